//! The upstream side of HTTP/1.1, spoken directly: a request's head written from the downstream
//! request's parts, its body framed by length or in chunks, and the upstream's response read
//! back: its head parsed with `httparse` into a header map whose values share the read buffer,
//! its body framed by RFC 9112 §6.3 (no body, `content-length`, chunked, or to the close).
//!
//! One downstream connection keeps one upstream connection ([`UpstreamSlot`]), and a request uses it
//! with no task, channel or callback in between: the downstream connection's task writes the
//! request, reads the answer's head, and relays its body ([`Reading`]), which hands the
//! connection back for the next request once it has been read whole. The read buffer is the
//! connection's own and is reused: the head and body handed on are slices of it, so a small
//! answer costs no allocation of its own but its header map.
//!
//! Why not hyper's client: measured in one run (`benches/upstream_client.rs`, docs/benchmarks.md),
//! this module is within a few percent of it either way (0.97x, 0.92x and 1.05x the time per
//! request), so speed is not the reason. It is kept for what hyper's client does not do: refuse a
//! `101` to a request that asked for no upgrade, hand the connection to the proxy's own tunnel
//! for an upgrade it admitted, and cap an upstream's head at 64 KiB. `h1_differential.rs` feeds
//! it and hyper's client the same byte streams from a real socket and requires the same outcome,
//! every meant difference named.

use std::io::{self, Write as _};
use std::mem::MaybeUninit;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, ready};

use bytes::{Buf, Bytes, BytesMut};
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, Response, StatusCode};
use hyper::body::{Body, Frame, SizeHint};
use tokio::net::TcpStream;

/// What a response head (status line and fields) or a trailer section must take less than.
const MAX_HEAD: usize = 64 * 1024;
/// The most fields a response head may have (hyper's default too).
const MAX_FIELDS: usize = 100;
/// The most a chunk-size line (with its extensions) may take.
const MAX_CHUNK_LINE: usize = 4096;
/// The room each read of the upstream socket asks for.
const READ_ROOM: usize = 16 * 1024;

/// An upstream HTTP/1.1 connection: the socket, the bytes read from it and not yet handed on,
/// and the buffer the next request's head is written into.
pub(crate) struct Conn {
    io: TcpStream,
    read: BytesMut,
    pub(crate) head: Vec<u8>,
}

/// Why an exchange with the upstream over HTTP/1.1 failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum H1Error {
    #[error("upstream connection: {0}")]
    Io(#[from] io::Error),
    /// The connection ended, or failed, before a byte of the answer came.
    #[error("the upstream closed the connection without answering")]
    Unanswered,
    #[error("the upstream closed the connection before its answer was whole")]
    Truncated,
    #[error("the upstream's answer head is malformed: {0}")]
    Head(httparse::Error),
    #[error(
        "the upstream's answer head is too large: {MAX_HEAD} bytes or more, or more than {MAX_FIELDS} fields"
    )]
    HeadTooLarge,
    #[error("the upstream's answer has a malformed field: {0}")]
    Field(&'static str),
    #[error("the upstream's answer has an invalid or conflicting content-length")]
    Length,
    #[error("the upstream's chunked answer body is malformed")]
    Chunk,
    #[error("the upstream answered 101 Switching Protocols to a request that asked for no upgrade")]
    Upgrade,
}

impl Conn {
    pub(crate) fn new(io: TcpStream) -> Self {
        Self {
            io,
            read: BytesMut::with_capacity(READ_ROOM),
            head: Vec::with_capacity(1024),
        }
    }

    /// Reads what the socket has into the read buffer: how many bytes, 0 at its end.
    fn poll_fill(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        self.read.reserve(READ_ROOM);
        loop {
            match self.io.try_read_buf(&mut self.read) {
                Err(err) if err.kind() == io::ErrorKind::WouldBlock => {
                    ready!(self.io.poll_read_ready(cx))?;
                }
                read => return Poll::Ready(read),
            }
        }
    }

    /// For a connection held between requests: whether it has ended. An upstream says nothing on
    /// an idle connection, so anything readable (its close, an error, or bytes no request asked
    /// for) ends it. Registers `cx` to be woken when it becomes readable. The read buffer is
    /// left alone: the last answer's body may still hold slices of it.
    fn idle_ended(&mut self, cx: &mut Context<'_>) -> bool {
        loop {
            match self.io.poll_read_ready(cx) {
                Poll::Pending => return false,
                Poll::Ready(Err(_)) => return true,
                Poll::Ready(Ok(())) => match self.io.try_read(&mut [0u8; 1]) {
                    // A stale readiness, now cleared: look again, which registers `cx`.
                    Err(err) if err.kind() == io::ErrorKind::WouldBlock => {}
                    _ => return true,
                },
            }
        }
    }

    /// The socket and what was read from it past the last answer's head: for a connection the
    /// upstream switched to another protocol, whose first bytes may have come with its `101`.
    pub(crate) fn into_parts(self) -> (TcpStream, BytesMut) {
        (self.io, self.read)
    }

