//! What the proxy adds for the upstream and what it refuses at the door:
//! `x-forwarded-for` with this hop's peer appended (several received lines as one list) and
//! `x-forwarded-proto`; a request with two `Host` headers, or an HTTP/1.1 one without any, is
//! answered 400 and never reaches the upstream. Raw bytes over a real socket.

use crate::support::{Upstream, proxy, proxy_with, send_raw};
use spillway_proxy::ForwardedFields;

const FILE: &str =
    "version: 1\nservices:\n  api:\n    buckets:\n      - { name: all, limit: 1000/s }\n";

#[tokio::test]
async fn the_upstream_gets_the_received_list_with_the_peer_appended_and_the_proto() {
    let upstream = Upstream::start().await;
    let running = proxy(FILE, &upstream.url()).await;
    let addr = running.proxy.addr();
    let none = send_raw(
        addr,
        b"GET /forwarded HTTP/1.1\r\nhost: app\r\nconnection: close\r\n\r\n",
    )
    .await;
    assert_eq!(none.status, 200, "{none:?}");
    assert_eq!(none.body, "xff=127.0.0.1\nxfp=http");
    // Two lines are one list (RFC 9110); the upstream gets it as one, the peer last.
    let two = send_raw(
        addr,
        b"GET /forwarded HTTP/1.1\r\nhost: app\r\nx-forwarded-for: 203.0.113.7\r\nx-forwarded-for: 10.0.0.5 \r\nx-forwarded-proto: https\r\nconnection: close\r\n\r\n",
    )
    .await;
    assert_eq!(two.status, 200, "{two:?}");
    assert_eq!(
        two.body, "xff=203.0.113.7, 10.0.0.5, 127.0.0.1\nxfp=https",
        "a hop before said https: kept"
    );
    running.proxy.shutdown().await;
}

#[tokio::test]
async fn rfc_7239_forwarded_is_appended_when_asked_and_nothing_when_off() {
    let upstream = Upstream::start().await;
    let both = proxy_with(FILE, &upstream.url(), |o| {
        o.forwarded = ForwardedFields::Both
    })
    .await;
    let answer = send_raw(
        both.proxy.addr(),
        b"GET /forwarded HTTP/1.1\r\nhost: app\r\nforwarded: for=203.0.113.7;proto=https\r\nconnection: close\r\n\r\n",
    )
    .await;
    assert_eq!(answer.status, 200, "{answer:?}");
    assert_eq!(
        answer.body,
        "xff=127.0.0.1\nxfp=http\nfwd=for=203.0.113.7;proto=https, for=127.0.0.1;proto=http"
    );
    both.proxy.shutdown().await;
    let off = proxy_with(FILE, &upstream.url(), |o| {
        o.forwarded = ForwardedFields::Off
    })
    .await;
    let answer = send_raw(
        off.proxy.addr(),
        b"GET /forwarded HTTP/1.1\r\nhost: app\r\nx-forwarded-for: 198.51.100.1\r\nconnection: close\r\n\r\n",
    )
    .await;
    assert_eq!(answer.body, "xff=198.51.100.1\nxfp=", "received, unchanged");
    off.proxy.shutdown().await;
}

#[tokio::test]
async fn two_hosts_or_none_on_http_1_1_get_400_and_never_reach_the_upstream() {
    let upstream = Upstream::start().await;
    let running = proxy(FILE, &upstream.url()).await;
    let addr = running.proxy.addr();
    let two = send_raw(
        addr,
        b"GET /a HTTP/1.1\r\nhost: app\r\nhost: admin.internal\r\nconnection: close\r\n\r\n",
    )
    .await;
    assert_eq!(two.status, 400, "{two:?}");
    assert!(
        two.body.contains("urn:spillway:problem:bad-host"),
        "{two:?}"
    );
    let none = send_raw(addr, b"GET /a HTTP/1.1\r\nconnection: close\r\n\r\n").await;
    assert_eq!(none.status, 400, "{none:?}");
    assert!(none.body.contains("needs a Host header"), "{none:?}");
    assert_eq!(upstream.seen(), 0, "neither reached the upstream");
    // HTTP/1.0 has no Host requirement.
    let old = send_raw(addr, b"GET /a HTTP/1.0\r\n\r\n").await;
    assert_eq!(old.status, 200, "{old:?}");
    assert_eq!(upstream.seen(), 1);
    running.proxy.shutdown().await;
}
