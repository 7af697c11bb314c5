//! Bounds on the request fields a response echoes back and the Responses
//! store keeps, so what a client sends is what the server holds, no more:
//! `metadata` under OpenAI's own limits, `text` with only the keys it
//! defines, and the short strings (`user`, `previous_response_id`) capped.
//!
//! Fields that become part of the prompt (`instructions`, `input`, tool
//! definitions) are bounded by the model's context instead (`params.rs`);
//! the store's byte budget (`response_store.rs`) bounds what is left. Pure:
//! JSON in, a validated value or a 400 naming the field out.

use serde_json::{Map, Value};

use crate::openai::error::ApiError;

/// Most `metadata` keys (OpenAI's limit).
pub const MAX_METADATA_KEYS: usize = 16;
/// Longest `metadata` key, in characters (OpenAI's limit).
pub const MAX_METADATA_KEY_CHARS: usize = 64;
/// Longest `metadata` value, in characters (OpenAI's limit).
pub const MAX_METADATA_VALUE_CHARS: usize = 512;
/// Longest end-user id (`user`, `safety_identifier`), in characters: an id
/// or an e-mail address fits many times over.
pub const MAX_USER_CHARS: usize = 256;
/// Longest `previous_response_id`, in characters (Tern's ids take 37): a
/// longer one cannot name a stored response, and its 404 quotes it.
pub const MAX_RESPONSE_ID_CHARS: usize = 128;

/// `metadata` as echoed: absent or null is `{}`; otherwise an object of at
/// most [`MAX_METADATA_KEYS`] string values, keys up to
/// [`MAX_METADATA_KEY_CHARS`] characters and values up to
/// [`MAX_METADATA_VALUE_CHARS`].
pub fn metadata(value: Option<&Value>) -> Result<Value, ApiError> {
    let bad = |message: String| ApiError::invalid_param("metadata", message);
    let map = match value {
        None | Some(Value::Null) => return Ok(Value::Object(Map::new())),
        Some(Value::Object(map)) => map,
        Some(_) => return Err(bad("`metadata` must be an object of strings".into())),
    };
    if map.len() > MAX_METADATA_KEYS {
        return Err(bad(format!(
            "`metadata` may have at most {MAX_METADATA_KEYS} keys, got {}",
            map.len()
        )));
    }
    for (key, v) in map {
        let chars = key.chars().count();
        if chars > MAX_METADATA_KEY_CHARS {
            return Err(bad(format!(
                "`metadata` keys may be at most {MAX_METADATA_KEY_CHARS} characters, got one of {chars}"
            )));
        }
        let Some(text) = v.as_str() else {
            return Err(bad(format!("`metadata.{key}` must be a string")));
        };
        let chars = text.chars().count();
        if chars > MAX_METADATA_VALUE_CHARS {
            return Err(bad(format!(
                "`metadata` values may be at most {MAX_METADATA_VALUE_CHARS} characters, \
                 got one of {chars} under `{key}`"
            )));
        }
    }
    Ok(Value::Object(map.clone()))
}

/// Keys of `text.format` the echo keeps (the ones OpenAI defines).
const FORMAT_KEYS: [&str; 5] = ["type", "name", "description", "schema", "strict"];

/// Responses' `text` as echoed: an object with only `format` (read as the
/// output constraint; of it, only OpenAI's keys are kept) and `verbosity`
/// (`low`, `medium` or `high`); any other key of `text` is refused by
/// name, as OpenAI refuses unknown parameters.
pub fn text_options(value: Option<&Value>) -> Result<Value, ApiError> {
    let map = match value {
        None | Some(Value::Null) => return Ok(serde_json::json!({"format": {"type": "text"}})),
        Some(Value::Object(map)) => map,
        Some(_) => return Err(ApiError::invalid_param("text", "`text` must be an object")),
    };
    let mut out = Map::new();
    for (key, v) in map {
        match key.as_str() {
            "format" => {
                let Some(format) = v.as_object() else {
                    return Err(ApiError::invalid_param(
                        "text.format",
                        "`text.format` must be an object",
                    ));
                };
                let kept: Map<String, Value> = format
                    .iter()
                    .filter(|(k, _)| FORMAT_KEYS.contains(&k.as_str()))
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect();
                out.insert(key.clone(), Value::Object(kept));
            }
            "verbosity" if matches!(v.as_str(), Some("low" | "medium" | "high")) => {
                out.insert(key.clone(), v.clone());
            }
            "verbosity" => {
                return Err(ApiError::invalid_param(
                    "text.verbosity",
                    "`text.verbosity` must be `low`, `medium` or `high`",
                ))
            }
            other => {
                return Err(ApiError::invalid_param(
                    format!("text.{other}"),
                    format!("Unknown parameter: `text.{other}`"),
                ))
            }
        }
    }
    out.entry("format")
        .or_insert_with(|| serde_json::json!({"type": "text"}));
    Ok(Value::Object(out))
}

