//! The built-in history source, `builtin:DATABASE_URL`: what the controllers with
//! `--database` wrote into the rules store, each its own region's counts per bucket per
//! `--history-resolution`, read back as per-minute rates with the regions summed.
//!
//! A minute's rate in a region is its counts over the seconds of the minute the region was heard
//! from (a controller that started mid-minute gives the rate of the part it saw); a region heard
//! from without a row for the bucket had no traffic for it; a minute no region was heard from is
//! a gap. A bucket is summed over regions, so a global bucket's series is its global load,
//! except the region-scoped buckets given to `per_region` (`--per-region`,
//! ): each has one series per region heard from in the window, that region's own
//! load, for a limit of that region's own.
//!
//! The store is async; this source drives a runtime of its own so that it can stay behind the
//! blocking [`HistorySource`] trait.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};

use spillway_db::HistoryTables;
use spillway_db::history::HistoryTotals;

use crate::series::{HistorySource, MINUTE, Point, SeriesKey, SourceError, Trial, Window};

/// A series to read: service, bucket, and the region of a bucket split by region.
type Listed = (String, String, Option<String>);

/// The rules store's history; see the module's documentation.
pub struct BuiltinSource {
    runtime: tokio::runtime::Runtime,
    store: HistoryTables,
    /// The URL without its credentials, for messages.
    shown: String,
    /// The series of the window read so far (a region for a bucket split by region), and that
    /// window.
    listed: Option<(Window, VecDeque<Listed>)>,
    /// The buckets whose series are one per region.
    regional: BTreeSet<(String, String)>,
    /// Seconds each region was heard from in each minute (Unix minutes) of the window.
    coverage: BTreeMap<i64, HashMap<String, f64>>,
}

/// `postgres://user:secret@host/db` as `postgres://host/db`.
fn without_credentials(url: &str) -> String {
    match url.split_once("://") {
        Some((scheme, rest)) => match rest.split_once('@') {
            Some((_, host)) if !rest.starts_with('/') => format!("{scheme}://{host}"),
            _ => url.to_owned(),
        },
        None => url.to_owned(),
    }
}

impl BuiltinSource {
    /// Opens the rules store at `url` (`sqlite://PATH` or `postgres://...`).
    pub fn open(url: &str) -> Result<Self, SourceError> {
        let shown = without_credentials(url);
        if spillway_db::normalize(url).is_err() {
            return Err(SourceError::Usage(format!(
                "--source builtin:{shown}: write builtin:sqlite://PATH or \
                 builtin:postgres://USER@HOST/DB, the rules store the controllers write to"
            )));
        }
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| SourceError::Usage(format!("cannot start a runtime: {e}")))?;
        let store =
            runtime
                .block_on(HistoryTables::open(url))
                .map_err(|e| SourceError::Unreachable {
                    what: "the rules store",
                    url: shown.clone(),
                    detail: e.to_string(),
                })?;
        Ok(BuiltinSource {
            runtime,
            store,
            shown,
            listed: None,
            coverage: BTreeMap::new(),
            regional: BTreeSet::new(),
        })
    }

    fn failed(&self, err: spillway_db::DbError) -> SourceError {
        SourceError::Unreachable {
            what: "the rules store",
            url: self.shown.clone(),
            detail: err.to_string(),
        }
    }

    /// One bucket's counts over `[from_ms, until_ms)`, regions summed: what a shadow bucket's
    /// validation window saw (offered, admitted, and what it would have dropped).
    pub fn totals(
        &self,
        service: &str,
        bucket: &str,
        from_ms: i64,
        until_ms: i64,
    ) -> Result<HistoryTotals, SourceError> {
        self.runtime
            .block_on(
                self.store
                    .history_totals(service, bucket, from_ms, until_ms),
            )
            .map_err(|e| self.failed(e))
    }

    fn list(&mut self, window: Window) -> Result<(), SourceError> {
        let (from, until) = (window.start * 1000, window.end * 1000);
        let series = self
            .runtime
            .block_on(self.store.history_series(from, until))
            .map_err(|e| self.failed(e))?;
        let coverage = self
            .runtime
            .block_on(self.store.history_coverage(from, until))
            .map_err(|e| self.failed(e))?;
        self.coverage.clear();
        for (region, minute, seconds) in coverage {
            if seconds > 0.0 {
                *self
                    .coverage
                    .entry(minute)
                    .or_default()
                    .entry(region)
                    .or_default() += seconds;
            }
        }
        let regions: BTreeSet<&String> = self.coverage.values().flat_map(|r| r.keys()).collect();
        let mut listed = VecDeque::with_capacity(series.len());
        for (service, bucket) in series {
            if self.regional.contains(&(service.clone(), bucket.clone())) {
                for region in &regions {
                    listed.push_back((service.clone(), bucket.clone(), Some((*region).clone())));
                }
            } else {
                listed.push_back((service, bucket, None));
            }
        }
        self.listed = Some((window, listed));
        Ok(())
    }
}

