//! Token budgets' costs read from the response as it streams to the client: a header, a
//! trailer, a path in a JSON body (a streaming scan that keeps only the value it is after) or
//! in the last server-sent event that carries it. A gzip or deflate body is inflated alongside
//! for the scan, a piece at a time. Nothing here holds the body back or copies it whole; a cost
//! that cannot be read is charged the bucket's default and counted.

use std::io::Write;
use std::sync::Arc;

use bytes::Bytes;
use http::HeaderMap;
use hyper::body::Frame;
use spillway_client::BudgetCharge;
use spillway_core::config::ResponseSource;

use crate::shared::Shared;

/// The largest value a JSON scan captures, and the longest SSE event it parses: a usage
/// object is a few hundred bytes.
const CAPTURE_MAX: usize = 64 * 1024;

/// The most a compressed body is inflated for its scan: an LLM's answer is at most a few MiB,
/// and a small body that inflates past this (a decompression bomb) is not worth the CPU. Past
/// it the cost is unreported.
const INFLATED_MAX: u64 = 64 * 1024 * 1024;

/// The costs of one response's token budgets, settled when the body ends or is dropped.
pub(crate) struct Meter {
    shared: Arc<Shared>,
    charges: Vec<(BudgetCharge, Reader)>,
    settled: bool,
}

enum Reader {
    /// Known from the head (a header), or never (a trailer's name awaited).
    Known(Option<serde_json::Value>),
    Trailer(http::HeaderName, Option<serde_json::Value>),
    Body(Box<Decoded>),
}

/// A body's content coding, as far as a scan can read it.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Coding {
    Identity,
    Gzip,
    /// HTTP's `deflate`: the zlib format.
    Deflate,
    /// Any other coding (br, zstd, several codings): not read, the cost unreported.
    Unreadable,
}

impl Coding {
    fn of(headers: &HeaderMap) -> Self {
        let mut codings = headers
            .get_all(http::header::CONTENT_ENCODING)
            .iter()
            .flat_map(|v| v.as_bytes().split(|&b| b == b','))
            .map(<[u8]>::trim_ascii)
            .filter(|c| !c.is_empty() && !c.eq_ignore_ascii_case(b"identity"));
        let coding = match codings.next() {
            None => return Coding::Identity,
            Some(c) if c.eq_ignore_ascii_case(b"gzip") || c.eq_ignore_ascii_case(b"x-gzip") => {
                Coding::Gzip
            }
            Some(c) if c.eq_ignore_ascii_case(b"deflate") => Coding::Deflate,
            Some(_) => Coding::Unreadable,
        };
        if codings.next().is_some() {
            return Coding::Unreadable;
        }
        coding
    }
}

/// A scan of the body's JSON or of its events.
enum Scan {
    Json(JsonScan),
    Sse(SseScan),
}

impl Scan {
    fn feed(&mut self, bytes: &[u8]) {
        match self {
            Scan::Json(scan) => scan.feed(bytes),
            Scan::Sse(scan) => scan.feed(bytes),
        }
    }

    fn finish(&mut self) -> Option<serde_json::Value> {
        match self {
            Scan::Json(scan) => scan.finish(),
            Scan::Sse(scan) => scan.finish(),
        }
    }
}

/// Where an inflater writes: straight into the scan, never into a buffer of the whole body,
/// and no further than [`INFLATED_MAX`].
struct Inflated {
    scan: Scan,
    bytes: u64,
    limit: u64,
}

