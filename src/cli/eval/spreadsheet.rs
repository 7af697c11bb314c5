//! `tern eval --task spreadsheet:...` (or a `.spreadsheet.jsonl` file): each
//! task's program written greedily and judged on its test-case workbooks;
//! `--strategy rounds@R` lets the model retry after a failure, up to R
//! rounds; `agree@N` and `oracle@N` (alone or together, over the same N
//! candidates) are best-of-N (`eval_spreadsheet_best.rs`); `reference`
//! judges each task's own reference program instead (no model: a failing
//! reference is a generator bug). Prints soft and hard scores after each
//! round and per operation kind; `--records` appends one JSON line per task,
//! and a stopped run given the same file runs only the tasks it lacks.
//! The evaluation is `tern_solve::eval::spreadsheet`; this file reads the
//! flags and prints.

use std::collections::BTreeMap;
use std::io::Write;
use std::sync::Mutex;

use anyhow::{bail, Context, Result};
use tern_solve::eval::spreadsheet::{run_references, run_spreadsheet, SheetRecord, SheetSettings};
use tern_solve::eval::spreadsheet_best::BestOfRecord;
use tern_solve::tasks::spreadsheet::{self, PromptBudget, SpreadsheetTask};
use tern_solve::verify::spreadsheet::workbook_limits;

use super::args::EvalArgs;

/// Tasks with their numbers in the source (numbers seed them).
type Tasks = Vec<(usize, SpreadsheetTask)>;

/// Most rounds `rounds@R` takes.
const MAX_ROUNDS: usize = 10;
/// Most candidates `agree@N` / `oracle@N` take (`tern bon`'s limit).
const MAX_CANDIDATES: usize = 16;

/// What a spreadsheet run does with each task.
#[derive(Debug, PartialEq)]
enum Mode {
    /// The model writes a program, up to R rounds (`single` is 1).
    Rounds(usize),
    /// No model: each task's own reference program is judged, as a
    /// candidate's would be (a failure is a generator bug).
    Reference,
    /// N sampled programs, chosen among by agreement and/or the oracle.
    BestOf {
        /// Candidates per task.
        n: usize,
        /// `agree@N` was asked.
        agree: bool,
        /// `oracle@N` was asked.
        oracle: bool,
        /// Rounds per candidate (`rounds@R` beside them; 1 without).
        rounds: usize,
    },
}

const STRATEGIES: &str = "single, rounds@R (R from 1 to 10), agree@N and/or oracle@N \
     (N from 2 to 16, the same N; with rounds@R beside them, each candidate retries), or \
     reference";

/// The mode from the strategies a spreadsheet run takes: single or
/// reference alone, or rounds@R, agree@N and oracle@N (agree and oracle one
/// or both, same N; rounds@R alone is greedy with retries, beside them
/// the candidates' rounds).
fn mode_of(strategies: &[String]) -> Result<Mode> {
    let bad = || {
        anyhow::anyhow!(
            "spreadsheet strategies `{}`: use {STRATEGIES}",
            strategies.join(",")
        )
    };
    if let [s] = strategies {
        match s.as_str() {
            "single" => return Ok(Mode::Rounds(1)),
            "reference" => return Ok(Mode::Reference),
            _ => {}
        }
    }
    let mut rounds = None;
    let mut best: Option<(usize, bool, bool)> = None;
    for s in strategies {
        let (name, arg) = s.split_once('@').ok_or_else(bad)?;
        match name {
            "rounds" => {
                let r = match arg.parse::<usize>() {
                    Ok(r) if (1..=MAX_ROUNDS).contains(&r) => r,
                    _ => bail!("spreadsheet strategy `{s}`: use {STRATEGIES}"),
                };
                if rounds.replace(r).is_some() {
                    bail!(
                        "spreadsheet strategies `{}`: name rounds@R once",
                        strategies.join(",")
                    );
                }
            }
            "agree" | "oracle" => {
                let n = match arg.parse::<usize>() {
                    Ok(n) if (2..=MAX_CANDIDATES).contains(&n) => n,
                    _ => bail!("spreadsheet strategy `{s}`: N must be from 2 to {MAX_CANDIDATES}"),
                };
                let (m, agree, oracle) = best.unwrap_or((n, false, false));
                if m != n {
                    bail!(
                        "spreadsheet strategies `{}`: agree@N and oracle@N share one N",
                        strategies.join(",")
                    );
                }
                best = Some((n, agree || name == "agree", oracle || name == "oracle"));
            }
            _ => return Err(bad()),
        }
    }
    match (best, rounds) {
        (Some((n, agree, oracle)), rounds) => Ok(Mode::BestOf {
            n,
            agree,
            oracle,
            rounds: rounds.unwrap_or(1),
        }),
        (None, Some(r)) => Ok(Mode::Rounds(r)),
        (None, None) => Err(bad()),
    }
}

