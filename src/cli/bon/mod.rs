//! `tern bon`: best-of-N on one question, aggregated by majority vote, a
//! CoT-based synthesizer or unit tests (given, or written by a model with
//! `--generate-tests K`), optionally stopping early once the answer is
//! settled (adaptive width).

use std::sync::Arc;

use anyhow::{bail, Context, Result};
use tern_runtime::chat::ChatMessage;
use tern_runtime::engine::{EngineConfig, EngineHandle};
use tern_runtime::sampler::SamplingParams;
use tern_solve::reasoning::{
    best_of_n_generated_tests, best_of_n_with, lacks_tests, Aggregate, BonRequest, BonResult,
    LengthPolicy, TestSpec, MAX_GENERATED_TESTS,
};

mod args;
mod spreadsheet;

use crate::cli::resolve;
pub use args::BonArgs;

/// Runs the subcommand with its parsed arguments.
pub fn run(a: &BonArgs) -> Result<()> {
    if let Some(source) = &a.spreadsheet {
        return spreadsheet::run(a, source);
    }
    if a.sheet_task.is_some() || a.select.is_some() || a.rounds.is_some() {
        bail!("--sheet-task, --select and --rounds are for a spreadsheet task's programs: add --spreadsheet SOURCE");
    }
    let question = a.prompt.text()?;
    let tests = match &a.tests {
        Some(path) => std::fs::read_to_string(path)
            .with_context(|| format!("reading --tests {}", path.display()))?
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| {
                // One test per line: a JSON string, or a bare Python statement.
                serde_json::from_str::<String>(l).unwrap_or_else(|_| l.to_string())
            })
            .collect(),
        None => Vec::new(),
    };
    if let Some(k) = a.generate_tests {
        if a.aggregate != Aggregate::Reward {
            bail!("--generate-tests writes unit tests for --aggregate reward; add it");
        }
        if k == 0 || k > MAX_GENERATED_TESTS {
            bail!("--generate-tests must be between 1 and {MAX_GENERATED_TESTS}, got {k}");
        }
    } else if lacks_tests(a.aggregate, &tests) {
        match &a.tests {
            Some(path) => bail!("--tests {} holds no tests", path.display()),
            None => bail!(
                "--aggregate reward scores candidates by unit tests: give --tests FILE (one Python assert per line) or --generate-tests K (a model writes K)"
            ),
        }
    }
    let length = LengthPolicy::new(a.reasoning_effort, a.thinking_budget, a.probe_every)?;
    let model = resolve::load(&a.model.model)?;
    let vocab = model.config().vocab_size;
    if let Some((id, _)) = a.logit_bias.iter().find(|(id, _)| *id as usize >= vocab) {
        bail!("--logit-bias names token {id}, but the model's vocabulary has {vocab} tokens");
    }
    let engine = EngineHandle::spawn(Arc::new(model), EngineConfig::default());
    let synthesizer = resolve::synthesizer(a.synthesizer_model.as_deref())?;
    let tester = resolve::tester(a.test_model.as_deref())?;
    let req = BonRequest {
        messages: a
            .system
            .iter()
            .map(|s| ChatMessage::new("system", s.as_str()))
            .chain([ChatMessage::new("user", question.as_str())])
            .collect(),
        n: a.n,
        sampling: SamplingParams {
            temperature: a.temperature,
            top_p: a.top_p,
            seed: a.seed,
            logit_bias: a.logit_bias.clone(),
            ..SamplingParams::default()
        },
        max_tokens: a.max_tokens,
        aggregate: a.aggregate,
        adaptive: a.adaptive,
        wave: a.wave,
        confidence: a.confidence,
        kv_policy: a.kv.kv_policy.clone(),
        tests,
        prelude: String::new(),
        length,
        cancel: Default::default(),
    };
    let t = std::time::Instant::now();
    let res = match a.generate_tests {
        // The tests are sampled as the candidates are, from their own seeds.
        Some(k) => {
            let spec = TestSpec {
                k,
                max_tokens: a.max_tokens,
                temperature: a.temperature,
                top_p: a.top_p,
            };
            best_of_n_generated_tests(&engine, tester.as_ref().unwrap_or(&engine), &req, &spec)?
        }
        None => best_of_n_with(&engine, synthesizer.as_ref().unwrap_or(&engine), &req)?,
    };
    let secs = t.elapsed().as_secs_f64();
    if a.model.json {
        let mut v = serde_json::to_value(&res)?;
        v["seconds"] = serde_json::json!(secs);
        println!("{v}");
        return Ok(());
    }
    for (i, c) in res.candidates.iter().enumerate() {
        let mark = if res.chosen == Some(i) { "*" } else { " " };
        eprintln!(
            "{mark} candidate {:>2}: answer {:<12} ({} tokens{})",
            i + 1,
            c.answer.as_deref().unwrap_or("-"),
            c.tokens,
            c.passed
                .map(|p| format!(", {p} tests passed"))
                .unwrap_or_default()
        );
        if let Some(l) = &c.length {
            let how = if l.stopped_early {
                "probes agreed"
            } else if l.hit_cap {
                "hit the cap"
            } else {
                "answered by itself"
            };
            eprintln!(
                "    reasoning {} of cap {} tokens ({how}), {} probes ({} tokens), {} saved",
                l.reasoning_tokens,
                l.cap,
                l.probes.len(),
                l.probe_tokens,
                l.tokens_saved
            );
        }
    }
    print_generated_tests(&res);
    println!("{}", res.text.trim());
    eprintln!(
        "[{:?}: answer {}; {} candidates{}, {} tokens, {:.1} s]",
        res.aggregate,
        res.answer.as_deref().unwrap_or("none"),
        res.candidates.len(),
        if res.candidates_saved > 0 {
            format!(" ({} saved by adaptive width)", res.candidates_saved)
        } else if res.forced_answer {
            " (the synthesis stated no answer: one was forced)".to_string()
        } else {
            String::new()
        },
        res.tokens,
        secs
    );
    Ok(())
}

/// With `--generate-tests`: the tests kept and the pass matrix, on stderr
/// (the chosen candidate's text is what goes to stdout).
fn print_generated_tests(res: &BonResult) {
    let Some(g) = &res.generated_tests else {
        return;
    };
    eprintln!(
        "{} generated tests kept from {} replies ({} tokens; sampling {:.1} s, sandbox {:.1} s):",
        g.tests.len(),
        g.replies.len(),
        g.tokens,
        g.generate_seconds,
        g.judge_seconds
    );
    for (j, t) in g.tests.iter().enumerate() {
        let shown = t.trim().replace('\n', "\n      ");
        eprintln!("  t{:<2} {shown}", j + 1);
    }
    eprintln!("pass matrix (candidate x test: P pass, F fail, T timeout, E error):");
    for (i, row) in g.matrix.iter().enumerate() {
        let mark = if res.chosen == Some(i) { "*" } else { " " };
        let passed = row.chars().filter(|&c| c == 'P').count();
        eprintln!(
            "{mark} candidate {:>2}: {row:<w$} {passed}/{}",
            i + 1,
            g.tests.len(),
            w = g.tests.len()
        );
    }
}
