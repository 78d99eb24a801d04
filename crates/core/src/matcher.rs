//! Matching: from (caller, procedure, subjects) to the buckets that apply, without allocating.
//!
//! [`Matcher::compile`] puts a bucket whose caller and procedure are both exact, the bulk of a
//! mesh configuration, in one map keyed by the (caller, procedure) pair. Every other bucket goes
//! into a two-level index, first by caller, then by procedure, where on each level it sits in
//! exactly one place, chosen by how its key is written:
//!
//! | key in `match`     | where it goes   | looked up by a request that...        |
//! | ------------------ | --------------- | ------------------------------------- |
//! | missing            | `any`           | always (the attribute may be missing) |
//! | `"*"`              | `present`       | carries the attribute                 |
//! | exact, `gw`        | hash map        | carries exactly `gw`                  |
//! | glob, `api-*`      | glob list, indexed by literal prefix | carries a value the glob matches |
//!
//! A lookup therefore reads one pair entry, and on each level one hash map entry, a few
//! `any`/`present` groups and one prefix probe per distinct glob-prefix length; with 1,000 buckets
//! it touches the few candidates of the request, not the 1,000. Subjects are checked last, on the
//! candidates only, because per-subject buckets are few and their check is a plain string
//! comparison.
//!
//! DESIGN.md suggests caching results per (caller, procedure) pair; the pair map resolves one
//! with a single hash lookup, and a cache filled at request time would need a lock or an
//! allocation on the hot path, so there is none.

use std::collections::HashMap;

use crate::decision::BucketId;
use crate::pattern::{MatchSpec, Pattern, RequestAttrs, Subject};

/// Exact keys come from the configuration and lookups from requests, so a request can choose what
/// it hashes. A fixed-seed fast hasher is still safe here: flooding needs the attacker to *insert*
/// colliding keys, and the tables are built once from the configuration and never grow. A
/// request-chosen key can at worst land on the longest probe sequence the fixed table already has,
/// which is short at hashbrown's load factor.
type ExactMap<V> = HashMap<Box<str>, V, foldhash::fast::FixedState>;

/// Exact (caller, procedure) pairs; hashbrown's map, because a lookup by a pair of borrowed
/// strings needs its `Equivalent` (the standard map can only borrow a key as one type).
type PairMap = hashbrown::HashMap<(Box<str>, Box<str>), Candidates, foldhash::fast::FixedState>;

/// A request's (caller, procedure), hashed exactly as the owned pair is.
#[derive(Hash)]
struct PairRef<'a>(&'a str, &'a str);

impl hashbrown::Equivalent<(Box<str>, Box<str>)> for PairRef<'_> {
    fn equivalent(&self, key: &(Box<str>, Box<str>)) -> bool {
        *self.0 == *key.0 && *self.1 == *key.1
    }
}

/// The buckets that a request matched, in ascending [`BucketId`] order.
///
/// Reuse one per thread (or per connection): [`Matcher::find`] clears it and refills it, and once
/// its capacity has reached [`Matcher::max_matches`] (see [`Matcher::matches_buffer`]) it never
/// allocates again.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Matches {
    buckets: Vec<BucketId>,
}

impl Matches {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn with_capacity(capacity: usize) -> Self {
        Self {
            buckets: Vec::with_capacity(capacity),
        }
    }

    pub fn as_slice(&self) -> &[BucketId] {
        &self.buckets
    }

    pub fn iter(&self) -> std::iter::Copied<std::slice::Iter<'_, BucketId>> {
        self.buckets.iter().copied()
    }

    pub fn len(&self) -> usize {
        self.buckets.len()
    }

    pub fn is_empty(&self) -> bool {
        self.buckets.is_empty()
    }

    pub fn capacity(&self) -> usize {
        self.buckets.capacity()
    }
}

impl<'a> IntoIterator for &'a Matches {
    type Item = BucketId;
    type IntoIter = std::iter::Copied<std::slice::Iter<'a, BucketId>>;

    fn into_iter(self) -> Self::IntoIter {
        self.iter()
    }
}

/// The compiled form of a configuration's match specs. Immutable once built; share it behind an
/// `Arc` (or `arc-swap`) and call [`Matcher::find`] from any number of threads.
#[derive(Debug, Clone, Default)]
pub struct Matcher {
    /// Specs with an exact caller and an exact procedure, the bulk of a mesh configuration,
    /// reached with one hash of the pair instead of one per level.
    pairs: PairMap,
    by_caller: Level<Level<Candidates>>,
    buckets: usize,
    max_matches: usize,
}

