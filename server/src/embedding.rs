//! Embeddings between the wire and the engine: OpenAI's `input` (a string,
//! strings, token ids, or lists of them) into token sequences, and the
//! engine's unit vectors into the response's `embedding` values (`dimensions`
//! truncation and renormalisation, `float` or `base64`).
//!
//! Tokenizing runs on a blocking thread (see the handler); nothing here
//! talks to the engine.

use serde_json::Value;
use tern_runtime::engine::{l2_normalize, MAX_EMBED_INPUTS};
use tern_runtime::LoadedModel;

use crate::openai::embedding::EmbeddingVector;
use crate::openai::error::ApiError;
use crate::prompt;

/// How the response writes each vector.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Encoding {
    /// A JSON array of numbers.
    Float,
    /// Base64 of the little-endian f32 bytes.
    Base64,
}

/// Reads `encoding_format`: absent or `float`, or `base64`.
pub fn encoding(format: Option<&str>) -> Result<Encoding, ApiError> {
    match format {
        None | Some("float") => Ok(Encoding::Float),
        Some("base64") => Ok(Encoding::Base64),
        Some(other) => Err(ApiError::invalid_param(
            "encoding_format",
            format!("unknown encoding_format `{other}`; use `float` or `base64`"),
        )),
    }
}

/// Reads `dimensions` against the model's hidden size: `None` keeps all.
pub fn dimensions(requested: Option<i64>, hidden: usize) -> Result<Option<usize>, ApiError> {
    match requested {
        None => Ok(None),
        Some(k) if k >= 1 && k as u64 <= hidden as u64 => Ok(Some(k as usize)),
        Some(k) => Err(ApiError::invalid_param(
            "dimensions",
            format!(
                "`dimensions` must be between 1 and {hidden} (this model's hidden size), got {k}"
            ),
        )),
    }
}

/// The token sequences `input` stands for: a string, a list of strings, a
/// list of token ids (one input), or a list of token-id lists. Strings are
/// tokenized as `/v1/completions` tokenizes a prompt; ids pass as they are
/// (the engine checks them against the vocabulary and the context, and
/// their tokens in all against its limit). More than [`MAX_EMBED_INPUTS`]
/// inputs are refused before any is tokenized.
pub fn inputs(model: &LoadedModel, input: &Value) -> Result<Vec<Vec<u32>>, ApiError> {
    let bad = |what: String| ApiError::invalid_param("input", what);
    check_count(input)?;
    match input {
        Value::String(s) => Ok(vec![text(model, s, 0)?]),
        Value::Array(items) if items.is_empty() => {
            Err(bad("`input` must not be an empty list".into()))
        }
        Value::Array(items) if items.iter().all(Value::is_string) => items
            .iter()
            .enumerate()
            .map(|(i, s)| text(model, s.as_str().unwrap_or_default(), i))
            .collect(),
        Value::Array(items) if items.iter().all(Value::is_number) => Ok(vec![ids(items, 0)?]),
        Value::Array(items) if items.iter().all(Value::is_array) => items
            .iter()
            .enumerate()
            .map(|(i, list)| ids(list.as_array().map_or(&[][..], Vec::as_slice), i))
            .collect(),
        Value::Null => Err(bad("Missing required parameter: `input`".into())),
        _ => Err(bad(
            "`input` must be a string, a list of strings, a list of token ids or a list of token-id lists"
                .into(),
        )),
    }
}

/// At most [`MAX_EMBED_INPUTS`] inputs (OpenAI's limit): a list of strings
/// or of token-id lists counts its items; one string or one id list is one.
fn check_count(input: &Value) -> Result<(), ApiError> {
    let count = match input {
        Value::Array(items) if items.iter().all(Value::is_number) => 1,
        Value::Array(items) => items.len(),
        _ => 1,
    };
    if count > MAX_EMBED_INPUTS {
        return Err(ApiError::invalid_param(
            "input",
            format!("at most {MAX_EMBED_INPUTS} inputs are allowed per request, got {count}"),
        ));
    }
    Ok(())
}

