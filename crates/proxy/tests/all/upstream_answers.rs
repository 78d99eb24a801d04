//! What a client gets through the proxy for each way an HTTP/1.1 upstream may frame its answer,
//! or fail to: a raw upstream writes the bytes of each case on a connection of its own, and a
//! real HTTP/1.1 client reads the answer from the real proxy. A body framed by its length, in
//! chunks (with extensions and trailers) or by the close arrives whole; `HEAD`, `204` and `304`
//! answers have none; interim answers are skipped; an answer head that is malformed, has
//! conflicting lengths, runs over 64 KiB or 100 fields, or switches protocols unasked is a 502
//! problem document; a body that turns out malformed or truncated after its head went out never
//! reaches the client as whole.

use std::net::SocketAddr;
use std::time::Duration;

use crate::support::proxy;
use bytes::Bytes;
use http::Method;
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// How long one case may take at most; every case ends far sooner.
const CASE_LIMIT: Duration = Duration::from_secs(10);

/// What the client must see.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Want {
    /// This status, body, and trailer fields (name, value), whole.
    Answer {
        status: u16,
        body: Vec<u8>,
        trailers: Vec<(String, String)>,
    },
    /// A 502 problem document.
    BadGateway,
    /// Anything but a whole answer: the head and part of the body followed by the connection's
    /// end, or no answer at all. (A body found bad after its head went out cannot become a 502.)
    NotWhole,
}

/// After writing its bytes, the upstream closes the connection, or holds it open until the
/// proxy closes it (an answer that frames itself must end without the close).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum End {
    Close,
    KeepOpen,
}

struct Case {
    name: &'static str,
    method: Method,
    wire: Vec<u8>,
    end: End,
    want: Want,
}

fn answer(status: u16, body: impl AsRef<[u8]>) -> Want {
    Want::Answer {
        status,
        body: body.as_ref().to_vec(),
        trailers: Vec::new(),
    }
}

fn with_trailers(status: u16, body: &str, trailers: &[(&str, &str)]) -> Want {
    Want::Answer {
        status,
        body: body.as_bytes().to_vec(),
        trailers: trailers
            .iter()
            .map(|(n, v)| ((*n).to_owned(), (*v).to_owned()))
            .collect(),
    }
}

fn case(name: &'static str, wire: impl AsRef<[u8]>, want: Want) -> Case {
    Case {
        name,
        method: Method::GET,
        wire: wire.as_ref().to_vec(),
        end: End::Close,
        want,
    }
}

impl Case {
    fn keep_open(mut self) -> Self {
        self.end = End::KeepOpen;
        self
    }

    fn head(mut self) -> Self {
        self.method = Method::HEAD;
        self
    }
}

/// An answer head with `fields` fields of `value` each, then `rest`.
fn many_fields(fields: usize, value: &str, rest: &str) -> Vec<u8> {
    let mut wire = b"HTTP/1.1 200 OK\r\n".to_vec();
    for n in 0..fields {
        wire.extend_from_slice(format!("x-f{n}: {value}\r\n").as_bytes());
    }
    wire.extend_from_slice(rest.as_bytes());
    wire
}

