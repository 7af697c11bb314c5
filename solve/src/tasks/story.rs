//! Built-in multi-step word problems: a person starts with some things and
//! several events change the count (buying more, giving some away, packs of
//! several, sharing into equal bags), so the answer takes a few sentences of
//! reasoning rather than one sum.
//!
//! Why: the Sparse-RL paper compresses the KV cache of long responses; a
//! one-line answer leaves nothing to compress. Stories of 2-4 steps with
//! one-digit numbers take SmolLM2-135M 100-300 tokens to work through, and it
//! gets some of them right, the range RL learns in. Deterministic for a seed
//! (ChaCha8): a training set and a held-out set are one spec with two seeds,
//! the held-out one naming the training set so that it skips its stories
//! (`train_seed=1,train_count=2000`; `held_out.rs`).

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::held_out::{self, TrainingKeys, TrainingSet};
use super::Task;

/// `story:count=N,seed=S,steps=2+3,digits=1,cot=1[,train_seed=T,train_count=M]`.
#[derive(Clone, Debug, PartialEq)]
pub struct StorySpec {
    /// How many tasks (default 100).
    pub count: usize,
    /// Generator seed (default 0).
    pub seed: u64,
    /// Events after the opening sentence, one drawn per task (default 2 or 3);
    /// the task's difficulty.
    pub steps: Vec<u32>,
    /// Digits of the starting count and of amounts bought or given (1 or 2;
    /// pack sizes and bag counts stay 2 to 5).
    pub digits: u32,
    /// Whether the question ends asking to work it out step by step
    /// (default yes).
    pub cot: bool,
    /// The training set a held-out set stays out of (`train_seed`,
    /// `train_count`): none of its stories is drawn.
    pub held_out_of: Option<TrainingSet>,
}

impl Default for StorySpec {
    fn default() -> Self {
        StorySpec {
            count: 100,
            seed: 0,
            steps: vec![2, 3],
            digits: 1,
            cot: true,
            held_out_of: None,
        }
    }
}

impl StorySpec {
    /// Parses the `k=v,...` options after `story:`; unknown keys are errors.
    pub fn parse(options: &str) -> Result<StorySpec, String> {
        let mut spec = StorySpec::default();
        let mut training = TrainingKeys::default();
        for (k, v) in super::options(options)? {
            if training.take(k, v)? {
                continue;
            }
            let bad = |what: &str| format!("{k}: `{v}` is not {what}");
            match k {
                "count" => spec.count = v.parse().map_err(|_| bad("a count"))?,
                "seed" => spec.seed = v.parse().map_err(|_| bad("an integer"))?,
                "steps" => spec.steps = super::levels(k, v, 1..=6, "events per story")?,
                "digits" => {
                    spec.digits = v.parse().map_err(|_| bad("1 or 2"))?;
                    if !(1..=2).contains(&spec.digits) {
                        return Err("digits must be 1 or 2".into());
                    }
                }
                "cot" => {
                    spec.cot = match v {
                        "1" | "true" => true,
                        "0" | "false" => false,
                        _ => return Err(bad("0 or 1")),
                    }
                }
                other => {
                    return Err(format!(
                        "unknown key `{other}` (keys: count, seed, steps, digits, cot, \
                         train_seed, train_count)"
                    ))
                }
            }
        }
        spec.held_out_of = training.finish()?;
        Ok(spec)
    }

    /// The tasks, the same for the same spec; an error only when a held-out
    /// spec cannot find `count` stories outside its training set.
    pub fn generate(&self) -> Result<Vec<Task>, String> {
        held_out::generate(self.count, self.seed, self.held_out_of, |seed| {
            self.stream(seed)
        })
    }

    /// This spec's endless story stream under `seed`.
    fn stream(&self, seed: u64) -> impl Iterator<Item = Task> + '_ {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        std::iter::repeat_with(move || {
            let steps = match self.steps.as_slice() {
                [s] => *s,
                ss => ss[rng.gen_range(0..ss.len())],
            };
            story(&mut rng, steps, self.digits, self.cot)
        })
    }
}

/// Names with their subject and object pronouns.
const PEOPLE: [(&str, &str, &str); 8] = [
    ("Sam", "he", "him"),
    ("Mia", "she", "her"),
    ("Leo", "he", "him"),
    ("Ava", "she", "her"),
    ("Noah", "he", "him"),
    ("Zoe", "she", "her"),
    ("Omar", "he", "him"),
    ("Lena", "she", "her"),
];
const THINGS: [&str; 8] = [
    "apples", "marbles", "books", "stickers", "coins", "pencils", "cookies", "stamps",
];

fn amount(rng: &mut ChaCha8Rng, digits: u32) -> i64 {
    if digits == 1 {
        rng.gen_range(2..10)
    } else {
        rng.gen_range(10..40)
    }
}

