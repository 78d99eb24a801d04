//! The controller's dashboard in a real browser. A `spillway up` node, with a second sidecar
//! linked to its zone, runs under paced load: one bucket over its limit (real drops), a shadow
//! bucket over its limit (virtual drops) and one well under it. Headless Chromium loads the page
//! whose address `spillway up` printed, twice a few seconds apart, and the rendered DOM must show
//! every bucket with its numbers and non-empty charts, the bucket in trouble first, the zone's
//! health, both hosts on the rules version a change through the rules API made, that change in
//! the store's audit log, and newer figures the second time. A screenshot of the page is taken
//! too.
//!
//! Needs Debian's `chromium`; without it on `PATH` the test is skipped with a message, unless
//! `SPILLWAY_REQUIRE_CHROMIUM` is set (scripts/test sets it), when it fails. With
//! `SPILLWAY_DASHBOARD_SCREENSHOT=FILE` the screenshot is also copied to FILE (how
//! docs/dashboard.png is made).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::support::fleet::{Load, Proc, admin_get, keep_alive_upstream, metric, wait_for};
use crate::support::{SPILLWAY, free_port};

/// How long one Chromium run may take.
const CHROMIUM_LIMIT: Duration = Duration::from_secs(60);

/// Three buckets of one service, reports every 250 ms.
const RULES: &str = "version: 1
control:
  report_interval: 250ms
services:
  api:
    buckets:
      - { name: orders, match: { procedure: /orders }, limit: 40/s, scope: global }
      - { name: search, match: { procedure: /search }, limit: 50/s, mode: shadow, scope: global }
      - { name: browse, match: { procedure: /browse }, limit: 1000/s, scope: global }
";

/// Each sidecar gets 40/s of orders and of search, 10/s of browse: 80/s against 40/s (half
/// refused), 80/s against a shadow 50/s (30/s virtual drops), 20/s against 1000/s.
const LOAD: [(&str, f64); 3] = [("/orders", 40.0), ("/search", 40.0), ("/browse", 10.0)];

