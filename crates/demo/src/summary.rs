//! The demo's summary: the numbers the demo is ask about, computed from the recorder.
//!
//! Enforcement delay: from the surge until the admitted rate, over a trailing window of 250 ms
//! whatever the report interval, first falls to within 5% of the limit; the window's end counts,
//! so the figure is never flattered by the window. Steady state: the admitted rate from
//! two seconds after the surge to the end. Added latency: the p99 of requests the sidecars
//! forwarded minus the p99 of direct requests to the same upstream in the same run.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use crate::load::{BIN, Recorder};

/// A bucket of the demo and its limit.
#[derive(Debug, Clone, Copy)]
pub struct BucketPlan {
    pub name: &'static str,
    pub limit: f64,
}

/// What the demo measured.
#[derive(Debug, Clone)]
pub struct Summary {
    pub seconds: f64,
    pub report_interval: Duration,
    pub bucket: &'static str,
    pub limit: f64,
    pub offered_before: f64,
    pub offered_surge: f64,
    /// Admitted a second from two seconds after the surge to the end.
    pub admitted_steady: f64,
    /// `None` when admitted never came within 5% of the limit.
    pub enforcement_delay: Option<Duration>,
    /// Where in its report interval the surge began, from 0 (at its start) to 1: the first
    /// ratio is whole when the surge began before the interval's last quarter, and the first
    /// instruction comes `(1 - phase)` intervals after the surge.
    pub surge_phase: f64,
    pub proxied_p99: Duration,
    pub direct_p99: Duration,
    pub errors: u64,
    pub chart: PathBuf,
}

fn p99(samples: &std::sync::Mutex<Vec<u32>>) -> Duration {
    let mut v = samples.lock().map(|v| v.clone()).unwrap_or_default();
    if v.is_empty() {
        return Duration::ZERO;
    }
    v.sort_unstable();
    let i = ((v.len() as f64 * 0.99).ceil() as usize).clamp(1, v.len()) - 1;
    Duration::from_micros(u64::from(v[i]))
}

impl Summary {
    pub fn compute(
        recorder: &Recorder,
        plans: &[BucketPlan],
        surge_at: f64,
        surge_phase: f64,
        seconds: f64,
        report_interval: Duration,
        chart: PathBuf,
    ) -> Summary {
        let bin_s = BIN.as_secs_f64();
        let to_bin = |t: f64| (t / bin_s).round() as usize;
        let series = &recorder.series[0];
        let limit = plans[0].limit;
        let surge = to_bin(surge_at);
        let end = to_bin(seconds);
        let window = to_bin(0.25).max(1);
        let enforcement_delay = (surge + window..=end)
            .find(|&b| series.rates(b - window, b).1 <= limit * 1.05)
            .map(|b| Duration::from_secs_f64((b - surge) as f64 * bin_s));
        let steady_from = to_bin(surge_at + 2.0).min(end.saturating_sub(1));
        Summary {
            seconds,
            report_interval,
            bucket: plans[0].name,
            limit,
            offered_before: series.rates(to_bin(0.5), surge).0,
            offered_surge: series.rates(surge, end).0,
            admitted_steady: series.rates(steady_from, end).1,
            enforcement_delay,
            surge_phase,
            proxied_p99: p99(&recorder.proxied_us),
            direct_p99: p99(&recorder.direct_us),
            errors: recorder
                .series
                .iter()
                .map(|s| s.errors.load(std::sync::atomic::Ordering::Relaxed))
                .sum(),
            chart,
        }
    }
}

impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ms = |d: Duration| d.as_secs_f64() * 1000.0;
        writeln!(
            f,
            "spillway demo: {:.0} s, 4 sidecars in 2 zones, reports every {} ms",
            self.seconds,
            self.report_interval.as_millis()
        )?;
        writeln!(f, "bucket {}", self.bucket)?;
        writeln!(f, "  limit                    {:.0}/s", self.limit)?;
        writeln!(
            f,
            "  offered                  {:.0}/s before the surge, {:.0}/s during it ({:.1}x)",
            self.offered_before,
            self.offered_surge,
            self.offered_surge / self.offered_before.max(1.0)
        )?;
        writeln!(
            f,
            "  admitted (steady state)  {:.1}/s ({:.3}x the limit)",
            self.admitted_steady,
            self.admitted_steady / self.limit
        )?;
        match self.enforcement_delay {
            Some(d) => writeln!(
                f,
                "  enforcement delay        {:.2} s (from the surge until admitted is within 5% of the limit)",
                d.as_secs_f64()
            )?,
            None => writeln!(
                f,
                "  enforcement delay        never (admitted did not come within 5% of the limit)"
            )?,
        }
        writeln!(
            f,
            "  surge phase              {:.2} of its report interval (which ended {:.2} s after the surge)",
            self.surge_phase,
            (1.0 - self.surge_phase) * self.report_interval.as_secs_f64()
        )?;
        writeln!(
            f,
            "  added p99 latency        {:.2} ms (through a sidecar {:.2} ms, direct {:.2} ms)",
            ms(self.proxied_p99) - ms(self.direct_p99),
            ms(self.proxied_p99),
            ms(self.direct_p99)
        )?;
        if self.errors > 0 {
            writeln!(f, "  errors                   {}", self.errors)?;
        }
        writeln!(f, "chart: {}", self.chart.display())
    }
}
