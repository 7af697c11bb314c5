//! `context_overflow`: what happens to a prompt that does not leave its
//! answer room in the context (a conversation grown past the window).
//!
//! - `error` (the default, `--context-overflow`): OpenAI's and llama-server's
//!   answer, a 400 `context_length_exceeded` carrying the numbers, so a
//!   client that counts its tokens is never given an answer to a
//!   conversation the model did not see whole;
//! - `shift` (llama.cpp's context shift, applied to the prompt): the first
//!   `keep` tokens (default [`DEFAULT_KEEP`]: the start of the system turn,
//!   as StreamingLLM's sinks) and the most recent ones are kept, the oldest
//!   tokens after the kept head are dropped, as many as the answer needs
//!   room for (its `max_tokens`, or a quarter of the context when the
//!   request sets none). The response's `tern.context_overflow` says which
//!   prompt tokens were dropped.
//!
//! - a KV policy spec (`snapkv:budget=512`, `streaming:budget=256,sink=4`):
//!   the prompt is read whole, however long, and the answer may outgrow the
//!   context too; whenever the next tokens would pass the last position the
//!   policy evicts down to its budget and what it kept is re-numbered
//!   (StreamingLLM's positions within the cache; see the runtime's
//!   `SeqCache::make_room`). Until the context fills nothing is evicted.
//!   The response's `tern.context_overflow` says how often, and how many
//!   tokens were evicted and kept. Without `max_tokens` the answer may run
//!   for one context's length.

use serde::Serialize;
use tern_runtime::kv::policy::KvPolicy;

use crate::openai::error::ApiError;

/// Prompt tokens `shift` keeps at the start unless the request says.
pub const DEFAULT_KEEP: usize = 4;

/// What to do with a prompt that leaves its answer no room.
#[derive(Clone, Debug, Default, PartialEq)]
pub enum ContextOverflow {
    /// A 400 with the numbers.
    #[default]
    Error,
    /// Drop the oldest tokens after the first `keep`.
    Shift {
        /// Leading tokens always kept.
        keep: usize,
    },
    /// Go on past the context, evicting by this policy when it fills.
    Policy(KvPolicy),
}

impl ContextOverflow {
    /// Reads `error`, `shift` or `shift:keep=N`; anything else is an error
    /// message naming what is accepted.
    pub fn parse(s: &str) -> Result<Self, String> {
        let s = s.trim();
        match s {
            "error" => return Ok(Self::Error),
            "shift" => return Ok(Self::Shift { keep: DEFAULT_KEEP }),
            _ => {}
        }
        if let Some(keep) = s.strip_prefix("shift:keep=") {
            return keep
                .trim()
                .parse()
                .map(|keep| Self::Shift { keep })
                .map_err(|_| format!("`shift:keep=` takes a token count, got `{keep}`"));
        }
        match s.parse::<KvPolicy>() {
            Ok(p) if p.budget().is_none() => Err(format!(
                "`{s}` evicts nothing, so it cannot go on past the context: name a policy \
                 with a budget (`snapkv:budget=512`, `streaming:budget=256`)"
            )),
            Ok(p) => Ok(Self::Policy(p)),
            Err(e) if s.contains(':') => Err(format!("context_overflow policy `{s}`: {e}")),
            Err(_) => Err(format!(
                "context_overflow must be `error`, `shift`, `shift:keep=N` or a KV policy \
                 with a budget (`snapkv:budget=512`); got `{s}`"
            )),
        }
    }
}

/// What the response's `tern.context_overflow` reports: the prompt tokens
/// `shift` dropped, or what a policy evicted past the context.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(untagged)]
pub enum Overflowed {
    /// `shift`.
    Shift(Shifted),
    /// A KV policy.
    Policy(Evicted),
}

/// What a KV policy did to a conversation longer than the context.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Evicted {
    /// The policy's canonical spec.
    pub policy: String,
    /// Prompt tokens as the conversation rendered them (all read).
    pub prompt_tokens: usize,
    /// Tokens the completion's cache read: the prompt and its answer, but
    /// the answer's last token (sampled, never read back).
    pub read_tokens: usize,
    /// Times the context filled and the cache was compressed and
    /// re-numbered (0: everything fit, nothing was evicted).
    pub shifts: usize,
    /// Entries the fullest layer held at the end.
    pub kept_tokens: usize,
    /// `read_tokens - kept_tokens`.
    pub evicted_tokens: usize,
}

