//! The architecture seam: one file per architecture, each saying what it
//! changes in the shared [`crate::decoder`] (its [`Features`], and any setting
//! or refusal of its own), [`Arch`], the registry that picks one by a GGUF's
//! `general.architecture`, and [`Model`], an architecture with its loaded
//! decoder behind one interface.
//!
//! What is not specific to an architecture lives beside it, not in it: the
//! decoder itself ([`crate::decoder`]), the ragged batch ([`crate::batch`]),
//! weights ([`crate::weight`]), RoPE tables ([`crate::rope`]), masks
//! ([`crate::mask`]), llama.cpp's rounding ([`crate::exact`],
//! [`crate::flash`]). Adding an architecture is a new file here, a variant of
//! [`Arch`] and a name in [`SUPPORTED`].

pub mod gemma3;
pub mod llama;
mod model;
pub mod phi3;
pub mod qwen2;
pub mod qwen3;

use std::collections::HashMap;

use candle_core::Tensor;

use crate::config::ModelConfig;
use crate::decoder::{fused, Decoder, Features};
use crate::error::{ModelError, Result};
use crate::gguf::GgufFile;
use crate::lora::LoraTarget;
use crate::weight::Precision;

pub use model::Model;

/// `general.architecture` values Tern runs, in the order `tern info` lists them.
pub const SUPPORTED: &[&str] = &["llama", "qwen2", "qwen3", "phi3", "gemma3"];

/// The error for a GGUF whose architecture Tern does not implement.
pub fn unsupported(name: &str) -> ModelError {
    ModelError::UnsupportedArchitecture {
        name: name.to_string(),
        supported: SUPPORTED.join(", "),
    }
}

/// A supported architecture: which file of this module says how it differs
/// from the plain decoder.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arch {
    /// `llama` (Llama 1-3, SmolLM2, Mistral-style decoders): the plain decoder.
    Llama,
    /// `qwen2` (Qwen2, Qwen2.5): QKV biases and NeoX RoPE.
    Qwen2,
    /// `qwen3` (Qwen3): per-head QK norms and NeoX RoPE.
    Qwen3,
    /// `phi3` (Phi-3, Phi-3.5): fused projections, NeoX RoPE, a pre-scaled
    /// query and LongRoPE factors.
    Phi3,
    /// `gemma3` (Gemma 3): QK norms, post-norms, GeGLU, a scaled embedding
    /// and sliding-window layers.
    Gemma3,
}

impl Arch {
    /// Every supported architecture, in [`SUPPORTED`]'s order.
    pub const ALL: [Arch; 5] = [
        Arch::Llama,
        Arch::Qwen2,
        Arch::Qwen3,
        Arch::Phi3,
        Arch::Gemma3,
    ];

    /// The architecture called `name` (`general.architecture`), or the error
    /// that lists the supported ones.
    pub fn named(name: &str) -> Result<Self> {
        Self::ALL
            .into_iter()
            .find(|a| a.name() == name)
            .ok_or_else(|| unsupported(name))
    }

    /// The architecture `file` declares.
    pub fn of(file: &GgufFile) -> Result<Self> {
        Self::named(file.str("general.architecture")?)
    }

    /// Its `general.architecture` value.
    pub fn name(self) -> &'static str {
        match self {
            Arch::Llama => "llama",
            Arch::Qwen2 => "qwen2",
            Arch::Qwen3 => "qwen3",
            Arch::Phi3 => "phi3",
            Arch::Gemma3 => "gemma3",
        }
    }

    /// What it switches on in the decoder.
    pub fn features(self) -> Features {
        match self {
            Arch::Llama => llama::FEATURES,
            Arch::Qwen2 => qwen2::FEATURES,
            Arch::Qwen3 => qwen3::FEATURES,
            Arch::Phi3 => phi3::FEATURES,
            Arch::Gemma3 => gemma3::FEATURES,
        }
    }

    /// Loads `file`'s decoder as this architecture runs it, its projections
    /// held as `precision`.
    pub fn load(self, file: &GgufFile, precision: Precision) -> Result<Decoder> {
        match self {
            Arch::Llama => llama::load_as(file, precision),
            Arch::Qwen2 => qwen2::load_as(file, precision),
            Arch::Qwen3 => qwen3::load_as(file, precision),
            Arch::Phi3 => phi3::load_as(file, precision),
            Arch::Gemma3 => gemma3::load_as(file, precision),
        }
    }

    /// Whether it ships an output head of its own, not tied to the
    /// embedding, in every model (Phi-3).
    fn own_output(self) -> bool {
        self == Arch::Phi3
    }
}

/// The sliding-window layers `file` declares, read as its architecture
/// reads them (only gemma3 has them so far).
pub fn sliding(file: &GgufFile, arch: &str) -> Result<Option<crate::config::Sliding>> {
    match Arch::named(arch) {
        Ok(Arch::Gemma3) => gemma3::sliding(file, file.u32("gemma3.block_count")? as usize),
        _ => Ok(None),
    }
}

