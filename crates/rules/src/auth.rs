//! Bearer tokens: `spw_<user id>_<secret>`, shown once and stored as an argon2 hash.
//!
//! The id part selects the user's row, so a request costs one hash check instead of one per
//! user. The secret is 256 random bits, so argon2 runs with light parameters: its cost guards
//! against guessing, and nobody guesses 256 bits. Tokens already verified are remembered in
//! memory, keyed by the whole token, so a busy client does not pay the hash on every request.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use argon2::password_hash::{PasswordHash, PasswordHasher, PasswordVerifier, SaltString};
use argon2::{Algorithm, Argon2, Params, Version};

use crate::store::{Store, StoreError, User};

pub const TOKEN_PREFIX: &str = "spw_";

/// Why a request is not authenticated.
#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    #[error("missing bearer token; send `authorization: Bearer spw_...`")]
    Missing,
    #[error("invalid bearer token")]
    Invalid,
    #[error(transparent)]
    Store(#[from] StoreError),
}

fn hasher() -> Argon2<'static> {
    // 4 MiB, one pass: see the module comment.
    let params = Params::new(4096, 1, 1, None).expect("constant argon2 parameters are valid");
    Argon2::new(Algorithm::Argon2id, Version::V0x13, params)
}

pub fn hash_secret(secret: &str) -> Result<String, String> {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes).map_err(|e| e.to_string())?;
    let salt = SaltString::encode_b64(&bytes).map_err(|e| e.to_string())?;
    hasher()
        .hash_password(secret.as_bytes(), &salt)
        .map(|h| h.to_string())
        .map_err(|e| e.to_string())
}

fn verify_secret(secret: &str, hash: &str) -> bool {
    PasswordHash::new(hash)
        .is_ok_and(|parsed| hasher().verify_password(secret.as_bytes(), &parsed).is_ok())
}

/// Checks tokens against the store.
#[derive(Clone, Default)]
pub struct Authenticator {
    verified: Arc<RwLock<HashMap<String, User>>>,
}

impl Authenticator {
    /// The user an `authorization` header value names.
    pub async fn authenticate(
        &self,
        store: &Store,
        header: Option<&str>,
    ) -> Result<User, AuthError> {
        let header = header.ok_or(AuthError::Missing)?;
        let token = header
            .strip_prefix("Bearer ")
            .or_else(|| header.strip_prefix("bearer "))
            .ok_or(AuthError::Missing)?
            .trim();
        if let Some(user) = self
            .verified
            .read()
            .ok()
            .and_then(|m| m.get(token).cloned())
        {
            return Ok(user);
        }
        let (id, secret) = token
            .strip_prefix(TOKEN_PREFIX)
            .and_then(|rest| rest.split_once('_'))
            .ok_or(AuthError::Invalid)?;
        if id.len() != 32 || !id.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(AuthError::Invalid);
        }
        let (user, hash) = store.user(id).await?.ok_or(AuthError::Invalid)?;
        let secret = secret.to_owned();
        // Hashing is CPU work; keep it off the reactor's threads.
        let ok = tokio::task::spawn_blocking(move || verify_secret(&secret, &hash))
            .await
            .unwrap_or(false);
        if !ok {
            return Err(AuthError::Invalid);
        }
        if let Ok(mut verified) = self.verified.write() {
            verified.insert(token.to_owned(), user.clone());
        }
        Ok(user)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hash_accepts_its_secret_only() {
        let hash = hash_secret("s3cret").unwrap();
        assert!(hash.starts_with("$argon2id$"));
        assert!(verify_secret("s3cret", &hash));
        assert!(!verify_secret("s3creT", &hash));
    }
}
