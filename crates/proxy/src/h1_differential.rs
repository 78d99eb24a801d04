//! The differential test of this module's client: the same upstream byte streams, served from a
//! real socket, read by h1.rs and by hyper's HTTP/1.1 client, which must come to the same outcome.
//!
//! Every stream is served by a loopback server that reads the request head, writes the stream,
//! and then closes the connection or holds it open (an answer that frames itself must end without
//! the close). Each client gets a connection of its own. Two outcomes are the same when both
//! answered with the same status, end-to-end fields, body and trailers, or when both failed (why
//! need not match: the errors are each client's own). Where the two differ on purpose, the case
//! names the difference ([`Allowed`]), and the test asserts that difference and no other.
//!
//! The fields compared leave out the hop-by-hop and framing fields that say how the bytes were
//! carried rather than what the answer is: `connection`, `keep-alive`, `transfer-encoding`, and
//! `content-length` beside a `transfer-encoding` (h1.rs removes it, since the coding decides the
//! framing; hyper leaves it in the map).

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http::Request;
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;
use proptest::prelude::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use super::*;

/// How long a client may take over one answer before it counts as stalled: far more than any
/// case needs on loopback, so a stall means a client waits for bytes that never come.
const STALL: Duration = Duration::from_secs(3);

/// What the server does after writing the stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum End {
    Close,
    /// Holds the connection open until the client closes it.
    KeepOpen,
}

/// A difference between h1.rs and hyper that is meant, with the reason.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Allowed {
    /// A `101` to a request that asked for no upgrade: h1.rs refuses it (the proxy would otherwise
    /// hand a tunnel to a client that never asked for one); hyper returns it as the answer.
    UnaskedUpgrade,
    /// An HTTP/1.0 answer with `transfer-encoding`: RFC 9112 §6.1 says to treat its framing as
    /// faulty and "close the connection after processing the message". h1.rs processes it by the
    /// coding and closes; hyper refuses it outright. Neither reuses the connection.
    Http10TransferEncoding,
    /// An answer head between 64 KiB and hyper's buffer limit (about 408 KiB): h1.rs caps an
    /// upstream's head at 64 KiB, the cap the proxy puts on a client's request head.
    HeadOver64KiB,
    /// More than 64 trailer fields and at most 100: h1.rs keeps at most 64 trailers, hyper 100
    /// (as many as it allows in a head). Past 100 both refuse.
    TrailerFieldsOver64,
    /// A trailer section over 16 KiB: hyper's limit for trailers; h1.rs allows them up to 64 KiB,
    /// as it does a head.
    TrailersOver16KiB,
    /// A bare LF ending a trailer line or the trailer section: h1.rs reads the trailer section as
    /// field lines, where RFC 9112 §2.2 lets a recipient take a lone LF as a line's end (as both
    /// clients do in a head); hyper's chunked decoder counts the lines by their CRLF, so it waits
    /// for a CR that never comes (a section ended by LF) or finds more fields than lines
    /// ("too many headers").
    BareLfInTrailers,
    /// A chunk size written with more than 16 hex digits (leading zeros): httparse's chunk-size
    /// parser refuses any size line over 16 digits; hyper accepts leading zeros as long as the
    /// value fits in 64 bits.
    LongChunkSize,
}

/// Which side refuses, under an [`Allowed`] difference, and with which [`H1Error`] when it is
/// h1.rs.
enum Stricter {
    H1(&'static str),
    Hyper,
}

impl Allowed {
    fn stricter(self) -> Stricter {
        match self {
            Allowed::UnaskedUpgrade => Stricter::H1("Upgrade"),
            Allowed::HeadOver64KiB => Stricter::H1("HeadTooLarge"),
            Allowed::TrailerFieldsOver64 | Allowed::LongChunkSize => Stricter::H1("Chunk"),
            Allowed::Http10TransferEncoding
            | Allowed::TrailersOver16KiB
            | Allowed::BareLfInTrailers => Stricter::Hyper,
        }
    }
}

/// What a case requires of the two clients.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Expect {
    /// Both answer, the same answer.
    Answer,
    /// Both fail.
    Fail,
    /// Both answer the same answer, or both fail (the property test's streams, which may be
    /// cut or carry conflicting lengths).
    Same,
    /// They differ exactly as the named difference says.
    Differ(Allowed),
    /// Either the same outcome, or the named difference (the property test's streams, where the
    /// grammar can tell that a difference may arise but not always whether it will).
    SameOr(Allowed),
}

struct Case {
    name: &'static str,
    method: Method,
    /// Whether the request asks for an upgrade (`connection: upgrade`, `upgrade: test`).
    upgrade: bool,
    wire: Vec<u8>,
    end: End,
    expect: Expect,
}

fn case(name: &'static str, wire: impl AsRef<[u8]>, expect: Expect) -> Case {
    Case {
        name,
        method: Method::GET,
        upgrade: false,
        wire: wire.as_ref().to_vec(),
        end: End::Close,
        expect,
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

    fn upgrade(mut self) -> Self {
        self.upgrade = true;
        self
    }
}

/// An answer, as far as the comparison goes.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Answer {
    status: u16,
    fields: Vec<(String, Vec<u8>)>,
    /// The body, or after a `101` the first bytes of the tunnel (read to the close).
    body: Vec<u8>,
    trailers: Option<Vec<(String, Vec<u8>)>>,
}

