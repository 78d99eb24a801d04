//! The operations artefacts in `deploy/` against the real thing: every metric that the Grafana
//! dashboard and the Prometheus alerts name is exported by a running Spillway process, promtool
//! parses every expression, and the alert rules pass `promtool check rules` and their unit tests.
//!
//! The promtool parts need Debian's `prometheus` package; without `promtool` on `PATH` they are
//! skipped with a message, unless `SPILLWAY_REQUIRE_PROMTOOL` is set, when they fail.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Seek};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use crate::support::fleet::{Proc, admin_get, wait_for};
use crate::support::{Proxy, free_port, get, upstream};
use serde_json::Value;
use spillway_testkit::RedisServer;

const ALERTS: &str = "deploy/prometheus/alerts.yml";
const ALERTS_TEST: &str = "deploy/prometheus/alerts_test.yml";
const DASHBOARD: &str = "deploy/grafana/spillway.json";
const OPERATIONS: &str = "docs/operations.md";

/// How long one promtool run may take.
const PROMTOOL_LIMIT: Duration = Duration::from_secs(60);

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn read(relative: &str) -> String {
    std::fs::read_to_string(root().join(relative))
        .unwrap_or_else(|e| panic!("reading {relative}: {e}"))
}

/// A PromQL expression of an artefact and where it is: `panel "Real drops"`, `alert X`.
struct Expr {
    origin: String,
    promql: String,
}

// ---- The dashboard's expressions.

fn dashboard() -> Value {
    serde_json::from_str(&read(DASHBOARD)).unwrap_or_else(|e| panic!("{DASHBOARD}: {e}"))
}

/// Every `expr` under the dashboard's panels, rows' nested panels included, named by the
/// nearest title; then the template variables' queries.
fn dashboard_exprs(dashboard: &Value) -> Vec<Expr> {
    let mut out = Vec::new();
    collect_exprs(&dashboard["panels"], "the dashboard", &mut out);
    let variables = dashboard["templating"]["list"].as_array();
    for variable in variables.into_iter().flatten() {
        if variable["type"] != "query" {
            continue;
        }
        let name = variable["name"].as_str().unwrap_or("?");
        let query = variable["query"]
            .as_str()
            .or_else(|| variable["query"]["query"].as_str())
            .unwrap_or_else(|| panic!("variable {name}: no query"));
        if let Some(promql) = variable_promql(name, query) {
            out.push(Expr {
                origin: format!("variable {name}"),
                promql,
            });
        }
    }
    out
}

fn collect_exprs(value: &Value, origin: &str, out: &mut Vec<Expr>) {
    match value {
        Value::Object(map) => {
            let origin = match map.get("title").and_then(Value::as_str) {
                Some(title) => format!("panel {title:?}"),
                None => origin.to_owned(),
            };
            for (key, item) in map {
                match (key.as_str(), item) {
                    ("expr", Value::String(promql)) => out.push(Expr {
                        origin: origin.clone(),
                        promql: promql.clone(),
                    }),
                    _ => collect_exprs(item, &origin, out),
                }
            }
        }
        Value::Array(items) => {
            for item in items {
                collect_exprs(item, origin, out);
            }
        }
        _ => {}
    }
}

/// The PromQL inside a Grafana variable query: `label_values(EXPR, label)` and
/// `query_result(EXPR)` hold one; `label_values(label)`, `label_names()` and `metrics(re)` none.
fn variable_promql(name: &str, query: &str) -> Option<String> {
    let query = query.trim();
    let inner = |prefix: &str| {
        query
            .strip_prefix(prefix)
            .and_then(|rest| rest.strip_suffix(')'))
            .map(str::trim)
    };
    if let Some(args) = inner("label_values(") {
        // The label is the last argument; the selector before it may hold commas of its own.
        return args
            .rsplit_once(',')
            .map(|(selector, _label)| selector.trim().to_owned());
    }
    if let Some(promql) = inner("query_result(") {
        return Some(promql.to_owned());
    }
    if query.starts_with("label_names(") || query.starts_with("metrics(") {
        return None;
    }
    panic!(
        "variable {name}: {query:?} is none of label_values, query_result, label_names, metrics"
    );
}