#[test]
fn the_dashboard_shows_every_bucket_with_numbers_and_charts_worst_first_and_updates() {
    let Some(chromium) = spillway_testkit::tools::on_path(
        "chromium",
        "Debian's chromium package",
        "SPILLWAY_REQUIRE_CHROMIUM",
    ) else {
        return;
    };
    let began = Instant::now();
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(dir.path());
    let url = node.dashboard_url();

    // A second sidecar in the node's zone: a zone of one proxy is counted at most at a bucket's
    // limit by its aggregator (control.plausibility), so the controller would never see it
    // over; two proxies are a zone like any in a fleet.
    let (listen, admin) = (free_port(), free_port());
    let _second = Proc::spawn(&[
        "proxy",
        "-c",
        &node.config.display().to_string(),
        "--listen",
        &format!("127.0.0.1:{listen}"),
        "--upstream",
        &format!("http://127.0.0.1:{}", node.upstream),
        "--aggregator",
        &format!("http://127.0.0.1:{}", node.ports.aggregator),
        "--region",
        "local",
        "--zone",
        "local-a",
        "--host-id",
        "local-2",
        "--state-dir",
        &dir.path().join("second").display().to_string(),
        "--admin",
        &format!("127.0.0.1:{admin}"),
    ]);
    wait_for(
        Duration::from_secs(20),
        "both sidecars linked and known to the controller",
        || {
            let hosts = admin_get(node.ports.controller_admin, "/v1/hosts");
            [node.ports.admin, admin].iter().all(|&port| {
                metric(
                    &admin_get(port, "/metrics"),
                    "spillway_control_plane_connected",
                    "",
                ) == Some(1.0)
            }) && hosts.contains("local-1")
                && hosts.contains("local-2")
        },
    );
    let _load: Vec<Load> = [node.ports.listen, listen]
        .into_iter()
        .flat_map(|port| LOAD.map(|(path, rps)| Load::on_path(port, rps, path)))
        .collect();
    wait_for(
        Duration::from_secs(20),
        "the controller sees orders dropping and search's virtual drops",
        || {
            let doc: serde_json::Value =
                serde_json::from_str(&admin_get(node.ports.controller_admin, "/v1/buckets"))
                    .unwrap_or_default();
            let bucket = |name: &str| {
                doc["buckets"]
                    .as_array()
                    .and_then(|b| b.iter().find(|b| b["bucket"] == name).cloned())
                    .unwrap_or_default()
            };
            bucket("orders")["drop_ratio"].as_f64() > Some(0.3)
                && bucket("search")["shadow_drop_rps"].as_f64() > Some(10.0)
        },
    );
    let loaded = Instant::now();
    // A change through the rules API, which the page lists and both hosts take.
    let changed = dir.path().join("changed.yaml");
    std::fs::write(&changed, RULES.replace("limit: 1000/s", "limit: 800/s")).unwrap();
    let applied = Command::new(SPILLWAY)
        .args(["rules", "apply", "-f"])
        .arg(&changed)
        .args([
            "--server",
            &format!("http://127.0.0.1:{}", node.ports.rules),
        ])
        .args(["--token", &node.admin_token()])
        .output()
        .unwrap();
    assert!(
        applied.status.success(),
        "{}",
        String::from_utf8_lossy(&applied.stderr)
    );
    wait_for(
        Duration::from_secs(20),
        "both hosts on rules version 2",
        || {
            let doc: serde_json::Value =
                serde_json::from_str(&admin_get(node.ports.controller_admin, "/v1/hosts"))
                    .unwrap_or_default();
            doc["rules_version"] == 2
                && doc["converged"] == true
                && doc["hosts"].as_object().is_some_and(|h| h.len() == 2)
        },
    );
    // A few seconds of history for the charts.
    std::thread::sleep(Duration::from_secs(3));

    let first = Page::load(&chromium, &url, dir.path());
    std::thread::sleep(Duration::from_secs(3));
    let second = Page::load(&chromium, &url, dir.path());
    let shot = dir.path().join("dashboard.png");
    let docs = std::env::var_os("SPILLWAY_DASHBOARD_SCREENSHOT");
    if docs.is_some() {
        // For the documentation's picture, most of a minute of history (the load runs 60 s).
        std::thread::sleep(Duration::from_secs(50).saturating_sub(loaded.elapsed()));
    }
    screenshot(&chromium, &url, dir.path(), &shot);

    for page in [&first, &second] {
        page.shows_the_fleet();
    }
    // Newer figures the second time: more intervals computed, more points in every chart.
    assert!(
        second.computed() > first.computed(),
        "intervals computed: {} then {}",
        first.computed(),
        second.computed()
    );
    for key in ["api/orders", "api/search", "api/browse"] {
        let (before, after) = (
            first.bucket(key).chart_points("rates"),
            second.bucket(key).chart_points("rates"),
        );
        assert!(after > before, "{key}: {before} points, then {after}");
    }
    let png = std::fs::read(&shot).expect("the screenshot was written");
    assert!(
        png.starts_with(b"\x89PNG\r\n\x1a\n") && png.len() > 20_000,
        "a PNG of the rendered page, {} bytes",
        png.len()
    );
    if let Some(copy) = docs {
        std::fs::copy(&shot, copy).unwrap();
    }
    eprintln!("the browser test took {:?}", began.elapsed());
}

/// The ports of the node's parts.
struct Ports {
    listen: u16,
    admin: u16,
    rules: u16,
    controller: u16,
    controller_admin: u16,
    aggregator: u16,
    aggregator_admin: u16,
}

/// `spillway up` as a process, its stdout in a file.
struct Node {
    _proc: Proc,
    ports: Ports,
    config: PathBuf,
    stdout: PathBuf,
    upstream: u16,
}