#[derive(Debug, Clone)]
enum Outcome {
    Answer(Answer),
    /// Why, for the report: an [`H1Error`] variant's name, or `hyper`, and the message.
    Failed(&'static str, String),
    Stalled,
}

impl Outcome {
    fn same(&self, other: &Outcome) -> bool {
        match (self, other) {
            (Outcome::Answer(a), Outcome::Answer(b)) => a == b,
            (Outcome::Failed(..), Outcome::Failed(..)) | (Outcome::Stalled, Outcome::Stalled) => {
                true
            }
            _ => false,
        }
    }
}

/// The end-to-end fields of `fields`, in order.
fn end_to_end(fields: &HeaderMap) -> Vec<(String, Vec<u8>)> {
    let coded = fields.contains_key(header::TRANSFER_ENCODING);
    fields
        .iter()
        .filter(|(name, _)| {
            ![header::CONNECTION, header::TRANSFER_ENCODING].contains(name)
                && name.as_str() != "keep-alive"
                && !(coded && *name == header::CONTENT_LENGTH)
        })
        .map(|(name, value)| (name.as_str().to_owned(), value.as_bytes().to_vec()))
        .collect()
}

fn all_fields(fields: &HeaderMap) -> Vec<(String, Vec<u8>)> {
    fields
        .iter()
        .map(|(name, value)| (name.as_str().to_owned(), value.as_bytes().to_vec()))
        .collect()
}

fn h1_kind(err: &H1Error) -> &'static str {
    match err {
        H1Error::Io(_) => "Io",
        H1Error::Unanswered => "Unanswered",
        H1Error::Truncated => "Truncated",
        H1Error::Head(_) => "Head",
        H1Error::HeadTooLarge => "HeadTooLarge",
        H1Error::Field(_) => "Field",
        H1Error::Length => "Length",
        H1Error::Chunk => "Chunk",
        H1Error::Upgrade => "Upgrade",
    }
}

fn h1_failed(err: H1Error) -> Outcome {
    Outcome::Failed(h1_kind(&err), err.to_string())
}

/// An error and its sources, on one line.
fn chain(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(err) = source {
        text.push_str(": ");
        text.push_str(&err.to_string());
        source = err.source();
    }
    text
}

/// Serves `wire` to every connection: reads the request head, writes `wire`, then ends as `end`
/// says.
async fn serve(wire: Vec<u8>, end: End) -> (SocketAddr, tokio::task::JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let wire = Bytes::from(wire);
    let server = tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            let wire = wire.clone();
            tokio::spawn(async move {
                let mut request = Vec::new();
                let mut buf = [0u8; 4096];
                while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                    match socket.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => request.extend_from_slice(&buf[..n]),
                    }
                }
                // A client that stopped reading (its limit reached) may close first.
                let _ = socket.write_all(&wire).await;
                match end {
                    End::Close => {
                        let _ = socket.shutdown().await;
                    }
                    End::KeepOpen => while matches!(socket.read(&mut buf).await, Ok(1..)) {},
                }
            });
        }
    });
    (addr, server)
}

fn upgrade_fields(upgrade: bool) -> HeaderMap {
    let mut fields = HeaderMap::new();
    if upgrade {
        fields.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
        fields.insert(header::UPGRADE, HeaderValue::from_static("test"));
    }
    fields
}

/// The answer as h1.rs reads it, the way `forward.rs` drives it.
async fn via_h1(addr: SocketAddr, method: &Method, upgrade: bool) -> Outcome {
    let io = match TcpStream::connect(addr).await {
        Ok(io) => io,
        Err(err) => return h1_failed(err.into()),
    };
    let mut conn = Conn::new(io);
    encode_head(
        &mut conn.head,
        method,
        "/",
        &upgrade_fields(upgrade),
        &HeaderValue::from_static("upstream"),
        Outgoing::Empty {
            length_field: false,
        },
    );
    let head = {
        let (io, read, head) = conn.parts();
        if let Err((err, _)) = write_all(io, head).await {
            return h1_failed(err.into());
        }
        match read_head(io, read, method, upgrade).await {
            Ok(head) => head,
            Err(err) => return h1_failed(err),
        }
    };
    let status = head.response.status().as_u16();
    let fields = end_to_end(head.response.headers());
    let (body, trailers) = if head.switched {
        let (mut io, read) = conn.into_parts();
        let mut tunnel = read.to_vec();
        if let Err(err) = io.read_to_end(&mut tunnel).await {
            return h1_failed(err.into());
        }
        (tunnel, None)
    } else if let Some(framing) = head.framing {
        let reading = Reading::new(conn, framing, head.keep, Arc::default());
        match reading.collect().await {
            Ok(collected) => {
                let trailers = collected.trailers().map(all_fields);
                (collected.to_bytes().to_vec(), trailers)
            }
            Err(err) => return h1_failed(err),
        }
    } else {
        (Vec::new(), None)
    };
    Outcome::Answer(Answer {
        status,
        fields,
        body,
        trailers,
    })
}