fn cases() -> Vec<Case> {
    use Want::{BadGateway, NotWhole};
    const OK: &str = "HTTP/1.1 200 OK\r\n";
    let ok = |rest: &str| format!("{OK}{rest}");
    let chunked = |body: &str| format!("{OK}transfer-encoding: chunked\r\n\r\n{body}");
    vec![
        // content-length
        case(
            "content-length",
            ok("content-length: 5\r\nx-a: 1\r\n\r\nhello"),
            answer(200, "hello"),
        )
        .keep_open(),
        case(
            "content-length zero",
            ok("content-length: 0\r\n\r\n"),
            answer(200, ""),
        )
        .keep_open(),
        case(
            "bytes past the content-length",
            ok("content-length: 5\r\n\r\nhelloEXTRA"),
            answer(200, "hello"),
        )
        .keep_open(),
        case(
            "content-length with leading zeros",
            ok("content-length: 007\r\n\r\nseven!!"),
            answer(200, "seven!!"),
        )
        .keep_open(),
        case(
            "repeated equal content-length",
            ok("content-length: 4\r\ncontent-length: 4, 4\r\n\r\nfour"),
            answer(200, "four"),
        )
        .keep_open(),
        case(
            "conflicting content-length",
            ok("content-length: 4\r\ncontent-length: 5\r\n\r\nfour!"),
            BadGateway,
        ),
        case(
            "conflicting content-length in one field",
            ok("content-length: 4, 5\r\n\r\nfour!"),
            BadGateway,
        ),
        case(
            "negative content-length",
            ok("content-length: -1\r\n\r\n"),
            BadGateway,
        ),
        case(
            "signed content-length",
            ok("content-length: +4\r\n\r\nfour"),
            BadGateway,
        ),
        case(
            "hex content-length",
            ok("content-length: 0x4\r\n\r\nfour"),
            BadGateway,
        ),
        case(
            "empty content-length",
            ok("content-length: \r\n\r\n"),
            BadGateway,
        ),
        case(
            "content-length past 64 bits",
            ok("content-length: 99999999999999999999\r\n\r\nx"),
            BadGateway,
        ),
        case(
            "a body shorter than its content-length",
            ok("content-length: 10\r\n\r\nhello"),
            NotWhole,
        ),
        // chunked
        case(
            "chunked",
            chunked("5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n"),
            answer(200, "hello world"),
        )
        .keep_open(),
        case(
            "chunked with extensions and trailers",
            format!(
                "{OK}transfer-encoding: chunked\r\ntrailer: x-checksum\r\n\r\n\
                 5;name=value\r\nhello\r\n6;a;b=\"q;uo\\\"ted\"\r\n world\r\n0;last\r\n\
                 x-checksum: 42\r\n\r\n"
            ),
            with_trailers(200, "hello world", &[("x-checksum", "42")]),
        )
        .keep_open(),
        case(
            "chunked, upper-case hex and coding",
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: Chunked\r\n\r\nA\r\n0123456789\r\n0\r\n\r\n",
            answer(200, "0123456789"),
        )
        .keep_open(),
        case(
            "content-length beside chunked: the chunks win",
            ok("content-length: 3\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"),
            answer(200, "hello"),
        )
        .keep_open(),
        case(
            "a coding that does not end in chunked is read to the close",
            ok("transfer-encoding: chunked, gzip\r\n\r\n2\r\nok\r\n0\r\n\r\n"),
            answer(200, "2\r\nok\r\n0\r\n\r\n"),
        ),
        case(
            "a chunk size that is not hex",
            chunked("zz\r\nhello\r\n"),
            NotWhole,
        ),
        case(
            "a chunk size with a 0x prefix",
            chunked("0x5\r\nhello\r\n0\r\n\r\n"),
            NotWhole,
        ),
        case(
            "two numbers as a chunk size",
            chunked("5 6\r\nhello\r\n0\r\n\r\n"),
            NotWhole,
        ),
        case(
            "an empty chunk size",
            chunked("\r\nhello\r\n0\r\n\r\n"),
            NotWhole,
        ),
        case(
            "a chunk size over 64 bits",
            chunked("10000000000000000\r\nhello\r\n0\r\n\r\n"),
            NotWhole,
        ),
        case(
            "chunk data longer than its size",
            chunked("5\r\nhelloXX\r\n0\r\n\r\n"),
            NotWhole,
        ),
        case("truncated in a chunk", chunked("5\r\nhel"), NotWhole),
        case(
            "truncated before the last chunk",
            chunked("5\r\nhello\r\n"),
            NotWhole,
        ),
        case(
            "truncated in the trailers",
            chunked("5\r\nhello\r\n0\r\nx-checksum: 4"),
            NotWhole,
        ),
        // to the close
        case(
            "close-delimited",
            ok("x-a: 1\r\n\r\nall of this, to the close"),
            answer(200, "all of this, to the close"),
        ),
        case("close-delimited and empty", ok("\r\n"), answer(200, "")),
        // HTTP/1.0
        case(
            "HTTP/1.0 with content-length",
            "HTTP/1.0 200 OK\r\ncontent-length: 2\r\n\r\nok",
            answer(200, "ok"),
        )
        .keep_open(),
        case(
            "HTTP/1.0 to the close",
            "HTTP/1.0 200 OK\r\n\r\nto the close",
            answer(200, "to the close"),
        ),
        // no body
        case(
            "HEAD with content-length",
            ok("content-length: 9\r\n\r\n"),
            answer(200, ""),
        )
        .head()
        .keep_open(),
        case(
            "HEAD with chunked",
            ok("transfer-encoding: chunked\r\n\r\n"),
            answer(200, ""),
        )
        .head()
        .keep_open(),
        case(
            "204 with a stray body",
            "HTTP/1.1 204 No Content\r\ncontent-length: 5\r\n\r\nhello",
            answer(204, ""),
        )
        .keep_open(),
        case(
            "304 with a stray body",
            "HTTP/1.1 304 Not Modified\r\netag: \"a\"\r\ncontent-length: 5\r\n\r\nhello",
            answer(304, ""),
        )
        .keep_open(),
        // interim answers and protocol switches
        case(
            "100-continue then 200",
            "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok",
            answer(200, "ok"),
        )
        .keep_open(),
        case(
            "two 100s and a 103 with fields, then 201",
            "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 100 Continue\r\n\r\n\
             HTTP/1.1 103 Early Hints\r\nlink: </a.css>\r\n\r\n\
             HTTP/1.1 201 Created\r\ncontent-length: 2\r\n\r\nok",
            answer(201, "ok"),
        )
        .keep_open(),
        case(
            "100-continue, then the close",
            "HTTP/1.1 100 Continue\r\n\r\n",
            BadGateway,
        ),
        case(
            "101 not asked for",
            "HTTP/1.1 101 Switching Protocols\r\nconnection: upgrade\r\nupgrade: test\r\n\r\n",
            BadGateway,
        )
        .keep_open(),
        // the head
        case("no answer at all", "", BadGateway),
        case(
            "a truncated head",
            "HTTP/1.1 200 OK\r\ncontent-len",
            BadGateway,
        ),
        case(
            "LF-only line endings",
            "HTTP/1.1 200 OK\ncontent-length: 2\nx-a: 1\n\nok",
            answer(200, "ok"),
        )
        .keep_open(),
        case(
            "a status line with no reason",
            "HTTP/1.1 200\r\ncontent-length: 2\r\n\r\nok",
            answer(200, "ok"),
        )
        .keep_open(),
        case(
            "obs-fold",
            ok("x-a: 1\r\n 2\r\ncontent-length: 0\r\n\r\n"),
            BadGateway,
        ),
        case(
            "a space before a colon",
            ok("x-a : 1\r\ncontent-length: 0\r\n\r\n"),
            BadGateway,
        ),
        case(
            "a field with no colon",
            ok("x-a\r\ncontent-length: 0\r\n\r\n"),
            BadGateway,
        ),
        case(
            "a NUL in a value",
            ok("x-a: a\0b\r\ncontent-length: 0\r\n\r\n"),
            BadGateway,
        ),
        case("a two-digit status", "HTTP/1.1 20 OK\r\n\r\n", BadGateway),
        case(
            "a four-digit status",
            "HTTP/1.1 2000 OK\r\n\r\n",
            BadGateway,
        ),
        case(
            "HTTP/2 in the status line",
            "HTTP/2 200 OK\r\n\r\n",
            BadGateway,
        ),
        case("not HTTP", "ICY 200 OK\r\n\r\n", BadGateway),
        case("100 fields", many_fields(100, "v", "\r\n"), answer(200, "")),
        case("101 fields", many_fields(101, "v", "\r\n"), BadGateway),
        case(
            "a head of 60 KiB, under the cap",
            many_fields(6, &"h".repeat(10 * 1024), "content-length: 2\r\n\r\nok"),
            answer(200, "ok"),
        )
        .keep_open(),
        case(
            "a head of 70 KiB, over the cap",
            many_fields(7, &"h".repeat(10 * 1024), "content-length: 2\r\n\r\nok"),
            BadGateway,
        )
        .keep_open(),
        case(
            "a head that never ends",
            many_fields(50, &"h".repeat(10 * 1024), ""),
            BadGateway,
        )
        .keep_open(),
    ]
}

