//! The learner: the serving model's own forward (`tern_models::Model`),
//! teacher-forced over prompt + response, with gradients into LoRA adapters
//! (or every projection under full fine-tuning).
//!
//! Under LoRA the frozen base stays in its GGUF format and the forward is the
//! sampler's, op for op (`tern_models`' differentiable exact ops): the same
//! quantized kernels, the same attention kernel per row as the sampler ran
//! it, the sampler's log-softmax. A dense rollout's recorded log-probabilities
//! are then the learner's pi_old exactly, wherever the weights' kernels give
//! a row the same result in any batch (Q4_1, Q8_0: SmolLM2). Kernels that
//! take a different order for a batch's leftover rows (the repacked K-quants
//! of Gemma 3's Q4_K_M) differ by that rounding, as llama.cpp's own batched
//! and single-row results do. The backward through a frozen
//! quantized projection dequantizes its blocks a tile at a time. With
//! recompute on, only each block's input is kept and the block is run again
//! in the backward pass. Full fine-tuning runs on dequantized f32 weights.
//!
//! Token log-probabilities never build `[tokens, vocab]` logits: the gradient
//! enters the graph at the final hidden states: for a loss whose derivative
//! in each `log p_t` is `c_t`, backpropagating `sum(h * G)` with
//! `G = c_t dlogp_t/dh_t` (detached) gives exactly the loss's parameter
//! gradients.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use candle_core::backprop::GradStore;
use candle_core::{DType, Device, Tensor, Var};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tern_models::quant::QLinear;
use tern_models::{EvictionLog, LoraAdapter, LoraSet, LoraTarget, Precision};
use tern_runtime::engine::EngineConfig;
use tern_runtime::LoadedModel;

use crate::error::{Result, TrainError};
use crate::logprob;
use crate::teacher::Teacher;

/// One sequence to score: the prompt and the response whose tokens are scored.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    /// Prompt token ids (chat-templated).
    pub prompt: Vec<u32>,
    /// Response token ids (what the loss is over).
    pub response: Vec<u32>,
    /// What each token saw when it was sampled under a KV policy: scored with
    /// this mask the learner is the sparse sampler's own policy
    /// (`--learner-kv sparse-replay`); `None` scores with full attention.
    pub visibility: Option<Arc<EvictionLog>>,
}

impl Sample {
    /// A sample scored with full attention.
    pub fn new(prompt: Vec<u32>, response: Vec<u32>) -> Self {
        Self {
            prompt,
            response,
            visibility: None,
        }
    }

    /// The part of the eviction record the prompt's own queries saw (prefill
    /// compression): equal for every fork of one prefilled prompt.
    pub(crate) fn prompt_evictions(&self) -> Option<EvictionLog> {
        let p = self.prompt.len() as u32;
        self.visibility.as_ref().map(|l| l.before(p))
    }
}

/// Trainable LoRA adapters: `A`, `B` per (layer, target) as variables.
struct TrainLora {
    vars: Vec<((usize, LoraTarget), Var, Var)>,
    scale: f64,
}

/// What one accumulation pass over a batch returns.
pub struct PassOutput {
    /// Per sample, the log-probability of each response token (before the update).
    pub logprobs: Vec<Vec<f64>>,
    /// The loss summed over the batch (as the objective defines it).
    pub loss: f64,
    /// Tokens scored.
    pub tokens: usize,
}

/// The model being trained.
pub struct Learner {
    model: Arc<LoadedModel>,
    lora: Option<TrainLora>,
    full: Vec<(String, Var)>,
    /// The rollouts' sampling temperature: log-probabilities are of the
    /// tempered policy `softmax(z / T)`, the one that produced the samples.
    temperature: f64,
    /// The rollout engine's prefill chunk: which attention kernel each prompt
    /// row was computed on.
    prompt_chunk: usize,
    /// Keep only each block's input and run the block again in the backward
    /// (set per step by the memory plan, so shared references may change it).
    recompute: AtomicBool,
}

