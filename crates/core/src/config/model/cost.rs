//! What one request costs (`cost:`): a fixed number, read from a request header, or reported by
//! the response (a token budget: the usage an LLM API reports when its answer ends).

use super::*;

/// What one request costs: a fixed number, read from a header, or reported by the response.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, JsonSchema)]
#[serde(untagged)]
pub enum Cost {
    /// `cost: 100`: every request costs this many units.
    Fixed(NonZeroU64),
    /// `cost: { header: x-cost, default: 1 }`.
    Header(CostHeader),
    /// `cost: { response: "json:usage", request: 500, weights: { input_tokens: 1, output_tokens: 4 } }`.
    Response(CostResponse),
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
            Cost::Response(r) => {
                write!(f, "response {}", r.response)?;
                if let Some(request) = r.request {
                    write!(f, " (estimate {request})")?;
                }
                Ok(())
            }
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

/// A cost the response reports when it ends (a token budget). The request is admitted while the
/// bucket is not in debt, reserving `request` units when given; the reported cost is debited
/// when the response ends, whatever its status, and may put the bucket into debt that later
/// requests pay by waiting.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CostResponse {
    /// Where the response reports its cost: `header:NAME`, `trailer:NAME`, `json:PATH` (a
    /// dotted path into a JSON body, e.g. `json:usage.total_tokens`) or `sse:PATH` (the last
    /// `data:` event of a `text/event-stream` body that carries PATH); on an Envoy descriptor
    /// bucket, `hits_addend` (the call Envoy makes when the response ends, its
    /// `apply_on_stream_done` rate limit, carries the cost as the descriptor's `hits_addend`).
    #[schemars(regex(pattern = r"^((header|trailer|json|sse):.+|hits_addend)$"))]
    pub response: String,
    /// The estimate reserved when the request is admitted, and refunded or topped up when the
    /// response reports. Default: nothing reserved (the request needs a bucket not in debt).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request: Option<NonZeroU64>,
    /// The cost as a weighted sum of the numeric fields of the object PATH names, e.g.
    /// `{ input_tokens: 1, output_tokens: 4 }` with `json:usage`. Default: PATH names the cost.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weights: Option<BTreeMap<String, u64>>,
    /// What a response that never reports its cost (missing, malformed, cut short) is charged.
    /// Default: the `request` estimate, or 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default: Option<NonZeroU64>,
}

/// The response source of an Envoy descriptor bucket whose cost Envoy's call at the end of the
/// response reports in `hits_addend`.
pub const HITS_ADDEND: &str = "hits_addend";

/// Where in a response its cost is, parsed from [`CostResponse::response`].
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum ResponseSource {
    /// A response header, lower case.
    Header(String),
    /// A trailer field (HTTP/2 trailers, HTTP/1.1 chunked trailers), lower case.
    Trailer(String),
    /// A dotted path into the JSON body.
    Json(Vec<String>),
    /// A dotted path into the JSON of the last `data:` event that carries it.
    Sse(Vec<String>),
    /// Envoy's settlement call at the end of the response (`apply_on_stream_done`): the
    /// descriptor's `hits_addend` is the cost. Descriptor buckets only.
    HitsAddend,
}

impl ResponseSource {
    /// Parses `header:NAME`, `trailer:NAME`, `json:PATH` or `sse:PATH`; the error says what is
    /// wrong and what would be right.
    pub fn parse(text: &str) -> Result<Self, String> {
        if text == HITS_ADDEND {
            return Ok(ResponseSource::HitsAddend);
        }
        let Some((kind, rest)) = text.split_once(':') else {
            return Err(format!(
                "response \"{text}\" names no source; use header:NAME, trailer:NAME, json:PATH or sse:PATH, like json:usage.total_tokens"
            ));
        };
        let name = |rest: &str| {
            if is_header_name(rest) {
                Ok(rest.to_ascii_lowercase())
            } else {
                Err(format!(
                    "\"{rest}\" is not a valid header name; use letters, digits and '-', like x-usage-tokens"
                ))
            }
        };
        let path = |rest: &str| {
            let parts: Vec<String> = rest.split('.').map(str::to_owned).collect();
            if parts.iter().any(String::is_empty) {
                Err(format!(
                    "path \"{rest}\" has an empty step; write keys joined by '.', like usage.total_tokens"
                ))
            } else {
                Ok(parts)
            }
        };
        match kind {
            "header" => name(rest).map(ResponseSource::Header),
            "trailer" => name(rest).map(ResponseSource::Trailer),
            "json" => path(rest).map(ResponseSource::Json),
            "sse" => path(rest).map(ResponseSource::Sse),
            other => Err(format!(
                "response source \"{other}\" is unknown; use header:NAME, trailer:NAME, json:PATH or sse:PATH"
            )),
        }
    }

    /// Whether the source reads the body (and so may name an object to weigh).
    pub fn reads_body(&self) -> bool {
        matches!(self, ResponseSource::Json(_) | ResponseSource::Sse(_))
    }
}

impl CostResponse {
    /// The parsed source; validation has refused a file whose source does not parse.
    pub fn source(&self) -> Result<ResponseSource, String> {
        ResponseSource::parse(&self.response)
    }

    /// What a response that never reports is charged: `default`, else the estimate, else 1.
    pub fn fallback(&self) -> u64 {
        self.default.or(self.request).map_or(1, NonZeroU64::get)
    }

    /// The estimate reserved at admission (0: none).
    pub fn estimate(&self) -> u64 {
        self.request.map_or(0, NonZeroU64::get)
    }
}

pub(super) fn one() -> NonZeroU64 {
    NonZeroU64::MIN
}

/// Every key a `cost:` map may hold, read before knowing which kind of cost it is.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CostMap {
    header: Option<String>,
    response: Option<String>,
    request: Option<NonZeroU64>,
    weights: Option<BTreeMap<String, u64>>,
    default: Option<NonZeroU64>,
}

impl<'de> Deserialize<'de> for Cost {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct CostVisitor;
        impl<'de> de::Visitor<'de> for CostVisitor {
            type Value = Cost;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str(
                    "a whole number of at least 1, { header: x-cost, default: 1 } or { response: \"json:usage.total_tokens\" }",
                )
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
                let map = CostMap::deserialize(MapAccessDeserializer::new(map))?;
                match (map.header, map.response) {
                    (Some(_), Some(_)) => Err(de::Error::custom(
                        "cost takes `header` (the request says its cost) or `response` (the response reports it), not both",
                    )),
                    (Some(header), None) => {
                        if map.request.is_some() || map.weights.is_some() {
                            return Err(de::Error::custom(
                                "`request` and `weights` belong to a cost the response reports (`response: ...`), not to `header`",
                            ));
                        }
                        Ok(Cost::Header(CostHeader {
                            header,
                            default: map.default.unwrap_or(NonZeroU64::MIN),
                        }))
                    }
                    (None, Some(response)) => Ok(Cost::Response(CostResponse {
                        response,
                        request: map.request,
                        weights: map.weights,
                        default: map.default,
                    })),
                    (None, None) => Err(de::Error::custom(
                        "cost needs `header: NAME` (the request says its cost) or `response: SOURCE` (the response reports it, like json:usage.total_tokens)",
                    )),
                }
            }
        }
        deserializer.deserialize_any(CostVisitor)
    }
}
