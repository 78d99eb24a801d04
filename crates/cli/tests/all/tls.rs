//! Mutual TLS on the control plane through the real binary: a development PKI made by
//! `spillway certs`, a TLS fleet of one controller, two aggregators and four proxies on loopback
//! (every role's region, zone and host taken from its certificate), paced load at 1.5x a global
//! limit, impostors played by a Python grpcio client built from the project's own proto, and a
//! certificate rotation mid-run.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::support::SPILLWAY;
use crate::support::fleet::{Load, Proc, keep_alive_upstream, metric, wait_for};
use crate::support::free_port;

/// A GET on an admin port that speaks TLS (it has the process's certificate), verified against
/// `ca`; the body, or an empty string when it is not answering.
fn https_get(port: u16, path: &str, ca: &Path) -> String {
    https(port, &format!("GET {path}"), "", "", ca).2
}

/// One request (`METHOD PATH`, extra header lines, a body) on an admin port that speaks TLS,
/// verified against `ca`: the status, the head and the body; status 0 when nothing answered.
fn https(port: u16, request: &str, headers: &str, body: &str, ca: &Path) -> (u16, String, String) {
    use rustls::pki_types::pem::PemObject;
    use std::io::{Read, Write};
    let nothing = (0, String::new(), String::new());
    let mut roots = rustls::RootCertStore::empty();
    let Ok(certs) = rustls::pki_types::CertificateDer::pem_file_iter(ca) else {
        return nothing;
    };
    for cert in certs.flatten() {
        let _ = roots.add(cert);
    }
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("TLS versions")
    .with_root_certificates(roots)
    .with_no_client_auth();
    let name = rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
    let Ok(conn) = rustls::ClientConnection::new(Arc::new(config), name) else {
        return nothing;
    };
    let Ok(tcp) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
        return nothing;
    };
    let _ = tcp.set_read_timeout(Some(Duration::from_secs(2)));
    let mut tls = rustls::StreamOwned::new(conn, tcp);
    let message = format!(
        "{request} HTTP/1.1\r\nhost: test\r\nconnection: close\r\n{headers}content-length: {}\r\n\r\n{body}",
        body.len()
    );
    if tls.write_all(message.as_bytes()).is_err() {
        return nothing;
    }
    let mut answer = Vec::new();
    let _ = tls.read_to_end(&mut answer);
    let answer = String::from_utf8_lossy(&answer);
    let Some((head, body)) = answer.split_once("\r\n\r\n") else {
        return nothing;
    };
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    (status, head.to_owned(), body.to_owned())
}

/// One global bucket of 100/s, reports every 250 ms, instructions valid 1 s.
const RULES: &str = "version: 1\ncontrol:\n  report_interval: 250ms\n  instruction_ttl: 1s\nservices:\n  api:\n    buckets:\n      - { name: all, limit: 100/s, scope: global }\n";
/// The proxies' own file: a limit nobody reaches, so only the controller's rules make them drop.
const OWN: &str = "version: 1\ncontrol:\n  report_interval: 250ms\n  instruction_ttl: 1s\nservices:\n  api:\n    buckets:\n      - { name: all, limit: 1000000/s, scope: global }\n";

fn spillway(args: &[&str]) -> Output {
    Command::new(SPILLWAY)
        .args(args)
        .output()
        .expect("spillway runs")
}

fn path(p: &Path) -> String {
    p.display().to_string()
}

/// A development PKI in a temporary folder: CA `ca1` (the fleet's), CA `ca2` (a stranger's, and
/// later the rotation's), and `trust.pem`, the CA file every process is given.
struct Pki {
    dir: tempfile::TempDir,
}

