//! `spillway demo --scenario tokens`: token budgets charged at the response, in one process.
//!
//! An OpenAI-compatible fake upstream (`POST /v1/chat/completions`: a JSON answer with `usage`,
//! or with `"stream": true` an SSE stream whose last event carries it; 100 to 2,000 tokens
//! each, drawn at random), sidecars in front of it with one token budget per API key (the
//! response's `usage.total_tokens`, token-bucket; `store: local`, a bucket per key, or
//! `store: redis`, one bucket whose subject is the key), and a few
//! API keys each offering more tokens than its budget. The summary compares the tokens each key
//! was answered with what its budget allows over the run (`rate x seconds + burst`).
//!
//! With `store: local` each sidecar holds its own budgets, so each key is sent to one sidecar
//! (as a load balancer hashing on the key would); with `store: redis` the budgets are shared and
//! every key's requests are spread over every sidecar.

use std::convert::Infallible;
use std::fmt;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::service::service_fn;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use spillway_proxy::{Proxy, ProxyOptions};
use tokio::sync::{Semaphore, watch};

use crate::DemoError;

/// The fewest and most tokens one answer reports.
pub const MIN_TOKENS: u64 = 100;
pub const MAX_TOKENS: u64 = 2_000;
/// The mean tokens of an answer, for the offered rate.
const MEAN_TOKENS: f64 = (MIN_TOKENS + MAX_TOKENS) as f64 / 2.0;
/// How long the fake upstream takes to answer (a streamed answer: to its last event).
const UPSTREAM_DELAY: Duration = Duration::from_millis(20);
const STREAM_DELAY: Duration = Duration::from_millis(60);

/// How the tokens scenario runs.
#[derive(Debug, Clone)]
pub struct TokensOptions {
    pub seconds: u64,
    pub sidecars: usize,
    pub keys: usize,
    /// Each key's budget, tokens a second (also its burst).
    pub budget: u64,
    /// Each key offers this many times its budget, in tokens.
    pub offered: f64,
    /// The share of requests that ask for a streamed answer.
    pub streamed: f64,
    /// `store: redis` at this URL; `None`: `store: local`.
    pub redis: Option<String>,
}

impl TokensOptions {
    pub fn new(seconds: u64) -> Self {
        Self {
            seconds,
            sidecars: 2,
            keys: 3,
            budget: 5_000,
            offered: 2.0,
            streamed: 0.5,
            redis: None,
        }
    }

    /// The sidecars' rules: one budget per key. In Redis, one bucket whose subject is the API
    /// key (`api_key: "*"`): one meter per key, every sidecar charging it; locally, a bucket
    /// per key, since each key is sent to one sidecar.
    pub fn rules(&self) -> String {
        let mut yaml = String::from("version: 1\n");
        if let Some(url) = &self.redis {
            yaml.push_str(&format!("redis: {{ url: \"{url}\", timeout: 200ms }}\n"));
        }
        yaml.push_str("services:\n  llm:\n    buckets:\n");
        let bucket = |name: &str, key: &str, store: &str| {
            format!(
                "      - name: {name}\n        match: {{ procedure: /v1/chat/completions, api_key: {key} }}\n        limit: {}/s\n        algorithm: token-bucket\n        store: {store}\n        cost: {{ response: json:usage.total_tokens }}\n",
                self.budget
            )
        };
        if self.redis.is_some() {
            yaml.push_str(&bucket(PER_KEY_BUCKET, "\"*\"", "redis"));
        } else {
            for key in 1..=self.keys {
                yaml.push_str(&bucket(
                    &format!("tokens-key-{key}"),
                    &format!("key-{key}"),
                    "local",
                ));
            }
        }
        yaml
    }
}

/// The Redis mode's one bucket, a budget per API key.
const PER_KEY_BUCKET: &str = "tokens-per-key";

/// What one key did.
#[derive(Debug, Default)]
struct KeyCounts {
    offered: AtomicU64,
    admitted: AtomicU64,
    refused: AtomicU64,
    errors: AtomicU64,
    /// Tokens the upstream answered this key with (what its `usage` reported).
    tokens: AtomicU64,
    streamed: AtomicU64,
    /// What happened to the key's budget, in nanoseconds since the start: the tokens of each
    /// answer when the upstream sent it (when the sidecar debits it), and each refusal (0) when
    /// its request was sent.
    events: Mutex<Vec<(u64, u64)>>,
}

