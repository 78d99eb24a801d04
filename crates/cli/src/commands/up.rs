//! `spillway up -c FILE` (SPEC §1): a single node in one process. Wiring only: the node is
//! `spillway_node::Node`.

use std::process::ExitCode;

use spillway_node::{Node, NodeOptions};

use crate::args::UpArgs;

/// Runs the node until SIGTERM or SIGINT, then drains the sidecar and stops the rest.
pub fn up(args: UpArgs) -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("spillway up: cannot start the async runtime: {err}");
            return ExitCode::from(1);
        }
    };
    runtime.block_on(async move {
        let options = NodeOptions {
            config: args.config,
            state_dir: args.state_dir,
            database: args.database,
            upstream: args.upstream,
            listen: args.listen,
            admin: args.admin,
            rules_listen: args.rules_listen,
            controller_listen: args.controller_listen,
            controller_admin: args.controller_admin,
            aggregator_listen: args.aggregator_listen,
            aggregator_admin: args.aggregator_admin,
            drain_timeout: args.drain_timeout,
        };
        let node = match Node::start(options).await {
            Ok(node) => node,
            Err(err) => {
                eprintln!("spillway up: {err}");
                return ExitCode::from(if err.is_usage() { 2 } else { 1 });
            }
        };
        if let Some(token) = &node.admin_token {
            println!("rules service admin token (shown once): {token}");
        }
        println!(
            "spillway up: sidecar on {} (admin {}), rules API on http://{}, controller {}, aggregator {}",
            node.proxy.addr(),
            node.proxy.admin_addr().map_or("-".into(), |a| a.to_string()),
            node.rules_addr,
            node.controller.local_addr(),
            node.aggregator.local_addr(),
        );
        if let Some(admin) = node.controller.admin_addr() {
            println!("dashboard: http://{admin}/");
        }
        super::stop_signal().await;
        tracing::info!("stopping: draining the sidecar, then the control plane and the rules service");
        node.shutdown().await;
        ExitCode::SUCCESS
    })
}
