//! Envoy rate-limit descriptors: what a descriptor bucket matches, and the matcher
//! that gives one request descriptor the single most specific bucket of its domain.
//!
//! An Envoy request names a `domain` and a list of descriptors, each an ordered list of
//! `(key, value)` entries. A descriptor bucket names a domain and a list of entries, each with a
//! key and optionally a value: an exact value, a value ending in `*` (a prefix, envoyproxy/
//! ratelimit's wildcard), or none (any value, each value counted apart).
//!
//! The order is envoyproxy/ratelimit's (its README, "Example 3": "the service will attempt the
//! most specific match possible ... key/value is always attempted as a match before just key";
//! "Example 4": a request matches configuration entries of the same depth; "Example 9": values
//! ending in `*` match by prefix). Its `GetLimit` walks the domain's tree entry by entry, and at
//! each level takes the child keyed by the entry's exact key and value, else the first wildcard
//! child (in configuration order) whose prefix the value starts with, else the child keyed by the
//! bare key; the limit found at the last entry decides, and a level with no such child ends the
//! walk without a limit. The walk never backtracks: a request whose `(k, v)` entry takes the exact
//! child and whose next entry has no place below it gets no limit, even when the bare `k` child
//! would have had one. This module builds the same tree from the buckets' entry lists (a
//! bucket's entries are a path from the domain's root) and walks it the same way.
//!
//! Two deliberate differences: envoyproxy/ratelimit keys its tree by the text `key_value`, so a
//! key with an underscore could collide with another key and value (`a_b` = `c` and `a` = `b_c`),
//! and its wildcard is a prefix of that text; here keys and values are compared apart.

use std::fmt;

use crate::decision::BucketId;

/// What a descriptor bucket's entry asks of the request's entry with the same position.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum EntryValue {
    /// No `value`: any value, and each value is counted apart (envoyproxy/ratelimit's bare key).
    Any,
    /// Exactly this value.
    Exact(Box<str>),
    /// A value written with a trailing `*`: any value that starts with the rest, each counted
    /// apart (envoyproxy/ratelimit's wildcard). `*` alone matches every value.
    Prefix(Box<str>),
}

impl EntryValue {
    /// `None` is any value; `"ba*"` a prefix; anything else exact.
    pub fn new(value: Option<&str>) -> Self {
        match value {
            None => EntryValue::Any,
            Some(v) => match v.strip_suffix('*') {
                Some(prefix) => EntryValue::Prefix(prefix.into()),
                None => EntryValue::Exact(v.into()),
            },
        }
    }

    /// Whether each value the entry matches has a count of its own.
    pub fn is_per_value(&self) -> bool {
        !matches!(self, EntryValue::Exact(_))
    }
}

/// One entry of a descriptor bucket.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct EntrySpec {
    pub key: Box<str>,
    pub value: EntryValue,
}

/// How a descriptor bucket answers, when it is the one a descriptor matched.
#[derive(
    Debug,
    Clone,
    Copy,
    Default,
    PartialEq,
    Eq,
    Hash,
    serde::Serialize,
    serde::Deserialize,
    schemars::JsonSchema,
)]
#[serde(rename_all = "kebab-case")]
#[schemars(rename = "DescriptorAnswer")]
pub enum Answer {
    /// The bucket's limit decides (the default).
    #[default]
    Limit,
    /// OK at once, never counted, `limit_remaining` the largest 32-bit number: envoyproxy/
    /// ratelimit's `unlimited: true`.
    Unlimited,
    /// OK with no limit, never counted: a descriptor that is known but not limited
    /// (envoyproxy/ratelimit's entry with neither `rate_limit` nor nested descriptors, which stops
    /// a less specific one from applying).
    Allow,
    /// Always over the limit: envoyproxy/ratelimit's `requests_per_unit: 0`. The bucket's limit
    /// gives only the unit Envoy is told.
    OverLimit,
}

impl Answer {
    pub fn name(self) -> &'static str {
        match self {
            Answer::Limit => "limit",
            Answer::Unlimited => "unlimited",
            Answer::Allow => "allow",
            Answer::OverLimit => "over-limit",
        }
    }
}

