//! The Lua scripts and how they are called: `EVALSHA` first, `EVAL` when Redis lost them.
//!
//! redis-rs's `Script` answers `NOSCRIPT` with `SCRIPT LOAD` and a second `EVALSHA`, two more
//! round trips. We send `EVAL` with the source instead: one round trip that also puts the
//! script back in the cache for the next `EVALSHA`.

use std::sync::OnceLock;

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
    /// A token budget's debit after its response (`lua/debit.lua`).
    Debit,
}

/// A script's source and the SHA-1 of it that `EVALSHA` names it by, computed on first use.
struct Script {
    source: &'static str,
    sha: OnceLock<String>,
}

impl Script {
    const fn new(source: &'static str) -> Self {
        Script {
            source,
            sha: OnceLock::new(),
        }
    }
}

static TOKEN_BUCKET: Script = Script::new(include_str!("lua/token_bucket.lua"));
static LEAKY_BUCKET: Script = Script::new(include_str!("lua/leaky_bucket.lua"));
static FIXED_WINDOW: Script = Script::new(include_str!("lua/fixed_window.lua"));
static SLIDING_LOG: Script = Script::new(include_str!("lua/sliding_log.lua"));
static SLIDING_COUNTER: Script = Script::new(include_str!("lua/sliding_counter.lua"));
static GCRA: Script = Script::new(include_str!("lua/gcra.lua"));
static DEBIT: Script = Script::new(include_str!("lua/debit.lua"));

impl ScriptKind {
    /// The script of each algorithm, named by the algorithm rather than by a position, so that
    /// reordering the variants cannot hand one algorithm another's script.
    fn script(self) -> &'static Script {
        match self {
            ScriptKind::TokenBucket => &TOKEN_BUCKET,
            ScriptKind::LeakyBucket => &LEAKY_BUCKET,
            ScriptKind::FixedWindow => &FIXED_WINDOW,
            ScriptKind::SlidingWindowLog => &SLIDING_LOG,
            ScriptKind::SlidingWindowCounter => &SLIDING_COUNTER,
            ScriptKind::Gcra => &GCRA,
            ScriptKind::Debit => &DEBIT,
        }
    }

    /// The script's Lua source.
    pub fn source(self) -> &'static str {
        self.script().source
    }

    /// The SHA-1 that `EVALSHA` names the script by.
    pub fn sha(self) -> &'static str {
        let script = self.script();
        script
            .sha
            .get_or_init(|| redis::Script::new(script.source).get_hash().to_owned())
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

#[cfg(test)]
mod tests {
    use super::*;

    const ALL: [ScriptKind; 7] = [
        ScriptKind::TokenBucket,
        ScriptKind::LeakyBucket,
        ScriptKind::FixedWindow,
        ScriptKind::SlidingWindowLog,
        ScriptKind::SlidingWindowCounter,
        ScriptKind::Gcra,
        ScriptKind::Debit,
    ];

    /// How each script's opening comment names the algorithm it implements.
    fn title(kind: ScriptKind) -> &'static str {
        match kind {
            ScriptKind::TokenBucket => "-- Token bucket",
            ScriptKind::LeakyBucket => "-- Leaky bucket",
            ScriptKind::FixedWindow => "-- Fixed window:",
            ScriptKind::SlidingWindowLog => "-- Sliding-window log",
            ScriptKind::SlidingWindowCounter => "-- Sliding-window counter:",
            ScriptKind::Gcra => "-- GCRA,",
            ScriptKind::Debit => "-- Debit of a token budget",
        }
    }

    #[test]
    fn every_kind_runs_the_script_that_implements_it() {
        for kind in ALL {
            assert!(
                kind.source().starts_with(title(kind)),
                "{kind:?} got the script {:?}",
                kind.source().lines().next()
            );
        }
    }

    #[test]
    fn every_kind_has_a_script_and_a_sha_of_its_own() {
        for (i, a) in ALL.iter().enumerate() {
            assert_eq!(a.sha().len(), 40, "{a:?}: a SHA-1 in hex");
            assert_eq!(a.sha(), redis::Script::new(a.source()).get_hash());
            for b in &ALL[i + 1..] {
                assert_ne!(a.source(), b.source(), "{a:?} and {b:?}");
                assert_ne!(a.sha(), b.sha(), "{a:?} and {b:?}");
            }
        }
    }
}
