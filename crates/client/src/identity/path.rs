//! Paths as matched: RFC 3986 normalisation, so `/%69p/search`, `//ip/search` and
//! `/./ip/search` fall in the bucket of `/ip/search` while the upstream still gets what was sent.
//!
//! Three things change, in one pass over the segments:
//! - a percent-encoded unreserved character (`ALPHA / DIGIT / - . _ ~`, hex in either case) is
//!   decoded; every other encoding stays encoded with upper-case hex (`%2f` becomes `%2F`, which
//!   is not a slash), and a `%` that starts no encoding becomes `%25`;
//! - dot segments are removed (RFC 3986 §5.2.4): `.` goes, `..` takes the segment before it
//!   with it, and none climbs above the root;
//! - empty segments are dropped (`//` is `/`), except that a trailing slash stays.
//!
//! Nothing else is touched: letter case, `;` parameters, `+`, backslashes and bytes beyond
//! ASCII are compared as sent. The output is a fixed point: normalising it again changes nothing.

/// How many bytes of normalised path fit on the stack; a longer one is normalised on the heap.
pub const PATH_STACK_BYTES: usize = 2048;

/// The first stack buffer, for the paths of nearly every request: zeroing 256 bytes when a path
/// needs normalising costs a few nanoseconds, zeroing 2 KB some tens.
const SHORT_BYTES: usize = 256;

/// Room for one request's normalised path: [`PATH_STACK_BYTES`] on the stack (256 bytes of them
/// apart, for short paths), and a heap buffer for the rare path whose normalised form is longer.
/// A path that needs no change (the common case, found with one scan) is used as it is, and no
/// buffer is touched, not even zeroed.
#[derive(Debug, Default)]
pub struct PathBuffer {
    short: Option<[u8; SHORT_BYTES]>,
    stack: Option<[u8; PATH_STACK_BYTES]>,
    heap: Vec<u8>,
}

impl PathBuffer {
    pub fn new() -> Self {
        Self::default()
    }

    /// `path` normalised, borrowing from `path` itself when it needs no change, else from this
    /// buffer. A path that does not start with `/` (`*`) is returned as it is. Allocates only for
    /// a path that needs normalising and is longer than [`PATH_STACK_BYTES`] normalised.
    pub fn normalise<'a>(&'a mut self, path: &'a str) -> &'a str {
        let bytes = path.as_bytes();
        if !needs_normalising(bytes) {
            return path;
        }
        // Only ASCII is written and segments are cut at `/`, so UTF-8 in stays UTF-8 out: the
        // conversions below cannot fail.
        if bytes.len() < SHORT_BYTES {
            let short = self.short.get_or_insert([0; SHORT_BYTES]);
            if let Some(len) = normalise_into(bytes, short) {
                return std::str::from_utf8(&short[..len]).unwrap_or(path);
            }
        }
        let stack = self.stack.get_or_insert([0; PATH_STACK_BYTES]);
        if let Some(len) = normalise_into(bytes, stack) {
            return std::str::from_utf8(&stack[..len]).unwrap_or(path);
        }
        // Each byte becomes at most three (`%` as `%25`), plus the trailing slash.
        self.heap.clear();
        self.heap.resize(bytes.len() * 3 + 1, 0);
        match normalise_into(bytes, &mut self.heap) {
            Some(len) => std::str::from_utf8(&self.heap[..len]).unwrap_or(path),
            None => path,
        }
    }
}

/// `path` normalised into a new string: for tests, tools and configuration checks, not the hot
/// path.
pub fn normalise(path: &str) -> String {
    PathBuffer::new().normalise(path).to_owned()
}

/// Whether normalising could change `path`: it holds a `%`, an empty segment that is not the
/// trailing one, or a `.` or `..` segment.
pub fn needs_normalising(path: &[u8]) -> bool {
    path.first() == Some(&b'/') && may_need(path) && really_needs(path)
}

const ONES: u64 = 0x0101_0101_0101_0101;
const HIGHS: u64 = 0x8080_8080_8080_8080;

/// The high bit of every byte of `word` that equals `byte`. Exact for the lowest match; a byte
/// just above a match may be flagged too (the borrow of the subtraction), never one missed.
fn flags(word: u64, byte: u8) -> u64 {
    let x = word ^ (ONES * u64::from(byte));
    x.wrapping_sub(ONES) & !x & HIGHS
}

