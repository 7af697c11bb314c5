//! The suite under each KV policy at each fraction of the prompt's entries
//! removed: every sample is read once for all settings
//! ([`crate::generate_each`]), scored, recorded as one JSON line per sample
//! and setting, and averaged into the tables of `table.rs`.

use serde_json::json;
use tern_runtime::backend::TernBackend;
use tern_runtime::kv::policy::KvPolicy;
use tern_runtime::sampler::SamplingParams;
use tern_runtime::LoadedModel;

use super::table::{print_tables, Cells, Setting};
use super::{build, sample_seed, score, RulerSample, RulerTask};
use crate::config::{KvEvalConfig, Query};
use crate::error::{KvEvalError, Result};
use crate::generate::{GenerateOutput, GenerateRequest};
use crate::generate_each::{generate_each, generate_each_query_agnostic};
use crate::policy::policy;
use crate::printer::Printer;
use crate::record_file::Records;

/// Per-layer budget that removes `removed` percent of `prompt_tokens` entries.
fn budget(prompt_tokens: usize, removed: u32) -> usize {
    (prompt_tokens * (100 - removed as usize)).div_ceil(100)
}

/// Greedy answers to `sample` under each of `policies`: the prompt is read
/// once, in one chunk, for all of them (`generate_each`; each answer equals
/// the policy's answer alone, tests/kv_tee.rs), so score-based policies
/// compress the whole prompt once, seeing the question's queries, as in the
/// passkey task. Query-agnostic, only the context before the question is
/// read together and compressed; each cache is then frozen and reads the
/// question on its own (`generate_each_query_agnostic`).
fn answers(
    model: &LoadedModel,
    sample: &RulerSample,
    policies: &[KvPolicy],
    cfg: &KvEvalConfig,
) -> Result<Vec<GenerateOutput>> {
    let req = GenerateRequest {
        prefill_chunk: sample.tokens.len(),
        prompt: sample.tokens.clone(),
        sampling: SamplingParams::greedy(),
        max_tokens: sample.max_new_tokens,
        ignore_eos: false,
        stop: Vec::new(),
        kv_policy: KvPolicy::Full,
        kv_dtype: cfg.kv_dtype,
    };
    let mut backend = TernBackend::new(model);
    match cfg.ruler.query {
        Query::Agnostic => {
            generate_each_query_agnostic(&mut backend, model, &req, policies, sample.context_tokens)
        }
        Query::Aware => generate_each(&mut backend, model, &req, policies),
    }
}

/// The settings of every table: full, then each policy (but full) at each
/// removed percentage. Fails on an unknown policy before any sample runs.
fn settings(cfg: &KvEvalConfig) -> Result<Vec<Setting>> {
    let mut settings = vec![Setting {
        name: "full".into(),
        removed: 0,
    }];
    for name in cfg.policies.iter().filter(|n| *n != "full") {
        policy(name, 1024)?;
        for &removed in &cfg.ruler.removed {
            settings.push(Setting {
                name: name.clone(),
                removed,
            });
        }
    }
    Ok(settings)
}

/// Where one sample sits in the run.
#[derive(Clone, Copy)]
struct SampleAt {
    task: RulerTask,
    length: usize,
    index: usize,
    seed: u64,
}

/// Everything a sample is run against.
struct Sweep<'a> {
    model: &'a LoadedModel,
    cfg: &'a KvEvalConfig,
    /// The model file's name, as records carry it.
    model_name: String,
    settings: Vec<Setting>,
    records: Records,
    rows: Vec<serde_json::Value>,
}

/// Runs the suite; returns every record (also written to `cfg.out`).
pub fn eval_ruler(
    model: &LoadedModel,
    cfg: &KvEvalConfig,
    out: &mut dyn Printer,
) -> Result<serde_json::Value> {
    let records = Records::create(cfg.out.as_deref())?;
    let model_name = std::path::Path::new(&cfg.model)
        .file_name()
        .map_or(cfg.model.clone(), |f| f.to_string_lossy().into_owned());
    let mut sweep = Sweep {
        model,
        cfg,
        model_name,
        settings: settings(cfg)?,
        records,
        rows: Vec::new(),
    };
    let a = &cfg.ruler;
    for &length in &a.lengths {
        let mut cells = Cells::new();
        for &task in &a.tasks {
            for index in 0..a.samples {
                let seed = sample_seed(cfg.seed, task, length, index);
                let at = SampleAt {
                    task,
                    length,
                    index,
                    seed,
                };
                sweep.sample(at, &mut cells, out)?;
            }
        }
        print_tables(length, cfg, &sweep.settings, &cells, out);
    }
    Ok(json!({"rows": sweep.rows}))
}

impl Sweep<'_> {
    /// Builds the sample at `at`, answers it under every setting, and scores,
    /// records and tallies each answer.
    fn sample(&mut self, at: SampleAt, cells: &mut Cells, out: &mut dyn Printer) -> Result<()> {
        let cfg = self.cfg;
        let sample = build(&self.model.tokenizer, at.task, at.length, at.seed).map_err(|e| {
            KvEvalError::RulerSample {
                task: at.task.name(),
                length: at.length,
                source: Box::new(e),
            }
        })?;
        let n = sample.tokens.len();
        // What a policy compresses: the whole prompt, or only the context
        // before the question.
        let compressed = match cfg.ruler.query {
            Query::Agnostic => sample.context_tokens,
            Query::Aware => n,
        };
        let mut policies = Vec::with_capacity(self.settings.len());
        let mut budgets = Vec::with_capacity(self.settings.len());
        for s in &self.settings {
            if s.removed == 0 {
                policies.push(KvPolicy::Full);
                budgets.push(n);
            } else {
                let b = budget(compressed, s.removed);
                policies.push(policy(&s.name, b)?);
                budgets.push(b);
            }
        }
        let outs = answers(self.model, &sample, &policies, cfg)?;
        for (si, (p, o)) in policies.iter().zip(outs).enumerate() {
            let s = &self.settings[si];
            let score = score(&sample.expected, &o.text);
            out.progress(&format!(
                "ruler {} {} #{} {p} (-{}%): {score:.0} (decode {:.1}s)",
                at.task, at.length, at.index, s.removed, o.decode_secs
            ));
            cells.entry((si, at.task)).or_default().push(score);
            let rec = json!({
                "suite": "ruler", "model": self.model_name, "task": at.task.name(),
                "length": at.length, "sample": at.index, "seed": at.seed, "prompt_tokens": n,
                "policy": p.to_string(), "name": s.name, "removed": s.removed,
                "budget": budgets[si], "kv_dtype": cfg.kv_dtype, "expected": sample.expected,
                "answer": o.text, "score": score, "kv_bytes": o.kv_bytes,
                "kv_bytes_full": o.kv_bytes_full,
                "seconds": o.prefill_secs + o.decode_secs,
                "prefill_secs": o.prefill_secs, "decode_secs": o.decode_secs,
                "shared_prefill": true,
                "query": cfg.ruler.query.name(),
                "context_tokens": sample.context_tokens,
            });
            self.records.write(&rec)?;
            self.rows.push(rec);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::budget;

    #[test]
    fn budget_rounds_kept_entries_up() {
        assert_eq!(budget(4000, 50), 2000);
        assert_eq!(budget(4001, 50), 2001);
        assert_eq!(budget(10, 90), 1);
        assert_eq!(budget(3, 99), 1);
    }
}
