//! Durations as the file writes them (`250ms`, `1s`, `2m`, `1h`, `1d`): their schema and (de)serializers.

use super::*;

/// The schema of a duration (`250ms`, `1s`, `2m`, `1h`, `1d`).
pub struct DurationText;

impl JsonSchema for DurationText {
    fn schema_name() -> Cow<'static, str> {
        "Duration".into()
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "type": "string",
            "description": "A whole number (at least 1) and a unit: ms, s, m (or min), h or d.",
            "pattern": DURATION_PATTERN,
            "examples": ["250ms", "1s", "2m"]
        })
    }
}

pub(super) struct DurationVisitor;

impl de::Visitor<'_> for DurationVisitor {
    type Value = Duration;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a duration like 250ms, 1s or 2m")
    }

    // Raised inside the visitor so the error carries the value's position.
    fn visit_str<E: de::Error>(self, text: &str) -> Result<Duration, E> {
        parse_duration(text).map_err(E::custom)
    }

    fn visit_u64<E: de::Error>(self, n: u64) -> Result<Duration, E> {
        Err(E::custom(format_args!(
            "duration {n} has no unit; write {n}s or {n}ms"
        )))
    }
}

/// Serde for durations written as `250ms`, `1s`, `2m`.
pub(crate) mod duration_text {
    use super::*;

    pub fn serialize<S: Serializer>(value: &Duration, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&format_duration(*value))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Duration, D::Error> {
        deserializer.deserialize_any(DurationVisitor)
    }
}

/// Serde for optional durations.
pub(crate) mod option_duration_text {
    use super::*;

    pub fn serialize<S: Serializer>(
        value: &Option<Duration>,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        match value {
            Some(d) => serializer.serialize_str(&format_duration(*d)),
            None => serializer.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Option<Duration>, D::Error> {
        struct OptionVisitor;
        impl<'de> de::Visitor<'de> for OptionVisitor {
            type Value = Option<Duration>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a duration like 250ms, 1s or 2m")
            }
            fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
                Ok(None)
            }
            fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
                Ok(None)
            }
            fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
                d.deserialize_any(DurationVisitor).map(Some)
            }
        }
        deserializer.deserialize_option(OptionVisitor)
    }
}
