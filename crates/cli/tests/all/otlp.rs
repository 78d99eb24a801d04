//! Tracing to an OpenTelemetry collector: `spillway up --otlp-endpoint` sends, over real
//! OTLP/gRPC, a span per rules service request (a child of the caller's `traceparent`, named by
//! route, with its status, request id and user) and a span per control interval of its
//! controller and its aggregator. The collector is the OTLP trace service's own generated
//! server on a loopback port. Without the flag nothing is sent, and a URL the exporter cannot
//! use is refused before the start.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::support::SPILLWAY;
use crate::support::fleet::{Load, wait_for};
use crate::support::up::{up_with, user};
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::{KeyValue, any_value};

/// A span as the collector received it.
#[derive(Debug, Clone)]
struct Got {
    service: String,
    name: String,
    trace_id: String,
    parent_span_id: String,
    attributes: HashMap<String, String>,
}

impl Got {
    fn attr(&self, key: &str) -> Option<&str> {
        self.attributes.get(key).map(String::as_str)
    }
}

#[derive(Clone, Default)]
struct Collector {
    spans: Arc<Mutex<Vec<Got>>>,
}

fn text(value: &KeyValue) -> String {
    match value.value.as_ref().and_then(|v| v.value.as_ref()) {
        Some(any_value::Value::StringValue(s)) => s.clone(),
        Some(any_value::Value::IntValue(i)) => i.to_string(),
        Some(any_value::Value::BoolValue(b)) => b.to_string(),
        Some(any_value::Value::DoubleValue(d)) => d.to_string(),
        other => format!("{other:?}"),
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[tonic::async_trait]
impl TraceService for Collector {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let mut spans = self.spans.lock().unwrap();
        for resource in request.into_inner().resource_spans {
            let service = resource
                .resource
                .iter()
                .flat_map(|r| &r.attributes)
                .find(|a| a.key == "service.name")
                .map(text)
                .unwrap_or_default();
            for span in resource.scope_spans.into_iter().flat_map(|s| s.spans) {
                spans.push(Got {
                    service: service.clone(),
                    name: span.name,
                    trace_id: hex(&span.trace_id),
                    parent_span_id: hex(&span.parent_span_id),
                    attributes: span
                        .attributes
                        .iter()
                        .map(|a| (a.key.clone(), text(a)))
                        .collect(),
                });
            }
        }
        Ok(tonic::Response::new(ExportTraceServiceResponse {
            partial_success: None,
        }))
    }
}

/// The collector on a loopback port, served from its own thread: (its URL, what it received).
fn collector() -> (String, Arc<Mutex<Vec<Got>>>) {
    let collector = Collector::default();
    let spans = collector.spans.clone();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async move {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            tx.send(listener.local_addr().unwrap()).unwrap();
            tonic::transport::Server::builder()
                .add_service(TraceServiceServer::new(collector))
                .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener))
                .await
                .unwrap();
        });
    });
    let addr = rx.recv().unwrap();
    (format!("http://{addr}"), spans)
}

/// One HTTP/1.1 GET with `headers` (lines ending in CRLF): the answer's head, lowercased.
fn get(port: u16, path: &str, headers: &str) -> String {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let head = format!("GET {path} HTTP/1.1\r\nhost: test\r\nconnection: close\r\n{headers}\r\n");
    stream.write_all(head.as_bytes()).unwrap();
    let mut answer = String::new();
    let _ = stream.read_to_string(&mut answer);
    answer
        .split_once("\r\n\r\n")
        .map_or(answer.clone(), |(h, _)| h.to_owned())
        .to_ascii_lowercase()
}

/// The attributes docs/operations.md's span table gives the span of the row whose first cell
/// contains `span`: every backticked name of its third cell with a dot or an underscore.
fn documented(span: &str) -> Vec<String> {
    let docs = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../docs/operations.md"
    ))
    .unwrap();
    let row = docs
        .lines()
        .find(|l| l.starts_with("| ") && l.split('|').nth(1).is_some_and(|c| c.contains(span)))
        .unwrap_or_else(|| panic!("docs/operations.md has no span row for {span}"));
    let cell = row.split('|').nth(3).unwrap();
    cell.split('`')
        .skip(1)
        .step_by(2)
        .filter(|name| name.contains(['.', '_']) && !name.contains(' '))
        .map(str::to_owned)
        .collect()
}

const CONFIG: &str = "version: 1\ncontrol:\n  report_interval: 250ms\nservices:\n  api:\n    buckets:\n      - { name: orders, match: {procedure: /orders}, limit: 1000/s }\n";

const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const PARENT: &str = "00f067aa0ba902b7";

