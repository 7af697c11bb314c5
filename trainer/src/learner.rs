//! The learner: the serving model's own forward (`tern_models::Model`) over
//! dequantized f32 weights, teacher-forced over prompt + response with a full
//! cache, with gradients into LoRA adapters (or every projection under full
//! fine-tuning).
//!
//! Token log-probabilities come from [`crate::logprob`]'s chunked passes, and
//! the gradient enters the graph at the final hidden states: for a loss whose
//! derivative in each `log p_t` is `c_t`, backpropagating `sum(h * G)` with
//! `G = c_t dlogp_t/dh_t` (detached) gives exactly the loss's parameter
//! gradients without building `[tokens, vocab]` logits.

use std::path::Path;
use std::sync::{Arc, Mutex};

use candle_core::{DType, Device, Tensor, Var};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tern_models::{
    EvictionLog, KvStore, LoraAdapter, LoraSet, LoraTarget, Precision, SeqBatch, Visibility,
};
use tern_runtime::LoadedModel;

use crate::error::{Result, TrainError};
use crate::logprob;

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
    fn prompt_evictions(&self) -> Option<EvictionLog> {
        let p = self.prompt.len() as u32;
        self.visibility.as_ref().map(|l| l.before(p))
    }
}

/// Keys and values of a shared prompt, per layer, as its own pass computed them.
type PrefixKv = Arc<Mutex<Vec<Option<(Tensor, Tensor)>>>>;

/// A cache for teacher forcing: the whole sequence goes in one forward, so the
/// keys to attend over are exactly the ones just computed. Several responses
/// to one prompt share the prompt's pass: the prompt's cache publishes its
/// keys and values layer by layer, and each response's cache prepends them
/// (the prompt comes first in the batch, and the model runs a layer for every
/// sequence before the next layer), so gradients from every response reach
/// the one prompt computation.
struct TeacherKv {
    prefix: Option<PrefixKv>,
    /// This cache is the prompt's and writes `prefix`.
    publishes: bool,
    prefix_len: usize,
    positions: Vec<u32>,
    visibility: Option<Visibility>,
}

impl KvStore for TeacherKv {
    fn append(
        &mut self,
        layer: usize,
        k: &Tensor,
        v: &Tensor,
        positions: &[u32],
    ) -> tern_models::Result<(Tensor, Tensor)> {
        self.positions.clear();
        match &self.prefix {
            Some(prefix) if self.publishes => {
                prefix.lock().unwrap_or_else(|p| p.into_inner())[layer] =
                    Some((k.clone(), v.clone()));
                self.positions.extend_from_slice(positions);
                Ok((k.clone(), v.clone()))
            }
            Some(prefix) => {
                let shared = prefix.lock().unwrap_or_else(|p| p.into_inner())[layer].clone();
                let (pk, pv) = shared.ok_or_else(|| {
                    candle_core::Error::Msg("a response ran before its prompt".into())
                })?;
                self.positions.extend(0..self.prefix_len as u32);
                self.positions.extend_from_slice(positions);
                Ok((Tensor::cat(&[&pk, k], 1)?, Tensor::cat(&[&pv, v], 1)?))
            }
            None => {
                self.positions.extend_from_slice(positions);
                Ok((k.clone(), v.clone()))
            }
        }
    }

    fn positions(&self, _layer: usize, _head: usize) -> &[u32] {
        &self.positions
    }

    fn visibility(&self) -> Option<&Visibility> {
        self.visibility.as_ref()
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
}

impl Learner {
    /// Loads `path` as f32 and adds LoRA adapters on `targets` of every block
    /// (rank `rank`, scale `alpha / rank`; `A` small random from `seed`, `B`
    /// zero, so step 0 is the base model), or, with `targets` empty, makes every
    /// block weight trainable (full fine-tuning).
    pub fn load(
        path: &Path,
        targets: &[LoraTarget],
        rank: usize,
        alpha: f64,
        seed: u64,
    ) -> Result<Learner> {
        let mut model = LoadedModel::load_as(path, Precision::DenseF32)?;
        let mut full = Vec::new();
        let lora = if targets.is_empty() {
            full = model.arch.make_trainable()?;
            None
        } else {
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
            Some(TrainLora {
                vars,
                scale: alpha / rank as f64,
            })
        };
        Ok(Learner {
            model: Arc::new(model),
            lora,
            full,
            temperature: 1.0,
        })
    }

    /// Scores the policy at sampling temperature `t` (> 0) from now on.
    pub fn set_temperature(&mut self, t: f64) {
        self.temperature = t;
    }

