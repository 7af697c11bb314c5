//! Embedding requests: token sequences in, one L2-normalised vector each out,
//! pooled from the model's final hidden states (after the output norm).
//!
//! The engine serves them between generation steps: each loop turn runs at
//! most one embedding forward of about `step_tokens` tokens ([`plan_batch`]),
//! several inputs (of one request or of several) sharing it, so a large
//! batch of inputs delays running streams by one bounded forward per step
//! instead of stalling them. An input longer than a prompt chunk is read in
//! the same chunks a prompt would be, its KV held in a transient full cache
//! that is freed as soon as the input is pooled. No sampling, stops or
//! events: the request's receiver gets every vector at once, or an error.
//! Wire formats (base64, `dimensions`) are the caller's business.

use std::str::FromStr;

use tokio::sync::oneshot;

use crate::backend::{Backend, LogitsWanted, Row, SeqId};
use crate::error::{Result, RuntimeError};
use crate::kv::policy::KvPolicy;
use crate::model::LoadedModel;
use tern_models::KvDtype;

/// How one input's token states become its vector.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Pooling {
    /// The mean over every token of the input (what sentence-embedding
    /// models trained with mean pooling expect; the default).
    #[default]
    Mean,
    /// The last token's state alone (causal models that summarise the input
    /// in its final position, e.g. those trained with an end token).
    Last,
}

impl Pooling {
    /// The name the CLI and docs use (`mean`, `last`).
    pub fn name(self) -> &'static str {
        match self {
            Pooling::Mean => "mean",
            Pooling::Last => "last",
        }
    }
}

impl FromStr for Pooling {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "mean" => Ok(Pooling::Mean),
            "last" => Ok(Pooling::Last),
            other => Err(format!("unknown pooling `{other}` (use mean or last)")),
        }
    }
}

/// Inputs to embed, already tokenized (the caller adds BOS if it wants one).
#[derive(Clone, Debug)]
pub struct EmbedRequest {
    /// One token sequence per vector wanted, each non-empty and within the
    /// model's context length.
    pub inputs: Vec<Vec<u32>>,
    /// How token states become a vector.
    pub pooling: Pooling,
}

/// One vector per input, in input order, each `[n_embd]` f32 of unit L2 norm.
pub type Embeddings = Vec<Vec<f32>>;

/// The receiving end of one embedding request. Dropping it cancels the
/// request at the engine's next turn.
pub struct EmbedReceiver(oneshot::Receiver<std::result::Result<Embeddings, String>>);

impl EmbedReceiver {
    /// Waits for the vectors (async callers).
    pub async fn recv(self) -> Result<Embeddings> {
        finish(self.0.await)
    }

    /// Waits for the vectors, blocking the thread (CLI; not inside an async runtime).
    pub fn blocking_recv(self) -> Result<Embeddings> {
        finish(self.0.blocking_recv())
    }
}

fn finish(
    got: std::result::Result<std::result::Result<Embeddings, String>, oneshot::error::RecvError>,
) -> Result<Embeddings> {
    match got {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(message)) => Err(RuntimeError::Generation(message)),
        Err(_) => Err(RuntimeError::Generation("the engine has stopped".into())),
    }
}

/// Most inputs one embedding request may carry (OpenAI's limit): each
/// becomes a vector of the model's width in the answer.
pub const MAX_EMBED_INPUTS: usize = 2048;

/// Most tokens all of one embedding request's inputs may hold together
/// (OpenAI's limit, 300,000), so one request's queued ids and its share of
/// the engine's turns stay bounded whatever its count.
pub const MAX_EMBED_TOKENS: usize = 300_000;

/// Checks `req` against `model` before it is queued: between one and
/// [`MAX_EMBED_INPUTS`] inputs, none empty, every id in the vocabulary,
/// none longer than the context, [`MAX_EMBED_TOKENS`] in all at most.
pub(super) fn validate(model: &LoadedModel, req: &EmbedRequest) -> Result<()> {
    let invalid = |reason: String| RuntimeError::InvalidParam {
        param: "input".into(),
        reason,
    };
    if req.inputs.is_empty() {
        return Err(invalid("must contain at least one input".into()));
    }
    if req.inputs.len() > MAX_EMBED_INPUTS {
        return Err(invalid(format!(
            "at most {MAX_EMBED_INPUTS} inputs are allowed per request, got {}",
            req.inputs.len()
        )));
    }
    let tokens: usize = req.inputs.iter().map(Vec::len).sum();
    if tokens > MAX_EMBED_TOKENS {
        return Err(invalid(format!(
            "the inputs hold {tokens} tokens together; at most {MAX_EMBED_TOKENS} are allowed per request"
        )));
    }
    let vocab = model.config().vocab_size;
    let context_length = model.config().context_length;
    for (index, input) in req.inputs.iter().enumerate() {
        if input.is_empty() {
            return Err(invalid(format!("input {index} is empty")));
        }
        if let Some(&bad) = input.iter().find(|&&t| t as usize >= vocab) {
            return Err(invalid(format!(
                "input {index}: token id {bad} is outside the vocabulary (0..{vocab})"
            )));
        }
        if input.len() > context_length {
            return Err(RuntimeError::InputLength {
                index,
                tokens: input.len(),
                context_length,
            });
        }
    }
    Ok(())
}

