//! Held-out sets drawn outside their training set.
//!
//! A generator's training set and its held-out set are one spec with two
//! seeds, and two seeds can still draw the same question: one-event stories
//! with one-digit numbers, or one-digit sums, have only so many distinct
//! texts. A held-out spec that names its training set
//! (`train_seed=S,train_count=N`: the same spec with seed S and count N)
//! skips every question that set holds, so the two share nothing by
//! construction. The questions it keeps are the ones the spec without the
//! two keys gives, in the same order; each skipped one is replaced by the
//! next question of the same seeded stream.
//!
//! Owns the two keys and the drawing; the generators (`story.rs`,
//! `arithmetic.rs`) supply a task stream per seed. Nothing here reads files.

use std::collections::HashSet;

use super::Task;

/// The training set a held-out spec stays out of: the same generator spec
/// with this seed and this count.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TrainingSet {
    /// The training set's generator seed (`train_seed`).
    pub seed: u64,
    /// How many tasks the training set holds (`train_count`).
    pub count: usize,
}

/// `train_seed` and `train_count` while a spec's options are read.
#[derive(Default)]
pub(super) struct TrainingKeys {
    seed: Option<u64>,
    count: Option<usize>,
}

impl TrainingKeys {
    /// Takes `k=v` when `k` is one of the two keys (`Ok(true)`); any other
    /// key is left to the generator (`Ok(false)`).
    pub(super) fn take(&mut self, k: &str, v: &str) -> Result<bool, String> {
        match k {
            "train_seed" => {
                self.seed = Some(
                    v.parse()
                        .map_err(|_| format!("train_seed: `{v}` is not an integer"))?,
                )
            }
            "train_count" => {
                self.count = Some(
                    v.parse()
                        .map_err(|_| format!("train_count: `{v}` is not a count"))?,
                )
            }
            _ => return Ok(false),
        }
        Ok(true)
    }

    /// The training set, when both keys were given; one without the other
    /// is an error.
    pub(super) fn finish(self) -> Result<Option<TrainingSet>, String> {
        match (self.seed, self.count) {
            (Some(seed), Some(count)) => Ok(Some(TrainingSet { seed, count })),
            (None, None) => Ok(None),
            _ => Err(
                "train_seed and train_count go together (the training set is this \
                      spec with that seed and count)"
                    .into(),
            ),
        }
    }
}

/// Draws allowed per task wanted (with a floor) before the spec is judged to
/// have too few distinct questions outside its training set.
const DRAWS_PER_TASK: usize = 100;
const MIN_DRAWS: usize = 10_000;

/// What makes two generated tasks the same task: a question's text, a
/// spreadsheet task's instruction.
pub(super) trait Keyed {
    /// The text a held-out task must not share with any training task.
    fn key(&self) -> &str;
}

impl Keyed for Task {
    fn key(&self) -> &str {
        &self.question
    }
}

