//! Shared helpers of the integration tests: limiters and raw connections to private servers.
#![allow(dead_code)]

pub mod outage;

use std::time::Duration;

use spillway_redis::{ExactAlgo, RedisEndpoint, RedisKey, RedisLimiter, StoreOptions};

/// A limiter with a generous timeout: these tests measure exactness, not latency, and a debug
/// build on a busy machine is slow.
pub fn limiter(url: &str) -> RedisLimiter {
    RedisLimiter::new(
        RedisEndpoint::single(url),
        StoreOptions {
            timeout: Duration::from_secs(2),
        },
    )
    .expect("a valid URL")
}

/// A limiter on the Redis Cluster that `nodes` belong to, as generous as [`limiter`].
pub fn cluster_limiter(nodes: Vec<String>) -> RedisLimiter {
    RedisLimiter::new(
        RedisEndpoint::cluster(nodes),
        StoreOptions {
            timeout: Duration::from_secs(2),
        },
    )
    .expect("valid URLs")
}

/// A raw connection, for commands the tests send themselves.
pub async fn raw(url: &str) -> redis::aio::MultiplexedConnection {
    redis::Client::open(url)
        .expect("a valid URL")
        .get_multiplexed_async_connection()
        .await
        .expect("connect to the private redis-server")
}

/// The server's clock in microseconds, from `TIME`.
pub async fn server_micros(con: &mut redis::aio::MultiplexedConnection) -> u64 {
    let (secs, micros): (u64, u64) = redis::cmd("TIME").query_async(con).await.unwrap();
    secs * 1_000_000 + micros
}

/// `calls` of `cmdstat_NAME` in `INFO commandstats`, 0 when the command never ran.
pub async fn command_calls(con: &mut redis::aio::MultiplexedConnection, name: &str) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(con)
        .await
        .unwrap();
    let prefix = format!("cmdstat_{name}:calls=");
    info.lines()
        .find_map(|line| line.strip_prefix(&prefix))
        .and_then(|rest| rest.split(',').next())
        .map_or(0, |n| n.parse().unwrap())
}

/// Each limiter, on a task of its own, sends `requests` requests of cost 1, 2, 3, 1, 2, 3, ...
/// at `key`, all at once. Returns the admitted cost.
pub async fn admitted_concurrently(
    limiters: Vec<RedisLimiter>,
    key: &RedisKey,
    algo: ExactAlgo,
    requests: u64,
) -> u64 {
    let mut tasks = Vec::new();
    for limiter in limiters {
        let key = key.clone();
        tasks.push(tokio::spawn(async move {
            let mut admitted = 0;
            for i in 0..requests {
                let cost = i % 3 + 1;
                if limiter.decide(&key, &algo, cost).await.unwrap().is_allow() {
                    admitted += cost;
                }
            }
            admitted
        }));
    }
    let mut total = 0;
    for task in tasks {
        total += task.await.unwrap();
    }
    total
}

/// Log lines captured from the thread that installs [`Logs::install`]: a current-thread
/// runtime's tasks, the breaker's prober included.
#[derive(Clone, Default)]
pub struct Logs(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Logs {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Logs {
    /// Captures info and above on this thread until the guard is dropped.
    pub fn install(&self) -> tracing::subscriber::DefaultGuard {
        let writer = self.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .without_time()
            .with_max_level(tracing::Level::INFO)
            .finish();
        tracing::subscriber::set_default(subscriber)
    }

    /// The lines so far.
    pub fn lines(&self) -> Vec<String> {
        String::from_utf8_lossy(&self.0.lock().unwrap())
            .lines()
            .map(str::to_owned)
            .collect()
    }
}