/// The expression with Grafana's variables replaced as a query would see them: the built-in
/// intervals by `5m`, the dashboard's variables (regex matches) by `.*`.
fn substitute(origin: &str, promql: &str) -> String {
    let mut out = String::new();
    let mut rest = promql;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        let (name, next) = match after.strip_prefix('{') {
            Some(braced) => {
                let end = braced
                    .find('}')
                    .unwrap_or_else(|| panic!("{origin}: an unclosed ${{ in {promql:?}"));
                // `${service:regex}`: the name before the format.
                let name = braced[..end].split(':').next().unwrap_or_default();
                (name, &braced[end + 1..])
            }
            None => {
                let end = after
                    .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                    .unwrap_or(after.len());
                (&after[..end], &after[end..])
            }
        };
        match name {
            "__rate_interval" | "__interval" | "__range" => out.push_str("5m"),
            builtin if builtin.starts_with("__") => {
                panic!("{origin}: no substitution for Grafana's ${builtin} in {promql:?}")
            }
            "" => panic!("{origin}: a lone $ in {promql:?}"),
            _ => out.push_str(".*"),
        }
        rest = next;
    }
    out.push_str(rest);
    out
}

// ---- The alert rules.

/// One rule of alerts.yml: its name, where it starts, and the fields the checks read.
struct Rule {
    name: String,
    line: usize,
    fields: BTreeMap<String, String>,
}

const RULE_FIELDS: [&str; 6] = [
    "expr",
    "for",
    "severity",
    "summary",
    "description",
    "runbook_url",
];

/// The rules of a rules file, read line by line: enough YAML for the file's own style (plain,
/// quoted and block scalars), while `promtool check rules` checks it as YAML. Panics on a field
/// it cannot read.
fn rules(file: &str, text: &str) -> Vec<Rule> {
    let lines: Vec<&str> = text.lines().collect();
    let mut rules: Vec<Rule> = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i];
        let indent = line.len() - line.trim_start().len();
        let trimmed = line.trim_start().trim_start_matches("- ");
        i += 1;
        if trimmed.starts_with('#') {
            continue;
        }
        let Some((key, value)) = trimmed.split_once(':') else {
            continue;
        };
        let value = value.trim();
        if key == "alert" || key == "record" {
            rules.push(Rule {
                name: value.to_owned(),
                line: i,
                fields: BTreeMap::new(),
            });
            continue;
        }
        if !RULE_FIELDS.contains(&key) {
            continue;
        }
        let rule = rules
            .last_mut()
            .unwrap_or_else(|| panic!("{file}:{i}: {key} before any rule"));
        let value = match value {
            "|" | "|-" | ">" | ">-" => {
                let mut block = Vec::new();
                while i < lines.len() {
                    let next = lines[i];
                    let blank = next.trim().is_empty();
                    if !blank && next.len() - next.trim_start().len() <= indent {
                        break;
                    }
                    block.push(next.trim());
                    i += 1;
                }
                let joiner = if value.starts_with('|') { "\n" } else { " " };
                block.join(joiner).trim().to_owned()
            }
            quoted if quoted.len() >= 2 && quoted.starts_with('"') && quoted.ends_with('"') => {
                let inner = &quoted[1..quoted.len() - 1];
                assert!(
                    !inner.contains('\\'),
                    "{file}:{i}: escapes in a quoted {key} are beyond this reader"
                );
                inner.to_owned()
            }
            quoted if quoted.len() >= 2 && quoted.starts_with('\'') && quoted.ends_with('\'') => {
                quoted[1..quoted.len() - 1].replace("''", "'")
            }
            plain => plain.to_owned(),
        };
        assert!(!value.is_empty(), "{file}:{i}: an empty {key}");
        rule.fields.insert(key.to_owned(), value);
    }
    rules
}

