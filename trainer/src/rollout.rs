//! Rollouts through the runtime's engine: each prompt is one request with `n =
//! G` completions (prefilled once, cache forked), sampled with the serving
//! sampler under the run's KV policy, each token's log-probability recorded.

use std::sync::{mpsc, Arc};
use std::time::Instant;

use tern_models::EvictionLog;

use tern_runtime::chat::ChatMessage;
use tern_runtime::chat_prompt::ContentTokens;
use tern_runtime::engine::{EngineHandle, RequestStream, SubmitRequest};
use tern_runtime::kv::policy::KvPolicy;
use tern_runtime::sampler::SamplingParams;
use tern_runtime::LoadedModel;
use tern_solve::eval;
use tern_solve::reasoning;
use tern_solve::tasks::Task;
use tern_solve::verify;

use crate::error::{Result, TrainError};

/// One sampled completion (`Default`: empty, nothing measured).
#[derive(Clone, Debug, Default)]
pub struct Rollout {
    /// Its text.
    pub text: String,
    /// Its token ids (a final end-of-sequence token is not included).
    pub tokens: Vec<u32>,
    /// The sampler's log-probability of each token (the behaviour policy).
    pub logprobs: Vec<f64>,
    /// Answer tasks: 1 if the extracted answer matches the task's, else 0.
    /// Code tasks: the share of the tests run that its program passes.
    pub reward: f64,
    /// Most KV bytes its sequence held.
    pub kv_peak_bytes: usize,
    /// Bytes a full cache would have held for it.
    pub kv_full_bytes: usize,
    /// Cached entries the queries that sampled its tokens attended over,
    /// summed over queries, layers and KV heads ([`EvictionLog::attended`]);
    /// with [`Rollout::kv_attended_full`], the share of the KV it really
    /// kept. Both 0 where unmeasured (a full cache, a remote rollout).
    pub kv_attended: u64,
    /// What a full cache would have offered the same queries.
    pub kv_attended_full: u64,
    /// What its KV policy evicted and when (recorded when the spec asks).
    pub evictions: Option<Arc<EvictionLog>>,
}

/// A prompt's group of rollouts.
#[derive(Clone, Debug)]
pub struct Group {
    /// Index of the task in the run's task list.
    pub task: usize,
    /// The chat-templated prompt ids.
    pub prompt: Vec<u32>,
    /// The `G` completions, in index order.
    pub rollouts: Vec<Rollout>,
    /// The tests a model wrote for it and the pass matrix its rewards came
    /// from (`generated_tests:K`); `None` when the task gave the rewards.
    pub tests: Option<crate::reward::GroupTests>,
}

/// The prompt for a task: an optional system message and the question,
/// through the model's chat template; a base model (no template) gets
/// [`base_prompt`] instead, so base checkpoints fine-tune too.
pub fn prompt_ids(model: &LoadedModel, system: Option<&str>, task: &Task) -> Result<Vec<u32>> {
    if model.template.is_none() {
        let text = base_prompt(system, &task.question);
        return Ok(model.tokenizer.encode(&text, true, true)?);
    }
    let messages = ChatMessage::turn(system, &task.question);
    Ok(model.chat_prompt(&messages, ContentTokens::Special)?)
}

/// The plain-text prompt a model without a chat template is trained and
/// evaluated on: the system text, a blank line, then `Question: ...` and
/// `Answer:` on their own lines (the few-shot-free form base models continue
/// most readily; a completion then reads ` The answer is ...`).
pub fn base_prompt(system: Option<&str>, question: &str) -> String {
    let mut text = String::new();
    if let Some(s) = system.filter(|s| !s.is_empty()) {
        text.push_str(s);
        text.push_str("\n\n");
    }
    text.push_str("Question: ");
    text.push_str(question.trim());
    text.push_str("\nAnswer:");
    text
}

/// Reward of a completion: 1 when its extracted answer equals the task's.
pub fn reward(text: &str, task: &Task) -> f64 {
    match verify::extract_answer(text) {
        Some(got) if verify::answers_match(&got, &task.answer) => 1.0,
        _ => 0.0,
    }
}