#[test]
fn up_sends_a_span_per_rules_request_and_per_control_interval_to_the_collector() {
    let (url, spans) = collector();
    let dir = tempfile::tempdir().unwrap();
    let mut up = up_with(dir.path(), CONFIG, &["--otlp-endpoint", &url]);
    let token = user(&up.db, "ops", "admin");
    let load = Load::on_path(up.listen, 20.0, "/orders");

    // A traced caller: its span is the parent, its request id comes back.
    let head = get(
        up.rules,
        "/v1/rules",
        &format!(
            "authorization: Bearer {token}\r\ntraceparent: 00-{TRACE}-{PARENT}-01\r\nx-request-id: change-42\r\n"
        ),
    );
    assert!(head.starts_with("http/1.1 200"), "{head}");
    assert!(head.contains("x-request-id: change-42"), "{head}");
    // An untraced one gets a request id of its own.
    let head = get(
        up.rules,
        "/v1/rules/no-such-rule",
        &format!("authorization: Bearer {token}\r\n"),
    );
    assert!(head.starts_with("http/1.1 404"), "{head}");
    let id = head
        .lines()
        .find_map(|l| l.strip_prefix("x-request-id: "))
        .expect("a request id");
    assert_eq!(id.len(), 32, "{head}");

    let intervals = |role: &str| {
        spans
            .lock()
            .unwrap()
            .iter()
            .filter(|s| s.name == "control.interval" && s.attr("spillway.role") == Some(role))
            .filter(|s| s.attr("spillway.outcome") == Some("sent"))
            .cloned()
            .collect::<Vec<_>>()
    };
    // The batch exporter sends every few seconds.
    wait_for(
        Duration::from_secs(30),
        "interval spans of both roles",
        || intervals("controller").len() >= 3 && intervals("aggregator").len() >= 3,
    );
    drop(load);
    let status = up.proc.terminate();
    assert!(status.is_some_and(|s| s.success()), "{status:?}");

    // Sent at the exit at the latest.
    wait_for(Duration::from_secs(15), "both requests' spans", || {
        spans
            .lock()
            .unwrap()
            .iter()
            .filter(|s| s.name.starts_with("GET /v1/rules"))
            .count()
            >= 2
    });
    let all = spans.lock().unwrap().clone();
    assert!(all.iter().all(|s| s.service == "spillway-up"), "{all:#?}");
    let traced = all
        .iter()
        .find(|s| s.attr("request_id") == Some("change-42"))
        .expect("the traced request's span");
    assert_eq!(traced.name, "GET /v1/rules");
    assert_eq!(traced.trace_id, TRACE);
    assert_eq!(traced.parent_span_id, PARENT);
    assert_eq!(traced.attr("http.route"), Some("/v1/rules"));
    assert_eq!(traced.attr("http.response.status_code"), Some("200"));
    assert_eq!(traced.attr("enduser.id"), Some("ops"));
    let untraced = all
        .iter()
        .find(|s| s.attr("request_id") == Some(id))
        .expect("the untraced request's span");
    // Named by its route, never by the id in its path.
    assert_eq!(untraced.name, "GET /v1/rules/{id}");
    assert_eq!(untraced.attr("url.path"), Some("/v1/rules/no-such-rule"));
    assert_eq!(untraced.attr("http.response.status_code"), Some("404"));
    assert_ne!(untraced.trace_id, TRACE);
    assert!(untraced.parent_span_id.is_empty(), "{untraced:?}");

    // Every attribute the docs name is on the spans.
    let request_attributes = documented("METHOD /route");
    assert!(request_attributes.len() >= 6, "{request_attributes:?}");
    for name in &request_attributes {
        assert!(traced.attr(name).is_some(), "{name} is not on {traced:?}");
    }
    let interval_attributes = documented("control.interval");
    assert!(interval_attributes.len() >= 8, "{interval_attributes:?}");
    for role in ["controller", "aggregator"] {
        let spans = intervals(role);
        for name in interval_attributes
            .iter()
            .filter(|n| *n != "spillway.zone" || role == "aggregator")
        {
            assert!(
                spans[0].attr(name).is_some(),
                "{name} is not on {:?}",
                spans[0]
            );
        }
    }

    for role in ["controller", "aggregator"] {
        let spans = intervals(role);
        let sequences: Vec<u64> = spans
            .iter()
            .map(|s| s.attr("spillway.sequence").unwrap().parse().unwrap())
            .collect();
        assert!(
            sequences.windows(2).all(|w| w[0] < w[1]),
            "{role}: {sequences:?}"
        );
        for span in &spans {
            assert_eq!(span.attr("spillway.region"), Some("local"), "{span:?}");
            let reports: u64 = span.attr("spillway.reports").unwrap().parse().unwrap();
            assert!(reports >= 1, "{span:?}");
            assert_eq!(span.attr("spillway.sent_to"), Some("1"), "{span:?}");
            assert_eq!(span.attr("spillway.buckets"), Some("1"), "{span:?}");
        }
    }
}

#[test]
fn an_endpoint_the_exporter_cannot_use_exits_2_before_the_start() {
    for (url, says) in [
        ("https://collector:4317", "plain OTLP/gRPC only"),
        ("collector:4317", "give an http:// URL"),
        ("http://", "names no host"),
    ] {
        let out = Command::new(SPILLWAY)
            .args(["--otlp-endpoint", url, "check", "-c", "/nonexistent.yaml"])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{url}: {err}");
        assert!(
            err.contains("--otlp-endpoint") && err.contains(says),
            "{url}: {err}"
        );
    }
}
