//! The configuration file: typed model, loading and validation with precise errors.
//!
//! Loading runs in three steps, each of which can reject the file with
//! `FILE:LINE:COLUMN: what is wrong`:
//! 1. [`positions`] walks the YAML events, indexing where every key and value starts and catching
//!    syntax errors, duplicate keys and extra documents;
//! 2. `yaml_serde` reads the [`model`] types, which deny unknown keys and parse limits, durations
//!    and names inside their visitors so that errors carry the value's position;
//! 3. [`validate`] checks what spans several keys (a store that does not fit the algorithm, two
//!    buckets with the same unique key (subject, value, api), ...) and fills in the defaults.
//!
//! ```
//! let config = spillway_core::config::load_str(
//!     "version: 1\nservices:\n  api:\n    buckets:\n      - { name: all, limit: 300/min }\n",
//!     "inline.yaml",
//! ).unwrap();
//! let bucket = &config.services[0].buckets[0];
//! assert_eq!(bucket.limit.per_second(), 5.0); // 300 a minute is 5 a second
//! assert_eq!(bucket.store.name(), "control-plane"); // the default algorithm is drop-ratio
//!
//! let err = spillway_core::config::load_str("version: 1\nservices: 7\n", "bad.yaml").unwrap_err();
//! assert_eq!(err.to_string(), "bad.yaml:2:11: invalid type: integer `7`, expected a mapping of service names to services");
//! ```

mod error;
pub mod model;
pub mod positions;
pub mod secret;
mod table;
pub mod validate;
mod warnings;

use std::path::Path;

pub use error::ConfigError;
pub(crate) use error::did_you_mean;
pub use model::{
    Algorithm, BucketFile, CandidateFile, ConcurrencyAlgorithm, ConcurrencyFile, ConfigFile,
    Control, Cost, CostHeader, CostResponse, DescriptorAnswer, DescriptorEntryFile, DescriptorFile,
    DocumentFile, FailurePolicy, HITS_ADDEND, IdentitySources, MatchFile, Mode, ProxyFile,
    RedisFile, ResponseSource, Scope, SentinelFile, ServiceFile, Services, Source, Sources,
    StateStore,
};
pub use positions::Position;
pub use secret::redact_url;
pub use table::{describe_match, render_table};
pub use validate::{
    Bucket, CANDIDATE_SUFFIX, Candidate, Config, ProxySettings, Redis, RedisTarget, Service,
    candidate_of, default_failure_policy,
};
pub use warnings::Warning;

/// The largest configuration accepted, in bytes: 8 MiB. A bucket takes a line or a few, so this
/// is far more than [`MAX_BUCKETS`] need; it refuses a runaway file before it is parsed (50 MB
/// of YAML took 1.6 GB and 25 s to check).
pub const MAX_CONFIG_BYTES: usize = 8 << 20;

/// The most buckets a configuration holds, across its services (candidates not counted).
pub const MAX_BUCKETS: usize = 20_000;

/// Reads and validates a configuration file; errors name the file as `path` is written.
pub fn load_file(path: &Path) -> Result<Config, ConfigError> {
    let bytes = read_file(path)?;
    load_bytes(&bytes, &path.display().to_string())
}

/// The bytes of a configuration file, unless it is over [`MAX_CONFIG_BYTES`]: then it is not
/// read past the limit.
fn read_file(path: &Path) -> Result<Vec<u8>, ConfigError> {
    use std::io::Read;
    let read_error = |source| ConfigError::Read {
        path: path.to_owned(),
        source,
    };
    let file = std::fs::File::open(path).map_err(read_error)?;
    let mut bytes = Vec::new();
    file.take(MAX_CONFIG_BYTES as u64 + 1)
        .read_to_end(&mut bytes)
        .map_err(read_error)?;
    if bytes.len() > MAX_CONFIG_BYTES {
        let size = std::fs::metadata(path).map_or(bytes.len() as u64, |m| m.len());
        check_size(
            usize::try_from(size).unwrap_or(usize::MAX),
            &path.display().to_string(),
        )?;
    }
    Ok(bytes)
}

/// Like [`load_file`], with the [`Warning`]s of a file that loads: what `spillway check` prints.
pub fn check_file(path: &Path) -> Result<(Config, Vec<Warning>), ConfigError> {
    let bytes = read_file(path)?;
    let file_name = path.display().to_string();
    let config = load_bytes(&bytes, &file_name)?;
    // The file loaded, so it is UTF-8 and indexes.
    let warnings = std::str::from_utf8(&bytes)
        .ok()
        .and_then(|text| positions::Positions::index(text).ok())
        .map(|positions| {
            let mut all = warnings::identity(&config.identity, &positions, &file_name);
            all.extend(warnings::budgets(&config, &positions, &file_name));
            all
        })
        .unwrap_or_default();
    Ok((config, warnings))
}