impl Matcher {
    /// Compiles specs; the n-th spec is bucket `n`.
    ///
    /// # Panics
    /// With more than `u32::MAX` specs, which no configuration file comes near.
    pub fn compile<'a>(specs: impl IntoIterator<Item = &'a MatchSpec>) -> Self {
        Self::compile_some(specs.into_iter().map(Some))
    }

    /// Like [`Matcher::compile`], where a `None` takes its bucket's id but matches no request:
    /// how descriptor buckets, which only Envoy's RLS requests reach, keep their ids.
    ///
    /// # Panics
    /// With more than `u32::MAX` specs.
    pub fn compile_some<'a>(specs: impl IntoIterator<Item = Option<&'a MatchSpec>>) -> Self {
        let mut pairs = PairMap::default();
        let mut by_caller: Level<Level<Candidates>> = Level::default();
        let mut buckets = 0;
        for (position, spec) in specs.into_iter().enumerate() {
            buckets = position + 1;
            let Some(spec) = spec else { continue };
            let bucket = BucketId(u32::try_from(position).expect("more than u32::MAX buckets"));
            let candidate = Candidate {
                bucket,
                subject: spec.subject.clone(),
            };
            // Buckets arrive in ascending order, so every candidate list is sorted by
            // construction and `find` only has to interleave a few sorted runs.
            match (&spec.caller, &spec.procedure) {
                (Some(Pattern::Exact(caller)), Some(Pattern::Exact(procedure))) => pairs
                    .entry((caller.clone(), procedure.clone()))
                    .or_default()
                    .push(candidate),
                (caller, procedure) => by_caller
                    .slot(caller.as_ref())
                    .slot(procedure.as_ref())
                    .push(candidate),
            }
        }
        // A request reaches at most one pair, plus what the levels give it.
        let max_matches = by_caller.bound() + pairs.values().map(Vec::len).max().unwrap_or(0);
        Self {
            pairs,
            by_caller,
            buckets,
            max_matches,
        }
    }

    /// How many buckets were compiled.
    pub fn len(&self) -> usize {
        self.buckets
    }

    pub fn is_empty(&self) -> bool {
        self.buckets == 0
    }

    /// An upper bound on how many buckets one request can match: the most candidates that every
    /// group a single request can reach holds together. Usually far below [`Matcher::len`].
    pub fn max_matches(&self) -> usize {
        self.max_matches
    }

    /// A buffer large enough that [`Matcher::find`] never grows it, not even on the first call.
    pub fn matches_buffer(&self) -> Matches {
        Matches::with_capacity(self.max_matches)
    }

    /// Replaces the contents of `out` with every bucket whose spec matches `request`
    /// ([`MatchSpec::matches`] is the definition), in ascending order. Allocates only when `out`
    /// is smaller than the result.
    pub fn find(&self, request: &RequestAttrs<'_>, out: &mut Matches) {
        let found = &mut out.buckets;
        found.clear();
        if let (Some(caller), Some(procedure)) = (request.caller, request.procedure)
            && let Some(candidates) = self.pairs.get(&PairRef(caller, procedure))
        {
            found.extend(
                candidates
                    .iter()
                    .filter(|c| c.admits(request))
                    .map(|c| c.bucket),
            );
        }
        self.by_caller.visit(request.caller, |by_procedure| {
            by_procedure.visit(request.procedure, |candidates| {
                found.extend(
                    candidates
                        .iter()
                        .filter(|c| c.admits(request))
                        .map(|c| c.bucket),
                );
            });
        });
        // Each group's run is sorted; an in-place unstable sort of the few results joins them
        // without allocating, in linear time when a single group matched (the common case).
        found.sort_unstable();
    }
}

/// A bucket reached through its caller and procedure, with the subject check that remains.
#[derive(Debug, Clone)]
struct Candidate {
    bucket: BucketId,
    subject: Option<Subject>,
}

impl Candidate {
    fn admits(&self, request: &RequestAttrs<'_>) -> bool {
        match &self.subject {
            None => true,
            Some(s) => request
                .subject(s.kind)
                .is_some_and(|value| s.value.matches(value)),
        }
    }
}

type Candidates = Vec<Candidate>;

/// One attribute's index (caller, then procedure): the groups `T` reached by each kind of key.
#[derive(Debug, Clone, Default)]
struct Level<T> {
    /// Specs without this key: they match whether or not the request has the attribute.
    any: Option<T>,
    /// Specs with `*` (or `**`...): the attribute must be present, its value does not matter.
    present: Option<T>,
    exact: ExactMap<T>,
    /// One entry per distinct glob, in order of first appearance.
    globs: Vec<(Pattern, T)>,
    /// The globs by their literal prefix (the text before the first `*`), one map per distinct
    /// prefix length: a lookup costs one probe per length, and only the globs whose prefix the
    /// value starts with are run. Forty globs like `team7-*` and `/pkg3.v1.*` take four probes
    /// instead of forty glob runs.
    by_prefix: Vec<(usize, PrefixMap)>,
    /// Globs that start with `*` (`*.Charge`): they have no prefix to index and are always run.
    unprefixed: Vec<usize>,
}

/// Glob prefixes as bytes, since a request value's first `n` bytes need not end on a character
/// boundary; values are positions in [`Level::globs`].
type PrefixMap = HashMap<Box<[u8]>, Vec<usize>, foldhash::fast::FixedState>;

