//! `POST /tokenize` and `POST /detokenize`: the served model's tokenizer, in
//! llama-server's shapes, behind the same API key as `/v1`.

use std::sync::Arc;

use axum::extract::State;
use axum::Json;
use serde_json::Value;

use crate::body::{fields, JsonBody};
use crate::llama_api::{DetokenizeFields, Detokenized, TokenEntry, TokenizeFields, Tokenized};
use crate::openai::error::ApiError;
use crate::prompt;
use crate::state::AppState;

/// Text to token ids (with their pieces if asked).
pub async fn tokenize(
    State(state): State<AppState>,
    JsonBody(body): JsonBody,
) -> Result<Json<Tokenized>, ApiError> {
    state.ready()?;
    let f: TokenizeFields = fields(&body)?;
    let served = state.tokenizer_model(f.model.as_deref()).await?;
    let model = Arc::clone(served.engine.model());
    let content = f.content.ok_or_else(|| {
        ApiError::invalid_param("content", "Missing required parameter: `content`")
    })?;
    let add_special = f.add_special.unwrap_or(false);
    let parse_special = f.parse_special.unwrap_or(true);
    let with_pieces = f.with_pieces.unwrap_or(false);
    let tokens = prompt::off_thread(move || {
        let tok = &model.tokenizer;
        let ids = tok
            .encode(&content, add_special, parse_special)
            .map_err(|e| ApiError::from_runtime(e, "content"))?;
        Ok(ids
            .into_iter()
            .map(|id| {
                if with_pieces {
                    TokenEntry::WithPiece {
                        id,
                        piece: piece(tok.bytes_of(id, true)),
                    }
                } else {
                    TokenEntry::Id(id)
                }
            })
            .collect())
    })
    .await?;
    Ok(Json(Tokenized { tokens }))
}

/// Token ids to text.
pub async fn detokenize(
    State(state): State<AppState>,
    JsonBody(body): JsonBody,
) -> Result<Json<Detokenized>, ApiError> {
    state.ready()?;
    let f: DetokenizeFields = fields(&body)?;
    let served = state.tokenizer_model(f.model.as_deref()).await?;
    let model = Arc::clone(served.engine.model());
    let vocab = model.config().vocab_size;
    let ids = token_ids(&f.tokens, vocab)?;
    let content = model.tokenizer.decode(&ids, true);
    Ok(Json(Detokenized { content }))
}

/// A token's text: a string when its bytes are UTF-8, else the byte values.
fn piece(bytes: &[u8]) -> Value {
    match std::str::from_utf8(bytes) {
        Ok(s) => Value::String(s.to_string()),
        Err(_) => Value::Array(bytes.iter().map(|&b| Value::from(b)).collect()),
    }
}

/// `tokens` as ids in the vocabulary (an empty list is empty text).
fn token_ids(tokens: &Value, vocab: usize) -> Result<Vec<u32>, ApiError> {
    let list = match tokens {
        Value::Array(list) => list,
        Value::Null => {
            return Err(ApiError::invalid_param(
                "tokens",
                "Missing required parameter: `tokens`",
            ))
        }
        _ => {
            return Err(ApiError::invalid_param(
                "tokens",
                "`tokens` must be a list of token ids",
            ))
        }
    };
    list.iter()
        .map(|v| {
            v.as_u64()
                .filter(|&id| id < vocab as u64)
                .map(|id| id as u32)
                .ok_or_else(|| {
                    ApiError::invalid_param(
                        "tokens",
                        format!("`{v}` is not a token id of this model (0..{vocab})"),
                    )
                })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn ids_outside_the_vocabulary_are_refused() {
        assert_eq!(token_ids(&json!([0, 9]), 10).unwrap(), vec![0, 9]);
        for bad in [
            json!([10]),
            json!([-1]),
            json!(["a"]),
            json!(1.5),
            json!(null),
        ] {
            let e = token_ids(&bad, 10).unwrap_err();
            assert_eq!(e.param.as_deref(), Some("tokens"), "{bad}");
        }
    }

    #[test]
    fn pieces_fall_back_to_bytes() {
        assert_eq!(piece(b"hi"), json!("hi"));
        assert_eq!(piece(&[0xe2, 0x82]), json!([0xe2, 0x82]));
    }
}
