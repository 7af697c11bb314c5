//! `reasoning_format`, as llama-server takes it (its `--reasoning-format`
//! flag and the request field of the same name): whether a reasoning model's
//! `<think>` block comes back in `reasoning_content` (whole, or as its own
//! stream deltas) or stays in `content`.
//!
//! - `none`: the raw generated text in `content`, tags and all;
//! - `deepseek`: the block's text in `reasoning_content`, the rest in
//!   `content` (`runtime::chat::think_reader` reads it as llama.cpp does);
//! - `auto` (llama-server's default, and Tern's): `deepseek`'s split.
//!
//! Only models whose chat template marks reasoning are split; for others the
//! field is accepted and the text is left as generated. Whether the prompt
//! itself opened the block (a template that ends the generation prompt with
//! `<think>`) is read from the prompt's last tokens, so such a reply, which
//! never writes the opening tag, is still split.

use std::str::FromStr;

use tern_runtime::chat::think_reader::{prompt_opens_reasoning, ThinkReader};
use tern_runtime::model::LoadedModel;

use crate::openai::error::ApiError;

/// Prompt tokens read back to see whether the prompt opened a think block
/// (`<think>` and the whitespace after it are a few tokens in any vocabulary).
const PROMPT_TAIL_TOKENS: usize = 8;

/// How a reply's reasoning is returned.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ReasoningFormat {
    /// Left in `content`, unparsed.
    None,
    /// In `reasoning_content`.
    Deepseek,
    /// As `Deepseek` (llama-server's default).
    #[default]
    Auto,
}

impl FromStr for ReasoningFormat {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "none" => Ok(Self::None),
            "deepseek" => Ok(Self::Deepseek),
            "auto" => Ok(Self::Auto),
            other => Err(format!(
                "reasoning_format must be one of none, deepseek, auto; got `{other}`"
            )),
        }
    }
}

/// A request's reasoning split: which reader each choice's text goes through.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ThinkSplit {
    /// The prompt opened the think block: replies start inside it.
    opened: bool,
}

impl ThinkSplit {
    /// A split whose replies open their own block, or (`opened`) start
    /// inside one the prompt opened.
    pub fn new(opened: bool) -> Self {
        Self { opened }
    }

    /// A fresh reader for one choice's text.
    pub fn reader(&self) -> ThinkReader {
        if self.opened {
            ThinkReader::opened()
        } else {
            ThinkReader::new()
        }
    }

    /// One whole reply: `(reasoning_content, content)`.
    pub fn split(&self, text: &str) -> (Option<String>, String) {
        self.reader().split(text)
    }
}

/// Reads the request's `reasoning_format` (the server's `default` when
/// absent) and decides the split for `model` and the rendered `prompt`:
/// `None` when the text stays as generated. A value outside llama-server's
/// is a 400 naming the field.
pub fn plan(
    field: Option<&str>,
    default: ReasoningFormat,
    model: &LoadedModel,
    prompt: &[u32],
) -> Result<Option<ThinkSplit>, ApiError> {
    let format = match field {
        Some(f) => f
            .parse()
            .map_err(|e: String| ApiError::invalid_param("reasoning_format", e))?,
        None => default,
    };
    let marks = model.template.as_ref().is_some_and(|t| t.marks_reasoning());
    if format == ReasoningFormat::None || !marks {
        return Ok(None);
    }
    let tail = &prompt[prompt.len().saturating_sub(PROMPT_TAIL_TOKENS)..];
    let opened = prompt_opens_reasoning(&model.tokenizer.decode(tail, true));
    Ok(Some(ThinkSplit::new(opened)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_parse_as_llama_server_names_them() {
        assert_eq!("none".parse(), Ok(ReasoningFormat::None));
        assert_eq!("deepseek".parse(), Ok(ReasoningFormat::Deepseek));
        assert_eq!("auto".parse(), Ok(ReasoningFormat::Auto));
        let e = "think".parse::<ReasoningFormat>().unwrap_err();
        assert!(
            e.contains("none, deepseek, auto") && e.contains("think"),
            "{e}"
        );
        assert_eq!(ReasoningFormat::default(), ReasoningFormat::Auto);
    }

    #[test]
    fn an_opened_prompt_splits_a_reply_without_its_opening_tag() {
        let opened = ThinkSplit { opened: true };
        assert_eq!(
            opened.split("plan\n</think>\n\nanswer"),
            (Some("plan".into()), "answer".into())
        );
        let closed = ThinkSplit { opened: false };
        assert_eq!(
            closed.split("plan\n</think>\n\nanswer"),
            (None, "plan\n</think>\n\nanswer".into())
        );
    }
}
