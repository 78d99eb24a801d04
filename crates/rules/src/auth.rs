//! Bearer tokens: `spw_<token id>_<secret>`, shown once and stored as an argon2 hash.
//!
//! The id part selects the token's row, so a request costs one hash check instead of one per
//! token. The secret is 256 random bits, so argon2 runs with light parameters: its cost guards
//! against guessing, and nobody guesses 256 bits.
//!
//! A token already verified is remembered in memory, so a busy client does not pay the hash on
//! every request. The memory is not trusted for long: an entry older than [`REVALIDATE_AFTER`]
//! is checked again against the store (one primary-key read, no hash) before it is used, so a
//! token revoked, rotated, expired, demoted or deleted on any instance of the service stops
//! working on every other one within that time plus one read. Expiry is also checked against the
//! clock on every request.
//!
//! Timing: the secret is compared in constant time (argon2's own check, and `same` for the
//! remembered ones), and a token id that names no token is checked against a dummy hash, so an
//! unknown id takes about as long as a wrong secret.
//!
//! Cost: a token not remembered costs an argon2 check (4 MiB, a few milliseconds of a core),
//! which anyone can ask for with a made-up token; [`guard`] bounds how many run at once and
//! throttles the addresses and token ids whose tokens keep failing.

pub mod guard;

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, OnceLock, RwLock};
use std::time::{Duration, Instant};

use self::guard::{Boarding, Guard, GuardRefusal};
use crate::store::{Store, StoreError, TokenRecord, User};
use crate::time::{format_millis, now_millis};
use crate::token_hash::verify_secret;
pub use crate::token_hash::{TOKEN_PREFIX, hash_secret};

/// How long a verified token is trusted from memory before the store is asked again. A change
/// of a token or of its user reaches every instance within this plus one read: well inside the
/// second that is promised.
pub const REVALIDATE_AFTER: Duration = Duration::from_millis(500);

/// How often at most a token's `last_used_at` is written, so that a busy token costs no write
/// per request.
const LAST_USED_EVERY_MILLIS: i64 = 60_000;

/// Remembered tokens beyond this many make the next insertion forget the ones unused for a
/// minute.
const REMEMBERED: usize = 4096;

/// Why a request is not authenticated.
#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    #[error("missing bearer token; send `authorization: Bearer spw_...`")]
    Missing,
    #[error("invalid bearer token")]
    Invalid,
    /// Only said to a client that proved it holds the secret.
    #[error("this token was revoked at {0}; ask an admin for a new one")]
    Revoked(String),
    /// Only said to a client that proved it holds the secret.
    #[error("this token expired at {0}; ask an admin to rotate it or for a new one")]
    Expired(String),
    /// Too many wrong tokens from this address or naming this token id: nothing was checked.
    #[error(
        "too many failed authentications from this address or for this token id; \
         retry in {0} s"
    )]
    Throttled(u64),
    /// Every argon2 check slot is taken: nothing was checked.
    #[error("too many bearer tokens are being checked at once; retry in a second")]
    Busy,
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl From<GuardRefusal> for AuthError {
    fn from(refusal: GuardRefusal) -> Self {
        match refusal {
            GuardRefusal::Throttled(seconds) => AuthError::Throttled(seconds),
            GuardRefusal::Busy => AuthError::Busy,
        }
    }
}

/// The hash an unknown token id is checked against: same parameters as a real one, so the
/// check costs the same, and a secret nobody holds, so it never matches.
fn dummy_hash() -> &'static str {
    static DUMMY: OnceLock<String> = OnceLock::new();
    DUMMY.get_or_init(|| {
        let mut bytes = [0u8; 32];
        let _ = getrandom::fill(&mut bytes);
        let secret: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        // Fails only if the system has no randomness, when no token can be made either.
        hash_secret(&secret).unwrap_or_default()
    })
}

/// Whether two byte strings are equal, in time that depends on their lengths only.
fn same(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let diff = a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y));
    std::hint::black_box(diff) == 0
}

/// A verified token, as remembered.
#[derive(Clone)]
struct Remembered {
    secret: String,
    /// The hash it was verified against: a rotation changes it.
    hash: String,
    user: User,
    expires_at: Option<i64>,
    /// When the store last vouched for it: taken before that read began.
    checked: Instant,
}

