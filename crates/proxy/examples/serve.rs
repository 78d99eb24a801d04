//! The proxy alone, for benchmarks (`bench/concurrency/run.sh`): `serve CONFIG LISTEN UPSTREAM
//! [WORKERS]` runs a standalone proxy from CONFIG until it is killed, without building the
//! whole `spillway` binary.

use std::path::PathBuf;

use spillway_proxy::{Proxy, ProxyOptions};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [config, listen, upstream, rest @ ..] = args.as_slice() else {
        eprintln!("usage: serve CONFIG LISTEN UPSTREAM [WORKERS]");
        std::process::exit(2);
    };
    let mut options = ProxyOptions::new(
        PathBuf::from(config),
        listen.parse().expect("LISTEN is HOST:PORT"),
        upstream.clone(),
    );
    options.workers = rest
        .first()
        .map_or(2, |w| w.parse().expect("WORKERS is a number"));
    options.upstream_timeout = Some(std::time::Duration::from_secs(30));
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("a runtime");
    runtime.block_on(async {
        let proxy = Proxy::start(options).await.expect("the proxy starts");
        println!("listening {}", proxy.addr());
        std::future::pending::<()>().await;
    });
}