/// The fast scan, eight bytes at a time: false only if `path` has no `%`, no `//` and no `/.`.
/// It may say true for a path that needs no change (`/.well-known`), never false for one that
/// needs one, so [`really_needs`] only runs on the rare paths it flags.
fn may_need(path: &[u8]) -> bool {
    // The flag of a `/` that ended the previous word, moved to the first byte of the next.
    let mut carry = 0;
    let mut words = path.chunks_exact(8);
    for word in &mut words {
        let mut bytes = [0; 8];
        bytes.copy_from_slice(word);
        let word = u64::from_le_bytes(bytes);
        let slash = flags(word, b'/');
        let next = slash | flags(word, b'.');
        if flags(word, b'%') != 0 || ((slash << 8) | carry) & next != 0 {
            return true;
        }
        carry = slash >> 56;
    }
    let mut previous = if carry != 0 { b'/' } else { 0 };
    for &b in words.remainder() {
        if b == b'%' || (previous == b'/' && matches!(b, b'/' | b'.')) {
            return true;
        }
        previous = b;
    }
    false
}

/// The exact test, for paths [`may_need`] flagged: a `%`, an inner empty segment, or a `.` or
/// `..` segment.
fn really_needs(path: &[u8]) -> bool {
    if path.contains(&b'%') {
        return true;
    }
    let mut rest = path;
    while let Some(at) = rest.iter().position(|&b| b == b'/') {
        rest = &rest[at + 1..];
        if let [b'/', ..] | [b'.'] | [b'.', b'/', ..] | [b'.', b'.'] | [b'.', b'.', b'/', ..] = rest
        {
            return true;
        }
    }
    false
}

/// Writes `path` (which starts with `/`) normalised into `out`; `None` when it does not fit.
fn normalise_into(path: &[u8], out: &mut [u8]) -> Option<usize> {
    let mut len = 0;
    // Whether the output ends in a directory: after an empty, `.` or `..` last segment.
    let mut directory = false;
    for raw in path[1..].split(|&b| b == b'/') {
        let mark = len;
        push(out, &mut len, b'/')?;
        decode(raw, out, &mut len)?;
        match &out[mark + 1..len] {
            b"" | b"." => {
                len = mark;
                directory = true;
            }
            b".." => {
                len = out[..mark].iter().rposition(|&b| b == b'/').unwrap_or(0);
                directory = true;
            }
            _ => directory = false,
        }
    }
    if directory || len == 0 {
        push(out, &mut len, b'/')?;
    }
    Some(len)
}

fn push(out: &mut [u8], len: &mut usize, byte: u8) -> Option<()> {
    *out.get_mut(*len)? = byte;
    *len += 1;
    Some(())
}

/// One segment with its unreserved characters decoded and other encodings in upper case.
fn decode(raw: &[u8], out: &mut [u8], len: &mut usize) -> Option<()> {
    let mut i = 0;
    while i < raw.len() {
        let b = raw[i];
        if b != b'%' {
            push(out, len, b)?;
            i += 1;
            continue;
        }
        match (raw.get(i + 1).and_then(hex), raw.get(i + 2).and_then(hex)) {
            (Some(high), Some(low)) => {
                let decoded = high << 4 | low;
                if is_unreserved(decoded) {
                    push(out, len, decoded)?;
                } else {
                    push(out, len, b'%')?;
                    push(out, len, raw[i + 1].to_ascii_uppercase())?;
                    push(out, len, raw[i + 2].to_ascii_uppercase())?;
                }
                i += 3;
            }
            // A `%` that starts no encoding is a literal percent sign.
            _ => {
                for b in *b"%25" {
                    push(out, len, b)?;
                }
                i += 1;
            }
        }
    }
    Some(())
}