fn alert_rules() -> Vec<Rule> {
    let text = read(ALERTS);
    let rules = rules(ALERTS, &text);
    let starts = text
        .lines()
        .filter(|l| {
            let t = l.trim_start();
            t.starts_with("- alert:") || t.starts_with("- record:")
        })
        .count();
    assert_eq!(rules.len(), starts, "{ALERTS}: every rule read");
    assert!(!rules.is_empty(), "{ALERTS} has no rules");
    for rule in &rules {
        assert!(
            rule.fields.contains_key("expr"),
            "{ALERTS}:{}: {} has no expr this test can read",
            rule.line,
            rule.name
        );
    }
    rules
}

fn alert_exprs(rules: &[Rule]) -> Vec<Expr> {
    rules
        .iter()
        .map(|rule| Expr {
            origin: format!("alert {} ({ALERTS}:{})", rule.name, rule.line),
            promql: rule.fields["expr"].clone(),
        })
        .collect()
}

// ---- Metric names.

/// The `spillway_*` names an expression selects: identifiers outside string literals.
fn spillway_names(promql: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut chars = promql.char_indices().peekable();
    while let Some((start, c)) = chars.next() {
        if c == '"' || c == '\'' || c == '`' {
            let mut escaped = false;
            for (_, inner) in chars.by_ref() {
                match inner {
                    _ if escaped => escaped = false,
                    '\\' if c != '`' => escaped = true,
                    end if end == c => break,
                    _ => {}
                }
            }
        } else if c.is_ascii_alphabetic() || c == '_' || c == ':' || c.is_ascii_digit() {
            let mut end = start + c.len_utf8();
            while let Some(&(at, next)) = chars.peek() {
                if !(next.is_ascii_alphanumeric() || next == '_' || next == ':') {
                    break;
                }
                end = at + next.len_utf8();
                chars.next();
            }
            let word = &promql[start..end];
            if word.starts_with("spillway_") {
                names.insert(word.to_owned());
            }
        }
    }
    names
}

/// The metric names a `/metrics` body exports, from its `# TYPE` lines: a counter family
/// `x` is exposed as `x_total`, a histogram's and a summary's as their series.
fn exported_names(body: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for line in body.lines() {
        let Some(rest) = line.strip_prefix("# TYPE ") else {
            continue;
        };
        let mut parts = rest.split_whitespace();
        let (Some(name), Some(kind)) = (parts.next(), parts.next()) else {
            continue;
        };
        match kind {
            "counter" if name.ends_with("_total") => {
                names.insert(name.to_owned());
            }
            "counter" => {
                names.insert(format!("{name}_total"));
            }
            "histogram" => {
                for suffix in ["_bucket", "_sum", "_count"] {
                    names.insert(format!("{name}{suffix}"));
                }
            }
            "summary" => {
                for suffix in ["", "_sum", "_count"] {
                    names.insert(format!("{name}{suffix}"));
                }
            }
            _ => {
                names.insert(name.to_owned());
            }
        }
    }
    names
}

// ---- The running processes.