/// Whether a completion solves its task outright: the right answer, or a
/// program that passes every one of the task's tests. Held-out accuracy
/// counts these, so it means the same for code as HumanEval's pass@1 (a
/// rollout's reward only sees the tests its group's difficulty called for).
pub fn solved(text: &str, task: &Task) -> Result<bool> {
    Ok(grade(text, task)?.ok)
}

/// A completion graded as `tern eval` grades it ([`eval::judge`]), its
/// answer extracted as [`reward`] extracts it.
pub fn grade(text: &str, task: &Task) -> Result<eval::Grade> {
    eval::judge(task, text, verify::extract_answer(text).as_deref()).map_err(|e| match e {
        eval::EvalError::Judge(e) => {
            TrainError::Rollout(format!("judging a held-out program: {e}"))
        }
        e => TrainError::Rollout(e.to_string()),
    })
}

/// Sets the rewards of one task's rollouts. Answer tasks: [`reward`]. Code
/// tasks: the share of tests each rollout's program passes, with the number
/// of tests scaled to the group's difficulty (every rollout runs a few
/// screening tests; more only where their pass patterns disagree, which is
/// where more tests tell rollouts apart), so rewards within a group compare
/// the same tests. Spreadsheet tasks: the share of test-case workbooks each
/// rollout's program solves (SpreadsheetBench's soft score).
pub fn score(rollouts: &mut [Rollout], task: &Task) -> Result<()> {
    if let Some(sheet) = &task.sheet {
        let limits = verify::spreadsheet::workbook_limits();
        for r in rollouts {
            let program = verify::extract_code(&r.text);
            let report = verify::spreadsheet::judge_workbooks(&program, sheet, &limits)
                .map_err(|e| TrainError::Rollout(format!("judging spreadsheet rollouts: {e}")))?;
            r.reward = report.soft();
        }
        return Ok(());
    }
    if !task.is_code() {
        for r in rollouts {
            r.reward = reward(&r.text, task);
        }
        return Ok(());
    }
    let programs: Vec<String> = rollouts
        .iter()
        .map(|r| task.program(&verify::extract_code(&r.text)))
        .collect();
    let judged = verify::judge_scaled(
        &programs,
        &task.tests,
        verify::SCREEN_TESTS,
        &verify::Limits::default(),
    )
    .map_err(|e| TrainError::Rollout(format!("judging code rollouts: {e}")))?;
    for (r, report) in rollouts.iter_mut().zip(&judged.reports) {
        r.reward = report.pass_rate();
    }
    Ok(())
}

/// Settings shared by every rollout of a step.
pub struct RolloutSpec<'a> {
    /// Completions per prompt.
    pub group_size: usize,
    /// Most new tokens per completion.
    pub max_new_tokens: usize,
    /// Sampling temperature.
    pub temperature: f32,
    /// KV policy of the rollouts.
    pub kv_policy: &'a KvPolicy,
    /// System message.
    pub system: Option<&'a str>,
    /// Record each rollout's evictions (for the `sparse-replay` learner).
    pub record_evictions: bool,
    /// Rewards from tests a model writes per group (`generated_tests:K`);
    /// `None`: from the task ([`score`]).
    pub tests: Option<&'a crate::reward::TestWriter<'a>>,
}

/// Sets one group's rewards: from tests `spec` has a model write now
/// (seeded `seed`, the group's request seed), else from the task
/// ([`score`]). For rollouts sampled elsewhere (a fleet's).
fn score_group(
    rollouts: &mut [Rollout],
    task: &Task,
    spec: &RolloutSpec<'_>,
    seed: u64,
) -> Result<Option<crate::reward::GroupTests>> {
    match spec.tests {
        Some(writer) => {
            crate::reward::score_by_generated_tests(rollouts, task, writer, seed).map(Some)
        }
        None => score(rollouts, task).map(|()| None),
    }
}

/// A sampled group on its way to the judge: its rollouts, and the test
/// writer's replies and tokens where the run's rewards come from them.
struct Sampled {
    group: Group,
    replies: Option<(Vec<String>, usize)>,
}