/// What `shift` dropped from a prompt, as the response's
/// `tern.context_overflow` reports it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Shifted {
    /// Always `shift`.
    pub policy: &'static str,
    /// Prompt tokens as the conversation rendered them.
    pub prompt_tokens: usize,
    /// Prompt tokens dropped.
    pub evicted_tokens: usize,
    /// The dropped run, `[from, to)` in the rendered prompt's positions.
    pub evicted_from: usize,
    /// End of the dropped run.
    pub evicted_to: usize,
    /// Prompt tokens the model read: the head and the most recent ones.
    pub kept_tokens: usize,
}

/// Applies `rule` to `prompt` for a context of `context_length` and an
/// answer of `max_tokens` (when the request set it): the prompt unchanged
/// when it fits, a shifted one with what was dropped, or the error `error`
/// leaves to the ordinary context check (which states the numbers).
pub fn fit(
    rule: &ContextOverflow,
    prompt: Vec<u32>,
    max_tokens: Option<i64>,
    context_length: usize,
) -> Result<(Vec<u32>, Option<Shifted>), ApiError> {
    let &ContextOverflow::Shift { keep } = rule else {
        return Ok((prompt, None));
    };
    let answer = match max_tokens {
        Some(m) if m >= 1 => usize::try_from(m).unwrap_or(usize::MAX),
        // Invalid values are the ordinary check's 400.
        Some(_) => return Ok((prompt, None)),
        None if prompt.len() < context_length => return Ok((prompt, None)),
        None => (context_length / 4).max(1),
    };
    let target = context_length.saturating_sub(answer);
    if prompt.len() <= target {
        return Ok((prompt, None));
    }
    if target <= keep {
        return Err(ApiError::invalid_param(
            "context_overflow",
            format!(
                "shift keeps {keep} leading tokens and must leave {answer} for the answer \
                 in a context of {context_length}: lower max_tokens or keep"
            ),
        ));
    }
    let dropped = prompt.len() - target;
    let mut kept = prompt[..keep].to_vec();
    kept.extend_from_slice(&prompt[keep + dropped..]);
    let shifted = Shifted {
        policy: "shift",
        prompt_tokens: prompt.len(),
        evicted_tokens: dropped,
        evicted_from: keep,
        evicted_to: keep + dropped,
        kept_tokens: kept.len(),
    };
    Ok((kept, Some(shifted)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_parse_and_policies_are_refused_by_name() {
        assert_eq!(ContextOverflow::parse("error"), Ok(ContextOverflow::Error));
        assert_eq!(
            ContextOverflow::parse("shift"),
            Ok(ContextOverflow::Shift { keep: DEFAULT_KEEP })
        );
        assert_eq!(
            ContextOverflow::parse("shift:keep=32"),
            Ok(ContextOverflow::Shift { keep: 32 })
        );
        assert_eq!(
            ContextOverflow::parse("snapkv:budget=64"),
            Ok(ContextOverflow::Policy("snapkv:budget=64".parse().unwrap()))
        );
        let e = ContextOverflow::parse("full").unwrap_err();
        assert!(e.contains("evicts nothing"), "{e}");
        let e = ContextOverflow::parse("snapkv:budget=-3").unwrap_err();
        assert!(e.contains("snapkv:budget=-3"), "{e}");
        assert!(ContextOverflow::parse("truncate").is_err());
    }

    #[test]
    fn shift_keeps_the_head_and_the_newest_tokens_and_leaves_the_answer_room() {
        let prompt: Vec<u32> = (0..100).collect();
        let shift = ContextOverflow::Shift { keep: 4 };
        let (kept, s) = fit(&shift, prompt.clone(), Some(10), 64).unwrap();
        let s = s.unwrap();
        assert_eq!(kept.len() + 10, 64);
        assert_eq!(&kept[..4], &[0, 1, 2, 3]);
        assert_eq!(*kept.last().unwrap(), 99);
        assert_eq!(
            (s.evicted_from, s.evicted_to, s.evicted_tokens),
            (4, 50, 46)
        );
        assert_eq!(kept[4], 50);
        // No max_tokens: a quarter of the context is left for the answer.
        let (kept, _) = fit(&shift, prompt.clone(), None, 64).unwrap();
        assert_eq!(kept.len(), 48);
        // A prompt that fits is untouched; `error` never changes one.
        assert_eq!(
            fit(&shift, prompt[..40].to_vec(), Some(10), 64).unwrap().1,
            None
        );
        let (same, none) = fit(&ContextOverflow::Error, prompt.clone(), Some(10), 64).unwrap();
        assert_eq!((same, none), (prompt.clone(), None));
        // No room beside the head: a 400 naming the field.
        let e = fit(&shift, prompt, Some(62), 64).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("context_overflow"));
    }
}
