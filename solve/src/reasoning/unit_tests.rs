//! Best-of-N on code judged by unit tests a model writes (the setting of
//! "Dynamic Scaling of Unit Tests for Code Reward Modeling", CodeRM): where
//! no test suite exists, the policy itself or a second model writes tests
//! for the problem, every candidate runs against every test in the sandbox,
//! and the pass matrix is the reward.
//!
//! The test writer's K replies are one engine request (one prefill, the
//! cache forked K ways, in requests of at most `MAX_N`), sampled while the
//! candidates are: both go to the engines at once, so their rows share
//! batches when one model writes both. Tests are read out of the replies by
//! [`verify::generated_tests`]; each candidate runs each test once in the
//! existing sandbox ([`verify::judge_many`]).
//!
//! Selection, as the paper scores a candidate: its reward is the number of
//! generated tests it passes, and the highest reward wins. Ties go to the
//! pass pattern most candidates share (programs that agree on every test are
//! likelier right than a lone one), then to the earliest candidate: Tern's
//! rule for every `reward` choice ([`verify::best_by_tests`]). A malformed,
//! wrong or endless test is a test every candidate fails; it costs its
//! sandbox time and changes no ranking.

use std::time::Instant;

use serde::{Deserialize, Serialize};

use super::{best_of_n_with, last_user_turn, Aggregate, BonRequest, BonResult, ReasoningError};
use crate::verify::{self, JudgeError, Limits};
use tern_runtime::chat::ChatMessage;
use tern_runtime::chat_prompt::ContentTokens;
use tern_runtime::engine::{EngineHandle, RequestStream, SubmitError, SubmitRequest, MAX_N};
use tern_runtime::error::RuntimeError;
use tern_runtime::sampler::SamplingParams;
use tern_runtime::LoadedModel;

/// The most tests one problem may ask for (`--generate-tests`, `tests=K`).
pub const MAX_GENERATED_TESTS: usize = 64;

/// Test reply `j` is seeded `seed + TEST_SEED_OFFSET + j`, away from the
/// candidates' `seed + i` (and, in `tern eval`, below the next task's
/// `seed + 1000`), so tests and candidates never share a sample.
pub const TEST_SEED_OFFSET: u64 = 500;

/// Where every test reply begins: the writer's turn is opened with a Python
/// block and its first `assert`, so a small model writes assertions rather
/// than its own solution of the problem (which it does, asked plainly, about
/// as often as not). The reply ends at the block's closing fence.
pub const REPLY_HEAD: &str = "```python\nassert";

/// How the tests are written.
#[derive(Clone, Debug)]
pub struct TestSpec {
    /// Most tests kept, and replies sampled (one per test asked for).
    pub k: usize,
    /// Most tokens per reply.
    pub max_tokens: usize,
    /// The replies' sampling (seeded from the request's seed, see
    /// [`TEST_SEED_OFFSET`]); a positive temperature gives distinct tests.
    pub temperature: f32,
    /// The replies' nucleus.
    pub top_p: f32,
}

