//! `spillway up -c FILE`: a single node in one process. Wiring only: the node is
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
    // One process with no TLS and no admin tokens: every listener on loopback, or a clear
    // refusal; the roles run apart take TLS and tokens.
    let listeners = [
        ("--listen", args.listen),
        ("--admin", args.admin),
        ("--rules-listen", args.rules_listen),
        ("--controller-listen", args.controller_listen),
        ("--controller-admin", args.controller_admin),
        ("--aggregator-listen", args.aggregator_listen),
        ("--aggregator-admin", args.aggregator_admin),
    ];
    for (flag, addr) in listeners {
        let admin = flag.ends_with("admin");
        if addr.ip().is_loopback() || (!admin && flag == "--listen") {
            continue;
        }
        if admin || !args.insecure_plaintext {
            eprintln!(
                "spillway up: {flag} {addr} is not a loopback address; spillway up serves its control plane, rules API and admin ports on loopback only ({}). Run the roles apart (spillway controller, aggregator, proxy, rules serve) with --tls-cert and --admin-token-file to serve a network",
                if admin {
                    "admin ports need --admin-token-file, which spillway up does not take"
                } else {
                    "or give --insecure-plaintext on a trusted network"
                }
            );
            return ExitCode::from(2);
        }
        tracing::warn!(%addr, "{flag} {addr} is not loopback and has no TLS (--insecure-plaintext): anyone who can reach it can use it");
    }
    // As `spillway proxy` does, before the sidecar derives its connection cap from it.
    match spillway_proxy::raise_fd_limit() {
        Ok(limit) => tracing::info!("file descriptor limit: {limit}"),
        Err(err) => tracing::warn!(
            "cannot raise the file descriptor limit to its hard limit ({err}); the soft limit stays"
        ),
    }
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
            history_resolution: args.history_resolution,
            history_retention: args.history_retention,
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