/// The answer as hyper's HTTP/1.1 client reads it.
async fn via_hyper(addr: SocketAddr, method: &Method, upgrade: bool) -> Outcome {
    let failed = |err: &dyn std::error::Error| Outcome::Failed("hyper", chain(err));
    let io = match TcpStream::connect(addr).await {
        Ok(io) => io,
        Err(err) => return failed(&err),
    };
    let (mut send, conn) =
        match hyper::client::conn::http1::handshake::<_, Empty<Bytes>>(TokioIo::new(io)).await {
            Ok(pair) => pair,
            Err(err) => return failed(&err),
        };
    let driving = tokio::spawn(conn.with_upgrades());
    let mut request = Request::builder()
        .method(method.clone())
        .uri("/")
        .header(header::HOST, "upstream");
    for (name, value) in &upgrade_fields(upgrade) {
        request = request.header(name, value);
    }
    let request = request.body(Empty::new()).unwrap();
    let outcome = async {
        let response = send
            .send_request(request)
            .await
            .map_err(|err| chain(&err))?;
        let status = response.status().as_u16();
        let fields = end_to_end(response.headers());
        if upgrade && status == 101 {
            let upgraded = hyper::upgrade::on(response)
                .await
                .map_err(|err| chain(&err))?;
            let mut tunnel = Vec::new();
            let mut upgraded = TokioIo::new(upgraded);
            upgraded
                .read_to_end(&mut tunnel)
                .await
                .map_err(|err| chain(&err))?;
            return Ok(Answer {
                status,
                fields,
                body: tunnel,
                trailers: None,
            });
        }
        let collected = response
            .into_body()
            .collect()
            .await
            .map_err(|err| chain(&err))?;
        let trailers = collected.trailers().map(all_fields);
        Ok(Answer {
            status,
            fields,
            body: collected.to_bytes().to_vec(),
            trailers,
        })
    }
    .await;
    driving.abort();
    match outcome {
        Ok(answer) => Outcome::Answer(answer),
        Err(text) => Outcome::Failed("hyper", text),
    }
}

/// Both clients' outcomes for one stream, each on a connection of its own.
async fn outcomes(case: &Case) -> (Outcome, Outcome) {
    let (addr, server) = serve(case.wire.clone(), case.end).await;
    let stalled = |outcome: Result<Outcome, _>| outcome.unwrap_or(Outcome::Stalled);
    let (h1, hyper) = tokio::join!(
        tokio::time::timeout(STALL, via_h1(addr, &case.method, case.upgrade)),
        tokio::time::timeout(STALL, via_hyper(addr, &case.method, case.upgrade)),
    );
    server.abort();
    (stalled(h1), stalled(hyper))
}

/// Whether the two outcomes meet what `expect` requires; if not, why.
fn judge(expect: Expect, h1: &Outcome, hyper: &Outcome) -> Result<(), String> {
    let differ = |allowed: Allowed| match (allowed.stricter(), h1, hyper) {
        (Stricter::H1(kind), Outcome::Failed(failed, _), Outcome::Answer(_)) if *failed == kind => {
            Ok(())
        }
        (Stricter::Hyper, Outcome::Answer(_), Outcome::Failed(..)) => Ok(()),
        _ => Err(format!("not the allowed difference {allowed:?}")),
    };
    match expect {
        Expect::Answer if matches!(h1, Outcome::Answer(_)) && h1.same(hyper) => Ok(()),
        Expect::Fail if matches!(h1, Outcome::Failed(..)) && h1.same(hyper) => Ok(()),
        Expect::Same | Expect::SameOr(_) if matches!(h1, Outcome::Stalled) => {
            Err(format!("stalled, expected {expect:?}"))
        }
        Expect::Same | Expect::SameOr(_) if h1.same(hyper) => Ok(()),
        Expect::Answer | Expect::Fail | Expect::Same => Err(format!("expected {expect:?}")),
        Expect::Differ(allowed) | Expect::SameOr(allowed) => differ(allowed),
    }
}

fn report(name: &str, wire: &[u8], h1: &Outcome, hyper: &Outcome, why: &str) -> String {
    let mut shown = String::from_utf8_lossy(wire).into_owned();
    if shown.len() > 300 {
        shown.truncate(shown.floor_char_boundary(300));
        shown.push_str("...");
    }
    let show = |outcome: &Outcome| match outcome {
        Outcome::Answer(answer) => format!("{answer:?}"),
        Outcome::Failed(kind, why) => format!("failed ({kind}): {why}"),
        Outcome::Stalled => format!("stalled for {STALL:?}"),
    };
    format!(
        "{name}: {why}\n  wire:  {shown:?}\n  h1:    {}\n  hyper: {}",
        show(h1),
        show(hyper)
    )
}