/// A queued or partly read embedding request, owned by the engine thread.
pub(super) struct EmbedJob {
    req: EmbedRequest,
    reply: oneshot::Sender<std::result::Result<Embeddings, String>>,
    inputs: Vec<InputState>,
}

/// How far one input has been read.
#[derive(Default)]
struct InputState {
    /// Its transient cache, while it is being read.
    seq: Option<SeqId>,
    /// Tokens read so far.
    done: usize,
    /// Sum of the states read so far (mean) or the last one (last).
    acc: Vec<f32>,
    /// The finished vector.
    vector: Option<Vec<f32>>,
}

impl EmbedJob {
    /// A job for `req` and the receiver its caller waits on.
    pub(super) fn new(req: EmbedRequest) -> (Self, EmbedReceiver) {
        let (reply, rx) = oneshot::channel();
        let inputs = req.inputs.iter().map(|_| InputState::default()).collect();
        (Self { req, reply, inputs }, EmbedReceiver(rx))
    }

    /// Whether the caller has gone (dropped its receiver).
    pub(super) fn is_cancelled(&self) -> bool {
        self.reply.is_closed()
    }

    /// Frees every cache the job holds.
    pub(super) fn free(&mut self, backend: &mut dyn Backend) {
        for s in &mut self.inputs {
            if let Some(seq) = s.seq.take() {
                backend.free(seq);
            }
        }
    }

    /// Ends the job with `message`, freeing its caches.
    pub(super) fn fail(mut self, backend: &mut dyn Backend, message: String) {
        self.free(backend);
        let _ = self.reply.send(Err(message));
    }

    /// Whether every input is pooled.
    pub(super) fn is_done(&self) -> bool {
        self.inputs.iter().all(|s| s.vector.is_some())
    }

    /// Sends the vectors (call once [`EmbedJob::is_done`]).
    pub(super) fn answer(self) {
        let vectors = self.inputs.into_iter().filter_map(|s| s.vector).collect();
        let _ = self.reply.send(Ok(vectors));
    }
}

/// One input's chunk in an embedding forward: job, input, and tokens taken.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Chunk {
    job: usize,
    input: usize,
    take: usize,
}

impl Chunk {
    /// The index of the job the chunk belongs to.
    pub(super) fn job(&self) -> usize {
        self.job
    }
}

/// Picks the next embedding forward: inputs in arrival order, each in chunks
/// of `chunk` tokens, until about `budget` tokens (always at least one chunk),
/// so the forward's cost is bounded like a generation step's.
pub(super) fn plan_batch(jobs: &[EmbedJob], chunk: usize, budget: usize) -> Vec<Chunk> {
    let mut out = Vec::new();
    let mut left = budget;
    for (job, j) in jobs.iter().enumerate() {
        for (input, s) in j.inputs.iter().enumerate() {
            let remaining = j.req.inputs[input].len() - s.done;
            if s.vector.is_some() || remaining == 0 {
                continue;
            }
            let take = chunk.min(remaining);
            if take > left && !out.is_empty() {
                return out;
            }
            left = left.saturating_sub(take);
            out.push(Chunk { job, input, take });
        }
    }
    out
}