/// Sets a sampled group's rewards: from the tests in its writer's replies
/// (at most `k` kept), else from its task.
fn judge(mut s: Sampled, task: &Task, k: usize) -> Result<Group> {
    match s.replies {
        Some((replies, tokens)) => {
            s.group.tests = Some(crate::reward::score_by_replies(
                &mut s.group.rollouts,
                task,
                &replies,
                tokens,
                k,
            )?);
        }
        None => score(&mut s.group.rollouts, task)?,
    }
    Ok(s.group)
}

/// Rolls out every task in `picks` (indices into `tasks`); request `i` is
/// seeded `seed_base + 1000 i` (child `j`: `+ j`), so a step's rollouts are
/// the same whenever it runs. All requests are queued as one unit (see
/// `EngineHandle::submit_all`), so the engine batches them the same way.
///
/// Under `generated_tests:K` each group's test replies are asked for at the
/// same time (in that same unit when the policy writes them, else on the
/// writer's engine), so the tests are written while the rollouts are. A
/// judge thread scores each group as soon as it is in, so the sandbox runs
/// one group's programs while the engine is still sampling the others.
/// Returns the groups, in `picks` order, and the wall seconds spent.
pub fn rollout(
    engine: &EngineHandle,
    tasks: &[Task],
    picks: &[usize],
    spec: &RolloutSpec<'_>,
    seed_base: u64,
) -> Result<(Vec<Group>, f64)> {
    let t0 = Instant::now();
    let mut reqs = Vec::with_capacity(picks.len());
    let mut prompts = Vec::with_capacity(picks.len());
    let mut test_reqs = Vec::new();
    for (i, &ti) in picks.iter().enumerate() {
        let prompt = prompt_ids(engine.model(), spec.system, &tasks[ti])?;
        let seed = seed_base.wrapping_add(1000 * i as u64);
        let sampling = SamplingParams {
            temperature: spec.temperature,
            seed,
            // The learner scores at the sampling temperature: so do the
            // recorded log-probabilities the corrections compare with.
            tempered_logprobs: true,
            ..SamplingParams::default()
        };
        let mut req = SubmitRequest::new(prompt.clone(), sampling, spec.max_new_tokens);
        req.n = spec.group_size;
        req.logprobs = true;
        req.kv_policy = spec.kv_policy.clone();
        // Under a compressing policy the record measures the KV kept, even
        // where the learner does not replay it.
        req.record_evictions = spec.record_evictions || spec.kv_policy.budget().is_some();
        reqs.push(req);
        if let Some(writer) = spec.tests {
            let problem = crate::reward::problem(&tasks[ti]);
            let asked =
                reasoning::test_requests(writer.engine.model(), problem, seed, &writer.spec())
                    .map_err(|e| TrainError::Rollout(e.to_string()))?;
            test_reqs.push(asked);
        }
        prompts.push((ti, prompt));
    }
    let (streams, mut test_streams) = submit(engine, reqs, spec.tests, test_reqs)?;
    let k = spec.tests.map_or(0, |w| w.k);
    std::thread::scope(|scope| {
        let (tx, rx) = mpsc::channel::<(usize, Sampled)>();
        let judged = scope.spawn(move || -> Result<Vec<Group>> {
            let mut groups = Vec::new();
            for (ti, sampled) in rx {
                groups.push(judge(sampled, &tasks[ti], k)?);
            }
            Ok(groups)
        });
        let sampling = (|| -> Result<()> {
            for (i, ((ti, prompt), stream)) in prompts.into_iter().zip(streams).enumerate() {
                let collected = stream
                    .collect_blocking()
                    .map_err(|e| TrainError::Rollout(e.to_string()))?;
                let rollouts = rollouts_of(collected, prompt.len(), spec)?;
                let replies = match test_streams.get_mut(i) {
                    Some(asked) => Some(
                        reasoning::collect_replies(std::mem::take(asked))
                            .map_err(|e| TrainError::Rollout(e.to_string()))?,
                    ),
                    None => None,
                };
                let group = Group {
                    task: ti,
                    prompt,
                    rollouts,
                    tests: None,
                };
                if tx.send((ti, Sampled { group, replies })).is_err() {
                    // The judge stopped on an error; it is returned below.
                    break;
                }
            }
            Ok(())
        })();
        drop(tx);
        let groups = judged
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
        sampling?;
        groups
    })
    .map(|groups| (groups, t0.elapsed().as_secs_f64()))
}

