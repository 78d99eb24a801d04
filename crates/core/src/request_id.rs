//! Which request id a Spillway process keeps from its caller (`x-request-id`, docs/operations.md
//! "Request ids"): the sidecar and the rules service take the same ones, and make their own for
//! the rest.

/// The header a request id travels in.
pub const HEADER: &str = "x-request-id";

/// The longest id taken from a caller.
pub const MAX_LEN: usize = 128;

/// Whether a caller's id is kept: 1 to [`MAX_LEN`] printable ASCII bytes, no space.
pub fn usable(id: &[u8]) -> bool {
    !id.is_empty() && id.len() <= MAX_LEN && id.iter().all(u8::is_ascii_graphic)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_callers_id_is_kept_only_when_printable_and_short() {
        assert!(usable(b"req-42"));
        assert!(usable(&[b'a'; MAX_LEN]));
        assert!(!usable(b""));
        assert!(!usable(b"has space"));
        assert!(!usable("caf\u{e9}".as_bytes()));
        assert!(!usable(&[b'a'; MAX_LEN + 1]));
    }
}
