//! What one request costs (`cost:`): a fixed number, or read from a header.

use super::*;

/// What one request costs: a fixed number, or read from a header.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, JsonSchema)]
#[serde(untagged)]
pub enum Cost {
    /// `cost: 100`: every request costs this many units.
    Fixed(NonZeroU64),
    /// `cost: { header: x-cost, default: 1 }`.
    Header(CostHeader),
}

impl Default for Cost {
    fn default() -> Self {
        Cost::Fixed(NonZeroU64::MIN)
    }
}

impl fmt::Display for Cost {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Cost::Fixed(n) => write!(f, "{n}"),
            Cost::Header(h) => write!(f, "header {} (default {})", h.header, h.default),
        }
    }
}

/// A cost read from a request header, with the cost of a request that lacks it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CostHeader {
    /// The header that carries the cost, e.g. `x-cost`.
    pub header: String,
    /// The cost when the header is missing or not a whole number. Default 1.
    #[serde(default = "one")]
    pub default: NonZeroU64,
}

pub(super) fn one() -> NonZeroU64 {
    NonZeroU64::MIN
}

impl<'de> Deserialize<'de> for Cost {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct CostVisitor;
        impl<'de> de::Visitor<'de> for CostVisitor {
            type Value = Cost;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a whole number of at least 1, or { header: x-cost, default: 1 }")
            }
            fn visit_u64<E: de::Error>(self, n: u64) -> Result<Cost, E> {
                NonZeroU64::new(n).map(Cost::Fixed).ok_or_else(|| {
                    E::custom("cost 0: a request costs at least 1; to exempt requests, narrow the bucket's match")
                })
            }
            fn visit_i64<E: de::Error>(self, n: i64) -> Result<Cost, E> {
                match u64::try_from(n) {
                    Ok(n) => self.visit_u64(n),
                    Err(_) => Err(E::custom(format_args!(
                        "cost {n}: a request costs at least 1"
                    ))),
                }
            }
            fn visit_map<A: de::MapAccess<'de>>(self, map: A) -> Result<Cost, A::Error> {
                CostHeader::deserialize(MapAccessDeserializer::new(map)).map(Cost::Header)
            }
        }
        deserializer.deserialize_any(CostVisitor)
    }
}
