//! Teacher forcing a batch of sampled sequences in one pass: the batch's
//! entries (each prompt once, then each response sharing it), the caches
//! that let responses attend over their prompt's keys, and the rows whose
//! hidden states predict the response tokens.

use std::ops::Range;
use std::sync::{Arc, Mutex};

use candle_core::Tensor;
use tern_models::{EvictionLog, FlashKernel, KvStore, LogitsWanted, SeqBatch, Visibility};

use crate::learner::Sample;

/// Keys and values of a shared prompt, per layer, as its own pass computed them.
type PrefixKv = Arc<Mutex<Vec<Option<(Tensor, Tensor)>>>>;

/// How the sampler read an entry's rows, so each attention row rounds as it
/// did when sampled.
#[derive(Clone, Copy, Debug)]
enum Read {
    /// A prompt prefilled in chunks of this many tokens.
    Prompt(usize),
    /// Response tokens, decoded one at a time.
    Decode,
}

/// A cache for teacher forcing: the whole sequence goes in one forward, so the
/// keys to attend over are exactly the ones just computed. Several responses
/// to one prompt share the prompt's pass: the prompt's cache publishes its
/// keys and values layer by layer, and each response's cache prepends them
/// (the prompt comes first in the batch, and the model runs a layer for every
/// sequence before the next layer), so gradients from every response reach
/// the one prompt computation.
struct TeacherKv {
    prefix: PrefixKv,
    /// This cache is the prompt's and writes `prefix`.
    publishes: bool,
    prefix_len: usize,
    positions: Vec<u32>,
    visibility: Option<Visibility>,
    read: Read,
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
        let mut prefix = self.prefix.lock().unwrap_or_else(|p| p.into_inner());
        if self.publishes {
            prefix[layer] = Some((k.clone(), v.clone()));
            self.positions.extend_from_slice(positions);
            return Ok((k.clone(), v.clone()));
        }
        let (pk, pv) = prefix[layer]
            .clone()
            .ok_or_else(|| candle_core::Error::Msg("a response ran before its prompt".into()))?;
        self.positions.extend(0..self.prefix_len as u32);
        self.positions.extend_from_slice(positions);
        Ok((Tensor::cat(&[&pk, k], 1)?, Tensor::cat(&[&pv, v], 1)?))
    }

    fn positions(&self, _layer: usize, _head: usize) -> &[u32] {
        &self.positions
    }

    fn visibility(&self) -> Option<&Visibility> {
        self.visibility.as_ref()
    }

    fn sampled_kernels(&self, n: usize) -> Option<Vec<(Range<usize>, FlashKernel)>> {
        Some(match self.read {
            Read::Decode => vec![(0..n, FlashKernel::Rows)],
            Read::Prompt(chunk) => {
                let chunk = chunk.max(1);
                (0..n)
                    .step_by(chunk)
                    .map(|s| {
                        let e = (s + chunk).min(n);
                        let kernel = if FlashKernel::ByRows.tiled(e - s) {
                            FlashKernel::Tiled
                        } else {
                            FlashKernel::Rows
                        };
                        (s..e, kernel)
                    })
                    .collect()
            }
        })
    }
}

/// A micro-batch laid out for one teacher-forced pass.
pub(crate) struct Teacher<'s> {
    /// Per batch entry: its tokens and first position.
    inputs: Vec<(&'s [u32], usize)>,
    caches: Vec<TeacherKv>,
    /// Rows of the pass's hidden states that predict each response token, in
    /// sample order, and those tokens.
    pub(crate) rows: Vec<u32>,
    pub(crate) targets: Vec<u32>,
}

impl<'s> Teacher<'s> {
    /// Lays out `samples`: per run of samples sharing a prompt (and what its
    /// prompt saw), the prompt once, then each response but its last token
    /// (nothing predicts past it). `prompt_chunk`: the engine's prefill chunk.
    pub(crate) fn new(samples: &[&'s Sample], n_layer: usize, prompt_chunk: usize) -> Self {
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
                    prefix: prefix.clone(),
                    publishes: true,
                    prefix_len: 0,
                    positions: Vec::new(),
                    visibility: seen.as_ref().map(|l| l.visibility(p)),
                    read: Read::Prompt(prompt_chunk),
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
                    prefix: prefix.clone(),
                    publishes: false,
                    prefix_len: p,
                    positions: Vec::new(),
                    visibility: s
                        .visibility
                        .as_ref()
                        .map(|l| l.visibility(p + s.response.len())),
                    read: Read::Decode,
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
        Teacher {
            inputs,
            caches,
            rows,
            targets,
        }
    }

    /// The batch the model runs (borrowing the caches).
    pub(crate) fn batch(&mut self) -> Vec<SeqBatch<'_>> {
        self.inputs
            .iter()
            .zip(self.caches.iter_mut())
            .map(|(&(t, start), c)| SeqBatch {
                tokens: t,
                start_pos: start,
                cache: c as &mut dyn KvStore,
                logits: LogitsWanted::None,
            })
            .collect()
    }
}
