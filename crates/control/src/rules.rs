//! The YAML file as a source of the rules a controller sends down, watched by polling
//! its modification time. What goes down is rendered from the parsed file, never its text
//!: its `control` and `services` as data, without its comments or its `redis` section.
//!
//! The controller reads rules from a `watch` channel, so any source plugs in the same way: this
//! file, or the rules service's store (`spillway_rules::follow`).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use spillway_loop::RulesSnapshot;
use tokio::sync::watch;

use crate::error::ControlError;

/// How often the file source looks at the file's modification time by default.
pub const DEFAULT_POLL: Duration = Duration::from_millis(500);

/// Rules from a YAML file, reloaded when its modification time changes.
///
/// The version is the file's modification time in Unix milliseconds (one more than the previous
/// version if the clock went back), so a restarted controller serving an unchanged file announces
/// the version its clients already run and nothing is sent again.
#[derive(Debug)]
pub struct FileRules {
    path: PathBuf,
    stamp: Option<SystemTime>,
    current: Arc<RulesSnapshot>,
}

impl FileRules {
    /// Loads the file once; a missing or invalid file is an error here, at start.
    pub fn load(path: &Path) -> Result<Self, ControlError> {
        let (stamp, snapshot) = read(path, 0)?;
        Ok(Self {
            path: path.to_owned(),
            stamp,
            current: Arc::new(snapshot),
        })
    }

    pub fn current(&self) -> Arc<RulesSnapshot> {
        self.current.clone()
    }

    /// Reloads if the file changed. An invalid edit keeps the rules in force and returns the
    /// error, so a typo never takes limits away; an edit that changes nothing sent down (a
    /// comment, the `redis` section) is no new version.
    pub fn poll(&mut self) -> Result<Option<Arc<RulesSnapshot>>, ControlError> {
        let stamp = modified(&self.path)?;
        if stamp == self.stamp {
            return Ok(None);
        }
        let (stamp, snapshot) = read(&self.path, self.current.version)?;
        self.stamp = stamp;
        if snapshot.sends_the_same(&self.current) {
            return Ok(None);
        }
        self.current = Arc::new(snapshot);
        Ok(Some(self.current.clone()))
    }

    /// Watches the file every `poll` on the current tokio runtime; the receiver always holds the
    /// latest valid rules. The task ends when every receiver is gone.
    pub fn watch(mut self, poll: Duration) -> watch::Receiver<Arc<RulesSnapshot>> {
        let (tx, rx) = watch::channel(self.current());
        tokio::spawn(async move {
            let mut ticker = tokio::time::interval(poll);
            ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                ticker.tick().await;
                if tx.is_closed() {
                    return;
                }
                match self.poll() {
                    Ok(Some(rules)) => {
                        tracing::info!(path = %self.path.display(), version = rules.version, "rules changed");
                        tx.send_replace(rules);
                    }
                    Ok(None) => {}
                    Err(err) => {
                        tracing::error!("{err}; keeping rules version {}", self.current.version)
                    }
                }
            }
        });
        rx
    }
}

fn modified(path: &Path) -> Result<Option<SystemTime>, ControlError> {
    std::fs::metadata(path)
        .map(|m| m.modified().ok())
        .map_err(|source| ControlError::Read {
            path: path.to_owned(),
            source,
        })
}

fn read(path: &Path, previous: u64) -> Result<(Option<SystemTime>, RulesSnapshot), ControlError> {
    let stamp = modified(path)?;
    let yaml = std::fs::read_to_string(path).map_err(|source| ControlError::Read {
        path: path.to_owned(),
        source,
    })?;
    let millis = stamp
        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
    let version = millis.max(previous + 1);
    let snapshot = RulesSnapshot::parse(version, &yaml, &path.display().to_string())?;
    Ok((stamp, snapshot))
}

#[cfg(test)]
mod tests {
    use super::*;
    use spillway_loop::RulesMessage;

    const ONE: &str =
        "version: 1\nservices:\n  api:\n    buckets:\n      - { name: all, limit: 10/s }\n";
    const TWO: &str =
        "version: 1\nservices:\n  api:\n    buckets:\n      - { name: all, limit: 20/s }\n";

    #[test]
    fn an_edit_raises_the_version_and_a_bad_edit_keeps_the_rules() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("rules.yaml");
        std::fs::write(&path, ONE).unwrap();
        let mut rules = FileRules::load(&path).unwrap();
        let first = rules.current();
        assert_eq!(rules.poll().unwrap().map(|r| r.version), None);

        std::fs::write(&path, TWO).unwrap();
        bump_mtime(&path, 1);
        let second = rules.poll().unwrap().expect("the edit is seen");
        assert!(second.version > first.version);
        assert_eq!(
            second.config.services[0].buckets[0].limit.per_second(),
            20.0
        );

        std::fs::write(&path, "version: 1\nservices: 7\n").unwrap();
        bump_mtime(&path, 2);
        let err = rules.poll().unwrap_err().to_string();
        assert!(err.contains("rules.yaml:2:11"), "{err}");
        assert_eq!(rules.current().version, second.version);
    }

    #[test]
    fn an_edit_of_a_comment_or_of_redis_is_no_new_version_and_never_goes_down() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("rules.yaml");
        let redis = "redis: { url: \"redis://:hunter2@127.0.0.1:6379\" }\n";
        std::fs::write(&path, format!("# secret comment\n{ONE}{redis}")).unwrap();
        let mut rules = FileRules::load(&path).unwrap();
        let message = rules.current().message();
        for field in [&message.yaml, &message.json] {
            assert!(!field.contains("secret comment"), "{field}");
            assert!(!field.contains("hunter2"), "{field}");
        }

        let other = "redis: { url: \"redis://:swordfish@127.0.0.1:6380\" }\n";
        std::fs::write(&path, format!("# another comment\n{ONE}{other}")).unwrap();
        bump_mtime(&path, 1);
        assert_eq!(rules.poll().unwrap().map(|r| r.version), None);
    }

    /// Moves the file's modification time forward so the edit is seen even on coarse clocks.
    fn bump_mtime(path: &Path, secs: u64) {
        let file = std::fs::File::options().write(true).open(path).unwrap();
        file.set_modified(SystemTime::now() + Duration::from_secs(secs))
            .unwrap();
    }
}