    /// Splits the connection into its socket, its read buffer and its head buffer, for a request
    /// that writes through one while it reads through the other.
    pub(crate) fn parts(&mut self) -> (&TcpStream, &mut BytesMut, &mut Vec<u8>) {
        (&self.io, &mut self.read, &mut self.head)
    }
}

/// The upstream connection of one downstream HTTP/1.1 connection, held between its requests.
///
/// HTTP/1.1 answers one request at a time per connection, so a downstream connection needs one
/// upstream connection, no more: its requests go out on it without a pool's checkout, lock and
/// key. It is opened at the first request and closed with the downstream connection; one the
/// upstream closed in between is dropped ([`UpstreamSlot::tend`]) and replaced at the next request.
#[derive(Default)]
pub(crate) struct UpstreamSlot(Mutex<Option<Conn>>);

impl UpstreamSlot {
    /// Watches the connection held between requests, if any, and lets it go if it has ended:
    /// called while the downstream connection waits for its next request, so an upstream's
    /// close is answered with a close at once rather than at the next request.
    pub(crate) fn tend(&self, cx: &mut Context<'_>) {
        if let Ok(mut slot) = self.0.try_lock()
            && slot.as_mut().is_some_and(|conn| conn.idle_ended(cx))
        {
            *slot = None;
        }
    }

    pub(crate) fn take(&self) -> Option<Conn> {
        self.0.lock().ok().and_then(|mut slot| slot.take())
    }

    /// Keeps `conn` for the next request, unless something was read past the answer just
    /// relayed (an upstream that sent more than it announced cannot be trusted with another
    /// request). The caller has checked that the answer lets the connection stay open.
    pub(crate) fn keep(&self, conn: Conn) {
        if !conn.read.is_empty() {
            return;
        }
        if let Ok(mut slot) = self.0.lock() {
            *slot = Some(conn);
        }
    }
}

/// How a request's body goes upstream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outgoing {
    /// None; `content-length: 0` is written when the request came with a `content-length`.
    Empty {
        length_field: bool,
    },
    Length(u64),
    Chunked,
}

/// Writes a request head into `out`: `METHOD target HTTP/1.1`, `host` (from `host` when the
/// fields have none), the fields but `content-length` and `transfer-encoding`, and the framing
/// of `body`. Every part was checked when it was parsed (method, target, names and values carry
/// no CR, LF or space where they may not), so nothing written here can split the request.
pub(crate) fn encode_head(
    out: &mut Vec<u8>,
    method: &Method,
    target: &str,
    fields: &HeaderMap,
    host: &HeaderValue,
    body: Outgoing,
) {
    out.clear();
    out.extend_from_slice(method.as_str().as_bytes());
    out.push(b' ');
    out.extend_from_slice(target.as_bytes());
    out.extend_from_slice(b" HTTP/1.1\r\n");
    if !fields.contains_key(header::HOST) {
        put_field(out, b"host", host.as_bytes());
    }
    for (name, value) in fields {
        if name != header::CONTENT_LENGTH && name != header::TRANSFER_ENCODING {
            put_field(out, name.as_str().as_bytes(), value.as_bytes());
        }
    }
    match body {
        Outgoing::Empty { length_field: true } => out.extend_from_slice(b"content-length: 0\r\n"),
        Outgoing::Empty {
            length_field: false,
        } => {}
        Outgoing::Length(length) => {
            // Writing into a Vec cannot fail.
            let _ = write!(out, "content-length: {length}\r\n");
        }
        Outgoing::Chunked => out.extend_from_slice(b"transfer-encoding: chunked\r\n"),
    }
    out.extend_from_slice(b"\r\n");
}

fn put_field(out: &mut Vec<u8>, name: &[u8], value: &[u8]) {
    out.extend_from_slice(name);
    out.extend_from_slice(b": ");
    out.extend_from_slice(value);
    out.extend_from_slice(b"\r\n");
}

/// Writes all of `data`, waiting while the socket is full. On failure, says whether any of it
/// had been written.
pub(crate) async fn write_all(io: &TcpStream, mut data: &[u8]) -> Result<(), (io::Error, bool)> {
    let mut written = false;
    while !data.is_empty() {
        match io.try_write(data) {
            Ok(0) => return Err((io::ErrorKind::WriteZero.into(), written)),
            Ok(n) => {
                data = &data[n..];
                written = true;
            }
            Err(err) if err.kind() == io::ErrorKind::WouldBlock => {
                io.writable().await.map_err(|err| (err, written))?;
            }
            Err(err) => return Err((err, written)),
        }
    }
    Ok(())
}

/// Writes all of `data`, waiting while the socket is full.
pub(crate) async fn write_whole(io: &TcpStream, data: &[u8]) -> io::Result<()> {
    write_all(io, data).await.map_err(|(err, _)| err)
}

