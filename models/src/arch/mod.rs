//! The architecture seam: one file per architecture, each reading in forward
//! order, and [`Model`], which holds whichever one a GGUF declares
//! (`general.architecture`) behind one interface: the forward over a ragged
//! batch, the learner's hidden-state path, the trainable parameters and LoRA
//! shapes, and the parameter count the trainer's memory planner uses.
//!
//! What is not specific to an architecture lives beside it, not in it: the
//! ragged batch ([`crate::batch`]), weights ([`crate::weight`]), RoPE tables
//! ([`crate::rope`]), masks ([`crate::mask`]), llama.cpp's rounding
//! ([`crate::exact`], [`crate::flash`]). Adding an architecture is a new file
//! here, a variant of [`Model`] and a name in [`SUPPORTED`].

pub mod gemma3;
pub mod llama;
pub mod phi3;
pub mod qwen2;
pub mod qwen3;

use std::sync::Arc;

use candle_core::{Tensor, Var};

use crate::batch::SeqBatch;
use crate::config::ModelConfig;
use crate::error::{ModelError, Result};
use crate::gguf::GgufFile;
use crate::lora::{LoraSet, LoraTarget};
use crate::weight::Precision;

pub use llama::{Llama, Trunk};

/// `general.architecture` values Tern runs, in the order `tern info` lists them.
pub const SUPPORTED: &[&str] = &["llama", "qwen2", "qwen3", "phi3", "gemma3"];

/// The error for a GGUF whose architecture Tern does not implement.
pub fn unsupported(name: &str) -> ModelError {
    ModelError::UnsupportedArchitecture {
        name: name.to_string(),
        supported: SUPPORTED.join(", "),
    }
}

/// A loaded model of any supported architecture. Immutable and shareable
/// (adapters are swapped through [`Model::set_adapters`]).
pub enum Model {
    /// `llama` (Llama 1-3, SmolLM2, Mistral-style decoders).
    Llama(Llama),
    /// `qwen2` (Qwen2, Qwen2.5): llama's decoder with QKV biases and NeoX RoPE.
    Qwen2(Llama),
    /// `qwen3` (Qwen3): llama's decoder with per-head QK norms and NeoX RoPE.
    Qwen3(Llama),
    /// `phi3` (Phi-3, Phi-3.5): llama's decoder with fused projections, NeoX
    /// RoPE, a pre-scaled query and LongRoPE factors.
    Phi3(Llama),
    /// `gemma3` (Gemma 3): llama's decoder with QK norms, post-norms, GeGLU,
    /// a scaled embedding and sliding-window layers.
    Gemma3(Llama),
}

impl Model {
    /// Loads `file` (already opened) for serving.
    pub fn load(file: &GgufFile) -> Result<Self> {
        Self::load_as(file, Precision::Quantized)
    }

    /// Loads `file` with its projection weights held as `precision`, choosing
    /// the architecture from `general.architecture`.
    pub fn load_as(file: &GgufFile, precision: Precision) -> Result<Self> {
        let arch = file.str("general.architecture")?;
        match arch {
            "llama" => Ok(Model::Llama(Llama::load_as(file, precision)?)),
            "qwen2" => Ok(Model::Qwen2(qwen2::load_as(file, precision)?)),
            "qwen3" => Ok(Model::Qwen3(qwen3::load_as(file, precision)?)),
            "phi3" => Ok(Model::Phi3(phi3::load_as(file, precision)?)),
            "gemma3" => Ok(Model::Gemma3(gemma3::load_as(file, precision)?)),
            other => Err(unsupported(other)),
        }
    }

    /// The model's hyper-parameters.
    pub fn config(&self) -> &ModelConfig {
        match self {
            Model::Llama(m)
            | Model::Qwen2(m)
            | Model::Qwen3(m)
            | Model::Phi3(m)
            | Model::Gemma3(m) => m.config(),
        }
    }

    /// The window of `layer` when it attends only to its last positions
    /// (Gemma 3's sliding layers): the most entries its cache need keep.
    pub fn sliding_window(&self, layer: usize) -> Option<usize> {
        self.config().sliding_window(layer)
    }

    /// Serves a context of `n` positions (see [`Llama::limit_context`]).
    pub fn limit_context(&mut self, n: usize) {
        match self {
            Model::Llama(m)
            | Model::Qwen2(m)
            | Model::Qwen3(m)
            | Model::Phi3(m)
            | Model::Gemma3(m) => m.limit_context(n),
        }
    }

    /// The rotation `layer`'s RoPE applies to its keys (see [`Llama::rotary`]).
    pub fn rotary(&self, layer: usize) -> &crate::Rotary {
        self.decoder().rotary(layer)
    }

    /// How the projection weights are held.
    pub fn precision(&self) -> Precision {
        match self {
            Model::Llama(m)
            | Model::Qwen2(m)
            | Model::Qwen3(m)
            | Model::Phi3(m)
            | Model::Gemma3(m) => m.precision(),
        }
    }

    /// Installs (or with `None` removes) the adapters [`Model::forward`] applies.
    pub fn set_adapters(&self, adapters: Option<Arc<LoraSet>>) {
        match self {
            Model::Llama(m)
            | Model::Qwen2(m)
            | Model::Qwen3(m)
            | Model::Phi3(m)
            | Model::Gemma3(m) => m.set_adapters(adapters),
        }
    }