impl KeyCounts {
    fn event(&self, start: Instant, tokens: u64) {
        let at = u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX);
        if let Ok(mut events) = self.events.lock() {
            events.push((at, tokens));
        }
    }
}

/// The keys' counts, and the instant their events are timed from.
#[derive(Debug)]
struct Counts {
    start: Instant,
    keys: Vec<KeyCounts>,
}

/// One key's line of the summary.
#[derive(Debug, Clone)]
pub struct KeySummary {
    pub key: String,
    pub offered: u64,
    pub admitted: u64,
    pub refused: u64,
    pub errors: u64,
    pub streamed: u64,
    pub tokens: u64,
    /// Refusals while the budget, replayed from the answers' tokens, had room: at least one
    /// token, and at least 5 ms of refill.
    pub wrongful: (u64, u64),
}

/// What the tokens scenario measured.
#[derive(Debug, Clone)]
pub struct TokensSummary {
    pub options: TokensOptions,
    pub seconds: f64,
    pub keys: Vec<KeySummary>,
    /// Responses whose usage could not be read (charged the default), over every sidecar.
    pub unreported: u64,
    /// Tokens the sidecars debited from the keys' budgets, summed over them.
    pub debited: u64,
}

impl TokensSummary {
    /// The tokens a key's budget allows over the run: its rate times the run's length, plus
    /// the burst it starts full with.
    pub fn allowed(&self) -> f64 {
        self.options.budget as f64 * (self.seconds + 1.0)
    }
}

impl fmt::Display for TokensSummary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let o = &self.options;
        let (store, routing) = match &o.redis {
            Some(_) => ("redis", "every key spread over every sidecar"),
            None => ("local", "each key sent to one sidecar"),
        };
        writeln!(f, "spillway demo --scenario tokens: summary")?;
        writeln!(
            f,
            "  fleet              {} sidecars, store: {store}, {routing}",
            o.sidecars
        )?;
        writeln!(
            f,
            "  budget             {} tokens/s per API key (burst {}), {:.1} s: {:.0} tokens allowed per key",
            o.budget,
            o.budget,
            self.seconds,
            self.allowed()
        )?;
        writeln!(
            f,
            "  offered            {:.1}x the budget per key ({MIN_TOKENS}-{MAX_TOKENS} tokens an answer, {:.0}% streamed)",
            o.offered,
            o.streamed * 100.0
        )?;
        writeln!(
            f,
            "  {:<8} {:>9} {:>9} {:>9} {:>7} {:>16} {:>12}",
            "key", "requests", "admitted", "refused", "errors", "tokens admitted", "of allowed"
        )?;
        let mut all = 0;
        for k in &self.keys {
            all += k.tokens;
            writeln!(
                f,
                "  {:<8} {:>9} {:>9} {:>9} {:>7} {:>16} {:>11.1}%",
                k.key,
                k.offered,
                k.admitted,
                k.refused,
                k.errors,
                k.tokens,
                100.0 * k.tokens as f64 / self.allowed()
            )?;
        }
        let refused: u64 = self.keys.iter().map(|k| k.refused).sum();
        writeln!(
            f,
            "  tokens admitted    {all} of {:.0} allowed ({:.1}%)",
            self.allowed() * self.keys.len() as f64,
            100.0 * all as f64 / (self.allowed() * self.keys.len() as f64)
        )?;
        writeln!(
            f,
            "  requests refused   {refused} (429, the key's budget in debt)"
        )?;
        let strict: u64 = self.keys.iter().map(|k| k.wrongful.0).sum();
        let loose: u64 = self.keys.iter().map(|k| k.wrongful.1).sum();
        writeln!(
            f,
            "  wrongful refusals  {strict} while the budget (replayed from the answers) had a token, {loose} while it had 5 ms of refill"
        )?;
        writeln!(f, "  tokens debited     {} by the sidecars", self.debited)?;
        writeln!(
            f,
            "  unreported costs   {} (answers whose usage could not be read, charged the default)",
            self.unreported
        )
    }
}