impl Pki {
    fn new() -> Pki {
        let pki = Pki {
            dir: tempfile::tempdir().unwrap(),
        };
        for ca in ["ca1", "ca2"] {
            let out = spillway(&["certs", "init", "--out", &path(&pki.path(ca))]);
            assert!(out.status.success(), "certs init: {out:?}");
        }
        std::fs::copy(pki.path("ca1/ca.pem"), pki.trust()).unwrap();
        pki
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn trust(&self) -> PathBuf {
        self.path("trust.pem")
    }

    /// Issues a leaf from `ca` into the folder `name` (replacing one there).
    fn issue(&self, ca: &str, name: &str, role: &str, place: &[&str]) {
        let (ca, out) = (path(&self.path(ca)), path(&self.path(name)));
        let mut args = vec![
            "certs", "issue", "--ca", &ca, "--role", role, "--out", &out, "--force",
        ];
        args.extend_from_slice(place);
        let out = spillway(&args);
        assert!(out.status.success(), "certs issue {name}: {out:?}");
    }

    /// `--tls-cert`, `--tls-key`, `--tls-ca` of the leaf in folder `name`.
    fn flags(&self, name: &str) -> Vec<String> {
        vec![
            "--tls-cert".into(),
            path(&self.path(&format!("{name}/cert.pem"))),
            "--tls-key".into(),
            path(&self.path(&format!("{name}/key.pem"))),
            "--tls-ca".into(),
            path(&self.trust()),
        ]
    }
}

const HOSTS: [(&str, &str); 4] = [("h1", "z1"), ("h2", "z1"), ("h3", "z2"), ("h4", "z2")];

/// A TLS fleet: controller of r1, aggregators of z1 and z2, two proxies in each zone.
struct Fleet {
    pki: Pki,
    controller: Proc,
    controller_port: u16,
    controller_admin: u16,
    aggregators: Vec<(Proc, u16, u16)>,
    proxies: Vec<(Proc, u16, u16)>,
}

impl Fleet {
    fn start() -> Fleet {
        let pki = Pki::new();
        pki.issue("ca1", "controller", "controller", &["--region", "r1"]);
        for zone in ["z1", "z2"] {
            pki.issue(
                "ca1",
                &format!("agg-{zone}"),
                "aggregator",
                &["--region", "r1", "--zone", zone],
            );
        }
        for (host, zone) in HOSTS {
            pki.issue(
                "ca1",
                host,
                "proxy",
                &["--region", "r1", "--zone", zone, "--host", host],
            );
        }
        std::fs::write(pki.path("rules.yaml"), RULES).unwrap();
        std::fs::write(pki.path("own.yaml"), OWN).unwrap();
        let (controller_port, controller_admin) = (free_port(), free_port());
        let controller = Fleet::controller(&pki, "controller", controller_port, controller_admin);
        let mut aggregators = Vec::new();
        for zone in ["z1", "z2"] {
            let (port, admin) = (free_port(), free_port());
            let name = format!("agg-{zone}");
            let mut args: Vec<String> = [
                "aggregator",
                "--listen",
                &format!("127.0.0.1:{port}"),
                "--controller",
                &format!("https://127.0.0.1:{controller_port}"),
                "--admin",
                &format!("127.0.0.1:{admin}"),
            ]
            .map(String::from)
            .to_vec();
            args.extend(pki.flags(&name));
            let log = pki.path(&format!("{name}.log"));
            aggregators.push((Proc::spawn_logged(&strs(&args), &log), port, admin));
        }
        let upstream = keep_alive_upstream();
        let mut proxies = Vec::new();
        for (host, zone) in HOSTS {
            let aggregator = aggregators[if zone == "z1" { 0 } else { 1 }].1;
            let (listen, admin) = (free_port(), free_port());
            let mut args: Vec<String> = [
                "proxy",
                "-c",
                &path(&pki.path("own.yaml")),
                "--listen",
                &format!("127.0.0.1:{listen}"),
                "--upstream",
                &format!("http://127.0.0.1:{upstream}"),
                "--aggregator",
                &format!("https://127.0.0.1:{aggregator}"),
                "--admin",
                &format!("127.0.0.1:{admin}"),
            ]
            .map(String::from)
            .to_vec();
            args.extend(pki.flags(host));
            proxies.push((Proc::spawn(&strs(&args)), listen, admin));
        }
        Fleet {
            pki,
            controller,
            controller_port,
            controller_admin,
            aggregators,
            proxies,
        }
    }