/// Runs the spreadsheet evaluation with the parsed `tern eval` flags.
pub fn run(a: &EvalArgs) -> Result<()> {
    let mode = mode_of(&a.strategy)?;
    super::setup::check_limit(a)?;
    let all = spreadsheet::load(&a.task)?;
    if a.offset > 0 && a.offset >= all.len() {
        bail!(
            "--offset {} skips every task: {} has {}",
            a.offset,
            a.task,
            all.len()
        );
    }
    let tasks: Vec<_> = all
        .into_iter()
        .enumerate()
        .skip(a.offset)
        .take(a.limit)
        .collect();
    let (rounds, records) = match mode {
        Mode::BestOf {
            n,
            agree,
            oracle,
            rounds,
        } => {
            let fits = |r: &BestOfRecord| r.candidates.len() == n && r.by_round.len() <= rounds;
            let (done, pending) = on_file(a, tasks, |r: &BestOfRecord| r.task, fits)?;
            let mut records = done;
            if !pending.is_empty() {
                tern_solve::verify::check()
                    .context("spreadsheet tasks run the candidates' programs")?;
                let lines = RecordLines::open(a)?;
                let new =
                    super::spreadsheet_best::run(a, &pending, n, rounds, &|r| lines.append(r))?;
                lines.finish()?;
                records.extend(new);
            }
            records.sort_by_key(|r| r.task);
            let shown = super::spreadsheet_best::Shown { agree, oracle };
            return super::spreadsheet_best::print_scores(a, n, rounds, shown, &records);
        }
        Mode::Reference => (1, rounds_run(a, tasks, 1, true)?),
        Mode::Rounds(rounds) => (rounds, rounds_run(a, tasks, rounds, false)?),
    };
    print_scores(a, rounds, &records)
}

/// The model's greedy programs, up to `rounds` rounds, or (`reference`) each
/// task's reference program, over the tasks without a record on file; then
/// every record of the selection, in task order.
fn rounds_run(
    a: &EvalArgs,
    tasks: Tasks,
    rounds: usize,
    reference: bool,
) -> Result<Vec<SheetRecord>> {
    let fits = |r: &SheetRecord| ran_as(r, rounds);
    let (mut records, pending) = on_file(a, tasks, |r: &SheetRecord| r.task, fits)?;
    if !pending.is_empty() {
        tern_solve::verify::check().context("spreadsheet tasks run the candidates' programs")?;
        let lines = RecordLines::open(a)?;
        let progress = Progress::new(pending.len());
        let on_record = |r: &SheetRecord| {
            lines.append(r);
            if !a.model.json {
                let scores: Vec<String> = r
                    .rounds
                    .iter()
                    .map(|x| format!("{}/{}", x.passed, x.total))
                    .collect();
                eprintln!(
                    "task {} [{}]: {} ({:.1}s) {}",
                    r.task,
                    r.kind,
                    scores.join(" -> "),
                    r.secs,
                    progress.tick()
                );
            }
        };
        let new = if reference {
            run_references(
                &pending,
                a.parallel as usize,
                &workbook_limits(),
                &on_record,
            )?
        } else {
            let engine = super::setup::engine(a)?;
            let settings = SheetSettings {
                rounds,
                max_tokens: a.max_tokens,
                seed: a.seed,
                kv_policy: a.kv.kv_policy.clone(),
                parallel: a.parallel as usize,
                budget: PromptBudget::default(),
                limits: workbook_limits(),
            };
            run_spreadsheet(&engine, &pending, &settings, &on_record)?
        };
        lines.finish()?;
        records.extend(new);
    }
    records.sort_by_key(|r| r.task);
    Ok(records)
}

/// Whether `r` is what a run of up to `rounds` rounds writes: every round,
/// or fewer only when its last one solved the task (the rounds stop there).
/// A file from a run with fewer rounds, resumed with more, is refused rather
/// than counted as if the later rounds had been tried.
fn ran_as(r: &SheetRecord, rounds: usize) -> bool {
    match r.rounds.last() {
        Some(last) if r.rounds.len() < rounds => last.total > 0 && last.passed == last.total,
        Some(_) => r.rounds.len() == rounds,
        None => false,
    }
}

