//! Identities a client cannot spoof around a limit: each finding of the
//! outside test as a black-box test over a real socket, in raw bytes where the finding is about
//! bytes. A client's own `rpc-procedure` does not replace the path; `x-forwarded-for` is counted
//! from the right, `identity.xff_trusted_hops` trusted hops deep; an identity header sent twice or
//! with bytes that are not visible ASCII is refused with 400 (gRPC: `INVALID_ARGUMENT`); and paths
//! are matched after RFC 3986 normalisation while the upstream gets them as sent.

use std::net::SocketAddr;

use crate::support::{Raw, Upstream, proxy, send_raw};
use http::uri::PathAndQuery;

/// Sends `head` (the request line and headers, each ending in CRLF, without the blank line) on a
/// fresh connection with `host: app` and `connection: close`, and reads the answer to the end.
async fn raw(addr: SocketAddr, head: &[u8]) -> Raw {
    let mut request = head.to_vec();
    request.extend_from_slice(b"host: app\r\nconnection: close\r\n\r\n");
    send_raw(addr, &request).await
}

/// `GET path` with these extra header lines (each ending in CRLF).
async fn get(addr: SocketAddr, path: &str, headers: &[u8]) -> Raw {
    let mut head = format!("GET {path} HTTP/1.1\r\n").into_bytes();
    head.extend_from_slice(headers);
    raw(addr, &head).await
}

fn one_service(identity: &str, buckets: &[&str]) -> String {
    let mut yaml = format!("version: 1\n{identity}services:\n  api:\n    buckets:\n");
    for bucket in buckets {
        yaml.push_str("      - ");
        yaml.push_str(bucket);
        yaml.push('\n');
    }
    yaml
}

/// One request an hour under `/ip*`.
const IP_PATHS: &str =
    "{ name: ip-paths, match: { procedure: \"/ip*\" }, limit: 1/h, algorithm: token-bucket }";
