//! One Redis endpoint: a single node, the primary that Sentinel names, or a Redis Cluster,
//! reconnected on errors.
//!
//! The connection is multiplexed, so every concurrent decision shares one socket (one per node
//! for a cluster) and clones of it are cheap. A cluster connection routes each script call to
//! the node serving its keys' slot, and follows `MOVED` and `ASK` redirections itself; every
//! key of one bucket carries the same hash tag, so one call never spans two slots. When a call fails in a way that says the connection or the node is gone (I/O
//! errors, timeouts, `READONLY` from a demoted primary), the connection is dropped and the next
//! call connects again; for Sentinel that means asking the sentinels for the primary anew,
//! which is how a failover is followed (redis-rs does not follow one by itself).

use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwapOption;
use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::cluster::{ClusterClient, ClusterClientBuilder};
use redis::cluster_async::ClusterConnection;
use redis::sentinel::{SentinelClient, SentinelNodeConnectionInfo, SentinelServerType};
use redis::{
    AsyncConnectionConfig, Client, Cmd, ErrorKind, IntoConnectionInfo, Pipeline,
    RedisConnectionInfo, RedisError, RedisFuture, RedisResult, ServerErrorKind, Value,
};
use spillway_core::config::redact_url;
use tokio::sync::Mutex;

use crate::password::Password;

/// Where a limiter finds Redis. Its `Debug` shows a URL's password as `***`.
#[derive(Clone, PartialEq, Eq)]
pub enum RedisEndpoint {
    /// One server, `redis://HOST:PORT[/DB]`.
    Single { url: String },
    /// The primary that `sentinels` (`redis://HOST:PORT` each) know as `master`.
    Sentinel {
        master: String,
        sentinels: Vec<String>,
    },
    /// A Redis Cluster, found from any of `nodes` (`redis://HOST:PORT` each); the client learns
    /// the slot map from the first that answers and follows it as it changes.
    Cluster { nodes: Vec<String> },
}

impl RedisEndpoint {
    /// One server at `url`.
    pub fn single(url: impl Into<String>) -> Self {
        RedisEndpoint::Single { url: url.into() }
    }

    /// The primary named `master` by `sentinels`.
    pub fn sentinel(master: impl Into<String>, sentinels: Vec<String>) -> Self {
        RedisEndpoint::Sentinel {
            master: master.into(),
            sentinels,
        }
    }

    /// The Redis Cluster that `nodes` (some or all of its nodes) belong to.
    pub fn cluster(nodes: Vec<String>) -> Self {
        RedisEndpoint::Cluster { nodes }
    }

    /// The target in a few words for log lines, passwords hidden.
    pub(crate) fn describe(&self) -> String {
        let redacted = |urls: &[String]| -> String {
            urls.iter()
                .map(|u| redact_url(u))
                .collect::<Vec<_>>()
                .join(", ")
        };
        match self {
            RedisEndpoint::Single { url } => redact_url(url).into_owned(),
            RedisEndpoint::Sentinel { master, sentinels } => {
                format!("sentinel master {master} via {}", redacted(sentinels))
            }
            RedisEndpoint::Cluster { nodes } => format!("cluster via {}", redacted(nodes)),
        }
    }
}

impl std::fmt::Debug for RedisEndpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let redacted = |urls: &[String]| -> Vec<String> {
            urls.iter().map(|u| redact_url(u).into_owned()).collect()
        };
        match self {
            RedisEndpoint::Single { url } => f
                .debug_struct("Single")
                .field("url", &redact_url(url))
                .finish(),
            RedisEndpoint::Sentinel { master, sentinels } => f
                .debug_struct("Sentinel")
                .field("master", master)
                .field("sentinels", &redacted(sentinels))
                .finish(),
            RedisEndpoint::Cluster { nodes } => f
                .debug_struct("Cluster")
                .field("nodes", &redacted(nodes))
                .finish(),
        }
    }
}

/// Redirections and retries a cluster call may take; the limiter's deadline bounds them all.
const CLUSTER_RETRIES: u32 = 3;

/// A live connection of any kind of endpoint.
#[derive(Clone)]
pub(crate) enum Connection {
    Node(MultiplexedConnection),
    Cluster(ClusterConnection),
}

impl ConnectionLike for Connection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Connection::Node(con) => con.req_packed_command(cmd),
            Connection::Cluster(con) => con.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Connection::Node(con) => con.req_packed_commands(pipeline, offset, count),
            Connection::Cluster(con) => con.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Connection::Node(con) => con.get_db(),
            Connection::Cluster(con) => con.get_db(),
        }
    }
}