/// A head of `fields` fields `x-<n>: <value>`, then `rest`.
fn many_fields(fields: usize, value: &str, rest: &str) -> Vec<u8> {
    let mut wire = b"HTTP/1.1 200 OK\r\n".to_vec();
    for n in 0..fields {
        wire.extend_from_slice(format!("x-{n}: {value}\r\n").as_bytes());
    }
    wire.extend_from_slice(rest.as_bytes());
    wire
}

/// A chunked body `ok` whose trailer section holds `fields` fields `x-<n>: <value>`.
fn many_trailers(fields: usize, value: &str) -> Vec<u8> {
    let mut wire =
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n".to_vec();
    for n in 0..fields {
        wire.extend_from_slice(format!("x-{n}: {value}\r\n").as_bytes());
    }
    wire.extend_from_slice(b"\r\n");
    wire
}

fn cases() -> Vec<Case> {
    use Expect::{Answer, Differ, Fail};
    const OK: &str = "HTTP/1.1 200 OK\r\n";
    const CHUNKED: &str = "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n";
    let ok = |rest: &str| format!("{OK}{rest}");
    let chunked = |body: &str| format!("{CHUNKED}{body}");
    vec![
        // content-length
        case(
            "content-length",
            ok("content-length: 5\r\nx-a: 1\r\nx-b: 2\r\nx-a: 3\r\n\r\nhello"),
            Answer,
        )
        .keep_open(),
        case("content-length zero", ok("content-length: 0\r\n\r\n"), Answer).keep_open(),
        case(
            "content-length with bytes past it",
            ok("content-length: 5\r\n\r\nhelloEXTRA"),
            Answer,
        )
        .keep_open(),
        case(
            "content-length with leading zeros",
            ok("content-length: 007\r\n\r\nseven!!"),
            Answer,
        )
        .keep_open(),
        case(
            "repeated equal content-length",
            ok("content-length: 4\r\ncontent-length: 4, 4\r\n\r\nfour"),
            Answer,
        )
        .keep_open(),
        case(
            "conflicting content-length",
            ok("content-length: 4\r\ncontent-length: 5\r\n\r\nfour!"),
            Fail,
        ),
        case(
            "conflicting content-length in one field",
            ok("content-length: 4, 5\r\n\r\nfour!"),
            Fail,
        ),
        case("negative content-length", ok("content-length: -1\r\n\r\n"), Fail),
        case("signed content-length", ok("content-length: +4\r\n\r\nfour"), Fail),
        case("hex content-length", ok("content-length: 0x4\r\n\r\nfour"), Fail),
        case("empty content-length", ok("content-length: \r\n\r\n"), Fail),
        case(
            "content-length with a trailing comma",
            ok("content-length: 4,\r\n\r\nfour"),
            Fail,
        ),
        case(
            "content-length past 64 bits",
            ok("content-length: 99999999999999999999\r\n\r\nx"),
            Fail,
        ),
        case(
            "truncated content-length body",
            ok("content-length: 10\r\n\r\nhello"),
            Fail,
        ),
        // chunked
        case(
            "chunked",
            chunked("5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n"),
            Answer,
        )
        .keep_open(),
        case(
            "chunked with extensions and trailers",
            chunked(
                "5;name=value\r\nhello\r\n6;a;b=\"q;uo\\\"ted\"\r\n world\r\n0;last\r\n\
                 x-checksum: 42\r\nserver-timing: db;dur=3\r\n\r\n",
            ),
            Answer,
        )
        .keep_open(),
        case(
            "chunked, upper-case hex and coding",
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: Chunked\r\n\r\nA\r\n0123456789\r\n0\r\n\r\n",
            Answer,
        )
        .keep_open(),
        case(
            "chunk size followed by whitespace",
            chunked("5 \t;ext\r\nhello\r\n0 \r\n\r\n"),
            Answer,
        )
        .keep_open(),
        case(
            "a 3000-byte chunk extension",
            chunked(&format!("5;{}\r\nhello\r\n0\r\n\r\n", "e".repeat(3000))),
            Answer,
        )
        .keep_open(),
        case(
            "gzip, chunked is chunked",
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: gzip, chunked\r\n\r\n3\r\n\x1f\x8b\x08\r\n0\r\n\r\n",
            Answer,
        )
        .keep_open(),
        case(
            "chunked with bytes past its end",
            chunked("2\r\nok\r\n0\r\n\r\nHTTP/1.1 200 OK\r\n\r\n"),
            Answer,
        )
        .keep_open(),
        case(
            "content-length beside chunked",
            "HTTP/1.1 200 OK\r\ncontent-length: 3\r\ntransfer-encoding: chunked\r\n\r\n\
             5\r\nhello\r\n0\r\n\r\n",
            Answer,
        )
        .keep_open(),
        case(
            "an invalid content-length beside chunked",
            "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\ncontent-length: abc\r\n\r\n\
             2\r\nok\r\n0\r\n\r\n",
            Answer,
        )
        .keep_open(),
        case(
            "a coding that does not end in chunked",
            "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked, gzip\r\n\r\n2\r\nok\r\n0\r\n\r\n",
            Answer,
        ),
        case(
            "identity coding",
            "HTTP/1.1 200 OK\r\ntransfer-encoding: identity\r\ncontent-length: 2\r\n\r\nto the close",
            Answer,
        ),
        case(
            "chunked, then another coding on a second line",
            "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\ntransfer-encoding: gzip\r\n\r\n0\r\n\r\n",
            Answer,
        ),
        case("a chunk size that is not hex", chunked("zz\r\nhello\r\n"), Fail),
        case(
            "a chunk size with a 0x prefix",
            chunked("0x5\r\nhello\r\n0\r\n\r\n"),
            Fail,
        ),
        case(
            "a chunk size after whitespace",
            chunked(" 5\r\nhello\r\n0\r\n\r\n"),
            Fail,
        ),
        case(
            "two numbers as a chunk size",
            chunked("5 6\r\nhello\r\n0\r\n\r\n"),
            Fail,
        ),
        case(
            "a negative chunk size",
            chunked("-5\r\nhello\r\n0\r\n\r\n"),
            Fail,
        ),
        // httparse reads an empty chunk size as 0 and lets a bare LF into a chunk extension:
        // h1.rs answered the last three of these four before it checked both itself (the first
        // failed only because its data then read as a malformed trailer section).
        case("an empty chunk size", chunked("\r\nhello\r\n0\r\n\r\n"), Fail),
        case("an empty last-chunk size", chunked("\r\n\r\n"), Fail),
        case("a chunk extension with no size", chunked(";ext\r\n\r\n"), Fail),
        case(
            "a bare LF inside a chunk extension",
            chunked("5;a\nb\r\nhello\r\n0\r\n\r\n"),
            Fail,
        ),
        case(
            "a chunk size over 64 bits",
            chunked("10000000000000000\r\nhello\r\n0\r\n\r\n"),
            Fail,
        ),
        case(
            "the largest chunk size, truncated",
            chunked("ffffffffffffffff\r\nhello"),
            Fail,
        ),
        case(
            "a chunk size with 17 digits, leading zeros",
            chunked("00000000000000005\r\nhello\r\n0\r\n\r\n"),
            Differ(Allowed::LongChunkSize),
        ),
        case(
            "chunk data longer than its size",
            chunked("5\r\nhelloXX\r\n0\r\n\r\n"),
            Fail,
        ),
        case(
            "chunk data ended by a bare LF",
            chunked("5\r\nhello\n0\r\n\r\n"),
            Fail,
        ),
        case(
            "a chunk size line ended by a bare LF",
            chunked("5\nhello\r\n0\r\n\r\n"),
            Fail,
        ),
        case(
            "a chunk size line ended by a bare CR",
            chunked("5\rhello\r\n0\r\n\r\n"),
            Fail,
        ),
        case(
            "a trailer section ended by a bare LF",
            chunked("2\r\nok\r\n0\r\n\n"),
            Differ(Allowed::BareLfInTrailers),
        ),
        case(
            "trailer fields ended by bare LFs, the section by CRLF",
            chunked("2\r\nok\r\n0\r\nx-a: 1\nx-b: 2\r\n\r\n"),
            Differ(Allowed::BareLfInTrailers),
        )
        .keep_open(),
        case("truncated in a chunk", chunked("5\r\nhel"), Fail),
        case("truncated before the last chunk", chunked("5\r\nhello\r\n"), Fail),
        case("truncated in a chunk size line", chunked("5\r\nhello\r\n0"), Fail),
        case(
            "truncated after the last chunk",
            chunked("5\r\nhello\r\n0\r\n"),
            Fail,
        ),
        case(
            "truncated in the trailers",
            chunked("5\r\nhello\r\n0\r\nx-checksum: 4"),
            Fail,
        ),
        case(
            "a trailer with obs-fold",
            chunked("2\r\nok\r\n0\r\nx-a: 1\r\n 2\r\n\r\n"),
            Fail,
        ),
        case(
            "a trailer with a space before its colon",
            chunked("2\r\nok\r\n0\r\nx-a : 1\r\n\r\n"),
            Fail,
        ),
        case(
            "a NUL in a trailer value",
            chunked("2\r\nok\r\n0\r\nx-a: a\0b\r\n\r\n"),
            Fail,
        ),
        case("64 trailer fields", many_trailers(64, "v"), Answer).keep_open(),
        case(
            "80 trailer fields",
            many_trailers(80, "v"),
            Differ(Allowed::TrailerFieldsOver64),
        ),
        case("101 trailer fields", many_trailers(101, "v"), Fail),
        case(
            "a 20 KiB trailer section",
            many_trailers(2, &"t".repeat(10 * 1024)),
            Differ(Allowed::TrailersOver16KiB),
        ),
        // to the close
        case(
            "close-delimited",
            ok("x-a: 1\r\n\r\nall of this, to the close"),
            Answer,
        ),
        case("close-delimited and empty", ok("\r\n"), Answer),
        // HTTP/1.0
        case(
            "HTTP/1.0 with content-length",
            "HTTP/1.0 200 OK\r\ncontent-length: 2\r\n\r\nok",
            Answer,
        )
        .keep_open(),
        case(
            "HTTP/1.0 kept alive",
            "HTTP/1.0 200 OK\r\nconnection: keep-alive\r\nkeep-alive: timeout=5\r\ncontent-length: 2\r\n\r\nok",
            Answer,
        )
        .keep_open(),
        case(
            "HTTP/1.0 to the close",
            "HTTP/1.0 200 OK\r\n\r\nto the close",
            Answer,
        ),
        case(
            "HTTP/1.0 with chunked",
            "HTTP/1.0 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n",
            Differ(Allowed::Http10TransferEncoding),
        ),
        // no body
        case(
            "HEAD with content-length",
            ok("content-length: 9\r\n\r\n"),
            Answer,
        )
        .head()
        .keep_open(),
        case(
            "HEAD with chunked",
            ok("transfer-encoding: chunked\r\n\r\n"),
            Answer,
        )
        .head()
        .keep_open(),
        case(
            "204 with a stray body",
            "HTTP/1.1 204 No Content\r\ncontent-length: 5\r\n\r\nhello",
            Answer,
        )
        .keep_open(),
        case(
            "204 with stray chunks",
            "HTTP/1.1 204 No Content\r\ntransfer-encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n",
            Answer,
        )
        .keep_open(),
        case(
            "304 with a stray body",
            "HTTP/1.1 304 Not Modified\r\netag: \"a\"\r\ncontent-length: 5\r\n\r\nhello",
            Answer,
        )
        .keep_open(),
        // interim answers and upgrades
        case(
            "100-continue then 200",
            "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok",
            Answer,
        )
        .keep_open(),
        case(
            "two 100s and a 103 with fields, then 201",
            "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 100 Continue\r\n\r\n\
             HTTP/1.1 103 Early Hints\r\nlink: </a.css>\r\n\r\n\
             HTTP/1.1 201 Created\r\ncontent-length: 2\r\n\r\nok",
            Answer,
        )
        .keep_open(),
        case(
            "100-continue, then the close",
            "HTTP/1.1 100 Continue\r\n\r\n",
            Fail,
        ),
        case(
            "101 not asked for",
            "HTTP/1.1 101 Switching Protocols\r\nconnection: upgrade\r\nupgrade: test\r\n\r\n",
            Differ(Allowed::UnaskedUpgrade),
        ),
        case(
            "101 asked for, with the tunnel's first bytes",
            "HTTP/1.1 101 Switching Protocols\r\nconnection: upgrade\r\nupgrade: test\r\n\r\n\
             tunnel bytes",
            Answer,
        )
        .upgrade(),
        case(
            "asked for an upgrade, answered 200",
            ok("content-length: 2\r\n\r\nok"),
            Answer,
        )
        .upgrade()
        .keep_open(),
        // the head
        case("no answer at all", "", Fail),
        case("a truncated head", "HTTP/1.1 200 OK\r\ncontent-len", Fail),
        case(
            "LF-only line endings",
            "HTTP/1.1 200 OK\ncontent-length: 2\nx-a: 1\n\nok",
            Answer,
        )
        .keep_open(),
        case(
            "a status line with no reason",
            "HTTP/1.1 200\r\ncontent-length: 2\r\n\r\nok",
            Answer,
        )
        .keep_open(),
        case(
            "a reason with obs-text",
            b"HTTP/1.1 200 \xe9t\xe9\r\ncontent-length: 2\r\n\r\nok",
            Answer,
        )
        .keep_open(),
        case("obs-fold", ok("x-a: 1\r\n 2\r\ncontent-length: 0\r\n\r\n"), Fail),
        case("a space before a colon", ok("x-a : 1\r\ncontent-length: 0\r\n\r\n"), Fail),
        case("a field with no name", ok(": 1\r\ncontent-length: 0\r\n\r\n"), Fail),
        case("a field name with a space", ok("x a: 1\r\ncontent-length: 0\r\n\r\n"), Fail),
        case("a field with no colon", ok("x-a\r\ncontent-length: 0\r\n\r\n"), Fail),
        case("a NUL in a value", ok("x-a: a\0b\r\ncontent-length: 0\r\n\r\n"), Fail),
        case("a control byte in a value", ok("x-a: a\x01b\r\ncontent-length: 0\r\n\r\n"), Fail),
        case(
            "obs-text and whitespace in values",
            ok("x-a: caf\u{e9}\r\nx-b:   padded  \r\nx-c:\r\ncontent-length: 0\r\n\r\n"),
            Answer,
        )
        .keep_open(),
        case("a two-digit status", "HTTP/1.1 20 OK\r\n\r\n", Fail),
        case("a four-digit status", "HTTP/1.1 2000 OK\r\n\r\n", Fail),
        case("a status below 100", "HTTP/1.1 099 Low\r\n\r\n", Fail),
        case("HTTP/2 in the status line", "HTTP/2 200 OK\r\n\r\n", Fail),
        case("HTTP/1.2", "HTTP/1.2 200 OK\r\n\r\n", Fail),
        case("a lower-case version", "http/1.1 200 OK\r\n\r\n", Fail),
        case("two spaces after the version", "HTTP/1.1  200 OK\r\n\r\n", Fail),
        case("not HTTP", "ICY 200 OK\r\n\r\n", Fail),
        case("100 fields", many_fields(100, "v", "\r\n"), Answer),
        case("101 fields", many_fields(101, "v", "\r\n"), Fail),
        case(
            "a 100 KiB head",
            many_fields(10, &"h".repeat(10 * 1024), "content-length: 0\r\n\r\n"),
            Differ(Allowed::HeadOver64KiB),
        ),
        case(
            "a 500 KiB head",
            many_fields(50, &"h".repeat(10 * 1024), "content-length: 0\r\n\r\n"),
            Fail,
        ),
    ]
}