impl Write for Inflated {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.bytes += buf.len() as u64;
        if self.bytes > self.limit {
            return Err(std::io::Error::other("inflated past the bound"));
        }
        self.scan.feed(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The body as the scan reads it: as it came, or inflated on the way.
enum Decoded {
    Plain(Scan),
    Gzip(flate2::write::GzDecoder<Inflated>),
    Deflate(flate2::write::ZlibDecoder<Inflated>),
    /// The coding was broken, or inflated past its bound: nothing the scan saw counts.
    Broken,
}

impl Decoded {
    fn new(scan: Scan, coding: Coding) -> Self {
        Self::inflating_at_most(scan, coding, INFLATED_MAX)
    }

    fn inflating_at_most(scan: Scan, coding: Coding, limit: u64) -> Self {
        let inflated = Inflated {
            scan,
            bytes: 0,
            limit,
        };
        match coding {
            Coding::Identity | Coding::Unreadable => Decoded::Plain(inflated.scan),
            Coding::Gzip => Decoded::Gzip(flate2::write::GzDecoder::new(inflated)),
            Coding::Deflate => Decoded::Deflate(flate2::write::ZlibDecoder::new(inflated)),
        }
    }

    fn feed(&mut self, bytes: &[u8]) {
        let written = match self {
            Decoded::Plain(scan) => {
                scan.feed(bytes);
                Ok(())
            }
            Decoded::Gzip(inflater) => inflater.write_all(bytes),
            Decoded::Deflate(inflater) => inflater.write_all(bytes),
            Decoded::Broken => Ok(()),
        };
        if written.is_err() {
            *self = Decoded::Broken;
        }
    }

    /// What the scan found, if the body (and its coding) ended whole.
    fn finish(&mut self) -> Option<serde_json::Value> {
        match self {
            Decoded::Plain(scan) => scan.finish(),
            Decoded::Gzip(inflater) => {
                inflater.try_finish().ok()?;
                inflater.get_mut().scan.finish()
            }
            Decoded::Deflate(inflater) => {
                inflater.try_finish().ok()?;
                inflater.get_mut().scan.finish()
            }
            Decoded::Broken => None,
        }
    }
}

fn number(text: &[u8]) -> Option<serde_json::Value> {
    let text = std::str::from_utf8(text).ok()?.trim();
    text.parse::<u64>().ok().map(serde_json::Value::from)
}

impl Meter {
    /// A meter for `charges` of a response with `headers`.
    pub(crate) fn new(
        shared: Arc<Shared>,
        charges: Vec<BudgetCharge>,
        headers: &HeaderMap,
    ) -> Self {
        let event_stream = headers
            .get(http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|ct| ct.trim_start().starts_with("text/event-stream"));
        let coding = Coding::of(headers);
        let charges = charges
            .into_iter()
            .map(|charge| {
                let reader = match charge.cost().source() {
                    ResponseSource::Header(name) => Reader::Known(
                        headers
                            .get(name.as_str())
                            .and_then(|v| number(v.as_bytes())),
                    ),
                    ResponseSource::Trailer(name) => {
                        match http::HeaderName::from_bytes(name.as_bytes()) {
                            Ok(name) => Reader::Trailer(name, None),
                            Err(_) => Reader::Known(None),
                        }
                    }
                    // Envoy's settlement call reports it; validation keeps it off HTTP buckets.
                    ResponseSource::HitsAddend => Reader::Known(None),
                    ResponseSource::Json(_) | ResponseSource::Sse(_)
                        if coding == Coding::Unreadable =>
                    {
                        Reader::Known(None)
                    }
                    ResponseSource::Json(path) | ResponseSource::Sse(path) => {
                        let scan = if event_stream {
                            Scan::Sse(SseScan::new(path.clone()))
                        } else {
                            Scan::Json(JsonScan::new(path.clone()))
                        };
                        Reader::Body(Box::new(Decoded::new(scan, coding)))
                    }
                };
                (charge, reader)
            })
            .collect();
        Self {
            shared,
            charges,
            settled: false,
        }
    }

    /// Reads what a frame of the body says.
    pub(crate) fn frame(&mut self, frame: &Frame<Bytes>) {
        if let Some(data) = frame.data_ref() {
            for (_, reader) in &mut self.charges {
                if let Reader::Body(body) = reader {
                    body.feed(data);
                }
            }
        } else if let Some(trailers) = frame.trailers_ref() {
            for (_, reader) in &mut self.charges {
                if let Reader::Trailer(name, found) = reader {
                    *found = trailers.get(&*name).and_then(|v| number(v.as_bytes()));
                }
            }
        }
    }

    /// Settles every charge with what the response reported: at the body's end, or when it is
    /// dropped (the client went away, the upstream cut it short).
    pub(crate) fn finish(&mut self) {
        if std::mem::replace(&mut self.settled, true) {
            return;
        }
        let now = self.shared.client.now();
        for (charge, reader) in self.charges.drain(..) {
            let value = match reader {
                Reader::Known(v) | Reader::Trailer(_, v) => v,
                Reader::Body(mut body) => body.finish(),
            };
            let reported = value.and_then(|v| charge.cost().cost_of(&v));
            if charge.in_redis() {
                // One Redis call per response, off the client's path.
                if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                    runtime.spawn(async move {
                        charge.settle_async(now, reported).await;
                    });
                }
            } else {
                charge.settle(now, reported);
            }
        }
    }
}

impl Drop for Meter {
    fn drop(&mut self) {
        self.finish();
    }
}

/// One level of the JSON document the scan is inside.
struct Level {
    object: bool,
    /// Whether this container lies on the path, as its `depth`-th step.
    on_path: bool,
    depth: usize,
    /// Whether the current key of this object is the path's next step.
    key_matches: bool,
    want_key: bool,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Lex {
    Between,
    Str { key: bool, escape: bool },
    Bare,
}

/// A streaming scan of a JSON document for the value at a path of object keys: it keeps the
/// stack of containers it is in, the key being read, and the bytes of the value at the path
/// (the last one seen), never the document.
pub(crate) struct JsonScan {
    path: Vec<String>,
    stack: Vec<Level>,
    lex: Lex,
    key: Vec<u8>,
    /// The value being captured and the depth it started at.
    capture: Option<(Vec<u8>, usize)>,
    found: Option<Vec<u8>>,
}

impl JsonScan {
    pub(crate) fn new(path: Vec<String>) -> Self {
        Self {
            path,
            stack: Vec::new(),
            lex: Lex::Between,
            key: Vec::new(),
            capture: None,
            found: None,
        }
    }