impl HistorySource for BuiltinSource {
    fn next_series(
        &mut self,
        window: Window,
        points: &mut Vec<Point>,
    ) -> Result<Option<SeriesKey>, SourceError> {
        points.clear();
        if self.listed.as_ref().is_none_or(|(w, _)| *w != window) {
            self.list(window)?;
        }
        let Some((service, bucket, only)) = self.listed.as_mut().and_then(|(_, s)| s.pop_front())
        else {
            return Ok(None);
        };
        let minutes = self
            .runtime
            .block_on(self.store.history_minutes(
                &service,
                &bucket,
                window.start * 1000,
                window.end * 1000,
            ))
            .map_err(|e| self.failed(e))?;
        let mut offered: HashMap<(i64, &str), u64> = HashMap::new();
        for m in &minutes {
            offered.insert((m.minute, m.region.as_str()), m.offered);
        }
        for (&minute, regions) in &self.coverage {
            let at = (minute + 1) * MINUTE;
            if !window.contains(at) {
                continue;
            }
            if only.as_ref().is_some_and(|r| !regions.contains_key(r)) {
                // This region was not heard from in this minute: a gap of its series.
                continue;
            }
            let rps: f64 = regions
                .iter()
                .filter(|(region, _)| only.as_ref().is_none_or(|r| r == *region))
                .map(|(region, seconds)| {
                    offered
                        .get(&(minute, region.as_str()))
                        .copied()
                        .unwrap_or(0) as f64
                        / seconds
                })
                .sum();
            points.push(Point { at, rps });
        }
        let mut key = SeriesKey::bucket(&service, &bucket);
        key.region = only;
        Ok(Some(key))
    }

    fn describe(&self) -> String {
        format!("the rules store's history at {}", self.shown)
    }

    fn seen(
        &mut self,
        service: &str,
        bucket: &str,
        trial: Trial,
        from_ms: i64,
        until_ms: i64,
    ) -> Result<Option<(f64, f64)>, SourceError> {
        let totals = self.totals(service, bucket, from_ms, until_ms)?;
        let would_drop = match trial {
            Trial::Shadow => totals.shadow_dropped,
            Trial::Candidate => totals.candidate_dropped,
        };
        Ok(Some((totals.offered as f64, would_drop as f64)))
    }

    fn per_region(&mut self, buckets: &[(String, String)]) -> Result<(), SourceError> {
        self.regional = buckets.iter().cloned().collect();
        self.listed = None;
        Ok(())
    }

    fn written_until(&mut self) -> Result<Option<i64>, SourceError> {
        self.runtime
            .block_on(self.store.history_written_until())
            .map_err(|e| self.failed(e))
    }

    fn when_empty(&self) -> &'static str {
        "does a controller run with --database on this store, and has a slot of its \
         --history-resolution ended since its proxies had traffic?"
    }
}

#[cfg(test)]
mod tests {
    use super::without_credentials;

    #[test]
    fn messages_never_show_a_password() {
        assert_eq!(
            without_credentials("postgres://spw:secret@db:5432/rules"),
            "postgres://db:5432/rules"
        );
        assert_eq!(
            without_credentials("sqlite:///var/lib/rules.db"),
            "sqlite:///var/lib/rules.db"
        );
    }
}
