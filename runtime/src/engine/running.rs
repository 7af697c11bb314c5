//! [`Running`]: a request the scheduler has admitted, with the sequences,
//! completions and answer probes it holds until it retires.

use std::time::Instant;

use tokio::sync::mpsc::UnboundedSender;

use super::sequence::Completion;
use super::think::Probe;
use super::{Event, SubmitRequest};
use crate::backend::SeqId;
use crate::sampler::SamplingParams;

/// An admitted request.
pub(super) struct Running {
    pub(super) req: SubmitRequest,
    pub(super) events: UnboundedSender<Event>,
    pub(super) reserve: usize,
    pub(super) submitted: Instant,
    pub(super) stop_ids: Vec<u32>,
    /// The prompt's sequence and how much of the prompt it holds, while reading it.
    pub(super) prefill: Option<(SeqId, usize)>,
    /// Live completions (finished ones are removed and their sequences freed).
    pub(super) completions: Vec<Completion>,
    /// Live answer probes (think requests only).
    pub(super) probes: Vec<Probe>,
    pub(super) first_token_sent: bool,
    /// Most prompt tokens one row may carry: under an overflow policy, what
    /// the context leaves beside what the policy keeps (else unbounded).
    pub(super) row_cap: usize,
}

impl Running {
    /// Sequences the request holds (its `n` while the prompt is read).
    pub(super) fn sequences(&self) -> usize {
        if self.prefill.is_some() {
            self.req.n
        } else {
            self.completions.len() + self.probes.len()
        }
    }

    /// Every sequence the request holds, to free or measure them.
    pub(super) fn seq_ids(&self) -> Vec<SeqId> {
        let mut ids: Vec<SeqId> = self.completions.iter().map(|c| c.seq).collect();
        ids.extend(self.probes.iter().map(|p| p.completion.seq));
        ids.extend(self.prefill.map(|(s, _)| s));
        ids
    }

    /// Whether the prompt is read and every completion has finished.
    pub(super) fn is_done(&self) -> bool {
        self.prefill.is_none() && self.completions.is_empty()
    }
}

/// Completion `i`'s sampling: the request's, seeded `seed + i` so that the
/// `n` completions differ yet each is reproducible.
pub(super) fn seeded(req: &SubmitRequest, i: usize) -> SamplingParams {
    let mut sampling = req.sampling.clone();
    sampling.seed = sampling.seed.wrapping_add(i as u64);
    sampling
}
