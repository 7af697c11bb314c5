//! The llama architecture (Touvron et al. 2023, "LLaMA"): a pre-norm decoder with
//! grouped-query attention, rotary position embeddings, RMSNorm and a SwiGLU MLP,
//! over GGUF weights held as candle quantized tensors.
//!
//! The forward pass takes a ragged batch ([`crate::batch`]): dense projections
//! run once over all tokens; attention runs per sequence against that
//! sequence's cache. The cache is reached only through [`KvStore`], so the
//! runtime can evict, fork and account for it without the model knowing.
//!
//! Shapes below: `T` = tokens in the batch, `D` = hidden size, `H` = query heads,
//! `KV` = key/value heads, `G = H / KV`, `hd` = head dim, `C` = cached positions.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use candle_core::quantized::QTensor;
use candle_core::{DType, Device, Tensor, Var, D};

use crate::batch::{plan, BatchLayout, LogitsWanted, SeqBatch, SeqSlot};
use crate::config::ModelConfig;
use crate::error::{ModelError, Result};
use crate::exact::round_f16;
use crate::gguf::GgufFile;
use crate::kv::KvStore;
use crate::kv_dtype::{hadamard, KvDtype};
use crate::lora::{LoraSet, LoraTarget};
use crate::mask::causal_mask;
use crate::quant::pool::Pool;
use crate::quant::QLinear;
use crate::rope::{rope_tables, Rotary};
use crate::weight::{Precision, Weight};

/// How the decoders of the llama family differ, as each architecture's file
/// declares it (llama, qwen2, ...): everything else is shared.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Features {
    /// Biases on the Q, K and V projections (`blk.N.attn_{q,k,v}.bias`).
    pub qkv_bias: bool,
    /// RMSNorm of each query and key head before RoPE
    /// (`blk.N.attn_{q,k}_norm.weight`, `[head_dim]`).
    pub qk_norm: bool,
    /// Which elements RoPE rotates together.
    pub rope: RopeStyle,
    /// Phi-3's storage: Q/K/V may be one `attn_qkv` and gate/up are one
    /// `ffn_up` (`[gate; up]`), split by rows at load (see [`super::phi3`]).
    pub fused_projections: bool,
    /// The query multiplied by `1/sqrt(hd)` after RoPE and the scores left
    /// unscaled (Phi-3), rather than the scores scaled (llama).
    pub scale_query: bool,
    /// Which per-pair RoPE frequency factors the file may carry.
    pub rope_factors: RopeFactors,
    /// RMSNorms after attention and after the MLP, before each joins the
    /// residual (`blk.N.post_attention_norm`, `blk.N.post_ffw_norm`: Gemma's).
    pub post_norms: bool,
    /// The MLP's gated activation.
    pub mlp: Mlp,
    /// Token embeddings multiplied by `sqrt(n_embd)` (Gemma).
    pub embed_scale: bool,
}

/// Where a model's per-pair RoPE frequency factors come from, if anywhere.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeFactors {
    /// Llama 3's `rope_freqs.weight`, when present.
    Llama3,
    /// Phi-3's LongRoPE: `rope_factors_long.weight` or
    /// `rope_factors_short.weight`, chosen by context length.
    LongRope,
}

/// The gated activation of the MLP: `act(gate) * up`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mlp {
    /// SiLU (SwiGLU): llama, Qwen.
    Silu,
    /// GELU, tanh approximation (GeGLU): Gemma.
    GeluTanh,
}

/// The pairing RoPE rotates, which llama.cpp calls the rope type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeStyle {
    /// Adjacent pairs `(2i, 2i+1)`: GGUF llama weights are laid out for it.
    Interleaved,
    /// Halves `(i, i + hd/2)`: NeoX's layout (Qwen2, Gemma, Phi-3).
    Neox,
}

/// What a llama model is: no projection biases, interleaved RoPE.
pub const LLAMA: Features = Features {
    qkv_bias: false,
    qk_norm: false,
    rope: RopeStyle::Interleaved,
    fused_projections: false,
    scale_query: false,
    rope_factors: RopeFactors::Llama3,
    post_norms: false,
    mlp: Mlp::Silu,
    embed_scale: false,
};

struct Block {
    attn_norm: Tensor,
    /// Q, K, V biases `[out]` f32, when the architecture has them.
    qkv_bias: Option<[Tensor; 3]>,
    /// Per-head Q and K norm weights `[head_dim]`, when it has them.
    qk_norm: Option<[Tensor; 2]>,
    wq: Weight,
    wk: Weight,
    wv: Weight,
    wo: Weight,
    ffn_norm: Tensor,
    /// Attention and MLP post-norms `[D]`, when the architecture has them.
    post_norms: Option<[Tensor; 2]>,
    w_gate: Weight,
    w_up: Weight,
    w_down: Weight,
}

impl Block {
    fn weight(&self, target: LoraTarget) -> &Weight {
        match target {
            LoraTarget::Q => &self.wq,
            LoraTarget::K => &self.wk,
            LoraTarget::V => &self.wv,
            LoraTarget::O => &self.wo,
            LoraTarget::Gate => &self.w_gate,
            LoraTarget::Up => &self.w_up,
            LoraTarget::Down => &self.w_down,
        }
    }
}

/// A loaded llama model: weights plus RoPE tables. Immutable and shareable.
pub struct Llama {
    config: ModelConfig,
    /// Token embedding `[vocab, D]`; also the output projection when tied.
    embedding: Weight,
    blocks: Vec<Block>,
    output_norm: Tensor,
    /// A separate output projection, when the model has one.
    output: Option<Weight>,
    precision: Precision,
    /// Adapters applied by [`Llama::forward`]; swapped between engine steps.
    adapters: RwLock<Option<Arc<LoraSet>>>,
    /// `[context_length, hd/2]` f32.
    rope_cos: Tensor,
    /// `[context_length, hd/2]` f32.
    rope_sin: Tensor,
    /// What this member of the family has (biases, RoPE style).
    features: Features,
    /// The sliding-window layers' own RoPE tables `[context_length, hd/2]`
    /// (cos, sin), when the configuration has such layers.
    rope_local: Option<(Tensor, Tensor)>,
    /// The global layers' rotation, handed to caches that watch queries.
    rotary: Rotary,
    /// The sliding layers' rotation, when the configuration has such layers.
    rotary_local: Option<Rotary>,
    /// Multiplies the queries after RoPE, attention then unscaled (Gemma's
    /// order); `None`: attention scales scores by `1/sqrt(head_dim)`.
    query_scale: Option<f32>,
    /// Final logits soft-capped as `cap * tanh(logits / cap)`.
    logit_softcap: Option<f32>,
}