/// Runs the planned chunks as one forward and folds each chunk's states into
/// its input, pooling and normalising inputs that are complete. An error
/// leaves the jobs as they were, for the caller to fail.
pub(super) fn run_batch(
    jobs: &mut [EmbedJob],
    chunks: &[Chunk],
    backend: &mut dyn Backend,
    d: usize,
) -> Result<()> {
    for c in chunks {
        let s = &mut jobs[c.job].inputs[c.input];
        if s.seq.is_none() {
            let len = jobs[c.job].req.inputs[c.input].len();
            s.seq = Some(backend.new_seq(&KvPolicy::Full, KvDtype::default(), len)?);
        }
    }
    let rows: Vec<Row> = chunks
        .iter()
        .map(|c| {
            let j = &jobs[c.job];
            let s = &j.inputs[c.input];
            Row {
                seq: s.seq.unwrap_or_default(),
                tokens: &j.req.inputs[c.input][s.done..s.done + c.take],
                start_pos: s.done,
                logits: LogitsWanted::None,
            }
        })
        .collect();
    let states = backend.hidden(&rows)?;
    drop(rows);
    for (c, h) in chunks.iter().zip(states) {
        let pooling = jobs[c.job].req.pooling;
        let len = jobs[c.job].req.inputs[c.input].len();
        let s = &mut jobs[c.job].inputs[c.input];
        fold(&mut s.acc, &h, d, pooling);
        s.done += c.take;
        if s.done == len {
            if let Some(seq) = s.seq.take() {
                backend.free(seq);
            }
            let mut v = std::mem::take(&mut s.acc);
            if pooling == Pooling::Mean {
                let n = len as f32;
                v.iter_mut().for_each(|x| *x /= n);
            }
            l2_normalize(&mut v);
            s.vector = Some(v);
        }
    }
    Ok(())
}

/// Adds a chunk's token states `h` (`[take, d]` row-major) to `acc`: summed
/// in token order for the mean, the last row kept for last-token pooling.
fn fold(acc: &mut Vec<f32>, h: &[f32], d: usize, pooling: Pooling) {
    if acc.is_empty() {
        acc.resize(d, 0.0);
    }
    match pooling {
        Pooling::Mean => {
            for row in h.chunks_exact(d) {
                acc.iter_mut().zip(row).for_each(|(a, &x)| *a += x);
            }
        }
        Pooling::Last => {
            if let Some(last) = h.chunks_exact(d).next_back() {
                acc.copy_from_slice(last);
            }
        }
    }
}

/// Scales `v` to unit L2 norm (summed in f64 so long vectors keep their
/// precision); a zero vector stays zero.
pub fn l2_normalize(v: &mut [f32]) {
    let norm = v
        .iter()
        .map(|&x| f64::from(x) * f64::from(x))
        .sum::<f64>()
        .sqrt();
    if norm > 0.0 {
        v.iter_mut()
            .for_each(|x| *x = (f64::from(*x) / norm) as f32);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(lens: &[usize]) -> EmbedJob {
        let inputs = lens.iter().map(|&n| vec![1u32; n]).collect();
        EmbedJob::new(EmbedRequest {
            inputs,
            pooling: Pooling::Mean,
        })
        .0
    }

    #[test]
    fn batches_fill_the_budget_in_chunks() {
        let jobs = vec![job(&[3, 10]), job(&[4])];
        let plan = plan_batch(&jobs, 4, 8);
        let takes: Vec<(usize, usize, usize)> =
            plan.iter().map(|c| (c.job, c.input, c.take)).collect();
        // 3 + 4 fit in 8; the second job's 4 would overflow and waits.
        assert_eq!(takes, vec![(0, 0, 3), (0, 1, 4)]);
    }

    #[test]
    fn a_chunk_bigger_than_the_budget_still_runs_alone() {
        let jobs = vec![job(&[20])];
        let plan = plan_batch(&jobs, 16, 4);
        assert_eq!(plan.len(), 1);
        assert_eq!(plan[0].take, 16);
    }

    #[test]
    fn mean_and_last_pooling() {
        let h = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]; // 3 tokens, d = 2
        let mut acc = Vec::new();
        fold(&mut acc, &h, 2, Pooling::Mean);
        assert_eq!(acc, vec![9.0, 12.0]);
        let mut last = Vec::new();
        fold(&mut last, &h[..4], 2, Pooling::Last);
        fold(&mut last, &h[4..], 2, Pooling::Last);
        assert_eq!(last, vec![5.0, 6.0]);
    }

    #[test]
    fn normalised_vectors_have_unit_norm() {
        let mut v = vec![3.0, 4.0];
        l2_normalize(&mut v);
        assert_eq!(v, vec![0.6, 0.8]);
        let mut zero = vec![0.0; 3];
        l2_normalize(&mut zero);
        assert_eq!(zero, vec![0.0; 3]);
    }

    #[test]
    fn pooling_names_round_trip() {
        for p in [Pooling::Mean, Pooling::Last] {
            assert_eq!(p.name().parse::<Pooling>(), Ok(p));
        }
        assert!("max".parse::<Pooling>().is_err());
    }
}
