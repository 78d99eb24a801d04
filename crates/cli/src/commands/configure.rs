//! `spillway configure plan`: limits proposed from traffic history, nothing changed.
//! Wiring only: the sources, policies and reports are in `spillway-configure`.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use clap::{ArgGroup, Args, ValueEnum};
use spillway_configure::builtin::BuiltinSource;
use spillway_configure::prometheus::{PrometheusSource, Query};
use spillway_configure::settings::{self, FileError};
use spillway_configure::synthetic::SyntheticSource;
use spillway_configure::{
    CapacityFile, CurrentLimits, Headroom, HistorySource, Params, PlanError, PolicyFile,
    PolicyKind, QuotaFile, Settings, SourceError, Window, chart, report,
};
use spillway_rules::client::RulesClient;

use crate::duration::duration;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Output {
    Table,
    Json,
}

#[derive(Debug, Args)]
#[command(group = ArgGroup::new("limits").required(true).args(["config", "server"]))]
pub struct PlanArgs {
    /// Where the history comes from: `prometheus:URL` (the Prometheus HTTP API),
    /// `builtin:DATABASE_URL` (the history the controllers write into the rules store), or
    /// `synthetic:N[:SEED]` (N generated series, to try the configurator and benchmark it).
    #[arg(long, value_name = "SOURCE")]
    pub source: String,
    /// The PromQL of the offered load; its series carry `service` and `bucket`, or `service`,
    /// `caller` and `procedure` (one new bucket per pair). Default:
    /// sum by (service, bucket) (rate(spillway_requests_total{decision!="candidate_dropped"}[1m])).
    #[arg(long, value_name = "PROMQL")]
    pub query: Option<String>,
    /// How limits are proposed, for services the policy file does not name.
    #[arg(long, value_enum, default_value = "historical")]
    pub policy: PolicyArg,
    /// How much history to read, like `28d` or `14d`.
    #[arg(long, default_value = "28d", value_parser = duration)]
    pub lookback: Duration,
    /// The end of the lookback (Unix seconds or a UTC time like 2025-03-01T00:00:00Z); default
    /// now.
    #[arg(long, value_name = "TIME")]
    pub until: Option<String>,
    /// `historical`: the quantile of the lookback's per-minute rates (0.999 passes over the
    /// ~40 highest minutes of 28 days).
    #[arg(long, default_value_t = settings::DEFAULT_QUANTILE)]
    pub quantile: f64,
    /// How far above the evidence a limit goes (0.25 is 25%), or `auto`: from the history's
    /// volatility (the spread of its daily peaks, or the forecast's band).
    #[arg(long, default_value = "0.25")]
    pub headroom: String,
    /// A proposal stays within [current / (1 + C), current x (1 + C)].
    #[arg(long, value_name = "C", default_value_t = settings::DEFAULT_MAX_CHANGE)]
    pub max_change: f64,
    /// Never propose below this (requests/s, or a limit like 600/min); default current / (1 + C).
    #[arg(long, value_name = "RATE")]
    pub floor: Option<String>,
    /// Never propose above this (requests/s, or a limit like 5000/s).
    #[arg(long, value_name = "RATE")]
    pub ceiling: Option<String>,
    /// The `fixed` policy's quotas: `quotas: [{service, bucket, limit}]`.
    #[arg(long, value_name = "FILE")]
    pub quota_file: Option<PathBuf>,
    /// `forecast`'s planned capacity: `capacity: [{service, from, until, multiplier}]` (service
    /// optional, dates like 2026-12-24, both included): next week's forecast of those days times
    /// the multiplier.
    #[arg(long, value_name = "FILE")]
    pub capacity_file: Option<PathBuf>,
    /// Policy and parameters per service: `services: {NAME: {policy: forecast, headroom: 0.3}}`;
    /// the flags are the defaults.
    #[arg(long, value_name = "FILE")]
    pub policy_file: Option<PathBuf>,
    /// The current limits come from this configuration file...
    #[arg(short, long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// ... or from the rules service.
    #[arg(long, value_name = "URL")]
    pub server: Option<String>,
    /// The rules service's bearer token.
    #[arg(
        long,
        env = "SPILLWAY_TOKEN",
        hide_env_values = true,
        requires = "server"
    )]
    pub token: Option<String>,
    /// The CA (PEM) an https:// rules service's certificate must chain to.
    #[arg(long, value_name = "FILE", env = "SPILLWAY_CA", requires = "server")]
    pub ca: Option<PathBuf>,
    /// A table for people, or the plan's JSON (`{"proposals": [...]}`) for programs.
    #[arg(long, value_enum, default_value = "table")]
    pub output: Output,
    /// Write an SVG per bucket here: history, forecast band, current and proposed limit.
    #[arg(long, value_name = "DIR")]
    pub chart: Option<PathBuf>,
    /// How much history one Prometheus range query asks for (at most 11,000 minutes).
    #[arg(long, default_value = "7d", value_parser = duration)]
    pub chunk: Duration,
    /// Below this share of the lookback's minutes a series is too gappy: its limit is kept.
    #[arg(long, default_value_t = settings::DEFAULT_MIN_COVERAGE)]
    pub min_coverage: f64,
    /// Propose a limit of each region's own for every `scope: region` bucket in force, from
    /// that region's history (a builtin: source).
    #[arg(long)]
    pub per_region: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum PolicyArg {
    Historical,
    Forecast,
    Fixed,
}