impl<T: Default> Level<T> {
    fn slot(&mut self, pattern: Option<&Pattern>) -> &mut T {
        match pattern {
            None => self.any.get_or_insert_with(T::default),
            Some(p) if p.is_any() => self.present.get_or_insert_with(T::default),
            Some(Pattern::Exact(text)) => self.exact.entry(text.clone()).or_default(),
            Some(glob) => {
                let index = match self.globs.iter().position(|(g, _)| g == glob) {
                    Some(index) => index,
                    None => {
                        self.globs.push((glob.clone(), T::default()));
                        let index = self.globs.len() - 1;
                        self.index_prefix(glob.as_str(), index);
                        index
                    }
                };
                &mut self.globs[index].1
            }
        }
    }

    fn index_prefix(&mut self, glob: &str, index: usize) {
        let prefix = glob.split('*').next().unwrap_or_default().as_bytes();
        if prefix.is_empty() {
            self.unprefixed.push(index);
            return;
        }
        let map = match self
            .by_prefix
            .iter()
            .position(|(len, _)| *len == prefix.len())
        {
            Some(at) => &mut self.by_prefix[at].1,
            None => {
                self.by_prefix.push((prefix.len(), PrefixMap::default()));
                &mut self.by_prefix.last_mut().expect("just pushed").1
            }
        };
        map.entry(prefix.into()).or_default().push(index);
    }
}

impl<T> Level<T> {
    /// Calls `f` on every group that a request with this attribute value can match.
    fn visit(&self, value: Option<&str>, mut f: impl FnMut(&T)) {
        if let Some(group) = &self.any {
            f(group);
        }
        let Some(value) = value else { return };
        if let Some(group) = &self.present {
            f(group);
        }
        if let Some(group) = self.exact.get(value) {
            f(group);
        }
        let bytes = value.as_bytes();
        let prefixed = self.by_prefix.iter().filter_map(|(len, map)| {
            bytes
                .get(..*len)
                .and_then(|prefix| map.get(prefix))
                .map(Vec::as_slice)
        });
        for index in prefixed.flatten().chain(&self.unprefixed) {
            let (glob, group) = &self.globs[*index];
            if glob.matches(value) {
                f(group);
            }
        }
    }
}

/// An upper bound on the matches a request can draw from a group.
trait Bound {
    fn bound(&self) -> usize;
}

impl Bound for Candidates {
    fn bound(&self) -> usize {
        self.len()
    }
}

impl<T: Bound> Bound for Level<T> {
    /// A request reaches `any`, `present`, at most one exact group, and possibly every glob.
    fn bound(&self) -> usize {
        let optional = |group: &Option<T>| group.as_ref().map_or(0, T::bound);
        optional(&self.any)
            + optional(&self.present)
            + self.exact.values().map(T::bound).max().unwrap_or(0)
            + self
                .globs
                .iter()
                .map(|(_, group)| group.bound())
                .sum::<usize>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pattern::{SubjectKind, SubjectValue};

    fn spec(caller: Option<&str>, procedure: Option<&str>) -> MatchSpec {
        MatchSpec {
            caller: caller.map(Pattern::new),
            procedure: procedure.map(Pattern::new),
            subject: None,
        }
    }

    #[test]
    fn the_bound_counts_every_group_one_request_can_reach() {
        let specs = [
            spec(Some("gw"), Some("/a")),
            spec(Some("gw"), Some("/a")),
            spec(Some("gw"), Some("/b")),
            spec(Some("other"), Some("/a")),
            spec(Some("g*"), None),
            spec(None, Some("/a/*")),
            spec(None, None),
        ];
        let matcher = Matcher::compile(&specs);
        // gw: its largest exact procedure group (2); plus the glob caller (1); plus the caller-less
        // group's glob procedure (1) and its procedure-less group (1).
        assert_eq!(matcher.max_matches(), 5);
        let mut out = matcher.matches_buffer();
        matcher.find(
            &RequestAttrs {
                caller: Some("gw"),
                procedure: Some("/a"),
                ..RequestAttrs::default()
            },
            &mut out,
        );
        assert_eq!(out.as_slice(), [0, 1, 4, 6].map(BucketId));
    }

    #[test]
    fn candidates_check_their_subject_last() {
        let specs = [MatchSpec {
            subject: Some(Subject {
                kind: SubjectKind::Org,
                value: SubjectValue::new("acme"),
            }),
            ..spec(Some("gw"), None)
        }];
        let matcher = Matcher::compile(&specs);
        let mut request = RequestAttrs {
            caller: Some("gw"),
            ..RequestAttrs::default()
        };
        let mut out = Matches::new();
        matcher.find(&request, &mut out);
        assert!(out.is_empty());
        request.subjects[SubjectKind::Org.index()] = Some("acme");
        matcher.find(&request, &mut out);
        assert_eq!(out.as_slice(), [BucketId(0)]);
    }
}