/// One request an hour per client address.
const PER_IP: &str = "{ name: per-ip, match: { ip: \"*\" }, limit: 1/h, algorithm: token-bucket }";
/// One request an hour per user.
const PER_USER: &str =
    "{ name: per-user, match: { user: \"*\" }, limit: 1/h, algorithm: token-bucket }";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clients_rpc_procedure_header_does_not_replace_the_path_by_default() {
    let upstream = Upstream::start().await;
    let running = proxy(&one_service("", &[IP_PATHS]), &upstream.url()).await;
    let addr = running.proxy.addr();
    assert_eq!(get(addr, "/ip/search", b"").await.status, 200);
    for header in [
        &b"rpc-procedure: /x\r\n"[..],
        b"rpc-procedure:\r\n",
        b"rpc-procedure: /free\r\n",
    ] {
        let answer = get(addr, "/ip/search", header).await;
        assert_eq!(
            answer.status,
            429,
            "{}: {answer:?}",
            String::from_utf8_lossy(header).trim()
        );
    }
    assert_eq!(upstream.seen(), 1);
    running.proxy.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rpc_procedure_counts_when_the_configuration_names_it() {
    let upstream = Upstream::start().await;
    let running = proxy(
        &one_service(
            "identity: { procedure: \"header:rpc-procedure,path\" }\n",
            &[IP_PATHS],
        ),
        &upstream.url(),
    )
    .await;
    let addr = running.proxy.addr();
    assert_eq!(
        get(addr, "/free", b"rpc-procedure: /ip/a\r\n").await.status,
        200
    );
    assert_eq!(
        get(addr, "/free", b"rpc-procedure: /ip/b\r\n").await.status,
        429
    );
    // Absent, the path is next.
    assert_eq!(get(addr, "/ip/c", b"").await.status, 429);
    assert_eq!(
        get(addr, "/ip/c", b"rpc-procedure: /other\r\n")
            .await
            .status,
        200
    );
    // Trusted, the header is still an identity header: sent twice, it is refused.
    let twice = get(addr, "/ip/c", b"rpc-procedure: /a\r\nrpc-procedure: /b\r\n").await;
    assert_eq!(twice.status, 400, "{twice:?}");
    running.proxy.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fake_hop_in_x_forwarded_for_does_not_give_a_fresh_bucket() {
    let upstream = Upstream::start().await;
    // The default `xff_trusted_hops: 1`: the proxy's peer (127.0.0.1 here) is the trusted load
    // balancer, and the client is the address it appended.
    let running = proxy(
        &one_service("identity: { ip: header:x-forwarded-for }\n", &[PER_IP]),
        &upstream.url(),
    )
    .await;
    let addr = running.proxy.addr();
    let first = get(addr, "/", b"x-forwarded-for: 198.51.100.1, 203.0.113.7\r\n").await;
    assert_eq!(first.status, 200);
    for fake in ["198.51.100.2", "198.51.100.3", "garbage"] {
        let header = format!("x-forwarded-for: {fake}, 203.0.113.7\r\n");
        let answer = get(addr, "/", header.as_bytes()).await;
        assert_eq!(answer.status, 429, "fake hop {fake}: {answer:?}");
    }
    // Several lines are one list (RFC 9110): the last entry of the last line is the client.
    let lines = get(
        addr,
        "/",
        b"x-forwarded-for: 198.51.100.4\r\nx-forwarded-for: 203.0.113.7\r\n",
    )
    .await;
    assert_eq!(lines.status, 429, "{lines:?}");
    // Another client behind the same balancer has a bucket of its own.
    let other = get(addr, "/", b"x-forwarded-for: 203.0.113.8\r\n").await;
    assert_eq!(other.status, 200);
    assert_eq!(upstream.seen(), 2);
    running.proxy.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn x_forwarded_for_is_counted_from_the_right_by_trusted_hops() {
    let upstream = Upstream::start().await;
    // The operations guide's example with two trusted hops: the proxy's peer and 10.0.0.5.
    let running = proxy(
        &one_service(
            "identity: { ip: header:x-forwarded-for, xff_trusted_hops: 2 }\n",
            &[PER_IP],
        ),
        &upstream.url(),
    )
    .await;
    let addr = running.proxy.addr();
    let xff = |list: &str| format!("x-forwarded-for: {list}\r\n");
    assert_eq!(
        get(addr, "/", xff("203.0.113.7, 10.0.0.5").as_bytes())
            .await
            .status,
        200
    );
    let again = get(addr, "/", xff("1.1.1.1, 203.0.113.7, 10.0.0.6").as_bytes()).await;
    assert_eq!(again.status, 429, "same client, another hop: {again:?}");
    let two_lines = get(
        addr,
        "/",
        b"x-forwarded-for: 203.0.113.7\r\nx-forwarded-for: 10.0.0.5\r\n",
    )
    .await;
    assert_eq!(two_lines.status, 429, "{two_lines:?}");
    assert_eq!(
        get(addr, "/", xff("198.51.100.9, 10.0.0.5").as_bytes())
            .await
            .status,
        200
    );
    running.proxy.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn x_forwarded_for_does_not_override_the_peer_without_trusted_hops() {
    let upstream = Upstream::start().await;
    let running = proxy(
        &one_service(
            "identity: { ip: \"header:x-forwarded-for,peer\", xff_trusted_hops: 0 }\n",
            &[PER_IP],
        ),
        &upstream.url(),
    )
    .await;
    let addr = running.proxy.addr();
    assert_eq!(
        get(addr, "/", b"x-forwarded-for: 198.51.100.1\r\n")
            .await
            .status,
        200
    );
    assert_eq!(
        get(addr, "/", b"x-forwarded-for: 198.51.100.2\r\n")
            .await
            .status,
        429
    );
    assert_eq!(get(addr, "/", b"").await.status, 429);
    running.proxy.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unusable_x_forwarded_for_falls_to_the_next_source() {
    let upstream = Upstream::start().await;
    let running = proxy(
        &one_service(
            "identity: { ip: \"header:x-forwarded-for,peer\" }\n",
            &[PER_IP],
        ),
        &upstream.url(),
    )
    .await;
    let addr = running.proxy.addr();
    // No list, or one whose trusted entry is no address: the peer (127.0.0.1) is the client.
    assert_eq!(get(addr, "/", b"").await.status, 200);
    for header in [
        &b"x-forwarded-for: garbage\r\n"[..],
        b"x-forwarded-for: 203.0.113.7:4711\r\n",
        b"x-forwarded-for: \r\n",
    ] {
        let answer = get(addr, "/", header).await;
        assert_eq!(
            answer.status,
            429,
            "{}: {answer:?}",
            String::from_utf8_lossy(header).trim()
        );
    }
    running.proxy.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_identity_header_sent_twice_is_refused_not_decided_on_one_value() {
    let upstream = Upstream::start().await;
    let running = proxy(&one_service("", &[PER_USER]), &upstream.url()).await;
    let addr = running.proxy.addr();
    assert_eq!(get(addr, "/", b"x-user-id: alice\r\n").await.status, 200);
    let twice = get(addr, "/", b"x-user-id: zz1\r\nx-user-id: alice\r\n").await;
    assert_eq!(twice.status, 400, "{twice:?}");
    assert!(
        twice
            .head
            .contains("content-type: application/problem+json"),
        "{twice:?}"
    );
    let problem: serde_json::Value = serde_json::from_str(&twice.body).unwrap();
    assert_eq!(problem["type"], "urn:spillway:problem:bad-identity");
    assert_eq!(problem["status"], 400);
    assert_eq!(problem["header"], "x-user-id");
    assert!(!twice.body.contains("zz1") && !twice.body.contains("alice"));
    // The same for the caller and the other subjects.
    for header in [
        &b"rpc-caller: a\r\nrpc-caller: b\r\n"[..],
        b"x-org-id: a\r\nx-org-id: b\r\n",
        b"x-api-key: a\r\nX-Api-Key: b\r\n",
    ] {
        let answer = get(addr, "/", header).await;
        assert_eq!(answer.status, 400, "{answer:?}");
    }
    assert_eq!(
        upstream.seen(),
        1,
        "no refused request reached the upstream"
    );
    running.proxy.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_identity_value_that_is_not_visible_ascii_is_refused() {
    let upstream = Upstream::start().await;
    let running = proxy(&one_service("", &[PER_USER]), &upstream.url()).await;
    let addr = running.proxy.addr();
    assert_eq!(get(addr, "/", b"x-user-id: alice\r\n").await.status, 200);
    for value in [&b"alice\xa0"[..], b"\xc3\xa9lise", b"\x80"] {
        let mut header = b"x-user-id: ".to_vec();
        header.extend_from_slice(value);
        header.extend_from_slice(b"\r\n");
        let answer = get(addr, "/", &header).await;
        assert_eq!(answer.status, 400, "{value:?}: {answer:?}");
        let problem: serde_json::Value = serde_json::from_str(&answer.body).unwrap();
        assert_eq!(problem["type"], "urn:spillway:problem:bad-identity");
        assert_eq!(problem["header"], "x-user-id");
        assert!(!answer.body.contains("alice") && !answer.body.contains("lise"));
    }
    // A control character never gets this far: the HTTP parser refuses it.
    let control = get(addr, "/", b"x-user-id: al\x7fice\r\n").await;
    assert_eq!(control.status, 400, "{control:?}");
    assert_eq!(upstream.seen(), 1);
    running.proxy.shutdown().await;
}

/// The message of a gRPC test call, written by hand.
#[derive(Clone, PartialEq, prost::Message)]
struct Echo {
    #[prost(string, tag = "1")]
    text: String,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grpc_call_with_a_repeated_identity_header_is_invalid_argument() {
    let upstream = Upstream::start().await;
    let running = proxy(&one_service("", &[PER_USER]), &upstream.url()).await;
    let channel =
        tonic::transport::Channel::from_shared(format!("http://{}", running.proxy.addr()))
            .unwrap()
            .connect()
            .await
            .unwrap();
    let mut grpc = tonic::client::Grpc::new(channel);
    let call = |users: &'static [&'static str]| {
        let mut request = tonic::Request::new(Echo {
            text: "hello".into(),
        });
        for user in users {
            request
                .metadata_mut()
                .append("x-user-id", user.parse().unwrap());
        }
        request
    };
    grpc.ready().await.unwrap();
    let codec = tonic_prost::ProstCodec::<Echo, Echo>::default();
    let method = PathAndQuery::from_static("/echo.Echo/Say");
    let ok = grpc.unary(call(&["alice"]), method.clone(), codec).await;
    assert_eq!(ok.unwrap().into_inner().text, "hello");
    grpc.ready().await.unwrap();
    let codec = tonic_prost::ProstCodec::<Echo, Echo>::default();
    let refused = grpc
        .unary(call(&["zz1", "alice"]), method, codec)
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::InvalidArgument, "{refused:?}");
    assert!(refused.message().contains("x-user-id"), "{refused:?}");
    assert!(!refused.message().contains("zz1"));
    running.proxy.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paths_are_matched_normalised_and_forwarded_as_sent() {
    let upstream = Upstream::start().await;
    let running = proxy(&one_service("", &[IP_PATHS]), &upstream.url()).await;
    let addr = running.proxy.addr();
    assert_eq!(get(addr, "/ip/search", b"").await.status, 200);
    for path in [
        "/%69p/search",
        "/i%70/search",
        "/%69%70/search",
        "//ip/search",
        "/./ip/search",
        "/%2e/ip/search",
        "/x/../ip/search",
        "/x/%2E%2e/ip/search",
        "/../ip/search",
        "/ip%2Fsearch",
    ] {
        let answer = get(addr, path, b"").await;
        assert_eq!(answer.status, 429, "{path}: {answer:?}");
    }
    // A path that normalises longer than the stack buffer is still matched normalised.
    let long = format!("/%69p/{}", "a".repeat(3000));
    assert_eq!(get(addr, &long, b"").await.status, 429);
    assert_eq!(upstream.seen(), 1);
    running.proxy.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_upstream_gets_the_path_as_sent() {
    let upstream = Upstream::start().await;
    let running = proxy(
        &one_service(
            "",
            &["{ name: a-b, match: { procedure: /a/b }, limit: 1/h, algorithm: token-bucket }"],
        ),
        &upstream.url(),
    )
    .await;
    let addr = running.proxy.addr();
    let sent = get(addr, "//%61/./b", b"").await;
    assert_eq!(sent.status, 200);
    assert_eq!(sent.body, "upstream saw //%61/./b");
    assert_eq!(get(addr, "/a/b", b"").await.status, 429);
    // An encoded slash is not a slash: `/a%2Fb` is one segment, not `/a/b`.
    let encoded = get(addr, "/a%2fb", b"").await;
    assert_eq!(encoded.status, 200);
    assert_eq!(encoded.body, "upstream saw /a%2fb");
    running.proxy.shutdown().await;
}