/// Runs the tokens scenario for `options.seconds`.
pub async fn run_tokens(options: TokensOptions) -> Result<TokensSummary, DemoError> {
    let dir = tempfile::Builder::new()
        .prefix("spillway-demo-tokens-")
        .tempdir()
        .map_err(DemoError::io("the demo's temporary folder"))?;
    let rules_file = dir.path().join("tokens.yaml");
    std::fs::write(&rules_file, options.rules()).map_err(DemoError::io("the demo's rules file"))?;
    let counts = Arc::new(Counts {
        start: Instant::now(),
        keys: (0..options.keys).map(|_| KeyCounts::default()).collect(),
    });
    let (stop_tx, stop_rx) = watch::channel(false);
    let (upstream, upstream_task) = fake_llm(stop_rx, counts.clone()).await?;
    let any: SocketAddr = "127.0.0.1:0".parse().expect("a socket address");
    let mut proxies = Vec::new();
    for _ in 0..options.sidecars.max(1) {
        let mut p = ProxyOptions::new(rules_file.clone(), any, format!("http://{upstream}"));
        p.drain_timeout = Duration::from_secs(1);
        proxies.push(Proxy::start(p).await?);
    }
    let targets: Vec<SocketAddr> = proxies.iter().map(Proxy::addr).collect();
    let run = Duration::from_secs(options.seconds.max(1));
    let start = Instant::now();
    let end = start + run;
    let rps = options.offered * options.budget as f64 / MEAN_TOKENS;
    let mut tasks = Vec::new();
    for key in 0..options.keys {
        let targets = match options.redis {
            Some(_) => targets.clone(),
            None => vec![targets[key % targets.len()]],
        };
        tasks.push(tokio::spawn(offer(
            key,
            targets,
            rps,
            options.streamed,
            counts.clone(),
            end,
        )));
    }
    for t in tasks {
        let _ = t.await;
    }
    let seconds = start.elapsed().as_secs_f64().min(run.as_secs_f64());
    // The answers in flight at the end come back (bounded by the upstream's delays).
    let drain = Instant::now() + Duration::from_secs(5);
    while Instant::now() < drain
        && counts.keys.iter().any(|c| {
            c.offered.load(Ordering::Relaxed)
                > c.admitted.load(Ordering::Relaxed)
                    + c.refused.load(Ordering::Relaxed)
                    + c.errors.load(Ordering::Relaxed)
        })
    {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // What the sidecars debited, over the keys' buckets (one per key locally, Redis's one
    // bucket of a budget per key).
    let debits = || {
        let (mut debited, mut unreported) = (0, 0);
        for p in &proxies {
            let rules = p.client().rules();
            let names = (1..=options.keys)
                .map(|key| format!("tokens-key-{key}"))
                .chain([PER_KEY_BUCKET.to_owned()]);
            for b in names.filter_map(|name| rules.find("llm", &name)) {
                debited += b.budget().debited();
                unreported += b.budget().unreported();
            }
        }
        (debited, unreported)
    };
    // A sidecar settles an answer after the client has it: with `store: redis`, once its Redis
    // call returns. Those still in flight are waited for (a busy machine's Redis may take a
    // while), up to 5 s.
    let answered: u64 = counts
        .keys
        .iter()
        .map(|c| c.tokens.load(Ordering::Relaxed))
        .sum();
    let settle = Instant::now() + Duration::from_secs(5);
    while debits().0 < answered && Instant::now() < settle {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (debited, unreported) = debits();
    let burst = options.budget;
    let keys = counts
        .keys
        .iter()
        .enumerate()
        .map(|(i, c)| KeySummary {
            wrongful: c.events.lock().map_or((0, 0), |mut events| {
                events.sort_unstable();
                wrongful(&events, options.budget, burst)
            }),
            key: format!("key-{}", i + 1),
            offered: c.offered.load(Ordering::Relaxed),
            admitted: c.admitted.load(Ordering::Relaxed),
            refused: c.refused.load(Ordering::Relaxed),
            errors: c.errors.load(Ordering::Relaxed),
            streamed: c.streamed.load(Ordering::Relaxed),
            tokens: c.tokens.load(Ordering::Relaxed),
        })
        .collect();
    for p in proxies {
        p.shutdown().await;
    }
    stop_tx.send_replace(true);
    let _ = upstream_task.await;
    drop(dir);
    Ok(TokensSummary {
        options,
        seconds,
        keys,
        unreported,
        debited,
    })
}

/// One key's open-loop load: `rps` chat completions a second, round robin over `targets`, a
/// share of them streamed, up to 256 in flight.
async fn offer(
    key: usize,
    targets: Vec<SocketAddr>,
    rps: f64,
    streamed: f64,
    counts: Arc<Counts>,
    end: Instant,
) {
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    let client: Client<HttpConnector, Full<Bytes>> =
        Client::builder(TokioExecutor::new()).build(connector);
    let in_flight = Arc::new(Semaphore::new(256));
    let api_key = format!("key-{}", key + 1);
    let mut next = Instant::now();
    let mut n = 0usize;
    while next < end {
        tokio::time::sleep_until(next.into()).await;
        next += Duration::from_secs_f64(1.0 / rps.max(0.1));
        let Ok(permit) = in_flight.clone().acquire_owned().await else {
            return;
        };
        let target = targets[n % targets.len()];
        n += 1;
        let stream = fastrand::f64() < streamed;
        let body = if stream {
            r#"{"model":"demo","messages":[{"role":"user","content":"hi"}],"stream":true,"stream_options":{"include_usage":true}}"#
        } else {
            r#"{"model":"demo","messages":[{"role":"user","content":"hi"}]}"#
        };
        let request = Request::post(format!("http://{target}/v1/chat/completions"))
            .header("content-type", "application/json")
            .header("x-api-key", api_key.as_str())
            .body(Full::new(Bytes::from_static(body.as_bytes())));
        let Ok(request) = request else { return };
        let (client, counts) = (client.clone(), counts.clone());
        counts.keys[key].offered.fetch_add(1, Ordering::Relaxed);
        let sent = Instant::now();
        tokio::spawn(async move {
            let _permit = permit;
            let c = &counts.keys[key];
            match client.request(request).await {
                Ok(response) => {
                    let status = response.status();
                    let whole = response.into_body().collect().await.is_ok();
                    match status {
                        StatusCode::OK if whole => c.admitted.fetch_add(1, Ordering::Relaxed),
                        StatusCode::TOO_MANY_REQUESTS => {
                            let at = sent.saturating_duration_since(counts.start);
                            if let Ok(mut events) = c.events.lock() {
                                events.push((u64::try_from(at.as_nanos()).unwrap_or(u64::MAX), 0));
                            }
                            c.refused.fetch_add(1, Ordering::Relaxed)
                        }
                        _ => c.errors.fetch_add(1, Ordering::Relaxed),
                    }
                }
                Err(_) => c.errors.fetch_add(1, Ordering::Relaxed),
            };
        });
    }
}

/// The fake LLM API on `127.0.0.1:0`: `POST /v1/chat/completions` answers 100 to 2,000
/// tokens, as one JSON document with `usage` or, when the request asks `"stream": true`, as
/// SSE chunks followed by an event with `usage` (OpenAI's `include_usage`) and `[DONE]`. The
/// tokens of each answer are counted for the key of its `x-api-key`.
async fn fake_llm(
    stop: watch::Receiver<bool>,
    counts: Arc<Counts>,
) -> Result<(SocketAddr, tokio::task::JoinHandle<()>), DemoError> {
    let service = service_fn(move |request: Request<hyper::body::Incoming>| {
        let counts = counts.clone();
        async move { Ok::<_, Infallible>(complete(request, &counts).await) }
    });
    crate::load::serve_http1("the fake LLM upstream", stop, service).await
}

/// One chat completion.
async fn complete(
    request: Request<hyper::body::Incoming>,
    counts: &Counts,
) -> Response<Full<Bytes>> {
    if request.method() != http::Method::POST || request.uri().path() != "/v1/chat/completions" {
        let mut r = Response::new(Full::new(Bytes::from_static(b"not found")));
        *r.status_mut() = StatusCode::NOT_FOUND;
        return r;
    }
    let key = request
        .headers()
        .get("x-api-key")
        .and_then(|v| v.to_str().ok())
        .and_then(|k| k.strip_prefix("key-"))
        .and_then(|n| n.parse::<usize>().ok())
        .and_then(|n| n.checked_sub(1));
    let body = request
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let asked: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
    let stream = asked["stream"].as_bool().unwrap_or(false);
    let total = fastrand::u64(MIN_TOKENS..=MAX_TOKENS);
    let prompt = total / 4;
    let usage = serde_json::json!({
        "prompt_tokens": prompt,
        "completion_tokens": total - prompt,
        "total_tokens": total,
    });
    let (content_type, text) = if stream {
        tokio::time::sleep(STREAM_DELAY).await;
        let mut events = String::new();
        for word in ["Hel", "lo", "!"] {
            let chunk = serde_json::json!({
                "object": "chat.completion.chunk",
                "choices": [{"index": 0, "delta": {"content": word}}],
                "usage": null,
            });
            events.push_str(&format!("data: {chunk}\n\n"));
        }
        let last = serde_json::json!({
            "object": "chat.completion.chunk",
            "choices": [],
            "usage": usage,
        });
        events.push_str(&format!("data: {last}\n\ndata: [DONE]\n\n"));
        ("text/event-stream", events)
    } else {
        tokio::time::sleep(UPSTREAM_DELAY).await;
        let answer = serde_json::json!({
            "id": "chatcmpl-demo",
            "object": "chat.completion",
            "model": "demo",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "Hello!"}, "finish_reason": "stop"}],
            "usage": usage,
        });
        ("application/json", answer.to_string())
    };
    // Counted when the answer leaves, which is when the sidecar reads its usage and debits it.
    if let Some(c) = key.and_then(|k| counts.keys.get(k)) {
        c.tokens.fetch_add(total, Ordering::Relaxed);
        if stream {
            c.streamed.fetch_add(1, Ordering::Relaxed);
        }
        c.event(counts.start, total);
    }
    let mut response = Response::new(Full::new(Bytes::from(text)));
    if let Ok(v) = http::HeaderValue::from_str(content_type) {
        response.headers_mut().insert(http::header::CONTENT_TYPE, v);
    }
    response
}