/// A short string field (`user`, `previous_response_id`): at most `max`
/// characters.
pub fn short_string(param: &str, value: Option<&str>, max: usize) -> Result<(), ApiError> {
    let chars = value.map_or(0, |v| v.chars().count());
    if chars > max {
        return Err(ApiError::invalid_param(
            param,
            format!("`{param}` may be at most {max} characters, got {chars}"),
        ));
    }
    Ok(())
}

/// Bytes `value` takes as JSON text, counted without writing it out: what
/// the Responses store would be charged for it.
pub fn json_len(value: &Value) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len();
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count(0);
    // Writing a Value to a sink that never fails cannot fail.
    let _ = serde_json::to_writer(&mut count, value);
    count.0
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn param(e: ApiError) -> String {
        assert_eq!(e.status.as_u16(), 400);
        e.param.unwrap_or_default()
    }

    #[test]
    fn metadata_follows_openais_limits() {
        assert_eq!(metadata(None).unwrap(), json!({}));
        let ok: Map<String, Value> = (0..MAX_METADATA_KEYS)
            .map(|i| (format!("{i:0>64}"), json!("v".repeat(512))))
            .collect();
        assert!(metadata(Some(&Value::Object(ok.clone()))).is_ok());
        let mut too_many = ok.clone();
        too_many.insert("one-more".into(), json!("v"));
        let long_key = json!({"k".repeat(65): "v"});
        let long_value = json!({"k": "é".repeat(513)});
        let array = json!({"k": [1, 2, 3]});
        for bad in [
            Value::Object(too_many),
            long_key,
            long_value,
            array,
            json!([1]),
        ] {
            assert_eq!(param(metadata(Some(&bad)).unwrap_err()), "metadata");
        }
        // Characters, not bytes: 512 two-byte characters are fine.
        assert!(metadata(Some(&json!({"k": "é".repeat(512)}))).is_ok());
    }

    #[test]
    fn text_keeps_only_its_own_keys() {
        assert_eq!(
            text_options(None).unwrap(),
            json!({"format": {"type": "text"}})
        );
        let t = json!({"format": {"type": "json_object"}, "verbosity": "low"});
        assert_eq!(text_options(Some(&t)).unwrap(), t);
        assert_eq!(
            text_options(Some(&json!({"verbosity": "high"}))).unwrap(),
            json!({"verbosity": "high", "format": {"type": "text"}})
        );
        let extra = json!({"format": {"type": "text", "junk": [1, 2]}});
        assert_eq!(
            text_options(Some(&extra)).unwrap(),
            json!({"format": {"type": "text"}})
        );
        let e = text_options(Some(&json!({"format": "text"}))).unwrap_err();
        assert_eq!(param(e), "text.format");
        let junk = json!({"format": {"type": "text"}, "junk": vec![1; 1000]});
        assert_eq!(param(text_options(Some(&junk)).unwrap_err()), "text.junk");
        let v = json!({"verbosity": "loud"});
        assert_eq!(param(text_options(Some(&v)).unwrap_err()), "text.verbosity");
        assert_eq!(param(text_options(Some(&json!("x"))).unwrap_err()), "text");
    }

    #[test]
    fn json_len_is_the_text_length() {
        let v = json!({"a": [1, "two", null], "é": {"b": 2.5}});
        assert_eq!(json_len(&v), v.to_string().len());
    }

    #[test]
    fn short_strings_are_capped() {
        assert!(short_string("user", Some(&"u".repeat(256)), MAX_USER_CHARS).is_ok());
        assert!(short_string("user", None, MAX_USER_CHARS).is_ok());
        let e = short_string("user", Some(&"u".repeat(257)), MAX_USER_CHARS).unwrap_err();
        assert_eq!(param(e), "user");
    }
}
