//! The Lua scripts and how they are called: `EVALSHA` first, `EVAL` when Redis lost them (W5).
//!
//! redis-rs's `Script` answers `NOSCRIPT` with `SCRIPT LOAD` and a second `EVALSHA`, two more
//! round trips. We send `EVAL` with the source instead: one round trip that also puts the
//! script back in the cache for the next `EVALSHA`.

use std::sync::LazyLock;

use redis::aio::ConnectionLike;
use redis::{ErrorKind, RedisResult, ServerErrorKind};

/// One script per algorithm.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ScriptKind {
    TokenBucket,
    LeakyBucket,
    FixedWindow,
    SlidingWindowLog,
    SlidingWindowCounter,
    Gcra,
}

struct Loaded {
    source: &'static str,
    sha: String,
}

static SCRIPTS: LazyLock<[Loaded; 6]> = LazyLock::new(|| {
    let load = |source: &'static str| Loaded {
        source,
        sha: redis::Script::new(source).get_hash().to_owned(),
    };
    [
        load(include_str!("lua/token_bucket.lua")),
        load(include_str!("lua/leaky_bucket.lua")),
        load(include_str!("lua/fixed_window.lua")),
        load(include_str!("lua/sliding_log.lua")),
        load(include_str!("lua/sliding_counter.lua")),
        load(include_str!("lua/gcra.lua")),
    ]
});

impl ScriptKind {
    fn loaded(self) -> &'static Loaded {
        &SCRIPTS[self as usize]
    }

    /// The script's Lua source.
    pub fn source(self) -> &'static str {
        self.loaded().source
    }

    /// The SHA-1 that `EVALSHA` names the script by.
    pub fn sha(self) -> &'static str {
        &self.loaded().sha
    }

    /// Runs the script on `keys` with `args` and returns its reply, an array of integers.
    pub(crate) async fn run(
        self,
        con: &mut (impl ConnectionLike + Send),
        keys: &[&str],
        args: &[String],
    ) -> RedisResult<Vec<i64>> {
        let call = |verb: &str, script: &str| {
            let mut cmd = redis::cmd(verb);
            cmd.arg(script).arg(keys.len()).arg(keys).arg(args);
            cmd
        };
        match call("EVALSHA", self.sha()).query_async(con).await {
            Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                call("EVAL", self.source()).query_async(con).await
            }
            other => other,
        }
    }
}
