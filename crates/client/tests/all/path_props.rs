//! Properties of path normalisation over arbitrary paths built from the bytes that
//! matter (`/`, `.`, `%`, hex digits, unreserved and reserved characters): normalising twice is
//! normalising once, a path the fast scan passes is returned unchanged, and the result is a clean
//! absolute path (no empty inner segment, no dot segment, every `%` a valid upper-case escape of
//! a character that is not unreserved).

use proptest::prelude::*;
use spillway_client::PathBuffer;
use spillway_client::path::{needs_normalising, normalise};

fn path() -> impl Strategy<Value = String> {
    let piece = prop_oneof![
        Just("/".to_owned()),
        Just(".".to_owned()),
        Just("..".to_owned()),
        Just("%".to_owned()),
        "[0-9a-fA-F]{1,2}",
        "%[0-9a-fA-F]{2}",
        "[a-z~_;+*-]{1,3}",
        Just("é".to_owned()),
        Just("%2F".to_owned()),
        Just("%2e".to_owned()),
    ];
    prop::collection::vec(piece, 0..24).prop_map(|pieces| format!("/{}", pieces.concat()))
}

fn is_unreserved(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~')
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(4096))]

    #[test]
    fn normalising_is_idempotent(path in path()) {
        let once = normalise(&path);
        prop_assert_eq!(normalise(&once), once.clone(), "{}", path);
    }

    #[test]
    fn a_path_the_scan_passes_is_already_normal(path in path()) {
        if !needs_normalising(path.as_bytes()) {
            prop_assert_eq!(normalise(&path), path);
        }
    }

    #[test]
    fn the_result_is_a_clean_absolute_path(path in path()) {
        let out = normalise(&path);
        prop_assert!(out.starts_with('/'));
        let inner = out.strip_suffix('/').unwrap_or(&out);
        for segment in inner.split('/').skip(1) {
            prop_assert!(!segment.is_empty() && segment != "." && segment != "..", "{} -> {}", path, out);
        }
        let bytes = out.as_bytes();
        for (i, _) in out.match_indices('%') {
            let escape = bytes.get(i + 1..i + 3).expect("two hex digits follow every %");
            prop_assert!(escape.iter().all(|b| b.is_ascii_digit() || (b'A'..=b'F').contains(b)), "{}", out);
            let value = u8::from_str_radix(std::str::from_utf8(escape).unwrap(), 16).unwrap();
            prop_assert!(!is_unreserved(value), "{}", out);
        }
    }

    #[test]
    fn the_heap_normalises_as_the_stack_does(path in path(), pad in 2100usize..5000) {
        // One plain segment long enough to push the path past the stack buffer: segments are
        // normalised one after the other, so it only appends itself to the short path's result.
        let tail = "y".repeat(pad);
        let short = normalise(&path);
        let expected = if short.ends_with('/') { format!("{short}{tail}") } else { format!("{short}/{tail}") };
        let long = format!("{path}/{tail}");
        let mut buffer = PathBuffer::new();
        prop_assert_eq!(buffer.normalise(&long), expected.as_str());
    }
}
