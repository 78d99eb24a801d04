//! The client address in `x-forwarded-for`, counted from the right past the trusted
//! hops, as nginx's realip module and Envoy's `xff_num_trusted_hops` count it.
//!
//! Each hop appends the address it received the request from, so only the right end of the list
//! is written by hops we trust; everything to the left of them is whatever the client sent. The
//! proxy appends its own peer, and with `N` trusted hops the client is the address `N` places left
//! of that last entry. With peer 10.0.0.9 and `x-forwarded-for: 203.0.113.7, 10.0.0.5` the list is
//! `203.0.113.7, 10.0.0.5, 10.0.0.9`: N=0 gives 10.0.0.9, N=1 gives 10.0.0.5, N=2 203.0.113.7.

use std::net::IpAddr;
use std::ops::ControlFlow;

use http::HeaderName;

use super::Headers;

/// The client address of a request: the entry `hops` places left of the peer in the received
/// `name` list (all its lines, in order, as one list; empty entries ignored, as RFC 9110 asks of
/// lists) followed by the peer, if that entry is an IP address. `None` when the list is too short
/// or the entry is not an address (a port, a name, garbage). Scans from the right and stops at the
/// entry, so a client that sends a long list costs nothing more; the result borrows from the
/// request (or is the peer). Allocates nothing.
pub(super) fn client<'a, H: Headers + ?Sized>(
    headers: &'a H,
    name: &HeaderName,
    hops: u32,
    peer: Option<&'a str>,
) -> Option<&'a str> {
    if hops == 0 {
        return peer;
    }
    let mut left = hops;
    let mut found: Option<&'a [u8]> = None;
    headers.values_rev(name, &mut |line: &'a [u8]| {
        for entry in line.rsplit(|&b| b == b',') {
            let entry = entry.trim_ascii();
            if entry.is_empty() {
                continue;
            }
            left -= 1;
            if left == 0 {
                found = Some(entry);
                return ControlFlow::Break(());
            }
        }
        ControlFlow::Continue(())
    });
    let text = std::str::from_utf8(found?).ok()?;
    text.parse::<IpAddr>().is_ok().then_some(text)
}

#[cfg(test)]
mod tests {
    use http::HeaderMap;

    use super::*;

    const XFF: HeaderName = HeaderName::from_static("x-forwarded-for");

    fn headers(lines: &[&[u8]]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for line in lines {
            map.append(XFF, http::HeaderValue::from_bytes(line).unwrap());
        }
        map
    }

    #[test]
    fn the_example_of_spec_section_3a() {
        let map = headers(&[b"203.0.113.7, 10.0.0.5"]);
        let client = |hops| client(&map, &XFF, hops, Some("10.0.0.9"));
        assert_eq!(client(0), Some("10.0.0.9"));
        assert_eq!(client(1), Some("10.0.0.5"));
        assert_eq!(client(2), Some("203.0.113.7"));
        assert_eq!(client(3), None, "too few entries");
    }

    #[test]
    fn several_lines_are_one_list() {
        let map = headers(&[b"203.0.113.7", b"10.0.0.5"]);
        let client = |hops| client(&map, &XFF, hops, Some("10.0.0.9"));
        assert_eq!(client(1), Some("10.0.0.5"));
        assert_eq!(client(2), Some("203.0.113.7"));
        let map = headers(&[b"198.51.100.1, 203.0.113.7", b"", b" 10.0.0.5 ,"]);
        assert_eq!(
            super::client(&map, &XFF, 2, Some("10.0.0.9")),
            Some("203.0.113.7")
        );
    }

    #[test]
    fn a_fake_hop_left_of_the_trusted_ones_changes_nothing() {
        for fake in [&b"1.2.3.4, "[..], b"garbage, ", b"\xff\xfe, ", b", , , "] {
            let mut line = fake.to_vec();
            line.extend_from_slice(b"203.0.113.7");
            let map = headers(&[&line]);
            assert_eq!(client(&map, &XFF, 1, Some("10.0.0.9")), Some("203.0.113.7"));
        }
    }

    #[test]
    fn an_entry_that_is_not_an_address_or_a_short_list_is_absent() {
        for line in [
            &b"203.0.113.7:4711"[..],
            b"[2001:db8::1]",
            b"client.example",
            b"unknown",
            b"",
            b" , ",
            b"203.0.113.7 10.0.0.5",
        ] {
            let map = headers(&[line]);
            assert_eq!(
                client(&map, &XFF, 1, Some("10.0.0.9")),
                None,
                "{}",
                String::from_utf8_lossy(line)
            );
        }
        assert_eq!(client(&HeaderMap::new(), &XFF, 1, Some("10.0.0.9")), None);
        let v6 = headers(&[b"2001:db8::7"]);
        assert_eq!(client(&v6, &XFF, 1, None), Some("2001:db8::7"));
        assert_eq!(client(&v6, &XFF, 0, None), None, "no peer known");
    }
}