/// Queues a step's rollout requests as one unit, and each group's test
/// requests (`test_reqs[i]` for group `i`) with them: in the same unit when
/// the policy's engine writes the tests, else as one unit on the writer's.
/// Returns the rollout streams and, per group, its test streams.
fn submit(
    engine: &EngineHandle,
    mut reqs: Vec<SubmitRequest>,
    writer: Option<&crate::reward::TestWriter<'_>>,
    test_reqs: Vec<Vec<SubmitRequest>>,
) -> Result<(Vec<RequestStream>, Vec<Vec<RequestStream>>)> {
    let failed = |e: tern_runtime::engine::SubmitError| TrainError::Rollout(e.to_string());
    let groups = reqs.len();
    let sizes: Vec<usize> = test_reqs.iter().map(Vec::len).collect();
    let flat: Vec<SubmitRequest> = test_reqs.into_iter().flatten().collect();
    let (streams, mut tests) = match writer {
        Some(w) if w.engine.same_engine(engine) => {
            reqs.extend(flat);
            let mut all = engine.submit_all(reqs).map_err(failed)?;
            let tests = all.split_off(groups);
            (all, tests)
        }
        Some(w) if !flat.is_empty() => {
            let tests = w.engine.submit_all(flat).map_err(failed)?;
            (engine.submit_all(reqs).map_err(failed)?, tests)
        }
        _ => (engine.submit_all(reqs).map_err(failed)?, Vec::new()),
    };
    let mut per_group = Vec::with_capacity(sizes.len());
    for n in sizes {
        let rest = tests.split_off(n);
        per_group.push(std::mem::replace(&mut tests, rest));
    }
    Ok((streams, per_group))
}

/// One group's completions as rollouts: tokens, the sampler's
/// log-probabilities and the KV each kept (`prompt_len` places the first
/// sampled token), reward 0 until judged.
fn rollouts_of(
    collected: tern_runtime::engine::Collected,
    prompt_len: usize,
    spec: &RolloutSpec<'_>,
) -> Result<Vec<Rollout>> {
    collected
        .into_completions()
        .into_iter()
        .map(|c| {
            let logprobs = c
                .logprobs
                .iter()
                .map(|l| l.logprob as f64)
                .collect::<Vec<_>>();
            if logprobs.len() != c.tokens.len() {
                return Err(TrainError::Rollout(
                    "the engine did not record log-probabilities".into(),
                ));
            }
            let kv = c.kv.ok_or_else(|| {
                TrainError::Rollout("a completion ended without its KV figures".into())
            })?;
            // Token t was sampled by the query at position prompt + t - 1.
            let (kv_attended, kv_attended_full) = match &kv.evictions {
                Some(log) => {
                    let from = prompt_len.saturating_sub(1) as u32;
                    log.attended(from, from + c.tokens.len() as u32)
                }
                None => (0, 0),
            };
            Ok(Rollout {
                text: c.text,
                tokens: c.tokens,
                logprobs,
                reward: 0.0,
                kv_peak_bytes: kv.bytes_peak,
                kv_full_bytes: kv.bytes_full,
                kv_attended,
                kv_attended_full,
                evictions: kv.evictions.filter(|_| spec.record_evictions),
            })
        })
        .collect()
}