/// One string input, tokenized; an empty string is refused (it would embed
/// nothing but a BOS).
fn text(model: &LoadedModel, s: &str, index: usize) -> Result<Vec<u32>, ApiError> {
    if s.is_empty() {
        return Err(ApiError::invalid_param(
            "input",
            format!("input {index} is an empty string"),
        ));
    }
    prompt::encode(model, s, "input")
}

/// One token-id input: non-negative integers that fit a token id.
fn ids(items: &[Value], index: usize) -> Result<Vec<u32>, ApiError> {
    if items.is_empty() {
        return Err(ApiError::invalid_param(
            "input",
            format!("input {index} is an empty list of token ids"),
        ));
    }
    items
        .iter()
        .map(|v| {
            v.as_u64()
                .and_then(|id| u32::try_from(id).ok())
                .ok_or_else(|| {
                    ApiError::invalid_param(
                        "input",
                        format!("input {index}: `{v}` is not a token id (a non-negative integer)"),
                    )
                })
        })
        .collect()
}

/// A unit vector as the response writes it: its first `dims` values
/// renormalised to unit length (all of them when `None`), then encoded.
pub fn vector(mut v: Vec<f32>, dims: Option<usize>, encoding: Encoding) -> EmbeddingVector {
    if let Some(k) = dims.filter(|&k| k < v.len()) {
        v.truncate(k);
        l2_normalize(&mut v);
    }
    match encoding {
        Encoding::Float => EmbeddingVector::Float(v),
        Encoding::Base64 => {
            let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
            EmbeddingVector::Base64(base64(&bytes))
        }
    }
}

/// Standard base64 (RFC 4648, with padding): what OpenAI's clients decode.
fn base64(bytes: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_matches_rfc_4648_vectors() {
        for (raw, encoded) in [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("fooba", "Zm9vYmE="),
            ("foobar", "Zm9vYmFy"),
        ] {
            assert_eq!(base64(raw.as_bytes()), encoded, "{raw}");
        }
        assert_eq!(base64(&[0xff, 0xfe, 0xfd]), "//79");
    }

    #[test]
    fn input_count_is_bounded_before_tokenizing() {
        let many = |n: usize, item: Value| Value::Array(vec![item; n]);
        assert!(check_count(&many(MAX_EMBED_INPUTS, Value::from("a"))).is_ok());
        for over in [
            many(MAX_EMBED_INPUTS + 1, Value::from("a")),
            many(MAX_EMBED_INPUTS + 1, serde_json::json!([1, 2])),
        ] {
            let e = check_count(&over).unwrap_err();
            assert_eq!(e.param.as_deref(), Some("input"));
            assert!(e.message.contains("2048"), "{}", e.message);
        }
        // One long list of token ids is one input (its length is the context's to bound).
        assert!(check_count(&many(5000, Value::from(1))).is_ok());
    }

    #[test]
    fn truncation_renormalises() {
        let v = vec![0.6, 0.0, 0.8];
        let EmbeddingVector::Float(t) = vector(v.clone(), Some(1), Encoding::Float) else {
            panic!("float asked for");
        };
        assert_eq!(t, vec![1.0]);
        let EmbeddingVector::Float(all) = vector(v.clone(), None, Encoding::Float) else {
            panic!("float asked for");
        };
        assert_eq!(all, v);
    }

    #[test]
    fn base64_vectors_are_little_endian_f32() {
        let EmbeddingVector::Base64(s) = vector(vec![1.0], None, Encoding::Base64) else {
            panic!("base64 asked for");
        };
        // 1.0f32 = 00 00 80 3f
        assert_eq!(s, base64(&[0, 0, 0x80, 0x3f]));
    }

    #[test]
    fn formats_and_dimensions_are_checked() {
        assert_eq!(encoding(None).unwrap(), Encoding::Float);
        assert_eq!(encoding(Some("base64")).unwrap(), Encoding::Base64);
        let e = encoding(Some("int8")).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("encoding_format"));
        assert_eq!(dimensions(Some(64), 576).unwrap(), Some(64));
        assert_eq!(dimensions(Some(576), 576).unwrap(), Some(576));
        for bad in [0, -1, 577] {
            let e = dimensions(Some(bad), 576).unwrap_err();
            assert_eq!(e.param.as_deref(), Some("dimensions"), "{bad}");
        }
    }
}
