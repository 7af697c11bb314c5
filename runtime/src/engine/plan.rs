//! The "plan" third of a step: which rows the next forward carries. Every
//! running sequence's decode token, answer probes, and prompt chunks within the
//! step's token budget, each row tagged with the [`Slot`] that says whose it is,
//! so the apply third routes each row's logits without re-deriving anything.

use super::running::Running;
use super::EngineConfig;
use crate::backend::{LogitsWanted, Row};

/// Whose row this is: the typed link from a row of the batch to the request
/// (an index into the running list) and the part of it the row advances.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Slot {
    /// `take` prompt tokens of request `req`; `last` when they end its prompt.
    Prefill { req: usize, take: usize, last: bool },
    /// One decode token of completion `completion` of request `req`.
    Decode { req: usize, completion: usize },
    /// One token of answer probe `probe` of request `req`.
    Probe { req: usize, probe: usize },
}

/// One step's batch: the rows for the backend and, index for index, their slots.
pub(super) struct StepPlan<'a> {
    /// The rows of the ragged forward, borrowing the requests' tokens.
    pub rows: Vec<Row<'a>>,
    /// `slots[i]` owns `rows[i]`.
    pub slots: Vec<Slot>,
}

impl Slot {
    /// The running request the row belongs to.
    pub fn req(&self) -> usize {
        match *self {
            Slot::Prefill { req, .. } | Slot::Decode { req, .. } | Slot::Probe { req, .. } => req,
        }
    }
}

impl StepPlan<'_> {
    /// Rows and tokens in the batch (for the step log).
    pub fn shape(&self) -> (usize, usize) {
        let tokens = self.rows.iter().map(|r| r.tokens.len()).sum();
        (self.rows.len(), tokens)
    }
}

/// Plans the next step over the running requests under `cfg`'s token budget.
///
/// Decode rows always go; a prompt is read in the same chunks under any load
/// (a compressing policy evicts between chunks and attention picks its kernel
/// by a chunk's rows, so a chunk cut to fit a busy step would change the
/// answer): a chunk that does not fit waits, unless the step carries no prompt yet.
pub(super) fn plan<'a>(running: &'a [Running], cfg: &EngineConfig) -> StepPlan<'a> {
    let decode_rows: usize = running
        .iter()
        .map(|r| r.completions.len() + r.probes.len())
        .sum();
    let chunk = cfg.prompt_chunk();
    let mut budget = cfg.step_tokens.saturating_sub(decode_rows);

    let mut rows: Vec<Row> = Vec::new();
    let mut slots: Vec<Slot> = Vec::new();
    let mut prefilling = false;
    for (ri, r) in running.iter().enumerate() {
        if let Some((seq, done)) = r.prefill {
            let take = chunk.min(r.row_cap).min(r.req.prompt.len() - done);
            if take == 0 || (take > budget && prefilling) {
                continue;
            }
            prefilling = true;
            budget = budget.saturating_sub(take);
            let last = done + take == r.req.prompt.len();
            rows.push(Row {
                seq,
                tokens: &r.req.prompt[done..done + take],
                start_pos: done,
                logits: if last {
                    LogitsWanted::Last
                } else {
                    LogitsWanted::None
                },
            });
            slots.push(Slot::Prefill {
                req: ri,
                take,
                last,
            });
        } else {
            for (ci, c) in r.completions.iter().enumerate() {
                // A completion waits while its answer probe runs, so a
                // verdict applies exactly where the probe was taken.
                if c.think.as_ref().is_some_and(|t| t.probe_live) {
                    continue;
                }
                // A row carrying a draft wants every position's logits.
                rows.push(Row {
                    seq: c.seq,
                    tokens: c.feed(),
                    start_pos: c.cached,
                    logits: if c.drafting() {
                        LogitsWanted::All
                    } else {
                        LogitsWanted::Last
                    },
                });
                slots.push(Slot::Decode {
                    req: ri,
                    completion: ci,
                });
            }
            for (pi, p) in r.probes.iter().enumerate() {
                rows.push(Row {
                    seq: p.completion.seq,
                    tokens: p.completion.uncached(),
                    start_pos: p.completion.cached,
                    logits: LogitsWanted::Last,
                });
                slots.push(Slot::Probe { req: ri, probe: pi });
            }
        }
    }
    StepPlan { rows, slots }
}