/// A raw upstream: for a request to `/N` it writes case N's bytes, then closes the connection
/// or reads until the proxy closes it.
async fn serve(cases: Vec<(Vec<u8>, End)>) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let cases = std::sync::Arc::new(cases);
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let cases = cases.clone();
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut buf = [0u8; 4096];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match stream.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                let text = String::from_utf8_lossy(&head);
                let n: usize = text
                    .split_whitespace()
                    .nth(1)
                    .and_then(|path| path.strip_prefix('/'))
                    .and_then(|n| n.parse().ok())
                    .expect("a request for /N");
                let (wire, end) = &cases[n];
                let _ = stream.write_all(wire).await;
                if *end == End::KeepOpen {
                    while let Ok(1..) = stream.read(&mut buf).await {}
                }
            });
        }
    });
    addr
}

/// What the client saw for `/n`, asked with `method` on a connection of its own.
async fn outcome(proxy: SocketAddr, n: usize, method: &Method) -> Want {
    let stream = TcpStream::connect(proxy).await.unwrap();
    // Room for the proxy's own fields beside an upstream's 100.
    let (mut sender, connection) = hyper::client::conn::http1::Builder::new()
        .max_headers(200)
        .handshake(TokioIo::new(stream))
        .await
        .unwrap();
    let driving = tokio::spawn(connection);
    let request = http::Request::builder()
        .method(method.clone())
        .uri(format!("/{n}"))
        .header("host", "app")
        .header("te", "trailers")
        .body(Empty::<Bytes>::new())
        .unwrap();
    let seen = async {
        let Ok(response) = sender.send_request(request).await else {
            return Want::NotWhole;
        };
        let status = response.status().as_u16();
        let problem = response
            .headers()
            .get("content-type")
            .is_some_and(|t| t == "application/problem+json");
        let Ok(collected) = response.into_body().collect().await else {
            return Want::NotWhole;
        };
        let trailers = collected
            .trailers()
            .map(|fields| {
                fields
                    .iter()
                    .map(|(n, v)| (n.to_string(), v.to_str().unwrap().to_owned()))
                    .collect()
            })
            .unwrap_or_default();
        let body = collected.to_bytes().to_vec();
        if status == 502 && problem {
            return Want::BadGateway;
        }
        Want::Answer {
            status,
            body,
            trailers,
        }
    };
    let seen = tokio::time::timeout(CASE_LIMIT, seen)
        .await
        .unwrap_or_else(|_| panic!("case {n}: no outcome within {CASE_LIMIT:?}"));
    driving.abort();
    seen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_upstream_framing_reaches_the_client_as_the_rfc_says() {
    let cases = cases();
    let upstream = serve(cases.iter().map(|c| (c.wire.clone(), c.end)).collect()).await;
    let running = proxy("version: 1\nservices: {}\n", &format!("http://{upstream}")).await;
    let mut wrong = Vec::new();
    for (n, case) in cases.iter().enumerate() {
        let seen = outcome(running.proxy.addr(), n, &case.method).await;
        if seen != case.want {
            wrong.push(format!(
                "{}: want {:?}, saw {:?}",
                case.name, case.want, seen
            ));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    running.proxy.shutdown().await;
}
