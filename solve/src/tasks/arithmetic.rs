//! Built-in arithmetic tasks: bare sums, differences and products, and short
//! word problems, with difficulty as the operands' digit count.
//!
//! Deterministic for a seed (ChaCha8), so a training set and a held-out set are
//! the same spec with two seeds, the held-out one naming the training set so
//! that it skips its questions (`train_seed=1,train_count=1000`;
//! `held_out.rs`). SmolLM2-135M gets one-digit sums mostly right
//! and two-digit ones rarely, which is the range RL needs.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::held_out::{self, TrainingKeys, TrainingSet};
use super::Task;

/// One kind of question.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// `a + b`.
    Add,
    /// `a - b` with `a >= b`.
    Sub,
    /// `a * b`, `b` one digit.
    Mul,
    /// A one-sentence story with a sum or a difference.
    Word,
}

impl Op {
    fn parse(s: &str) -> Result<Op, String> {
        Ok(match s {
            "add" => Op::Add,
            "sub" => Op::Sub,
            "mul" => Op::Mul,
            "word" => Op::Word,
            other => return Err(format!("unknown op `{other}` (use add, sub, mul, word)")),
        })
    }
}

/// `arithmetic:count=N,seed=S,difficulty=D,ops=add+sub+mul+word`; `difficulty`
/// may be a mix such as `1+2` (each task draws one uniformly), a pool where
/// some tasks are out of reach, which difficulty-aware selection learns to skip;
/// `train_seed=T,train_count=M` makes it a held-out set outside that training set.
#[derive(Clone, Debug, PartialEq)]
pub struct ArithmeticSpec {
    /// How many tasks (default 100).
    pub count: usize,
    /// Generator seed (default 0).
    pub seed: u64,
    /// Digits per operand, 1 to 6, one drawn per task (default 1).
    pub difficulty: Vec<u32>,
    /// Kinds drawn uniformly (default add and sub).
    pub ops: Vec<Op>,
    /// The training set a held-out set stays out of (`train_seed`,
    /// `train_count`): none of its questions is drawn.
    pub held_out_of: Option<TrainingSet>,
}

impl Default for ArithmeticSpec {
    fn default() -> Self {
        ArithmeticSpec {
            count: 100,
            seed: 0,
            difficulty: vec![1],
            ops: vec![Op::Add, Op::Sub],
            held_out_of: None,
        }
    }
}

impl ArithmeticSpec {
    /// Parses the `k=v,...` options after `arithmetic:`; unknown keys are errors.
    pub fn parse(options: &str) -> Result<ArithmeticSpec, String> {
        let mut spec = ArithmeticSpec::default();
        let mut training = TrainingKeys::default();
        for (k, v) in super::options(options)? {
            if training.take(k, v)? {
                continue;
            }
            let bad = |what: &str| format!("{k}: `{v}` is not {what}");
            match k {
                "count" => spec.count = v.parse().map_err(|_| bad("a count"))?,
                "seed" => spec.seed = v.parse().map_err(|_| bad("an integer"))?,
                "difficulty" => spec.difficulty = super::levels(k, v, 1..=6, "digits per operand")?,
                "ops" => {
                    spec.ops = v.split('+').map(Op::parse).collect::<Result<_, _>>()?;
                    if spec.ops.is_empty() {
                        return Err("ops is empty".into());
                    }
                }
                other => {
                    return Err(format!(
                        "unknown key `{other}` (keys: count, seed, difficulty, ops, \
                         train_seed, train_count)"
                    ))
                }
            }
        }
        spec.held_out_of = training.finish()?;
        Ok(spec)
    }

    /// The tasks, the same for the same spec; an error only when a held-out
    /// spec cannot find `count` questions outside its training set.
    pub fn generate(&self) -> Result<Vec<Task>, String> {
        held_out::generate(self.count, self.seed, self.held_out_of, |seed| {
            self.stream(seed)
        })
    }

    /// This spec's endless question stream under `seed`.
    fn stream(&self, seed: u64) -> impl Iterator<Item = Task> + '_ {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        std::iter::repeat_with(move || {
            let op = self.ops[rng.gen_range(0..self.ops.len())];
            // One level draws nothing, so single-level pools stay as they were.
            let digits = match self.difficulty.as_slice() {
                [d] => *d,
                ds => ds[rng.gen_range(0..ds.len())],
            };
            one(&mut rng, op, digits)
        })
    }
}