    fn controller(pki: &Pki, leaf: &str, port: u16, admin: u16) -> Proc {
        let mut args: Vec<String> = [
            "controller",
            "--listen",
            &format!("127.0.0.1:{port}"),
            "-c",
            &path(&pki.path("rules.yaml")),
            "--admin",
            &format!("127.0.0.1:{admin}"),
        ]
        .map(String::from)
        .to_vec();
        args.extend(pki.flags(leaf));
        Proc::spawn_logged(&strs(&args), &pki.path("controller.log"))
    }

    fn proxy_metrics(&self, i: usize) -> String {
        https_get(self.proxies[i].2, "/metrics", &self.pki.trust())
    }

    /// The drop ratio the controller sends for the bucket.
    fn ratio(&self) -> Option<f64> {
        metric(
            &https_get(self.controller_admin, "/metrics", &self.pki.trust()),
            "spillway_drop_ratio",
            "bucket=\"all\"",
        )
    }

    /// Every proxy linked and dropping about a third.
    fn wait_converged(&self, limit: Duration) -> Duration {
        wait_for(limit, "every proxy dropping about a third", || {
            (0..HOSTS.len()).all(|i| {
                let m = self.proxy_metrics(i);
                metric(&m, "spillway_control_plane_connected", "") == Some(1.0)
                    && metric(&m, "spillway_drop_ratio", "bucket=\"all\"")
                        .is_some_and(|r| (0.22..0.45).contains(&r))
            })
        })
    }

