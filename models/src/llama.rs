//! The llama architecture (Touvron et al. 2023, "LLaMA"): a pre-norm decoder with
//! grouped-query attention, rotary position embeddings, RMSNorm and a SwiGLU MLP,
//! over GGUF weights held as candle quantized tensors.
//!
//! The forward pass takes a *ragged batch*: the new tokens of several sequences
//! concatenated, each with its own start position and its own KV cache. Dense
//! projections run once over all tokens; attention runs per sequence against that
//! sequence's cache. The cache is reached only through [`KvStore`], so the runtime
//! can evict, fork and account for it without the model knowing.
//!
//! Shapes below: `T` = tokens in the batch, `D` = hidden size, `H` = query heads,
//! `KV` = key/value heads, `G = H / KV`, `hd` = head dim, `C` = cached positions.

use candle_core::quantized::QTensor;
use candle_core::{DType, Device, Tensor};

use crate::config::ModelConfig;
use crate::error::{ModelError, Result};
use crate::gguf::GgufFile;
use crate::kv::KvStore;
use crate::quant::QLinear;

/// Which logits a sequence in a batch needs back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogitsWanted {
    /// None (a prefill chunk that is not the prompt's last).
    None,
    /// Only the last new token's (generation).
    Last,
    /// Every new token's (perplexity, teacher forcing).
    All,
}

/// One sequence's slice of a ragged batch.
pub struct SeqBatch<'a> {
    /// New token ids of this sequence.
    pub tokens: &'a [u32],
    /// Position of `tokens[0]` in the sequence (the count of tokens before it).
    pub start_pos: usize,
    /// This sequence's cache.
    pub cache: &'a mut dyn KvStore,
    /// Which logits to return for it.
    pub logits: LogitsWanted,
}

struct Block {
    attn_norm: Tensor,
    wq: QLinear,
    wk: QLinear,
    wv: QLinear,
    wo: QLinear,
    ffn_norm: Tensor,
    w_gate: QLinear,
    w_up: QLinear,
    w_down: QLinear,
}

/// A loaded llama model: weights plus RoPE tables. Immutable and shareable.
pub struct Llama {
    config: ModelConfig,
    /// Token embedding `[vocab, D]`; also the output projection when tied.
    embedding: QLinear,
    blocks: Vec<Block>,
    output_norm: Tensor,
    /// A separate output projection, when the model has one.
    output: Option<QLinear>,
    /// `[context_length, hd/2]` f32.
    rope_cos: Tensor,
    /// `[context_length, hd/2]` f32.
    rope_sin: Tensor,
}

impl Llama {
    /// Loads the weights of `file` (already opened and validated).
    pub fn load(file: &GgufFile) -> Result<Self> {
        let config = ModelConfig::from_gguf(file)?;
        let (d, kvd) = (config.n_embd, config.n_kv_head * config.head_dim);
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
        let mm = |name: &str, dims: &[usize]| -> Result<QLinear> {
            Ok(QLinear::from_qtensor(qt(name, dims)?)?)
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
            blocks.push(Block {
                attn_norm: vec(&p("attn_norm"))?,
                wq: mm(&p("attn_q"), &[d, d])?,
                wk: mm(&p("attn_k"), &[kvd, d])?,
                wv: mm(&p("attn_v"), &[kvd, d])?,
                wo: mm(&p("attn_output"), &[d, d])?,
                ffn_norm: vec(&p("ffn_norm"))?,
                w_gate: mm(&p("ffn_gate"), &[config.n_ff, d])?,
                w_up: mm(&p("ffn_up"), &[config.n_ff, d])?,
                w_down: mm(&p("ffn_down"), &[d, config.n_ff])?,
            });
        }
        let (rope_cos, rope_sin) = rope_tables(&config)?;
        Ok(Self {
            output_norm: vec("output_norm.weight")?,
            config,
            embedding,
            blocks,
            output,
            rope_cos,
            rope_sin,
        })
    }