/// Why tests could not be written or run. A bad test is never one of these:
/// it is a test the candidates fail.
#[derive(Debug, thiserror::Error)]
pub enum TestGenError {
    /// K outside `1..=MAX_GENERATED_TESTS`.
    #[error(
        "the number of tests to generate must be between 1 and {MAX_GENERATED_TESTS}, got {0}"
    )]
    Count(usize),
    /// The test writer's engine refused the request.
    #[error("writing unit tests: {0}")]
    Submit(#[source] SubmitError),
    /// Templating or generation failed in the test writer.
    #[error("writing unit tests: {0}")]
    Runtime(#[source] RuntimeError),
    /// The sandbox could not run the tests at all.
    #[error("running the generated tests: {0}")]
    Judge(#[source] JudgeError),
}

/// What the tests were and how every candidate did on them: a record from
/// which any selection over these candidates can be recomputed.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct GeneratedTests {
    /// The tests kept, in the order they were picked (at most K).
    pub tests: Vec<String>,
    /// The test writer's replies, in seed order, each from [`REPLY_HEAD`] on.
    pub replies: Vec<String>,
    /// The pass matrix: per candidate, one letter per test
    /// ([`verify::matrix_row`]: `P` pass, `F` fail, `T` timeout, `E` error).
    pub matrix: Vec<String>,
    /// Tokens the test writer generated.
    pub tokens: usize,
    /// Wall seconds until both the candidates and the replies were in.
    pub generate_seconds: f64,
    /// Wall seconds the sandbox took over the whole matrix.
    pub judge_seconds: f64,
}

/// The prompt that asks for tests of `problem` (a code task's signature and
/// docstring, or the user's question). It asks for assertions only, since
/// the candidate's code, not the writer's, is what runs against them.
pub fn test_prompt(problem: &str) -> String {
    format!(
        "Here is a Python programming problem:\n\n{}\n\nDo not solve it. Write unit tests \
         for it: Python `assert` statements that call the function with concrete inputs \
         and compare the result with the exact expected output, one assert per line. \
         Cover ordinary inputs and edge cases. Reply with one Python code block that \
         contains only the assert statements.",
        problem.trim()
    )
}

/// Best-of-N on `engine` judged by tests `tester` writes (it may be
/// `engine` itself): `req.n` candidates (candidate `i` seeded `seed + i`, as
/// every best-of-N run seeds them) and `spec.k` test replies, sampled at
/// once; then every candidate against every picked test, and the candidate
/// with the most passes chosen (the module's tie rule). `req.tests` is
/// ignored: the tests are the generated ones.
pub fn best_of_n_generated_tests(
    engine: &EngineHandle,
    tester: &EngineHandle,
    req: &BonRequest,
    spec: &TestSpec,
) -> Result<BonResult, ReasoningError> {
    if spec.k == 0 || spec.k > MAX_GENERATED_TESTS {
        return Err(TestGenError::Count(spec.k).into());
    }
    let sample = BonRequest {
        aggregate: Aggregate::Majority,
        adaptive: false,
        ..req.clone()
    };
    let problem = problem_of(req);
    let started = Instant::now();
    let (sampled, written) = std::thread::scope(|scope| {
        let candidates = scope.spawn(|| best_of_n_with(engine, engine, &sample));
        let written = write_tests(tester, &problem, req.sampling.seed, spec);
        let sampled = candidates
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
        (sampled, written)
    });
    let res = sampled?;
    let (replies, tokens) = written?;
    let generate_seconds = started.elapsed().as_secs_f64();
    judge_generated(req, spec, res, (replies, tokens), generate_seconds)
}

/// The second half of [`best_of_n_generated_tests`] for candidates already
/// sampled (`sampled`, from `req` with any aggregate): `spec.k` tests
/// written by `tester` now, every candidate judged on them, the most passes
/// chosen by the same rule. Dynamic allocation (`reward@N:tests=K:dynamic`)
/// samples every problem's candidates first, to learn how much they
/// disagree, and only then knows each problem's K. `generate_seconds` is
/// then the writer's time alone.
pub fn choose_by_generated_tests(
    tester: &EngineHandle,
    req: &BonRequest,
    spec: &TestSpec,
    sampled: BonResult,
) -> Result<BonResult, ReasoningError> {
    if spec.k == 0 || spec.k > MAX_GENERATED_TESTS {
        return Err(TestGenError::Count(spec.k).into());
    }
    let started = Instant::now();
    let written = write_tests(tester, &problem_of(req), req.sampling.seed, spec)?;
    let generate_seconds = started.elapsed().as_secs_f64();
    judge_generated(req, spec, sampled, written, generate_seconds)
}

/// What the tests are written for: a code task's prelude (signature and
/// docstring), else the user's last turn.
fn problem_of(req: &BonRequest) -> String {
    if req.prelude.trim().is_empty() {
        last_user_turn(&req.messages)
    } else {
        req.prelude.clone()
    }
}

/// Reads the tests out of `replies`, runs every candidate of `res` on them
/// and chooses (the module's rule), recording the matrix.
fn judge_generated(
    req: &BonRequest,
    spec: &TestSpec,
    mut res: BonResult,
    (replies, tokens): (Vec<String>, usize),
    generate_seconds: f64,
) -> Result<BonResult, ReasoningError> {
    let tests = tests_from_replies(&replies, spec.k);
    let programs: Vec<String> = res
        .candidates
        .iter()
        .map(|c| verify::with_prelude(&req.prelude, &verify::extract_code(&c.text)))
        .collect();
    let judged = Instant::now();
    let limits = Limits {
        cancel: req.cancel.clone(),
        ..Limits::default()
    };
    let reports = verify::judge_many(&programs, &tests, &limits).map_err(TestGenError::Judge)?;
    let judge_seconds = judged.elapsed().as_secs_f64();

    for (c, r) in res.candidates.iter_mut().zip(&reports) {
        c.passed = Some(r.passed);
    }
    // With no test at all every candidate ties on an empty pattern: the
    // earliest is chosen, as the rule says.
    let best = verify::best_by_tests(&reports).unwrap_or(0);
    res.answer = res.candidates[best].answer.clone();
    res.text = res.candidates[best].text.clone();
    res.chosen = Some(best);
    res.aggregate = Aggregate::Reward;
    res.tokens += tokens;
    res.tests_run = Some(tests.len());
    res.generated_tests = Some(GeneratedTests {
        matrix: reports.iter().map(verify::matrix_row).collect(),
        tests,
        replies,
        tokens,
        generate_seconds,
        judge_seconds,
    });
    Ok(res)
}

/// `spec.k` replies from `tester` to [`test_prompt`] over `problem`
/// ([`test_requests`], submitted as one unit), with the tokens they cost.
fn write_tests(
    tester: &EngineHandle,
    problem: &str,
    seed: u64,
    spec: &TestSpec,
) -> Result<(Vec<String>, usize), TestGenError> {
    let reqs = test_requests(tester.model(), problem, seed, spec)?;
    collect_replies(tester.submit_all(reqs).map_err(TestGenError::Submit)?)
}

/// The requests that ask `model` for `spec.k` test replies to `problem`
/// ([`test_prompt`], the reply opened with [`REPLY_HEAD`]): reply `j` seeded
/// `seed + TEST_SEED_OFFSET + j`, at most [`MAX_N`] replies a request. A
/// caller submits them beside its other work (in one unit with the
/// candidates when one engine does both, else on the writer's own engine),
/// so the tests are written while the candidates are, not after them.
pub fn test_requests(
    model: &LoadedModel,
    problem: &str,
    seed: u64,
    spec: &TestSpec,
) -> Result<Vec<SubmitRequest>, TestGenError> {
    if spec.k == 0 || spec.k > MAX_GENERATED_TESTS {
        return Err(TestGenError::Count(spec.k));
    }
    let mut prompt = model
        .chat_prompt(
            &[ChatMessage::new("user", test_prompt(problem))],
            ContentTokens::Special,
        )
        .map_err(TestGenError::Runtime)?;
    prompt.extend(
        model
            .tokenizer
            .encode(REPLY_HEAD, false, false)
            .map_err(TestGenError::Runtime)?,
    );
    let max_tokens = model.fit_max_tokens(prompt.len(), spec.max_tokens);
    let mut reqs = Vec::new();
    let mut first = 0;
    while first < spec.k {
        let n = (spec.k - first).min(MAX_N);
        let sampling = SamplingParams {
            temperature: spec.temperature,
            top_p: spec.top_p,
            seed: seed
                .wrapping_add(TEST_SEED_OFFSET)
                .wrapping_add(first as u64),
            ..SamplingParams::default()
        };
        let mut sub = SubmitRequest::new(prompt.clone(), sampling, max_tokens);
        sub.n = n;
        sub.stop = vec!["```".to_string()];
        reqs.push(sub);
        first += n;
    }
    Ok(reqs)
}

/// The replies of [`test_requests`]' streams, in seed order, each from
/// [`REPLY_HEAD`] on, with the tokens the writer generated.
pub fn collect_replies(streams: Vec<RequestStream>) -> Result<(Vec<String>, usize), TestGenError> {
    let mut replies = Vec::new();
    let mut tokens = 0;
    for stream in streams {
        let out = stream.collect_blocking().map_err(TestGenError::Runtime)?;
        for c in out.into_completions() {
            tokens += c.completion_tokens;
            replies.push(format!("{REPLY_HEAD}{}", c.text));
        }
    }
    Ok((replies, tokens))
}

/// The tests kept from a writer's replies: each reply parsed
/// ([`verify::parse_tests`]) and at most `k` picked round-robin over them
/// ([`verify::pick_tests`]).
pub fn tests_from_replies(replies: &[String], k: usize) -> Vec<String> {
    let per_reply: Vec<Vec<String>> = replies.iter().map(|r| verify::parse_tests(r)).collect();
    verify::pick_tests(&per_reply, k)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verify::{JudgeReport, Verdict};

    /// A report from a matrix row as records write it.
    fn row(letters: &str) -> JudgeReport {
        let verdicts: Vec<Verdict> = letters
            .chars()
            .map(|c| match c {
                'P' => Verdict::Pass,
                'T' => Verdict::Timeout,
                'E' => Verdict::Crash { stderr: "e".into() },
                _ => Verdict::Fail { reason: "f".into() },
            })
            .collect();
        JudgeReport {
            passed: verdicts.iter().filter(|v| v.passed()).count(),
            total: verdicts.len(),
            verdicts,
        }
    }

    fn choose(rows: &[&str]) -> Option<usize> {
        let reports: Vec<JudgeReport> = rows.iter().map(|r| row(r)).collect();
        let chosen = verify::best_by_tests(&reports);
        // The letters round-trip: a record's matrix recomputes the choice.
        for (r, letters) in reports.iter().zip(rows) {
            assert_eq!(verify::matrix_row(r), *letters);
        }
        chosen
    }

    #[test]
    fn most_passes_win_then_the_shared_pattern_then_the_earliest() {
        // Reward = passes: candidate 2 passes 3 of 4.
        assert_eq!(choose(&["PFFF", "PPFF", "PPPF", "FFFF"]), Some(2));
        // 0, 1 and 2 pass 2 each; 1 and 2 share a pattern, so 1 (the earlier).
        assert_eq!(choose(&["PPFF", "FPPT", "FPPE", "PFFF"]), Some(1));
        // A test every candidate fails (a wrong or malformed one) changes nothing.
        assert_eq!(choose(&["PFE", "PPE", "FFE"]), Some(1));
        // Equal passes, patterns all distinct: the earliest.
        assert_eq!(choose(&["PF", "FP"]), Some(0));
        // No test survived parsing: every candidate ties, the first is chosen.
        assert_eq!(choose(&["", "", ""]), Some(0));
    }

    #[test]
    fn the_prompt_shows_the_problem_and_asks_for_asserts_only() {
        let p = test_prompt("def add(a, b):\n    \"\"\"Sum.\"\"\"\n");
        assert!(p.contains("def add(a, b):"));
        assert!(p.contains("Do not solve it"));
        assert!(p.ends_with("only the assert statements."));
    }
}