enum Connector {
    Single(Client),
    Sentinel(SentinelClient),
    Cluster(ClusterClient),
}

impl Connector {
    /// `password`, when given, replaces any password of the URLs: the process's own, from its
    /// `redis.password_file` or its environment. For Sentinel it is the primary's (the
    /// sentinels are asked with their URLs as written).
    fn new(
        target: &RedisEndpoint,
        timeout: Duration,
        password: Option<&Password>,
    ) -> RedisResult<Self> {
        Ok(match target {
            RedisEndpoint::Single { url } => {
                let mut info = url.as_str().into_connection_info()?;
                if let Some(password) = password {
                    let settings = info
                        .redis_settings()
                        .clone()
                        .set_password(password.expose());
                    info = info.set_redis_settings(settings);
                }
                Connector::Single(Client::open(info)?)
            }
            RedisEndpoint::Sentinel { master, sentinels } => {
                Connector::Sentinel(SentinelClient::build(
                    sentinels.clone(),
                    master.clone(),
                    password.map(|password| {
                        SentinelNodeConnectionInfo::default().set_redis_connection_info(
                            RedisConnectionInfo::default().set_password(password.expose()),
                        )
                    }),
                    SentinelServerType::Master,
                )?)
            }
            RedisEndpoint::Cluster { nodes } => {
                let mut builder = ClusterClientBuilder::new(nodes.iter().map(String::as_str))
                    .connection_timeout(timeout)
                    .response_timeout(timeout)
                    .retries(CLUSTER_RETRIES);
                if let Some(password) = password {
                    builder = builder.password(password.expose());
                }
                Connector::Cluster(builder.build()?)
            }
        })
    }

    async fn connect(&mut self, config: &AsyncConnectionConfig) -> RedisResult<Connection> {
        Ok(match self {
            Connector::Single(client) => Connection::Node(
                client
                    .get_multiplexed_async_connection_with_config(config)
                    .await?,
            ),
            Connector::Sentinel(client) => {
                Connection::Node(client.get_async_connection_with_config(config).await?)
            }
            Connector::Cluster(client) => Connection::Cluster(client.get_async_connection().await?),
        })
    }
}

/// A lazily connected endpoint. Connecting happens inside the caller's deadline, so it is never
/// slower than the limiter's timeout.
pub(crate) struct Endpoint {
    current: ArcSwapOption<Connection>,
    // Serializes reconnection, so that a burst of decisions after a failure opens one
    // connection, not one each.
    connector: Mutex<Connector>,
    config: AsyncConnectionConfig,
}

impl Endpoint {
    pub(crate) fn new(
        target: &RedisEndpoint,
        timeout: Duration,
        password: Option<&Password>,
    ) -> RedisResult<Self> {
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(timeout))
            .set_response_timeout(Some(timeout));
        Ok(Self {
            current: ArcSwapOption::empty(),
            connector: Mutex::new(Connector::new(target, timeout, password)?),
            config,
        })
    }

    /// The live connection, connecting first when there is none.
    pub(crate) async fn connection(&self) -> RedisResult<Connection> {
        if let Some(con) = self.current.load_full() {
            return Ok((*con).clone());
        }
        let mut connector = self.connector.lock().await;
        // Another caller may have connected while we waited for the lock.
        if let Some(con) = self.current.load_full() {
            return Ok((*con).clone());
        }
        let con = connector.connect(&self.config).await?;
        self.current.store(Some(Arc::new(con.clone())));
        Ok(con)
    }

    /// Forgets the connection after `error` if it says the connection or the node is gone.
    pub(crate) fn after_error(&self, error: &RedisError) {
        if breaks_connection(error) {
            self.forget();
        }
    }

    /// Forgets the connection, so the next call connects (and re-resolves the primary) again.
    pub(crate) fn forget(&self) {
        self.current.store(None);
    }
}

/// Whether an error means this connection, or the node behind it, should not be used again.
fn breaks_connection(error: &RedisError) -> bool {
    error.is_io_error()
        || error.is_connection_dropped()
        || error.is_connection_refusal()
        || error.is_timeout()
        || error.is_unrecoverable_error()
        || matches!(
            error.kind(),
            ErrorKind::Server(
                ServerErrorKind::ReadOnly
                    | ServerErrorKind::MasterDown
                    | ServerErrorKind::BusyLoading
            )
        )
}