/// The projection onto the vocabulary, as the learner reads it.
enum Output<'a> {
    /// Dequantized f32 `[vocab, D]` (full fine-tuning).
    Dense(&'a Tensor),
    /// The GGUF matrix on the sampler's kernel.
    Quant(&'a QLinear),
}

impl Learner {
    /// Loads `path` and adds LoRA adapters on `targets` of every block (rank
    /// `rank`, scale `alpha / rank`; `A` small random from `seed`, `B` zero, so
    /// step 0 is the base model) over the quantized base, or, with `targets`
    /// empty, makes every block weight trainable over f32 weights (full
    /// fine-tuning).
    pub fn load(
        path: &Path,
        targets: &[LoraTarget],
        rank: usize,
        alpha: f64,
        seed: u64,
    ) -> Result<Learner> {
        Self::load_as(path, targets, rank, alpha, seed, Precision::Quantized)
    }

    /// [`Learner::load`] with the LoRA base held as `base` (full fine-tuning
    /// is always f32).
    pub fn load_as(
        path: &Path,
        targets: &[LoraTarget],
        rank: usize,
        alpha: f64,
        seed: u64,
        base: Precision,
    ) -> Result<Learner> {
        if targets.is_empty() {
            let mut model = LoadedModel::load_as(path, Precision::DenseF32)?;
            let full = model.arch.make_trainable()?;
            return Ok(Self::assemble(Arc::new(model), None, full));
        }
        let model = Arc::new(LoadedModel::load_as(path, base)?);
        Self::lora(model, targets, rank, alpha, seed)
    }

    /// LoRA adapters over a model already loaded for serving (the rollout
    /// engine's): one copy of the quantized weights serves both.
    pub fn with_model(
        model: Arc<LoadedModel>,
        targets: &[LoraTarget],
        rank: usize,
        alpha: f64,
        seed: u64,
    ) -> Result<Learner> {
        if targets.is_empty() || model.arch.precision() != Precision::Quantized {
            return Err(TrainError::Config(
                "LoRA over a served model needs targets and quantized weights".into(),
            ));
        }
        Self::lora(model, targets, rank, alpha, seed)
    }

    fn lora(
        model: Arc<LoadedModel>,
        targets: &[LoraTarget],
        rank: usize,
        alpha: f64,
        seed: u64,
    ) -> Result<Learner> {
        let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x10_5a);
        let mut vars = Vec::new();
        for layer in 0..model.arch.config().n_layer {
            for &t in targets {
                let (out, inp) = model.arch.projection_shape(t);
                // Kaiming-uniform-like bound for A, as LoRA initialises it.
                let bound = (1.0 / inp as f64).sqrt() as f32;
                let a: Vec<f32> = (0..rank * inp)
                    .map(|_| rng.gen_range(-bound..bound))
                    .collect();
                let a = Var::from_vec(a, (rank, inp), &Device::Cpu)?;
                let b = Var::zeros((out, rank), DType::F32, &Device::Cpu)?;
                vars.push(((layer, t), a, b));
            }
        }
        let lora = TrainLora {
            vars,
            scale: alpha / rank as f64,
        };
        Ok(Self::assemble(model, Some(lora), Vec::new()))
    }

    fn assemble(
        model: Arc<LoadedModel>,
        lora: Option<TrainLora>,
        full: Vec<(String, Var)>,
    ) -> Learner {
        Learner {
            model,
            lora,
            full,
            temperature: 1.0,
            prompt_chunk: EngineConfig::default().prompt_chunk(),
            recompute: AtomicBool::new(false),
        }
    }

    /// Scores the policy at sampling temperature `t` (> 0) from now on.
    pub fn set_temperature(&mut self, t: f64) {
        self.temperature = t;
    }

    /// The rollout engine's prompt chunk ([`EngineConfig::prompt_chunk`]), so
    /// prompt rows are scored on the attention kernel they were sampled with.
    pub fn set_prompt_chunk(&mut self, chunk: usize) {
        self.prompt_chunk = chunk.max(1);
    }

    /// Recompute each block in the backward pass instead of keeping its
    /// activations (LoRA only: full fine-tuning keeps them). Each GRPO step
    /// may switch it once its rollouts' lengths are known (`memory::step_plan`).
    pub fn set_recompute(&self, on: bool) {
        self.recompute.store(on, Ordering::Relaxed);
    }

    /// Whether blocks are recomputed in the backward pass.
    pub fn recomputes(&self) -> bool {
        self.recompute.load(Ordering::Relaxed) && self.quantized()
    }

    /// The model (tokenizer and template included).
    pub fn model(&self) -> &Arc<LoadedModel> {
        &self.model
    }

    /// Whether the frozen base runs on the sampler's quantized kernels.
    pub fn quantized(&self) -> bool {
        self.model.arch.precision() == Precision::Quantized
    }

    /// Every trainable parameter with a stable name (checkpoint keys).
    pub fn params(&self) -> Vec<(String, &Var)> {
        match &self.lora {
            Some(l) => l
                .vars
                .iter()
                .flat_map(|((layer, t), a, b)| {
                    [
                        (LoraSet::tensor_name(*layer, *t, 'a'), a),
                        (LoraSet::tensor_name(*layer, *t, 'b'), b),
                    ]
                })
                .collect(),
            None => self.full.iter().map(|(n, v)| (n.clone(), v)).collect(),
        }
    }

    /// Number of trainable scalars.
    pub fn param_count(&self) -> usize {
        self.params().iter().map(|(_, v)| v.elem_count()).sum()
    }

    /// `alpha / rank`, if LoRA.
    pub fn lora_scale(&self) -> Option<f64> {
        self.lora.as_ref().map(|l| l.scale)
    }

    /// The adapters as the forward uses them (`live`: the variables, so
    /// gradients flow; otherwise detached copies).
    fn adapter_set(&self, live: bool) -> Option<LoraSet> {
        let l = self.lora.as_ref()?;
        let mut set = LoraSet::default();
        for ((layer, t), a, b) in &l.vars {
            let (a, b) = if live {
                (a.as_tensor().clone(), b.as_tensor().clone())
            } else {
                (a.as_tensor().detach(), b.as_tensor().detach())
            };
            set.adapters.insert(
                (*layer, *t),
                LoraAdapter {
                    a,
                    b,
                    scale: l.scale,
                },
            );
        }
        Some(set)
    }

    /// A frozen copy of the current adapters for the rollout engine (`None`
    /// under full fine-tuning, whose weights the engine cannot take this way).
    pub fn adapters_snapshot(&self) -> Result<Option<Arc<LoraSet>>> {
        let Some(set) = self.adapter_set(false) else {
            return Ok(None);
        };
        let mut copy = LoraSet::default();
        for (k, ad) in set.adapters {
            copy.adapters.insert(
                k,
                LoraAdapter {
                    a: ad.a.copy()?,
                    b: ad.b.copy()?,
                    scale: ad.scale,
                },
            );
        }
        Ok(Some(Arc::new(copy)))
    }

    fn output(&self) -> Result<Output<'_>> {
        let d = self.model.arch.decoder();
        if let Some(q) = d.quant_output() {
            return Ok(Output::Quant(q));
        }
        self.model
            .arch
            .dense_output()
            .map(Output::Dense)
            .ok_or_else(|| TrainError::Config("the learner has no output projection".into()))
    }

    /// Pass 1 over the selected hidden states `h` (detached).
    fn stats(&self, h: &Tensor, targets: &[u32]) -> Result<logprob::RowStats> {
        match self.output()? {
            Output::Dense(w) => logprob::row_stats(h, w, targets),
            Output::Quant(w) => logprob::quant_row_stats(h, w, targets, self.temperature),
        }
    }

    /// Pass 2: `G = c_t d log p_t / d h_t`.
    fn grad_hidden(
        &self,
        h: &Tensor,
        targets: &[u32],
        stats: &logprob::RowStats,
        coef: &[f64],
    ) -> Result<Tensor> {
        match self.output()? {
            Output::Dense(w) => logprob::grad_hidden(h, w, targets, stats, coef),
            Output::Quant(w) => {
                logprob::quant_grad_hidden(h, w, targets, stats, coef, self.temperature)
            }
        }
    }

    /// The rows of the final hidden states that predict response tokens;
    /// on the dense path divided by the temperature (`z / T = (h / T) W^T`;
    /// the quantized path tempers the served logits themselves).
    fn select(&self, h: &Tensor, rows: &[u32]) -> Result<Tensor> {
        let idx = Tensor::from_slice(rows, rows.len(), &Device::Cpu)?;
        let h = h.index_select(&idx, 0)?;
        Ok(if self.quantized() || self.temperature == 1.0 {
            h
        } else {
            (h * (1.0 / self.temperature))?
        })
    }

    /// Log-probabilities of every response token, no gradients; with
    /// `base` the adapters are left out (the reference model of the KL term).
    pub fn score(&self, samples: &[Sample], micro: usize, base: bool) -> Result<Vec<Vec<f64>>> {
        let adapters = if base { None } else { self.adapter_set(false) };
        let n_layer = self.model.arch.config().n_layer;
        let mut out = Vec::with_capacity(samples.len());
        for chunk in samples.chunks(micro.max(1)) {
            let refs: Vec<&Sample> = chunk.iter().collect();
            let mut teacher = Teacher::new(&refs, n_layer, self.prompt_chunk);
            let (rows, targets) = (teacher.rows.clone(), teacher.targets.clone());
            let h = self
                .model
                .arch
                .hidden_with(&mut teacher.batch(), adapters.as_ref())?;
            let h = self.select(&h.detach(), &rows)?;
            let stats = self.stats(&h, &targets)?;
            split_rows(&stats.logprobs(), chunk, &mut out);
        }
        Ok(out)
    }

    /// One gradient pass over `samples` in micro-batches of `micro` sequences.
    /// `objective(sample, token, logp)` returns that token's `(loss, dloss/dlogp)`;
    /// the gradients of the summed loss are returned in [`Learner::params`] order
    /// (accumulated over micro-batches), with the pre-update log-probabilities.
    pub fn accumulate(
        &self,
        samples: &[Sample],
        micro: usize,
        mut objective: impl FnMut(usize, usize, f64) -> (f64, f64),
        mut after_micro: impl FnMut(),
    ) -> Result<(Vec<Tensor>, PassOutput)> {
        let params = self.params();
        let mut grads: Vec<Option<Tensor>> = vec![None; params.len()];
        let mut logprobs: Vec<Vec<f64>> = Vec::with_capacity(samples.len());
        let (mut loss, mut tokens) = (0f64, 0usize);
        let live = self.adapter_set(true);
        let frozen = self.adapter_set(false);
        let n_layer = self.model.arch.config().n_layer;
        let decoder = self.model.arch.decoder();
        let mut base = 0;
        for chunk in samples.chunks(micro.max(1)) {
            let refs: Vec<&Sample> = chunk.iter().collect();
            let mut teacher = Teacher::new(&refs, n_layer, self.prompt_chunk);
            let (rows, targets) = (teacher.rows.clone(), teacher.targets.clone());
            let mut batch = teacher.batch();
            // With recompute: the blocks' inputs, and the last block's output
            // as the variable the backward starts from.
            let mut kept: Option<(Vec<Tensor>, Var, tern_models::Trunk)> = None;
            let h = if self.recomputes() {
                let (mut x, trunk) = decoder.trunk_start(&mut batch)?;
                let mut inputs = Vec::with_capacity(n_layer);
                for layer in 0..n_layer {
                    inputs.push(x.clone());
                    x = decoder.trunk_layer(layer, &x, &trunk, &mut batch, frozen.as_ref())?;
                }
                let last = Var::from_tensor(&x)?;
                let h = decoder.final_norm(last.as_tensor())?;
                kept = Some((inputs, last, trunk));
                h
            } else {
                self.model.arch.hidden_with(&mut batch, live.as_ref())?
            };
            let h = self.select(&h, &rows)?;
            let hd = h.detach();
            let stats = self.stats(&hd, &targets)?;
            let lp = stats.logprobs();
            let mut coef = Vec::with_capacity(lp.len());
            let mut row = 0;
            for (i, s) in chunk.iter().enumerate() {
                for j in 0..s.response.len() {
                    let (l, c) = objective(base + i, j, lp[row]);
                    loss += l;
                    coef.push(c);
                    row += 1;
                }
            }
            tokens += lp.len();
            split_rows(&lp, chunk, &mut logprobs);
            if coef.iter().any(|&c| c != 0.0) {
                let g = self.grad_hidden(&hd, &targets, &stats, &coef)?;
                let store = (h * g)?.sum_all()?.backward()?;
                add_grads(&params, &store, &mut grads)?;
                if let Some((inputs, last, trunk)) = kept {
                    // Backward block by block: run each again from its kept
                    // input with the live adapters, and push the gradient
                    // of its output through it.
                    let mut g =
                        store
                            .get(last.as_tensor())
                            .map(|t| t.detach())
                            .ok_or_else(|| {
                                TrainError::Config("no gradient reached the trunk".into())
                            })?;
                    drop(store);
                    for layer in (0..n_layer).rev() {
                        let x = Var::from_tensor(&inputs[layer])?;
                        let y = decoder.trunk_layer(
                            layer,
                            x.as_tensor(),
                            &trunk,
                            &mut batch,
                            live.as_ref(),
                        )?;
                        let store = (y * &g)?.sum_all()?.backward()?;
                        add_grads(&params, &store, &mut grads)?;
                        match store.get(x.as_tensor()) {
                            Some(gx) => g = gx.detach(),
                            None => break,
                        }
                    }
                }
            }
            base += chunk.len();
            after_micro();
        }
        let grads = params
            .iter()
            .zip(grads)
            .map(|((_, v), g)| match g {
                Some(g) => Ok(g),
                None => Ok(v.as_tensor().zeros_like()?),
            })
            .collect::<Result<Vec<_>>>()?;
        Ok((
            grads,
            PassOutput {
                logprobs,
                loss,
                tokens,
            },
        ))
    }
}

/// Adds the gradients `store` holds for `params` into `acc`.
fn add_grads(
    params: &[(String, &Var)],
    store: &GradStore,
    acc: &mut [Option<Tensor>],
) -> Result<()> {
    for ((_, var), acc) in params.iter().zip(acc.iter_mut()) {
        if let Some(g) = store.get(var.as_tensor()) {
            let g = g.detach();
            *acc = Some(match acc.take() {
                Some(a) => (a + g)?,
                None => g,
            });
        }
    }
    Ok(())
}

/// Appends one `Vec` per sample of `chunk`, cut from the flat per-row values.
fn split_rows(flat: &[f64], chunk: &[Sample], out: &mut Vec<Vec<f64>>) {
    let mut at = 0;
    for s in chunk {
        out.push(flat[at..at + s.response.len()].to_vec());
        at += s.response.len();
    }
}