/// Checks tokens against the store.
#[derive(Clone, Default)]
pub struct Authenticator {
    verified: Arc<RwLock<HashMap<String, Remembered>>>,
    guard: Arc<Guard>,
}

impl Authenticator {
    /// Computes the dummy hash now rather than on the first unknown token id.
    pub fn warm_up(&self) {
        let _ = dummy_hash();
    }

    /// What bounds the checks: its counts are on `/metrics`.
    pub fn guard(&self) -> &Guard {
        &self.guard
    }

    /// The user an `authorization` header value names; `source` is the client's address, by
    /// which wrong tokens are throttled.
    pub async fn authenticate(
        &self,
        store: &Store,
        header: Option<&str>,
        source: Option<IpAddr>,
    ) -> Result<User, AuthError> {
        let header = header.ok_or(AuthError::Missing)?;
        let token = header
            .strip_prefix("Bearer ")
            .or_else(|| header.strip_prefix("bearer "))
            .ok_or(AuthError::Missing)?
            .trim();
        let (id, secret) = token
            .strip_prefix(TOKEN_PREFIX)
            .and_then(|rest| rest.split_once('_'))
            .ok_or(AuthError::Invalid)?;
        if id.len() != 32 || !id.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(AuthError::Invalid);
        }
        let digest = Guard::digest(id, secret);
        // At most twice: a request that waited for another's check of the same token looks
        // again, and finds its outcome remembered.
        let mut may_follow = true;
        loop {
            if let Some(known) = self.recall(store, id, secret).await? {
                return known;
            }
            // From here on the secret is checked with argon2, which the guard bounds.
            if self.guard.failed_recently(&digest) {
                return Err(AuthError::Invalid);
            }
            let flight = match self.guard.board(digest) {
                Boarding::Follow(mut ended) if may_follow => {
                    // Err once the check has ended: that is the signal.
                    let _ = ended.changed().await;
                    may_follow = false;
                    continue;
                }
                boarding => boarding,
            };
            let outcome = self.verify(store, id, secret, digest, source).await;
            drop(flight);
            return outcome;
        }
    }

    /// The answer from memory, if the token was verified lately: `Some` outcome, after a read
    /// of its row if the memory is older than [`REVALIDATE_AFTER`]; `None` if it needs a check.
    async fn recall(
        &self,
        store: &Store,
        id: &str,
        secret: &str,
    ) -> Result<Option<Result<User, AuthError>>, AuthError> {
        let remembered = self
            .verified
            .read()
            .ok()
            .and_then(|m| m.get(id).cloned())
            .filter(|r| same(r.secret.as_bytes(), secret.as_bytes()));
        let Some(entry) = remembered else {
            return Ok(None);
        };
        let now = now_millis();
        if let Some(at) = entry.expires_at.filter(|at| *at <= now) {
            self.forget(id);
            return Ok(Some(Err(AuthError::Expired(format_millis(at)))));
        }
        if entry.checked.elapsed() < REVALIDATE_AFTER {
            return Ok(Some(Ok(entry.user)));
        }
        // Revalidation: the same secret hash still stands, so no argon2 is needed.
        let checked = Instant::now();
        let record = store.token_record(id).await?;
        if let Some(record) = &record
            && record.secret_hash == entry.hash
        {
            let user = match still_valid(record, now) {
                Ok(user) => user.clone(),
                Err(err) => {
                    self.forget(id);
                    return Ok(Some(Err(err)));
                }
            };
            self.remember(id, secret, record, checked);
            self.note_use(store, id, record, now);
            return Ok(Some(Ok(user)));
        }
        // Rotated or gone: the memory is of no use any more.
        self.forget(id);
        Ok(None)
    }

    /// Checks the secret against the token's hash (a dummy one for an id that names no
    /// token), within the guard's bounds.
    async fn verify(
        &self,
        store: &Store,
        id: &str,
        secret: &str,
        digest: [u8; 32],
        source: Option<IpAddr>,
    ) -> Result<User, AuthError> {
        let charge = self.guard.charge(source, id)?;
        let checked = Instant::now();
        let record = match store.token_record(id).await {
            Ok(record) => record,
            Err(err) => {
                charge.refund();
                return Err(err.into());
            }
        };
        let hash = record
            .as_ref()
            .map_or_else(|| dummy_hash().to_owned(), |r| r.secret_hash.clone());
        let owned = secret.to_owned();
        let ok = match self
            .guard
            .verify(source, move || verify_secret(&owned, &hash))
            .await
        {
            Ok(ok) => ok,
            Err(refusal) => {
                charge.refund();
                return Err(refusal.into());
            }
        };
        let Some(record) = record.filter(|_| ok) else {
            // The charge stays spent.
            self.guard.note_failure(digest);
            return Err(AuthError::Invalid);
        };
        charge.refund();
        let now = now_millis();
        let user = still_valid(&record, now)?.clone();
        self.remember(id, secret, &record, checked);
        self.note_use(store, id, &record, now);
        Ok(user)
    }

    fn remember(&self, id: &str, secret: &str, record: &TokenRecord, checked: Instant) {
        if let Ok(mut verified) = self.verified.write() {
            if verified.len() >= REMEMBERED {
                verified.retain(|_, r| r.checked.elapsed() < Duration::from_secs(60));
            }
            verified.insert(
                id.to_owned(),
                Remembered {
                    secret: secret.to_owned(),
                    hash: record.secret_hash.clone(),
                    user: record.user.clone(),
                    expires_at: record.expires_at,
                    checked,
                },
            );
        }
    }

    /// Forgets token `id`, so that this instance asks the store about it on its next use.
    pub(crate) fn forget(&self, id: &str) {
        if let Ok(mut verified) = self.verified.write() {
            verified.remove(id);
        }
    }

    /// Forgets every token of user `user_id`.
    pub(crate) fn forget_user(&self, user_id: &str) {
        if let Ok(mut verified) = self.verified.write() {
            verified.retain(|_, r| r.user.id != user_id);
        }
    }

    /// Writes `last_used_at` in the background when the stored one is a minute old.
    fn note_use(&self, store: &Store, id: &str, record: &TokenRecord, now: i64) {
        if record
            .last_used_at
            .is_some_and(|at| now - at < LAST_USED_EVERY_MILLIS)
        {
            return;
        }
        let store = store.clone();
        let id = id.to_owned();
        tokio::spawn(async move {
            if let Err(err) = store.touch_token(&id, now).await {
                tracing::debug!(%err, "noting when a token was last used");
            }
        });
    }
}