/// `spillway up` (a linked sidecar, the controller, an aggregator and the rules service) and a
/// standalone `spillway proxy` with a `store: redis` bucket against a private redis-server, a
/// per-subject bucket and a shadow bucket, so every family the proxy can export has a series.
// Fields drop in order: the processes stop before Redis and their folder go.
struct Fleet {
    proxy: Proxy,
    _up: Proc,
    /// The listener of `spillway up`'s sidecar.
    up_listen: u16,
    /// (role, port of its `/metrics`).
    scrapes: Vec<(&'static str, u16)>,
    _redis: RedisServer,
    _dir: tempfile::TempDir,
}

impl Fleet {
    fn start() -> Fleet {
        let redis = RedisServer::start().expect("a private redis-server (Debian's redis-server)");
        let dir = tempfile::tempdir().unwrap();
        let upstream = upstream();
        let up_config = dir.path().join("up.yaml");
        std::fs::write(
            &up_config,
            "version: 1\ncontrol:\n  report_interval: 250ms\nservices:\n  api:\n    buckets:\n      - { name: all, limit: 1000/s }\n      - { name: trial, match: { procedure: /trial }, limit: 1/s, mode: shadow }\n",
        )
        .unwrap();
        let ports: Vec<u16> = (0..7).map(|_| free_port()).collect();
        let addr = |i: usize| format!("127.0.0.1:{}", ports[i]);
        let state = dir.path().join("state");
        let up = Proc::spawn(&[
            "up",
            "-c",
            up_config.to_str().unwrap(),
            "--state-dir",
            state.to_str().unwrap(),
            "--upstream",
            &format!("http://{upstream}"),
            "--listen",
            &addr(0),
            "--admin",
            &addr(1),
            "--rules-listen",
            &addr(2),
            "--controller-listen",
            &addr(3),
            "--controller-admin",
            &addr(4),
            "--aggregator-listen",
            &addr(5),
            "--aggregator-admin",
            &addr(6),
        ]);
        let proxy_config = dir.path().join("proxy.yaml");
        std::fs::write(
            &proxy_config,
            format!(
                "version: 1\nredis: {{ url: \"{}\", timeout: 2s }}\nservices:\n  api:\n    buckets:\n      - {{ name: shared, limit: 100/s, algorithm: token-bucket, store: redis }}\n      - {{ name: per-user, match: {{ procedure: /mine, user: \"*\" }}, limit: 5/s, algorithm: token-bucket }}\n      - {{ name: trial, match: {{ procedure: /trial }}, limit: 1/s, mode: shadow }}\n",
                redis.url()
            ),
        )
        .unwrap();
        let proxy = Proxy::start(&proxy_config, upstream);
        // The sidecar linked and the controller seeing its buckets: every family has a series.
        wait_for(
            Duration::from_secs(30),
            "spillway up's sidecar linked and its controller exporting the buckets' load",
            || {
                admin_get(ports[1], "/metrics").contains("spillway_control_plane_connected 1")
                    && admin_get(ports[4], "/metrics").contains("spillway_bucket_observed_rps{")
            },
        );
        Fleet {
            _redis: redis,
            _dir: dir,
            _up: up,
            proxy,
            up_listen: ports[0],
            scrapes: vec![
                ("spillway up's sidecar", ports[1]),
                ("spillway up's controller", ports[4]),
                ("spillway up's aggregator", ports[6]),
                ("spillway up's rules service", ports[2]),
            ],
        }
    }