    pub(crate) fn feed(&mut self, bytes: &[u8]) {
        for &c in bytes {
            self.byte(c);
        }
    }

    fn byte(&mut self, c: u8) {
        if let Some((buf, _)) = &mut self.capture {
            if buf.len() < CAPTURE_MAX {
                buf.push(c);
            } else {
                self.capture = None;
            }
        }
        match self.lex {
            Lex::Str { key, escape } => {
                if escape {
                    self.lex = Lex::Str { key, escape: false };
                } else if c == b'\\' {
                    self.lex = Lex::Str { key, escape: true };
                } else if c == b'"' {
                    self.lex = Lex::Between;
                    if key {
                        let path = &self.path;
                        let key = &self.key;
                        if let Some(top) = self.stack.last_mut() {
                            top.key_matches = top.on_path
                                && path
                                    .get(top.depth)
                                    .is_some_and(|k| k.as_bytes() == key.as_slice());
                        }
                        self.key.clear();
                    } else {
                        self.value_done(false);
                    }
                } else if key && self.key.len() < 1024 {
                    self.key.push(c);
                }
            }
            Lex::Bare => {
                if matches!(c, b',' | b'}' | b']' | b' ' | b'\t' | b'\r' | b'\n') {
                    self.lex = Lex::Between;
                    self.value_done(true);
                    self.between(c);
                }
            }
            Lex::Between => self.between(c),
        }
    }

