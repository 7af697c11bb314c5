//! What a request produces besides text: each token's log-probabilities and
//! why a completion ended. The server and the CLI turn these into their own
//! shapes.

/// Why generation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    /// An end-of-sequence token or a stop string.
    Stop,
    /// The token limit or the context window.
    Length,
}

/// Log-probabilities recorded for one generated token.
#[derive(Debug, Clone, serde::Serialize)]
pub struct TokenLogprob {
    /// The token generated.
    pub token: u32,
    /// Its log-probability under the (penalised, biased) model distribution.
    pub logprob: f32,
    /// The most likely alternatives, descending.
    pub top: Vec<(u32, f32)>,
}