    /// Each process's role and the names its `/metrics` exports.
    fn exported(&self) -> Vec<(&'static str, BTreeSet<String>)> {
        let proxy = ("spillway proxy (store: redis)", self.proxy.admin.port());
        self.scrapes
            .iter()
            .copied()
            .chain([proxy])
            .map(|(role, port)| {
                let body = admin_get(port, "/metrics");
                let names = exported_names(&body);
                assert!(
                    !names.is_empty(),
                    "{role} on port {port} exported no metric families: {body:?}"
                );
                (role, names)
            })
            .collect()
    }
}

#[test]
fn every_metric_the_dashboard_and_the_alerts_name_is_exported_by_a_running_process() {
    let fleet = Fleet::start();
    // Traffic through both proxies, the shadow bucket's included, and a rules API answer, so
    // the counters that count answers have a series too.
    for path in ["/orders", "/trial", "/mine"] {
        for proxy in [fleet.up_listen, fleet.proxy.listen.port()] {
            let (status, _) = get(([127, 0, 0, 1], proxy).into(), path).expect("a proxy answers");
            assert!(
                status == 200 || status == 429,
                "{path} on {proxy}: {status}"
            );
        }
    }
    let rules_port = fleet.scrapes[3].1;
    let (status, _) = get(([127, 0, 0, 1], rules_port).into(), "/healthz").unwrap();
    assert_eq!(status, 200, "the rules service answers");

    let exported = fleet.exported();
    let everything: BTreeSet<&str> = exported
        .iter()
        .flat_map(|(_, names)| names.iter().map(String::as_str))
        .collect();
    let dashboard_exprs = dashboard_exprs(&dashboard());
    let alert_exprs = alert_exprs(&alert_rules());
    assert!(
        dashboard_exprs.len() >= 20,
        "{DASHBOARD}: only {} expressions found",
        dashboard_exprs.len()
    );
    let mut missing = Vec::new();
    let mut named = BTreeSet::new();
    for expr in dashboard_exprs.iter().chain(&alert_exprs) {
        let names = spillway_names(&expr.promql);
        assert!(
            !names.is_empty(),
            "{} names no spillway_* metric: {}",
            expr.origin,
            expr.promql
        );
        for name in names {
            if !everything.contains(name.as_str()) {
                missing.push(format!(
                    "{} names {name}, which no running process exports (in {})",
                    expr.origin, expr.promql
                ));
            }
            named.insert(name);
        }
    }
    let unshown: Vec<&str> = everything
        .iter()
        .copied()
        .filter(|name| name.starts_with("spillway_") && !named.contains(*name))
        .collect();
    if !unshown.is_empty() {
        eprintln!("exported but on neither the dashboard nor an alert: {unshown:?}");
    }
    let by_role: Vec<String> = exported
        .iter()
        .map(|(role, names)| format!("{role}: {names:?}"))
        .collect();
    assert!(
        missing.is_empty(),
        "metrics that Spillway does not export:\n  {}\nexported:\n  {}",
        missing.join("\n  "),
        by_role.join("\n  ")
    );
}

// ---- promtool.

/// promtool on `PATH`; `None` (the caller skips) when it is missing and
/// `SPILLWAY_REQUIRE_PROMTOOL` is unset.
fn promtool() -> Option<PathBuf> {
    spillway_testkit::tools::on_path(
        "promtool",
        "Debian's prometheus package",
        "SPILLWAY_REQUIRE_PROMTOOL",
    )
}

/// Runs promtool with `args` in `dir`, `PROMTOOL_LIMIT` at most: its exit status and output.
fn run_promtool(promtool: &Path, dir: &Path, args: &[&str]) -> (ExitStatus, String) {
    let mut out = tempfile::tempfile().unwrap();
    let mut child = Command::new(promtool)
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(out.try_clone().unwrap())
        .stderr(out.try_clone().unwrap())
        .spawn()
        .expect("promtool starts");
    let deadline = Instant::now() + PROMTOOL_LIMIT;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("promtool {args:?} did not finish within {PROMTOOL_LIMIT:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut text = String::new();
    out.rewind().unwrap();
    out.read_to_string(&mut text).unwrap();
    (status, text)
}

/// A rules file with each expression as a recording rule, which `promtool check rules` parses.
fn recording_rules(exprs: &[(String, &Expr)]) -> String {
    let mut file = String::from("groups:\n  - name: deploy-expressions\n    rules:\n");
    for (i, (promql, expr)) in exprs.iter().enumerate() {
        file.push_str(&format!("      # {}\n", expr.origin));
        file.push_str(&format!(
            "      - record: deploy:expression_{i}\n        expr: |\n"
        ));
        for line in promql.lines() {
            file.push_str(&format!("          {line}\n"));
        }
    }
    file
}

#[test]
fn promtool_parses_every_expression_of_the_dashboard_and_the_alerts() {
    let Some(promtool) = promtool() else { return };
    let exprs: Vec<Expr> = dashboard_exprs(&dashboard())
        .into_iter()
        .chain(alert_exprs(&alert_rules()))
        .collect();
    let substituted: Vec<(String, &Expr)> = exprs
        .iter()
        .map(|expr| (substitute(&expr.origin, &expr.promql), expr))
        .collect();
    let dir = tempfile::tempdir().unwrap();
    let check = |rules: &[(String, &Expr)]| {
        std::fs::write(dir.path().join("expressions.yml"), recording_rules(rules)).unwrap();
        run_promtool(
            &promtool,
            dir.path(),
            &["check", "rules", "expressions.yml"],
        )
    };
    // All at once; when that fails, one by one, to name the expressions promtool refuses.
    if check(&substituted).0.success() {
        return;
    }
    let refused: Vec<String> = substituted
        .iter()
        .filter_map(|one| {
            let (status, output) = check(std::slice::from_ref(one));
            let (promql, expr) = one;
            (!status.success()).then(|| {
                format!(
                    "{}: {promql:?}\n    {}",
                    expr.origin,
                    output.trim().replace('\n', "\n    ")
                )
            })
        })
        .collect();
    panic!(
        "promtool does not parse {} expression(s) (Grafana's variables substituted):\n  {}",
        refused.len(),
        refused.join("\n  ")
    );
}

#[test]
fn the_alert_rules_pass_promtool_check_and_their_unit_tests() {
    let Some(promtool) = promtool() else { return };
    let dir = root().join("deploy/prometheus");
    let (status, output) = run_promtool(&promtool, &dir, &["check", "rules", "alerts.yml"]);
    assert!(status.success(), "promtool check rules {ALERTS}:\n{output}");
    let (status, output) = run_promtool(&promtool, &dir, &["test", "rules", "alerts_test.yml"]);
    assert!(
        status.success(),
        "promtool test rules {ALERTS_TEST}:\n{output}"
    );
}

// ---- Static checks of the artefacts.

/// GitHub's anchor of a heading: lower case, spaces to `-`, punctuation other than `-` and `_`
/// dropped.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

#[test]
fn every_alert_has_a_severity_a_runbook_section_and_unit_tests_that_fire_and_stay_quiet() {
    let rules = alert_rules();
    let operations = read(OPERATIONS);
    let anchors: BTreeSet<String> = operations
        .lines()
        .filter_map(|l| l.strip_prefix('#'))
        .map(|l| anchor(l.trim_start_matches('#')))
        .collect();
    // Which alerts the unit tests expect to fire, and which to stay quiet, at some time.
    let (mut firing, mut quiet) = (BTreeSet::new(), BTreeSet::new());
    let mut alertname = None;
    for line in read(ALERTS_TEST).lines().map(str::trim) {
        if let Some(name) = line.strip_prefix("alertname:") {
            alertname = Some(name.trim().to_owned());
        } else if let Some(expected) = line.strip_prefix("exp_alerts:") {
            let name = alertname.clone().expect("exp_alerts after an alertname");
            if expected.trim() == "[]" {
                quiet.insert(name);
            } else {
                firing.insert(name);
            }
        }
    }
    let names: BTreeSet<String> = rules.iter().map(|r| r.name.clone()).collect();
    let mut problems = Vec::new();
    for rule in &rules {
        let (name, field) = (&rule.name, |key: &str| rule.fields.get(key));
        let at = format!("{ALERTS}:{}: {name}", rule.line);
        if !matches!(
            field("severity").map(String::as_str),
            Some("critical" | "warning" | "info")
        ) {
            problems.push(format!("{at}: severity is not critical, warning or info"));
        }
        if field("for").is_none() {
            problems.push(format!("{at}: no for: duration"));
        }
        for key in ["summary", "description"] {
            match field(key) {
                None => problems.push(format!("{at}: no {key}")),
                Some(text) if !text.contains("{{ $labels.") => {
                    problems.push(format!("{at}: its {key} names none of the alert's labels"))
                }
                Some(_) => {}
            }
        }
        match field("runbook_url").and_then(|url| url.split_once("docs/operations.md#")) {
            Some((_, section)) if anchors.contains(section) => {}
            Some((_, section)) => problems.push(format!(
                "{at}: runbook_url points at #{section}, which is no heading of {OPERATIONS}"
            )),
            None => problems.push(format!(
                "{at}: runbook_url does not point at a section of {OPERATIONS}"
            )),
        }
        if !firing.contains(name) {
            problems.push(format!(
                "{at}: no unit test in {ALERTS_TEST} expects it to fire"
            ));
        }
        if !quiet.contains(name) {
            problems.push(format!(
                "{at}: no unit test in {ALERTS_TEST} expects it quiet"
            ));
        }
    }
    for tested in firing.union(&quiet) {
        if !names.contains(tested) {
            problems.push(format!(
                "{ALERTS_TEST} tests {tested}, which is no alert of {ALERTS}"
            ));
        }
    }
    assert!(problems.is_empty(), "\n{}", problems.join("\n"));
}

#[test]
fn the_dashboard_imports_with_a_datasource_variable_and_filters_by_service_and_bucket() {
    let dashboard = dashboard();
    let variables = dashboard["templating"]["list"]
        .as_array()
        .expect("template variables");
    let variable = |name: &str| variables.iter().find(|v| v["name"] == name);
    let datasource = variable("datasource").expect("a datasource variable");
    assert_eq!(datasource["type"], "datasource");
    assert_eq!(datasource["query"], "prometheus");
    for name in ["service", "bucket"] {
        let v = variable(name).unwrap_or_else(|| panic!("a {name} variable"));
        assert_eq!(v["type"], "query", "{name}");
        assert_eq!(v["includeAll"], true, "{name}: All");
        assert_eq!(v["allValue"], ".*", "{name}: All matches every value");
    }

    // Every panel, nested ones included, queries through the variable; ids are unique.
    let mut panels = Vec::new();
    for panel in dashboard["panels"].as_array().expect("panels") {
        panels.push(panel);
        panels.extend(panel["panels"].as_array().into_iter().flatten());
    }
    let mut ids = BTreeSet::new();
    for panel in &panels {
        let title = panel["title"].as_str().unwrap_or("?");
        assert!(
            ids.insert(panel["id"].as_u64()),
            "panel {title:?}: a duplicate id"
        );
        if panel["type"] == "row" {
            continue;
        }
        assert_eq!(
            panel["datasource"]["uid"], "${datasource}",
            "panel {title:?}: not on the datasource variable"
        );
        for target in panel["targets"].as_array().into_iter().flatten() {
            assert_eq!(
                target["datasource"]["uid"], "${datasource}",
                "panel {title:?}: a target not on the datasource variable"
            );
        }
    }
    // The bucket in trouble first: the top row ranks buckets.
    let top = dashboard["panels"]
        .as_array()
        .unwrap()
        .iter()
        .min_by_key(|p| (p["gridPos"]["y"].as_u64(), p["gridPos"]["x"].as_u64()))
        .unwrap();
    assert!(
        top["title"]
            .as_str()
            .unwrap_or_default()
            .contains("trouble"),
        "the first row is the buckets in trouble: {}",
        top["title"]
    );
}

// ---- The readers themselves, on worked examples.

#[test]
fn the_readers_find_names_substitute_variables_and_read_block_scalars() {
    assert_eq!(
        spillway_names(
            r#"sum by (bucket) (rate(spillway_requests_total{decision="spillway_not_a_name"}[5m])) / spillway_bucket_limit_rps"#
        ),
        BTreeSet::from([
            "spillway_bucket_limit_rps".to_owned(),
            "spillway_requests_total".to_owned()
        ])
    );
    assert_eq!(
        substitute(
            "t",
            r#"rate(x{service=~"$service",bucket=~"${bucket:regex}"}[$__rate_interval])"#
        ),
        r#"rate(x{service=~".*",bucket=~".*"}[5m])"#
    );
    assert_eq!(
        variable_promql("b", r#"label_values(spillway_x{a=~"1,2"}, bucket)"#).as_deref(),
        Some(r#"spillway_x{a=~"1,2"}"#)
    );
    assert_eq!(variable_promql("s", "label_values(service)"), None);
    let parsed = rules(
        "t.yml",
        "groups:\n  - rules:\n      - alert: A\n        expr: |\n          x\n            and y\n        for: 5m\n        annotations:\n          summary: \"a {{ $labels.b }}\"\n          description: >-\n            one\n            two\n",
    );
    assert_eq!(parsed.len(), 1);
    assert_eq!(parsed[0].fields["expr"], "x\nand y");
    assert_eq!(parsed[0].fields["for"], "5m");
    assert_eq!(parsed[0].fields["summary"], "a {{ $labels.b }}");
    assert_eq!(parsed[0].fields["description"], "one two");
    assert_eq!(anchor(" SpillwayFailingOpen"), "spillwayfailingopen");
    assert_eq!(
        anchor("The sidecar: `spillway proxy`"),
        "the-sidecar-spillway-proxy"
    );
    assert_eq!(
        exported_names(
            "# TYPE spillway_a counter\n# TYPE spillway_b_total counter\n# TYPE spillway_c gauge\n"
        ),
        BTreeSet::from([
            "spillway_a_total".to_owned(),
            "spillway_b_total".to_owned(),
            "spillway_c".to_owned()
        ])
    );
}
