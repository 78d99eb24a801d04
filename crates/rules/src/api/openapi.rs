//! The OpenAPI document served at `/openapi.json`: what utoipa generates from the handlers'
//! annotations ([`ApiDoc`]), completed with what the annotations cannot say.
//!
//! - A rule's body is described as the service validates it: which algorithms take a `burst`
//!   or a `burst_window`, which stores each algorithm fits, at most one subject in `match`, no
//!   NUL anywhere, a `reason` with every `ttl`. So a client (or a fuzzer) that follows the
//!   document sends rules the service accepts, and one that does not gets a 422.
//! - The body of `POST /v1/rules:apply` is a configuration file, described as one.
//! - The answers every `/v1` route can give whatever it does: 401 without a valid token, 429
//!   and 503 from the guard of the token checks (and 503 while the store is down), and 400 and
//!   413 for a route that reads a body.

use std::sync::LazyLock;

use serde_json::{Map, Value, json};
use utoipa::OpenApi;

use super::ApiDoc;
use crate::rule::MAX_REASON_BYTES;

/// The document, built once.
pub fn document() -> &'static Value {
    static DOCUMENT: LazyLock<Value> = LazyLock::new(build);
    &DOCUMENT
}

/// A name of the configuration file: a service's or a bucket's.
const NAME: &str = r"^[A-Za-z0-9][A-Za-z0-9._-]*$";
/// Text that is not blank, without NUL (which the PostgreSQL store cannot hold).
const TEXT: &str = r"^[^\u0000]*[^\u0000\s][^\u0000]*$";
/// A count over a period, as the configuration file writes it (`100 per 30s` is accepted too).
const LIMIT: &str = r"^[1-9][0-9]{0,8}/(s|min|h|d)$";
/// A token's lifetime: a whole number and a unit (at most 9999 days).
const DURATION: &str = r"^[1-9][0-9]{0,3}(ms|s|m|min|h|d)$";
/// A header name.
const HEADER: &str = r"^[A-Za-z0-9][A-Za-z0-9-]*$";

/// Exact algorithms that take a burst and can go into debt (leaky-bucket takes a burst but
/// cannot), those that take no burst, and those the control plane runs.
const DEBT_ALGORITHMS: [&str; 2] = ["token-bucket", "gcra"];
const WINDOW_ALGORITHMS: [&str; 3] = [
    "fixed-window",
    "sliding-window-log",
    "sliding-window-counter",
];

fn string(pattern: &str) -> Value {
    json!({"type": "string", "pattern": pattern})
}

/// Optional keys may be sent as null, which means left out.
fn nullable(schema: Value) -> Value {
    json!({"anyOf": [schema, {"type": "null"}]})
}

fn problem() -> Value {
    json!({"application/problem+json": {"schema": {"$ref": "#/components/schemas/Problem"}}})
}

fn retry_after() -> Value {
    json!({"retry-after": {"description": "Seconds", "schema": {"type": "integer", "minimum": 0}}})
}

/// `match`: caller and procedure, and at most one subject; no empty value.
fn match_schema() -> Value {
    // Not blank: an empty value would match no request.
    let value = nullable(string(TEXT));
    let subjects = ["user", "org", "api_key", "ip"];
    let mut pairs = Vec::new();
    for (i, a) in subjects.iter().enumerate() {
        for b in &subjects[i + 1..] {
            // Null is left out, so two subjects are two strings.
            pairs.push(json!({"required": [a, b], "properties": {
                *a: {"type": "string"}, *b: {"type": "string"}}}));
        }
    }
    json!({
        "type": "object",
        "description": "Which requests count against the rule: exact values or globs with `*`. \
            caller and procedure, and at most one subject (user, org, api_key or ip); \
            a key left out matches anything.",
        "properties": {
            "caller": value, "procedure": value,
            "user": value, "org": value, "api_key": value, "ip": value,
        },
        "additionalProperties": false,
        "not": {"anyOf": pairs},
    })
}

