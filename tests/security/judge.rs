//! The suite through the judge itself and through the trainer's code rewards
//! (a reward-hacking policy writes the attack as its program).

use std::sync::Arc;

use tern_solve::tasks::Task;
use tern_solve::verify::{judge_many, Limits, Verdict};
use tern_trainer::rollout::{score, Rollout};

use super::fixture::{attacks, judge_outcome, summary, tiny_model, Expect, Host};

#[test]
fn every_attack_fails_as_a_test_and_as_a_program() {
    let models = tempfile::tempdir().unwrap();
    let host = Host::new(&tiny_model(&models));
    let attacks = attacks();
    let limits = Limits::default();
    let mut broken = Vec::new();

    // As tests (what an API client sends) after a harmless program.
    let tests: Vec<String> = attacks.iter().map(|a| host.render(a)).collect();
    let reports = judge_many(&["x = 1\n".to_string()], &tests, &limits).expect("the judge runs");
    for (attack, verdict) in attacks.iter().zip(&reports[0].verdicts) {
        eprintln!(
            "{:<24} {:<60} {}",
            attack.name,
            attack.what,
            summary(verdict)
        );
        broken.extend(judge_outcome(attack, verdict));
    }
    // As programs (what a model writes) before a test that always passes.
    let programs = tests.clone();
    let reports = judge_many(&programs, &["pass".to_string()], &limits).expect("the judge runs");
    for (attack, report) in attacks.iter().zip(&reports) {
        broken.extend(
            judge_outcome(attack, &report.verdicts[0]).map(|b| format!("as a program: {b}")),
        );
    }
    broken.extend(host.breaches());
    assert!(
        broken.is_empty(),
        "the sandbox was breached:\n{}",
        broken.join("\n")
    );

    // The judge still works afterwards.
    let ok = judge_many(
        &["def add(a, b):\n    return a + b\n".to_string()],
        &["assert add(2, 3) == 5".to_string()],
        &limits,
    )
    .unwrap();
    assert_eq!(ok[0].verdicts, vec![Verdict::Pass]);
}

#[test]
fn every_attack_earns_no_reward_in_training() {
    let models = tempfile::tempdir().unwrap();
    let host = Host::new(&tiny_model(&models));
    let attacks = attacks();
    let mut rollouts: Vec<Rollout> = attacks
        .iter()
        .map(|a| Rollout {
            text: format!("Here is my solution.\n```python\n{}\n```\n", host.render(a)),
            tokens: Vec::new(),
            logprobs: Vec::new(),
            reward: -1.0,
            kv_peak_bytes: 0,
            kv_full_bytes: 0,
            kv_attended: 0,
            kv_attended_full: 0,
            evictions: None::<Arc<_>>,
        })
        .collect();
    let task = Task {
        question: "Write a function.".into(),
        answer: String::new(),
        difficulty: None,
        tests: vec!["pass".into()],
        prelude: String::new(),
        target: None,
        sheet: None,
    };
    score(&mut rollouts, &task).expect("code rewards are computed");
    let rewarded: Vec<&str> = attacks
        .iter()
        .zip(&rollouts)
        .filter(|(a, r)| a.expect == Expect::Refused && r.reward != 0.0)
        .map(|(a, _)| a.name.as_str())
        .collect();
    assert!(rewarded.is_empty(), "attacks rewarded: {rewarded:?}");
    let breaches = host.breaches();
    assert!(breaches.is_empty(), "{breaches:?}");
    // A real solution still earns its reward.
    let mut good = vec![Rollout {
        text: "```python\nx = 1\n```".into(),
        reward: 0.0,
        ..rollouts[0].clone()
    }];
    score(&mut good, &task).unwrap();
    assert_eq!(good[0].reward, 1.0);
}
