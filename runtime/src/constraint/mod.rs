//! Output constraints applied while sampling.
//!
//! A request may restrict what the model may emit: any JSON object, a JSON
//! schema, or a grammar (llguidance's Lark dialect; the caller builds tool-call
//! grammars in it). [`Grammars`] compiles a [`Constraint`] once per request
//! against the model's vocabulary into a [`Grammar`], which each completion
//! clones and advances token by token. The sampler draws freely first and
//! asks the grammar only whether that token may come next; only when it may
//! not does it compute the full token mask and draw again from the masked
//! distribution, which is the same distribution as masking first (an
//! accepted free draw of an allowed token has probability p(t), a rejected
//! one is redrawn with p(t)/Z) at a fraction of the cost.

#[cfg(test)]
pub(crate) mod byte_vocab;
mod gbnf;
mod vocab;

pub use gbnf::{gbnf_to_lark, GbnfError};

use std::fmt;
use std::sync::Arc;

use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{SimpleVob, TokEnv, TokTrie};
use llguidance::{Matcher, ParserFactory};
use serde_json::Value;

use crate::chat::tool_reader::CallReader;
use crate::tokenizer::Tokenizer;

/// A constraint on generated output a request may ask for.
#[derive(Clone, Debug, PartialEq)]
pub enum Constraint {
    /// Any one JSON object (OpenAI `response_format: json_object`).
    JsonObject,
    /// A JSON value matching this schema (OpenAI `json_schema`).
    JsonSchema(Value),
    /// A grammar in llguidance's Lark dialect (which may embed JSON schemas
    /// with `%json { ... }`).
    Lark(String),
    /// A tool-call grammar (Lark) whose output also ends when a call
    /// repeats an earlier one (same name and arguments): small models under
    /// a forced call write the same call until the token limit otherwise.
    ToolCalls {
        /// The grammar (`ToolSyntax::grammar` or `lazy_grammar`).
        grammar: String,
        /// The declared tools' names: only calls to them are read.
        declared: Vec<String>,
        /// Whether the family writes `<tool_call>` blocks.
        hermes: bool,
    },
}

/// Why a constraint cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ConstraintError {
    /// The schema or grammar does not compile, or uses a feature the
    /// engine does not support (the message names it).
    #[error("{0}")]
    Invalid(String),
}

/// How JSON is written under a schema: one space after `:` and `,`, no
/// other whitespace (as Python's `json.dumps`). Free whitespace would let a
/// small model stall in newlines before or inside the value.
fn json_layout() -> Value {
    serde_json::json!({
        "whitespace_flexible": false,
        "item_separator": ", ",
        "key_separator": ": ",
    })
}

/// The compiler of constraints for one model's vocabulary (built once per
/// model: it indexes every token's bytes).
pub struct Grammars {
    factory: Arc<ParserFactory>,
}

impl Grammars {
    /// Indexes `tokenizer`'s vocabulary; `stop` are the ids that end
    /// generation (allowed exactly where the constraint may end).
    pub fn new(tokenizer: &Tokenizer, stop: &[u32]) -> Result<Self, ConstraintError> {
        let env: TokEnv = Arc::new(vocab::Vocab::new(tokenizer, stop));
        let mut factory =
            ParserFactory::new_simple(&env).map_err(|e| ConstraintError::Invalid(e.to_string()))?;
        factory.quiet();
        Ok(Grammars {
            factory: Arc::new(factory),
        })
    }