/// The bucket keys of the configuration file for one family of algorithms.
fn bucket_variant(
    algorithms: &[&str],
    algorithm_required: bool,
    stores: &[&str],
    response_cost: bool,
    extra: &[(&str, Value)],
) -> Map<String, Value> {
    let mut properties = Map::new();
    properties.insert("name".into(), string(NAME));
    properties.insert(
        "match".into(),
        json!({"$ref": "#/components/schemas/MatchBody"}),
    );
    properties.insert(
        "limit".into(),
        json!({"type": "string", "pattern": LIMIT, "example": "100/s",
            "description": "A count over a period: `5000/s`, `300/min`, `1000/h`, `10000/d`"}),
    );
    properties.insert("algorithm".into(), json!({"enum": algorithms}));
    properties.insert("store".into(), nullable(json!({"enum": stores})));
    properties.insert(
        "scope".into(),
        json!({"enum": ["global", "region", "zone"]}),
    );
    properties.insert("mode".into(), json!({"enum": ["enforce", "shadow"]}));
    properties.insert("cost".into(), cost_schema(response_cost));
    properties.insert(
        "on_store_failure".into(),
        nullable(json!({"enum": ["open", "closed"]})),
    );
    // A key the family does not take may still be sent as null, which means left out.
    for key in ["burst", "burst_window"] {
        properties.insert(key.into(), json!({"type": "null"}));
    }
    for (key, schema) in extra {
        properties.insert((*key).into(), schema.clone());
    }
    let mut required = vec!["name", "limit"];
    if algorithm_required {
        required.push("algorithm");
    }
    let mut variant = Map::new();
    variant.insert("type".into(), json!("object"));
    variant.insert("required".into(), json!(required));
    variant.insert("properties".into(), Value::Object(properties));
    variant.insert("additionalProperties".into(), json!(false));
    if response_cost && stores == ["control-plane"] {
        // A token budget in the control plane is one budget for the bucket's scope: not one
        // per value of a subject.
        let each: Vec<Value> = ["user", "org", "api_key", "ip"]
            .iter()
            .map(|k| json!({"required": [k], "properties": {*k: {"const": "*"}}}))
            .collect();
        variant.insert(
            "not".into(),
            json!({"required": ["cost", "match"], "properties": {
                "cost": {"type": "object", "required": ["response"],
                    "properties": {"response": {"type": "string"}}},
                "match": {"anyOf": each},
            }}),
        );
    }
    variant
}

/// `cost`: a whole number, a request header, or (`response`, for the algorithms that can go
/// into debt) a cost the response reports. Optional keys may be null; `weights` only with a
/// body's source, naming at least one field of weight above zero.
fn cost_schema(response: bool) -> Value {
    let count = json!({"type": "integer", "minimum": 1, "maximum": u64::MAX});
    let none = json!({"type": "null"});
    let mut variants = vec![
        count.clone(),
        json!({"type": "object", "required": ["header"], "additionalProperties": false,
        "properties": {
           "header": string(HEADER),
           "default": nullable(count.clone()),
           "response": none, "request": none, "weights": none,
        }}),
    ];
    if response {
        let weights = json!({"type": "object", "minProperties": 1,
            "propertyNames": {"pattern": r"^[^\u0000]*$"},
            "additionalProperties": {"type": "integer", "minimum": 0, "maximum": u64::MAX},
            "not": {"additionalProperties": {"const": 0}}});
        for (source, weights) in [
            // A header or trailer carries one number: no weights.
            (
                r"^(header|trailer):[-A-Za-z0-9!#$%&'*+.^_`|~]+$",
                none.clone(),
            ),
            // A dotted path into a JSON body or the last SSE event.
            (
                r"^(json|sse):[^.\u0000]+(\.[^.\u0000]+)*$",
                nullable(weights),
            ),
        ] {
            variants.push(json!({"type": "object", "required": ["response"],
            "additionalProperties": false,
            "properties": {
                "response": {"type": "string", "pattern": source,
                    "example": "json:usage.total_tokens"},
                "request": nullable(count.clone()),
                "weights": weights,
                "default": nullable(count.clone()),
                "header": none,
            }}));
        }
    }
    let mut description =
        "A whole number, or `{ \"header\": \"x-cost\", \"default\": 1 }`".to_owned();
    if response {
        description.push_str(", or a cost the response reports (a token budget): `{ \"response\": \"json:usage\", \"request\": 500, \"weights\": { \"input_tokens\": 1, \"output_tokens\": 4 }, \"default\": 1000 }`");
    }
    json!({"description": description, "oneOf": variants})
}

