//! Patterns in `match`: exact strings and globs with `*`, and the match spec of a bucket.
//!
//! A bucket's `match` names up to three things: the caller, the procedure and at most one
//! subject (`user`, `org`, `api_key` or `ip`). Every key is optional; a missing key matches
//! anything. A value is exact, or a glob where `*` stands for any run of characters
//! (`/payments.v1.Payments/*`). On a subject, the lone value `"*"` means something stronger than
//! "any": one bucket per distinct value (`user: "*"` gives every user a bucket of their own).

use std::fmt;

use crate::criticality::Criticality;

/// An exact string or a glob. `*` matches any run of characters, including none; there is no
/// escape, because no caller, procedure or subject in practice contains a literal `*`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Pattern {
    /// Matches exactly this string.
    Exact(Box<str>),
    /// Holds at least one `*`.
    Glob(Box<str>),
}

impl Pattern {
    /// `"*"`, `"a*b"` and `"/v1/*"` are globs; anything without `*` is exact.
    pub fn new(text: &str) -> Self {
        if text.contains('*') {
            Pattern::Glob(text.into())
        } else {
            Pattern::Exact(text.into())
        }
    }

    /// The text as written in the configuration.
    pub fn as_str(&self) -> &str {
        match self {
            Pattern::Exact(s) | Pattern::Glob(s) => s,
        }
    }

    pub fn is_exact(&self) -> bool {
        matches!(self, Pattern::Exact(_))
    }

    /// True for the glob `*`, which matches every string.
    pub fn is_any(&self) -> bool {
        matches!(self, Pattern::Glob(s) if s.bytes().all(|b| b == b'*'))
    }

    /// Whether `text` matches. Allocates nothing.
    pub fn matches(&self, text: &str) -> bool {
        match self {
            Pattern::Exact(s) => **s == *text,
            Pattern::Glob(g) => glob_matches(g.as_bytes(), text.as_bytes()),
        }
    }
}

impl fmt::Display for Pattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Glob matching with `*` only, in O(pattern × text) worst case and no allocation: on a mismatch
/// the last `*` absorbs one more byte and matching resumes after it. Earlier stars never need to
/// be revisited, because a later star can absorb anything an earlier one could.
fn glob_matches(pattern: &[u8], text: &[u8]) -> bool {
    let (mut p, mut t) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while t < text.len() {
        if p < pattern.len() && pattern[p] == b'*' {
            star = Some((p, t));
            p += 1;
        } else if p < pattern.len() && pattern[p] == text[t] {
            p += 1;
            t += 1;
        } else if let Some((sp, st)) = star {
            p = sp + 1;
            t = st + 1;
            star = Some((sp, st + 1));
        } else {
            return false;
        }
    }
    pattern[p..].iter().all(|&b| b == b'*')
}

/// The subjects of per-subject quotas: who or what a per-subject quota is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SubjectKind {
    User,
    Org,
    ApiKey,
    Ip,
}

impl SubjectKind {
    pub const ALL: [SubjectKind; 4] = [
        SubjectKind::User,
        SubjectKind::Org,
        SubjectKind::ApiKey,
        SubjectKind::Ip,
    ];

    /// The key in `match` and in `identity`.
    pub fn key(self) -> &'static str {
        match self {
            SubjectKind::User => "user",
            SubjectKind::Org => "org",
            SubjectKind::ApiKey => "api_key",
            SubjectKind::Ip => "ip",
        }
    }

    /// Position in a request's subject array ([`SubjectKind::ALL`] order).
    pub fn index(self) -> usize {
        self as usize
    }

    pub fn from_key(key: &str) -> Option<Self> {
        SubjectKind::ALL.into_iter().find(|k| k.key() == key)
    }
}

impl fmt::Display for SubjectKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.key())
    }
}

/// What a bucket asks of a subject.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum SubjectValue {
    /// `"*"`: the request must carry the subject, and each distinct value gets its own bucket.
    Each,
    /// A value or a glob: the request's subject must match; all matching values share the bucket.
    Pattern(Pattern),
}

impl SubjectValue {
    pub fn new(text: &str) -> Self {
        if text == "*" {
            SubjectValue::Each
        } else {
            SubjectValue::Pattern(Pattern::new(text))
        }
    }

