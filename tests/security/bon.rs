//! The suite through `tern bon --aggregate reward --tests`: the tiny model is
//! made to answer with an empty program (its end-of-sequence token biased
//! up), so each attack test runs against a program that loads.

use std::path::Path;

use super::fixture::{attacks, tiny_model, Attack, Expect, Host, SECRET};
use crate::support::{last_json, tern};

/// The tiny model's end-of-sequence id (models/tests/support/tiny.rs).
const EOS: u32 = 2;

fn run_bon(model: &Path, tests: &Path) -> std::process::Output {
    let bias = format!("{EOS}=100");
    tern(
        &[
            "bon",
            "-m",
            &model.display().to_string(),
            "-p",
            "Write a Python function.",
            "-n",
            "1",
            "--aggregate",
            "reward",
            "--tests",
            &tests.display().to_string(),
            "--logit-bias",
            &bias,
            "--max-tokens",
            "4",
            "--json",
        ],
        None,
    )
}

#[test]
fn every_attack_fails_through_tern_bon() {
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_model(&dir);
    let host = Host::new(&model);
    let attacks = attacks();
    let outcome = |attack: &Attack| -> Option<String> {
        let tests = dir.path().join(format!("{}.tests", attack.name));
        let line = serde_json::to_string(&host.render(attack)).unwrap();
        std::fs::write(&tests, format!("{line}\n")).unwrap();
        let out = run_bon(&model, &tests);
        let stdout = String::from_utf8_lossy(&out.stdout);
        if stdout.contains(SECRET) || String::from_utf8_lossy(&out.stderr).contains(SECRET) {
            return Some(format!("{}: the secret reached the output", attack.name));
        }
        if !out.status.success() {
            return Some(format!(
                "{}: tern bon failed: {}",
                attack.name,
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        let v = last_json(&out);
        let passed = v["candidates"][0]["passed"].as_u64();
        match (attack.expect, passed) {
            (_, None) => Some(format!("{}: no test result in {v}", attack.name)),
            (Expect::Refused, Some(p)) if p > 0 => {
                Some(format!("{}: the attack succeeded", attack.name))
            }
            _ => None,
        }
    };
    // Two at a time: each run is a fresh process with its own judge.
    let broken: Vec<String> = std::thread::scope(|s| {
        let halves: Vec<_> = [0, 1]
            .map(|h| {
                let attacks = &attacks;
                let outcome = &outcome;
                s.spawn(move || {
                    attacks
                        .iter()
                        .skip(h)
                        .step_by(2)
                        .filter_map(outcome)
                        .collect::<Vec<_>>()
                })
            })
            .into();
        halves.into_iter().flat_map(|h| h.join().unwrap()).collect()
    });
    let mut broken = broken;
    broken.extend(host.breaches());
    assert!(
        broken.is_empty(),
        "through tern bon:\n{}",
        broken.join("\n")
    );

    // A real test of the empty program still runs and passes.
    let tests = dir.path().join("ok.tests");
    std::fs::write(&tests, "assert 1 + 1 == 2\n").unwrap();
    let v = last_json(&run_bon(&model, &tests));
    assert_eq!(v["candidates"][0]["passed"], 1, "{v}");
}