#[tokio::test]
async fn h1_and_hyper_agree_on_every_case() {
    let cases = cases();
    assert!(cases.len() >= 30);
    let mut wrong = Vec::new();
    for case in &cases {
        let (h1, hyper) = outcomes(case).await;
        if let Err(why) = judge(case.expect, &h1, &hyper) {
            wrong.push(report(case.name, &case.wire, &h1, &hyper, &why));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// The framing of a generated answer's body.
#[derive(Debug, Clone)]
enum Framed {
    /// `content-length` off by this much from the body's length (0 most often).
    Length(i64),
    /// The same length twice, in two fields or as `n, n`.
    LengthTwice {
        one_field: bool,
    },
    /// Two lengths that differ.
    LengthsConflicting,
    /// Chunked: the body cut at these sizes, with or without extensions and upper-case hex,
    /// and with these trailers.
    Chunked {
        sizes: Vec<usize>,
        extensions: bool,
        upper: bool,
        trailers: Vec<(&'static str, String)>,
    },
    /// Chunked beside a `content-length` (which does not count).
    ChunkedWithLength,
    /// A coding that does not end in chunked: read to the close.
    NotChunked,
    Close,
}

/// A generated upstream answer.
#[derive(Debug, Clone)]
struct Generated {
    http10: bool,
    interim: bool,
    status: u16,
    head: bool,
    fields: Vec<(&'static str, String)>,
    framed: Framed,
    body: Vec<u8>,
    /// Where the stream is cut (as a fraction of its length, in thousandths), if it is.
    cut: Option<u16>,
    keep_open: bool,
}

impl Generated {
    /// The bytes, and whether they frame themselves whole (so that the connection may stay open
    /// after them without either client waiting for more).
    fn wire(&self) -> (Vec<u8>, bool) {
        let mut wire = Vec::new();
        if self.interim {
            wire.extend_from_slice(b"HTTP/1.1 100 Continue\r\n\r\n");
        }
        let version = if self.http10 { "1.0" } else { "1.1" };
        wire.extend_from_slice(format!("HTTP/{version} {} Reason\r\n", self.status).as_bytes());
        for (name, value) in &self.fields {
            wire.extend_from_slice(format!("{name}: {value}\r\n").as_bytes());
        }
        let len = self.body.len() as i64;
        let no_body = self.head || self.status == 204 || self.status == 304;
        let mut whole = true;
        let mut body = Vec::new();
        let chunk = |body: &mut Vec<u8>, size: usize, extensions: bool, upper: bool| {
            let size = if upper {
                format!("{size:X}")
            } else {
                format!("{size:x}")
            };
            let extension = if extensions { ";e=1" } else { "" };
            body.extend_from_slice(format!("{size}{extension}\r\n").as_bytes());
        };
        match &self.framed {
            Framed::Length(off) => {
                let declared = (len + off).max(0);
                wire.extend_from_slice(format!("content-length: {declared}\r\n\r\n").as_bytes());
                body.extend_from_slice(&self.body);
                whole = declared <= len;
            }
            Framed::LengthTwice { one_field: true } => {
                wire.extend_from_slice(format!("content-length: {len}, {len}\r\n\r\n").as_bytes());
                body.extend_from_slice(&self.body);
            }
            Framed::LengthTwice { one_field: false } => {
                wire.extend_from_slice(
                    format!("content-length: {len}\r\ncontent-length: {len}\r\n\r\n").as_bytes(),
                );
                body.extend_from_slice(&self.body);
            }
            Framed::LengthsConflicting => {
                wire.extend_from_slice(
                    format!(
                        "content-length: {len}\r\ncontent-length: {}\r\n\r\n",
                        len + 1
                    )
                    .as_bytes(),
                );
                body.extend_from_slice(&self.body);
            }
            Framed::Chunked {
                sizes,
                extensions,
                upper,
                trailers,
            } => {
                wire.extend_from_slice(b"transfer-encoding: chunked\r\n\r\n");
                let mut rest = &self.body[..];
                let mut sizes = sizes.iter().cycle();
                while !rest.is_empty() {
                    let size = (*sizes.next().unwrap_or(&1)).clamp(1, rest.len());
                    chunk(&mut body, size, *extensions, *upper);
                    body.extend_from_slice(&rest[..size]);
                    body.extend_from_slice(b"\r\n");
                    rest = &rest[size..];
                }
                chunk(&mut body, 0, *extensions, *upper);
                for (name, value) in trailers {
                    body.extend_from_slice(format!("{name}: {value}\r\n").as_bytes());
                }
                body.extend_from_slice(b"\r\n");
            }
            Framed::ChunkedWithLength => {
                wire.extend_from_slice(
                    format!(
                        "content-length: {}\r\ntransfer-encoding: chunked\r\n\r\n",
                        len + 3
                    )
                    .as_bytes(),
                );
                if !self.body.is_empty() {
                    chunk(&mut body, self.body.len(), false, false);
                    body.extend_from_slice(&self.body);
                    body.extend_from_slice(b"\r\n");
                }
                body.extend_from_slice(b"0\r\n\r\n");
            }
            Framed::NotChunked => {
                wire.extend_from_slice(b"transfer-encoding: chunked, gzip\r\n\r\n");
                body.extend_from_slice(&self.body);
                whole = false;
            }
            Framed::Close => {
                wire.extend_from_slice(b"\r\n");
                body.extend_from_slice(&self.body);
                whole = false;
            }
        }
        if no_body {
            // The body's bytes are still sent: a stray body neither client may read.
            whole = true;
        }
        wire.extend_from_slice(&body);
        if let Some(cut) = self.cut {
            wire.truncate(wire.len() * usize::from(cut) / 1000);
            whole = false;
        }
        (wire, whole)
    }

    /// The difference the grammar may produce, if any.
    fn may_differ(&self) -> Option<Allowed> {
        let coded = matches!(
            self.framed,
            Framed::Chunked { .. } | Framed::ChunkedWithLength | Framed::NotChunked
        );
        let no_body = self.head || self.status == 204 || self.status == 304;
        (self.http10 && coded && !no_body).then_some(Allowed::Http10TransferEncoding)
    }
}

fn field() -> impl Strategy<Value = (&'static str, String)> {
    (
        prop_oneof![
            Just("x-a"),
            Just("x-b"),
            Just("server"),
            Just("Cache-Control"),
            Just("content-type"),
        ],
        "[!-~]([ -~]{0,14}[!-~])?",
    )
}

fn framed() -> impl Strategy<Value = Framed> {
    prop_oneof![
        4 => Just(Framed::Length(0)),
        1 => (-3i64..=3).prop_map(Framed::Length),
        1 => any::<bool>().prop_map(|one_field| Framed::LengthTwice { one_field }),
        1 => Just(Framed::LengthsConflicting),
        4 => (
            proptest::collection::vec(1usize..40, 1..4),
            any::<bool>(),
            any::<bool>(),
            proptest::collection::vec(
                (
                    prop_oneof![Just("x-checksum"), Just("server-timing"), Just("x-t")],
                    "[!-~]{1,8}",
                ),
                0..3,
            ),
        )
            .prop_map(|(sizes, extensions, upper, trailers)| Framed::Chunked {
                sizes,
                extensions,
                upper,
                trailers,
            }),
        1 => Just(Framed::ChunkedWithLength),
        1 => Just(Framed::NotChunked),
        2 => Just(Framed::Close),
    ]
}

fn generated() -> impl Strategy<Value = Generated> {
    (
        (
            prop::bool::weighted(0.2),
            prop::bool::weighted(0.2),
            prop_oneof![
                6 => Just(200u16),
                1 => Just(201),
                1 => Just(204),
                1 => Just(206),
                1 => Just(304),
                1 => Just(404),
                1 => Just(503),
            ],
            prop::bool::weighted(0.15),
        ),
        proptest::collection::vec(field(), 0..5),
        framed(),
        proptest::collection::vec(any::<u8>(), 0..120),
        proptest::option::weighted(0.25, 0u16..1000),
        any::<bool>(),
    )
        .prop_map(
            |((http10, interim, status, head), fields, framed, body, cut, keep_open)| Generated {
                http10,
                interim,
                status,
                head,
                fields,
                framed,
                body,
                cut,
                keep_open,
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Answers from a small grammar (status, fields, framing, body, chunk sizes, a cut): both
    /// clients come to the same outcome, or differ only as an allowed difference says.
    #[test]
    fn h1_and_hyper_agree_on_generated_answers(answer in generated()) {
        let (wire, whole) = answer.wire();
        let case = Case {
            name: "generated",
            method: if answer.head { Method::HEAD } else { Method::GET },
            upgrade: false,
            // Held open only when the bytes frame themselves whole: otherwise both would wait.
            end: if whole && answer.keep_open { End::KeepOpen } else { End::Close },
            expect: answer.may_differ().map_or(Expect::Same, Expect::SameOr),
            wire,
        };
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let (h1, hyper) = runtime.block_on(outcomes(&case));
        if let Err(why) = judge(case.expect, &h1, &hyper) {
            return Err(TestCaseError::fail(report(case.name, &case.wire, &h1, &hyper, &why)));
        }
    }
}