/// A projection stored as a type candle cannot read (IQ4_NL, IQ4_XS): its
/// bytes straight from the file into Tern's layer, or dequantized for the
/// learner.
fn own_weight(
    file: &GgufFile,
    name: &str,
    t: crate::gguf::OwnTensorData<'_>,
    dims: &[usize],
    precision: Precision,
) -> Result<Weight> {
    let bad = |reason: String| ModelError::BadTensor {
        name: name.into(),
        reason,
    };
    if t.dims != dims {
        return Err(bad(format!("expected shape {dims:?}, found {:?}", t.dims)));
    }
    let (rows, cols) = (dims[0], dims[1]);
    let w = match precision {
        Precision::Quantized => Weight::Quant(Arc::new(
            QLinear::from_own(t.ty, rows, cols, t.data).map_err(|e| bad(e.to_string()))?,
        )),
        Precision::DenseF32 => Weight::Dense(
            crate::quant::dequantize_own(t.ty, rows, cols, t.data)
                .map_err(|e| bad(e.to_string()))?,
        ),
    };
    file.release_pages(name);
    Ok(w)
}

impl Llama {
    /// Loads the weights of `file` (already opened and validated) for serving.
    pub fn load(file: &GgufFile) -> Result<Self> {
        Self::load_as(file, Precision::Quantized)
    }

    /// Loads the weights of `file` held as `precision`.
    pub fn load_as(file: &GgufFile, precision: Precision) -> Result<Self> {
        Self::load_with(file, precision, LLAMA)
    }

    /// Loads a member of the llama family with `features` (its
    /// architecture's file says which).
    pub fn load_with(file: &GgufFile, precision: Precision, features: Features) -> Result<Self> {
        let config = ModelConfig::from_gguf(file)?;
        let (d, qd, kvd) = (
            config.n_embd,
            config.q_dim(),
            config.n_kv_head * config.head_dim,
        );
        let qt = |name: &str, dims: &[usize]| -> Result<QTensor> {
            let t = file.tensor(name)?;
            if t.shape().dims() != dims {
                return Err(ModelError::BadTensor {
                    name: name.into(),
                    reason: format!("expected shape {dims:?}, found {:?}", t.shape().dims()),
                });
            }
            Ok(t)
        };
        let weight = |name: &str, t: QTensor| -> Result<Weight> {
            Ok(match precision {
                Precision::Quantized => {
                    Weight::Quant(Arc::new(QLinear::from_qtensor(t).map_err(|e| {
                        ModelError::BadTensor {
                            name: name.into(),
                            reason: e.to_string(),
                        }
                    })?))
                }
                // The served values exactly, so the learner is the sampler's policy.
                Precision::DenseF32 => Weight::Dense(crate::quant::dequantize(t)?),
            })
        };
        let mm = |name: &str, dims: &[usize]| -> Result<Weight> {
            match file.own_tensor(name) {
                Some(t) => own_weight(file, name, t, dims, precision),
                None => weight(name, qt(name, dims)?),
            }
        };
        let vec = |name: &str| -> Result<Tensor> { Ok(qt(name, &[d])?.dequantize(&Device::Cpu)?) };
        let embedding = mm("token_embd.weight", &[config.vocab_size, d])?;
        let output = if file.has_tensor("output.weight") {
            Some(mm("output.weight", &[config.vocab_size, d])?)
        } else {
            None
        };
        let mut blocks = Vec::with_capacity(config.n_layer);
        for i in 0..config.n_layer {
            let p = |s: &str| format!("blk.{i}.{s}.weight");
            let bias = |s: &str, n: usize| -> Result<Tensor> {
                Ok(qt(&format!("blk.{i}.{s}.bias"), &[n])?.dequantize(&Device::Cpu)?)
            };
            let qkv_bias = if features.qkv_bias {
                Some([
                    bias("attn_q", qd)?,
                    bias("attn_k", kvd)?,
                    bias("attn_v", kvd)?,
                ])
            } else {
                None
            };
            let head_norm = |s: &str| -> Result<Tensor> {
                Ok(qt(&p(s), &[config.head_dim])?.dequantize(&Device::Cpu)?)
            };
            let qk_norm = if features.qk_norm {
                Some([head_norm("attn_q_norm")?, head_norm("attn_k_norm")?])
            } else {
                None
            };
            let fused = features.fused_projections;
            let [wq, wk, wv] = if fused && file.has_tensor(&p("attn_qkv")) {
                let [q, k, v]: [QTensor; 3] =
                    super::phi3::split_rows(file, &p("attn_qkv"), &[qd, kvd, kvd], d)?
                        .try_into()
                        .map_err(|_| ModelError::BadTensor {
                            name: p("attn_qkv"),
                            reason: "not three parts".into(),
                        })?;
                let n = p("attn_qkv");
                [weight(&n, q)?, weight(&n, k)?, weight(&n, v)?]
            } else {
                [
                    mm(&p("attn_q"), &[qd, d])?,
                    mm(&p("attn_k"), &[kvd, d])?,
                    mm(&p("attn_v"), &[kvd, d])?,
                ]
            };
            let [w_gate, w_up] = if fused {
                let [g, u]: [QTensor; 2] =
                    super::phi3::split_rows(file, &p("ffn_up"), &[config.n_ff, config.n_ff], d)?
                        .try_into()
                        .map_err(|_| ModelError::BadTensor {
                            name: p("ffn_up"),
                            reason: "not two parts".into(),
                        })?;
                let n = p("ffn_up");
                [weight(&n, g)?, weight(&n, u)?]
            } else {
                [
                    mm(&p("ffn_gate"), &[config.n_ff, d])?,
                    mm(&p("ffn_up"), &[config.n_ff, d])?,
                ]
            };
            let post_norms = if features.post_norms {
                Some([vec(&p("post_attention_norm"))?, vec(&p("post_ffw_norm"))?])
            } else {
                None
            };
            blocks.push(Block {
                attn_norm: vec(&p("attn_norm"))?,
                post_norms,
                qkv_bias,
                qk_norm,
                wq,
                wk,
                wv,
                wo: mm(&p("attn_output"), &[d, qd])?,
                ffn_norm: vec(&p("ffn_norm"))?,
                w_gate,
                w_up,
                w_down: mm(&p("ffn_down"), &[d, config.n_ff])?,
            });
        }
        // Long-context RoPE: per-pair frequency factors.
        let freq_factors: Option<Vec<f32>> = match features.rope_factors {
            RopeFactors::Llama3 if file.has_tensor("rope_freqs.weight") => {
                let t = qt("rope_freqs.weight", &[config.head_dim / 2])?;
                Some(t.dequantize(&Device::Cpu)?.to_vec1()?)
            }
            RopeFactors::Llama3 => None,
            RopeFactors::LongRope => super::phi3::rope_factors(file, &config)?,
        };
        let (mut rope_cos, mut rope_sin) = rope_tables(&config, freq_factors.as_deref())?;
        let neox = features.rope == RopeStyle::Neox;
        let rotary = Rotary::new(&config, neox, freq_factors.as_deref());
        // llama.cpp multiplies every cos and sin by `rope.scaling.attn_factor`
        // (LongRoPE's magnitude correction), in f32.
        let attn_factor_key = format!("{}.rope.scaling.attn_factor", config.architecture);
        if file.get(&attn_factor_key).is_some() {
            let m = file.f32(&attn_factor_key)?;
            if !(m.is_finite() && m > 0.0) {
                return Err(ModelError::MissingMetadata {
                    key: attn_factor_key,
                });
            }
            if m != 1.0 {
                rope_cos = (rope_cos * m as f64)?;
                rope_sin = (rope_sin * m as f64)?;
            }
        }
        let (rope_local, rotary_local) = match &config.sliding {
            Some(s) => {
                let local = ModelConfig {
                    rope_base: s.rope_base,
                    rope_freq_scale: 1.0,
                    ..config.clone()
                };
                (
                    Some(rope_tables(&local, None)?),
                    Some(Rotary::new(&local, neox, None)),
                )
            }
            None => (None, None),
        };
        let query_scale = features.scale_query.then(|| query_scale(config.head_dim));
        Ok(Self {
            output_norm: vec("output_norm.weight")?,
            config,
            embedding,
            blocks,
            output,
            rope_cos,
            rope_sin,
            precision,
            adapters: RwLock::new(None),
            features,
            rope_local,
            rotary,
            rotary_local,
            query_scale,
            logit_softcap: None,
        })
    }

