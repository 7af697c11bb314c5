//! The one error type of `tern-runtime`.

use tern_models::ModelError;

/// What can go wrong between a request and the model.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// Loading or running the model failed.
    #[error(transparent)]
    Model(#[from] ModelError),
    /// Building the tokenizer from GGUF metadata, or encoding, failed.
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    /// The chat template is missing, does not compile or failed to render.
    #[error("chat template: {0}")]
    Template(String),
    /// The prompt plus requested tokens do not fit the context window.
    #[error("prompt has {prompt_tokens} tokens but the context window is {context_length} (at most {max_prompt} prompt tokens leave room to generate)")]
    ContextLength {
        prompt_tokens: usize,
        context_length: usize,
        max_prompt: usize,
    },
    /// The prompt plus the tokens asked for exceed the context window.
    #[error("this model's maximum context length is {context_length} tokens, but {total} were requested ({prompt_tokens} in the prompt, {max_tokens} to generate); reduce the prompt or max_tokens", total = prompt_tokens + max_tokens)]
    ContextRequest {
        prompt_tokens: usize,
        max_tokens: usize,
        context_length: usize,
    },
    /// An input to embed is longer than the model reads at once.
    #[error("input {index} has {tokens} tokens but this model reads at most {context_length}; shorten it or split it")]
    InputLength {
        index: usize,
        tokens: usize,
        context_length: usize,
    },
    /// The prompt tokenized to nothing.
    #[error("the prompt is empty")]
    EmptyPrompt,
    /// An output constraint (schema or grammar) cannot be enforced.
    #[error("{0}")]
    Constraint(String),
    /// A request parameter is out of range.
    #[error("invalid parameter `{param}`: {reason}")]
    InvalidParam { param: String, reason: String },
    /// The engine failed while generating, or stopped mid-request.
    #[error("generation failed: {0}")]
    Generation(String),
    /// A backend other than Tern's own (llama.cpp) failed.
    #[error("{0}")]
    Backend(String),
    /// A tensor operation failed.
    #[error("tensor error: {0}")]
    Candle(#[from] candle_core::Error),
    /// `error`, which a request alone cannot fix: it needs the runtime set up
    /// otherwise (`setting`). The runtime knows no flags; whoever set it up
    /// (the server, the CLI) names its own way to change the setting.
    #[error("{error}")]
    Setup {
        /// What would have to be set up otherwise.
        setting: Setting,
        /// What went wrong, in the runtime's terms.
        error: Box<RuntimeError>,
    },
}

/// What the runtime is set up with once, when a model loads, that a request
/// may need otherwise.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Setting {
    /// A draft model for draft-model speculation.
    DraftModel,
    /// The type a backend's cache stores keys and values as.
    KvDtype,
    /// Whether control-token text in message content is read as control
    /// tokens.
    SpecialTokensInContent,
    /// A chat template: the model has none, so it takes raw prompts only.
    ChatTemplate,
}

impl RuntimeError {
    /// `error`, marked as needing `setting` set up otherwise.
    pub fn setup(setting: Setting, error: RuntimeError) -> Self {
        RuntimeError::Setup {
            setting,
            error: Box::new(error),
        }
    }

    /// The setting this error needs changed, if it is one a request alone
    /// cannot fix.
    pub fn setting(&self) -> Option<Setting> {
        match self {
            RuntimeError::Setup { setting, .. } => Some(*setting),
            _ => None,
        }
    }
}

impl From<crate::sampler::SamplerError> for RuntimeError {
    fn from(e: crate::sampler::SamplerError) -> Self {
        RuntimeError::InvalidParam {
            param: "sampling".into(),
            reason: e.to_string(),
        }
    }
}

/// Result alias for this crate.
pub type Result<T> = std::result::Result<T, RuntimeError>;