/// Writes one chunk of a chunked body: its size line, `data`, and its CRLF. `scratch` holds the
/// framing, and small data with it, so a small chunk is one write.
pub(crate) async fn write_chunk(
    io: &TcpStream,
    scratch: &mut Vec<u8>,
    data: &[u8],
) -> io::Result<()> {
    const COPIED: usize = 8 * 1024;
    scratch.clear();
    let _ = write!(scratch, "{:x}\r\n", data.len());
    if data.len() <= COPIED {
        scratch.extend_from_slice(data);
        scratch.extend_from_slice(b"\r\n");
        return write_whole(io, scratch).await;
    }
    write_whole(io, scratch).await?;
    write_whole(io, data).await?;
    write_whole(io, b"\r\n").await
}

/// Writes the end of a chunked body: the last chunk and the trailer fields, if any.
pub(crate) async fn write_last_chunk(
    io: &TcpStream,
    scratch: &mut Vec<u8>,
    trailers: Option<&HeaderMap>,
) -> io::Result<()> {
    scratch.clear();
    scratch.extend_from_slice(b"0\r\n");
    for (name, value) in trailers.into_iter().flatten() {
        put_field(scratch, name.as_str().as_bytes(), value.as_bytes());
    }
    scratch.extend_from_slice(b"\r\n");
    write_whole(io, scratch).await
}

/// A response head read from the upstream, with how its body is framed.
#[derive(Debug)]
pub(crate) struct Head {
    pub(crate) response: Response<()>,
    /// `None`: the answer has no body.
    pub(crate) framing: Option<Framing>,
    /// Whether the connection can carry another request once this answer has been read.
    pub(crate) keep: bool,
    /// A `101 Switching Protocols` to a request that asked for an upgrade: the connection now
    /// speaks the protocol named in the answer's `upgrade` field, and is the upgrade's tunnel.
    pub(crate) switched: bool,
}

/// Reads the upstream's answer head, skipping interim (1xx) answers; a `101` ends the head only
/// when the request asked for an `upgrade` (it is refused otherwise).
pub(crate) async fn read_head(
    io: &TcpStream,
    read: &mut BytesMut,
    method: &Method,
    upgrade: bool,
) -> Result<Head, H1Error> {
    let mut answered = false;
    loop {
        if !read.is_empty() {
            answered = true;
            if let Some(head) = parse_head(read, method, upgrade)? {
                return Ok(head);
            }
        }
        read.reserve(READ_ROOM);
        match io.try_read_buf(read) {
            Ok(0) if answered => return Err(H1Error::Truncated),
            Ok(0) => return Err(H1Error::Unanswered),
            Ok(_) => {}
            Err(err) if err.kind() == io::ErrorKind::WouldBlock => io.readable().await?,
            Err(_) if !answered => return Err(H1Error::Unanswered),
            Err(err) => return Err(err.into()),
        }
    }
}

/// Parses the answer head at the start of `read`, taking it (and any interim answers before it)
/// off the buffer: `None` while it is incomplete. The fields' values are slices of the buffer,
/// not copies. A `101` is the answer ([`Head::switched`]) when the request asked for an
/// `upgrade`, and a fault otherwise.
pub(crate) fn parse_head(
    read: &mut BytesMut,
    method: &Method,
    upgrade: bool,
) -> Result<Option<Head>, H1Error> {
    loop {
        // Where each field's name and value lie in the head, so that the head can be split off
        // the buffer after parsing and the values taken as slices of it. A head is at most
        // `MAX_HEAD` bytes, so every offset and length fits in 16 bits.
        let mut spans = [[0u16; 4]; MAX_FIELDS];
        let (length, code, minor, count) = {
            let mut fields = [const { MaybeUninit::uninit() }; MAX_FIELDS];
            let mut parsed = httparse::Response::new(&mut []);
            let parsing = httparse::ParserConfig::default().parse_response_with_uninit_headers(
                &mut parsed,
                read,
                &mut fields,
            );
            let length = match parsing {
                Ok(httparse::Status::Complete(length)) => length,
                Ok(httparse::Status::Partial) if read.len() >= MAX_HEAD => {
                    return Err(H1Error::HeadTooLarge);
                }
                Ok(httparse::Status::Partial) => return Ok(None),
                Err(httparse::Error::TooManyHeaders) => return Err(H1Error::HeadTooLarge),
                Err(err) => return Err(H1Error::Head(err)),
            };
            if length >= MAX_HEAD {
                return Err(H1Error::HeadTooLarge);
            }
            let base = read.as_ptr() as usize;
            let offset = |part: &[u8]| (part.as_ptr() as usize - base) as u16;
            for (span, field) in spans.iter_mut().zip(parsed.headers.iter()) {
                *span = [
                    offset(field.name.as_bytes()),
                    field.name.len() as u16,
                    offset(field.value),
                    field.value.len() as u16,
                ];
            }
            // A complete parse always has a code and a version.
            (
                length,
                parsed.code.unwrap_or_default(),
                parsed.version.unwrap_or_default(),
                parsed.headers.len(),
            )
        };
        let status = StatusCode::from_u16(code).map_err(|_| H1Error::Field("status code"))?;
        let switched = status == StatusCode::SWITCHING_PROTOCOLS;
        if switched && !upgrade {
            return Err(H1Error::Upgrade);
        }
        if status.is_informational() && !switched {
            // `100 Continue` and its kind come before the answer; they are not relayed.
            read.advance(length);
            continue;
        }
        let head = read.split_to(length).freeze();
        let mut fields = HeaderMap::with_capacity(count);
        for span in &spans[..count] {
            let [name, name_len, value, value_len] = span.map(usize::from);
            let name = HeaderName::from_bytes(&head[name..name + name_len])
                .map_err(|_| H1Error::Field("a field name"))?;
            let value = HeaderValue::from_maybe_shared(head.slice(value..value + value_len))
                .map_err(|_| H1Error::Field("a field value"))?;
            fields.append(name, value);
        }
        // After a `101` the connection is the tunnel's: no body, never kept.
        let (framing, keep) = if switched {
            (None, false)
        } else {
            framing(&mut fields, status, method, minor == 1)?
        };
        let mut response = Response::new(());
        *response.status_mut() = status;
        *response.headers_mut() = fields;
        return Ok(Some(Head {
            response,
            framing,
            keep,
            switched,
        }));
    }
}