    /// Scales the queries by `scale` after RoPE instead of the scores.
    pub fn with_query_scale(mut self, scale: f32) -> Self {
        self.query_scale = Some(scale);
        self
    }

    /// Soft-caps the final logits at `cap`.
    pub fn with_logit_softcap(mut self, cap: f32) -> Self {
        self.logit_softcap = Some(cap);
        self
    }

    /// The window of `layer` when it is a sliding-window layer: the most
    /// positions its attention ever reads.
    pub fn sliding_window(&self, layer: usize) -> Option<usize> {
        self.config.sliding_window(layer)
    }

    /// How the projection weights are held.
    pub fn precision(&self) -> Precision {
        self.precision
    }

    /// The rotation `layer`'s RoPE applies (the local one on a sliding
    /// layer): what re-positions a key already in a cache.
    pub fn rotary(&self, layer: usize) -> &Rotary {
        match (&self.rotary_local, self.sliding_window(layer)) {
            (Some(local), Some(_)) => local,
            _ => &self.rotary,
        }
    }

    /// Installs (or with `None` removes) the adapters [`Llama::forward`] applies.
    /// A forward already running keeps the set it started with.
    pub fn set_adapters(&self, adapters: Option<Arc<LoraSet>>) {
        *self.adapters.write().unwrap_or_else(|e| e.into_inner()) = adapters;
    }