/// Parameters of a model of `cfg`'s shape, by its architecture's layout
/// (the planner estimates before loading, from the configuration alone).
pub fn parameter_count(cfg: &ModelConfig) -> u64 {
    let arch = Arch::named(&cfg.architecture).ok();
    let features = arch.map_or(llama::FEATURES, Arch::features);
    let own_output = match arch {
        Some(a) if a.own_output() => (cfg.vocab_size * cfg.n_embd) as u64,
        _ => 0,
    };
    crate::decoder::parameter_count(cfg, &features) + own_output
}

/// Whether the architecture called `name` stores projections fused.
fn fuses(name: &str) -> bool {
    Arch::named(name).is_ok_and(|a| a.features().fused_projections)
}

/// Projection `target` of block `layer` as the model computes with it, f32
/// `[out, in]`: its rows of whichever tensor of `file` holds it
/// ([`fused::projection_weight`] for the file's architecture).
pub fn projection_weight(
    file: &GgufFile,
    c: &ModelConfig,
    layer: usize,
    target: LoraTarget,
) -> Result<Tensor> {
    fused::projection_weight(file, c, layer, target, fuses(&c.architecture))
}

/// Replacement tensors named by the model's own projections, rewritten into
/// the tensors `file` holds ([`fused::fuse_replacements`] where its
/// architecture fuses them; unchanged elsewhere).
pub fn fuse_replacements(
    file: &GgufFile,
    replacements: HashMap<String, Tensor>,
) -> Result<HashMap<String, Tensor>> {
    if !fuses(file.str("general.architecture")?) {
        return Ok(replacements);
    }
    fused::fuse_replacements(file, replacements)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decoder::{Mlp, RopeFactors, RopeStyle};

    #[test]
    fn every_supported_name_is_an_architecture_in_order() {
        let names: Vec<&str> = Arch::ALL.iter().map(|a| a.name()).collect();
        assert_eq!(names, SUPPORTED);
        for a in Arch::ALL {
            assert_eq!(Arch::named(a.name()).unwrap(), a);
        }
        let err = Arch::named("mamba").unwrap_err();
        assert!(matches!(err, ModelError::UnsupportedArchitecture { .. }));
        assert!(err
            .to_string()
            .contains("llama, qwen2, qwen3, phi3, gemma3"));
    }

    /// Each architecture's features, in the order of [`Arch::ALL`].
    fn column<T>(f: impl Fn(Features) -> T) -> Vec<T> {
        Arch::ALL.iter().map(|a| f(a.features())).collect()
    }

    #[test]
    fn each_architecture_switches_on_its_own_features() {
        // llama, qwen2, qwen3, phi3, gemma3.
        assert_eq!(column(|f| f.qkv_bias), [false, true, false, false, false]);
        assert_eq!(column(|f| f.qk_norm), [false, false, true, false, true]);
        assert_eq!(
            column(|f| f.rope == RopeStyle::Neox),
            [false, true, true, true, true]
        );
        assert_eq!(
            column(|f| f.fused_projections),
            [false, false, false, true, false]
        );
        assert_eq!(
            column(|f| f.scale_query),
            [false, false, false, true, false]
        );
        assert_eq!(
            column(|f| f.rope_factors == RopeFactors::LongRope),
            [false, false, false, true, false]
        );
        assert_eq!(column(|f| f.post_norms), [false, false, false, false, true]);
        assert_eq!(
            column(|f| f.mlp == Mlp::GeluTanh),
            [false, false, false, false, true]
        );
        assert_eq!(
            column(|f| f.embed_scale),
            [false, false, false, false, true]
        );
    }

    #[test]
    fn parameter_counts_add_what_each_architecture_holds() {
        let cfg = |arch: &str| ModelConfig {
            architecture: arch.into(),
            name: None,
            n_layer: 3,
            n_embd: 64,
            n_head: 4,
            n_kv_head: 2,
            head_dim: 32,
            n_ff: 96,
            vocab_size: 100,
            context_length: 128,
            rope_base: 10_000.0,
            rope_freq_scale: 1.0,
            rms_eps: 1e-5,
            sliding: None,
        };
        let (l, d, hd, qd, kvd, vocab) = (3, 64, 32, 128, 64, 100);
        // Per block: Q and O `[qd, d]`, K and V `[kvd, d]`, three MLP
        // matrices, two norms; then the embedding and the output norm.
        let llama = l * (2 * qd * d + 2 * kvd * d + 3 * d * 96 + 2 * d) + vocab * d + d;
        assert_eq!(parameter_count(&cfg("llama")), llama);
        assert_eq!(parameter_count(&cfg("qwen2")), llama + l * (qd + 2 * kvd));
        assert_eq!(parameter_count(&cfg("qwen3")), llama + l * 2 * hd);
        assert_eq!(parameter_count(&cfg("phi3")), llama + vocab * d);
        assert_eq!(
            parameter_count(&cfg("gemma3")),
            llama + l * (2 * hd + 2 * d)
        );
    }
}