impl Node {
    fn start(dir: &Path) -> Node {
        let config = dir.join("spillway.yaml");
        std::fs::write(&config, RULES).unwrap();
        let ports = Ports {
            listen: free_port(),
            admin: free_port(),
            rules: free_port(),
            controller: free_port(),
            controller_admin: free_port(),
            aggregator: free_port(),
            aggregator_admin: free_port(),
        };
        let addr = |port: u16| format!("127.0.0.1:{port}");
        let upstream = keep_alive_upstream();
        let stdout = dir.join("up.out");
        let child = Command::new(SPILLWAY)
            .args(["up", "-c"])
            .arg(&config)
            .arg("--state-dir")
            .arg(dir.join("state"))
            .args(["--upstream", &format!("http://127.0.0.1:{upstream}")])
            .args(["--listen", &addr(ports.listen)])
            .args(["--admin", &addr(ports.admin)])
            .args(["--rules-listen", &addr(ports.rules)])
            .args(["--controller-listen", &addr(ports.controller)])
            .args(["--controller-admin", &addr(ports.controller_admin)])
            .args(["--aggregator-listen", &addr(ports.aggregator)])
            .args(["--aggregator-admin", &addr(ports.aggregator_admin)])
            .env("RUST_LOG", "warn")
            .stdout(std::fs::File::create(&stdout).unwrap())
            .stderr(Stdio::null())
            .spawn()
            .expect("spillway up starts");
        Node {
            _proc: Proc(child),
            ports,
            config,
            stdout,
            upstream,
        }
    }

    /// The rules API's admin token, which a fresh `spillway up` printed once.
    fn admin_token(&self) -> String {
        let out = std::fs::read_to_string(&self.stdout).unwrap();
        out.lines()
            .find_map(|l| l.strip_prefix("rules service admin token (shown once): "))
            .unwrap_or_else(|| panic!("no admin token printed: {out}"))
            .trim()
            .to_owned()
    }

    /// The address `spillway up` printed for its dashboard (20 s at most).
    fn dashboard_url(&self) -> String {
        let mut url = String::new();
        wait_for(
            Duration::from_secs(20),
            "spillway up's dashboard line",
            || {
                let out = std::fs::read_to_string(&self.stdout).unwrap_or_default();
                match out.lines().find_map(|l| l.strip_prefix("dashboard: ")) {
                    Some(found) => {
                        url = found.trim().to_owned();
                        true
                    }
                    None => false,
                }
            },
        );
        assert_eq!(
            url,
            format!("http://127.0.0.1:{}/", self.ports.controller_admin)
        );
        url
    }
}