/// How an answer's body is framed (RFC 9112 §6.3), and whether its connection stays open after
/// it. A `content-length` beside a `transfer-encoding` is removed (the encoding wins, and the
/// connection is not reused after such an answer).
fn framing(
    fields: &mut HeaderMap,
    status: StatusCode,
    method: &Method,
    http11: bool,
) -> Result<(Option<Framing>, bool), H1Error> {
    let mut keep = http11;
    for value in fields.get_all(header::CONNECTION) {
        for token in value.as_bytes().split(|&b| b == b',') {
            let token = token.trim_ascii();
            if token.eq_ignore_ascii_case(b"close") {
                keep = false;
            } else if token.eq_ignore_ascii_case(b"keep-alive") && !http11 {
                keep = true;
            }
        }
    }
    if method == Method::HEAD
        || status == StatusCode::NO_CONTENT
        || status == StatusCode::NOT_MODIFIED
    {
        return Ok((None, keep));
    }
    if fields.contains_key(header::TRANSFER_ENCODING) {
        if fields.remove(header::CONTENT_LENGTH).is_some() || !http11 {
            keep = false;
        }
        // Chunked only when it is the last coding; any other is read to the close.
        let chunked = fields
            .get_all(header::TRANSFER_ENCODING)
            .iter()
            .next_back()
            .and_then(|value| value.as_bytes().rsplit(|&b| b == b',').next())
            .is_some_and(|last| last.trim_ascii().eq_ignore_ascii_case(b"chunked"));
        if chunked {
            return Ok((Some(Framing::Chunked(Chunk::Size)), keep));
        }
        return Ok((Some(Framing::Close), false));
    }
    let mut length = None;
    for value in fields.get_all(header::CONTENT_LENGTH) {
        // `5` or, repeated, `5, 5`: every value must be the same number.
        for part in value.as_bytes().split(|&b| b == b',') {
            let part = part.trim_ascii();
            if part.is_empty() || part.len() > 19 || !part.iter().all(u8::is_ascii_digit) {
                return Err(H1Error::Length);
            }
            let n = part
                .iter()
                .fold(0u64, |n, digit| n * 10 + u64::from(digit - b'0'));
            if length.is_some_and(|seen| seen != n) {
                return Err(H1Error::Length);
            }
            length = Some(n);
        }
    }
    Ok(match length {
        Some(0) => (None, keep),
        Some(n) => (Some(Framing::Length(n)), keep),
        None => (Some(Framing::Close), false),
    })
}

/// How the rest of an answer's body is framed, and where its reading stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Framing {
    /// This many bytes are still to come.
    Length(u64),
    Chunked(Chunk),
    /// Everything until the upstream closes the connection.
    Close,
}

/// Where the reading of a chunked body stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Chunk {
    /// A chunk-size line comes next.
    Size,
    /// This many bytes of the current chunk are still to come.
    Data(u64),
    /// The CRLF after a chunk's data.
    DataEnd,
    /// The trailer section, after the last chunk.
    Trailers,
}

/// What [`Framing::decode`] found in the buffer.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Decoded {
    Data(Bytes),
    /// More must be read first.
    More,
    /// The body has ended, with these trailer fields.
    End(Option<HeaderMap>),
}