/// A bucket in its four families; `rule` adds what a single rule carries besides.
fn bucket_schema(rule: bool, exact_stores: &[&str]) -> Value {
    let burst = (
        "burst",
        nullable(json!({"type": "integer", "minimum": 1, "maximum": u64::MAX,
            "description": "How far above the steady rate a burst may go, in requests"})),
    );
    let burst_window = (
        "burst_window",
        nullable(
            json!({"type": "string", "pattern": r"^([1-9]|1[0-9]|20)s$|^[1-9][0-9]{0,3}ms$",
            "description": "How long unused tokens are kept: at most 20s (default 10s)"}),
        ),
    );
    let mut variants = vec![
        // A cost the response reports needs a meter that can go into debt.
        bucket_variant(
            &DEBT_ALGORITHMS,
            true,
            exact_stores,
            true,
            std::slice::from_ref(&burst),
        ),
        bucket_variant(&["leaky-bucket"], true, exact_stores, false, &[burst]),
        bucket_variant(&WINDOW_ALGORITHMS, true, exact_stores, false, &[]),
        bucket_variant(
            &["adaptive-token-bucket"],
            true,
            &["control-plane"],
            false,
            &[burst_window],
        ),
        // Without `algorithm` a bucket is a drop-ratio one.
        // A drop-ratio bucket may hold a token budget: its hosts report the tokens
        // their responses spent.
        bucket_variant(&["drop-ratio"], false, &["control-plane"], true, &[]),
    ];
    if rule {
        for variant in &mut variants {
            let required = variant["required"].as_array_mut().expect("an array");
            required.insert(0, json!("service"));
            let properties = variant["properties"].as_object_mut().expect("an object");
            properties.insert(
                "service".into(),
                json!({"type": "string", "pattern": NAME, "description": "The protected service"}),
            );
            properties.insert(
                "ttl".into(),
                nullable(json!({"type": "string",
                    "pattern": r"^[1-9][0-9]{0,3}(ms|s|m|min)$|^[1-9][0-9]?h$|^[1-7]d$",
                    "description": "Makes the rule an incident override that ends after this long, \
                        like `15m`; at most the service's maximum (`rules serve --max-override-ttl`, 7d \
                        unless set). It then needs a `reason`."})),
            );
            properties.insert(
                "reason".into(),
                // Any text but NUL; not blank only for an override (below).
                nullable(json!({"type": "string", "maxLength": MAX_REASON_BYTES,
                    "pattern": r"^[^\u0000]*$",
                    "description": "Why, for the audit log; at most 4096 bytes"})),
            );
            // A `ttl` needs a `reason` that is not blank.
            variant.insert(
                "if".into(),
                json!({"required": ["ttl"], "properties": {"ttl": {"type": "string"}}}),
            );
            variant.insert(
                "then".into(),
                json!({"required": ["reason"], "properties": {"reason": string(TEXT)}}),
            );
        }
    }
    let description = if rule {
        "A rule as sent: a bucket of the configuration file plus its service. With a `ttl` it is \
         an incident override that ends by itself; it then needs a `reason`. The keys an answer \
         adds (id, version, ...) may be sent back and are ignored."
    } else {
        "A bucket of the configuration file"
    };
    json!({"description": description, "oneOf": variants})
}

/// `POST /v1/rules:apply`'s body: a whole configuration file (here one bucket per service, so
/// that no two conflict; the service takes any number).
fn config_schema() -> Value {
    json!({
        "type": "object",
        "description": "A configuration file, as `spillway check` reads it",
        "required": ["version"],
        "additionalProperties": false,
        "properties": {
            "version": {"const": 1},
            "services": {
                "type": "object",
                "propertyNames": {"pattern": NAME},
                "additionalProperties": {
                    "type": "object",
                    "required": ["buckets"],
                    "additionalProperties": false,
                    "properties": {
                        "buckets": {
                            "type": "array",
                            "maxItems": 1,
                            "items": {"$ref": "#/components/schemas/Bucket"},
                        },
                    },
                },
            },
        },
    })
}