    fn between(&mut self, c: u8) {
        match c {
            b'"' => {
                if self
                    .stack
                    .last()
                    .is_some_and(|top| top.object && top.want_key)
                {
                    self.lex = Lex::Str {
                        key: true,
                        escape: false,
                    };
                } else {
                    self.start_value(c);
                    self.lex = Lex::Str {
                        key: false,
                        escape: false,
                    };
                }
            }
            b'{' | b'[' => {
                let (on_path, depth) = match self.stack.last() {
                    None => (true, 0),
                    Some(top) => (top.object && top.on_path && top.key_matches, top.depth + 1),
                };
                self.start_value(c);
                self.stack.push(Level {
                    object: c == b'{',
                    on_path,
                    depth,
                    key_matches: false,
                    want_key: true,
                });
            }
            b'}' | b']' => {
                self.stack.pop();
                self.value_done(false);
            }
            b':' => {
                if let Some(top) = self.stack.last_mut() {
                    top.want_key = false;
                }
            }
            b',' => {
                if let Some(top) = self.stack.last_mut()
                    && top.object
                {
                    top.want_key = true;
                    top.key_matches = false;
                }
            }
            b' ' | b'\t' | b'\r' | b'\n' => {}
            _ => {
                self.start_value(c);
                self.lex = Lex::Bare;
            }
        }
    }

    /// A value starts with `c`: captured when it is the one at the path.
    fn start_value(&mut self, c: u8) {
        if self.capture.is_some() {
            return;
        }
        if let Some(top) = self.stack.last()
            && top.object
            && top.on_path
            && top.key_matches
            && top.depth + 1 == self.path.len()
        {
            self.capture = Some((vec![c], self.stack.len()));
        }
    }

    /// A value ended; the captured one when back at its depth. `delimited`: the byte just
    /// captured ends a bare value and is not part of it.
    fn value_done(&mut self, delimited: bool) {
        if let Some((_, depth)) = &self.capture
            && *depth == self.stack.len()
            && let Some((mut buf, _)) = self.capture.take()
        {
            if delimited {
                buf.pop();
            }
            self.found = Some(buf);
        }
    }

    /// The value at the path, parsed: the last one the document held, if it was whole.
    pub(crate) fn finish(&mut self) -> Option<serde_json::Value> {
        if self.lex == Lex::Bare {
            // A bare value at the document's very end (never the path's: that is in an object).
            self.lex = Lex::Between;
        }
        let found = self.found.take()?;
        serde_json::from_slice(&found).ok()
    }
}

/// A scan of a `text/event-stream` body for the last `data:` event whose JSON holds the path.
pub(crate) struct SseScan {
    path: Vec<String>,
    line: Vec<u8>,
    /// The current line is longer than [`CAPTURE_MAX`] and is skipped.
    long: bool,
    data: Vec<u8>,
    found: Option<serde_json::Value>,
}

impl SseScan {
    pub(crate) fn new(path: Vec<String>) -> Self {
        Self {
            path,
            line: Vec::new(),
            long: false,
            data: Vec::new(),
            found: None,
        }
    }

    pub(crate) fn feed(&mut self, bytes: &[u8]) {
        for &c in bytes {
            if c == b'\n' {
                self.end_line();
            } else if self.line.len() < CAPTURE_MAX {
                self.line.push(c);
            } else {
                self.long = true;
            }
        }
    }

    fn end_line(&mut self) {
        let mut line = std::mem::take(&mut self.line);
        if line.last() == Some(&b'\r') {
            line.pop();
        }
        if std::mem::replace(&mut self.long, false) {
            return;
        }
        if line.is_empty() {
            self.dispatch();
        } else if let Some(rest) = line.strip_prefix(b"data:") {
            let rest = rest.strip_prefix(b" ").unwrap_or(rest);
            if !self.data.is_empty() {
                self.data.push(b'\n');
            }
            if self.data.len() + rest.len() <= CAPTURE_MAX {
                self.data.extend_from_slice(rest);
            }
        }
        line.clear();
        self.line = line;
    }

    fn dispatch(&mut self) {
        let data = std::mem::take(&mut self.data);
        if let Ok(event) = serde_json::from_slice::<serde_json::Value>(&data) {
            let mut at = &event;
            for step in &self.path {
                match at.get(step) {
                    Some(next) => at = next,
                    None => return,
                }
            }
            if !at.is_null() {
                self.found = Some(at.clone());
            }
        }
    }