fn operand(rng: &mut ChaCha8Rng, digits: u32) -> i64 {
    let hi = 10i64.pow(digits);
    let lo = if digits == 1 { 1 } else { hi / 10 };
    rng.gen_range(lo..hi)
}

const NAMES: [&str; 8] = ["Sam", "Mia", "Leo", "Ava", "Noah", "Zoe", "Omar", "Lena"];
const THINGS: [&str; 8] = [
    "apples", "marbles", "books", "stickers", "coins", "pencils", "cookies", "stamps",
];

fn one(rng: &mut ChaCha8Rng, op: Op, digits: u32) -> Task {
    let (a, b) = (operand(rng, digits), operand(rng, digits));
    let (question, answer) = match op {
        Op::Add => (format!("What is {a} + {b}?"), a + b),
        Op::Sub => {
            let (a, b) = (a.max(b), a.min(b));
            (format!("What is {a} - {b}?"), a - b)
        }
        Op::Mul => {
            let b = operand(rng, 1);
            (format!("What is {a} * {b}?"), a * b)
        }
        Op::Word => {
            let name = NAMES[rng.gen_range(0..NAMES.len())];
            let thing = THINGS[rng.gen_range(0..THINGS.len())];
            if rng.gen_bool(0.5) {
                (
                    format!(
                        "{name} has {a} {thing} and gets {b} more. How many {thing} does {name} have now?"
                    ),
                    a + b,
                )
            } else {
                let (a, b) = (a.max(b), a.min(b));
                (
                    format!(
                        "{name} has {a} {thing} and gives away {b}. How many {thing} does {name} have left?"
                    ),
                    a - b,
                )
            }
        }
    };
    Task::answer(question, answer.to_string(), Some(digits))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_tasks_other_seed_other_tasks() {
        let spec = ArithmeticSpec::parse("count=50,seed=7,ops=add+sub+mul+word").unwrap();
        assert_eq!(spec.generate(), spec.generate());
        let other = ArithmeticSpec {
            seed: 8,
            ..spec.clone()
        }
        .generate()
        .unwrap();
        assert_ne!(spec.generate().unwrap(), other);
    }

    #[test]
    fn answers_are_right_and_operands_have_the_digits() {
        let spec = ArithmeticSpec::parse("count=200,seed=1,difficulty=2,ops=add+sub+mul").unwrap();
        for t in spec.generate().unwrap() {
            let q = t
                .question
                .trim_start_matches("What is ")
                .trim_end_matches('?');
            let parts: Vec<&str> = q.split(' ').collect();
            let (a, op, b): (i64, &str, i64) = (
                parts[0].parse().unwrap(),
                parts[1],
                parts[2].parse().unwrap(),
            );
            assert!((10..100).contains(&a), "{}", t.question);
            let want = match op {
                "+" => a + b,
                "-" => a - b,
                "*" => a * b,
                _ => unreachable!(),
            };
            assert_eq!(t.answer, want.to_string(), "{}", t.question);
            assert!(want >= 0);
        }
    }

    #[test]
    fn bad_specs_name_the_problem() {
        assert!(ArithmeticSpec::parse("count=x")
            .unwrap_err()
            .contains("count"));
        assert!(ArithmeticSpec::parse("size=3")
            .unwrap_err()
            .contains("unknown key"));
        assert!(ArithmeticSpec::parse("ops=add+div")
            .unwrap_err()
            .contains("div"));
        assert!(ArithmeticSpec::parse("difficulty=9")
            .unwrap_err()
            .contains("1 to 6"));
        assert!(ArithmeticSpec::parse("difficulty=1+7")
            .unwrap_err()
            .contains("1 to 6"));
        assert!(ArithmeticSpec::parse("difficulty=1+")
            .unwrap_err()
            .contains("mix"));
    }

    #[test]
    fn a_difficulty_mix_draws_every_level() {
        let mixed = ArithmeticSpec::parse("count=200,seed=3,difficulty=1+2").unwrap();
        let levels: Vec<u32> = mixed
            .generate()
            .unwrap()
            .iter()
            .map(|t| t.difficulty.unwrap())
            .collect();
        let ones = levels.iter().filter(|&&d| d == 1).count();
        assert!((60..140).contains(&ones), "{ones} one-digit tasks of 200");
        assert!(levels.iter().all(|&d| d == 1 || d == 2));
    }
}