/// Validates a configuration held in memory; `file_name` is what error messages call it. A text
/// over [`MAX_CONFIG_BYTES`] is refused unread.
pub fn load_str(text: &str, file_name: &str) -> Result<Config, ConfigError> {
    check_size(text.len(), file_name)?;
    load_rendered(text, file_name)
}

/// Refuses a configuration of `bytes` over [`MAX_CONFIG_BYTES`], naming the limit.
pub fn check_size(bytes: usize, file_name: &str) -> Result<(), ConfigError> {
    if bytes <= MAX_CONFIG_BYTES {
        return Ok(());
    }
    Err(ConfigError::Invalid {
        file: file_name.to_owned(),
        position: Position::START,
        message: format!(
            "the configuration is {bytes} bytes, over the limit of {MAX_CONFIG_BYTES} bytes \
             (8 MiB); a configuration holds at most {MAX_BUCKETS} buckets, which fit well \
             within it"
        ),
    })
}

/// [`load_str`] for a text this program wrote from rules it already holds (with every default
/// spelled out, so it can be longer than the file they came from): not refused for its size in
/// bytes. The limit of [`MAX_BUCKETS`] holds all the same.
pub fn load_rendered(text: &str, file_name: &str) -> Result<Config, ConfigError> {
    let invalid = |position, message| ConfigError::Invalid {
        file: file_name.to_owned(),
        position: clamp(position, text),
        message,
    };
    let positions =
        positions::Positions::index(text).map_err(|e| invalid(e.position, e.message))?;
    if !positions.has_root() {
        return Err(invalid(
            Position::START,
            "the file holds no configuration; it starts with `version: 1`".to_owned(),
        ));
    }
    let file: DocumentFile = yaml_serde::from_str(text).map_err(|err| {
        let (position, message) = error::from_yaml(&err, &positions);
        invalid(position, message)
    })?;
    let (file, concurrency, proxy) = file.split();
    let mut config =
        validate::validate(file, &positions).map_err(|e| invalid(e.position, e.message))?;
    config.concurrency = concurrency
        .map(|c| validate::concurrency(c, &positions))
        .transpose()
        .map_err(|e| invalid(e.position, e.message))?;
    if let Some(proxy) = proxy {
        config.proxy =
            validate::proxy(proxy, &positions).map_err(|e| invalid(e.position, e.message))?;
    }
    Ok(config)
}

/// Keeps a position inside the text: parsers report an error at the end of the stream one line
/// past the last one when the file does not end with a newline.
pub(crate) fn clamp(position: Position, text: &str) -> Position {
    let lines: Vec<&str> = text.split('\n').collect();
    let line = position.line.clamp(1, lines.len());
    let width = lines[line - 1].chars().count() + 1;
    let column = if line < position.line {
        width
    } else {
        position.column.clamp(1, width)
    };
    Position { line, column }
}

/// Like [`load_str`], for bytes that may not be UTF-8 text.
pub fn load_bytes(bytes: &[u8], file_name: &str) -> Result<Config, ConfigError> {
    check_size(bytes.len(), file_name)?;
    load_str(utf8(bytes, file_name)?, file_name)
}

/// The text of a file, or where it stops being UTF-8.
pub(crate) fn utf8<'a>(bytes: &'a [u8], file_name: &str) -> Result<&'a str, ConfigError> {
    match std::str::from_utf8(bytes) {
        Ok(text) => Ok(text),
        Err(err) => {
            let valid = String::from_utf8_lossy(&bytes[..err.valid_up_to()]);
            let line = valid.matches('\n').count() + 1;
            let column = valid.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
            Err(ConfigError::Invalid {
                file: file_name.to_owned(),
                position: Position { line, column },
                message: format!(
                    "the file is not UTF-8 text (byte 0x{:02x}); save it as UTF-8",
                    bytes[err.valid_up_to()]
                ),
            })
        }
    }
}

/// The JSON Schema of the configuration file, generated from the [`model`] types.
pub fn json_schema() -> serde_json::Value {
    serde_json::to_value(schemars::schema_for!(DocumentFile))
        .expect("a generated schema is always representable as JSON")
}