/// Replays a budget of `rate` tokens a second and `burst` from `events` (sorted by time: the
/// tokens of each answer as it was debited, and 0 for each refusal) and counts the refusals made
/// while it had room: at least one token, and at least 5 ms of refill (a margin for the few
/// milliseconds between an answer leaving the upstream and its debit).
pub fn wrongful(events: &[(u64, u64)], rate: u64, burst: u64) -> (u64, u64) {
    const SEC: f64 = 1e9;
    let margin = rate as f64 * 0.005;
    let mut level = burst as f64;
    let mut last = 0u64;
    let (mut strict, mut loose) = (0, 0);
    for &(at, tokens) in events {
        level = (level + (at.saturating_sub(last)) as f64 / SEC * rate as f64).min(burst as f64);
        last = last.max(at);
        if tokens == 0 {
            strict += u64::from(level >= 1.0);
            loose += u64::from(level >= 1.0_f64.max(margin));
        } else {
            level -= tokens as f64;
        }
    }
    (strict, loose)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_is_wrongful_only_while_the_replayed_budget_has_room() {
        const MS: u64 = 1_000_000;
        // 1,000 tokens a second, burst 1,000: 1,500 spent at once leaves 500 owed, paid back
        // at 500 ms; a refusal at 400 ms is right, at 501 ms (1 token) wrongful but within the
        // margin of 5 tokens, at 600 ms (100 tokens) wrongful.
        let events = [(0, 1_500), (400 * MS, 0), (501 * MS, 0), (600 * MS, 0)];
        assert_eq!(wrongful(&events, 1_000, 1_000), (2, 1));
        assert_eq!(wrongful(&[(0, 0)], 1_000, 1_000), (1, 1));
    }
}