/// A validated `match: { descriptor: ... }`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct DescriptorSpec {
    pub domain: Box<str>,
    /// Never empty.
    pub entries: Box<[EntrySpec]>,
    pub answer: Answer,
    /// Names of buckets of the same service that this one replaces: when a request matches both
    /// (through any of its descriptors), the replaced one neither decides nor counts
    /// (envoyproxy/ratelimit's `replaces`).
    pub replaces: Box<[Box<str>]>,
}

impl DescriptorSpec {
    /// Whether the bucket counts each value of some entry apart (one limiter per combination of
    /// those values), rather than once for every request it matches.
    pub fn is_per_value(&self) -> bool {
        self.entries.iter().any(|e| e.value.is_per_value())
    }

    /// The values of `entries` that key the bucket's count: those of the entries without an
    /// exact value, in order. `entries` must be a descriptor this bucket matched (as many
    /// entries, in the same order).
    pub fn counted_values<'a, E: Entries + ?Sized>(
        &'a self,
        entries: &'a E,
    ) -> impl Iterator<Item = &'a str> + 'a {
        self.entries
            .iter()
            .enumerate()
            .filter(|(_, spec)| spec.value.is_per_value())
            .map(move |(i, _)| entries.value(i))
    }
}

/// `rl: foo, bar=banned, baz=sha*`: the domain and the entries as written, a domain, key or value
/// that holds punctuation of this form (`=`, `,`, `:`, `*`, a quote, a backslash or white space)
/// quoted with Rust's escapes (`d: "a=b"`, a key `a=b` of any value, is not `d: a=b`). Two
/// different descriptors never display alike, so the text can key them: validation finds
/// duplicates by it, and a `store: redis` bucket's key holds it.
impl fmt::Display for DescriptorSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_word(f, &self.domain)?;
        f.write_str(":")?;
        for (i, entry) in self.entries.iter().enumerate() {
            f.write_str(if i == 0 { " " } else { ", " })?;
            write_word(f, &entry.key)?;
            match &entry.value {
                EntryValue::Any => {}
                EntryValue::Exact(v) => {
                    f.write_str("=")?;
                    write_word(f, v)?;
                }
                EntryValue::Prefix(p) => {
                    f.write_str("=")?;
                    if !p.is_empty() {
                        write_word(f, p)?;
                    }
                    f.write_str("*")?;
                }
            }
        }
        Ok(())
    }
}

/// `text` as it is when it cannot be mistaken for the punctuation around it, else quoted.
fn write_word(f: &mut fmt::Formatter<'_>, text: &str) -> fmt::Result {
    let plain = !text.is_empty()
        && !text.chars().any(|c| {
            matches!(c, '=' | ',' | ':' | '*' | '"' | '\\') || c.is_whitespace() || c.is_control()
        });
    if plain {
        f.write_str(text)
    } else {
        write!(f, "{text:?}")
    }
}

/// A request descriptor's entries, borrowed from wherever the request keeps them.
/// The entry key that carries a request descriptor's criticality tier: Envoy's
/// `request_headers` action with `descriptor_key: criticality`. It is read as the tier and never
/// matched ([`WithoutTier`]), so one bucket serves a descriptor with or without it.
pub const CRITICALITY_KEY: &str = "criticality";

/// A request descriptor without its [`CRITICALITY_KEY`] entries: what buckets match. Reading it
/// walks the entries (a descriptor has a handful), allocating nothing.
pub struct WithoutTier<'a, E: ?Sized>(pub &'a E);

impl<E: Entries + ?Sized> WithoutTier<'_, E> {
    /// The position in the whole descriptor of the `index`-th entry that is not the tier.
    fn position(&self, index: usize) -> usize {
        (0..self.0.len())
            .filter(|&i| self.0.key(i) != CRITICALITY_KEY)
            .nth(index)
            .unwrap_or(usize::MAX)
    }

    /// The value of the descriptor's tier entry, if it has one.
    pub fn tier(&self) -> Option<&str> {
        (0..self.0.len())
            .find(|&i| self.0.key(i) == CRITICALITY_KEY)
            .map(|i| self.0.value(i))
    }
}

