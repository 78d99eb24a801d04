//! The `redis:` section as the file writes it; its `Debug` never shows a password.

use super::*;

/// The Redis that exact buckets count in: exactly one of `url`, `sentinel` or `cluster`.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(extend("oneOf" = [
    { "required": ["url"] },
    { "required": ["sentinel"] },
    { "required": ["cluster"] }
]))]
pub struct RedisFile {
    /// A single node: `redis://HOST:PORT[/DB]` (or `rediss://` for TLS).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// A primary watched by Redis Sentinel.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sentinel: Option<SentinelFile>,
    /// The nodes of a Redis Cluster to start from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster: Option<Vec<String>>,
    /// How long one Redis call may take before it counts as a store failure. Default `50ms`.
    #[serde(default = "default_redis_timeout", with = "duration_text")]
    #[schemars(with = "DurationText")]
    pub timeout: Duration,
    /// A file holding the Redis password (its text, without a trailing newline), read by each
    /// process that connects when it starts: the password stays out of this file, out of the
    /// control plane's link and out of logs. Relative paths are from the working directory.
    /// Without it, the `SPILLWAY_REDIS_PASSWORD` environment variable gives the password, if
    /// set; a password written in a URL is the last resort.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub password_file: Option<PathBuf>,
}

impl fmt::Debug for RedisFile {
    /// URLs with their password replaced by `***`, so a logged configuration shows none.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisFile")
            .field("url", &self.url.as_deref().map(redact_url))
            .field("sentinel", &self.sentinel)
            .field(
                "cluster",
                &self
                    .cluster
                    .as_ref()
                    .map(|nodes| nodes.iter().map(|n| redact_url(n)).collect::<Vec<_>>()),
            )
            .field("timeout", &self.timeout)
            .field("password_file", &self.password_file)
            .finish()
    }
}

pub(crate) fn default_redis_timeout() -> Duration {
    Duration::from_millis(50)
}

/// Redis Sentinel: the monitored master's name and the sentinels to ask.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SentinelFile {
    /// The master's name in the sentinels' configuration, e.g. `mymaster`.
    pub master: String,
    /// Sentinel addresses, e.g. `redis://10.0.0.1:26379`.
    pub nodes: Vec<String>,
}

impl fmt::Debug for SentinelFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SentinelFile")
            .field("master", &self.master)
            .field(
                "nodes",
                &self.nodes.iter().map(|n| redact_url(n)).collect::<Vec<_>>(),
            )
            .finish()
    }
}