    /// The dense model (tokenizer and template included).
    pub fn model(&self) -> &Arc<LoadedModel> {
        &self.model
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

    /// Final hidden states of the rows that predict each response token, `[R, D]`,
    /// and those tokens. Consecutive samples with the same prompt (a rollout
    /// group) share one pass over it.
    fn response_hidden(
        &self,
        samples: &[&Sample],
        adapters: Option<&LoraSet>,
    ) -> Result<(Tensor, Vec<u32>)> {
        let n_layer = self.model.arch.config().n_layer;
        // Batch entries: per run of samples sharing a prompt, the prompt, then
        // each response but its last token (nothing predicts past it).
        let mut inputs: Vec<(&[u32], usize)> = Vec::new();
        let mut caches: Vec<TeacherKv> = Vec::new();
        // Per sample: (entry of its prompt, entry of its response if any).
        let mut places: Vec<(usize, Option<usize>)> = Vec::with_capacity(samples.len());
        let mut current: Option<(usize, PrefixKv, Option<EvictionLog>)> = None;
        for s in samples {
            let p = s.prompt.len();
            let seen = s.prompt_evictions();
            let shares = matches!(&current, Some((e, _, ev))
                if inputs[*e].0 == s.prompt.as_slice() && *ev == seen);
            if !shares {
                let prefix: PrefixKv = Arc::new(Mutex::new(vec![None; n_layer]));
                inputs.push((&s.prompt, 0));
                caches.push(TeacherKv {
                    prefix: Some(prefix.clone()),
                    publishes: true,
                    prefix_len: 0,
                    positions: Vec::new(),
                    visibility: seen.as_ref().map(|l| l.visibility(p)),
                });
                current = Some((inputs.len() - 1, prefix, seen));
            }
            let (prompt_entry, prefix, _) = current.as_ref().expect("set above");
            let rest = &s.response[..s.response.len().saturating_sub(1)];
            let response_entry = if rest.is_empty() {
                None
            } else {
                inputs.push((rest, p));
                caches.push(TeacherKv {
                    prefix: Some(prefix.clone()),
                    publishes: false,
                    prefix_len: p,
                    positions: Vec::new(),
                    visibility: s
                        .visibility
                        .as_ref()
                        .map(|l| l.visibility(p + s.response.len())),
                });
                Some(inputs.len() - 1)
            };
            places.push((*prompt_entry, response_entry));
        }
        let mut offsets = Vec::with_capacity(inputs.len());
        let mut off = 0usize;
        for (t, _) in &inputs {
            offsets.push(off);
            off += t.len();
        }
        let mut batch: Vec<SeqBatch<'_>> = inputs
            .iter()
            .zip(caches.iter_mut())
            .map(|(&(t, start), c)| SeqBatch {
                tokens: t,
                start_pos: start,
                cache: c as &mut dyn KvStore,
                logits: tern_models::LogitsWanted::None,
            })
            .collect();
        let h = self.model.arch.hidden_with(&mut batch, adapters)?; // [T, D]
        drop(batch);
        let mut rows = Vec::new();
        let mut targets = Vec::new();
        for (s, &(pe, re)) in samples.iter().zip(&places) {
            for (j, &y) in s.response.iter().enumerate() {
                let row = match (j, re) {
                    (0, _) => offsets[pe] + s.prompt.len() - 1,
                    (j, Some(re)) => offsets[re] + j - 1,
                    (_, None) => unreachable!("a response longer than one token has an entry"),
                };
                rows.push(row as u32);
                targets.push(y);
            }
        }
        let idx = Tensor::from_vec(rows, targets.len(), &Device::Cpu)?;
        let h = h.index_select(&idx, 0)?;
        // z / T = (h / T) W^T: scaling the rows tempers the logits, and the
        // gradient flows back through the scale.
        let h = if self.temperature == 1.0 {
            h
        } else {
            (h * (1.0 / self.temperature))?
        };
        Ok((h, targets))
    }

    fn output(&self) -> Result<&Tensor> {
        self.model
            .arch
            .dense_output()
            .ok_or_else(|| TrainError::Config("the learner needs dense weights".into()))
    }

    /// Log-probabilities of every response token, no gradients; with
    /// `base` the adapters are left out (the reference model of the KL term).
    pub fn score(&self, samples: &[Sample], micro: usize, base: bool) -> Result<Vec<Vec<f64>>> {
        let adapters = if base { None } else { self.adapter_set(false) };
        let mut out = Vec::with_capacity(samples.len());
        for chunk in samples.chunks(micro.max(1)) {
            let refs: Vec<&Sample> = chunk.iter().collect();
            let (h, targets) = self.response_hidden(&refs, adapters.as_ref())?;
            let stats = logprob::row_stats(&h.detach(), self.output()?, &targets)?;
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
        let w = self.output()?;
        let mut base = 0;
        for chunk in samples.chunks(micro.max(1)) {
            let refs: Vec<&Sample> = chunk.iter().collect();
            let (h, targets) = self.response_hidden(&refs, live.as_ref())?;
            let hd = h.detach();
            let stats = logprob::row_stats(&hd, w, &targets)?;
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
                let g = logprob::grad_hidden(&hd, w, &targets, &stats, &coef)?;
                let surrogate = (h * g)?.sum_all()?;
                let store = surrogate.backward()?;
                for ((_, var), acc) in params.iter().zip(grads.iter_mut()) {
                    if let Some(g) = store.get(var.as_tensor()) {
                        *acc = Some(match acc.take() {
                            Some(a) => (a + g)?,
                            None => g.clone(),
                        });
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

/// Appends one `Vec` per sample of `chunk`, cut from the flat per-row values.
fn split_rows(flat: &[f64], chunk: &[Sample], out: &mut Vec<Vec<f64>>) {
    let mut at = 0;
    for s in chunk {
        out.push(flat[at..at + s.response.len()].to_vec());
        at += s.response.len();
    }
}