impl<E: Entries + ?Sized> Entries for WithoutTier<'_, E> {
    fn len(&self) -> usize {
        (0..self.0.len())
            .filter(|&i| self.0.key(i) != CRITICALITY_KEY)
            .count()
    }
    fn key(&self, index: usize) -> &str {
        self.0.key(self.position(index))
    }
    fn value(&self, index: usize) -> &str {
        self.0.value(self.position(index))
    }
}

pub trait Entries {
    fn len(&self) -> usize;
    fn key(&self, index: usize) -> &str;
    fn value(&self, index: usize) -> &str;
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Entries for [(&str, &str)] {
    fn len(&self) -> usize {
        <[_]>::len(self)
    }
    fn key(&self, index: usize) -> &str {
        self[index].0
    }
    fn value(&self, index: usize) -> &str {
        self[index].1
    }
}

impl Entries for [(String, String)] {
    fn len(&self) -> usize {
        <[_]>::len(self)
    }
    fn key(&self, index: usize) -> &str {
        &self[index].0
    }
    fn value(&self, index: usize) -> &str {
        &self[index].1
    }
}

/// Maps built once from the configuration and never grown: a fixed-seed hasher is safe here, as
/// in [`crate::matcher`].
type Hasher = foldhash::fast::FixedState;

/// A (key, value) pair borrowed from a request, hashed as the owned pair is.
#[derive(Hash)]
struct PairRef<'a>(&'a str, &'a str);

impl hashbrown::Equivalent<(Box<str>, Box<str>)> for PairRef<'_> {
    fn equivalent(&self, key: &(Box<str>, Box<str>)) -> bool {
        *self.0 == *key.0 && *self.1 == *key.1
    }
}

/// One level of a domain's tree: the children of a path of entries.
#[derive(Debug, Default)]
struct Node {
    /// The bucket whose entries end here.
    bucket: Option<BucketId>,
    exact: hashbrown::HashMap<(Box<str>, Box<str>), Node, Hasher>,
    /// (key, prefix), in configuration order: the first that matches wins.
    prefixes: Vec<(Box<str>, Box<str>, Node)>,
    bare: hashbrown::HashMap<Box<str>, Node, Hasher>,
}

impl Node {
    fn child(&mut self, entry: &EntrySpec) -> &mut Node {
        match &entry.value {
            EntryValue::Exact(v) => self
                .exact
                .entry((entry.key.clone(), v.clone()))
                .or_default(),
            EntryValue::Any => self.bare.entry(entry.key.clone()).or_default(),
            EntryValue::Prefix(p) => {
                let at = match self
                    .prefixes
                    .iter()
                    .position(|(k, q, _)| *k == entry.key && q == p)
                {
                    Some(at) => at,
                    None => {
                        self.prefixes
                            .push((entry.key.clone(), p.clone(), Node::default()));
                        self.prefixes.len() - 1
                    }
                };
                &mut self.prefixes[at].2
            }
        }
    }

    /// The most specific child for `(key, value)`: exact, then wildcard, then bare key.
    fn next(&self, key: &str, value: &str) -> Option<&Node> {
        self.exact
            .get(&PairRef(key, value))
            .or_else(|| {
                self.prefixes
                    .iter()
                    .find(|(k, prefix, _)| **k == *key && value.starts_with(&**prefix))
                    .map(|(_, _, node)| node)
            })
            .or_else(|| self.bare.get(key))
    }

    fn is_leaf(&self) -> bool {
        self.exact.is_empty() && self.prefixes.is_empty() && self.bare.is_empty()
    }
}

/// The compiled descriptor buckets of a configuration, by domain. Immutable once built; a lookup
/// allocates nothing and takes no lock.
#[derive(Debug, Default)]
pub struct DescriptorMatcher {
    domains: hashbrown::HashMap<Box<str>, Node, Hasher>,
}

