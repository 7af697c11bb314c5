//! Tern's own backend: the `tern-models` llama forward over candle tensors with
//! Tern's quantized kernels, and a [`SeqCache`] (any KV policy) per sequence.

use std::collections::HashMap;
use std::ops::Deref;

use std::sync::Arc;

use tern_models::{EvictionLog, KvDtype, SeqBatch};

use super::{Backend, Row, SeqId, SeqKv};
use crate::error::{Result, RuntimeError};
use crate::kv::policy::KvPolicy;
use crate::kv::{SeqCache, TeeCache};
use crate::model::LoadedModel;

/// Runs a [`LoadedModel`] (held as `Arc<LoadedModel>` by the engine, or
/// borrowed for a one-off run); supports every KV policy.
pub struct TernBackend<M = std::sync::Arc<LoadedModel>> {
    model: M,
    seqs: HashMap<SeqId, SeqCache>,
    next: SeqId,
}

impl<M: Deref<Target = LoadedModel>> TernBackend<M> {
    /// A backend over `model` with no sequences.
    pub fn new(model: M) -> Self {
        Self {
            model,
            seqs: HashMap::new(),
            next: 1,
        }
    }

    fn insert(&mut self, cache: SeqCache) -> SeqId {
        let id = self.next;
        self.next += 1;
        self.seqs.insert(id, cache);
        id
    }

