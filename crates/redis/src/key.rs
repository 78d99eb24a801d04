//! Redis key names of exact buckets: `rl:{scope:scope_value:api}`, one Cluster slot each.

use std::fmt;

/// The Redis key of one exact bucket, for example `rl:{user:alice:/search}`.
///
/// Redis keys are named `rl:{scope}:{scope_value}:{api}`. The braces here wrap the whole identity
/// rather than only the scope, because Redis Cluster hashes just the text inside the first pair
/// of braces: `rl:{user}:alice:/search` would put every user's bucket in one slot, one hot node.
/// Wrapping all three spreads buckets over the cluster while a bucket's own keys (the sliding
/// log's chunks `<key>:0`, `<key>:1`, ... and its `<key>:meta` hash) share a slot, as a
/// multi-key script requires.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RedisKey {
    key: String,
}

impl RedisKey {
    /// The key of the bucket limiting `api` for the subject `scope` = `scope_value`, for example
    /// `("user", "alice", "/search")`.
    pub fn new(scope: &str, scope_value: &str, api: &str) -> Self {
        Self {
            key: format!("rl:{{{scope}:{scope_value}:{api}}}"),
        }
    }

    /// The key of the same bucket when one Redis serves several services and a bucket's algorithm
    /// may change: `rl:{orders:user:alice:/search}:token-bucket`.
    ///
    /// The service inside the braces keeps two services' buckets on the same (scope, value, api)
    /// apart, which would otherwise charge one counter twice. The algorithm after the braces
    /// gives a changed algorithm a fresh key in the same slot, since a token bucket's hash and a
    /// sliding log's sorted set cannot share one (Redis would answer `WRONGTYPE`).
    pub fn qualified(
        service: &str,
        scope: &str,
        scope_value: &str,
        api: &str,
        algorithm: &str,
    ) -> Self {
        Self {
            key: format!("rl:{{{service}:{scope}:{scope_value}:{api}}}:{algorithm}"),
        }
    }

    /// The key of a bucket that has no subject, keyed by any caller-chosen name. The name is
    /// used as the hash tag, so it should not contain braces.
    pub fn named(name: &str) -> Self {
        Self {
            key: format!("rl:{{{name}}}"),
        }
    }

    /// The key itself.
    pub fn as_str(&self) -> &str {
        &self.key
    }

    /// A companion key in the same slot, for algorithms that keep two structures.
    pub(crate) fn companion(&self, suffix: &str) -> String {
        format!("{}:{suffix}", self.key)
    }
}

impl fmt::Display for RedisKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The text Redis Cluster hashes: inside the first `{...}` when it is non-empty.
    fn hash_tag(key: &str) -> &str {
        if let Some(open) = key.find('{')
            && let Some(len) = key[open + 1..].find('}')
            && len > 0
        {
            return &key[open + 1..open + 1 + len];
        }
        key
    }

    #[test]
    fn key_follows_s5_with_the_whole_identity_as_hash_tag() {
        let key = RedisKey::new("user", "alice", "/search");
        assert_eq!(key.as_str(), "rl:{user:alice:/search}");
        assert_eq!(hash_tag(key.as_str()), "user:alice:/search");
    }

    #[test]
    fn companion_keys_share_the_bucket_slot_and_subjects_do_not() {
        let alice = RedisKey::new("user", "alice", "/search");
        let bob = RedisKey::new("user", "bob", "/search");
        assert_eq!(hash_tag(&alice.companion("meta")), hash_tag(alice.as_str()));
        assert_ne!(hash_tag(alice.as_str()), hash_tag(bob.as_str()));
    }
}