impl DescriptorMatcher {
    /// Compiles the descriptor buckets; when two have the same domain and entries (which
    /// validation refuses) the first one is kept.
    pub fn compile<'a>(specs: impl IntoIterator<Item = (BucketId, &'a DescriptorSpec)>) -> Self {
        let mut domains: hashbrown::HashMap<Box<str>, Node, Hasher> = Default::default();
        for (bucket, spec) in specs {
            let mut node = domains.entry(spec.domain.clone()).or_default();
            for entry in spec.entries.iter() {
                node = node.child(entry);
            }
            node.bucket.get_or_insert(bucket);
        }
        Self { domains }
    }

    pub fn is_empty(&self) -> bool {
        self.domains.is_empty()
    }

    /// Whether any bucket names `domain`.
    pub fn has_domain(&self, domain: &str) -> bool {
        self.domains.contains_key(domain)
    }

    /// The bucket that decides the descriptor `entries` of `domain`, if any (see the module's
    /// documentation for the order).
    pub fn find<E: Entries + ?Sized>(&self, domain: &str, entries: &E) -> Option<BucketId> {
        let mut node = self.domains.get(domain)?;
        let last = entries.len().checked_sub(1)?;
        for i in 0..=last {
            let next = node.next(entries.key(i), entries.value(i))?;
            if i == last {
                return next.bucket;
            }
            if next.is_leaf() {
                // The configuration is shallower than the request (README, "Example 4").
                return None;
            }
            node = next;
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(domain: &str, entries: &[(&str, Option<&str>)]) -> DescriptorSpec {
        DescriptorSpec {
            domain: domain.into(),
            entries: entries
                .iter()
                .map(|(k, v)| EntrySpec {
                    key: (*k).into(),
                    value: EntryValue::new(*v),
                })
                .collect(),
            answer: Answer::Limit,
            replaces: Box::new([]),
        }
    }

    #[test]
    fn the_tier_entry_is_read_and_never_matched() {
        let wire: &[(&str, &str)] = &[
            ("remote_address", "10.0.0.1"),
            (CRITICALITY_KEY, "sheddable"),
            ("path", "/a"),
        ];
        let view = WithoutTier(wire);
        assert_eq!(view.len(), 2);
        assert_eq!((view.key(0), view.value(0)), ("remote_address", "10.0.0.1"));
        assert_eq!((view.key(1), view.value(1)), ("path", "/a"));
        assert_eq!(view.tier(), Some("sheddable"));
        let plain: &[(&str, &str)] = &[("remote_address", "10.0.0.1")];
        assert_eq!(WithoutTier(plain).tier(), None);
        assert_eq!(WithoutTier(plain).len(), 1);
    }

    #[test]
    fn displays_as_written() {
        let s = spec(
            "rl",
            &[("foo", None), ("bar", Some("banned")), ("baz", Some("sh*"))],
        );
        assert_eq!(s.to_string(), "rl: foo, bar=banned, baz=sh*");
        assert!(s.is_per_value());
        let entries = [("foo", "1"), ("bar", "banned"), ("baz", "shady")];
        assert_eq!(
            s.counted_values(&entries[..]).collect::<Vec<_>>(),
            ["1", "shady"]
        );
        // Punctuation and white space are quoted; `*` alone is any value, before the bare key.
        let quoted = spec(
            "my rl",
            &[
                ("a=b", None),
                ("k", Some("x, y")),
                ("p", Some("*")),
                ("q", Some("a b*")),
            ],
        );
        assert_eq!(
            quoted.to_string(),
            r#""my rl": "a=b", k="x, y", p=*, q="a b"*"#
        );
    }

    #[test]
    fn exact_then_wildcard_then_bare_key() {
        let specs = [
            spec("d", &[("ip", None)]),
            spec("d", &[("ip", Some("10.*"))]),
            spec("d", &[("ip", Some("10.0.0.5"))]),
        ];
        let m = DescriptorMatcher::compile(
            specs
                .iter()
                .enumerate()
                .map(|(i, s)| (BucketId(i as u32), s)),
        );
        let find = |v: &str| m.find("d", &[("ip", v)][..]);
        assert_eq!(find("10.0.0.5"), Some(BucketId(2)));
        assert_eq!(find("10.0.0.6"), Some(BucketId(1)));
        assert_eq!(find("192.0.2.1"), Some(BucketId(0)));
        assert_eq!(m.find("other", &[("ip", "1")][..]), None);
        assert_eq!(m.find("d", &[][..] as &[(&str, &str)]), None);
    }
}
