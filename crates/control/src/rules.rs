//! The rules a controller sends down (G12, G13): a validated snapshot with a version, and the
//! YAML file source that watches its file by polling its modification time.
//!
//! The controller reads rules from a `watch` channel, so any source plugs in the same way: the
//! file today, the rules service's store (LISTEN/NOTIFY) once it is wired.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use spillway_core::config::{self, Config, ConfigFile};
use tokio::sync::watch;

use crate::error::ControlError;

/// One version of the rules: the validated configuration and the text it came from (what
/// clients receive, so they validate and compile exactly what the controller did).
#[derive(Debug, Clone)]
pub struct RulesSnapshot {
    /// Grows with every change of one source.
    pub version: u64,
    pub yaml: Arc<str>,
    pub config: Arc<Config>,
}

impl RulesSnapshot {
    /// Validates `yaml` (`name` is what errors call it) as version `version`.
    pub fn parse(version: u64, yaml: &str, name: &str) -> Result<Self, ControlError> {
        let config = config::load_str(yaml, name)?;
        Ok(Self {
            version,
            yaml: yaml.into(),
            config: Arc::new(config),
        })
    }
}

impl RulesSnapshot {
    /// The rules of a store (the rules service's), given as the file model, as version
    /// `version`: rendered to YAML once, so clients receive the same text they would from a file.
    pub fn from_model(version: u64, file: &ConfigFile) -> Result<Self, ControlError> {
        let yaml = yaml_serde::to_string(file).map_err(|e| ControlError::Render(e.to_string()))?;
        Self::parse(version, &yaml, "the rules store")
    }
}

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
    /// error, so a typo never takes limits away.
    pub fn poll(&mut self) -> Result<Option<Arc<RulesSnapshot>>, ControlError> {
        let stamp = modified(&self.path)?;
        if stamp == self.stamp {
            return Ok(None);
        }
        let (stamp, snapshot) = read(&self.path, self.current.version)?;
        self.stamp = stamp;
        if *snapshot.yaml == *self.current.yaml {
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
    fn a_model_renders_to_the_yaml_it_came_from() {
        let file: ConfigFile = yaml_serde::from_str(ONE).unwrap();
        let rules = RulesSnapshot::from_model(7, &file).unwrap();
        assert_eq!(rules.version, 7);
        assert_eq!(*rules.config, config::load_str(ONE, "one.yaml").unwrap());
    }

    /// Moves the file's modification time forward so the edit is seen even on coarse clocks.
    fn bump_mtime(path: &Path, secs: u64) {
        let file = std::fs::File::options().write(true).open(path).unwrap();
        file.set_modified(SystemTime::now() + Duration::from_secs(secs))
            .unwrap();
    }
}
