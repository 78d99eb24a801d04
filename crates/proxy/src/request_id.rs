//! Request ids (`x-request-id`): every request the proxy forwards carries one to the
//! upstream, the client's when it sent a usable one (1 to 128 printable ASCII bytes), else a new
//! one; the proxy's own answers carry it back, and the proxy's log lines about a request name it
//! (`request_id`), so a 429 a client quotes, the upstream's log and the proxy's are one search.
//!
//! A new id is 32 hex digits: a random half fixed at start and a counter, so ids are unique
//! across processes without a random draw per request. Making one formats 16 bytes on the stack
//! and copies them into the header value: one small allocation, on the forwarding path (which
//! builds an upstream request anyway), never on the decision's.

use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};

use http::{HeaderMap, HeaderName, HeaderValue};
use spillway_core::request_id;

/// The header a request id travels in.
pub const REQUEST_ID: HeaderName = HeaderName::from_static(request_id::HEADER);

/// Where new ids come from.
pub struct RequestIds {
    prefix: u64,
    next: AtomicU64,
}

impl Default for RequestIds {
    fn default() -> Self {
        // The standard library's hasher keys are drawn from the OS at first use.
        let prefix = std::collections::hash_map::RandomState::new()
            .build_hasher()
            .finish();
        Self {
            prefix,
            next: AtomicU64::new(1),
        }
    }
}

impl RequestIds {
    /// The request's id: the client's, when usable, or a new one put in `headers` in place of
    /// whatever was there.
    pub fn of(&self, headers: &mut HeaderMap) -> HeaderValue {
        let mut received = headers.get_all(&REQUEST_ID).iter();
        if let (Some(id), None) = (received.next(), received.next())
            && request_id::usable(id.as_bytes())
        {
            return id.clone();
        }
        let id = self.new_id();
        headers.insert(REQUEST_ID, id.clone());
        id
    }

    fn new_id(&self) -> HeaderValue {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        let mut hex = [0u8; 32];
        write_hex(&mut hex[..16], self.prefix);
        write_hex(&mut hex[16..], n);
        HeaderValue::from_bytes(&hex).expect("hex digits are a header value")
    }
}

fn write_hex(out: &mut [u8], value: u64) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    for (i, slot) in out.iter_mut().enumerate() {
        *slot = HEX[((value >> (60 - 4 * i)) & 15) as usize];
    }
}

/// The id as log text.
pub(crate) fn text(id: &HeaderValue) -> &str {
    // Usable ids and new ones are ASCII.
    id.to_str().unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_usable_client_id_is_kept_and_anything_else_replaced() {
        let ids = RequestIds::default();
        let mut headers = HeaderMap::new();
        headers.insert(REQUEST_ID, HeaderValue::from_static("abc-123"));
        assert_eq!(ids.of(&mut headers), "abc-123");
        assert_eq!(headers.get_all(&REQUEST_ID).iter().count(), 1);

        for bad in ["", "has space", &"x".repeat(request_id::MAX_LEN + 1)] {
            let mut headers = HeaderMap::new();
            headers.insert(REQUEST_ID, HeaderValue::from_str(bad).unwrap());
            let id = ids.of(&mut headers);
            assert_eq!(id.len(), 32, "{bad:?}");
            assert_eq!(headers.get(&REQUEST_ID), Some(&id));
        }
        // Two ids: the upstream would not know which one the proxy logged.
        let mut headers = HeaderMap::new();
        headers.append(REQUEST_ID, HeaderValue::from_static("a"));
        headers.append(REQUEST_ID, HeaderValue::from_static("b"));
        let id = ids.of(&mut headers);
        assert_eq!(id.len(), 32);
        assert_eq!(headers.get_all(&REQUEST_ID).iter().count(), 1);
    }

    #[test]
    fn new_ids_share_the_process_half_and_count_in_the_other() {
        let ids = RequestIds::default();
        let a = ids.of(&mut HeaderMap::new());
        let b = ids.of(&mut HeaderMap::new());
        assert!(a.as_bytes().iter().all(u8::is_ascii_hexdigit));
        assert_eq!(a.as_bytes()[..16], b.as_bytes()[..16]);
        assert_eq!(&a.as_bytes()[16..], b"0000000000000001");
        assert_eq!(&b.as_bytes()[16..], b"0000000000000002");
        assert_ne!(
            RequestIds::default().prefix,
            ids.prefix,
            "each proxy draws its own half"
        );
    }
}
