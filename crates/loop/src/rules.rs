//! The rules every tier passes down (G12, G13): a validated configuration with its version and
//! the text it came from, so clients validate and compile exactly what the controller did.

use std::sync::Arc;

use spillway_core::config::{self, Config, ConfigError, ConfigFile};

/// Why a rules text or model could not become a snapshot.
#[derive(Debug, thiserror::Error)]
pub enum RulesError {
    #[error("{0}")]
    Config(#[from] ConfigError),
    #[error("cannot render the rules as YAML: {0}")]
    Render(String),
}

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
    pub fn parse(version: u64, yaml: &str, name: &str) -> Result<Self, RulesError> {
        let config = config::load_str(yaml, name)?;
        Ok(Self {
            version,
            yaml: yaml.into(),
            config: Arc::new(config),
        })
    }

    /// The rules of a store (the rules service's), given as the file model, as version
    /// `version`: rendered to YAML once, so clients receive the same text they would from a file.
    pub fn from_model(version: u64, file: &ConfigFile) -> Result<Self, RulesError> {
        let yaml = yaml_serde::to_string(file).map_err(|e| RulesError::Render(e.to_string()))?;
        Self::parse(version, &yaml, "the rules store")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ONE: &str =
        "version: 1\nservices:\n  api:\n    buckets:\n      - { name: all, limit: 10/s }\n";

    #[test]
    fn a_model_renders_to_the_yaml_it_came_from() {
        let file: ConfigFile = yaml_serde::from_str(ONE).unwrap();
        let rules = RulesSnapshot::from_model(7, &file).unwrap();
        assert_eq!(rules.version, 7);
        assert_eq!(*rules.config, config::load_str(ONE, "one.yaml").unwrap());
    }

    #[test]
    fn an_invalid_text_names_where() {
        let err = RulesSnapshot::parse(1, "version: 1\nservices: 7\n", "r.yaml").unwrap_err();
        assert!(err.to_string().contains("r.yaml:2:11"), "{err}");
    }
}
