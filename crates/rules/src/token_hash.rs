//! A bearer token's secret: the token's prefix and the argon2 hash that is all the store keeps
//! of the secret (light parameters: the secret is 256 random bits, see [`crate::auth`]).

use argon2::password_hash::{PasswordHash, PasswordHasher, PasswordVerifier, SaltString};
use argon2::{Algorithm, Argon2, Params, Version};

pub const TOKEN_PREFIX: &str = "spw_";

fn hasher() -> Argon2<'static> {
    // 4 MiB, one pass: see the auth module's comment.
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

pub(crate) fn verify_secret(secret: &str, hash: &str) -> bool {
    PasswordHash::new(hash)
        .is_ok_and(|parsed| hasher().verify_password(secret.as_bytes(), &parsed).is_ok())
}
