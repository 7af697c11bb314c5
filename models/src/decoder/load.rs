//! Loading: a GGUF's tensors into the decoder's layers, each checked against
//! the shape the configuration implies, held as the caller's [`Precision`]
//! (quantized for serving, dequantized f32 for the learner), fused storage
//! split by rows ([`super::fused`]).

use std::sync::{Arc, RwLock};

use candle_core::quantized::QTensor;
use candle_core::{Device, Tensor};

use super::block::Block;
use super::features::Features;
use super::fused::split_rows;
use super::rotation::RopeTables;
use super::Decoder;
use crate::config::ModelConfig;
use crate::error::{ModelError, Result};
use crate::gguf::GgufFile;
use crate::quant::QLinear;
use crate::weight::{Precision, Weight};

impl Decoder {
    /// Loads the decoder of `file` (already opened and validated) with
    /// `features` (its architecture's file says which), its projections held
    /// as `precision`.
    pub fn load_with(file: &GgufFile, precision: Precision, features: Features) -> Result<Self> {
        let config = ModelConfig::from_gguf(file)?;
        let load = Loader {
            file,
            precision,
            config: &config,
        };
        let (d, vocab) = (config.n_embd, config.vocab_size);
        let embedding = load.matrix("token_embd.weight", &[vocab, d])?;
        let output = if file.has_tensor("output.weight") {
            Some(load.matrix("output.weight", &[vocab, d])?)
        } else {
            None
        };
        let blocks = (0..config.n_layer)
            .map(|i| load.block(i, &features))
            .collect::<Result<Vec<_>>>()?;
        let rope = RopeTables::load(file, &config, &features)?;
        let query_scale = features.scale_query.then(|| query_scale(config.head_dim));
        Ok(Self {
            output_norm: load.vector("output_norm.weight")?,
            config,
            embedding,
            blocks,
            output,
            precision,
            adapters: RwLock::new(None),
            features,
            rope,
            query_scale,
            logit_softcap: None,
        })
    }
}

/// `1/sqrt(hd)` as llama.cpp's phi3 graph computes it, in f32.
fn query_scale(head_dim: usize) -> f32 {
    1.0 / (head_dim as f32).sqrt()
}

/// Reads one file's tensors in the shapes its configuration implies.
struct Loader<'a> {
    file: &'a GgufFile,
    precision: Precision,
    config: &'a ModelConfig,
}

impl Loader<'_> {
    /// Block `i`'s norms, projections and (as `features` call for) biases,
    /// per-head norms and post-norms.
    fn block(&self, i: usize, features: &Features) -> Result<Block> {
        let c = self.config;
        let (d, qd, kvd) = (c.n_embd, c.q_dim(), c.n_kv_head * c.head_dim);
        let p = |s: &str| format!("blk.{i}.{s}.weight");
        let bias = |s: &str, n: usize| -> Result<Tensor> {
            let t = self
                .file
                .tensor_shaped(&format!("blk.{i}.{s}.bias"), &[n])?;
            Ok(t.dequantize(&Device::Cpu)?)
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
            let t = self.file.tensor_shaped(&p(s), &[c.head_dim])?;
            Ok(t.dequantize(&Device::Cpu)?)
        };
        let qk_norm = if features.qk_norm {
            Some([head_norm("attn_q_norm")?, head_norm("attn_k_norm")?])
        } else {
            None
        };
        let [wq, wk, wv] = self.qkv(i, features.fused_projections)?;
        let [w_gate, w_up] = self.gate_up(i, features.fused_projections)?;
        let post_norms = if features.post_norms {
            Some([
                self.vector(&p("post_attention_norm"))?,
                self.vector(&p("post_ffw_norm"))?,
            ])
        } else {
            None
        };
        Ok(Block {
            attn_norm: self.vector(&p("attn_norm"))?,
            post_norms,
            qkv_bias,
            qk_norm,
            wq,
            wk,
            wv,
            wo: self.matrix(&p("attn_output"), &[d, qd])?,
            ffn_norm: self.vector(&p("ffn_norm"))?,
            w_gate,
            w_up,
            w_down: self.matrix(&p("ffn_down"), &[d, c.n_ff])?,
        })
    }

    /// Block `i`'s Q, K and V projections: rows of one `attn_qkv` when the
    /// storage is `fused` and the file has it, else three tensors.
    fn qkv(&self, i: usize, fused: bool) -> Result<[Weight; 3]> {
        let c = self.config;
        let (d, qd, kvd) = (c.n_embd, c.q_dim(), c.n_kv_head * c.head_dim);
        let p = |s: &str| format!("blk.{i}.{s}.weight");
        let name = p("attn_qkv");
        if !(fused && self.file.has_tensor(&name)) {
            return Ok([
                self.matrix(&p("attn_q"), &[qd, d])?,
                self.matrix(&p("attn_k"), &[kvd, d])?,
                self.matrix(&p("attn_v"), &[kvd, d])?,
            ]);
        }
        let [q, k, v]: [QTensor; 3] = split_rows(self.file, &name, &[qd, kvd, kvd], d)?
            .try_into()
            .map_err(|_| ModelError::BadTensor {
                name: name.clone(),
                reason: "not three parts".into(),
            })?;
        Ok([
            self.weight(&name, q)?,
            self.weight(&name, k)?,
            self.weight(&name, v)?,
        ])
    }

    /// Block `i`'s gate and up projections: the halves of one `ffn_up`
    /// (gate first) when the storage is `fused`, else two tensors.
    fn gate_up(&self, i: usize, fused: bool) -> Result<[Weight; 2]> {
        let (d, ff) = (self.config.n_embd, self.config.n_ff);
        let p = |s: &str| format!("blk.{i}.{s}.weight");
        if !fused {
            return Ok([
                self.matrix(&p("ffn_gate"), &[ff, d])?,
                self.matrix(&p("ffn_up"), &[ff, d])?,
            ]);
        }
        let name = p("ffn_up");
        let [g, u]: [QTensor; 2] = split_rows(self.file, &name, &[ff, ff], d)?
            .try_into()
            .map_err(|_| ModelError::BadTensor {
                name: name.clone(),
                reason: "not two parts".into(),
            })?;
        Ok([self.weight(&name, g)?, self.weight(&name, u)?])
    }

    /// A projection matrix `name` of shape `dims`, in whichever storage the
    /// file has it (candle's quantized types or Tern's own).
    fn matrix(&self, name: &str, dims: &[usize]) -> Result<Weight> {
        match self.file.own_tensor(name) {
            Some(t) => own_weight(self.file, name, t, dims, self.precision),
            None => self.weight(name, self.file.tensor_shaped(name, dims)?),
        }
    }

    /// A norm weight `name` of shape `[D]`, f32.
    fn vector(&self, name: &str) -> Result<Tensor> {
        let t = self.file.tensor_shaped(name, &[self.config.n_embd])?;
        Ok(t.dequantize(&Device::Cpu)?)
    }

    /// The quantized tensor `t` (read as `name`) held as the precision asked.
    fn weight(&self, name: &str, t: QTensor) -> Result<Weight> {
        Ok(match self.precision {
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
    }
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