fn hex(b: &u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

/// RFC 3986 §2.3.
fn is_unreserved(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_escapes_of_the_outside_test_are_the_path_they_hide() {
        for path in [
            "/%69p/search",
            "/i%70/search",
            "/%69%70/search",
            "//ip/search",
            "/./ip/search",
            "/ip/./search",
            "/ip//search",
            "/%2e/ip/search",
            "/x/../ip/search",
            "/x/%2E%2e/ip/search",
            "/../../ip/search",
            "///ip///search",
        ] {
            assert_eq!(normalise(path), "/ip/search", "{path}");
        }
    }

    #[test]
    fn encoded_reserved_characters_stay_encoded() {
        assert_eq!(normalise("/a%2Fb"), "/a%2Fb");
        assert_eq!(normalise("/a%2fb"), "/a%2Fb");
        assert_eq!(normalise("/a%3f%23"), "/a%3F%23");
        assert_eq!(normalise("/%25"), "/%25");
        assert_eq!(normalise("/%C3%A9"), "/%C3%A9");
        assert_eq!(normalise("/%7E%5f%2D%41"), "/~_-A");
        // A `%` that starts no encoding is a percent sign, so it cannot pair up with what follows
        // in a second pass.
        assert_eq!(normalise("/%zz"), "/%25zz");
        assert_eq!(normalise("/%%34%31"), "/%2541");
        assert_eq!(normalise("/a%4"), "/a%254");
    }

    #[test]
    fn dot_segments_and_slashes_follow_rfc_3986() {
        let cases = [
            ("/", "/"),
            ("/.", "/"),
            ("/..", "/"),
            ("//", "/"),
            ("/a/b/..", "/a/"),
            ("/a/b/.", "/a/b/"),
            ("/a/b/", "/a/b/"),
            ("/a/b//", "/a/b/"),
            ("/a/./b/../c", "/a/c"),
            ("/a/.b/..c/...", "/a/.b/..c/..."),
            ("/a/%2e%2e", "/"),
            ("/é/./x", "/é/x"),
        ];
        for (path, normalised) in cases {
            assert_eq!(normalise(path), normalised, "{path}");
        }
    }

    #[test]
    fn a_path_that_needs_no_change_is_borrowed_as_it_is() {
        let mut buffer = PathBuffer::new();
        for path in [
            "/payments.v1.Payments/Charge",
            "/",
            "/a/b/",
            "/a/.b",
            "*",
            "/a..b",
        ] {
            assert!(!needs_normalising(path.as_bytes()), "{path}");
            let out = buffer.normalise(path);
            assert_eq!(out.as_ptr(), path.as_ptr(), "{path}");
        }
        assert!(
            buffer.short.is_none() && buffer.stack.is_none(),
            "no buffer was even zeroed"
        );
    }

    proptest::proptest! {
        #[test]
        fn the_fast_scan_never_misses_a_path_that_needs_normalising(
            path in "/[/.%a-z]{0,40}",
            offset in 0usize..8,
        ) {
            // Shifted by up to seven bytes, so every pattern lands on every place in a word.
            let shifted = format!("/{}{path}", "a".repeat(offset));
            let bytes = shifted.as_bytes();
            if really_needs(bytes) {
                proptest::prop_assert!(may_need(bytes), "{}", shifted);
            }
        }
    }

    #[test]
    fn the_fast_scan_sees_patterns_across_words() {
        for at in 0..24 {
            for pattern in ["//", "/.", "%"] {
                let mut path = "/".to_owned() + &"a".repeat(at);
                path.push_str(pattern);
                path.push_str("bcdefghij");
                assert!(may_need(path.as_bytes()), "{path}");
            }
            let clean = "/".to_owned() + &"a".repeat(at) + "x/b.c/d";
            assert!(!may_need(clean.as_bytes()), "{clean}");
        }
    }

    #[test]
    fn each_buffer_takes_the_paths_that_fit_it() {
        let mut buffer = PathBuffer::new();
        assert_eq!(buffer.normalise("//ip"), "/ip");
        assert!(buffer.short.is_some() && buffer.stack.is_none());
        let mut buffer = PathBuffer::new();
        let long = format!("//{}", "a".repeat(1000));
        assert_eq!(buffer.normalise(&long), &long[1..]);
        assert!(buffer.short.is_none() && buffer.stack.is_some() && buffer.heap.is_empty());
        // Short, but three times longer once every lone `%` is `%25`: the 2 KB buffer takes it.
        let mut buffer = PathBuffer::new();
        let percents = format!("/{}", "%".repeat(200));
        assert_eq!(
            buffer.normalise(&percents),
            format!("/{}", "%25".repeat(200))
        );
        assert!(buffer.stack.is_some() && buffer.heap.is_empty());
    }

    #[test]
    fn a_long_path_is_normalised_on_the_heap() {
        let long = format!("/%69p/{}", "a".repeat(3 * PATH_STACK_BYTES));
        let mut buffer = PathBuffer::new();
        let out = buffer.normalise(&long).to_owned();
        assert_eq!(out, format!("/ip/{}", "a".repeat(3 * PATH_STACK_BYTES)));
        assert!(!buffer.heap.is_empty());
        // The worst growth, every byte a lone `%`, fits the heap buffer too.
        let percent = format!("/{}", "%".repeat(PATH_STACK_BYTES));
        assert_eq!(
            normalise(&percent),
            format!("/{}", "%25".repeat(PATH_STACK_BYTES))
        );
    }
}