/// Names the subcommand that runs, for messages (`plan` when none is named).
pub(super) fn set_command(name: &'static str) {
    let _ = COMMAND.set(name);
}

/// `plan` or `apply`, for messages.
static COMMAND: std::sync::OnceLock<&'static str> = std::sync::OnceLock::new();

fn command() -> &'static str {
    COMMAND.get().copied().unwrap_or("plan")
}

pub(super) fn usage(message: impl std::fmt::Display) -> ExitCode {
    eprintln!("spillway configure {}: {message}", command());
    ExitCode::from(2)
}

pub(super) fn failure(message: impl std::fmt::Display) -> ExitCode {
    eprintln!("spillway configure {}: {message}", command());
    ExitCode::from(1)
}

/// A rate flag: requests per second, or a limit as the configuration file writes it.
fn rate(name: &str, text: &str) -> Result<f64, String> {
    let value = match text.trim().parse::<f64>() {
        Ok(value) => value,
        Err(_) => spillway_core::limit::Limit::parse(text)
            .map_err(|e| format!("--{name}: {e}, or requests per second like 250"))?
            .per_second(),
    };
    settings::check_limit(&format!("--{name}"), value)
}

fn read(path: &Path) -> Result<String, String> {
    std::fs::read_to_string(path)
        .map_err(|e| format!("{}: cannot read the file: {e}", path.display()))
}

fn settings(args: &PlanArgs) -> Result<Settings, String> {
    let defaults = Params {
        policy: match args.policy {
            PolicyArg::Historical => PolicyKind::Historical,
            PolicyArg::Forecast => PolicyKind::Forecast,
            PolicyArg::Fixed => PolicyKind::Fixed,
        },
        quantile: settings::check_quantile(args.quantile).map_err(|e| format!("--{e}"))?,
        headroom: args
            .headroom
            .parse::<Headroom>()
            .map_err(|e| format!("--{e}"))?,
        max_change: settings::check_max_change(args.max_change).map_err(|e| format!("--{e}"))?,
        floor: args
            .floor
            .as_deref()
            .map(|f| rate("floor", f))
            .transpose()?,
        ceiling: args
            .ceiling
            .as_deref()
            .map(|c| rate("ceiling", c))
            .transpose()?,
    };
    defaults.check()?;
    if !(0.0..=1.0).contains(&args.min_coverage) {
        return Err(format!(
            "--min-coverage {}: write a share from 0 to 1",
            args.min_coverage
        ));
    }
    let mut settings = Settings::new(defaults);
    settings.min_coverage = args.min_coverage;
    let located = |e: FileError| e.to_string();
    if let Some(path) = &args.policy_file {
        settings.policy_file = PolicyFile::parse(
            &read(path)?,
            &path.display().to_string(),
            &settings.defaults,
        )
        .map_err(located)?;
    }
    if let Some(path) = &args.quota_file {
        settings.quotas =
            Some(QuotaFile::parse(&read(path)?, &path.display().to_string()).map_err(located)?);
    }
    if let Some(path) = &args.capacity_file {
        if !settings.uses(PolicyKind::Forecast) {
            return Err(
                "--capacity-file multiplies forecasts: give --policy forecast (or name it for a \
                 service in --policy-file)"
                    .to_owned(),
            );
        }
        settings.capacity =
            Some(CapacityFile::parse(&read(path)?, &path.display().to_string()).map_err(located)?);
    }
    if settings.uses(PolicyKind::Fixed) && settings.quotas.is_none() {
        return Err("the fixed policy takes its limits from --quota-file FILE".to_owned());
    }
    Ok(settings)
}