/// [`rollout`] on a fleet of servers (`--rollout-endpoints`): the same
/// prompts and seeds (request `i` seeded `seed_base + 1000 i`), one
/// `/v1/completions` request per group under the adapter last published. A
/// group sampled under an older adapter is dropped when the run says so.
/// Returns the groups, the wall seconds and what each worker did.
pub fn rollout_remote(
    fleet: &crate::fleet::Fleet,
    model: &LoadedModel,
    tasks: &[Task],
    picks: &[usize],
    spec: &RolloutSpec<'_>,
    seed_base: u64,
) -> Result<(Vec<Group>, f64, crate::fleet::FleetStats)> {
    let t0 = Instant::now();
    let mut jobs = Vec::with_capacity(picks.len());
    for (i, &ti) in picks.iter().enumerate() {
        jobs.push(crate::fleet::Job {
            prompt: prompt_ids(model, spec.system, &tasks[ti])?,
            n: spec.group_size,
            seed: seed_base.wrapping_add(1000 * i as u64),
            temperature: spec.temperature,
            max_tokens: spec.max_new_tokens,
            kv_policy: spec.kv_policy.to_string(),
        });
    }
    let (answers, stats) = fleet.run(&jobs)?;
    let mut groups = Vec::with_capacity(answers.len());
    for ((&ti, job), answer) in picks.iter().zip(jobs).zip(answers) {
        if fleet.drops(&answer) {
            continue;
        }
        let mut rollouts: Vec<Rollout> = answer
            .completions
            .into_iter()
            .map(|c| Rollout {
                text: c.text,
                tokens: c.tokens,
                logprobs: c.logprobs,
                reward: 0.0,
                kv_peak_bytes: c.kv_peak_bytes,
                kv_full_bytes: c.kv_full_bytes,
                kv_attended: 0,
                kv_attended_full: 0,
                evictions: None,
            })
            .collect();
        let tests = score_group(&mut rollouts, &tasks[ti], spec, job.seed)?;
        groups.push(Group {
            task: ti,
            prompt: job.prompt,
            rollouts,
            tests,
        });
    }
    Ok((groups, t0.elapsed().as_secs_f64(), stats))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rollout(text: &str) -> Rollout {
        Rollout {
            text: text.into(),
            reward: -1.0,
            ..Rollout::default()
        }
    }

    #[test]
    fn code_rollouts_earn_the_share_of_tests_they_pass() {
        let task = Task {
            question: "Write add(a, b).".into(),
            answer: String::new(),
            difficulty: None,
            tests: vec![
                "assert add(1, 2) == 3".into(),
                "assert add(0, 0) == 0".into(),
                "assert add(-2, 2) == 0".into(),
                "assert add(5, 5) == 10".into(),
            ],
            prelude: String::new(),
            target: None,
            sheet: None,
        };
        let mut group = vec![
            rollout("```python\ndef add(a, b):\n    return a + b\n```"),
            // Right only where the sum is 0: tests 2 and 3.
            rollout("```python\ndef add(a, b):\n    return 0\n```"),
            rollout("I cannot write code."),
        ];
        score(&mut group, &task).unwrap();
        let rewards: Vec<f64> = group.iter().map(|r| r.reward).collect();
        // The 2 screening tests split the group three ways (disagreement
        // 2/3), so 2 + round(2 * 2/3) = 3 of the 4 tests ran.
        assert_eq!(rewards, vec![1.0, 2.0 / 3.0, 0.0]);
        // Held out, only the program passing all 4 tests counts as solved.
        let solves: Vec<bool> = group
            .iter()
            .map(|r| solved(&r.text, &task).unwrap())
            .collect();
        assert_eq!(solves, vec![true, false, false]);
        let answer = Task::answer("2 + 2?".into(), "4".into(), None);
        let mut group = vec![rollout("The answer is 4."), rollout("5")];
        score(&mut group, &answer).unwrap();
        assert_eq!((group[0].reward, group[1].reward), (1.0, 0.0));
        assert!(solved("The answer is 4.", &answer).unwrap());
        assert!(!solved("5", &answer).unwrap());
    }

    #[test]
    fn spreadsheet_rollouts_earn_the_share_of_workbooks_they_solve() {
        let tasks = tern_solve::tasks::load("spreadsheet:count=1,seed=7").unwrap();
        let task = &tasks[0];
        let sheet = task.sheet.as_ref().unwrap();
        assert!(task.question.contains(&sheet.instruction));
        let fenced = |p: &str| format!("Here it is:\n```python\n{p}\n```");
        let unchanged = "import openpyxl\nopenpyxl.load_workbook('input.xlsx').save('output.xlsx')";
        let mut group = vec![
            rollout(&fenced(&sheet.reference)),
            rollout(&fenced(unchanged)),
            rollout("I cannot write code."),
        ];
        score(&mut group, task).unwrap();
        let rewards: Vec<f64> = group.iter().map(|r| r.reward).collect();
        assert_eq!(rewards, vec![1.0, 0.0, 0.0]);
        assert!(solved(&group[0].text, task).unwrap());
        assert!(!solved(&group[1].text, task).unwrap());
    }
}