fn capitalized(s: &str) -> String {
    let mut c = s.chars();
    c.next()
        .map(|f| f.to_uppercase().chain(c).collect())
        .unwrap_or_default()
}

fn story(rng: &mut ChaCha8Rng, steps: u32, digits: u32, cot: bool) -> Task {
    let who = rng.gen_range(0..PEOPLE.len());
    let (name, he, him) = PEOPLE[who];
    let other = PEOPLE[(who + rng.gen_range(1..PEOPLE.len())) % PEOPLE.len()].0;
    let thing = THINGS[rng.gen_range(0..THINGS.len())];
    let he_cap = capitalized(he);
    let mut x = amount(rng, digits) + amount(rng, digits);
    let mut text = format!("{name} has {x} {thing}.");
    for _ in 0..steps {
        // Events that keep the count a whole number of things, drawn until one fits.
        loop {
            let sentence = match rng.gen_range(0..5) {
                0 => {
                    let b = amount(rng, digits);
                    x += b;
                    format!(" {he_cap} buys {b} more.")
                }
                1 => {
                    let b = amount(rng, digits);
                    if b > x {
                        continue;
                    }
                    x -= b;
                    format!(" {he_cap} gives {b} to {other}.")
                }
                2 => {
                    let (k, m) = (rng.gen_range(2..6), rng.gen_range(2..6));
                    x += k * m;
                    format!(" {he_cap} buys {k} packs with {m} {thing} in each pack.")
                }
                3 => {
                    let b = amount(rng, digits);
                    x += b;
                    format!(" {other} gives {him} {b} {thing}.")
                }
                _ => {
                    let k = rng.gen_range(2..5);
                    if x < k || x % k != 0 {
                        continue;
                    }
                    x /= k;
                    format!(" {he_cap} shares them equally among {k} bags and keeps only one bag.")
                }
            };
            text.push_str(&sentence);
            break;
        }
    }
    let ask = if cot {
        " Work it out step by step."
    } else {
        ""
    };
    let question = format!("{text} How many {thing} does {name} have now?{ask}");
    Task::answer(question, x.to_string(), Some(steps))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Replays a story's sentences to recompute its answer.
    fn solve(q: &str) -> i64 {
        let words: Vec<&str> = q.split_whitespace().collect();
        let num = |w: &str| w.trim_end_matches('.').parse::<i64>().ok();
        let mut x = num(words[2]).expect("opening count");
        for (i, w) in words.iter().enumerate() {
            match *w {
                "buys" if words[i + 2] == "more." => x += num(words[i + 1]).unwrap(),
                "buys" => x += num(words[i + 1]).unwrap() * num(words[i + 4]).unwrap(),
                "gives" if num(words[i + 1]).is_some() => x -= num(words[i + 1]).unwrap(),
                "gives" => x += num(words[i + 2]).unwrap(),
                "among" => x /= num(words[i + 1]).unwrap(),
                _ => {}
            }
        }
        x
    }

    #[test]
    fn answers_follow_the_story_and_stay_whole() {
        let spec = StorySpec::parse("count=300,seed=5,steps=1+2+3+4").unwrap();
        let tasks = spec.generate().unwrap();
        for t in &tasks {
            let x: i64 = t.answer.parse().unwrap();
            assert!(x >= 0, "{}", t.question);
            assert_eq!(solve(&t.question), x, "{}", t.question);
            let events = t.question.matches(". ").count() - 1;
            assert_eq!(events as u32, t.difficulty.unwrap(), "{}", t.question);
        }
        // Every kind of event occurs.
        for kind in ["more.", "packs", "gives him", "gives her", "bags", " to "] {
            assert!(
                tasks.iter().any(|t| t.question.contains(kind)),
                "no `{kind}` event"
            );
        }
    }

    #[test]
    fn same_seed_same_tasks_other_seed_other_tasks() {
        let a = StorySpec::parse("count=20,seed=1").unwrap();
        assert_eq!(a.generate(), a.generate());
        assert_eq!(a.generate().unwrap().len(), 20);
        let b = StorySpec::parse("count=20,seed=2").unwrap();
        assert_ne!(a.generate(), b.generate());
    }

    #[test]
    fn bad_specs_name_the_problem() {
        assert!(StorySpec::parse("steps=0").unwrap_err().contains("1 to 6"));
        assert!(StorySpec::parse("digits=3").unwrap_err().contains("1 or 2"));
        assert!(StorySpec::parse("size=3")
            .unwrap_err()
            .contains("unknown key"));
        assert!(StorySpec::parse("count=x").unwrap_err().contains("count"));
        assert!(StorySpec::parse("cot=yes").unwrap_err().contains("0 or 1"));
    }
}