impl Framing {
    /// Takes the next piece of the body off `read`.
    pub(crate) fn decode(&mut self, read: &mut BytesMut) -> Result<Decoded, H1Error> {
        loop {
            match self {
                Framing::Length(0) => return Ok(Decoded::End(None)),
                Framing::Length(left) | Framing::Chunked(Chunk::Data(left @ 1..)) => {
                    if read.is_empty() {
                        return Ok(Decoded::More);
                    }
                    let take = (*left).min(read.len() as u64);
                    *left -= take;
                    return Ok(Decoded::Data(read.split_to(take as usize).freeze()));
                }
                Framing::Close => {
                    if read.is_empty() {
                        return Ok(Decoded::More);
                    }
                    return Ok(Decoded::Data(read.split().freeze()));
                }
                Framing::Chunked(chunk) => match chunk {
                    // A chunk's data taken whole (with data left, the arm above).
                    Chunk::Data(_) => *chunk = Chunk::DataEnd,
                    Chunk::Size => match httparse::parse_chunk_size(read) {
                        Ok(httparse::Status::Complete((used, size))) => {
                            // httparse reads an empty size as 0 (a last chunk) and lets a bare
                            // LF into an extension; RFC 9112 §7.1 allows neither (`chunk-size =
                            // 1*HEXDIG`, the line ends at CRLF), and a peer that reads the line
                            // another way would frame the body differently.
                            if !read[0].is_ascii_hexdigit() || read[..used - 1].contains(&b'\n') {
                                return Err(H1Error::Chunk);
                            }
                            read.advance(used);
                            *chunk = if size == 0 {
                                Chunk::Trailers
                            } else {
                                Chunk::Data(size)
                            };
                        }
                        Ok(httparse::Status::Partial) if read.len() > MAX_CHUNK_LINE => {
                            return Err(H1Error::Chunk);
                        }
                        Ok(httparse::Status::Partial) => return Ok(Decoded::More),
                        Err(_) => return Err(H1Error::Chunk),
                    },
                    Chunk::DataEnd => {
                        if read.len() < 2 {
                            return Ok(Decoded::More);
                        }
                        if &read[..2] != b"\r\n" {
                            return Err(H1Error::Chunk);
                        }
                        read.advance(2);
                        *chunk = Chunk::Size;
                    }
                    Chunk::Trailers => {
                        let mut fields = [httparse::EMPTY_HEADER; 64];
                        let (used, trailers) = match httparse::parse_headers(read, &mut fields) {
                            Ok(httparse::Status::Complete((used, fields))) => {
                                (used, trailer_map(fields)?)
                            }
                            Ok(httparse::Status::Partial) if read.len() > MAX_HEAD => {
                                return Err(H1Error::HeadTooLarge);
                            }
                            Ok(httparse::Status::Partial) => return Ok(Decoded::More),
                            Err(_) => return Err(H1Error::Chunk),
                        };
                        read.advance(used);
                        *self = Framing::Length(0);
                        return Ok(Decoded::End(trailers));
                    }
                },
            }
        }
    }

    /// What the end of the connection means here: the end of a body read to the close, a
    /// truncated body otherwise.
    fn at_close(self) -> Result<(), H1Error> {
        match self {
            Framing::Close => Ok(()),
            _ => Err(H1Error::Truncated),
        }
    }

    /// Whether the whole body has been taken.
    fn done(self) -> bool {
        self == Framing::Length(0)
    }
}