    pub fn as_str(&self) -> &str {
        match self {
            SubjectValue::Each => "*",
            SubjectValue::Pattern(p) => p.as_str(),
        }
    }

    /// Whether a request's value of this subject qualifies.
    pub fn matches(&self, value: &str) -> bool {
        match self {
            SubjectValue::Each => true,
            SubjectValue::Pattern(p) => p.matches(value),
        }
    }
}

/// A bucket's subject: which one, and what value it asks for.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Subject {
    pub kind: SubjectKind,
    pub value: SubjectValue,
}

/// A bucket's `match`: every key optional, `None` matches anything (including a request that
/// lacks the attribute). A subject key, when present, requires the request to carry that subject.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct MatchSpec {
    pub caller: Option<Pattern>,
    pub procedure: Option<Pattern>,
    pub subject: Option<Subject>,
}

impl MatchSpec {
    /// The plain definition of matching: the reference the compiled matcher is tested against.
    pub fn matches(&self, request: &RequestAttrs<'_>) -> bool {
        fn field(pattern: &Option<Pattern>, value: Option<&str>) -> bool {
            match (pattern, value) {
                (None, _) => true,
                (Some(p), Some(v)) => p.matches(v),
                (Some(_), None) => false,
            }
        }
        field(&self.caller, request.caller)
            && field(&self.procedure, request.procedure)
            && match &self.subject {
                None => true,
                Some(s) => request
                    .subject(s.kind)
                    .is_some_and(|value| s.value.matches(value)),
            }
    }
}

/// The attributes of one request that matching looks at, borrowed from the request.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RequestAttrs<'a> {
    pub caller: Option<&'a str>,
    pub procedure: Option<&'a str>,
    /// Indexed by [`SubjectKind::index`].
    pub subjects: [Option<&'a str>; 4],
    /// The request's tier: which drops it absorbs first. No bucket matches on it.
    pub criticality: Criticality,
}

impl<'a> RequestAttrs<'a> {
    pub fn subject(&self, kind: SubjectKind) -> Option<&'a str> {
        self.subjects[kind.index()]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exact_patterns_match_only_themselves() {
        let p = Pattern::new("/payments.v1.Payments/Charge");
        assert!(p.is_exact());
        assert!(p.matches("/payments.v1.Payments/Charge"));
        assert!(!p.matches("/payments.v1.Payments/Charge2"));
        assert!(!p.matches(""));
    }

    #[test]
    fn globs_match_any_run_of_characters() {
        let cases = [
            ("*", "", true),
            ("*", "anything", true),
            ("/v1/*", "/v1/", true),
            ("/v1/*", "/v1/users/7", true),
            ("/v1/*", "/v2/users", false),
            ("*.Charge", "payments.Charge", true),
            ("*.Charge", "payments.Charge.x", false),
            ("a*b*c", "abc", true),
            ("a*b*c", "aXbYbZc", true),
            ("a*b*c", "aXbYbZ", false),
            ("a**b", "ab", true),
            ("*ab", "aab", true),
            ("a*", "b", false),
        ];
        for (pattern, text, expected) in cases {
            assert_eq!(
                Pattern::new(pattern).matches(text),
                expected,
                "{pattern:?} against {text:?}"
            );
        }
    }

    #[test]
    fn a_lone_star_on_a_subject_means_one_bucket_per_value() {
        assert_eq!(SubjectValue::new("*"), SubjectValue::Each);
        assert_eq!(
            SubjectValue::new("bot-*"),
            SubjectValue::Pattern(Pattern::Glob("bot-*".into()))
        );
    }

    #[test]
    fn a_subject_key_requires_the_request_to_carry_it() {
        let spec = MatchSpec {
            procedure: Some(Pattern::new("/search")),
            subject: Some(Subject {
                kind: SubjectKind::User,
                value: SubjectValue::Each,
            }),
            ..MatchSpec::default()
        };
        let mut request = RequestAttrs {
            procedure: Some("/search"),
            ..RequestAttrs::default()
        };
        assert!(!spec.matches(&request));
        request.subjects[SubjectKind::User.index()] = Some("alice");
        assert!(spec.matches(&request));
        request.procedure = Some("/other");
        assert!(!spec.matches(&request));
    }
}