    /// Compiles `c`; a schema or grammar the engine cannot enforce is an
    /// error naming what is wrong, never a silently unconstrained answer.
    pub fn compile(&self, c: &Constraint) -> Result<Grammar, ConstraintError> {
        let top = match c {
            Constraint::JsonObject => TopLevelGrammar::from_json_schema(with_layout(
                serde_json::json!({"type": "object"}),
            )?),
            Constraint::JsonSchema(schema) => {
                TopLevelGrammar::from_json_schema(with_layout(schema.clone())?)
            }
            Constraint::Lark(text) | Constraint::ToolCalls { grammar: text, .. } => {
                TopLevelGrammar::from_lark(text.clone())
            }
        };
        let parser = self
            .factory
            .create_parser(top)
            .map_err(|e| ConstraintError::Invalid(e.to_string()))?;
        let matcher = Matcher::new(Ok(parser));
        if let Some(e) = matcher.get_error() {
            return Err(ConstraintError::Invalid(e));
        }
        let calls = match c {
            Constraint::ToolCalls {
                declared, hermes, ..
            } => Some(CallWatch {
                reader: CallReader::new(declared.clone(), *hermes),
                env: self.factory.tok_env().clone(),
                pending: Vec::new(),
            }),
            _ => None,
        };
        Ok(Grammar {
            matcher,
            kind: match c {
                Constraint::JsonObject => "json_object",
                Constraint::JsonSchema(_) => "json_schema",
                Constraint::Lark(_) => "grammar",
                Constraint::ToolCalls { .. } => "tools",
            },
            calls,
        })
    }
}

/// A schema with Tern's JSON layout, unless it sets its own (`x-guidance`).
fn with_layout(schema: Value) -> Result<Value, ConstraintError> {
    match schema {
        Value::Object(mut m) => {
            m.entry("x-guidance").or_insert_with(json_layout);
            Ok(Value::Object(m))
        }
        Value::Bool(true) => Ok(serde_json::json!({"x-guidance": json_layout()})),
        other => Err(ConstraintError::Invalid(format!(
            "a JSON schema must be an object, got `{other}`"
        ))),
    }
}

/// A compiled constraint at some point of one completion's output.
#[derive(Clone)]
pub struct Grammar {
    matcher: Matcher,
    kind: &'static str,
    /// Tool calls read as they are written (tool-call grammars only).
    calls: Option<CallWatch>,
}

/// The calls in a tool-call grammar's output, read token by token to end
/// the output at a repeated call.
#[derive(Clone)]
struct CallWatch {
    reader: CallReader,
    env: TokEnv,
    /// Bytes of a character split across tokens.
    pending: Vec<u8>,
}

impl CallWatch {
    fn feed(&mut self, token: u32) {
        let bytes = self.env.tok_trie().token(token);
        if bytes.first() == Some(&TokTrie::SPECIAL_TOKEN_MARKER) {
            return;
        }
        self.pending.extend_from_slice(bytes);
        let valid = match std::str::from_utf8(&self.pending) {
            Ok(s) => s.len(),
            Err(e) => e.valid_up_to(),
        };
        if valid > 0 {
            let text = String::from_utf8_lossy(&self.pending[..valid]).into_owned();
            self.pending.drain(..valid);
            self.reader.push(&text);
        }
    }
}

impl fmt::Debug for Grammar {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Grammar({})", self.kind)
    }
}

impl Grammar {
    /// Whether `token` may come next (a stop token: whether the output may
    /// end here).
    pub fn allows(&mut self, token: u32) -> bool {
        self.matcher.validate_tokens(&[token]).unwrap_or(0) == 1
    }

    /// Every token that may come next, stop tokens included where the
    /// output may end (`None` once the grammar is in an error state).
    pub fn mask(&mut self) -> Option<SimpleVob> {
        self.matcher.compute_mask().ok()
    }

    /// Advances past `token`; false if the grammar refused it.
    pub fn commit(&mut self, token: u32) -> bool {
        if let Some(w) = &mut self.calls {
            w.feed(token);
        }
        self.matcher.consume_token(token).is_ok()
    }

    /// Whether the output may end here.
    pub fn is_accepting(&mut self) -> bool {
        self.matcher.is_accepting().unwrap_or(false)
    }

    /// Whether nothing can follow (the output is complete), or a tool
    /// call just repeated an earlier one (the answer's calls are done).
    pub fn is_complete(&self) -> bool {
        self.matcher.is_stopped() || self.calls.as_ref().is_some_and(|w| w.reader.repeated())
    }
}
