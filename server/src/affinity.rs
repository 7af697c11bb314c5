//! A routing hint for load balancers: `x-tern-prefix-key`, a short hash of a
//! prompt's first [`PREFIX_TOKENS`] token ids. Requests whose prompts share
//! that prefix (the later turns of one conversation, many requests under
//! one long system prompt) get the same key, so a balancer that routes on
//! it (nginx's `hash $http_x_tern_affinity consistent;` with the client
//! echoing the key as `x-tern-affinity`, see docs/SCALING.md) sends them to
//! the replica whose prompt-prefix cache already holds that prefix.

use axum::http::{HeaderName, HeaderValue};
use axum::response::Response;
use sha2::{Digest, Sha256};

/// Tokens the key covers: long enough to tell system prompts and first
/// questions apart, short enough that a conversation's later turns, which
/// only add to the end, keep it.
pub const PREFIX_TOKENS: usize = 64;

/// The response header carrying the key.
pub const HEADER: &str = "x-tern-prefix-key";

/// The key of `prompt`: 16 hex digits of SHA-256 over its first
/// [`PREFIX_TOKENS`] ids (little-endian u32), or `None` for a shorter
/// prompt, whose reuse is not worth routing on.
pub fn prefix_key(prompt: &[u32]) -> Option<String> {
    let head = prompt.get(..PREFIX_TOKENS)?;
    let mut h = Sha256::new();
    for t in head {
        h.update(t.to_le_bytes());
    }
    Some(
        h.finalize()[..8]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect(),
    )
}

/// `response` with the key of `prompt` as [`HEADER`], when it has one.
pub fn with_key(mut response: Response, key: Option<&str>) -> Response {
    if let Some(v) = key.and_then(|k| HeaderValue::from_str(k).ok()) {
        response
            .headers_mut()
            .insert(HeaderName::from_static(HEADER), v);
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_longer_prompt_with_the_same_start_keeps_its_key() {
        let a: Vec<u32> = (0..100).collect();
        let mut b = a.clone();
        b.extend([7, 8, 9]);
        let mut c = a.clone();
        c[3] = 999;
        let k = prefix_key(&a).unwrap();
        assert_eq!(k.len(), 16);
        assert_eq!(prefix_key(&b).as_deref(), Some(k.as_str()));
        assert_ne!(prefix_key(&c).as_deref(), Some(k.as_str()));
        assert_eq!(prefix_key(&a[..63]), None);
    }
}
