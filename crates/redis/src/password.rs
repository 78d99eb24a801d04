//! The Redis password: each process's own, from its `redis.password_file` or its environment
//!, never from the control plane, and never printed.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The environment variable that gives the Redis password when the `redis` section names no
/// `password_file`.
pub const PASSWORD_ENV: &str = "SPILLWAY_REDIS_PASSWORD";

/// A Redis password. `Debug` and `Display` print `***`, so it cannot reach a log by accident.
#[derive(Clone, PartialEq, Eq)]
pub struct Password(Arc<str>);

impl Password {
    pub fn new(password: impl Into<Arc<str>>) -> Self {
        Self(password.into())
    }

    /// The password itself, for the connection's `AUTH` only.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// The password of `file` when it is given (a file the process cannot read is an error),
    /// else of [`PASSWORD_ENV`] when it is set and not empty, else none (a password written in
    /// the Redis URL, if any, then applies).
    pub fn resolve(file: Option<&Path>) -> Result<Option<Self>, PasswordError> {
        match file {
            Some(path) => Self::from_file(path).map(Some),
            None => Ok(Self::from_env()),
        }
    }

    /// The text of `path`, without a trailing newline (as `echo` writes it, or a Kubernetes
    /// secret mounted as a file).
    pub fn from_file(path: &Path) -> Result<Self, PasswordError> {
        let text = std::fs::read_to_string(path).map_err(|source| PasswordError::Read {
            path: path.to_owned(),
            source,
        })?;
        let password = text.strip_suffix('\n').unwrap_or(&text);
        let password = password.strip_suffix('\r').unwrap_or(password);
        if password.is_empty() {
            return Err(PasswordError::Empty {
                path: path.to_owned(),
            });
        }
        Ok(Self::new(password))
    }

    /// [`PASSWORD_ENV`], when set and not empty.
    pub fn from_env() -> Option<Self> {
        std::env::var(PASSWORD_ENV)
            .ok()
            .filter(|p| !p.is_empty())
            .map(Self::new)
    }
}

impl fmt::Debug for Password {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Password(***)")
    }
}

impl fmt::Display for Password {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

/// Why `redis.password_file` gave no password. The messages name the file, never its content.
#[derive(Debug, thiserror::Error)]
pub enum PasswordError {
    #[error(
        "redis.password_file {}: cannot read it: {source}; the file holds the Redis password (or leave password_file out and set {PASSWORD_ENV})",
        path.display()
    )]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "redis.password_file {} is empty; write the Redis password in it",
        path.display()
    )]
    Empty { path: PathBuf },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_gives_its_text_without_the_newline_and_prints_as_stars() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("pw");
        std::fs::write(&path, "hunter2\r\n").unwrap();
        let password = Password::from_file(&path).unwrap();
        assert_eq!(password.expose(), "hunter2");
        assert_eq!(format!("{password} {password:?}"), "*** Password(***)");
    }

    #[test]
    fn a_target_prints_no_password() {
        for target in [
            crate::RedisEndpoint::single("redis://:hunter2@cache:6379"),
            crate::RedisEndpoint::sentinel("m", vec!["redis://app:hunter2@s1:26379".into()]),
            crate::RedisEndpoint::cluster(vec!["rediss://:hunter2@n1:7000".into()]),
        ] {
            let printed = format!("{target:?}");
            assert!(
                !printed.contains("hunter2") && printed.contains(":***@"),
                "{printed}"
            );
        }
    }

    #[test]
    fn a_missing_or_empty_file_is_an_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("nowhere");
        let err = Password::resolve(Some(&missing)).unwrap_err().to_string();
        assert!(
            err.starts_with(&format!(
                "redis.password_file {}: cannot read it",
                missing.display()
            )),
            "{err}"
        );
        let empty = dir.path().join("empty");
        std::fs::write(&empty, "\n").unwrap();
        let err = Password::from_file(&empty).unwrap_err().to_string();
        assert!(err.contains("is empty"), "{err}");
    }
}