/// Why a source cannot be used: bad input (2), or a store that cannot be reached (1).
enum Unusable {
    Usage(String),
    Failure(String),
}

impl From<String> for Unusable {
    fn from(message: String) -> Self {
        Unusable::Usage(message)
    }
}

impl From<&str> for Unusable {
    fn from(message: &str) -> Self {
        Unusable::Usage(message.to_owned())
    }
}

fn source(args: &PlanArgs) -> Result<Box<dyn HistorySource>, Unusable> {
    let (kind, rest) = args.source.split_once(':').unwrap_or((&args.source, ""));
    match kind {
        "prometheus" => {
            let query = args.query.clone().map_or(Query::Default, Query::Custom);
            PrometheusSource::new(rest, query, args.chunk)
                .map(|s| Box::new(s) as Box<dyn HistorySource>)
                .map_err(|e| e.to_string().into())
        }
        "synthetic" => {
            if args.query.is_some() {
                return Err("--query is for a prometheus: source".into());
            }
            let (count, seed) = rest.split_once(':').unwrap_or((rest, "1"));
            let wrong = || {
                format!(
                    "--source {}: write synthetic:N or synthetic:N:SEED (N series, at least 1), like \
                     synthetic:100",
                    args.source
                )
            };
            let count: usize = count.parse().ok().filter(|n| *n > 0).ok_or_else(wrong)?;
            let seed: u64 = seed.parse().map_err(|_| wrong())?;
            Ok(Box::new(SyntheticSource::new(count, seed)))
        }
        "builtin" => {
            if args.query.is_some() {
                return Err("--query is for a prometheus: source".into());
            }
            match BuiltinSource::open(rest) {
                Ok(source) => Ok(Box::new(source)),
                Err(err @ SourceError::Unreachable { .. }) => {
                    Err(Unusable::Failure(err.to_string()))
                }
                Err(err) => Err(err.to_string().into()),
            }
        }
        _ => Err(format!(
            "--source {}: write prometheus:URL (like prometheus:http://127.0.0.1:9090), \
             builtin:DATABASE_URL (the rules store the controllers write history to) or \
             synthetic:N",
            args.source
        )
        .into()),
    }
}

/// The current limits: from `-c FILE` (bad configuration: 2) or the rules service (1 when it
/// cannot be asked).
fn current(args: &PlanArgs) -> Result<CurrentLimits, ExitCode> {
    if let Some(path) = &args.config {
        return spillway_core::config::load_file(path)
            .map(|config| CurrentLimits::from_config(&config))
            .map_err(|err| {
                eprintln!("{err}");
                ExitCode::from(2)
            });
    }
    let rules = client(args)?
        .rules(None)
        .map_err(|e| failure(format!("the current limits: {e}")))?;
    Ok(CurrentLimits::from_rules(&rules))
}

/// The rules service of `--server`, with `--token` and `--ca`.
pub(super) fn client(args: &PlanArgs) -> Result<RulesClient, ExitCode> {
    let server = args.server.as_deref().unwrap_or_default();
    match &args.ca {
        Some(ca) => RulesClient::with_ca(server, args.token.clone(), ca)
            .map_err(|e| usage(format!("--ca: {e}"))),
        None => Ok(RulesClient::new(server, args.token.clone())),
    }
}