/// The records `--records` already holds for the selected tasks (a long run
/// stops and resumes; they count in the table) and the tasks still to run.
/// A line that is not this run's kind of record, or one that `fits` refuses
/// (more rounds, another N), is an error naming the file: mixing runs would
/// give a table of neither. With `--report`, nothing runs.
fn on_file<T: serde::de::DeserializeOwned>(
    a: &EvalArgs,
    tasks: Tasks,
    task_of: impl Fn(&T) -> usize,
    fits: impl Fn(&T) -> bool,
) -> Result<(Vec<T>, Tasks)> {
    let mut held: BTreeMap<usize, T> = BTreeMap::new();
    if let Some(path) = &a.records {
        let text = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
            Err(e) => {
                return Err(anyhow::Error::new(e).context(format!("reading {}", path.display())))
            }
        };
        for (n, line) in text.lines().enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            let other = || {
                anyhow::anyhow!(
                    "{} line {}: not a record of this run (strategies `{}`); \
                     give --records a new file",
                    path.display(),
                    n + 1,
                    a.strategy.join(",")
                )
            };
            let r: T = serde_json::from_str(line).map_err(|_| other())?;
            if !fits(&r) {
                return Err(other());
            }
            held.insert(task_of(&r), r);
        }
    }
    let total = tasks.len();
    let (mut done, mut pending) = (Vec::new(), Vec::new());
    for (i, t) in tasks {
        match held.remove(&i) {
            Some(r) => done.push(r),
            None => pending.push((i, t)),
        }
    }
    if a.report {
        pending.clear();
    } else if !done.is_empty() && !a.model.json {
        eprintln!(
            "{} of {total} tasks already have a record; running the other {}",
            done.len(),
            pending.len()
        );
    }
    Ok((done, pending))
}

/// `--records`: one JSON line appended per finished task, from any task's
/// thread; the first write error is kept and reported at the end.
pub(super) struct RecordLines {
    sink: Option<Mutex<std::fs::File>>,
    error: Mutex<Option<std::io::Error>>,
}

impl RecordLines {
    /// The `--records` file opened to append, if one was given.
    fn open(a: &EvalArgs) -> Result<RecordLines> {
        Ok(RecordLines {
            sink: super::setup::records_sink(a)?.map(Mutex::new),
            error: Mutex::new(None),
        })
    }

    /// Appends `record` as one line (and flushes, so a stopped run keeps it).
    pub(super) fn append<T: serde::Serialize>(&self, record: &T) {
        let Some(f) = &self.sink else { return };
        let line = serde_json::to_string(record).map_err(std::io::Error::other);
        let mut f = f.lock().expect("records file");
        if let Err(e) = line
            .and_then(|l| writeln!(f, "{l}"))
            .and_then(|()| f.flush())
        {
            self.error.lock().expect("error slot").get_or_insert(e);
        }
    }

    /// The first write error, if any.
    fn finish(self) -> Result<()> {
        match self.error.into_inner().expect("error slot") {
            Some(e) => Err(anyhow::Error::new(e).context("appending a record")),
            None => Ok(()),
        }
    }
}

/// A long run's progress line: tasks finished of those this run started
/// with, and the time left at the pace so far (as the other task families
/// print it).
pub(super) struct Progress {
    started: std::time::Instant,
    done: std::sync::atomic::AtomicUsize,
    total: usize,
}

impl Progress {
    /// Progress over `total` tasks to run, starting now.
    pub(super) fn new(total: usize) -> Progress {
        Progress {
            started: std::time::Instant::now(),
            done: std::sync::atomic::AtomicUsize::new(0),
            total,
        }
    }

    /// One more task finished: `(k/n)`, and `, ~T left` while some remain.
    pub(super) fn tick(&self) -> String {
        let k = self.done.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
        let rest = self.total.saturating_sub(k);
        if rest == 0 {
            return format!("({k}/{})", self.total);
        }
        let eta = self.started.elapsed().as_secs_f64() / k as f64 * rest as f64;
        format!("({k}/{}), ~{} left", self.total, super::human_secs(eta))
    }
}

/// Mean soft score and share solved (hard) of `records` after `round`.
fn scores(records: &[&SheetRecord], round: usize) -> (f64, f64) {
    let n = records.len().max(1) as f64;
    let soft = records.iter().map(|r| r.after(round).0).sum::<f64>() / n;
    let hard = records.iter().filter(|r| r.after(round).1).count() as f64 / n;
    (soft, hard)
}

