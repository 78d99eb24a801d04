//! Token budgets through the real proxy: a fake OpenAI-style upstream on a real socket reports
//! each response's usage (a JSON body, a final SSE event, a trailer, a header, or nothing
//! readable), and the proxy debits it when the response ends. Checked: the debits, the debt
//! that follows an overspend, the 429 with its Retry-After, and `x-ratelimit-remaining-tokens`
//! going down as tokens are spent.

use std::net::SocketAddr;
use std::time::Duration;

use http::StatusCode;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use crate::support::{Running, admin, config, get, proxy};

/// The completion body of `/json/N` compressed with `coding` (`gzip` or `deflate`), or for
/// `sse`, the stream of `/sse/P/C` gzipped.
fn compressed(coding: &str, plain: &[u8]) -> Vec<u8> {
    use std::io::Write;
    let level = flate2::Compression::default();
    match coding {
        "gzip" => {
            let mut e = flate2::write::GzEncoder::new(Vec::new(), level);
            e.write_all(plain).unwrap();
            e.finish().unwrap()
        }
        "deflate" => {
            let mut e = flate2::write::ZlibEncoder::new(Vec::new(), level);
            e.write_all(plain).unwrap();
            e.finish().unwrap()
        }
        other => panic!("no encoder for {other}"),
    }
}

fn completion(usage: &str) -> String {
    format!(
        r#"{{"id":"chatcmpl-1","object":"chat.completion","choices":[{{"index":0,"message":{{"role":"assistant","content":"the \"usage\": {{\"total_tokens\": 1}} in a string is not it"}}}}],"usage":{usage}}}"#
    )
}

fn events(p: &str, c: &str) -> String {
    let mut events = String::new();
    for word in ["Hel", "lo"] {
        events.push_str(&format!(
            "data: {{\"choices\":[{{\"delta\":{{\"content\":\"{word}\"}}}}],\"usage\":null}}\n\n"
        ));
    }
    events.push_str(&format!(
        "data: {{\"choices\":[],\"usage\":{{\"prompt_tokens\":{p},\"completion_tokens\":{c}}}}}\n\ndata: [DONE]\n\n"
    ));
    events
}