fn now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

/// A plan made, with its source (still open, for what a rollout asks it next).
pub(super) struct Planned {
    pub plan: spillway_configure::Plan,
    pub source: Box<dyn HistorySource>,
    pub chart_error: Option<String>,
    pub began: Instant,
}

/// Checks the flags, opens the source, reads the current limits with `current` and plans.
pub(super) fn planned(
    args: &PlanArgs,
    current: impl FnOnce() -> Result<CurrentLimits, ExitCode>,
) -> Result<Planned, ExitCode> {
    let settings = settings(args).map_err(usage)?;
    let until = match args
        .until
        .as_deref()
        .map(spillway_configure::time::parse_time)
    {
        None => now(),
        Some(Ok(at)) => at,
        Some(Err(err)) => return Err(usage(format!("--until: {err}"))),
    };
    if args.lookback < Duration::from_secs(3600) {
        return Err(usage(
            "--lookback: give at least 1h (the policies read days and weeks)",
        ));
    }
    let window = Window::ending(until, args.lookback.as_secs() as i64);
    let mut source = match source(args) {
        Ok(source) => source,
        Err(Unusable::Usage(err)) => return Err(usage(err)),
        Err(Unusable::Failure(err)) => return Err(failure(err)),
    };
    let current = current()?;
    if args.per_region {
        let regional: Vec<(String, String)> = current
            .buckets
            .iter()
            .filter(|b| b.regional.is_some())
            .map(|b| (b.service.clone(), b.bucket.clone()))
            .collect();
        source.per_region(&regional).map_err(usage)?;
    }
    if let Some(dir) = &args.chart
        && let Err(err) = std::fs::create_dir_all(dir)
    {
        return Err(failure(format!("--chart {}: {err}", dir.display())));
    }
    let began = Instant::now();
    let mut chart_error = None;
    let planned = spillway_configure::plan(source.as_mut(), window, &settings, &current, |p, h| {
        if let Some(dir) = &args.chart
            && chart_error.is_none()
        {
            let path = dir.join(chart::file_name(p));
            let written = chart::svg(p, h)
                .and_then(|svg| std::fs::write(&path, svg).map_err(|e| e.to_string()));
            if let Err(err) = written {
                chart_error = Some(format!("{}: {err}", path.display()));
            }
        }
    });
    let plan = match planned {
        Ok(plan) => plan,
        // Bad input (2): series without the labels a proposal needs, a source spelt wrong, or
        // a query Prometheus refuses as bad data (400, as `spillway rules` treats a refused
        // rule). A source that cannot be reached or fails is a failure at run time (1).
        Err(PlanError::Source(
            err @ (SourceError::Labels(_)
            | SourceError::Usage(_)
            | SourceError::Status { status: 400, .. }),
        )) => {
            return Err(usage(err));
        }
        Err(err) => return Err(failure(err)),
    };
    Ok(Planned {
        plan,
        source,
        chart_error,
        began,
    })
}

pub(super) fn plan(args: &PlanArgs) -> ExitCode {
    let Planned {
        plan,
        source,
        chart_error,
        began,
    } = match planned(args, || current(args)) {
        Ok(planned) => planned,
        Err(code) => return code,
    };
    for warning in &plan.warnings {
        eprintln!("warning: {warning}");
    }
    let text = match args.output {
        Output::Table => report::table(&plan),
        Output::Json => match serde_json::to_string_pretty(&report::json(&plan)) {
            Ok(text) => text + "\n",
            Err(err) => return failure(err),
        },
    };
    use std::io::Write as _;
    if let Err(err) = std::io::stdout().lock().write_all(text.as_bytes())
        && err.kind() != std::io::ErrorKind::BrokenPipe
    {
        return failure(format!("cannot write to stdout: {err}"));
    }
    eprintln!(
        "planned {} series from {} in {:.1}s",
        plan.series,
        source.describe(),
        began.elapsed().as_secs_f64()
    );
    if let Some(err) = chart_error {
        return failure(format!("--chart: {err}"));
    }
    ExitCode::SUCCESS
}
