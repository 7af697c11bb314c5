//! One prompt answered under several KV policies, read once for all of them
//! ([`TernBackend::prefill_each`]): the policy sweeps' way to answer a long
//! prompt dozens of times at the cost of one prefill. Each answer equals what
//! [`generate`](crate::generate::generate) gives under that policy alone with
//! the prompt in one chunk (`tests/kv_tee.rs` checks it token for token).

use std::time::Instant;

use tern_runtime::backend::{Backend, TernBackend};
use tern_runtime::kv::policy::KvPolicy;
use tern_runtime::{LoadedModel, RuntimeError};

use crate::error::{KvEvalError, Result};
use crate::generate::{decode, prefill, GenerateOutput, GenerateRequest};

/// Answers `req.prompt` under each of `policies` (stored as `req.kv_dtype`;
/// `req.kv_policy` is not read), reading the prompt once for all of them
/// ([`TernBackend::prefill_each`]: one chunk, whatever `req.prefill_chunk`
/// says). Each output equals what [`generate`](crate::generate::generate) gives under that policy with
/// the prompt in one chunk; each reports the shared prefill's seconds.
pub fn generate_each<M>(
    backend: &mut TernBackend<M>,
    model: &LoadedModel,
    req: &GenerateRequest,
    policies: &[KvPolicy],
) -> Result<Vec<GenerateOutput>>
where
    M: std::ops::Deref<Target = LoadedModel> + Send,
{
    generate_each_split(backend, model, req, policies, req.prompt.len())
}

/// Like [`generate_each`], but the policies compress only the first
/// `context` prompt tokens, before the rest of the prompt (the question) is
/// read: each cache is then frozen ([`tern_runtime::kv::SeqCache::freeze`]) and the
/// question and answer are kept whole. This is the query-agnostic setting of
/// kvpress's leaderboard, where a scorer cannot look at the question; the
/// budget a policy is given counts context entries only.
pub fn generate_each_query_agnostic<M>(
    backend: &mut TernBackend<M>,
    model: &LoadedModel,
    req: &GenerateRequest,
    policies: &[KvPolicy],
    context: usize,
) -> Result<Vec<GenerateOutput>>
where
    M: std::ops::Deref<Target = LoadedModel> + Send,
{
    if context == 0 || context >= req.prompt.len() {
        return Err(KvEvalError::ContextSplit {
            context,
            prompt: req.prompt.len(),
        });
    }
    generate_each_split(backend, model, req, policies, context)
}

/// [`generate_each`] when `context == req.prompt.len()`, else its
/// query-agnostic form.
fn generate_each_split<M>(
    backend: &mut TernBackend<M>,
    model: &LoadedModel,
    req: &GenerateRequest,
    policies: &[KvPolicy],
    context: usize,
) -> Result<Vec<GenerateOutput>>
where
    M: std::ops::Deref<Target = LoadedModel> + Send,
{
    req.sampling.validate().map_err(RuntimeError::from)?;
    model.check_prompt(req.prompt.len())?;
    let t0 = Instant::now();
    let (seqs, shared) = backend.prefill_each(&req.prompt[..context], policies, req.kv_dtype)?;
    let shared_secs = t0.elapsed().as_secs_f64();
    let question = &req.prompt[context..];
    let mut outs = Vec::with_capacity(seqs.len());
    let mut result = Ok(());
    for &seq in &seqs {
        if result.is_ok() {
            let t1 = Instant::now();
            let logits = if question.is_empty() {
                Ok(shared.clone())
            } else {
                backend
                    .freeze(seq)
                    .map_err(KvEvalError::from)
                    .and_then(|()| prefill(backend, seq, question, context, question.len()))
            };
            let own_secs = t1.elapsed().as_secs_f64();
            match logits.and_then(|logits| {
                decode(
                    backend,
                    seq,
                    model,
                    req,
                    logits,
                    shared_secs + own_secs,
                    |_| {},
                )
            }) {
                Ok(out) => outs.push(out),
                Err(e) => result = Err(e),
            }
        }
        backend.free(seq);
    }
    result.map(|()| outs)
}