/// The body the upstream sends for a compressed answer: `/gzip/N`, `/deflate/N` (the
/// completion of `/json/N`), `/gzip-sse/P/C` (the events of `/sse/P/C`), `/br/N` (bytes no
/// scan reads).
fn compressed_body(path: &str) -> Option<(&'static str, &'static str, Vec<u8>)> {
    let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    let total = |n: &str| completion(&format!(r#"{{"total_tokens":{n}}}"#));
    Some(match parts.as_slice() {
        ["gzip", n] => (
            "gzip",
            "application/json",
            compressed("gzip", total(n).as_bytes()),
        ),
        ["deflate", n] => (
            "deflate",
            "application/json",
            compressed("deflate", total(n).as_bytes()),
        ),
        ["gzip-sse", p, c] => (
            "gzip",
            "text/event-stream",
            compressed("gzip", events(p, c).as_bytes()),
        ),
        ["br", n] => (
            "br",
            "application/json",
            format!("brotli bytes {n}").into_bytes(),
        ),
        _ => return None,
    })
}

/// The wire bytes of the upstream's answer to `path`: `/json/N`, `/weighted/P/C`, `/sse/P/C`,
/// `/trailer/N`, `/header/N`, `/malformed`, `/truncated`, and the compressed ones of
/// [`compressed_body`] (sent chunked in two pieces).
fn answer(path: &str) -> Vec<u8> {
    if let Some((coding, content_type, body)) = compressed_body(path) {
        let (a, b) = body.split_at(body.len() / 2);
        let mut wire = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: {content_type}\r\ncontent-encoding: {coding}\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n{:x}\r\n",
            a.len()
        )
        .into_bytes();
        wire.extend_from_slice(a);
        wire.extend_from_slice(format!("\r\n{:x}\r\n", b.len()).as_bytes());
        wire.extend_from_slice(b);
        wire.extend_from_slice(b"\r\n0\r\n\r\n");
        return wire;
    }
    let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    let json = |body: String| {
        format!(
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        )
    };
    let wire = match parts.as_slice() {
        ["json", n] => json(completion(&format!(
            r#"{{"prompt_tokens":1,"completion_tokens":2,"total_tokens":{n}}}"#
        ))),
        ["weighted", p, c] => json(completion(&format!(
            r#"{{"prompt_tokens":{p},"completion_tokens":{c}}}"#
        ))),
        ["sse", p, c] => {
            let events = events(p, c);
            // Two chunks, the usage event cut across them.
            let (a, b) = events.split_at(events.len() - 40);
            format!(
                "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n{:x}\r\n{a}\r\n{:x}\r\n{b}\r\n0\r\n\r\n",
                a.len(),
                b.len()
            )
        }
        ["trailer", n] => format!(
            "HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ntransfer-encoding: chunked\r\ntrailer: x-usage-tokens\r\nconnection: close\r\n\r\n5\r\nhello\r\n0\r\nx-usage-tokens: {n}\r\n\r\n"
        ),
        ["header", n] => format!(
            "HTTP/1.1 200 OK\r\nx-usage-tokens: {n}\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok"
        ),
        ["malformed"] => json(completion(r#"{"total_tokens":"lots"#)),
        ["truncated"] => {
            let body = completion(r#"{"total_tokens":50}"#);
            format!(
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{}",
                body.len(),
                &body[..body.len() - 30]
            )
        }
        _ => "HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\nconnection: close\r\n\r\n".to_owned(),
    };
    wire.into_bytes()
}

/// The fake LLM API: one answer per connection, chosen by the request's path.
async fn upstream() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((mut stream, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut buf = [0u8; 4096];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match stream.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                let head = String::from_utf8_lossy(&head);
                let mut path = head.split(' ').nth(1).unwrap_or("/").to_owned();
                // `/slow/...`: answered 20 ms late, so that requests overlap in flight.
                if let Some(rest) = path.strip_prefix("/slow") {
                    path = rest.to_owned();
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                let _ = stream.write_all(&answer(&path)).await;
                let _ = stream.shutdown().await;
            });
        }
    });
    addr
}

fn metric(text: &str, name: &str) -> u64 {
    let line = format!("{name}{{service=\"api\",bucket=\"tokens\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&line))
        .map_or(0, |v| v.trim().parse().unwrap())
}

/// Waits (bounded) until the proxy has debited `debited` units in all: a response is settled
/// when its body ends at the proxy, which may be just after the client read it.
async fn settled(running: &Running, debited: u64) -> String {
    for _ in 0..200 {
        let text = admin(running, "/metrics").await.body;
        if metric(&text, "spillway_cost_debited_total") >= debited {
            assert_eq!(
                metric(&text, "spillway_cost_debited_total"),
                debited,
                "{text}"
            );
            return text;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the proxy never debited {debited}");
}

/// One bucket of 1000 tokens refilled at 1000 an hour (3.6 s a token: no refill to speak of
/// during a test), with `cost` as written.
fn budget(cost: &str) -> String {
    config(&[&format!(
        "{{ name: tokens, limit: 1000/h, algorithm: token-bucket, cost: {cost} }}"
    )])
}

fn remaining(answer: &crate::support::Answer) -> u64 {
    answer
        .header("x-ratelimit-remaining-tokens")
        .expect("x-ratelimit-remaining-tokens")
        .parse()
        .unwrap()
}

#[tokio::test]
async fn json_usage_is_debited_into_debt_and_the_debt_refuses_with_retry_after() {
    let up = upstream().await;
    let running = proxy(
        &budget(r#"{ response: "json:usage.total_tokens" }"#),
        &format!("http://{up}"),
    )
    .await;
    let addr = running.proxy.addr();
    let mut left = Vec::new();
    for n in 1..=3u64 {
        let answer = get(addr, "/json/400", &[]).await;
        assert_eq!(answer.status, StatusCode::OK);
        assert!(
            answer.body.contains("\"total_tokens\":400"),
            "the body passes whole"
        );
        assert_eq!(
            answer.header("ratelimit-policy"),
            Some("\"tokens\";q=1000;w=3600")
        );
        left.push(remaining(&answer));
        settled(&running, 400 * n).await;
    }
    // Nothing reserved at admission: each answer shows what the earlier ones left.
    assert_eq!(left, [1000, 600, 200]);
    // The third, admitted with 200 left, spent 400: 1200 of 1000, so 200 owed. Refused until
    // they and one token of room have refilled: 201 x 3.6 s.
    let refused = get(addr, "/json/400", &[]).await;
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);
    let retry: u64 = refused.header("retry-after").unwrap().parse().unwrap();
    assert!((723..=725).contains(&retry), "retry-after {retry}");
    assert_eq!(refused.header("x-spillway-bucket"), Some("tokens"));
    // The refused request was never charged.
    let text = settled(&running, 1200).await;
    assert_eq!(metric(&text, "spillway_cost_unreported_total"), 0);
}

#[tokio::test]
async fn an_estimate_is_reserved_then_settled_to_the_reported_weighted_cost() {
    let up = upstream().await;
    let running = proxy(
        &budget(
            r#"{ response: "json:usage", request: 300, weights: { prompt_tokens: 1, completion_tokens: 4 } }"#,
        ),
        &format!("http://{up}"),
    )
    .await;
    let addr = running.proxy.addr();
    // 10 + 4 x 25 = 110.
    let first = get(addr, "/weighted/10/25", &[]).await;
    assert_eq!(remaining(&first), 700, "the estimate of 300 reserved");
    settled(&running, 110).await;
    let second = get(addr, "/weighted/10/25", &[]).await;
    assert_eq!(
        remaining(&second),
        590,
        "1000 - 110 - the next estimate of 300"
    );
    settled(&running, 220).await;
}

#[tokio::test]
async fn an_estimate_above_the_bucket_reserves_the_whole_bucket_and_is_admitted_when_it_is_full() {
    let up = upstream().await;
    let running = proxy(
        &budget(r#"{ response: "json:usage.total_tokens", request: 5000 }"#),
        &format!("http://{up}"),
    )
    .await;
    let addr = running.proxy.addr();
    // The full bucket of 1000 admits it, reserving all of it rather than refusing forever.
    let first = get(addr, "/json/400", &[]).await;
    assert_eq!(first.status, StatusCode::OK);
    assert_eq!(remaining(&first), 0, "the whole bucket reserved");
    settled(&running, 400).await;
    // 600 left after the settlement: not full, so the next one waits.
    let second = get(addr, "/json/400", &[]).await;
    assert_eq!(second.status, StatusCode::TOO_MANY_REQUESTS);
}

#[tokio::test]
async fn the_last_sse_event_with_usage_is_debited() {
    let up = upstream().await;
    let running = proxy(
        &budget(
            r#"{ response: "sse:usage", weights: { prompt_tokens: 1, completion_tokens: 4 } }"#,
        ),
        &format!("http://{up}"),
    )
    .await;
    let addr = running.proxy.addr();
    let answer = get(addr, "/sse/20/30", &[]).await;
    assert_eq!(answer.status, StatusCode::OK);
    assert!(answer.body.ends_with("data: [DONE]\n\n"), "{}", answer.body);
    settled(&running, 140).await;
    assert_eq!(remaining(&get(addr, "/sse/1/1", &[]).await), 860);
}

#[tokio::test]
async fn a_trailer_or_a_header_reports_the_cost() {
    let up = upstream().await;
    let running = proxy(
        &budget(r#"{ response: "trailer:x-usage-tokens" }"#),
        &format!("http://{up}"),
    )
    .await;
    let answer = get(running.proxy.addr(), "/trailer/123", &[]).await;
    assert_eq!(answer.body, "hello");
    settled(&running, 123).await;

    let running = proxy(
        &budget(r#"{ response: "header:x-usage-tokens" }"#),
        &format!("http://{up}"),
    )
    .await;
    assert_eq!(
        get(running.proxy.addr(), "/header/77", &[]).await.body,
        "ok"
    );
    settled(&running, 77).await;
}

/// The body bytes the client receives for `path`, read raw (no decoding).
async fn raw_body(addr: SocketAddr, path: &str) -> (http::HeaderMap, Vec<u8>) {
    let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .unwrap();
    tokio::spawn(connection);
    let response = sender
        .send_request(
            http::Request::get(path)
                .header("host", addr.to_string())
                .header("accept-encoding", "gzip, deflate, br")
                .body(http_body_util::Full::new(bytes::Bytes::new()))
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let headers = response.headers().clone();
    let body = http_body_util::BodyExt::collect(response.into_body())
        .await
        .unwrap()
        .to_bytes();
    (headers, body.to_vec())
}

#[tokio::test]
async fn a_gzip_or_deflate_answer_is_inflated_for_its_usage_and_reaches_the_client_as_sent() {
    let up = upstream().await;
    let running = proxy(
        &budget(
            r#"{ response: "json:usage", weights: { total_tokens: 1, prompt_tokens: 1, completion_tokens: 4 }, default: 999 }"#,
        ),
        &format!("http://{up}"),
    )
    .await;
    let addr = running.proxy.addr();
    let mut debited = 0;
    // A JSON document gzipped and deflated, an event stream gzipped (20 + 4 x 30).
    for (path, cost) in [
        ("/gzip/120", 120),
        ("/deflate/75", 75),
        ("/gzip-sse/20/30", 140),
    ] {
        let (headers, body) = raw_body(addr, path).await;
        let (coding, _, sent) = compressed_body(path).unwrap();
        assert_eq!(headers["content-encoding"], coding, "{path}");
        assert_eq!(body, sent, "{path}: the client gets the upstream's bytes");
        debited += cost;
        settled(&running, debited).await;
    }
    // A coding the proxy does not inflate: the default, counted as unreported.
    let (_, body) = raw_body(addr, "/br/50").await;
    assert_eq!(body, compressed_body("/br/50").unwrap().2);
    let text = settled(&running, debited + 999).await;
    assert_eq!(metric(&text, "spillway_cost_unreported_total"), 1, "{text}");
}

#[tokio::test]
async fn malformed_or_truncated_usage_is_charged_the_default_and_counted() {
    let up = upstream().await;
    let running = proxy(
        &budget(r#"{ response: "json:usage.total_tokens", default: 250 }"#),
        &format!("http://{up}"),
    )
    .await;
    let addr = running.proxy.addr();
    let malformed = get(addr, "/malformed", &[]).await;
    assert_eq!(
        malformed.status,
        StatusCode::OK,
        "the client's answer is untouched"
    );
    assert!(malformed.body.contains("lots"));
    settled(&running, 250).await;
    // Cut short: the client's connection ends early; the proxy still charges the default.
    let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .unwrap();
    tokio::spawn(connection);
    let response = sender
        .send_request(
            http::Request::get("/truncated")
                .header("host", addr.to_string())
                .body(http_body_util::Full::new(bytes::Bytes::new()))
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert!(
        http_body_util::BodyExt::collect(response.into_body())
            .await
            .is_err(),
        "a truncated body never reaches the client as whole"
    );
    let text = settled(&running, 500).await;
    assert_eq!(metric(&text, "spillway_cost_unreported_total"), 2, "{text}");
}

/// Script calls Redis has run (`EVAL` and `EVALSHA` that did not fail), from `INFO commandstats`.
async fn script_calls(redis: &spillway_testkit::RedisServer) -> u64 {
    let url = redis.url();
    let addr = url.trim_start_matches("redis://").trim_end_matches('/');
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream.write_all(b"INFO commandstats\r\n").await.unwrap();
    let mut reply = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let n = stream.read(&mut buf).await.unwrap();
        assert!(n > 0, "redis closed the connection");
        reply.extend_from_slice(&buf[..n]);
        let text = String::from_utf8_lossy(&reply);
        if let Some((len, rest)) = text.strip_prefix('$').and_then(|t| t.split_once("\r\n"))
            && rest.len() >= len.parse::<usize>().unwrap()
        {
            return rest
                .lines()
                .filter(|l| l.starts_with("cmdstat_eval:") || l.starts_with("cmdstat_evalsha:"))
                .map(|l| {
                    // Calls that ran: a first EVALSHA that finds no script fails, and EVAL follows.
                    let field = |name: &str| {
                        l.split([':', ','])
                            .find_map(|kv| kv.strip_prefix(name)?.parse::<u64>().ok())
                            .unwrap_or(0)
                    };
                    field("calls=") - field("failed_calls=") - field("rejected_calls=")
                })
                .sum();
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_budget_costs_one_call_per_response_and_its_debt_is_shared() {
    let redis = spillway_testkit::RedisServer::start().expect("private redis-server");
    let up = upstream().await;
    let yaml = format!(
        "version: 1\nredis: {{ url: \"{}\", timeout: 2s }}\n{}",
        redis.url(),
        budget(r#"{ response: "json:usage.total_tokens" }"#)
            .trim_start_matches("version: 1\n")
            .replace("algorithm: token-bucket", "algorithm: gcra, store: redis")
    );
    let (a, b) = (
        proxy(&yaml, &format!("http://{up}")).await,
        proxy(&yaml, &format!("http://{up}")).await,
    );
    let before = script_calls(&redis).await;
    assert_eq!(
        get(a.proxy.addr(), "/json/600", &[]).await.status,
        StatusCode::OK
    );
    settled(&a, 600).await;
    // B has debited nothing yet: it admits, and its debit finds 1200 of 1000 spent.
    assert_eq!(
        get(b.proxy.addr(), "/json/600", &[]).await.status,
        StatusCode::OK
    );
    settled(&b, 600).await;
    let refused = get(b.proxy.addr(), "/json/1", &[]).await;
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);
    let retry: u64 = refused.header("retry-after").unwrap().parse().unwrap();
    assert!((723..=725).contains(&retry), "201 tokens at 3.6 s: {retry}");
    // A learns of the debt with its next debit: the overspend is bounded by what each proxy
    // admits before its own debit comes back.
    assert_eq!(
        get(a.proxy.addr(), "/json/100", &[]).await.status,
        StatusCode::OK
    );
    settled(&a, 700).await;
    assert_eq!(
        get(a.proxy.addr(), "/json/1", &[]).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    // One script call per response, none at admission.
    assert_eq!(script_calls(&redis).await - before, 3);
}

fn unsent(text: &str) -> u64 {
    metric(text, "spillway_cost_unsent")
}

#[tokio::test]
async fn a_debit_redis_cannot_take_is_carried_by_the_next_one() {
    let mut redis = spillway_testkit::RedisServer::start().expect("private redis-server");
    let up = upstream().await;
    let yaml = format!(
        "version: 1\nredis: {{ url: \"{}\", timeout: 500ms }}\n{}",
        redis.url(),
        budget(r#"{ response: "json:usage.total_tokens" }"#)
            .trim_start_matches("version: 1\n")
            .replace("algorithm: token-bucket", "algorithm: gcra, store: redis")
    );
    let running = proxy(&yaml, &format!("http://{up}")).await;
    let addr = running.proxy.addr();
    // Redis down: the response is admitted and settled, its 500 held for the next debit.
    redis.kill();
    assert_eq!(get(addr, "/json/500", &[]).await.status, StatusCode::OK);
    let text = settled(&running, 500).await;
    let mut held = unsent(&text);
    for _ in 0..200 {
        if held > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
        held = unsent(&admin(&running, "/metrics").await.body);
    }
    assert_eq!(held, 500, "the debit Redis could not take is held");
    // Redis back (empty: it keeps nothing on disk). Responses of no cost carry the 500 there
    // once the circuit lets a debit through.
    redis.restart().expect("redis-server restarts");
    let mut carried = false;
    for _ in 0..100 {
        assert_eq!(get(addr, "/json/0", &[]).await.status, StatusCode::OK);
        tokio::time::sleep(Duration::from_millis(50)).await;
        if unsent(&admin(&running, "/metrics").await.body) == 0 {
            carried = true;
            break;
        }
    }
    assert!(carried, "the held units reached Redis once it answered");
    // The shared meter holds the 500: 600 more puts 1100 of 1000 in it, and the debt refuses.
    assert_eq!(get(addr, "/json/600", &[]).await.status, StatusCode::OK);
    for _ in 0..200 {
        if get(addr, "/json/0", &[]).await.status == StatusCode::TOO_MANY_REQUESTS {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the carried 500 and the 600 never put the budget into debt");
}

/// How far a budget is overspent: 8 clients, each with one request of 100 tokens in flight at
/// a time (answered 20 ms late), spend a budget of 1000 until refused. Only requests admitted
/// while the bucket was not yet in debt overspend, so the debited total stays within the budget
/// plus one request per client in flight (plus the ~0.3 token an hour's refill gives back).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_overspend_is_bounded_by_the_requests_in_flight() {
    const CLIENTS: u64 = 8;
    const COST: u64 = 100;
    let up = upstream().await;
    let running = proxy(
        &budget(r#"{ response: "json:usage.total_tokens" }"#),
        &format!("http://{up}"),
    )
    .await;
    let addr = running.proxy.addr();
    let mut tasks = Vec::new();
    for _ in 0..CLIENTS {
        tasks.push(tokio::spawn(async move {
            let mut admitted = 0u64;
            // Bounded: the budget holds 10 requests' worth, so each client is refused long before.
            for _ in 0..100 {
                match get(addr, "/slow/json/100", &[]).await.status {
                    StatusCode::OK => admitted += 1,
                    StatusCode::TOO_MANY_REQUESTS => break,
                    other => panic!("unexpected status {other}"),
                }
            }
            admitted
        }));
    }
    let mut admitted = 0;
    for task in tasks {
        admitted += task.await.unwrap();
    }
    settled(&running, admitted * COST).await;
    let spent = admitted * COST;
    eprintln!(
        "budget 1000, {CLIENTS} clients of {COST}: {admitted} admitted, {spent} tokens spent"
    );
    assert!(spent >= 1000, "the budget is spent whole: {spent}");
    assert!(
        spent <= 1000 + CLIENTS * COST,
        "overspend beyond the requests in flight: {spent}"
    );
}

#[tokio::test]
async fn a_per_user_budget_puts_only_that_user_into_debt() {
    let up = upstream().await;
    let running = proxy(
        &config(&[
            r#"{ name: tokens, match: { user: "*" }, limit: 1000/h, algorithm: token-bucket, cost: { response: "json:usage.total_tokens" } }"#,
        ]),
        &format!("http://{up}"),
    )
    .await;
    let addr = running.proxy.addr();
    let (alice, bob) = ([("x-user-id", "alice")], [("x-user-id", "bob")]);
    assert_eq!(get(addr, "/json/1500", &alice).await.status, StatusCode::OK);
    settled(&running, 1500).await;
    assert_eq!(
        get(addr, "/json/1", &alice).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    let fresh = get(addr, "/json/10", &bob).await;
    assert_eq!(fresh.status, StatusCode::OK);
    assert_eq!(remaining(&fresh), 1000);
    settled(&running, 1510).await;
    assert_eq!(remaining(&get(addr, "/json/1", &bob).await), 990);
}

#[tokio::test]
async fn a_per_user_redis_budget_is_one_meter_per_user_that_every_proxy_shares() {
    let redis = spillway_testkit::RedisServer::start().expect("private redis-server");
    let up = upstream().await;
    let yaml = format!(
        "version: 1\nredis: {{ url: \"{}\", timeout: 2s }}\n{}",
        redis.url(),
        config(&[
            r#"{ name: tokens, match: { user: "*" }, limit: 1000/h, algorithm: gcra, store: redis, cost: { response: "json:usage.total_tokens" } }"#,
        ])
        .trim_start_matches("version: 1\n")
    );
    let (a, b) = (
        proxy(&yaml, &format!("http://{up}")).await,
        proxy(&yaml, &format!("http://{up}")).await,
    );
    let (alice, bob) = ([("x-user-id", "alice")], [("x-user-id", "bob")]);
    let before = script_calls(&redis).await;
    let status = |answer: crate::support::Answer| answer.status;
    assert_eq!(
        status(get(a.proxy.addr(), "/json/600", &alice).await),
        StatusCode::OK
    );
    settled(&a, 600).await;
    // B has seen nothing of alice: it admits her, and its debit finds 1200 of her 1000 spent.
    assert_eq!(
        status(get(b.proxy.addr(), "/json/600", &alice).await),
        StatusCode::OK
    );
    settled(&b, 600).await;
    let refused = get(b.proxy.addr(), "/json/1", &alice).await;
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);
    let retry: u64 = refused.header("retry-after").unwrap().parse().unwrap();
    assert!((723..=725).contains(&retry), "201 tokens at 3.6 s: {retry}");
    // Bob's meter is his own.
    let fresh = get(b.proxy.addr(), "/json/10", &bob).await;
    assert_eq!(fresh.status, StatusCode::OK);
    settled(&b, 610).await;
    // A learns of alice's debt with its next debit of hers; bob stays admitted there.
    assert_eq!(
        status(get(a.proxy.addr(), "/json/100", &alice).await),
        StatusCode::OK
    );
    settled(&a, 700).await;
    assert_eq!(
        status(get(a.proxy.addr(), "/json/1", &alice).await),
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(
        status(get(a.proxy.addr(), "/json/10", &bob).await),
        StatusCode::OK
    );
    settled(&a, 710).await;
    // One script call per response (five answered), none at admission.
    assert_eq!(script_calls(&redis).await - before, 5);
}
