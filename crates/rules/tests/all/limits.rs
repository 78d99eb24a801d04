//! The size limits of a configuration through the REST API: a body over 8 MiB is refused with a
//! problem document naming the limit, a client without a token is refused before its body is
//! read, and a file of more buckets than a configuration holds is refused naming that limit.

use crate::common::{Db, start};
use spillway_core::config::{MAX_BUCKETS, MAX_CONFIG_BYTES};

/// A valid configuration padded with a comment to `bytes` bytes.
fn padded(bytes: usize) -> String {
    let mut text = String::from("version: 1\nservices: {}\n# ");
    text.push_str(&"x".repeat(bytes - text.len() - 1));
    text.push('\n');
    assert_eq!(text.len(), bytes);
    text
}

#[test]
fn a_body_over_the_limit_is_413_naming_it() {
    let service = start(Db::sqlite());
    let admin = service.client(&service.admin);
    let at_limit = admin
        .post("/v1/rules:apply?dry_run=true", &padded(MAX_CONFIG_BYTES))
        .unwrap();
    assert_eq!(at_limit.status, 200, "{:?}", at_limit.body);
    let over = admin
        .post(
            "/v1/rules:apply?dry_run=true",
            &padded(MAX_CONFIG_BYTES + 1),
        )
        .unwrap();
    assert_eq!(over.status, 413, "{:?}", over.body);
    assert_eq!(over.body["type"], "urn:spillway:problem:too-large");
    assert_eq!(
        over.body["detail"],
        "the body is over the limit of 8388608 bytes (8 MiB), the largest configuration accepted"
    );
}

#[test]
fn a_client_without_a_token_is_refused_before_its_body_is_read() {
    use std::io::{Read, Write};
    let service = start(Db::sqlite());
    let addr = service.url.trim_start_matches("http://");
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(std::time::Duration::from_secs(10)))
        .unwrap();
    // The headers announce the largest body accepted; a kilobyte of it is sent, and the answer
    // comes without the rest.
    let head = format!(
        "POST /v1/rules:apply HTTP/1.1\r\nhost: x\r\ncontent-type: application/yaml\r\n\
         content-length: {MAX_CONFIG_BYTES}\r\n\r\n"
    );
    stream.write_all(head.as_bytes()).unwrap();
    stream.write_all(&[b'#'; 1024]).unwrap();
    let mut answer = [0u8; 12];
    stream
        .read_exact(&mut answer)
        .expect("an answer before the body is sent");
    assert_eq!(&answer, b"HTTP/1.1 401");
}

#[test]
fn more_buckets_than_a_configuration_holds_is_422_naming_the_limit() {
    let service = start(Db::sqlite());
    let admin = service.client(&service.admin);
    let mut text = String::from("version: 1\nservices:\n  api:\n    buckets:\n");
    for n in 0..=MAX_BUCKETS {
        text.push_str(&format!(
            "      - {{ name: b{n}, limit: 10/s, match: {{ caller: c{n} }} }}\n"
        ));
    }
    let answer = admin.post("/v1/rules:apply?dry_run=true", &text).unwrap();
    assert_eq!(answer.status, 422, "{:?}", answer.body);
    let detail = answer.body["detail"].as_str().unwrap();
    assert!(
        detail.starts_with(
            "apply:20005:9: bucket 20001 of the configuration is over the limit of 20000 buckets"
        ),
        "{detail}"
    );
}