/// The token's user, unless the token was revoked or has expired.
fn still_valid(record: &TokenRecord, now: i64) -> Result<&User, AuthError> {
    if let Some(at) = record.revoked_at {
        return Err(AuthError::Revoked(format_millis(at)));
    }
    if let Some(at) = record.expires_at.filter(|at| *at <= now) {
        return Err(AuthError::Expired(format_millis(at)));
    }
    Ok(&record.user)
}

#[cfg(test)]
mod tests {
    use argon2::password_hash::PasswordHash;

    use super::*;

    #[test]
    fn a_hash_accepts_its_secret_only() {
        let hash = hash_secret("s3cret").unwrap();
        assert!(hash.starts_with("$argon2id$"));
        assert!(verify_secret("s3cret", &hash));
        assert!(!verify_secret("s3creT", &hash));
    }

    #[test]
    fn the_dummy_hash_is_a_real_one_that_matches_nothing_sent() {
        let dummy = dummy_hash();
        assert!(PasswordHash::new(dummy).is_ok(), "{dummy}");
        assert_eq!(
            PasswordHash::new(dummy).unwrap().params,
            PasswordHash::new(&hash_secret("x").unwrap())
                .unwrap()
                .params,
            "the same parameters, so the same cost"
        );
        assert!(!verify_secret(&"0".repeat(64), dummy));
        assert!(!verify_secret("", dummy));
    }

    #[test]
    fn same_compares_whole_strings() {
        assert!(same(b"abc", b"abc"));
        assert!(!same(b"abc", b"abd"));
        assert!(!same(b"abc", b"ab"));
        assert!(same(b"", b""));
    }
}
