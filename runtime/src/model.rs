//! A model ready to run: weights, tokenizer and chat template loaded from one GGUF.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use tern_models::{GgufFile, Model, ModelConfig, Precision};

use crate::chat::{ChatMessage, ChatTemplate};
use crate::chat_prompt::{encode_chat, ContentTokens};
use crate::constraint::{Constraint, Grammar, Grammars};
use crate::error::{Result, RuntimeError, Setting};
use crate::sampler::DryBreakers;
use crate::tokenizer::Tokenizer;

/// Everything needed to turn text into tokens, run them, and turn tokens back
/// into text, for one GGUF file.
pub struct LoadedModel {
    /// Where the weights came from.
    pub path: PathBuf,
    /// The forward pass and its weights, behind the architecture seam
    /// (whichever architecture the GGUF declares).
    pub arch: Model,
    /// Text <-> ids.
    pub tokenizer: Tokenizer,
    /// The GGUF's chat template, if it has one.
    pub template: Option<ChatTemplate>,
    /// Ids that end generation ([`LoadedModel::stop_tokens`]).
    stop: Vec<u32>,
    /// The constraint compiler over this vocabulary, built on first use.
    grammars: OnceLock<std::result::Result<Grammars, String>>,
    /// DRY's breakers for the last list asked for: clients send the same
    /// list (llama-server's default) request after request, and building
    /// it walks the whole vocabulary (10-25 ms on the engine thread).
    dry: Mutex<Option<(Vec<String>, Arc<DryBreakers>)>>,
}

/// End-of-turn and end-of-text tokens of the common families, matched by
/// text as llama.cpp's end-of-generation set also is: ChatML, Llama 3,
/// Phi-3, Gemma, and the GPT-2 family's.
const END_OF_GENERATION: &[&str] = &[
    "<|im_end|>",
    "<|endoftext|>",
    "<|eot_id|>",
    "<|eom_id|>",
    "<|end_of_text|>",
    "<|end|>",
    "<end_of_turn>",
];

impl LoadedModel {
    /// Opens, validates and loads `path` for serving (quantized weights).
    pub fn load(path: &Path) -> Result<Self> {
        Self::load_as(path, Precision::Quantized)
    }

    /// As [`LoadedModel::load`], holding the weights as `precision` (the
    /// trainer's learner loads [`Precision::DenseF32`]).
    pub fn load_as(path: &Path, precision: Precision) -> Result<Self> {
        let file = GgufFile::open(path)?;
        let tokenizer = Tokenizer::from_gguf(&file)?;
        let model = Model::load_as(&file, precision)?;
        if tokenizer.vocab_size() != model.config().vocab_size {
            return Err(RuntimeError::Tokenizer(format!(
                "vocabulary has {} tokens but the embedding has {} rows",
                tokenizer.vocab_size(),
                model.config().vocab_size
            )));
        }
        let template = match file.str("tokenizer.chat_template") {
            Ok(src) => {
                let name = |id: Option<u32>| {
                    id.map(|i| String::from_utf8_lossy(tokenizer.bytes_of(i, true)).into_owned())
                        .unwrap_or_default()
                };
                Some(ChatTemplate::new(
                    src,
                    &name(tokenizer.bos()),
                    &name(tokenizer.eos()),
                )?)
            }
            Err(_) => None,
        };
        // The declared EOS, end-of-turn and end-of-message ids, then the
        // family tokens by text.
        let mut stop: Vec<u32> = tokenizer.eos().into_iter().collect();
        let declared = ["tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"]
            .iter()
            .filter_map(|k| file.u32(k).ok());
        let named = END_OF_GENERATION
            .iter()
            .filter_map(|t| tokenizer.token_id(t));
        for id in declared.chain(named) {
            if (id as usize) < tokenizer.vocab_size() && !stop.contains(&id) {
                stop.push(id);
            }
        }
        Ok(Self {
            path: path.to_path_buf(),
            arch: model,
            tokenizer,
            template,
            stop,
            grammars: OnceLock::new(),
            dry: Mutex::new(None),
        })
    }

    /// Compiles an output constraint against this model's vocabulary (the
    /// vocabulary's index is built by the first call and kept).
    pub fn grammar(&self, c: &Constraint) -> Result<Grammar> {
        let grammars = self
            .grammars
            .get_or_init(|| Grammars::new(&self.tokenizer, &self.stop).map_err(|e| e.to_string()))
            .as_ref()
            .map_err(|e| RuntimeError::Constraint(e.clone()))?;
        grammars
            .compile(c)
            .map_err(|e| RuntimeError::Constraint(e.to_string()))
    }

    /// DRY's sequence breakers as this vocabulary's tokens (llama.cpp's
    /// search: tokens containing a breaker, and tokens ending with the start
    /// of one followed by the rest's tokens); the last list's are kept, so
    /// requests that send the same list share them.
    pub fn dry_breakers(&self, breakers: &[String]) -> Arc<DryBreakers> {
        let mut last = self.dry.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((list, built)) = last.as_ref() {
            if list.as_slice() == breakers {
                return Arc::clone(built);
            }
        }
        let tok = &self.tokenizer;
        let built = Arc::new(DryBreakers::build(
            tok.vocab_size(),
            |id| tok.bytes_of(id, true),
            |s| tok.encode(s, false, false).unwrap_or_default(),
            breakers,
        ));
        *last = Some((breakers.to_vec(), Arc::clone(&built)));
        built
    }