fn print_scores(a: &EvalArgs, rounds: usize, records: &[SheetRecord]) -> Result<()> {
    let all: Vec<&SheetRecord> = records.iter().collect();
    let mut kinds: BTreeMap<&str, Vec<&SheetRecord>> = BTreeMap::new();
    for r in records {
        kinds.entry(r.kind.as_str()).or_default().push(r);
    }
    if a.model.json {
        let by_round: Vec<_> = (1..=rounds)
            .map(|k| {
                let (soft, hard) = scores(&all, k);
                serde_json::json!({ "round": k, "soft": soft, "hard": hard })
            })
            .collect();
        let by_kind: Vec<_> = kinds
            .iter()
            .map(|(kind, rs)| {
                let (soft, hard) = scores(rs, rounds);
                serde_json::json!({ "kind": kind, "tasks": rs.len(), "soft": soft, "hard": hard })
            })
            .collect();
        println!(
            "{}",
            serde_json::json!({ "tasks": records.len(), "rounds": by_round, "kinds": by_kind })
        );
        return Ok(());
    }
    println!("{} spreadsheet tasks ({})", records.len(), a.task);
    println!(
        "{:<16} {:>6} {:>7} {:>7}",
        "after round", "tasks", "soft", "hard"
    );
    for k in 1..=rounds {
        let (soft, hard) = scores(&all, k);
        println!("{:<16} {:>6} {:>7.3} {:>7.3}", k, records.len(), soft, hard);
    }
    println!("{:<16} {:>6} {:>7} {:>7}", "kind", "tasks", "soft", "hard");
    for (kind, rs) in &kinds {
        let (soft, hard) = scores(rs, rounds);
        println!("{:<16} {:>6} {:>7.3} {:>7.3}", kind, rs.len(), soft, hard);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mode(s: &str) -> Result<Mode> {
        mode_of(&s.split(',').map(String::from).collect::<Vec<_>>())
    }

    #[test]
    fn a_record_fits_a_resumed_run_only_with_the_rounds_that_run_would_have_written() {
        use tern_solve::eval::spreadsheet::RoundResult;
        let record = |scores: &[(usize, usize)]| SheetRecord {
            task: 0,
            kind: "lookup".into(),
            rounds: scores
                .iter()
                .map(|&(passed, total)| RoundResult {
                    passed,
                    total,
                    failure: None,
                    tokens: 0,
                })
                .collect(),
            program: String::new(),
            secs: 0.0,
        };
        assert!(ran_as(&record(&[(1, 4), (2, 4), (2, 4)]), 3));
        assert!(ran_as(&record(&[(1, 4), (4, 4)]), 3), "solved in round 2");
        assert!(
            !ran_as(&record(&[(1, 4), (2, 4)]), 3),
            "a 2-round run's failure"
        );
        assert!(
            !ran_as(&record(&[(1, 4), (2, 4)]), 1),
            "more rounds than asked"
        );
        assert!(!ran_as(&record(&[]), 1));
        assert!(ran_as(&record(&[(0, 4)]), 1));
    }

    #[test]
    fn strategies_name_one_mode_and_best_of_shares_one_n() {
        assert_eq!(mode("single").unwrap(), Mode::Rounds(1));
        assert_eq!(mode("rounds@3").unwrap(), Mode::Rounds(3));
        assert_eq!(mode("reference").unwrap(), Mode::Reference);
        let both = |rounds| Mode::BestOf {
            n: 8,
            agree: true,
            oracle: true,
            rounds,
        };
        assert_eq!(mode("agree@8,oracle@8").unwrap(), both(1));
        assert_eq!(mode("oracle@8,agree@8").unwrap(), both(1));
        assert_eq!(mode("agree@8,rounds@3,oracle@8").unwrap(), both(3));
        assert_eq!(
            mode("oracle@4").unwrap(),
            Mode::BestOf {
                n: 4,
                agree: false,
                oracle: true,
                rounds: 1,
            }
        );
        for (bad, says) in [
            ("agree@8,oracle@4", "share one N"),
            ("agree@1", "from 2 to 16"),
            ("oracle@x", "from 2 to 16"),
            ("single,agree@8", "use single"),
            ("majority@8", "use single"),
            ("rounds@11", "use single"),
            ("rounds@2,agree@8,rounds@3", "once"),
            ("reference,rounds@2", "use single"),
        ] {
            let e = mode(bad).unwrap_err().to_string();
            assert!(e.contains(says), "{bad}: {e}");
        }
    }
}
