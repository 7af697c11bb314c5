//! Reading the chat endpoint's streamed answer back: its SSE body split
//! into `data:` payloads, each a chat chunk, `[DONE]` or an error envelope
//! ([`Upstream`]). Keep-alive comments are skipped.
//!
//! The body owns the chat request's engine stream, so dropping a
//! [`ChatEvents`] cancels the request, as a client leaving does.

use axum::body::{Body, BodyDataStream};
use futures_util::StreamExt;
use serde_json::Value;

use super::reply::Upstream;
use crate::stream::DONE;

/// The steps of one streamed chat answer, in order.
pub struct ChatEvents {
    body: BodyDataStream,
    buf: Vec<u8>,
}

impl ChatEvents {
    /// Reads the SSE `body` of a streamed chat answer.
    pub fn new(body: Body) -> Self {
        Self {
            body: body.into_data_stream(),
            buf: Vec::new(),
        }
    }

    /// The next step; `None` once the body ends (or fails).
    pub async fn next(&mut self) -> Option<Upstream> {
        loop {
            if let Some(end) = find(&self.buf, b"\n\n") {
                let frame: Vec<u8> = self.buf.drain(..end + 2).collect();
                if let Some(step) = step(&frame[..end]) {
                    return Some(step);
                }
                continue;
            }
            match self.body.next().await {
                Some(Ok(bytes)) => self.buf.extend_from_slice(&bytes),
                Some(Err(_)) | None => return None,
            }
        }
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// One SSE frame's step; `None` for a frame with no data (a keep-alive).
fn step(frame: &[u8]) -> Option<Upstream> {
    let text = String::from_utf8_lossy(frame);
    let data: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("data:"))
        .map(|d| d.strip_prefix(' ').unwrap_or(d))
        .collect();
    if data.is_empty() {
        return None;
    }
    let payload = data.join("\n");
    if payload == DONE {
        return Some(Upstream::Done);
    }
    match serde_json::from_str::<Value>(&payload) {
        Ok(v) if v.get("error").is_some() => Some(Upstream::Error(
            v["error"]["message"]
                .as_str()
                .unwrap_or("the request failed")
                .to_string(),
        )),
        Ok(v) => Some(Upstream::Chunk(v)),
        Err(_) => Some(Upstream::Error(
            "the chat stream sent a malformed chunk".into(),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn frames_split_across_reads_and_keep_alives_skipped() {
        let parts: Vec<Result<&'static str, std::io::Error>> = vec![
            Ok("data: {\"choices\": []}\n\n:\n\ndata: {\"err"),
            Ok("or\": {\"message\": \"boom\"}}\n\ndata: [DONE]\n\n"),
        ];
        let body = Body::from_stream(futures_util::stream::iter(parts));
        let mut events = ChatEvents::new(body);
        assert!(matches!(events.next().await, Some(Upstream::Chunk(v)) if v["choices"].is_array()));
        assert!(matches!(events.next().await, Some(Upstream::Error(m)) if m == "boom"));
        assert!(matches!(events.next().await, Some(Upstream::Done)));
        assert!(events.next().await.is_none());
    }
}
