//! The seeded generator: `spreadsheet:count=N,seed=S[,kinds=a+b][,train_seed=T,train_count=M]`.
//!
//! Each task draws its kind, then its layout once and the values of every
//! test case, from one ChaCha8 stream, so a spec always gives the same tasks
//! and workbooks. A held-out spec names its training set and skips every
//! task whose instruction that set holds (`held_out.rs`): no held-out
//! instruction is ever emitted for training.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::super::held_out::{self, Keyed, TrainingKeys, TrainingSet};
use super::workbook::{Sheet, Workbook};
use super::{cells, reshape, Case, Kind, Source, SpreadsheetTask};

/// A spreadsheet generator spec.
#[derive(Clone, Debug, PartialEq)]
pub struct SpreadsheetSpec {
    /// How many tasks (default 300).
    pub count: usize,
    /// Generator seed (default 0).
    pub seed: u64,
    /// The kinds drawn from (default all nine).
    pub kinds: Vec<Kind>,
    /// The training set a held-out set stays out of.
    pub held_out_of: Option<TrainingSet>,
}

impl Default for SpreadsheetSpec {
    fn default() -> Self {
        SpreadsheetSpec {
            count: 300,
            seed: 0,
            kinds: Kind::ALL.to_vec(),
            held_out_of: None,
        }
    }
}

impl Keyed for SpreadsheetTask {
    /// Tasks are the same task when their instructions are: a held-out
    /// instruction never appears in training, whatever its values.
    fn key(&self) -> &str {
        &self.instruction
    }
}

impl SpreadsheetSpec {
    /// Parses the `k=v,...` options after `spreadsheet:`.
    pub fn parse(options: &str) -> Result<SpreadsheetSpec, String> {
        let mut spec = SpreadsheetSpec::default();
        let mut training = TrainingKeys::default();
        for (k, v) in super::super::options(options)? {
            if training.take(k, v)? {
                continue;
            }
            match k {
                "count" => {
                    spec.count = v
                        .parse()
                        .map_err(|_| format!("count: `{v}` is not a count"))?
                }
                "seed" => {
                    spec.seed = v
                        .parse()
                        .map_err(|_| format!("seed: `{v}` is not an integer"))?
                }
                "kinds" => {
                    spec.kinds = v
                        .split('+')
                        .map(|name| {
                            Kind::parse(name.trim()).ok_or_else(|| {
                                let all: Vec<&str> = Kind::ALL.iter().map(|k| k.name()).collect();
                                format!("kinds: unknown kind `{name}` (kinds: {})", all.join(", "))
                            })
                        })
                        .collect::<Result<_, _>>()?
                }
                other => {
                    return Err(format!(
                        "unknown key `{other}` (keys: count, seed, kinds, train_seed, train_count)"
                    ))
                }
            }
        }
        spec.held_out_of = training.finish()?;
        Ok(spec)
    }

    /// The tasks, the same for the same spec.
    pub fn generate(&self) -> Result<Vec<SpreadsheetTask>, String> {
        held_out::generate(self.count, self.seed, self.held_out_of, |seed| {
            self.stream(seed)
        })
    }

    fn stream(&self, seed: u64) -> impl Iterator<Item = SpreadsheetTask> + '_ {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        std::iter::repeat_with(move || {
            let kind = self.kinds[rng.gen_range(0..self.kinds.len())];
            one(&mut rng, kind)
        })
    }
}

/// Free text on a sheet before the data, in some workbooks.
const README: [&str; 3] = [
    "This workbook is updated every Monday.",
    "Do not sort the tables by hand; the macros rely on the order.",
    "Questions: ask the data team.",
];

fn one(rng: &mut ChaCha8Rng, kind: Kind) -> SpreadsheetTask {
    let draft = match kind {
        Kind::Lookup => cells::lookup(rng),
        Kind::ConditionalSum => cells::conditional_sum(rng),
        Kind::Dates => cells::dates(rng),
        Kind::TextCleanup => cells::text_cleanup(rng),
        Kind::FillGaps => cells::fill_gaps(rng),
        Kind::Formulas => cells::formulas(rng),
        Kind::Deduplicate => reshape::deduplicate(rng),
        Kind::Pivot => reshape::pivot(rng),
        Kind::FilterSort => reshape::filter_sort(rng),
    };
    // A sheet of notes in front of the data: the active sheet is not the
    // one to change.
    let readme = rng.gen_bool(0.35).then(|| {
        let mut s = Sheet::new("ReadMe");
        for (i, line) in README.iter().enumerate() {
            s.text(2 + 2 * i as u32, 2, line);
        }
        s
    });
    let cases = draft
        .cases
        .into_iter()
        .map(|(mut book, expected): (Workbook, _)| {
            if let Some(s) = &readme {
                book.sheets.insert(0, s.clone());
            }
            Case {
                input: Source::Cells(book),
                expected,
            }
        })
        .collect();
    SpreadsheetTask {
        kind: draft.kind,
        instruction: draft.instruction,
        answer_position: draft.answer_position,
        reference: draft.reference,
        cases,
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::super::load;
    use super::*;

    #[test]
    fn tasks_cover_every_kind_with_cases_sharing_layout_not_values() {
        let tasks = load("spreadsheet:count=300,seed=1").unwrap();
        assert_eq!(tasks.len(), 300);
        let kinds: HashSet<Kind> = tasks.iter().map(|t| t.kind).collect();
        assert_eq!(kinds.len(), Kind::ALL.len());
        assert_eq!(load("spreadsheet:count=300,seed=1").unwrap(), tasks);
        for t in &tasks {
            assert!(t.cases.len() >= 4);
            let books: Vec<&Workbook> = t
                .cases
                .iter()
                .map(|c| match &c.input {
                    Source::Cells(b) => b,
                    Source::Path(_) | Source::Bytes(_) => unreachable!("generated cases are cells"),
                })
                .collect();
            let cells = |b: &Workbook| -> Vec<Vec<(u32, u32)>> {
                b.sheets
                    .iter()
                    .map(|s| s.cells.keys().copied().collect())
                    .collect()
            };
            let answers: HashSet<String> = t
                .cases
                .iter()
                .map(|c| format!("{:?}", c.expected))
                .collect();
            // Same sheets and headers (layout), different answers (values).
            assert!(books
                .iter()
                .all(|b| b.sheets.len() == books[0].sheets.len()));
            assert!(books
                .iter()
                .all(|b| b.sheets[0].merges == books[0].sheets[0].merges));
            assert_eq!(answers.len(), t.cases.len(), "{}", t.instruction);
            assert!(!cells(books[0]).is_empty());
        }
    }

    #[test]
    fn the_held_out_split_shares_no_instruction_with_training() {
        let training = load("spreadsheet:count=300,seed=1").unwrap();
        let seen: HashSet<&str> = training.iter().map(|t| t.instruction.as_str()).collect();
        let plain = load("spreadsheet:count=300,seed=2").unwrap();
        let held = load("spreadsheet:count=300,seed=2,train_seed=1,train_count=300").unwrap();
        let overlap = |ts: &[SpreadsheetTask]| {
            ts.iter()
                .filter(|t| seen.contains(t.instruction.as_str()))
                .count()
        };
        assert!(
            overlap(&plain) > 0,
            "the plain seed draws some training instructions"
        );
        assert_eq!(overlap(&held), 0);
        assert_eq!(held.len(), 300);
    }
}