    /// The adapters [`Model::forward`] applies now.
    pub fn adapters(&self) -> Option<Arc<LoraSet>> {
        match self {
            Model::Llama(m)
            | Model::Qwen2(m)
            | Model::Qwen3(m)
            | Model::Phi3(m)
            | Model::Gemma3(m) => m.adapters(),
        }
    }

    /// `(out, in)` of a block projection: the shape an adapter on it must fit.
    pub fn projection_shape(&self, target: LoraTarget) -> (usize, usize) {
        match self {
            Model::Llama(m)
            | Model::Qwen2(m)
            | Model::Qwen3(m)
            | Model::Phi3(m)
            | Model::Gemma3(m) => m.projection_shape(target),
        }
    }

    /// The f32 weight `[out, in]` of a projection ([`Precision::DenseF32`]
    /// only): what LoRA merging adds to.
    pub fn dense_projection(&self, layer: usize, target: LoraTarget) -> Option<&Tensor> {
        match self {
            Model::Llama(m)
            | Model::Qwen2(m)
            | Model::Qwen3(m)
            | Model::Phi3(m)
            | Model::Gemma3(m) => m.dense_projection(layer, target),
        }
    }

    /// Makes every block projection and norm trainable (full fine-tuning) and
    /// returns them by GGUF tensor name.
    pub fn make_trainable(&mut self) -> Result<Vec<(String, Var)>> {
        match self {
            Model::Llama(m)
            | Model::Qwen2(m)
            | Model::Qwen3(m)
            | Model::Phi3(m)
            | Model::Gemma3(m) => m.make_trainable(),
        }
    }

    /// The decoder every architecture so far is built on (the llama
    /// family's, with its features): where a learner steps block by block.
    pub fn decoder(&self) -> &Llama {
        match self {
            Model::Llama(m)
            | Model::Qwen2(m)
            | Model::Qwen3(m)
            | Model::Phi3(m)
            | Model::Gemma3(m) => m,
        }
    }

    /// The f32 output projection `[vocab, D]` ([`Precision::DenseF32`] only).
    pub fn dense_output(&self) -> Option<&Tensor> {
        match self {
            Model::Llama(m)
            | Model::Qwen2(m)
            | Model::Qwen3(m)
            | Model::Phi3(m)
            | Model::Gemma3(m) => m.dense_output(),
        }
    }

    /// Parameters the model holds (every weight, norms included): what the
    /// memory planner sizes a dense learner by.
    pub fn parameter_count(&self) -> u64 {
        parameter_count(self.config())
    }

    /// Runs one ragged batch and returns, per sequence, the logits it asked
    /// for: `[rows, vocab]` f32 with rows = 0, 1 or its token count.
    pub fn forward(&self, batch: &mut [SeqBatch<'_>]) -> Result<Vec<Option<Tensor>>> {
        match self {
            Model::Llama(m)
            | Model::Qwen2(m)
            | Model::Qwen3(m)
            | Model::Phi3(m)
            | Model::Gemma3(m) => m.forward(batch),
        }
    }

    /// [`Model::forward`] with explicit adapters (the learner's trainable ones).
    pub fn forward_with(
        &self,
        batch: &mut [SeqBatch<'_>],
        adapters: Option<&LoraSet>,
    ) -> Result<Vec<Option<Tensor>>> {
        match self {
            Model::Llama(m)
            | Model::Qwen2(m)
            | Model::Qwen3(m)
            | Model::Phi3(m)
            | Model::Gemma3(m) => m.forward_with(batch, adapters),
        }
    }

    /// Every new token's final hidden state after the output norm, `[T, D]`
    /// f32 in batch order: what an embedding pools. [`Model::forward`] returns
    /// logits only, and the embeddings endpoint needs the states before the
    /// output projection.
    pub fn hidden(&self, batch: &mut [SeqBatch<'_>]) -> Result<Tensor> {
        match self {
            Model::Llama(m)
            | Model::Qwen2(m)
            | Model::Qwen3(m)
            | Model::Phi3(m)
            | Model::Gemma3(m) => m.hidden(batch),
        }
    }

    /// Every new token's final hidden state after the output norm, `[T, D]`:
    /// what the learner projects onto the vocabulary chunk by chunk.
    pub fn hidden_with(
        &self,
        batch: &mut [SeqBatch<'_>],
        adapters: Option<&LoraSet>,
    ) -> Result<Tensor> {
        match self {
            Model::Llama(m)
            | Model::Qwen2(m)
            | Model::Qwen3(m)
            | Model::Phi3(m)
            | Model::Gemma3(m) => m.hidden_with(batch, adapters),
        }
    }
}

/// The sliding-window layers `file` declares, read as its architecture
/// reads them (only gemma3 has them so far).
pub fn sliding(file: &GgufFile, arch: &str) -> Result<Option<crate::config::Sliding>> {
    match arch {
        "gemma3" => gemma3::sliding(file, file.u32("gemma3.block_count")? as usize),
        _ => Ok(None),
    }
}

/// Parameters of a model of `cfg`'s shape, by its architecture's layout
/// (the planner estimates before loading, from the configuration alone).
pub fn parameter_count(cfg: &ModelConfig) -> u64 {
    // Every supported architecture has llama's layout so far (phi3's fused
    // tensors hold the same parameters); Phi-3 ships its own output head.
    let own_output = match cfg.architecture.as_str() {
        "phi3" => (cfg.vocab_size * cfg.n_embd) as u64,
        _ => 0,
    };
    llama::parameter_count(cfg) + own_output
}