/// The answers of every `/v1` route besides its own.
fn common_answers(operation: &mut Map<String, Value>) {
    let has_body = operation.contains_key("requestBody");
    let responses = operation
        .entry("responses")
        .or_insert_with(|| json!({}))
        .as_object_mut()
        .expect("responses are an object");
    let mut add = |status: &str, description: &str, headers: Option<Value>| {
        let mut answer = json!({"description": description, "content": problem()});
        if let Some(headers) = headers {
            answer["headers"] = headers;
        }
        responses.entry(status).or_insert(answer);
    };
    add("401", "No valid token", None);
    add(
        "429",
        "Too many wrong tokens from this address or for this token id: the token was not checked",
        Some(retry_after()),
    );
    add(
        "503",
        "The store is unavailable, or every token check slot is taken",
        Some(retry_after()),
    );
    if has_body {
        add("400", "The body is not what the route reads", None);
        add(
            "413",
            "The body is over the limit of 8 MiB, the largest configuration accepted",
            None,
        );
    }
}

fn build() -> Value {
    let mut doc = serde_json::to_value(ApiDoc::openapi()).expect("the document is JSON");
    let schemas = &mut doc["components"]["schemas"];
    schemas["MatchBody"] = match_schema();
    schemas["RuleBody"] = bucket_schema(true, &["local", "redis"]);
    // A file's `store: redis` needs the file's `redis` section.
    schemas["Bucket"] = bucket_schema(false, &["local"]);
    schemas["ConfigBody"] = config_schema();
    let duration = nullable(string(DURATION));
    let roles = json!({"enum": ["admin", "viewer", "service"]});
    schemas["NewUserBody"]["properties"]["role"] = nullable(roles.clone());
    schemas["NewUserBody"]["properties"]["expires"] = duration.clone();
    schemas["RoleBody"]["properties"]["role"] = roles;
    schemas["NewTokenBody"]["properties"]["expires"] = duration.clone();
    schemas["NewTokenBody"]["properties"]["user"] =
        nullable(string(r"^[A-Za-z0-9][A-Za-z0-9._@-]{0,63}$"));
    for body in ["NewUserBody", "RoleBody", "NewTokenBody", "RotateBody"] {
        schemas[body]["additionalProperties"] = json!(false);
    }
    schemas["RotateBody"]["properties"]["expires"] = duration;

    let paths = doc["paths"].as_object_mut().expect("paths are an object");
    let apply = &mut paths["/v1/rules:apply"]["post"]["requestBody"];
    let config = json!({"schema": {"$ref": "#/components/schemas/ConfigBody"}});
    apply["content"] = json!({"application/yaml": config, "application/json": config});
    apply["required"] = json!(true);
    // An empty body is the defaults: the caller's own token, one that does not expire.
    paths["/v1/tokens"]["post"]["requestBody"]["required"] = json!(false);
    paths["/v1/tokens/{id}/rotate"]["post"]["requestBody"]["required"] = json!(false);
    // A created rule's id (and version) for the routes that take one, so a client can follow.
    paths["/v1/rules"]["post"]["responses"]["201"]["links"] = json!({
        "GetRule": {"operationId": "get_rule", "parameters": {"path.id": "$response.body#/id"}},
        "UpdateRule": {"operationId": "update_rule", "parameters": {
            "path.id": "$response.body#/id", "header.if-match": "$response.header.etag"}},
        "DeleteRule": {"operationId": "delete_rule", "parameters": {"path.id": "$response.body#/id"}},
    });
    // `*`, or a version as the ETag gives it.
    let version = json!({"type": "string", "pattern": r#"^(\*|(W/)?"[0-9]{1,18}"|[0-9]{1,18})$"#});
    for method in ["put", "delete"] {
        for parameter in paths["/v1/rules/{id}"][method]["parameters"]
            .as_array_mut()
            .into_iter()
            .flatten()
        {
            if parameter["name"] == "if-match" {
                parameter["schema"] = version.clone();
            }
        }
    }
    // A created token's id for the routes that take one.
    paths["/v1/tokens"]["post"]["responses"]["201"]["links"] = json!({
        "RotateToken": {"operationId": "rotate_token", "parameters": {"path.id": "$response.body#/id"}},
        "RevokeToken": {"operationId": "revoke_token", "parameters": {"path.id": "$response.body#/id"}},
    });
    for (path, item) in paths.iter_mut() {
        if !path.starts_with("/v1/") {
            continue;
        }
        for operation in item
            .as_object_mut()
            .into_iter()
            .flat_map(|i| i.values_mut())
        {
            if let Some(operation) = operation.as_object_mut() {
                common_answers(operation);
            }
        }
    }
    doc
}