/// Trailer fields, copied (they are rare); `None` when there are none.
fn trailer_map(fields: &[httparse::Header<'_>]) -> Result<Option<HeaderMap>, H1Error> {
    if fields.is_empty() {
        return Ok(None);
    }
    let mut map = HeaderMap::with_capacity(fields.len());
    for field in fields {
        let name = HeaderName::from_bytes(field.name.as_bytes())
            .map_err(|_| H1Error::Field("a trailer name"))?;
        let value =
            HeaderValue::from_bytes(field.value).map_err(|_| H1Error::Field("a trailer value"))?;
        map.append(name, value);
    }
    Ok(Some(map))
}

/// The body of an upstream HTTP/1.1 answer, read off its connection as the downstream side asks
/// for it. Once read whole the connection goes back to its [`UpstreamSlot`] for the next request (if the
/// answer let it stay open); an answer dropped before its end closes the connection, since the
/// rest of it is still coming.
pub(crate) struct Reading {
    /// `None` once the body has ended or failed.
    conn: Option<Conn>,
    framing: Framing,
    keep: bool,
    home: Arc<UpstreamSlot>,
}

impl Reading {
    pub(crate) fn new(conn: Conn, framing: Framing, keep: bool, home: Arc<UpstreamSlot>) -> Self {
        Self {
            conn: Some(conn),
            framing,
            keep,
            home,
        }
    }

    fn end(&mut self) {
        if let Some(conn) = self.conn.take()
            && self.keep
        {
            self.home.keep(conn);
        }
    }
}

impl Body for Reading {
    type Data = Bytes;
    type Error = H1Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, H1Error>>> {
        let this = &mut *self;
        loop {
            let Some(conn) = this.conn.as_mut() else {
                return Poll::Ready(None);
            };
            let failed = match this.framing.decode(&mut conn.read) {
                Ok(Decoded::Data(data)) => {
                    if this.framing.done() {
                        this.end();
                    }
                    return Poll::Ready(Some(Ok(Frame::data(data))));
                }
                Ok(Decoded::End(trailers)) => {
                    this.end();
                    return Poll::Ready(trailers.map(|trailers| Ok(Frame::trailers(trailers))));
                }
                Ok(Decoded::More) => match ready!(conn.poll_fill(cx)) {
                    Ok(0) => match this.framing.at_close() {
                        Ok(()) => {
                            this.conn = None;
                            return Poll::Ready(None);
                        }
                        Err(err) => err,
                    },
                    Ok(_) => continue,
                    Err(err) => err.into(),
                },
                Err(err) => err,
            };
            this.conn = None;
            return Poll::Ready(Some(Err(failed)));
        }
    }

    fn is_end_stream(&self) -> bool {
        // The connection goes (back to its link, or closed) as the body ends.
        self.conn.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        match self.framing {
            Framing::Length(left) => SizeHint::with_exact(left),
            _ => SizeHint::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(bytes: &[u8], method: &Method) -> Result<Option<Head>, H1Error> {
        parse_head(&mut BytesMut::from(bytes), method, false)
    }

    #[test]
    fn a_response_head_is_parsed_and_taken_off_the_buffer() {
        let mut read = BytesMut::from(
            &b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nX-Trace: a b\r\nx-trace: c\r\n\r\nhello"[..],
        );
        let head = parse_head(&mut read, &Method::GET, false).unwrap().unwrap();
        assert_eq!(head.response.status(), StatusCode::OK);
        let fields = head.response.headers();
        assert_eq!(fields["content-length"], "5");
        let traces: Vec<_> = fields.get_all("x-trace").iter().collect();
        assert_eq!(traces, ["a b", "c"]);
        assert_eq!(head.framing, Some(Framing::Length(5)));
        assert!(head.keep);
        assert_eq!(&read[..], b"hello");
    }

    #[test]
    fn an_incomplete_head_waits_and_a_huge_one_is_refused() {
        assert!(
            head(b"HTTP/1.1 200 OK\r\ncontent-le", &Method::GET)
                .unwrap()
                .is_none()
        );
        let mut huge = b"HTTP/1.1 200 OK\r\nx-big: ".to_vec();
        huge.resize(MAX_HEAD + 10, b'a');
        assert!(matches!(
            head(&huge, &Method::GET),
            Err(H1Error::HeadTooLarge)
        ));
        let mut many = b"HTTP/1.1 200 OK\r\n".to_vec();
        for n in 0..=MAX_FIELDS {
            many.extend_from_slice(format!("x-{n}: {n}\r\n").as_bytes());
        }
        many.extend_from_slice(b"\r\n");
        assert!(matches!(
            head(&many, &Method::GET),
            Err(H1Error::HeadTooLarge)
        ));
        assert!(matches!(
            head(b"HTTQ/1.1 200 OK\r\n\r\n", &Method::GET),
            Err(H1Error::Head(_))
        ));
    }

    #[test]
    fn interim_answers_are_skipped_and_101_is_refused() {
        let mut read =
            BytesMut::from(&b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 201 Created\r\n\r\n"[..]);
        let head = parse_head(&mut read, &Method::POST, false)
            .unwrap()
            .unwrap();
        assert_eq!(head.response.status(), StatusCode::CREATED);
        assert!(read.is_empty());
        assert!(matches!(
            self::head(
                b"HTTP/1.1 101 Switching\r\nupgrade: x\r\n\r\n",
                &Method::GET
            ),
            Err(H1Error::Upgrade)
        ));
    }

    #[test]
    fn framing_follows_rfc_9112() {
        let framing_of = |bytes: &[u8], method: &Method| {
            let head = head(bytes, method).unwrap().unwrap();
            (head.framing, head.keep)
        };
        // No body: HEAD, 204, 304, a zero length.
        assert_eq!(
            framing_of(
                b"HTTP/1.1 200 OK\r\ncontent-length: 9\r\n\r\n",
                &Method::HEAD
            ),
            (None, true)
        );
        assert_eq!(
            framing_of(b"HTTP/1.1 204 No Content\r\n\r\n", &Method::GET),
            (None, true)
        );
        assert_eq!(
            framing_of(b"HTTP/1.1 304 Not Modified\r\n\r\n", &Method::GET),
            (None, true)
        );
        assert_eq!(
            framing_of(
                b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n",
                &Method::GET
            ),
            (None, true)
        );
        // Chunked wins over a length, and the connection is not reused after.
        let both = head(
            b"HTTP/1.1 200 OK\r\ncontent-length: 3\r\ntransfer-encoding: chunked\r\n\r\n",
            &Method::GET,
        )
        .unwrap()
        .unwrap();
        assert_eq!(both.framing, Some(Framing::Chunked(Chunk::Size)));
        assert!(!both.keep);
        assert!(both.response.headers().get("content-length").is_none());
        // An encoding that does not end in chunked, or no length at all: read to the close.
        assert_eq!(
            framing_of(
                b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked, gzip\r\n\r\n",
                &Method::GET
            ),
            (Some(Framing::Close), false)
        );
        assert_eq!(
            framing_of(b"HTTP/1.1 200 OK\r\n\r\n", &Method::GET),
            (Some(Framing::Close), false)
        );
        // Repeated equal lengths are one length; HTTP/1.0 closes unless kept alive.
        assert_eq!(
            framing_of(
                b"HTTP/1.0 200 OK\r\ncontent-length: 4, 4\r\ncontent-length: 4\r\n\r\n",
                &Method::GET
            ),
            (Some(Framing::Length(4)), false)
        );
        assert_eq!(
            framing_of(
                b"HTTP/1.0 200 OK\r\nconnection: keep-alive\r\ncontent-length: 4\r\n\r\n",
                &Method::GET
            ),
            (Some(Framing::Length(4)), true)
        );
        assert_eq!(
            framing_of(
                b"HTTP/1.1 200 OK\r\nconnection: Close\r\ncontent-length: 4\r\n\r\n",
                &Method::GET
            ),
            (Some(Framing::Length(4)), false)
        );
        for bad in [
            &b"HTTP/1.1 200 OK\r\ncontent-length: 4\r\ncontent-length: 5\r\n\r\n"[..],
            b"HTTP/1.1 200 OK\r\ncontent-length: -1\r\n\r\n",
            b"HTTP/1.1 200 OK\r\ncontent-length: 0x10\r\n\r\n",
            b"HTTP/1.1 200 OK\r\ncontent-length: 99999999999999999999\r\n\r\n",
            b"HTTP/1.1 200 OK\r\ncontent-length: \r\n\r\n",
        ] {
            assert!(
                matches!(head(bad, &Method::GET), Err(H1Error::Length)),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    /// Decodes all of `wire` with `framing`, fed in pieces of `step` bytes: the body, the
    /// trailers and how many bytes of `wire` were left after the body, or the error.
    fn decode_all(
        mut framing: Framing,
        wire: &[u8],
        step: usize,
    ) -> Result<(Vec<u8>, Option<HeaderMap>, usize), H1Error> {
        let mut read = BytesMut::new();
        let mut fed = 0;
        let mut body = Vec::new();
        loop {
            match framing.decode(&mut read)? {
                Decoded::Data(data) => body.extend_from_slice(&data),
                Decoded::End(trailers) => {
                    return Ok((body, trailers, read.len() + wire.len() - fed));
                }
                Decoded::More if fed >= wire.len() => {
                    framing.at_close()?;
                    return Ok((body, None, 0));
                }
                Decoded::More => {
                    let next = (fed + step).min(wire.len());
                    read.extend_from_slice(&wire[fed..next]);
                    fed = next;
                }
            }
        }
    }

    #[test]
    fn chunked_bodies_decode_with_extensions_and_trailers_in_any_pieces() {
        let wire = b"5;name=value\r\nhello\r\n6\r\n world\r\n0\r\nx-checksum: 42\r\n\r\nNEXT";
        for step in 1..wire.len() {
            let (body, trailers, left) =
                decode_all(Framing::Chunked(Chunk::Size), wire, step).unwrap();
            assert_eq!(body, b"hello world", "step {step}");
            assert_eq!(trailers.unwrap()["x-checksum"], "42");
            // What follows the body is left for the next answer.
            assert_eq!(left, 4, "step {step}");
        }
        let (body, trailers, _) =
            decode_all(Framing::Chunked(Chunk::Size), b"3\r\nabc\r\n0\r\n\r\n", 100).unwrap();
        assert_eq!(body, b"abc");
        assert!(trailers.is_none());
    }

    #[test]
    fn malformed_or_truncated_bodies_fail() {
        for bad in [
            &b"5\r\nhelloXX0\r\n\r\n"[..],
            b"zz\r\nhello\r\n",
            b"ffffffffffffffffff\r\n",
        ] {
            assert!(
                matches!(
                    decode_all(Framing::Chunked(Chunk::Size), bad, 3),
                    Err(H1Error::Chunk)
                ),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
        assert!(matches!(
            decode_all(Framing::Chunked(Chunk::Size), b"5\r\nhel", 2),
            Err(H1Error::Truncated)
        ));
        assert!(matches!(
            decode_all(Framing::Length(10), b"hello", 2),
            Err(H1Error::Truncated)
        ));
        let (body, _, left) = decode_all(Framing::Length(5), b"helloEXTRA", 3).unwrap();
        assert_eq!(body, b"hello");
        assert_eq!(left, 5);
        let (body, _, _) = decode_all(Framing::Close, b"to the end", 4).unwrap();
        assert_eq!(body, b"to the end");
    }

    #[test]
    fn a_request_head_carries_its_fields_and_the_body_framing() {
        let mut fields = HeaderMap::new();
        fields.insert("x-user-id", "alice".parse().unwrap());
        fields.insert("content-length", "99".parse().unwrap());
        fields.insert("transfer-encoding", "chunked".parse().unwrap());
        let host = HeaderValue::from_static("upstream:80");
        let mut out = Vec::new();
        encode_head(
            &mut out,
            &Method::POST,
            "/a?b=c",
            &fields,
            &host,
            Outgoing::Length(3),
        );
        assert_eq!(
            out,
            b"POST /a?b=c HTTP/1.1\r\nhost: upstream:80\r\nx-user-id: alice\r\ncontent-length: 3\r\n\r\n"
        );
        fields.insert("host", "app".parse().unwrap());
        encode_head(
            &mut out,
            &Method::PUT,
            "/",
            &fields,
            &host,
            Outgoing::Chunked,
        );
        let text = String::from_utf8(out.clone()).unwrap();
        assert!(text.starts_with("PUT / HTTP/1.1\r\n"));
        assert!(text.contains("host: app\r\n") && !text.contains("upstream:80"));
        assert!(text.ends_with("transfer-encoding: chunked\r\n\r\n"));
        assert!(!text.contains("content-length"));
        encode_head(
            &mut out,
            &Method::GET,
            "/",
            &HeaderMap::new(),
            &host,
            Outgoing::Empty {
                length_field: false,
            },
        );
        assert_eq!(out, b"GET / HTTP/1.1\r\nhost: upstream:80\r\n\r\n");
    }

    mod fuzz {
        use super::*;
        use proptest::prelude::*;

        proptest! {
            /// Any bytes at all: the head parser answers (a head, more please, or an error) and
            /// never panics, and a head it returns was taken off the buffer.
            #[test]
            fn any_bytes_parse_or_fail_cleanly(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
                let mut read = BytesMut::from(&bytes[..]);
                if let Ok(Some(_)) = parse_head(&mut read, &Method::GET, false) {
                    prop_assert!(read.len() < bytes.len());
                }
            }

            /// Response-like text with fields mixed from the ones that decide framing.
            #[test]
            fn response_like_heads_parse_or_fail_cleanly(
                code in 100u16..600,
                fields in proptest::collection::vec(
                    (prop_oneof![
                        Just("content-length"), Just("transfer-encoding"), Just("connection"),
                        Just("x-other"), Just("Content-Length")
                    ], "[ -~]{0,12}"),
                    0..6,
                ),
                body in proptest::collection::vec(any::<u8>(), 0..64),
            ) {
                let mut wire = format!("HTTP/1.1 {code} X\r\n").into_bytes();
                for (name, value) in &fields {
                    wire.extend_from_slice(format!("{name}: {value}\r\n").as_bytes());
                }
                wire.extend_from_slice(b"\r\n");
                wire.extend_from_slice(&body);
                let mut read = BytesMut::from(&wire[..]);
                if let Ok(Some(head)) = parse_head(&mut read, &Method::GET, false)
                    && let Some(mut framing) = head.framing
                {
                    // Whatever the framing, decoding what follows ends or fails cleanly.
                    for _ in 0..256 {
                        match framing.decode(&mut read) {
                            Ok(Decoded::Data(_)) => {}
                            _ => break,
                        }
                    }
                }
            }

            /// Chunked bodies made of any chunks decode to their data, fed in any pieces.
            #[test]
            fn chunked_bodies_round_trip(
                chunks in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 1..40), 0..6),
                step in 1usize..50,
            ) {
                let mut wire = Vec::new();
                for chunk in &chunks {
                    wire.extend_from_slice(format!("{:X}\r\n", chunk.len()).as_bytes());
                    wire.extend_from_slice(chunk);
                    wire.extend_from_slice(b"\r\n");
                }
                wire.extend_from_slice(b"0\r\n\r\n");
                let (body, trailers, left) = decode_all(Framing::Chunked(Chunk::Size), &wire, step).unwrap();
                prop_assert_eq!(body, chunks.concat());
                prop_assert!(trailers.is_none());
                prop_assert_eq!(left, 0);
            }

            /// Arbitrary bytes as a chunked body: decoded, more wanted, or refused, never a panic.
            #[test]
            fn any_chunked_bytes_decode_or_fail_cleanly(
                wire in proptest::collection::vec(any::<u8>(), 0..256),
                step in 1usize..64,
            ) {
                let _ = decode_all(Framing::Chunked(Chunk::Size), &wire, step);
            }
        }
    }
}

#[cfg(test)]
#[path = "h1_differential.rs"]
mod differential;