/// Runs Chromium headless on `url` with `args`, `CHROMIUM_LIMIT` at most, in a profile of its
/// own under `dir`; returns what it wrote on stdout.
fn chromium_run(chromium: &Path, url: &str, dir: &Path, args: &[&str]) -> String {
    use std::os::unix::process::CommandExt;
    let profile = tempfile::tempdir_in(dir).unwrap();
    let out = tempfile::NamedTempFile::new_in(dir).unwrap();
    let err = tempfile::NamedTempFile::new_in(dir).unwrap();
    let mut child = Command::new(chromium)
        .args([
            "--headless=new",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--no-first-run",
            "--hide-scrollbars",
            "--window-size=1400,1350",
        ])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        // Time enough in the page for a few refreshes (once a second), fetches included.
        .arg("--virtual-time-budget=3500")
        .args(args)
        .arg(url)
        .stdin(Stdio::null())
        .stdout(out.reopen().unwrap())
        .stderr(err.reopen().unwrap())
        // Its own process group, so a run over its limit is stopped with every child.
        .process_group(0)
        .spawn()
        .expect("chromium starts");
    let deadline = Instant::now() + CHROMIUM_LIMIT;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = Command::new("kill")
                .args(["-KILL", &format!("-{}", child.id())])
                .status();
            let _ = child.wait();
            panic!(
                "chromium {args:?} did not finish within {CHROMIUM_LIMIT:?}: {}",
                std::fs::read_to_string(err.path()).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(
        status.success(),
        "chromium {args:?}: {status}\n{}",
        std::fs::read_to_string(err.path()).unwrap_or_default()
    );
    std::fs::read_to_string(out.path()).unwrap()
}

fn screenshot(chromium: &Path, url: &str, dir: &Path, to: &Path) {
    chromium_run(
        chromium,
        url,
        dir,
        &[&format!("--screenshot={}", to.display())],
    );
}

/// The DOM of the dashboard as Chromium rendered it.
struct Page {
    dom: String,
}

impl Page {
    fn load(chromium: &Path, url: &str, dir: &Path) -> Page {
        let mut dom = chromium_run(chromium, url, dir, &["--dump-dom"]);
        assert!(
            dom.contains("<title>spillway controller</title>"),
            "not the dashboard:\n{dom}"
        );
        // What was rendered, not the script's templates.
        if let (Some(start), Some(end)) = (dom.find("<script>"), dom.find("</script>")) {
            dom.replace_range(start..end, "");
        }
        Page { dom }
    }

    /// The page drew the controller's figures: at least one refresh went through.
    fn computed(&self) -> u64 {
        let body = self.dom.find("<body").map(|at| &self.dom[at..]).unwrap();
        let tag = &body[..body.find('>').unwrap()];
        attr(tag, "data-computed")
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no refresh drawn: {tag}\n{}", self.dom))
    }

    /// The buckets' cards in the order the page shows them.
    fn buckets(&self) -> Vec<Bucket<'_>> {
        self.dom
            .match_indices("<article class=\"bucket")
            .map(|(at, _)| {
                let html = &self.dom[at..];
                let html = &html[..html.find("</article>").unwrap()];
                let tag = &html[..html.find('>').unwrap()];
                Bucket {
                    key: attr(tag, "data-key").unwrap(),
                    status: attr(tag, "data-status").unwrap(),
                    html,
                }
            })
            .collect()
    }

    fn bucket(&self, key: &str) -> Bucket<'_> {
        self.buckets()
            .into_iter()
            .find(|b| b.key == key)
            .unwrap_or_else(|| panic!("no card for {key}:\n{}", self.dom))
    }

    /// Everything the load should show.
    fn shows_the_fleet(&self) {
        let order: Vec<(String, String)> = self
            .buckets()
            .into_iter()
            .map(|b| (b.key, b.status))
            .collect();
        let names: Vec<&str> = order.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(
            names,
            ["api/orders", "api/search", "api/browse"],
            "the bucket in trouble first, then the one that would drop: {order:?}"
        );
        let orders = self.bucket("api/orders");
        assert_eq!(orders.status, "dropping");
        assert_eq!(orders.field("limit"), 40.0);
        let offered = orders.field("offered");
        assert!(
            (60.0..=100.0).contains(&offered),
            "orders offered {offered}"
        );
        let ratio = orders.field("drop_ratio");
        assert!((0.25..=0.75).contains(&ratio), "orders drop ratio {ratio}");
        assert!(orders.field("real_drops") > 10.0, "{}", orders.html);
        assert_eq!(orders.field("virtual_drops"), 0.0);
        assert!(
            orders.series_points("drops", "real") >= 3,
            "{}",
            orders.html
        );

        let search = self.bucket("api/search");
        assert_eq!(search.status, "would drop");
        assert_eq!(search.field("limit"), 50.0);
        assert!(search.field("virtual_drops") > 10.0, "{}", search.html);
        assert_eq!(search.field("real_drops"), 0.0);
        assert!(search.series_points("drops", "virtual") >= 3);

        let browse = self.bucket("api/browse");
        assert_eq!(browse.status, "ok");
        assert_eq!(browse.field("limit"), 800.0, "the limit applied");
        let offered = browse.field("offered");
        assert!((10.0..=30.0).contains(&offered), "browse offered {offered}");
        for bucket in [&orders, &search, &browse] {
            for series in ["offered", "admitted", "limit"] {
                let points = bucket.series_points("rates", series);
                assert!(points >= 3, "{}: {series} has {points} points", bucket.key);
            }
        }

        // The zone, its two hosts on the rules version, and the store's change.
        let zone = self.row("data-zone=\"local-a\"");
        assert!(zone.contains("data-health=\"ok\""), "{zone}");
        assert!(zone.contains("<td>2</td>"), "two hosts connected: {zone}");
        assert!(zone.contains("live"), "instructions live: {zone}");
        let hosts = self.section("<table id=\"hosts\"", "</table>");
        assert!(
            hosts.contains("local-1") && hosts.contains("local-2"),
            "{hosts}"
        );
        let rollout = self.section("<div id=\"rollout\"", "</div>");
        assert!(
            rollout.contains("Rules version <b>2</b>") && rollout.contains("2 of 2 hosts run it"),
            "{rollout}"
        );
        // The store's audit log, newest first: the change, then the seeding.
        let changes = self.section("<div id=\"changes\"", "</table>");
        let change = changes
            .find("api/browse: limit 1000/s -&gt; 800/s")
            .unwrap_or_else(|| panic!("{changes}"));
        let seeded = changes
            .find("api/orders: created, limit 40/s")
            .unwrap_or_else(|| panic!("{changes}"));
        assert!(change < seeded, "{changes}");
    }

    /// The `<tr ...>` row whose tag contains `marker`.
    fn row(&self, marker: &str) -> &str {
        let at = self
            .dom
            .find(marker)
            .unwrap_or_else(|| panic!("no row {marker}:\n{}", self.dom));
        let start = self.dom[..at].rfind("<tr").unwrap();
        let end = at + self.dom[at..].find("</tr>").unwrap();
        &self.dom[start..end]
    }

    fn section(&self, from: &str, to: &str) -> &str {
        let at = self
            .dom
            .find(from)
            .unwrap_or_else(|| panic!("no {from}:\n{}", self.dom));
        let rest = &self.dom[at..];
        &rest[..rest.find(to).map_or(rest.len(), |end| end + to.len())]
    }
}