    /// The adapters [`Llama::forward`] applies now.
    pub fn adapters(&self) -> Option<Arc<LoraSet>> {
        self.adapters
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// `(out, in)` of a block projection: the shape an adapter on it must fit.
    pub fn projection_shape(&self, target: LoraTarget) -> (usize, usize) {
        target.shape(&self.config)
    }

    /// The f32 weight `[out, in]` of a projection ([`Precision::DenseF32`] only):
    /// what LoRA merging adds to.
    pub fn dense_projection(&self, layer: usize, target: LoraTarget) -> Option<&Tensor> {
        match self.blocks.get(layer)?.weight(target) {
            Weight::Dense(w) => Some(w),
            Weight::Quant(_) => None,
        }
    }

    /// Turns every block projection and norm of a [`Precision::DenseF32`] model
    /// into a trainable variable (full fine-tuning) and returns them by GGUF
    /// tensor name. The forward reads the variables in place, so an optimiser
    /// updating them updates the model. The token embedding (the tied output
    /// projection) stays frozen.
    pub fn make_trainable(&mut self) -> Result<Vec<(String, Var)>> {
        let mut out = Vec::new();
        for (i, b) in self.blocks.iter_mut().enumerate() {
            let mut norms = vec![
                ("attn_norm", &mut b.attn_norm),
                ("ffn_norm", &mut b.ffn_norm),
            ];
            if let Some([attn_post, ffn_post]) = b.post_norms.as_mut() {
                norms.push(("post_attention_norm", attn_post));
                norms.push(("post_ffw_norm", ffn_post));
            }
            for (stem, norm) in norms {
                let var = Var::from_tensor(norm)?;
                *norm = var.as_tensor().clone();
                out.push((format!("blk.{i}.{stem}.weight"), var));
            }
            for t in LoraTarget::ALL {
                let w = match t {
                    LoraTarget::Q => &mut b.wq,
                    LoraTarget::K => &mut b.wk,
                    LoraTarget::V => &mut b.wv,
                    LoraTarget::O => &mut b.wo,
                    LoraTarget::Gate => &mut b.w_gate,
                    LoraTarget::Up => &mut b.w_up,
                    LoraTarget::Down => &mut b.w_down,
                };
                let Weight::Dense(dense) = w else {
                    return Err(ModelError::BadTensor {
                        name: format!("blk.{i}.{}.weight", t.gguf_stem()),
                        reason: "only a DenseF32 model can be trained".into(),
                    });
                };
                let var = Var::from_tensor(dense)?;
                *dense = var.as_tensor().clone();
                out.push((format!("blk.{i}.{}.weight", t.gguf_stem()), var));
            }
        }
        let var = Var::from_tensor(&self.output_norm)?;
        self.output_norm = var.as_tensor().clone();
        out.push(("output_norm.weight".into(), var));
        Ok(out)
    }

    /// The f32 output projection `[vocab, D]` ([`Precision::DenseF32`] only; the
    /// token embedding when tied): the learner's log-softmax reads it in chunks.
    pub fn dense_output(&self) -> Option<&Tensor> {
        match self.output.as_ref().unwrap_or(&self.embedding) {
            Weight::Dense(w) => Some(w),
            Weight::Quant(_) => None,
        }
    }

    /// The quantized output projection `[vocab, D]` (the token embedding when
    /// tied), for a learner that scores with the sampler's own kernel.
    pub fn quant_output(&self) -> Option<&Arc<QLinear>> {
        match self.output.as_ref().unwrap_or(&self.embedding) {
            Weight::Quant(q) => Some(q),
            Weight::Dense(_) => None,
        }
    }

    /// The model's hyper-parameters.
    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    /// Serves a context of `n` positions instead of the trained one (`n`
    /// no larger): sequences, and the RoPE rows they use, stop there.
    pub fn limit_context(&mut self, n: usize) {
        self.config.context_length = self.config.context_length.min(n.max(1));
    }

    /// Runs one ragged batch and returns, per sequence, the logits it asked for:
    /// `[rows, vocab]` f32 with rows = 0, 1 or its token count.
    pub fn forward(&self, batch: &mut [SeqBatch<'_>]) -> Result<Vec<Option<Tensor>>> {
        let adapters = self.adapters();
        self.forward_with(batch, adapters.as_deref())
    }

    /// [`Llama::forward`] with explicit adapters (the learner's trainable ones).
    pub fn forward_with(
        &self,
        batch: &mut [SeqBatch<'_>],
        adapters: Option<&LoraSet>,
    ) -> Result<Vec<Option<Tensor>>> {
        let layout = plan(&self.config, batch)?;
        let x = self.trunk(batch, &layout, adapters)?;
        self.logits(&x, batch, &layout)
    }

    /// Every new token's final hidden state after the output norm, `[T, D]` in
    /// batch order: what the learner projects onto the vocabulary chunk by chunk
    /// instead of materialising `[T, vocab]` logits.
    pub fn hidden_with(
        &self,
        batch: &mut [SeqBatch<'_>],
        adapters: Option<&LoraSet>,
    ) -> Result<Tensor> {
        if let Some(cap) = self.logit_softcap {
            // The learner projects these itself and would skip the cap.
            return Err(ModelError::UnsupportedFeature {
                key: format!("{}.final_logit_softcapping", self.config.architecture),
                value: cap.to_string(),
                supported: "no soft-capping when training".into(),
            });
        }
        let layout = plan(&self.config, batch)?;
        let x = self.trunk(batch, &layout, adapters)?;
        self.norm(&x, &self.output_norm)
    }

    /// Every new token's final hidden state after the output norm, `[T, D]` f32
    /// in batch order, with the model's own adapters: what an embedding pools.
    /// Unlike [`Llama::hidden_with`] it is not refused under a logit soft-cap,
    /// since the cap acts on logits and no logits are made here.
    pub fn hidden(&self, batch: &mut [SeqBatch<'_>]) -> Result<Tensor> {
        let adapters = self.adapters();
        let layout = plan(&self.config, batch)?;
        let x = self.trunk(batch, &layout, adapters.as_deref())?;
        self.norm(&x, &self.output_norm)
    }

    /// RMSNorm: candle's fused kernel when serving, the differentiable form when
    /// learning.
    fn norm(&self, x: &Tensor, w: &Tensor) -> Result<Tensor> {
        let eps = self.config.rms_eps;
        Ok(match self.precision {
            // A learner's activation: the same rounding, with a gradient.
            Precision::Quantized if x.track_op() => {
                x.contiguous()?.apply_op1(crate::grad::RmsNorm {
                    w: w.to_vec1()?,
                    eps,
                })?
            }
            Precision::Quantized => {
                let xs: Vec<f32> = x.flatten_all()?.to_vec1()?;
                let ws: Vec<f32> = w.to_vec1()?;
                Tensor::from_vec(crate::exact::rms_norm(&xs, &ws, eps), x.shape(), x.device())?
            }
            Precision::DenseF32 => candle_nn::ops::rms_norm_slow(x, w, eps)?,
        })
    }

    /// A projection plus its adapter, if the set has one.
    fn project(
        &self,
        b: &Block,
        layer: usize,
        target: LoraTarget,
        x: &Tensor,
        adapters: Option<&LoraSet>,
    ) -> Result<Tensor> {
        let y = b.weight(target).forward(x)?;
        match adapters.and_then(|s| s.get(layer, target)) {
            Some(ad) => Ok((y + ad.delta(x)?)?),
            None => Ok(y),
        }
    }

    /// Embedding and every block: the residual stream `[T, D]`.
    fn trunk(
        &self,
        batch: &mut [SeqBatch<'_>],
        layout: &BatchLayout,
        adapters: Option<&LoraSet>,
    ) -> Result<Tensor> {
        let (mut x, rows) = self.embed(batch, layout)?;
        for layer in 0..self.blocks.len() {
            x = self.layer(layer, &x, &rows, batch, layout, adapters)?;
        }
        Ok(x)
    }

    /// Starts a forward pass block by block (a learner that recomputes each
    /// block in its backward pass): the embeddings `[T, D]` and what every
    /// block of this batch reads.
    pub fn trunk_start(&self, batch: &mut [SeqBatch<'_>]) -> Result<(Tensor, Trunk)> {
        let layout = plan(&self.config, batch)?;
        let (x, rows) = self.embed(batch, &layout)?;
        Ok((x, Trunk { layout, rows }))
    }

    /// Block `layer` of a pass [`Llama::trunk_start`] began, on the residual
    /// stream `x` `[T, D]`; the caches see the layer's keys as a whole pass would.
    pub fn trunk_layer(
        &self,
        layer: usize,
        x: &Tensor,
        trunk: &Trunk,
        batch: &mut [SeqBatch<'_>],
        adapters: Option<&LoraSet>,
    ) -> Result<Tensor> {
        self.layer(layer, x, &trunk.rows, batch, &trunk.layout, adapters)
    }

    /// The output norm of the residual stream: the hidden states the output
    /// projection reads.
    pub fn final_norm(&self, x: &Tensor) -> Result<Tensor> {
        self.norm(x, &self.output_norm)
    }

    /// One block with the RoPE angles of its kind (global or sliding).
    fn layer(
        &self,
        layer: usize,
        x: &Tensor,
        rows: &TrunkRows,
        batch: &mut [SeqBatch<'_>],
        layout: &BatchLayout,
        adapters: Option<&LoraSet>,
    ) -> Result<Tensor> {
        let rope = match (&rows.local, self.sliding_window(layer)) {
            (Some(local), Some(_)) => local,
            _ => &rows.global,
        };
        self.block_forward(layer, &self.blocks[layer], x, rope, batch, layout, adapters)
    }

    /// The token embeddings of the batch and its RoPE angles.
    fn embed(&self, batch: &[SeqBatch<'_>], layout: &BatchLayout) -> Result<(Tensor, TrunkRows)> {
        let ids: Vec<u32> = batch
            .iter()
            .flat_map(|s| s.tokens.iter().copied())
            .collect();
        let n_tokens = ids.len();
        let positions = Tensor::from_vec(layout.positions.clone(), n_tokens, &Device::Cpu)?;
        let global = self.rope_rows(&self.rope_cos, &self.rope_sin, &positions)?;
        let local = match &self.rope_local {
            Some((cos, sin)) => Some(self.rope_rows(cos, sin, &positions)?),
            None => None,
        };

        let mut x = self.embedding.rows(&ids)?; // [T, D]
        if self.features.embed_scale {
            // After the lookup, in f32, as llama.cpp scales the rows.
            let s = (self.config.n_embd as f32).sqrt();
            let xs: Vec<f32> = x.flatten_all()?.to_vec1()?;
            let scaled: Vec<f32> = xs.iter().map(|&v| v * s).collect();
            x = Tensor::from_vec(scaled, x.shape(), x.device())?;
        }
        Ok((x, TrunkRows { global, local }))
    }

    /// The angles of the batch's positions from one pair of RoPE tables.
    fn rope_rows(&self, cos: &Tensor, sin: &Tensor, positions: &Tensor) -> Result<RopeRows> {
        let cos = cos.index_select(positions, 0)?; // [T, hd/2]
        let sin = sin.index_select(positions, 0)?;
        // Serving rotates with plain loops (see `exact`): the rows' angles
        // read out once for every layer.
        let angles = match self.precision {
            Precision::Quantized => Some((
                Arc::new(cos.flatten_all()?.to_vec1::<f32>()?),
                Arc::new(sin.flatten_all()?.to_vec1::<f32>()?),
            )),
            Precision::DenseF32 => None,
        };
        Ok(RopeRows { cos, sin, angles })
    }

    #[allow(clippy::too_many_arguments)]
    fn block_forward(
        &self,
        layer: usize,
        b: &Block,
        x: &Tensor,
        rows: &RopeRows,
        batch: &mut [SeqBatch<'_>],
        layout: &BatchLayout,
        adapters: Option<&LoraSet>,
    ) -> Result<Tensor> {
        let c = &self.config;
        let (cos, sin) = (&rows.cos, &rows.sin);
        let n_tokens = x.dim(0)?;
        let dense = self.precision == Precision::DenseF32;
        let proj = |t: LoraTarget, x: &Tensor| self.project(b, layer, t, x, adapters);
        // 1. Attention projections over the whole batch.
        let h = self.norm(x, &b.attn_norm)?; // [T, D]
        let mut q = proj(LoraTarget::Q, &h)?; // [T, H*hd]
        let mut k = proj(LoraTarget::K, &h)?; // [T, KV*hd]
        let mut v = proj(LoraTarget::V, &h)?; // [T, KV*hd]
        if let Some([bq, bk, bv]) = &b.qkv_bias {
            // After the projection and its adapter, as llama.cpp adds them.
            q = q.broadcast_add(bq)?;
            k = k.broadcast_add(bk)?;
            v = v.broadcast_add(bv)?;
        }
        if let Some([nq, nk]) = &b.qk_norm {
            // Each head's vector normed on its own, before RoPE.
            let per_head = |t: &Tensor, heads: usize, w: &Tensor| -> Result<Tensor> {
                let normed = self.norm(&t.reshape((n_tokens, heads, c.head_dim))?, w)?;
                Ok(normed.reshape((n_tokens, heads * c.head_dim))?)
            };
            q = per_head(&q, c.n_head, nq)?;
            k = per_head(&k, c.n_kv_head, nk)?;
        }
        // 2. RoPE at each token's own position, in the architecture's pairing.
        let neox = self.features.rope == RopeStyle::Neox;
        let to_heads = |t: Tensor, heads: usize| -> Result<Tensor> {
            Ok(t.reshape((1, n_tokens, heads, c.head_dim))?
                .transpose(1, 2)?
                .contiguous()?)
        };
        // The learner's differentiable rotation (serving takes `exact`'s).
        let rope = |t: &Tensor| -> Result<Tensor> {
            Ok(if neox {
                candle_nn::rotary_emb::rope_slow(t, cos, sin)?
            } else {
                candle_nn::rotary_emb::rope_i_slow(t, cos, sin)?
            })
        };
        let (q, k) = match &rows.angles {
            None => (
                rope(&to_heads(q, c.n_head)?)?,    // [1, H, T, hd]
                rope(&to_heads(k, c.n_kv_head)?)?, // [1, KV, T, hd]
            ),
            // Serving: llama.cpp's rounding (see `exact`).
            Some((cos, sin)) => {
                let turn = |t: Tensor, heads: usize| -> Result<Tensor> {
                    let op = crate::grad::Rope {
                        cos: cos.clone(),
                        sin: sin.clone(),
                        head_dim: c.head_dim,
                        neox,
                    };
                    to_heads(t.contiguous()?.apply_op1(op)?, heads)
                };
                (turn(q, c.n_head)?, turn(k, c.n_kv_head)?)
            }
        };
        // Gemma and Phi-3 scale the rotated queries themselves, in f32.
        let q = match self.query_scale {
            Some(s) if dense => (q * s as f64)?,
            Some(s) => q.contiguous()?.apply_op1(crate::grad::Scale(s))?,
            None => q,
        };
        let v = to_heads(v, c.n_kv_head)?; // [1, KV, T, hd]
                                           // 3. Attention per sequence, against its own cache.
        let one = |seq: &mut SeqBatch<'_>, off: usize| -> Result<Tensor> {
            let n = seq.tokens.len();
            let qs = q.narrow(2, off, n)?.squeeze(0)?; // [H, n, hd]
            let ks = k.narrow(2, off, n)?.squeeze(0)?.contiguous()?; // [KV, n, hd]
            let vs = v.narrow(2, off, n)?.squeeze(0)?.contiguous()?;
            let q_pos = &layout.positions[off..off + n];
            // Keys and values at f16 precision, as llama.cpp's f16 KV cache
            // holds them: our correctness reference, token for token. The
            // learner stays in f32.
            let (ks, vs) = if dense || seq.cache.dtype().is_quantized() {
                // A quantized cache takes the f32 values, as llama.cpp's
                // quantizes them.
                (ks, vs)
            } else if ks.track_op() || vs.track_op() {
                // The learner: the gradient stays f32.
                (
                    ks.apply_op1(crate::grad::RoundF16)?,
                    vs.apply_op1(crate::grad::RoundF16)?,
                )
            } else {
                (round_f16(&ks)?, round_f16(&vs)?)
            };
            self.attention(layer, &qs, &ks, &vs, q_pos, &mut *seq.cache)
        };
        // A learner's caches share a prompt's pass layer by layer: in order.
        let ordered = batch
            .iter()
            .any(|s| s.cache.sampled_kernels(s.tokens.len()).is_some());
        let outs: Vec<Tensor> = if dense || ordered || batch.len() < 2 {
            batch
                .iter_mut()
                .zip(&layout.offsets)
                .map(|(seq, &off)| one(seq, off))
                .collect::<Result<_>>()?
        } else {
            // Serving several sequences (a batched decode step): they are
            // independent, so the pool takes them one sequence per work item and
            // each sequence's attention runs whole on one thread, its numbers
            // the same as alone. (The learner's caches share a prompt's pass
            // layer by layer, so it stays in order.)
            let slots: Vec<Mutex<SeqSlot<'_, '_>>> = batch
                .iter_mut()
                .zip(&layout.offsets)
                .map(|(seq, &off)| Mutex::new((seq, off, None)))
                .collect();
            let next = AtomicUsize::new(0);
            Pool::global().run(&|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(slot) = slots.get(i) else { break };
                let mut slot = slot.lock().unwrap_or_else(|p| p.into_inner());
                let (seq, off, out) = &mut *slot;
                *out = Some(one(seq, *off));
            });
            slots
                .into_iter()
                .map(|m| {
                    let (_, _, out) = m.into_inner().unwrap_or_else(|p| p.into_inner());
                    out.unwrap_or_else(|| {
                        Err(candle_core::Error::Msg("attention not run".into()).into())
                    })
                })
                .collect::<Result<_>>()?
        };
        let attn = Tensor::cat(&outs, 0)?; // [T, D]
        let mut attn = proj(LoraTarget::O, &attn)?;
        if let Some([post, _]) = &b.post_norms {
            attn = self.norm(&attn, post)?;
        }
        let x = (x + attn)?;
        // 4. Gated MLP (SwiGLU or GeGLU).
        let h = self.norm(&x, &b.ffn_norm)?;
        let gelu = self.features.mlp == Mlp::GeluTanh;
        let adapted = adapters.is_some_and(|s| {
            s.get(layer, LoraTarget::Gate).is_some() || s.get(layer, LoraTarget::Up).is_some()
        });
        // Serving without adapters on the pair: one fused pass where the
        // kernels take it (same bits as the three steps below).
        let fused = match dense || adapted {
            true => None,
            false => Weight::glu(&b.w_gate, &b.w_up, &h, gelu)?,
        };
        let sw = match fused {
            Some(sw) => sw,
            None => self.glu_apart(layer, b, &h, adapters)?,
        };
        let mut ff = proj(LoraTarget::Down, &sw)?; // [T, D]
        if let Some([_, post]) = &b.post_norms {
            ff = self.norm(&ff, post)?;
        }
        Ok((x + ff)?)
    }

    /// The gated unit as three steps: gate and up projections (each with
    /// its adapter), then the activation product.
    fn glu_apart(
        &self,
        layer: usize,
        b: &Block,
        h: &Tensor,
        adapters: Option<&LoraSet>,
    ) -> Result<Tensor> {
        let dense = self.precision == Precision::DenseF32;
        let gate = self.project(b, layer, LoraTarget::Gate, h, adapters)?; // [T, F]
        let up = self.project(b, layer, LoraTarget::Up, h, adapters)?;
        Ok(match (dense, self.features.mlp) {
            (true, Mlp::Silu) => (candle_nn::ops::silu(&gate)? * up)?,
            (true, Mlp::GeluTanh) => (gate.gelu()? * up)?,
            // Serving and the learner alike: llama.cpp's rounding, on the
            // tensors' own storage (no copies of a prefill's megabytes).
            (false, mlp) => gate.contiguous()?.apply_op2(
                &up.contiguous()?,
                crate::grad::Glu {
                    gelu: mlp == Mlp::GeluTanh,
                },
            )?,
        })
    }

    /// Scaled dot-product attention of one sequence's new queries over its cache.
    /// `q`: `[H, n, hd]`; `k`, `v`: `[KV, n, hd]`. Returns `[n, H*hd]`.
    ///
    /// A quantized cache stores keys and values rotated (see
    /// [`KvDtype::rotation`]): the queries turn with the keys, and the output
    /// turns back, as llama.cpp's graph does.
    fn attention(
        &self,
        layer: usize,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        q_pos: &[u32],
        cache: &mut dyn KvStore,
    ) -> Result<Tensor> {
        if cache.wants_queries(layer) {
            // In the model's frame, before any rotation for the cache.
            let scale = self.score_scale() as f64;
            let rotary = self.rotary(layer);
            let logit_q = (q.detach() * scale)?;
            cache.observe_queries(layer, &logit_q, q_pos, rotary)?;
        }
        let rotation = match self.precision {
            Precision::Quantized => cache.dtype().rotation(self.config.head_dim),
            Precision::DenseF32 => None,
        };
        let Some(rot) = rotation else {
            return self.attend_cache(layer, q, k, v, q_pos, cache);
        };
        let turn = |t: &Tensor, block: usize| -> Result<Tensor> {
            let mut x: Vec<f32> = t.flatten_all()?.to_vec1()?;
            hadamard(&mut x, block);
            Ok(Tensor::from_vec(x, t.shape(), t.device())?)
        };
        let (q, k, v) = (turn(q, rot.k)?, turn(k, rot.k)?, turn(v, rot.v)?);
        let out = self.attend_cache(layer, &q, &k, &v, q_pos, cache)?;
        turn(&out, rot.v)
    }

    /// What a query-key dot product is multiplied by to give a logit: 1 where
    /// the queries arrive scaled (Gemma's query scale), else `1/sqrt(head_dim)`.
    fn score_scale(&self) -> f32 {
        match self.query_scale {
            Some(_) => 1.0,
            None => (1.0 / (self.config.head_dim as f64).sqrt()) as f32,
        }
    }

    /// [`Self::attention`] in the frame the cache stores: appends the new
    /// keys and values, attends, then lets the cache evict.
    ///
    /// Under [`crate::quant::alone::scope`] (a speculative draft verified in
    /// one forward) several rows are attended one by one, each over the
    /// entries up to its own, on the path plain decoding takes for one token
    /// over that many entries (llama.cpp's per-key kernel below
    /// [`FAST_DECODE_MIN`], the vectorized decode from there): the draft's
    /// rows get plain decoding's bits, weights a policy observes included.
    fn attend_cache(
        &self,
        layer: usize,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        q_pos: &[u32],
        cache: &mut dyn KvStore,
    ) -> Result<Tensor> {
        let n = q_pos.len();
        let (kc, vc) = cache.append(layer, k, v, q_pos)?; // [KV, C, hd]
        let serving = self.precision == Precision::Quantized;
        let one_by_one = n > 1
            && serving
            && crate::quant::alone::active()
            && cache.visibility().is_none()
            && cache.sampled_kernels(n).is_none();
        let out = if one_by_one {
            let n_cached = kc.dim(1)?;
            let mut rows = Vec::with_capacity(n);
            for j in 0..n {
                let len = n_cached - (n - 1 - j);
                let gap = cache.draft_gap(layer, q_pos[j]);
                rows.push(self.attend_views(
                    layer,
                    &q.narrow(1, j, 1)?,
                    kc.narrow(1, 0, len)?,
                    vc.narrow(1, 0, len)?,
                    &q_pos[j..j + 1],
                    gap,
                    cache,
                )?);
            }
            Tensor::cat(&rows, 0)?
        } else {
            self.attend_views(layer, q, kc, vc, q_pos, None, cache)?
        };
        cache.after_attention(layer)?;
        Ok(out)
    }

    /// The attention of queries `q` at `q_pos` over the cache's first
    /// `kc.dim(1)` entries (`kc`, `vc`: views `append` returned, or their
    /// leading part) less the run `gap` (a draft's row: entries plain
    /// decoding evicted before it, [`KvStore::draft_gap`]), the weights
    /// handed to the cache when it scores.
    #[allow(clippy::too_many_arguments)]
    fn attend_views(
        &self,
        layer: usize,
        q: &Tensor,
        kc: Tensor,
        vc: Tensor,
        q_pos: &[u32],
        gap: Option<std::ops::Range<usize>>,
        cache: &mut dyn KvStore,
    ) -> Result<Tensor> {
        let c = &self.config;
        let (g, n) = (c.group_size(), q_pos.len());
        let scale = self.score_scale();
        let window = self.sliding_window(layer).map(|w| w as u32);
        let stored = kc.dim(1)?;
        let gap = gap.filter(|r| r.start < r.end && r.end <= stored);
        // Entries the queries see: without the gap, laid out as plain
        // decoding holds them after its evictions.
        let n_cached = stored - gap.as_ref().map_or(0, |r| r.len());
        let k_pos_of = |view: &dyn KvStore, h: usize| -> Vec<u32> {
            let all = &view.positions(layer, h)[..stored];
            match &gap {
                Some(r) => all[..r.start]
                    .iter()
                    .chain(&all[r.end..])
                    .copied()
                    .collect(),
                None => all.to_vec(),
            }
        };
        let dtype = cache.dtype();
        // Serving reads the cache in place; the learner keeps the tensor path
        // (autograd).
        let serving = self.precision == Precision::Quantized;
        let replayed = cache.visibility().is_some();
        // A sequence scored again: each row on the kernel the sampler ran
        // for it, with gradients when the learner asks.
        if let Some(segments) = cache.sampled_kernels(n).filter(|_| serving) {
            let op = {
                let view: &dyn KvStore = &*cache;
                crate::grad::Attention {
                    q_pos: q_pos.to_vec(),
                    k_pos: (0..c.n_kv_head)
                        .map(|h| view.positions(layer, h).to_vec())
                        .collect(),
                    replay: view.visibility().map(|v| (Arc::new(v.clone()), layer)),
                    window,
                    scale,
                    segments,
                }
            };
            let out = q.contiguous()?.apply_op3(&kc, &vc, op)?;
            drop((kc, vc));
            return Ok(out);
        }
        // llama.cpp's numerics (see `flash`), except one new token over a long
        // cache, where llama.cpp's own result depends on its thread count and
        // speed matters most: there the vectorized decode below.
        // Padding slots (a head-wise policy) need the mask even for one token;
        // a quantized cache always: llama.cpp reads one with its per-row kernel.
        let hidden = cache.hides_entries(layer);
        if serving
            && (n > 1
                || n_cached < FAST_DECODE_MIN
                || replayed
                || window.is_some()
                || hidden
                || dtype.is_quantized())
        {
            let want = cache
                .wants_attention(layer)
                .then(|| cache.attention_rows(layer));
            let exact = {
                let view: &dyn KvStore = &*cache;
                let owned: Vec<Vec<u32>> = (0..c.n_kv_head).map(|h| k_pos_of(view, h)).collect();
                let k_pos: Vec<&[u32]> = owned.iter().map(Vec::as_slice).collect();
                let replay = view.visibility().map(|v| (v, layer));
                crate::flash::attend_tensors_windowed(
                    q,
                    q_pos,
                    &kc,
                    &vc,
                    dtype,
                    &k_pos,
                    replay,
                    window,
                    scale,
                    want,
                    gap.clone(),
                )?
            };
            if let Some((out, seen)) = exact {
                drop((kc, vc));
                if let Some(seen) = seen {
                    let shape = (c.n_kv_head, g, seen.rows, n_cached);
                    let w = Tensor::from_vec(seen.weights, shape, q.device())?;
                    cache.observe_attention(layer, &w, seen.column_means.as_deref())?;
                }
                return Ok(Tensor::from_vec(
                    out,
                    (n, c.n_head * c.head_dim),
                    q.device(),
                )?);
            }
        }
        // Queries at f16 precision, as llama.cpp's f16 products take them.
        let q = match self.precision {
            Precision::Quantized => round_f16(q)?,
            Precision::DenseF32 => q.clone(),
        };
        let q = &q;
        if n == 1 && serving && !replayed && window.is_none() && !hidden {
            let want = cache.wants_attention(layer);
            if let Some((out, weights)) =
                crate::attention::decode_tensors(q, &kc, &vc, dtype, g, scale, want, gap.clone())?
            {
                drop((kc, vc));
                if let Some(w) = weights {
                    let w = Tensor::from_vec(w, (c.n_kv_head, g, 1, n_cached), q.device())?;
                    cache.observe_attention(layer, &w, None)?;
                }
                return Ok(Tensor::from_vec(
                    out,
                    (1, c.n_head * c.head_dim),
                    q.device(),
                )?);
            }
        }
        if gap.is_some() {
            return Err(crate::error::ModelError::BadTensor {
                name: "kv cache".into(),
                reason: "a draft's row skipping evicted entries needs the in-place attention \
                         kernels (CPU cache tensors)"
                    .into(),
            });
        }
        // The tensor path works on f32 keys and values.
        let (kc, vc) = match dtype {
            KvDtype::F32 => (kc, vc),
            other => (
                other.decode(&kc, c.head_dim)?,
                other.decode(&vc, c.head_dim)?,
            ),
        };
        // Query heads of one group attend to the same KV head: fold them into rows.
        let q = q.contiguous()?.reshape((c.n_kv_head, g * n, c.head_dim))?;
        let mut scores = (q.matmul(&kc.t()?)? * scale as f64)?; // [KV, G*n, C]

        // One new token sees every cached entry, unless a replayed eviction
        // record, a window or padding slots hide some of them.
        if n > 1 || cache.visibility().is_some() || window.is_some() || hidden {
            let mask = causal_mask(q_pos, cache, layer, c.n_kv_head, n_cached, window)?; // [KV, 1, n, C]
            scores = scores
                .reshape((c.n_kv_head, g, n, n_cached))?
                .broadcast_add(&mask)?
                .reshape((c.n_kv_head, g * n, n_cached))?;
        }
        let weights = match self.precision {
            Precision::Quantized => candle_nn::ops::softmax_last_dim(&scores)?,
            Precision::DenseF32 => candle_nn::ops::softmax(&scores, D::Minus1)?,
        };
        if cache.wants_attention(layer) {
            let w = weights.reshape((c.n_kv_head, g, n, n_cached))?;
            cache.observe_attention(layer, &w, None)?;
        }
        // llama.cpp multiplies the f16 V cache by f16-converted weights.
        let weights = match self.precision {
            Precision::Quantized => round_f16(&weights)?,
            Precision::DenseF32 => weights,
        };
        let out = weights.matmul(&vc)?; // [KV, G*n, hd]
        Ok(out
            .reshape((c.n_head, n, c.head_dim))?
            .transpose(0, 1)?
            .reshape((n, c.n_head * c.head_dim))?)
    }

    /// Final norm and output projection, only on the rows the sequences asked for.
    fn logits(
        &self,
        x: &Tensor,
        batch: &[SeqBatch<'_>],
        layout: &BatchLayout,
    ) -> Result<Vec<Option<Tensor>>> {
        let mut rows: Vec<u32> = Vec::new();
        let mut spans = Vec::with_capacity(batch.len());
        for (seq, &off) in batch.iter().zip(&layout.offsets) {
            let n = seq.tokens.len();
            let (first, count) = match seq.logits {
                LogitsWanted::None => (off, 0),
                LogitsWanted::Last => (off + n - 1, 1.min(n)),
                LogitsWanted::All => (off, n),
            };
            spans.push((rows.len(), count));
            rows.extend((first..first + count).map(|r| r as u32));
        }
        if rows.is_empty() {
            return Ok(vec![None; batch.len()]);
        }
        let n_rows = rows.len();
        let idx = Tensor::from_vec(rows, n_rows, &Device::Cpu)?;
        let h = x.index_select(&idx, 0)?;
        let h = self.norm(&h, &self.output_norm)?;
        let logits = self
            .output
            .as_ref()
            .unwrap_or(&self.embedding)
            .forward(&h)?
            .to_dtype(DType::F32)?; // [R, vocab]
        let logits = match self.logit_softcap {
            // llama.cpp: scale by 1/cap, tanh, scale by cap, each in f32.
            Some(cap) => {
                let xs: Vec<f32> = logits.flatten_all()?.to_vec1()?;
                let inv = 1.0 / cap;
                let capped: Vec<f32> = xs.iter().map(|&v| (v * inv).tanh() * cap).collect();
                Tensor::from_vec(capped, logits.shape(), logits.device())?
            }
            None => logits,
        };
        spans
            .into_iter()
            .map(|(start, count)| {
                Ok((count > 0)
                    .then(|| logits.narrow(0, start, count))
                    .transpose()?)
            })
            .collect()
    }
}

/// `1/sqrt(hd)` as llama.cpp's phi3 graph computes it, in f32.
fn query_scale(head_dim: usize) -> f32 {
    1.0 / (head_dim as f32).sqrt()
}

/// What every block of one batch reads besides the residual stream: where
/// each sequence sits and the RoPE angles ([`Llama::trunk_start`]).
pub struct Trunk {
    layout: BatchLayout,
    rows: TrunkRows,
}

/// The batch's RoPE angles for global and (if any) sliding-window layers.
struct TrunkRows {
    global: RopeRows,
    local: Option<RopeRows>,
}

/// One table's angles for a batch's rows, shared with the learner's ops.
type Angles = Arc<Vec<f32>>;

/// One batch's RoPE angles from one pair of tables.
struct RopeRows {
    /// `[T, hd/2]` f32.
    cos: Tensor,
    /// `[T, hd/2]` f32.
    sin: Tensor,
    /// The same, read out for serving's loops.
    angles: Option<(Angles, Angles)>,
}

/// Cached positions from which one new token's attention takes the
/// vectorized decode rather than llama.cpp's exact per-key kernel (llama.cpp
/// itself splits the cache across its threads from here).
const FAST_DECODE_MIN: usize = 512;

/// Parameters of a llama-family model of `cfg`'s shape: per block the four
/// attention projections, the three MLP projections and two norms (and the
/// QKV biases where the architecture has them); the embedding (tied output)
/// and the output norm.
pub fn parameter_count(cfg: &ModelConfig) -> u64 {
    let (d, f, kvd, l) = (
        cfg.n_embd as u64,
        cfg.n_ff as u64,
        (cfg.n_kv_head * cfg.head_dim) as u64,
        cfg.n_layer as u64,
    );
    let qd = cfg.q_dim() as u64;
    let extra = match cfg.architecture.as_str() {
        "qwen2" => qd + 2 * kvd,                     // QKV biases
        "qwen3" => 2 * cfg.head_dim as u64,          // per-head Q and K norms
        "gemma3" => 2 * cfg.head_dim as u64 + 2 * d, // QK norms, post-norms
        _ => 0,
    };
    let per_layer = 2 * qd * d + 2 * kvd * d + 3 * d * f + extra;
    l * per_layer + cfg.vocab_size as u64 * d + (2 * l + 1) * d
}
