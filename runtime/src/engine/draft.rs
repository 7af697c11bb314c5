//! Draft-model speculation: a second, smaller model of the target's
//! vocabulary (`--draft-model`, e.g. Qwen2.5-Coder-0.5B for the 1.5B)
//! proposes each draft, which the target verifies exactly as it verifies a
//! prompt-lookup draft (see `speculate`).
//!
//! The draft model keeps its own cache per completion, beside the target's.
//! Before a step, every completion that drafts with the model brings that
//! cache up to its text (rewinding the tokens a verification rejected,
//! feeding those it accepted and the token after them), then the draft model
//! runs one-token greedy steps, batched across those completions, until each
//! has the draft length its acceptance earned. Greedy drafts are point
//! masses, so the verify step stays the exact rejection scheme: the output is
//! the target's own, token for token, whatever the draft model says.

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::Arc;

use tern_models::{KvDtype, ModelConfig};

use super::running::Running;
use super::MAX_DRAFT;
use crate::backend::{Backend, LogitsWanted, Row, SeqId, TernBackend};
use crate::error::{Result, RuntimeError};
use crate::kv::policy::KvPolicy;
use crate::kv::SeqCache;
use crate::model::LoadedModel;

/// A draft model that cannot serve the target it was loaded beside.
#[derive(Debug, thiserror::Error)]
pub enum DraftError {
    /// The two vocabularies differ: the target would verify ids that mean
    /// other text in the draft model.
    #[error("the draft model {draft} does not share the vocabulary of the target {target} (target, then draft): {difference}")]
    Vocabulary {
        /// The draft model's file.
        draft: PathBuf,
        /// The target model's file.
        target: PathBuf,
        /// Where they first differ.
        difference: String,
    },
    /// The draft model's cache cannot take rejected tokens back out
    /// (sliding-window layers).
    #[error("the draft model {draft} cannot be rewound (sliding-window attention layers), so it cannot draft")]
    CannotRewind {
        /// The draft model's file.
        draft: PathBuf,
    },
}

/// The draft model and its backend, owned by the engine thread beside the
/// target's backend.
pub struct DraftModel {
    model: Arc<LoadedModel>,
    backend: Box<dyn Backend>,
    /// Sequences this backend holds, so that those of finished completions
    /// are freed (see [`DraftModel::sweep`]).
    live: HashSet<SeqId>,
}

/// One completion's side in the draft model: its sequence (made on first
/// use) and the tokens its cache holds.
#[derive(Default)]
pub(super) struct DraftSeq {
    seq: Option<SeqId>,
    cached: Vec<u32>,
}

/// One completion drafting this step.
struct Job {
    req: usize,
    completion: usize,
    seq: SeqId,
    /// Tokens the draft model reads next.
    feed: Vec<u32>,
    /// Draft tokens proposed so far.
    got: Vec<u32>,
    want: usize,
}

impl DraftModel {
    /// `draft` made ready to draft for `target`: refused when their
    /// vocabularies differ (compared token by token) or when the draft
    /// model's cache cannot be rewound.
    pub fn new(
        target: &LoadedModel,
        draft: Arc<LoadedModel>,
    ) -> std::result::Result<Self, DraftError> {
        if let Some(difference) = target.tokenizer.vocabulary_difference(&draft.tokenizer) {
            return Err(DraftError::Vocabulary {
                draft: draft.path.clone(),
                target: target.path.clone(),
                difference,
            });
        }
        let mut backend = TernBackend::new(Arc::clone(&draft));
        let rewinds = backend
            .new_seq(&KvPolicy::Full, KvDtype::default(), 1)
            .map(|seq| {
                let ok = backend.can_rewind(seq);
                backend.free(seq);
                ok
            })
            .unwrap_or(false);
        if !rewinds {
            return Err(DraftError::CannotRewind {
                draft: draft.path.clone(),
            });
        }
        Ok(Self {
            model: draft,
            backend: Box::new(backend),
            live: HashSet::new(),
        })
    }

    /// The draft model.
    pub fn model(&self) -> &Arc<LoadedModel> {
        &self.model
    }

    /// The draft model's shape (its KV per token is reserved beside the
    /// target's for every request that drafts with it).
    pub fn config(&self) -> &ModelConfig {
        self.model.config()
    }

    /// Bytes of draft-model KV one sequence of `prompt` tokens growing by
    /// `extra` reserves (a full cache, plus room for one draft).
    pub(super) fn reservation(
        config: &ModelConfig,
        prompt: usize,
        extra: usize,
        chunk: usize,
    ) -> usize {
        SeqCache::reservation_bytes(
            config,
            &KvPolicy::Full,
            KvDtype::default(),
            prompt,
            extra + MAX_DRAFT,
            chunk,
        )
    }

