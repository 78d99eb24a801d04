//! Keeping the Redis password out of what is printed: a URL's password shown as `***`.

use std::borrow::Cow;

/// What a redacted password reads as.
pub const REDACTED: &str = "***";

/// `url` with any password it carries replaced by `***`: the one of its user information
/// (`redis://user:secret@host` reads `redis://user:***@host`) and a `pass=` query parameter
/// (`redis+unix:///run/redis.sock?pass=secret`). Every Redis URL that reaches a log line, an
/// error message or a `Debug` output goes through this; a URL without a password is returned
/// as it is.
pub fn redact_url(url: &str) -> Cow<'_, str> {
    let mut out = Cow::Borrowed(url);
    // The authority runs from after `scheme://` to the first `/`, `?` or `#`; its user
    // information ends at its last `@`.
    let start = url.find("://").map_or(0, |i| i + 3);
    let rest = &url[start..];
    let authority_len = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let authority = &rest[..authority_len];
    if let Some(at) = authority.rfind('@')
        && let Some(colon) = authority[..at].find(':')
        && colon + 1 < at
    {
        let (from, to) = (start + colon + 1, start + at);
        out = Cow::Owned(format!("{}{REDACTED}{}", &url[..from], &url[to..]));
    }
    if let Some(query_at) = out.find('?') {
        let (head, query) = out.split_at(query_at + 1);
        let mut changed = false;
        let parts: Vec<String> = query
            .split('&')
            .map(|pair| match pair.split_once('=') {
                Some((key, value)) if key == "pass" && !value.is_empty() => {
                    changed = true;
                    format!("{key}={REDACTED}")
                }
                _ => pair.to_owned(),
            })
            .collect();
        if changed {
            out = Cow::Owned(format!("{head}{}", parts.join("&")));
        }
    }
    out
}

/// Whether `url` carries a password of its own (in its user information or a `pass=` query).
pub fn url_has_password(url: &str) -> bool {
    redact_url(url) != url
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_password_is_hidden_wherever_a_url_carries_it() {
        for (url, shown) in [
            ("redis://127.0.0.1:6379", "redis://127.0.0.1:6379"),
            (
                "redis://:hunter2@10.0.0.1:6379/2",
                "redis://:***@10.0.0.1:6379/2",
            ),
            (
                "rediss://app:hunter2@cache:6380",
                "rediss://app:***@cache:6380",
            ),
            ("redis://app@cache:6379", "redis://app@cache:6379"),
            ("redis://:p@ss:w@rd@cache", "redis://:***@cache"),
            (
                "redis+unix:///run/redis.sock?db=1&pass=hunter2",
                "redis+unix:///run/redis.sock?db=1&pass=***",
            ),
            ("cache:6379", "cache:6379"),
        ] {
            assert_eq!(redact_url(url), shown, "{url}");
            assert!(!redact_url(url).contains("hunter2"));
            assert_eq!(url_has_password(url), url != shown, "{url}");
        }
    }
}