    /// The model's hyper-parameters.
    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    /// Runs one ragged batch and returns, per sequence, the logits it asked for:
    /// `[rows, vocab]` f32 with rows = 0, 1 or its token count.
    pub fn forward(&self, batch: &mut [SeqBatch<'_>]) -> Result<Vec<Option<Tensor>>> {
        let layout = self.plan(batch)?;
        let ids: Vec<u32> = batch
            .iter()
            .flat_map(|s| s.tokens.iter().copied())
            .collect();
        let n_tokens = ids.len();
        let positions = Tensor::from_vec(layout.positions.clone(), n_tokens, &Device::Cpu)?;
        let cos = self.rope_cos.index_select(&positions, 0)?; // [T, hd/2]
        let sin = self.rope_sin.index_select(&positions, 0)?;

        let mut x = self.embedding.rows(&ids)?; // [T, D]
        for (layer, block) in self.blocks.iter().enumerate() {
            x = self.block_forward(layer, block, &x, &cos, &sin, batch, &layout)?;
        }
        self.logits(&x, batch, &layout)
    }

    /// Checks the batch and works out each sequence's rows and token positions.
    fn plan(&self, batch: &[SeqBatch<'_>]) -> Result<BatchLayout> {
        let mut offsets = Vec::with_capacity(batch.len());
        let mut positions = Vec::new();
        for seq in batch {
            let end = seq.start_pos + seq.tokens.len();
            if end > self.config.context_length {
                return Err(ModelError::BadTensor {
                    name: "positions".into(),
                    reason: format!(
                        "position {end} exceeds the model's context length {}",
                        self.config.context_length
                    ),
                });
            }
            if let Some(&bad) = seq
                .tokens
                .iter()
                .find(|&&t| t as usize >= self.config.vocab_size)
            {
                return Err(ModelError::BadTensor {
                    name: "tokens".into(),
                    reason: format!(
                        "token id {bad} is outside the vocabulary ({})",
                        self.config.vocab_size
                    ),
                });
            }
            offsets.push(positions.len());
            positions.extend((seq.start_pos..end).map(|p| p as u32));
        }
        Ok(BatchLayout { offsets, positions })
    }

    #[allow(clippy::too_many_arguments)]
    fn block_forward(
        &self,
        layer: usize,
        b: &Block,
        x: &Tensor,
        cos: &Tensor,
        sin: &Tensor,
        batch: &mut [SeqBatch<'_>],
        layout: &BatchLayout,
    ) -> Result<Tensor> {
        let c = &self.config;
        let n_tokens = x.dim(0)?;
        // 1. Attention projections over the whole batch.
        let h = candle_nn::ops::rms_norm(x, &b.attn_norm, c.rms_eps)?; // [T, D]
        let q = b.wq.forward(&h)?; // [T, H*hd]
        let k = b.wk.forward(&h)?; // [T, KV*hd]
        let v = b.wv.forward(&h)?; // [T, KV*hd]
                                   // 2. RoPE at each token's own position (GGUF llama weights are laid out for
                                   //    the interleaved-pairs rotation).
        let to_heads = |t: Tensor, heads: usize| -> Result<Tensor> {
            Ok(t.reshape((1, n_tokens, heads, c.head_dim))?
                .transpose(1, 2)?
                .contiguous()?)
        };
        let q = candle_nn::rotary_emb::rope_i(&to_heads(q, c.n_head)?, cos, sin)?; // [1, H, T, hd]
        let k = candle_nn::rotary_emb::rope_i(&to_heads(k, c.n_kv_head)?, cos, sin)?; // [1, KV, T, hd]
        let v = to_heads(v, c.n_kv_head)?; // [1, KV, T, hd]
                                           // 3. Attention per sequence, against its own cache.
        let mut outs = Vec::with_capacity(batch.len());
        for (seq, &off) in batch.iter_mut().zip(&layout.offsets) {
            let n = seq.tokens.len();
            let qs = q.narrow(2, off, n)?.squeeze(0)?; // [H, n, hd]
            let ks = k.narrow(2, off, n)?.squeeze(0)?.contiguous()?; // [KV, n, hd]
            let vs = v.narrow(2, off, n)?.squeeze(0)?.contiguous()?;
            let q_pos = &layout.positions[off..off + n];
            // Queries, keys and values at f16 precision, as llama.cpp's f16 KV
            // cache computes them: our correctness reference, token for token.
            let (qs, ks, vs) = (round_f16(&qs)?, round_f16(&ks)?, round_f16(&vs)?);
            outs.push(self.attention(layer, &qs, &ks, &vs, q_pos, &mut *seq.cache)?);
        }
        let attn = Tensor::cat(&outs, 0)?; // [T, D]
        let x = (x + b.wo.forward(&attn)?)?;
        // 4. SwiGLU MLP.
        let h = candle_nn::ops::rms_norm(&x, &b.ffn_norm, c.rms_eps)?;
        let gate = candle_nn::ops::silu(&b.w_gate.forward(&h)?)?; // [T, F]
        let up = b.w_up.forward(&h)?;
        let ff = b.w_down.forward(&(gate * up)?)?; // [T, D]
        Ok((x + ff)?)
    }

    /// Scaled dot-product attention of one sequence's new queries over its cache.
    /// `q`: `[H, n, hd]`; `k`, `v`: `[KV, n, hd]`. Returns `[n, H*hd]`.
    fn attention(
        &self,
        layer: usize,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        q_pos: &[u32],
        cache: &mut dyn KvStore,
    ) -> Result<Tensor> {
        let c = &self.config;
        let (g, n) = (c.group_size(), q_pos.len());
        let (kc, vc) = cache.append(layer, k, v, q_pos)?; // [KV, C, hd]
        let n_cached = kc.dim(1)?;
        // Query heads of one group attend to the same KV head: fold them into rows.
        let q = q.contiguous()?.reshape((c.n_kv_head, g * n, c.head_dim))?;
        let scale = 1.0 / (c.head_dim as f64).sqrt();
        let mut scores = (q.matmul(&kc.t()?)? * scale)?; // [KV, G*n, C]
        if n > 1 {
            let mask = causal_mask(q_pos, cache, layer, c.n_kv_head)?; // [KV, 1, n, C]
            scores = scores
                .reshape((c.n_kv_head, g, n, n_cached))?
                .broadcast_add(&mask)?
                .reshape((c.n_kv_head, g * n, n_cached))?;
        }
        let weights = candle_nn::ops::softmax_last_dim(&scores)?;
        if cache.wants_attention(layer) {
            cache.observe_attention(layer, &weights.reshape((c.n_kv_head, g, n, n_cached))?)?;
        }
        // llama.cpp multiplies the f16 V cache by f16-converted weights.
        let out = round_f16(&weights)?.matmul(&vc)?; // [KV, G*n, hd]
        cache.after_attention(layer)?;
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
        let h = candle_nn::ops::rms_norm(&h, &self.output_norm, self.config.rms_eps)?;
        let logits = self
            .output
            .as_ref()
            .unwrap_or(&self.embedding)
            .forward(&h)?
            .to_dtype(DType::F32)?; // [R, vocab]
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

struct BatchLayout {
    /// First row of each sequence in the concatenated batch.
    offsets: Vec<usize>,
    /// Position of every token in the batch.
    positions: Vec<u32>,
}

/// `[KV, 1, n, C]` f32: 0 where a cached entry's position <= the query's
/// position, -inf elsewhere; per KV head, since heads may keep different entries.
fn causal_mask(
    q_pos: &[u32],
    cache: &dyn KvStore,
    layer: usize,
    n_kv_head: usize,
) -> Result<Tensor> {
    let n_cached = cache.positions(layer, 0).len();
    let mut m = Vec::with_capacity(n_kv_head * q_pos.len() * n_cached);
    for h in 0..n_kv_head {
        let k_pos = cache.positions(layer, h);
        for &qp in q_pos {
            m.extend(
                k_pos
                    .iter()
                    .map(|&kp| if kp <= qp { 0.0f32 } else { f32::NEG_INFINITY }),
            );
        }
    }
    Ok(Tensor::from_vec(
        m,
        (n_kv_head, 1, q_pos.len(), n_cached),
        &Device::Cpu,
    )?)
}

/// RoPE cos/sin tables for every position up to the context length.
fn rope_tables(c: &ModelConfig) -> Result<(Tensor, Tensor)> {
    let half = c.head_dim / 2;
    // ggml's recurrence: theta_i = p * scale^i by repeated f32 multiplication,
    // scale = base^(-2/d); kept so angles match llama.cpp's bit for bit.
    let theta_scale = c.rope_base.powf(-2.0 / c.head_dim as f32);
    let mut cos = Vec::with_capacity(c.context_length * half);
    let mut sin = Vec::with_capacity(c.context_length * half);
    for p in 0..c.context_length {
        let mut theta = p as f32;
        for _ in 0..half {
            cos.push(theta.cos());
            sin.push(theta.sin());
            theta *= theta_scale;
        }
    }
    let shape = (c.context_length, half);
    Ok((
        Tensor::from_vec(cos, shape, &Device::Cpu)?,
        Tensor::from_vec(sin, shape, &Device::Cpu)?,
    ))
}

/// Rounds an f32 tensor to the nearest f16 value, kept as f32.
fn round_f16(t: &Tensor) -> Result<Tensor> {
    Ok(t.to_dtype(DType::F16)?.to_dtype(DType::F32)?)
}
