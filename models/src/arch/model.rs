//! [`Model`]: a loaded model of any supported architecture, the
//! architecture beside its decoder, behind the interface the runtime and the
//! trainer use.

use std::sync::Arc;

use candle_core::{Tensor, Var};

use super::Arch;
use crate::batch::SeqBatch;
use crate::config::ModelConfig;
use crate::decoder::Decoder;
use crate::error::Result;
use crate::gguf::GgufFile;
use crate::lora::{LoraSet, LoraTarget};
use crate::weight::Precision;

/// A loaded model of any supported architecture. Immutable and shareable
/// (adapters are swapped through [`Model::set_adapters`]).
pub struct Model {
    arch: Arch,
    decoder: Decoder,
}

impl Model {
    /// Loads `file` (already opened) for serving.
    pub fn load(file: &GgufFile) -> Result<Self> {
        Self::load_as(file, Precision::Quantized)
    }

    /// Loads `file` with its projection weights held as `precision`, choosing
    /// the architecture from `general.architecture`.
    pub fn load_as(file: &GgufFile, precision: Precision) -> Result<Self> {
        let arch = Arch::of(file)?;
        let decoder = arch.load(file, precision)?;
        Ok(Self { arch, decoder })
    }

    /// `decoder` run as `arch`'s model: what a test that loads a decoder with
    /// features of its choosing serves.
    pub fn new(arch: Arch, decoder: Decoder) -> Self {
        Self { arch, decoder }
    }

    /// The architecture.
    pub fn arch(&self) -> Arch {
        self.arch
    }

    /// The decoder, with the architecture's features: where a learner steps
    /// block by block.
    pub fn decoder(&self) -> &Decoder {
        &self.decoder
    }

    /// The model's hyper-parameters.
    pub fn config(&self) -> &ModelConfig {
        self.decoder.config()
    }

    /// The window of `layer` when it attends only to its last positions
    /// (Gemma 3's sliding layers): the most entries its cache need keep.
    pub fn sliding_window(&self, layer: usize) -> Option<usize> {
        self.config().sliding_window(layer)
    }

    /// Serves a context of `n` positions (see [`Decoder::limit_context`]).
    pub fn limit_context(&mut self, n: usize) {
        self.decoder.limit_context(n)
    }

    /// The rotation `layer`'s RoPE applies to its keys (see [`Decoder::rotary`]).
    pub fn rotary(&self, layer: usize) -> &crate::Rotary {
        self.decoder.rotary(layer)
    }

    /// How the projection weights are held.
    pub fn precision(&self) -> Precision {
        self.decoder.precision()
    }

    /// Installs (or with `None` removes) the adapters [`Model::forward`] applies.
    pub fn set_adapters(&self, adapters: Option<Arc<LoraSet>>) {
        self.decoder.set_adapters(adapters)
    }

    /// The adapters [`Model::forward`] applies now.
    pub fn adapters(&self) -> Option<Arc<LoraSet>> {
        self.decoder.adapters()
    }

    /// `(out, in)` of a block projection: the shape an adapter on it must fit.
    pub fn projection_shape(&self, target: LoraTarget) -> (usize, usize) {
        self.decoder.projection_shape(target)
    }

    /// The f32 weight `[out, in]` of a projection ([`Precision::DenseF32`]
    /// only): what LoRA merging adds to.
    pub fn dense_projection(&self, layer: usize, target: LoraTarget) -> Option<&Tensor> {
        self.decoder.dense_projection(layer, target)
    }

    /// Makes every block projection and norm trainable (full fine-tuning) and
    /// returns them by GGUF tensor name.
    pub fn make_trainable(&mut self) -> Result<Vec<(String, Var)>> {
        self.decoder.make_trainable()
    }

    /// The f32 output projection `[vocab, D]` ([`Precision::DenseF32`] only).
    pub fn dense_output(&self) -> Option<&Tensor> {
        self.decoder.dense_output()
    }

    /// Parameters the model holds (every weight, norms included): what the
    /// memory planner sizes a dense learner by.
    pub fn parameter_count(&self) -> u64 {
        super::parameter_count(self.config())
    }

    /// Runs one ragged batch and returns, per sequence, the logits it asked
    /// for: `[rows, vocab]` f32 with rows = 0, 1 or its token count.
    pub fn forward(&self, batch: &mut [SeqBatch<'_>]) -> Result<Vec<Option<Tensor>>> {
        self.decoder.forward(batch)
    }

    /// [`Model::forward`] with explicit adapters (the learner's trainable ones).
    pub fn forward_with(
        &self,
        batch: &mut [SeqBatch<'_>],
        adapters: Option<&LoraSet>,
    ) -> Result<Vec<Option<Tensor>>> {
        self.decoder.forward_with(batch, adapters)
    }

    /// Every new token's final hidden state after the output norm, `[T, D]`
    /// f32 in batch order: what an embedding pools. [`Model::forward`] returns
    /// logits only, and the embeddings endpoint needs the states before the
    /// output projection.
    pub fn hidden(&self, batch: &mut [SeqBatch<'_>]) -> Result<Tensor> {
        self.decoder.hidden(batch)
    }

    /// Every new token's final hidden state after the output norm, `[T, D]`:
    /// what the learner projects onto the vocabulary chunk by chunk.
    pub fn hidden_with(
        &self,
        batch: &mut [SeqBatch<'_>],
        adapters: Option<&LoraSet>,
    ) -> Result<Tensor> {
        self.decoder.hidden_with(batch, adapters)
    }
}
