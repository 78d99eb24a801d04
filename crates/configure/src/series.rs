//! History as the configurator sees it: per-minute rates of one series, from a source that hands
//! out one series at a time.

use std::fmt;

/// The rate of one minute: requests per second averaged over the minute that ends at `at`
/// (Unix seconds, a multiple of 60), which is how Prometheus stamps `rate(...[1m])`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Point {
    pub at: i64,
    pub rps: f64,
}

/// What a series is the load of: a bucket of a service, or a (caller, procedure) pair that
/// would become a new bucket (GRL's RLC proposes one per pair).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SeriesTarget {
    Bucket(String),
    Pair { caller: String, procedure: String },
}

/// One series' identity. `region` is `None` for a series summed over regions; the built-in
/// source sets it for the region-scoped buckets of `--per-region`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SeriesKey {
    pub service: String,
    pub target: SeriesTarget,
    pub region: Option<String>,
}

impl SeriesKey {
    pub fn bucket(service: &str, bucket: &str) -> Self {
        SeriesKey {
            service: service.to_owned(),
            target: SeriesTarget::Bucket(bucket.to_owned()),
            region: None,
        }
    }

    pub fn pair(service: &str, caller: &str, procedure: &str) -> Self {
        SeriesKey {
            service: service.to_owned(),
            target: SeriesTarget::Pair {
                caller: caller.to_owned(),
                procedure: procedure.to_owned(),
            },
            region: None,
        }
    }
}

impl fmt::Display for SeriesKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.target {
            SeriesTarget::Bucket(bucket) => write!(f, "{}/{bucket}", self.service)?,
            SeriesTarget::Pair { caller, procedure } => {
                write!(f, "{} caller={caller} procedure={procedure}", self.service)?
            }
        }
        if let Some(region) = &self.region {
            write!(f, " region={region}")?;
        }
        Ok(())
    }
}

/// The lookback: the minutes that end in `(start, end]`, both multiples of 60.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    pub start: i64,
    pub end: i64,
}

pub const MINUTE: i64 = 60;
pub const HOUR: i64 = 3600;
pub const DAY: i64 = 86_400;
pub const WEEK: i64 = 7 * DAY;

impl Window {
    /// The `lookback` seconds before `until`, both rounded down to whole minutes.
    pub fn ending(until: i64, lookback: i64) -> Self {
        let end = until.div_euclid(MINUTE) * MINUTE;
        let lookback = (lookback.div_euclid(MINUTE) * MINUTE).max(MINUTE);
        Window {
            start: end - lookback,
            end,
        }
    }

    /// Minutes in the window: as many points as a gapless series has.
    pub fn minutes(&self) -> usize {
        usize::try_from((self.end - self.start) / MINUTE).unwrap_or(0)
    }

    /// Whole days in the window, counted back from its end.
    pub fn days(&self) -> usize {
        usize::try_from((self.end - self.start) / DAY).unwrap_or(0)
    }

    /// Whole hours in the window.
    pub fn hours(&self) -> usize {
        usize::try_from((self.end - self.start) / HOUR).unwrap_or(0)
    }

    pub fn contains(&self, at: i64) -> bool {
        at > self.start && at <= self.end
    }

    /// The day (0 = the oldest whole day) of a minute that ends at `at`, counted back from the
    /// end so every day is whole; `None` for the part of the window before its first whole day.
    pub fn day_of(&self, at: i64) -> Option<usize> {
        let age = usize::try_from((self.end - at).div_euclid(DAY)).ok()?;
        self.days().checked_sub(age + 1)
    }

    /// The hour (0 = the oldest whole hour) of a minute that ends at `at`, counted back from
    /// the end like [`Window::day_of`].
    pub fn hour_of(&self, at: i64) -> Option<usize> {
        let age = usize::try_from((self.end - at).div_euclid(HOUR)).ok()?;
        self.hours().checked_sub(age + 1)
    }

    /// When day `day` of [`Window::day_of`] starts; days past the window continue the count.
    pub fn day_start(&self, day: usize) -> i64 {
        self.end - (self.days() as i64 - day as i64) * DAY
    }
}

/// Why a source could not give its history.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    #[error("cannot reach {what} at {url}: {detail}")]
    Unreachable {
        what: &'static str,
        url: String,
        detail: String,
    },
    #[error("{what} at {url} answered {status}: {detail}")]
    Status {
        what: &'static str,
        url: String,
        status: u16,
        detail: String,
    },
    #[error("{what} at {url} answered something unexpected: {detail}")]
    Body {
        what: &'static str,
        url: String,
        detail: String,
    },
    /// The series do not carry the labels that say what they are the load of.
    #[error("{0}")]
    Labels(String),
    #[error("{0}")]
    Usage(String),
}

/// The limit a validation window tries: a shadow bucket's own, or an enforcing bucket's
/// `candidate`, whose virtual drops are counted as `candidate_dropped`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trial {
    Shadow,
    Candidate,
}

/// A source of history: one series at a time, each whole and in time order, so a planner holds
/// one series however many there are.
///
/// A source is blocking; one over an async client (the built-in source, over the rules store)
/// drives its own runtime inside [`HistorySource::next_series`].
pub trait HistorySource {
    /// Clears `points`, fills it with the next series' per-minute rates within `window` in time
    /// order (a minute without a value is a gap: no point) and returns the series' key, or
    /// `None` when every series has been handed out.
    fn next_series(
        &mut self,
        window: Window,
        points: &mut Vec<Point>,
    ) -> Result<Option<SeriesKey>, SourceError>;

    /// What the source is, for messages: `Prometheus at http://...`.
    fn describe(&self) -> String;

    /// What a bucket's requests were over `[from_ms, until_ms)`: (offered, would have been
    /// dropped by the limit on `trial`), for a validation window; `None` when the source
    /// cannot say.
    fn seen(
        &mut self,
        _service: &str,
        _bucket: &str,
        _trial: Trial,
        _from_ms: i64,
        _until_ms: i64,
    ) -> Result<Option<(f64, f64)>, SourceError> {
        Ok(None)
    }

    /// Reads each of `buckets` (service, bucket; the region-scoped buckets in force) as one
    /// series per region (`--per-region`). Only a source that knows regions can.
    fn per_region(&mut self, _buckets: &[(String, String)]) -> Result<(), SourceError> {
        Err(SourceError::Usage(format!(
            "--per-region needs a history per region, which {} does not keep: use a builtin: \
             source (each controller writes its own region's history)",
            self.describe()
        )))
    }

    /// Up to when (Unix ms) the source has its history: a validation window that ends later is
    /// not all there yet. `None` when the source cannot say (it is then taken as complete).
    fn written_until(&mut self) -> Result<Option<i64>, SourceError> {
        Ok(None)
    }

    /// What to check when the source has no series over a lookback.
    fn when_empty(&self) -> &'static str {
        "is it scraping Spillway's proxies, and does the query select their metrics?"
    }
}
