//! The Rate Limit Configurator: proposes limits that follow each
//! bucket's traffic history, and explains every proposal.
//!
//! The crate is sans-IO at its centre and thin at its edges:
//! - [`series`]: what history is (per-minute rates of one series) and the [`HistorySource`]
//!   trait that every source implements, one series at a time, so planning 10,000 series never
//!   holds more than one in memory;
//! - [`prometheus`], [`builtin`] and [`synthetic`]: the sources (the Prometheus HTTP API; the
//!   history the controllers write into the rules store; an in-process generator for benchmarks
//!   and tests);
//! - [`history`]: one pass over a series that gives every policy what it reads (quantiles,
//!   daily peaks, the hourly picture);
//! - [`forecast`]: the seasonal model of next week's daily peaks;
//! - [`policy`]: the [`Policy`] trait and `historical`, `forecast` and `fixed`, with the common
//!   headroom and clamps;
//! - [`mod@plan`]: a source, the current limits and the settings in, proposals out;
//! - [`report`] and [`chart`]: the table, the JSON and an SVG per bucket;
//! - [`rollout`]: shadow-first rollout, what `apply` does with a plan (create in shadow,
//!   validate, promote or hold).
#![forbid(unsafe_code)]

pub mod builtin;
pub mod chart;
pub mod current;
pub mod forecast;
pub mod history;
pub mod plan;
pub mod policy;
pub mod prometheus;
pub mod report;
pub mod rollout;
pub mod series;
pub mod settings;
pub mod stats;
pub mod synthetic;
pub mod time;

pub use current::{CurrentBucket, CurrentLimits};
pub use history::History;
pub use plan::{Evidence, Plan, PlanAction, PlanError, Proposal, plan};
pub use policy::{Policy, PolicyKind};
pub use series::{HistorySource, Point, SeriesKey, SeriesTarget, SourceError, Trial, Window};
pub use settings::{CapacityFile, Headroom, Params, PolicyFile, QuotaFile, Settings};