    /// 37.5 requests/s on each proxy: 150/s against the limit of 100/s.
    fn load(&self) -> Vec<Load> {
        self.proxies
            .iter()
            .map(|(_, listen, _)| Load::start(*listen, 37.5))
            .collect()
    }
}

fn strs(args: &[String]) -> Vec<&str> {
    args.iter().map(String::as_str).collect()
}

/// The sum of `metric{reason="REASON"}` on an admin port.
fn rejected(fleet: &Fleet, admin: u16, reason: &str) -> f64 {
    metric(
        &https_get(admin, "/metrics", &fleet.pki.trust()),
        "spillway_control_plane_rejected_total",
        &format!("reason=\"{reason}\""),
    )
    .unwrap_or(0.0)
}

/// What the Python attacker saw: its status code name and detail.
struct Attack {
    code: String,
    detail: String,
}

/// Runs the attacker for `seconds` against `target` with `args`, sampling the controller's drop
/// ratio meanwhile; returns what it saw and the highest ratio.
fn attack(fleet: &Fleet, target: u16, rpc: &str, args: &[String]) -> (Attack, f64) {
    let proto = Path::new(env!("CARGO_MANIFEST_DIR")).join("../proto/proto");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/attacker.py");
    // scripts/test gives a virtual environment with grpcio and grpcio-tools.
    let python = std::env::var("SPILLWAY_PYTHON").unwrap_or_else(|_| "python3".into());
    let mut child = Command::new(python)
        .arg(&script)
        .args(["--proto-dir", &path(&proto)])
        .args(["--target", &format!("127.0.0.1:{target}")])
        .args(["--rpc", rpc, "--seconds", "3"])
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect(
            "python runs (scripts/test makes SPILLWAY_PYTHON, a venv with grpcio and grpcio-tools)",
        );
    let started = Instant::now();
    let mut highest: f64 = 0.0;
    // Bounded: the attacker talks for 3 s and gives up 3 s later.
    while child.try_wait().unwrap().is_none() && started.elapsed() < Duration::from_secs(20) {
        highest = highest.max(fleet.ratio().unwrap_or(0.0));
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "the attacker failed: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let line = stdout.lines().last().unwrap_or_default();
    let field = |name: &str| {
        let key = format!("\"{name}\": \"");
        line.split_once(&key)
            .and_then(|(_, rest)| rest.split_once('"'))
            .map(|(value, _)| value.to_owned())
            .unwrap_or_default()
    };
    (
        Attack {
            code: field("code"),
            detail: field("detail"),
        },
        highest,
    )
}

fn cert_args(pki: &Pki, leaf: &str, ca: &Path) -> Vec<String> {
    vec![
        "--cert".into(),
        path(&pki.path(&format!("{leaf}/cert.pem"))),
        "--key".into(),
        path(&pki.path(&format!("{leaf}/key.pem"))),
        "--ca".into(),
        path(ca),
    ]
}

/// One impostor: who it is, where it dials, which call, its arguments, the status it should get,
/// and the admin port and `reason` of the counter that should count it.
type Case = (
    &'static str,
    u16,
    &'static str,
    Vec<String>,
    &'static str,
    u16,
    &'static str,
);

#[test]
fn impostors_are_refused_and_an_authenticated_liar_moves_the_ratio_no_further_than_its_bound() {
    let fleet = Fleet::start();
    let _load = fleet.load();
    fleet.wait_converged(Duration::from_secs(30));
    let pki = &fleet.pki;
    let trust = pki.trust();
    let (agg_z1, agg_z1_admin) = (fleet.aggregators[0].1, fleet.aggregators[0].2);
    let (controller, controller_admin) = (fleet.controller_port, fleet.controller_admin);
    // A stranger: a proxy certificate of z1 from another CA; a proxy of the fleet's that is
    // not in the zone it reports to.
    pki.issue(
        "ca2",
        "stranger",
        "proxy",
        &["--region", "r1", "--zone", "z1", "--host", "h1"],
    );
    let liar = |host: &str| {
        vec![
            "--host-id".to_owned(),
            host.to_owned(),
            "--region".into(),
            "r1".into(),
            "--zone".into(),
            "z1".into(),
        ]
    };

    // (what, target, rpc, args, expected code, counter's admin port, reason)
    let cases: Vec<Case> = vec![
        (
            "an unauthenticated plaintext client",
            agg_z1,
            "report",
            liar("h1"),
            "UNAVAILABLE",
            agg_z1_admin,
            "handshake",
        ),
        (
            "a client certificate of another CA",
            agg_z1,
            "report",
            [
                cert_args(pki, "stranger", &pki.path("ca1/ca.pem")),
                liar("h1"),
            ]
            .concat(),
            "UNAVAILABLE",
            agg_z1_admin,
            "handshake",
        ),
        (
            "a proxy of zone z2 at zone z1's aggregator",
            agg_z1,
            "report",
            [cert_args(pki, "h3", &trust), liar("h3")].concat(),
            "PERMISSION_DENIED",
            agg_z1_admin,
            "zone",
        ),
        (
            "a proxy reporting under another host id",
            agg_z1,
            "report",
            [cert_args(pki, "h1", &trust), liar("h2")].concat(),
            "PERMISSION_DENIED",
            agg_z1_admin,
            "host_id",
        ),
        (
            "an aggregator posing as a peer controller",
            controller,
            "exchange",
            [
                cert_args(pki, "agg-z1", &trust),
                vec!["--region".into(), "r2".into()],
            ]
            .concat(),
            "PERMISSION_DENIED",
            controller_admin,
            "role",
        ),
        (
            "a proxy posing as an aggregator",
            controller,
            "link_zone",
            [cert_args(pki, "h1", &trust), liar("h1")].concat(),
            "PERMISSION_DENIED",
            controller_admin,
            "role",
        ),
    ];
    for (what, target, rpc, args, code, admin, reason) in cases {
        let before = rejected(&fleet, admin, reason);
        let (seen, highest) = attack(&fleet, target, rpc, &args);
        assert_eq!(seen.code, code, "{what}: {}", seen.detail);
        assert!(
            rejected(&fleet, admin, reason) > before,
            "{what}: spillway_control_plane_rejected_total{{reason=\"{reason}\"}} did not grow"
        );
        // Honest: 1/3. Had the liar's 1e9 been counted, it would be 2/3 (its bound) or more.
        assert!(
            highest < 0.5,
            "{what}: the drop ratio moved to {highest} although the peer was refused"
        );
    }
    let log = std::fs::read_to_string(pki.path("agg-z1.log")).unwrap();
    for names in [
        "the TLS handshake failed",
        "spiffe://spillway.local/spillway/proxy/r1/z2/h3",
        "the certificate names host h1, the report host \"h2\"",
    ] {
        assert!(
            log.lines()
                .any(|l| l.contains("refused a control-plane peer") && l.contains(names)),
            "the aggregator's log has a refusal naming {names}:\n{log}"
        );
    }

    // An authenticated liar: a certificate of the fleet's own for a new host of z1. Its report
    // is counted at most max(limit, 4 x the median of z1's other hosts), so with R/s honest
    // the ratio stays within 1 - L / (R + max(L, 4 x R/4)) (docs/security.md).
    let honest = metric(
        &https_get(controller_admin, "/metrics", &trust),
        "spillway_bucket_observed_rps",
        "bucket=\"all\"",
    )
    .expect("the controller sees the load");
    pki.issue(
        "ca1",
        "h9",
        "proxy",
        &["--region", "r1", "--zone", "z1", "--host", "h9"],
    );
    let (seen, highest) = attack(
        &fleet,
        agg_z1,
        "report",
        &[cert_args(pki, "h9", &trust), liar("h9")].concat(),
    );
    assert_eq!(
        seen.code, "OK",
        "an authenticated proxy is heard: {}",
        seen.detail
    );
    let bound = 1.0 - 100.0 / (honest + honest.max(100.0));
    assert!(
        highest > 0.45,
        "the liar's report was counted (the ratio rose to {highest}, honest load {honest}/s)"
    );
    assert!(
        highest <= bound + 0.06,
        "the ratio rose to {highest}, above the bound {bound} for {honest}/s of honest load"
    );
}

#[test]
fn a_tls_fleet_converges_and_rides_out_a_certificate_rotation() {
    let mut fleet = Fleet::start();
    let _load = fleet.load();
    let took = fleet.wait_converged(Duration::from_secs(30));
    eprintln!("converged {took:?} after the load started");
    // Every role took its region, zone and host from its certificate.
    let hosts = https_get(fleet.controller_admin, "/v1/hosts", &fleet.pki.trust());
    for (host, _) in HOSTS {
        assert!(hosts.contains(&format!("\"{host}\"")), "{host} in {hosts}");
    }
    let counter = |fleet: &Fleet, i: usize, name: &str| {
        metric(&fleet.proxy_metrics(i), name, "").unwrap_or(-1.0)
    };
    let connects: Vec<f64> = (0..HOSTS.len())
        .map(|i| counter(&fleet, i, "spillway_control_plane_connects_total"))
        .collect();
    let reports: Vec<f64> = (0..HOSTS.len())
        .map(|i| counter(&fleet, i, "spillway_control_plane_reports_total"))
        .collect();

    // Rotation of every leaf in place, and of the CA file to trust a second CA beside the first
    // (written beside and renamed, as cert-manager and SPIRE do).
    for (host, zone) in HOSTS {
        fleet.pki.issue(
            "ca1",
            host,
            "proxy",
            &["--region", "r1", "--zone", zone, "--host", host],
        );
    }
    for zone in ["z1", "z2"] {
        fleet.pki.issue(
            "ca1",
            &format!("agg-{zone}"),
            "aggregator",
            &["--region", "r1", "--zone", zone],
        );
    }
    let bundle = [
        std::fs::read_to_string(fleet.pki.path("ca1/ca.pem")).unwrap(),
        std::fs::read_to_string(fleet.pki.path("ca2/ca.pem")).unwrap(),
    ]
    .concat();
    let temp = fleet.pki.path("trust.pem.tmp");
    std::fs::write(&temp, bundle).unwrap();
    std::fs::rename(&temp, fleet.pki.trust()).unwrap();
    std::thread::sleep(Duration::from_secs(2));
    for i in 0..HOSTS.len() {
        assert_eq!(
            counter(&fleet, i, "spillway_control_plane_connects_total"),
            connects[i],
            "proxy {i}'s stream stayed open across the rotation"
        );
        // 2 s at four reports a second: at least 6 more, none lost to the rotation.
        let more = counter(&fleet, i, "spillway_control_plane_reports_total") - reports[i];
        assert!(more >= 6.0, "proxy {i} sent {more} reports in 2 s");
    }
    fleet.wait_converged(Duration::from_secs(5));

    // The controller comes back with a certificate of the second CA: the aggregators' new
    // handshakes succeed only if they re-read the CA file, and the controller's only if their
    // rotated leaves still chain to a CA it trusts.
    fleet
        .pki
        .issue("ca2", "controller2", "controller", &["--region", "r1"]);
    fleet.controller.kill();
    fleet.controller = Fleet::controller(
        &fleet.pki,
        "controller2",
        fleet.controller_port,
        fleet.controller_admin,
    );
    wait_for(Duration::from_secs(15), "both aggregators back", || {
        metric(
            &https_get(fleet.controller_admin, "/metrics", &fleet.pki.trust()),
            "spillway_controller_zones",
            "",
        ) == Some(2.0)
    });
    fleet.wait_converged(Duration::from_secs(15));
    assert_eq!(
        rejected(&fleet, fleet.controller_admin, "handshake"),
        0.0,
        "no handshake failed at the new controller"
    );
}

#[test]
fn transport_flags_that_would_downgrade_or_misidentify_exit_2() {
    let pki = Pki::new();
    pki.issue(
        "ca1",
        "agg",
        "aggregator",
        &["--region", "r1", "--zone", "z1"],
    );
    pki.issue(
        "ca1",
        "proxy",
        "proxy",
        &["--region", "r1", "--zone", "z1", "--host", "h1"],
    );
    let aggregator = |extra: &[String]| {
        let mut args: Vec<String> = ["aggregator", "--listen", "127.0.0.1:0"]
            .map(String::from)
            .to_vec();
        args.extend_from_slice(extra);
        spillway(&strs(&args))
    };
    let s = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let place = s(&["--region", "r1", "--zone", "z1"]);
    let cases: Vec<(&str, Vec<String>, &str)> = vec![
        (
            "https without TLS flags",
            [place.clone(), s(&["--controller", "https://127.0.0.1:1"])].concat(),
            "--tls-cert",
        ),
        (
            "TLS flags with an http:// controller",
            [pki.flags("agg"), s(&["--controller", "http://127.0.0.1:1"])].concat(),
            "https://",
        ),
        (
            "a proxy's certificate for an aggregator",
            [
                pki.flags("proxy"),
                s(&["--controller", "https://127.0.0.1:1"]),
            ]
            .concat(),
            "--role aggregator",
        ),
        (
            "a zone that disagrees with the certificate",
            [
                pki.flags("agg"),
                s(&["--zone", "z2", "--controller", "https://127.0.0.1:1"]),
            ]
            .concat(),
            "disagrees",
        ),
        (
            "an admin port off loopback without a token",
            [
                pki.flags("agg"),
                s(&[
                    "--controller",
                    "https://127.0.0.1:1",
                    "--admin",
                    "0.0.0.0:0",
                ]),
            ]
            .concat(),
            "--admin-token-file",
        ),
    ];
    for (what, args, says) in cases {
        let out = aggregator(&args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{what}: {stderr}");
        assert!(
            stderr.contains(says),
            "{what}: {stderr} should mention {says}"
        );
    }

    // A plaintext listener off loopback is refused before it binds anything (that
    // --insecure-plaintext lets it start with a warning is a unit test of the command line:
    // these tests bind loopback only).
    let off_loopback = s(&[
        "aggregator",
        "--listen",
        "0.0.0.0:0",
        "--region",
        "r1",
        "--zone",
        "z1",
        "--controller",
        "http://127.0.0.1:1",
    ]);
    let out = spillway(&strs(&off_loopback));
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--insecure-plaintext"));

    // A leaf without what its role needs.
    let out = spillway(&[
        "certs",
        "issue",
        "--ca",
        &path(&pki.path("ca1")),
        "--role",
        "proxy",
        "--region",
        "r1",
        "--out",
        &path(&pki.path("bad")),
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--zone"));
}

#[test]
fn a_controllers_admin_port_with_a_token_opens_its_api_to_the_bearer_and_a_signed_in_browser() {
    let pki = Pki::new();
    pki.issue("ca1", "controller", "controller", &["--region", "r1"]);
    std::fs::write(pki.path("rules.yaml"), RULES).unwrap();
    let token = "a-token-of-the-operators-0123456789";
    std::fs::write(pki.path("admin-token"), format!("{token}\n")).unwrap();
    let admin = free_port();
    let mut args: Vec<String> = [
        "controller",
        "--listen",
        "127.0.0.1:0",
        "-c",
        &path(&pki.path("rules.yaml")),
        "--admin",
        &format!("127.0.0.1:{admin}"),
        "--admin-token-file",
        &path(&pki.path("admin-token")),
    ]
    .map(String::from)
    .to_vec();
    args.extend(pki.flags("controller"));
    let _controller = Proc::spawn(&strs(&args));
    let ca = pki.trust();
    wait_for(Duration::from_secs(10), "the admin port over HTTPS", || {
        https(admin, "GET /readyz", "", "", &ca).0 == 200
    });
    // Probes and Prometheus need nothing; the API and the dashboard need the token.
    assert_eq!(https(admin, "GET /metrics", "", "", &ca).0, 200);
    assert_eq!(https(admin, "GET /v1/hosts", "", "", &ca).0, 401);
    let bearer = format!("authorization: Bearer {token}\r\n");
    assert_eq!(https(admin, "GET /v1/hosts", &bearer, "", &ca).0, 200);
    let wrong = "authorization: Bearer a-token-of-someone-else-0123456\r\n";
    assert_eq!(https(admin, "GET /v1/hosts", wrong, "", &ca).0, 401);
    let (status, _, page) = https(admin, "GET /", "", "", &ca);
    assert_eq!(status, 401);
    assert!(
        page.contains("<form"),
        "the dashboard asks to sign in: {page}"
    );
    // A browser signs in once and its cookie opens the dashboard.
    let form = "content-type: application/x-www-form-urlencoded\r\n";
    let (status, head, _) = https(admin, "POST /signin", form, &format!("token={token}"), &ca);
    assert_eq!(status, 303, "{head}");
    let cookie_line = head
        .lines()
        .find(|l| l.to_ascii_lowercase().starts_with("set-cookie:"))
        .expect("a cookie");
    for attribute in ["HttpOnly", "SameSite=Strict", "Secure"] {
        assert!(cookie_line.contains(attribute), "{cookie_line}");
    }
    assert!(!cookie_line.contains(token), "the cookie is not the token");
    let pair = cookie_line
        .split_once(':')
        .unwrap()
        .1
        .split(';')
        .next()
        .unwrap()
        .trim();
    let (status, _, page) = https(admin, "GET /", &format!("cookie: {pair}\r\n"), "", &ca);
    assert_eq!(status, 200);
    assert!(!page.contains("<form"), "signed in, the dashboard itself");
}