    /// Runs `run` over `rows` as one ragged batch, each row with its
    /// sequence's cache. The caches are taken out so each row can hold its own
    /// `&mut`, and go back whatever happens.
    fn with_batch<T>(
        &mut self,
        rows: &[Row<'_>],
        run: impl FnOnce(&LoadedModel, &mut [SeqBatch<'_>]) -> Result<T>,
    ) -> Result<T> {
        let mut caches: Vec<SeqCache> = Vec::with_capacity(rows.len());
        for r in rows {
            match self.seqs.remove(&r.seq) {
                Some(c) => caches.push(c),
                None => {
                    for (r, c) in rows.iter().zip(caches) {
                        self.seqs.insert(r.seq, c);
                    }
                    return Err(Self::unknown(r.seq));
                }
            }
        }
        let result = Self::room(&self.model, rows, &mut caches).and_then(|()| {
            // A cache re-numbered past the context holds the sequence's
            // tokens `shift` positions lower.
            let mut batch: Vec<SeqBatch> = rows
                .iter()
                .zip(caches.iter_mut())
                .map(|(r, cache)| SeqBatch {
                    tokens: r.tokens,
                    start_pos: r.start_pos.saturating_sub(cache.shift()),
                    cache,
                    logits: r.logits,
                })
                .collect();
            run(&self.model, &mut batch)
        });
        for (r, c) in rows.iter().zip(caches) {
            self.seqs.insert(r.seq, c);
        }
        result
    }

    /// Gives each overflowing cache room for its row below the model's
    /// context ([`SeqCache::make_room`]).
    fn room(model: &LoadedModel, rows: &[Row<'_>], caches: &mut [SeqCache]) -> Result<()> {
        let limit = model.config().context_length;
        for (r, cache) in rows.iter().zip(caches.iter_mut()) {
            cache.make_room(r.tokens.len(), limit, |layer| model.arch.rotary(layer))?;
        }
        Ok(())
    }

    /// Reads `prompt` once, as one chunk, into a fresh sequence per policy
    /// (all stored as `dtype`) and ends their prefill: each sequence then
    /// holds what it would after prefilling `prompt` alone (see
    /// [`TeeCache`]). Returns the sequences in `policies`' order and the last
    /// prompt token's logits, which they share.
    pub fn prefill_each(
        &mut self,
        prompt: &[u32],
        policies: &[KvPolicy],
        dtype: KvDtype,
    ) -> Result<(Vec<SeqId>, Vec<f32>)> {
        let members = policies
            .iter()
            .map(|p| SeqCache::with_storage(self.model.config(), p.clone(), dtype))
            .collect::<tern_models::Result<Vec<_>>>()?;
        let mut tee = TeeCache::new(members).map_err(|e| RuntimeError::InvalidParam {
            param: "kv_policy".into(),
            reason: e.to_string(),
        })?;
        let logits = {
            let mut batch = [SeqBatch {
                tokens: prompt,
                start_pos: 0,
                cache: &mut tee,
                logits: tern_models::LogitsWanted::Last,
            }];
            self.model.arch.forward(&mut batch)?
        };
        tee.finish_prefill()?;
        let logits = logits
            .into_iter()
            .next()
            .flatten()
            .ok_or(RuntimeError::EmptyPrompt)?
            .flatten_all()?
            .to_vec1::<f32>()?;
        let seqs = tee
            .into_members()
            .into_iter()
            .map(|c| self.insert(c))
            .collect();
        Ok((seqs, logits))
    }

    /// Compresses `seq`'s cache to its budget now and stops it evicting
    /// anything more ([`SeqCache::freeze`]).
    pub fn freeze(&mut self, seq: SeqId) -> Result<()> {
        let cache = self.seqs.get_mut(&seq).ok_or_else(|| Self::unknown(seq))?;
        Ok(cache.freeze()?)
    }

    fn unknown(seq: SeqId) -> RuntimeError {
        RuntimeError::InvalidParam {
            param: "seq".into(),
            reason: format!("no sequence {seq} in the backend"),
        }
    }
}

impl<M: Deref<Target = LoadedModel> + Send> Backend for TernBackend<M> {
    fn name(&self) -> &'static str {
        "tern"
    }

    fn attention_kernel_switch_rows(&self) -> Option<usize> {
        Some(tern_models::flash::TILED_MIN_ROWS)
    }

    fn set_adapters(
        &mut self,
        adapters: Option<std::sync::Arc<tern_models::LoraSet>>,
    ) -> Result<()> {
        self.model.arch.set_adapters(adapters);
        Ok(())
    }

    fn new_seq(&mut self, policy: &KvPolicy, dtype: KvDtype, expected_len: usize) -> Result<SeqId> {
        let mut cache = SeqCache::with_storage(self.model.config(), policy.clone(), dtype)?;
        if policy.budget().is_none() {
            cache.set_capacity_hint(expected_len);
        }
        Ok(self.insert(cache))
    }

    fn new_overflow_seq(
        &mut self,
        policy: &KvPolicy,
        overflow: &KvPolicy,
        dtype: KvDtype,
        expected_len: usize,
    ) -> Result<SeqId> {
        let dormant = policy.budget().is_none();
        let cache = SeqCache::with_storage(self.model.config(), overflow.clone(), dtype)?;
        let mut cache = cache.overflowing(dormant);
        if dormant {
            cache.set_capacity_hint(expected_len.min(self.model.config().context_length));
        }
        Ok(self.insert(cache))
    }

    fn forward(&mut self, rows: &[Row<'_>]) -> Result<Vec<Option<Vec<f32>>>> {
        self.with_batch(rows, |model, batch| Ok(model.arch.forward(batch)?))?
            .into_iter()
            .map(|t| {
                t.map(|t| Ok(t.flatten_all()?.to_vec1::<f32>()?))
                    .transpose()
            })
            .collect()
    }

    /// The products take each activation row in its one-row order
    /// (`tern_models::quant::alone`); attention, norms and the rest already
    /// compute each token alone below the tiled attention's row count.
    fn forward_alone(&mut self, rows: &[Row<'_>]) -> Result<Vec<Option<Vec<f32>>>> {
        tern_models::quant::alone::scope(|| self.forward(rows))
    }

    fn hidden(&mut self, rows: &[Row<'_>]) -> Result<Vec<Vec<f32>>> {
        let h = self.with_batch(rows, |model, batch| Ok(model.arch.hidden(batch)?))?;
        let d = self.model.config().n_embd;
        let all: Vec<f32> = h
            .to_dtype(candle_core::DType::F32)?
            .flatten_all()?
            .to_vec1()?;
        let mut out = Vec::with_capacity(rows.len());
        let mut at = 0;
        for r in rows {
            let end = at + r.tokens.len() * d;
            let slice = all.get(at..end).ok_or_else(|| {
                RuntimeError::Backend("hidden states shorter than the batch".into())
            })?;
            out.push(slice.to_vec());
            at = end;
        }
        Ok(out)
    }

    fn embeds(&self) -> bool {
        true
    }

    fn finish_prefill(&mut self, seq: SeqId) -> Result<()> {
        let cache = self.seqs.get_mut(&seq).ok_or_else(|| Self::unknown(seq))?;
        Ok(cache.finish_prefill()?)
    }

    fn fork(&mut self, seq: SeqId) -> Result<SeqId> {
        let copy = self
            .seqs
            .get(&seq)
            .ok_or_else(|| Self::unknown(seq))?
            .fork()?;
        Ok(self.insert(copy))
    }

    fn fork_prefix(
        &mut self,
        seq: SeqId,
        len: usize,
        expected_len: usize,
    ) -> Result<Option<SeqId>> {
        let cache = self.seqs.get(&seq).ok_or_else(|| Self::unknown(seq))?;
        Ok(match cache.prefix(len)? {
            Some(mut copy) => {
                copy.set_capacity_hint(expected_len);
                Some(self.insert(copy))
            }
            None => None,
        })
    }

    fn can_rewind(&self, seq: SeqId) -> bool {
        self.seqs.get(&seq).is_some_and(SeqCache::rewindable)
    }

    fn rewind(&mut self, seq: SeqId, len: usize) -> Result<bool> {
        let cache = self.seqs.get_mut(&seq).ok_or_else(|| Self::unknown(seq))?;
        Ok(cache.rewind(len)?)
    }

    fn verify_rows(&self, seq: SeqId) -> usize {
        self.seqs
            .get(&seq)
            .map_or(usize::MAX, SeqCache::verify_rows)
    }

    fn begin_verify(&mut self, seq: SeqId) {
        if let Some(cache) = self.seqs.get_mut(&seq) {
            cache.begin_verify();
        }
    }

    fn free(&mut self, seq: SeqId) {
        self.seqs.remove(&seq);
    }

    fn record_evictions(&mut self, seq: SeqId) -> Result<()> {
        let cache = self.seqs.get_mut(&seq).ok_or_else(|| Self::unknown(seq))?;
        cache.record_evictions();
        Ok(())
    }

    fn evictions(&self, seq: SeqId) -> Option<Arc<EvictionLog>> {
        let log = self.seqs.get(&seq)?.evictions()?;
        Some(Arc::new(log.clone()))
    }

    fn kv(&self, seq: SeqId) -> SeqKv {
        self.seqs
            .get(&seq)
            .map(|c| SeqKv {
                bytes: c.bytes(),
                peak: c.peak_bytes(),
                full: c.full_bytes(),
                allocated: c.allocated_bytes(),
                shifts: c.shifts(),
                held: c.held_entries(),
            })
            .unwrap_or_default()
    }
}