/// `count` tasks of the stream `stream(seed)`; with `held_out_of`, only those
/// whose key (question) is not among the first `held_out_of.count` of
/// `stream(held_out_of.seed)`.
pub(super) fn generate<T: Keyed, I: Iterator<Item = T>>(
    count: usize,
    seed: u64,
    held_out_of: Option<TrainingSet>,
    stream: impl Fn(u64) -> I,
) -> Result<Vec<T>, String> {
    let Some(set) = held_out_of else {
        return Ok(stream(seed).take(count).collect());
    };
    let training: Vec<T> = stream(set.seed).take(set.count).collect();
    let seen: HashSet<&str> = training.iter().map(Keyed::key).collect();
    let limit = count.saturating_mul(DRAWS_PER_TASK).max(MIN_DRAWS);
    let mut draws = stream(seed).take(limit);
    let mut out = Vec::with_capacity(count);
    while out.len() < count {
        let Some(task) = draws.next() else {
            return Err(format!(
                "only {} of {count} tasks found outside the training set (seed {}, {} tasks) \
                 in {limit} draws: the spec has too few distinct questions for a disjoint \
                 held-out set",
                out.len(),
                set.seed,
                set.count
            ));
        };
        if !seen.contains(task.key()) {
            out.push(task);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::super::{load, ArithmeticSpec, StorySpec};
    use super::*;

    fn questions(tasks: &[Task]) -> HashSet<&str> {
        tasks.iter().map(|t| t.question.as_str()).collect()
    }

    /// Indices of the tasks of `tasks` whose question is in `pool`.
    fn shared(tasks: &[Task], pool: &HashSet<&str>) -> Vec<usize> {
        (0..tasks.len())
            .filter(|&i| pool.contains(tasks[i].question.as_str()))
            .collect()
    }

    #[test]
    fn a_held_out_set_skips_the_training_questions_and_keeps_the_rest_in_order() {
        let training = load("story:count=2000,seed=1,steps=1,cot=0").unwrap();
        let plain = load("story:count=200,seed=99,steps=1,cot=0").unwrap();
        let held =
            load("story:count=200,seed=99,steps=1,cot=0,train_seed=1,train_count=2000").unwrap();
        assert_eq!(held.len(), 200);
        let train_q = questions(&training);
        assert!(!shared(&plain, &train_q).is_empty());
        assert!(shared(&held, &train_q).is_empty());
        // Every story of the plain set outside the pool comes first, in order.
        let kept: Vec<&Task> = plain
            .iter()
            .filter(|t| !train_q.contains(t.question.as_str()))
            .collect();
        assert_eq!(held.iter().take(kept.len()).collect::<Vec<_>>(), kept);
    }

    /// What the records made before `train_seed` scored on: the docs give
    /// these overlaps, and scripts/tables.py leaves SPARSE_RL.md's 9 out to
    /// show what they changed.
    #[test]
    fn the_recorded_held_out_sets_overlap_their_training_sets_as_the_docs_say() {
        let pool = load("story:count=2000,seed=1,steps=1,cot=0").unwrap();
        let pool_q = questions(&pool);
        // docs/SPARSE_RL.md: 9 of the 200 held-out stories.
        let sparse = load("story:count=200,seed=99,steps=1,cot=0").unwrap();
        assert_eq!(
            shared(&sparse, &pool_q),
            [0, 37, 50, 58, 67, 132, 145, 149, 174]
        );
        // docs/REASONING.md: 6 of the 300 among the synthesizer's 800
        // training stories, 13 among the pool's 2000.
        let synth = load("story:count=300,seed=98,steps=1,cot=0").unwrap();
        assert_eq!(
            shared(&synth, &questions(&pool[..800])),
            [50, 100, 155, 208, 214, 238]
        );
        assert_eq!(shared(&synth, &pool_q).len(), 13);
        // docs/TRAINING.md: 66 of 100 arithmetic tasks in the 1000-task
        // pool; issue 58's SFT: 11 of 20 in its 200.
        for (train, plain, want) in [
            (
                "count=1000,seed=1,ops=add+sub+word",
                "count=100,seed=99,ops=add+sub+word",
                66,
            ),
            (
                "count=200,seed=1,ops=add+sub+word",
                "count=20,seed=99,ops=add+sub+word",
                11,
            ),
        ] {
            let train = load(&format!("arithmetic:{train}")).unwrap();
            let plain = load(&format!("arithmetic:{plain}")).unwrap();
            assert_eq!(shared(&plain, &questions(&train)).len(), want);
        }
    }

    #[test]
    fn the_keys_go_together_and_a_space_too_small_is_refused() {
        assert!(StorySpec::parse("train_seed=1")
            .unwrap_err()
            .contains("go together"));
        assert!(ArithmeticSpec::parse("train_count=5")
            .unwrap_err()
            .contains("go together"));
        assert!(StorySpec::parse("train_seed=x,train_count=3")
            .unwrap_err()
            .contains("train_seed"));
        // Every one-digit sum is among 1000 drawn ones: nothing is left.
        let err = load("arithmetic:count=20,seed=2,ops=add,train_seed=1,train_count=1000")
            .unwrap_err()
            .to_string();
        assert!(err.contains("outside the training set"), "{err}");
    }

    /// What a config or script of the repository trains on and scores on.
    struct Pair {
        /// The file the two specs are read from.
        file: String,
        training: String,
        held_out: String,
    }

    fn repo_path(path: &str) -> std::path::PathBuf {
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("..")
            .join(path)
    }

    fn read(path: &std::path::Path) -> String {
        std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
    }

    /// `key = "value"` of a flat TOML config, without a TOML parser.
    fn toml_value(text: &str, key: &str) -> Option<String> {
        text.lines().find_map(|l| {
            let (k, v) = l.split_once('=')?;
            (k.trim() == key).then(|| v.trim().trim_matches('"').to_string())
        })
    }

    /// The scripts' pairs as they are written (`$n` standing for each of
    /// the values after them); each must appear in its script verbatim, so
    /// this list cannot drift from what the scripts run.
    const SCRIPTED: [(&str, &str, &str, &[&str]); 4] = [
        // issue 29: the synthesizer's training stories and its held-out stories.
        (
            "scripts/synth29.sh",
            "story:count=2000,seed=1,steps=1,cot=0",
            "story:count=300,seed=98,steps=1,cot=0,train_seed=1,train_count=2000",
            &[],
        ),
        // issue 28: the story arms' exports, scored on the arms' held-out set.
        (
            "scripts/sparse28_export_eval.sh",
            "story:count=2000,seed=1,steps=1,cot=0",
            "story:count=200,seed=99,steps=1,cot=0,train_seed=1,train_count=2000",
            &[],
        ),
        // issue 58: SFT on arithmetic, 20 held out.
        (
            "scripts/train58.sh",
            "arithmetic:count=200,seed=1,ops=add+sub+word",
            "arithmetic:count=20,seed=99,ops=add+sub+word,train_seed=1,train_count=200",
            &[],
        ),
        // docs/SPARSE_RL.md's data selection, pools of 24 and 100 tasks.
        (
            "scripts/sparse_rerun.sh",
            "arithmetic:count=$n,seed=5,difficulty=1+2,ops=add+sub+word",
            "arithmetic:count=100,seed=98,difficulty=1+2,ops=add+sub+word,train_seed=5,train_count=$n",
            &["24", "100"],
        ),
    ];

    /// Every training/held-out pair the docs report results on: each
    /// trainer config under docs/ with an `eval_task`, and the scripts'.
    fn documented_pairs() -> Vec<Pair> {
        let mut pairs = Vec::new();
        for dir in ["docs/sparse", "docs/train"] {
            let mut files: Vec<_> = std::fs::read_dir(repo_path(dir))
                .unwrap_or_else(|e| panic!("reading {dir}: {e}"))
                .map(|e| e.unwrap().path())
                .filter(|p| p.extension().is_some_and(|x| x == "toml"))
                .collect();
            files.sort();
            for path in files {
                let text = read(&path);
                if let (Some(training), Some(held_out)) =
                    (toml_value(&text, "task"), toml_value(&text, "eval_task"))
                {
                    pairs.push(Pair {
                        file: path.display().to_string(),
                        training,
                        held_out,
                    });
                }
            }
        }
        for (file, training, held_out, values) in SCRIPTED {
            let text = read(&repo_path(file));
            for spec in [training, held_out] {
                assert!(
                    text.contains(spec),
                    "{file} does not use `{spec}`: update SCRIPTED"
                );
            }
            let values: &[&str] = if values.is_empty() { &["$n"] } else { values };
            for n in values {
                pairs.push(Pair {
                    file: file.to_string(),
                    training: training.replace("$n", n),
                    held_out: held_out.replace("$n", n),
                });
            }
        }
        pairs
    }

    #[test]
    fn every_documented_held_out_set_shares_no_task_with_its_training_set() {
        let pairs = documented_pairs();
        // story.toml, base.toml and grpo-arith.toml carry an eval_task.
        assert!(pairs.len() >= 8, "{} pairs", pairs.len());
        for p in &pairs {
            let training = load(&p.training).unwrap();
            let held_out = load(&p.held_out).unwrap();
            let train_q = questions(&training);
            let shared = held_out
                .iter()
                .filter(|t| train_q.contains(t.question.as_str()))
                .count();
            assert_eq!(
                shared,
                0,
                "{}: {shared} of {} held-out tasks of `{}` are in `{}`",
                p.file,
                held_out.len(),
                p.held_out,
                p.training
            );
        }
    }
}