/// One bucket's card.
struct Bucket<'a> {
    key: String,
    status: String,
    html: &'a str,
}

impl Bucket<'_> {
    /// The number shown in the card's `data-field`.
    fn field(&self, name: &str) -> f64 {
        let marker = format!("data-field=\"{name}\">");
        let at = self.html.find(&marker).unwrap_or_else(|| {
            panic!("{}: no {name}:\n{}", self.key, self.html);
        }) + marker.len();
        let text = &self.html[at..at + self.html[at..].find('<').unwrap()];
        text.parse()
            .unwrap_or_else(|_| panic!("{}: {name} is {text:?}", self.key))
    }

    /// The chart's `<svg ...>` element.
    fn chart(&self, chart: &str) -> &str {
        let marker = format!("data-chart=\"{chart}\"");
        let at = self
            .html
            .find(&marker)
            .unwrap_or_else(|| panic!("{}: no {chart} chart:\n{}", self.key, self.html));
        let start = self.html[..at].rfind("<svg").unwrap();
        &self.html[start..at + self.html[at..].find("</svg>").unwrap()]
    }

    /// How many points the chart says it drew (its `data-points`).
    fn chart_points(&self, chart: &str) -> usize {
        let svg = self.chart(chart);
        attr(&svg[..svg.find('>').unwrap()], "data-points")
            .and_then(|v| v.parse().ok())
            .unwrap()
    }

    /// How many points of `series` in `chart` are drawn above the chart's zero line (its first
    /// `<line>`), from the shape's own coordinates.
    fn series_points(&self, chart: &str, series: &str) -> usize {
        let svg = self.chart(chart);
        let axis = &svg[svg.find("<line").unwrap()..];
        let zero: f64 = attr(&axis[..axis.find('>').unwrap()], "y1")
            .and_then(|y| y.parse().ok())
            .unwrap();
        let marker = format!("data-series=\"{series}\"");
        let Some(at) = svg.find(&marker) else {
            return 0;
        };
        let shape = &svg[svg[..at].rfind('<').unwrap()..];
        let shape = &shape[..shape.find('>').unwrap()];
        attr(shape, "points")
            .unwrap_or_default()
            .split_whitespace()
            .filter_map(|p| p.split_once(',')?.1.parse::<f64>().ok())
            .filter(|&y| y < zero - 0.5)
            .count()
    }
}

/// The value of `name="..."` in a tag.
fn attr(tag: &str, name: &str) -> Option<String> {
    let marker = format!(" {name}=\"");
    let at = tag.find(&marker)? + marker.len();
    Some(tag[at..at + tag[at..].find('"')?].to_owned())
}