    /// The model's hyper-parameters.
    pub fn config(&self) -> &ModelConfig {
        self.arch.config()
    }

    /// The chat template, or a clear error for models without one.
    pub fn chat_template(&self) -> Result<&ChatTemplate> {
        self.template.as_ref().ok_or_else(|| {
            RuntimeError::setup(
                Setting::ChatTemplate,
                RuntimeError::Template(
                    "this model has no chat template (a base model), so it takes a raw prompt, \
                     not messages"
                        .into(),
                ),
            )
        })
    }

    /// `messages` through the chat template, tokenized and ready to
    /// generate from (the assistant turn opened): the one way every caller
    /// builds a chat prompt. `content` says how control-token text inside
    /// messages is encoded (see [`ContentTokens`]).
    pub fn chat_prompt(
        &self,
        messages: &[ChatMessage],
        content: ContentTokens,
    ) -> Result<Vec<u32>> {
        encode_chat(
            self.chat_template()?,
            &self.tokenizer,
            messages,
            true,
            content,
        )
    }

    /// OpenAI-style `messages` (tool calls and results included) and an
    /// optional tool list through the chat template, tokenized as
    /// [`LoadedModel::chat_prompt`] does. A template without a tools section
    /// gets them the documented default way
    /// ([`crate::chat::tools::fold_into_messages`]).
    pub fn conversation_prompt(
        &self,
        messages: &serde_json::Value,
        tools: Option<&serde_json::Value>,
        content: ContentTokens,
    ) -> Result<Vec<u32>> {
        let template = self.chat_template()?;
        let caps = template.caps();
        let has_calls = messages
            .as_array()
            .into_iter()
            .flatten()
            .any(|m| m.get("tool_calls").is_some_and(|c| !c.is_null()) || m["role"] == "tool");
        let fold = (tools.is_some() && !caps.tools) || (has_calls && !caps.tool_calls);
        let (messages, tools) = if fold {
            (
                crate::chat::tools::fold_into_messages(messages, tools),
                None,
            )
        } else {
            (messages.clone(), tools.cloned())
        };
        let opts = crate::chat::RenderOptions {
            tools,
            ..crate::chat::RenderOptions::default()
        };
        crate::chat_prompt::encode_conversation(
            template,
            &self.tokenizer,
            &messages,
            &opts,
            content,
        )
    }

    /// Checks that a prompt of `prompt_tokens` is non-empty and leaves room
    /// in the context for at least one token (see [`check_prompt`]).
    pub fn check_prompt(&self, prompt_tokens: usize) -> Result<()> {
        check_prompt(prompt_tokens, self.config().context_length)
    }

    /// Serves a context of `n` tokens instead of the `context_length` the
    /// model was trained for (llama.cpp's `-c`): prompts, answers and KV
    /// reservations are held to it. Refused above the trained length, where
    /// RoPE has no trained positions, and below 16 tokens.
    pub fn limit_context(&mut self, n: usize) -> Result<()> {
        let trained = self.config().context_length;
        if !(16..=trained).contains(&n) {
            return Err(RuntimeError::InvalidParam {
                param: "context_length".into(),
                reason: format!(
                    "a served context must be between 16 tokens and the model's trained \
                     {trained}, got {n}"
                ),
            });
        }
        self.arch.limit_context(n);
        Ok(())
    }

    /// Tokens the context leaves after a prompt of `prompt_tokens`.
    pub fn room(&self, prompt_tokens: usize) -> usize {
        self.config().context_length.saturating_sub(prompt_tokens)
    }

    /// `max_tokens` cut to the room after the prompt, at least 1: for
    /// callers that generate "up to" a length rather than insist on it.
    pub fn fit_max_tokens(&self, prompt_tokens: usize, max_tokens: usize) -> usize {
        max_tokens.min(self.room(prompt_tokens)).max(1)
    }

    /// Token ids that end generation: the declared EOS, the GGUF's
    /// end-of-turn (`tokenizer.ggml.eot_token_id`) and end-of-message ids,
    /// and the families' end tokens (`<|im_end|>`, `<|eot_id|>`,
    /// `<end_of_turn>`, `<|end|>` ...) where the vocabulary has them.
    pub fn stop_tokens(&self) -> Vec<u32> {
        self.stop.clone()
    }
}

/// Checks that a prompt of `prompt_tokens` is non-empty and leaves room in a
/// context of `context_length` for at least one token: the one check every
/// way into the engine applies (the server calls it before queueing).
pub fn check_prompt(prompt_tokens: usize, context_length: usize) -> Result<()> {
    if prompt_tokens == 0 {
        return Err(RuntimeError::EmptyPrompt);
    }
    if prompt_tokens >= context_length {
        return Err(RuntimeError::ContextLength {
            prompt_tokens,
            context_length,
            max_prompt: context_length.saturating_sub(1),
        });
    }
    Ok(())
}