    /// Proposes this step's draft for every completion that drafts with the
    /// model and wants one (`speculate::draft_all` set how long): catches
    /// each one's cache up with its text in chunks of at most `chunk`
    /// tokens, then runs batched greedy one-token steps. A draft stops early
    /// at an end-of-sequence token or an id outside the target's
    /// vocabulary (`target_vocab`).
    pub(super) fn draft_all(
        &mut self,
        running: &mut [Running],
        chunk: usize,
        target_vocab: usize,
    ) -> Result<()> {
        let context = self.model.config().context_length;
        let mut jobs = Vec::new();
        for (ri, r) in running.iter_mut().enumerate() {
            let expected = r.req.prompt.len() + r.req.max_tokens + MAX_DRAFT + 1;
            for (ci, c) in r.completions.iter_mut().enumerate() {
                let Some(d) = c.spec.as_mut() else { continue };
                let want = d.wanted().min(context.saturating_sub(c.history.len()));
                let Some(ds) = d.model.as_mut() else { continue };
                if want == 0 || c.history.is_empty() {
                    continue;
                }
                let seq = match ds.seq {
                    Some(seq) => seq,
                    None => {
                        let seq =
                            self.backend
                                .new_seq(&KvPolicy::Full, KvDtype::default(), expected)?;
                        self.live.insert(seq);
                        ds.seq = Some(seq);
                        seq
                    }
                };
                // Keep what agrees with the text; the last token is always
                // read again, its logits give the first draft token.
                let same = ds
                    .cached
                    .iter()
                    .zip(&c.history)
                    .take_while(|(a, b)| a == b)
                    .count()
                    .min(c.history.len() - 1);
                if same < ds.cached.len() {
                    if !self.backend.rewind(seq, same)? {
                        return Err(RuntimeError::Backend(
                            "the draft model could not rewind a rejected draft".into(),
                        ));
                    }
                    ds.cached.truncate(same);
                }
                jobs.push(Job {
                    req: ri,
                    completion: ci,
                    seq,
                    feed: c.history[same..].to_vec(),
                    got: Vec::new(),
                    want,
                });
            }
        }
        if jobs.is_empty() {
            return Ok(());
        }
        // Catch up: whole chunks of text not yet read, without logits.
        let chunk = chunk.max(1);
        loop {
            let behind: Vec<usize> = (0..jobs.len())
                .filter(|&j| jobs[j].feed.len() > chunk)
                .collect();
            if behind.is_empty() {
                break;
            }
            let rows: Vec<Row> = behind
                .iter()
                .map(|&j| Row {
                    seq: jobs[j].seq,
                    tokens: &jobs[j].feed[..chunk],
                    start_pos: cached_len(running, &jobs[j]),
                    logits: LogitsWanted::None,
                })
                .collect();
            self.backend.forward(&rows)?;
            for &j in &behind {
                let read: Vec<u32> = jobs[j].feed.drain(..chunk).collect();
                cached_mut(running, &jobs[j]).extend(read);
            }
        }
        // Greedy steps: each reads what it has not read and proposes one token.
        let mut active: Vec<usize> = (0..jobs.len()).collect();
        while !active.is_empty() {
            let rows: Vec<Row> = active
                .iter()
                .map(|&j| Row {
                    seq: jobs[j].seq,
                    tokens: &jobs[j].feed,
                    start_pos: cached_len(running, &jobs[j]),
                    logits: LogitsWanted::Last,
                })
                .collect();
            let logits = self.backend.forward(&rows)?;
            let mut next = Vec::with_capacity(active.len());
            for (&j, row) in active.iter().zip(logits) {
                let row = row.ok_or_else(|| {
                    RuntimeError::Backend("the draft model returned no logits".into())
                })?;
                let job = &mut jobs[j];
                let read = std::mem::take(&mut job.feed);
                cached_mut(running, job).extend(read);
                let token = argmax(&row);
                if token as usize >= target_vocab {
                    continue;
                }
                job.got.push(token);
                let ends = running[job.req].stop_ids.contains(&token);
                if !ends && job.got.len() < job.want {
                    job.feed.push(token);
                    next.push(j);
                }
            }
            active = next;
        }
        for job in jobs {
            let c = &mut running[job.req].completions[job.completion];
            let uncached = c.history[c.cached..].to_vec();
            if let Some(d) = c.spec.as_mut() {
                d.propose(&uncached, &job.got);
            }
        }
        Ok(())
    }

    /// Frees the draft sequences of completions that are gone (finished,
    /// cancelled, or failed with their request).
    pub(super) fn sweep(&mut self, running: &[Running]) {
        if self.live.is_empty() {
            return;
        }
        let held: HashSet<SeqId> = running
            .iter()
            .flat_map(|r| &r.completions)
            .filter_map(|c| c.spec.as_ref()?.model.as_ref()?.seq)
            .collect();
        let gone: Vec<SeqId> = self.live.difference(&held).copied().collect();
        for seq in gone {
            self.backend.free(seq);
            self.live.remove(&seq);
        }
    }
}

/// Tokens `job`'s draft cache holds.
fn cached_len(running: &[Running], job: &Job) -> usize {
    running[job.req].completions[job.completion]
        .spec
        .as_ref()
        .and_then(|d| d.model.as_ref())
        .map_or(0, |ds| ds.cached.len())
}

/// The token list of `job`'s draft cache.
fn cached_mut<'a>(running: &'a mut [Running], job: &Job) -> &'a mut Vec<u32> {
    &mut running[job.req].completions[job.completion]
        .spec
        .as_mut()
        .and_then(|d| d.model.as_mut())
        .expect("a drafting job's completion drafts with the model")
        .cached
}

/// The highest logit's id (the lowest id among equals).
fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &l) in logits.iter().enumerate() {
        if l > logits[best] {
            best = i;
        }
    }
    best as u32
}