    /// The path's value in the last event that carried it (an event cut short is not read).
    pub(crate) fn finish(&mut self) -> Option<serde_json::Value> {
        self.found.take()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scan(path: &str, chunks: &[&str]) -> Option<serde_json::Value> {
        let mut scan = JsonScan::new(path.split('.').map(str::to_owned).collect());
        for chunk in chunks {
            scan.feed(chunk.as_bytes());
        }
        scan.finish()
    }

    #[test]
    fn the_json_scan_finds_the_value_at_its_path_across_chunks() {
        let body = r#"{"id":"x","choices":[{"message":{"content":"a \"usage\": {\"total_tokens\": 9}"}}],"usage":{"prompt_tokens":12,"completion_tokens":30,"total_tokens":42}}"#;
        for split in [1, 7, 50, body.len()] {
            let (a, b) = body.split_at(split.min(body.len()));
            assert_eq!(
                scan("usage.total_tokens", &[a, b]),
                Some(42.into()),
                "split {split}"
            );
        }
        assert_eq!(
            scan("usage", &[body]),
            Some(serde_json::json!({"prompt_tokens":12,"completion_tokens":30,"total_tokens":42}))
        );
        // Keys of the same name deeper down or in arrays are not the path.
        assert_eq!(scan("content", &[body]), None);
        assert_eq!(
            scan(
                "usage.total_tokens",
                &[r#"{"usage": {"total_tokens" : 7 } }"#]
            ),
            Some(7.into())
        );
    }

    #[test]
    fn a_truncated_or_malformed_document_reports_nothing() {
        assert_eq!(
            scan("usage.total_tokens", &[r#"{"usage":{"total_tok"#]),
            None
        );
        assert_eq!(scan("usage", &[r#"{"usage":{"total_tokens":4"#]), None);
        assert_eq!(scan("usage.total_tokens", &["not json at all"]), None);
    }

    fn compressed(coding: Coding, body: &[u8]) -> Vec<u8> {
        let level = flate2::Compression::default();
        match coding {
            Coding::Gzip => {
                let mut e = flate2::write::GzEncoder::new(Vec::new(), level);
                e.write_all(body).unwrap();
                e.finish().unwrap()
            }
            Coding::Deflate => {
                let mut e = flate2::write::ZlibEncoder::new(Vec::new(), level);
                e.write_all(body).unwrap();
                e.finish().unwrap()
            }
            other => panic!("no encoder for {other:?}"),
        }
    }

    fn decoded(coding: Coding, chunks: &[&[u8]]) -> Option<serde_json::Value> {
        decoded_at_most(coding, chunks, INFLATED_MAX)
    }

    fn decoded_at_most(coding: Coding, chunks: &[&[u8]], limit: u64) -> Option<serde_json::Value> {
        let scan = Scan::Json(JsonScan::new(vec!["usage".into(), "total_tokens".into()]));
        let mut body = Decoded::inflating_at_most(scan, coding, limit);
        for chunk in chunks {
            body.feed(chunk);
        }
        body.finish()
    }

    #[test]
    fn a_gzip_or_deflate_body_is_inflated_for_the_scan_a_byte_at_a_time_or_whole() {
        let body = br#"{"choices":[{"message":{"content":"hi"}}],"usage":{"total_tokens":42}}"#;
        for coding in [Coding::Gzip, Coding::Deflate] {
            let wire = compressed(coding, body);
            assert_eq!(decoded(coding, &[&wire]), Some(42.into()), "{coding:?}");
            let bytes: Vec<&[u8]> = wire.chunks(1).collect();
            assert_eq!(
                decoded(coding, &bytes),
                Some(42.into()),
                "{coding:?} by bytes"
            );
            // Cut short, or corrupted: nothing.
            assert_eq!(
                decoded(coding, &[&wire[..wire.len() / 2]]),
                None,
                "{coding:?}"
            );
            let mut bad = wire.clone();
            let middle = bad.len() / 2;
            bad[middle] ^= 0xff;
            bad[middle + 1] ^= 0x55;
            assert_eq!(decoded(coding, &[&bad]), None, "{coding:?} corrupted");
        }
        // Not compressed at all, but said to be.
        assert_eq!(decoded(Coding::Gzip, &[body]), None);
    }

    #[test]
    fn a_body_that_inflates_past_the_bound_is_not_read() {
        // 2 MiB of spaces before the usage: a few KiB compressed.
        let mut body = b"{".to_vec();
        body.resize(2 * 1024 * 1024, b' ');
        body.extend_from_slice(br#""usage":{"total_tokens":7}}"#);
        let wire = compressed(Coding::Gzip, &body);
        assert!(wire.len() < 64 * 1024, "{} bytes", wire.len());
        let mib = 1024 * 1024;
        assert_eq!(
            decoded_at_most(Coding::Gzip, &[&wire], 3 * mib),
            Some(7.into())
        );
        assert_eq!(decoded_at_most(Coding::Gzip, &[&wire], 2 * mib), None);
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(256))]

        /// Any bytes in any pieces, said to be plain, gzip or deflate, as a document or as
        /// events: the scans end with a value or none, never a panic.
        #[test]
        fn any_bytes_in_any_pieces_end_the_scan_without_a_panic(
            bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..2048),
            cuts in proptest::collection::vec(0usize..2048, 0..8),
            coding in 0usize..3,
            events in proptest::prelude::any::<bool>(),
        ) {
            let coding = [Coding::Identity, Coding::Gzip, Coding::Deflate][coding];
            let path = vec!["usage".to_owned(), "total_tokens".to_owned()];
            let scan = if events { Scan::Sse(SseScan::new(path)) } else { Scan::Json(JsonScan::new(path)) };
            let mut body = Decoded::new(scan, coding);
            let mut cuts: Vec<usize> = cuts.into_iter().map(|c| c.min(bytes.len())).collect();
            cuts.sort_unstable();
            let mut from = 0;
            for cut in cuts.into_iter().chain([bytes.len()]) {
                body.feed(&bytes[from..cut]);
                from = cut;
            }
            let _ = body.finish();
        }

        /// A gzipped answer cut anywhere into pieces reports its usage.
        #[test]
        fn a_gzipped_answer_in_any_pieces_reports_its_usage(
            n in 0u64..1_000_000,
            padding in 0usize..4096,
            cut in 0usize..4096,
        ) {
            let body = format!(
                r#"{{"choices":[{{"message":{{"content":"{}"}}}}],"usage":{{"total_tokens":{n}}}}}"#,
                "x".repeat(padding)
            );
            let wire = compressed(Coding::Gzip, body.as_bytes());
            let (a, b) = wire.split_at(cut.min(wire.len()));
            proptest::prop_assert_eq!(decoded(Coding::Gzip, &[a, b]), Some(n.into()));
        }
    }

    #[test]
    fn content_codings_are_read_as_one_coding_or_none() {
        let coding = |values: &[&str]| {
            let mut headers = HeaderMap::new();
            for v in values {
                headers.append(http::header::CONTENT_ENCODING, v.parse().unwrap());
            }
            Coding::of(&headers)
        };
        assert_eq!(coding(&[]), Coding::Identity);
        assert_eq!(coding(&["identity"]), Coding::Identity);
        assert_eq!(coding(&["GZip"]), Coding::Gzip);
        assert_eq!(coding(&["x-gzip"]), Coding::Gzip);
        assert_eq!(coding(&[" deflate "]), Coding::Deflate);
        assert_eq!(coding(&["br"]), Coding::Unreadable);
        assert_eq!(coding(&["gzip, br"]), Coding::Unreadable);
        assert_eq!(coding(&["gzip", "gzip"]), Coding::Unreadable);
    }

    #[test]
    fn the_sse_scan_keeps_the_last_event_that_carries_the_path() {
        let mut sse = SseScan::new(vec!["usage".into(), "total_tokens".into()]);
        sse.feed(b"data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}],\"usage\":null}\n\n");
        sse.feed(b"data: {\"usage\":{\"total_tokens\":5}}\r\n\r\ndata: {\"choices\":[],\"usa");
        sse.feed(b"ge\":{\"total_tokens\":17}}\n\ndata: [DONE]\n\n");
        assert_eq!(sse.finish(), Some(17.into()));
    }
}
