//! The judge on generated tasks: reference programs pass, a hard-coded
//! answer passes only its own workbook, and bad programs and bad task files
//! are failed test cases with their reasons.

use std::time::Duration;

use super::*;
use crate::tasks::spreadsheet::{self, address, Kind, Source, Value};

fn one_task(kind: Kind, seed: u64) -> SpreadsheetTask {
    let spec = format!("spreadsheet:count=1,seed={seed},kinds={}", kind.name());
    spreadsheet::load(&spec).unwrap().remove(0)
}

fn judge(program: &str, task: &SpreadsheetTask) -> WorkbookReport {
    judge_workbooks(program, task, &workbook_limits()).expect("the sandbox works here")
}

#[test]
fn every_kinds_reference_program_solves_all_its_test_cases() {
    // One task of each kind (9 tasks, 36 sandboxed runs): the reference
    // program reproduces the answers the generator computed in Rust.
    for kind in Kind::ALL {
        let task = one_task(kind, 11);
        let report = judge(&task.reference, &task);
        assert!(report.hard(), "{kind:?}: {:?}", report.verdicts);
    }
}

/// A program that writes the first test case's expected cells as constants.
fn hard_coded(task: &SpreadsheetTask) -> String {
    let mut p =
        String::from("import openpyxl, datetime\nwb = openpyxl.load_workbook('input.xlsx')\n");
    for e in &task.cases[0].expected {
        let v = match &e.value {
            Some(Value::Number(n)) => format!("{n}"),
            Some(Value::Text(t)) => format!("{t:?}"),
            Some(Value::Date(d)) => {
                format!("datetime.datetime(1899, 12, 30) + datetime.timedelta(days={d})")
            }
            _ => "None".into(),
        };
        p.push_str(&format!(
            "if {:?} not in wb.sheetnames:\n    wb.create_sheet({:?})\nwb[{:?}][{:?}] = {v}\n",
            e.sheet,
            e.sheet,
            e.sheet,
            address(e.row, e.col)
        ));
    }
    p.push_str("wb.save('output.xlsx')\n");
    p
}

#[test]
fn a_hard_coded_answer_passes_its_own_workbook_and_fails_the_others() {
    for kind in [Kind::Lookup, Kind::Pivot, Kind::Dates] {
        let task = one_task(kind, 5);
        let report = judge(&hard_coded(&task), &task);
        assert!(
            report.verdicts[0].passed(),
            "{kind:?}: {:?}",
            report.verdicts[0]
        );
        assert_eq!(report.passed(), 1, "{kind:?}: {:?}", report.verdicts);
        assert!(!report.hard());
        assert_eq!(report.soft(), 1.0 / task.cases.len() as f64);
    }
}

/// The formulas task's reference with each product's operands swapped.
fn swapped_products(task: &SpreadsheetTask) -> String {
    task.reference
        .lines()
        .map(|l| {
            if let Some((_, rest)) = l.split_once("value = f'=") {
                let (a, b) = rest.trim_end_matches('\'').split_once('*').unwrap();
                format!("{}value = f'={b}*{a}'", l.split("value = ").next().unwrap())
            } else {
                l.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn formulas_are_judged_by_what_they_compute_and_values_do_not_count() {
    let task = one_task(Kind::Formulas, 3);
    // The reference with each product's operands swapped still computes the same.
    let swapped = swapped_products(&task);
    assert_ne!(swapped, task.reference);
    assert!(judge(&swapped, &task).hard());
    // Right numbers written as values fail every case: formulas were asked.
    let values = hard_coded(&task);
    let report = judge(&values, &task);
    assert_eq!(report.passed(), 0, "{:?}", report.verdicts);
    assert!(
        matches!(&report.verdicts[0], Verdict::Fail { reason } if reason.contains("expected a formula")),
        "{:?}",
        report.verdicts[0]
    );
}

#[test]
fn bad_input_and_bad_programs_are_failed_test_cases_and_stay_inside() {
    let mut task = one_task(Kind::TextCleanup, 2);
    let dir = tempfile::tempdir().unwrap();
    // Case 1 comes from a file on the host; case 2's file is missing.
    let on_disk = dir.path().join("case1.xlsx");
    let bytes = task.cases[1].input.bytes().unwrap();
    std::fs::write(&on_disk, &bytes).unwrap();
    task.cases[1].input = Source::Path(on_disk.clone());
    task.cases[2].input = Source::Path(dir.path().join("missing.xlsx"));
    // As a task file gives them: the file loads, the missing case fails alone.
    let file = dir.path().join("tasks.spreadsheet.jsonl");
    std::fs::write(&file, serde_json::to_string(&task).unwrap() + "\n").unwrap();
    let task = spreadsheet::load(file.to_str().unwrap()).unwrap().remove(0);
    let report = judge(&task.reference, &task);
    assert!(report.verdicts[0].passed() && report.verdicts[1].passed());
    assert!(
        matches!(&report.verdicts[2], Verdict::Fail { reason } if reason.contains("missing.xlsx") && reason.contains("cannot be read")),
        "{:?}",
        report.verdicts[2]
    );
    assert!(report.verdicts[3].passed());

    // Deleting the input deletes the sandbox's copy only.
    let deletes = format!(
        "import os\nos.remove('input.xlsx')\nos.remove({:?})\n",
        on_disk.display().to_string()
    );
    let report = judge(&deletes, &task);
    assert_eq!(report.passed(), 0);
    assert!(
        matches!(&report.verdicts[0], Verdict::Crash { stderr } if stderr.contains("FileNotFoundError")),
        "{:?}",
        report.verdicts[0]
    );
    let deletes_only = "import os\nos.remove('input.xlsx')\n";
    let report = judge(deletes_only, &task);
    assert!(
        matches!(&report.verdicts[0], Verdict::Fail { reason } if reason.contains("no output.xlsx")),
        "{:?}",
        report.verdicts[0]
    );
    assert_eq!(std::fs::read(&on_disk).unwrap(), bytes);

    // A 1 GB file stops at the sandbox's 16 MiB /tmp (or its file-size limit).
    let huge = "with open('output.xlsx', 'wb') as f:\n    for _ in range(1024):\n        f.write(b'x' * (1 << 20))\n";
    let report = judge(huge, &task);
    assert!(
        matches!(&report.verdicts[0], Verdict::Crash { stderr }
            if stderr.contains("No space left on device") || stderr.contains("File too large")),
        "{:?}",
        report.verdicts[0]
    );

    // A program that never finishes is a timeout.
    let limits = Limits {
        time: Duration::from_secs(3),
        ..workbook_limits()
    };
    let report = judge_workbooks("while True:\n    pass\n", &task, &limits).unwrap();
    assert_eq!(
        [0, 1, 3].map(|i| report.verdicts[i].clone()),
        [Verdict::Timeout, Verdict::Timeout, Verdict::Timeout]
    );
}

#[test]
fn an_error_shows_the_programs_own_lines_as_python_would() {
    // The retry prompt quotes this traceback: it must show the line that
    // failed, not just its number, and no frame of the judge's harness.
    let task = one_task(Kind::Dates, 4);
    let program = "import openpyxl\nwb = openpyxl.load_workbook('input.xlsx')\n\
                   cells = tuple(wb.active.iter_rows(max_row=1))[0]\nvalue = cells[99].value\n";
    let report = judge(program, &task);
    let Verdict::Crash { stderr } = &report.verdicts[0] else {
        panic!("{:?}", report.verdicts[0]);
    };
    assert!(
        stderr.contains("line 4, in <module>\n    value = cells[99].value"),
        "{stderr}"
    );
    assert!(
        stderr
            .trim_end()
            .ends_with("IndexError: tuple index out of range"),
        "{stderr}"
    );
    assert!(!stderr.contains("_tern_workbook"), "{stderr}");
}

#[test]
fn answer_ranges_are_what_the_program_wrote_and_agreement_picks_the_shared_one() {
    // The swapped-operand formulas compute what the reference's do: the same
    // answers. A hard-coded program matches only on the shown workbook; one
    // that saves its input unchanged answers nothing.
    let task = one_task(Kind::Formulas, 3);
    let swapped = swapped_products(&task);
    let saves = "import openpyxl\nopenpyxl.load_workbook('input.xlsx').save('output.xlsx')\n";
    let reports: Vec<WorkbookReport> = [hard_coded(&task), task.reference.clone(), swapped]
        .iter()
        .chain([saves.to_string()].iter())
        .map(|p| judge(p, &task))
        .collect();
    let [values, reference, spaced, unchanged] = &reports[..] else {
        unreachable!()
    };
    assert!(reference.hard() && spaced.hard());
    assert_eq!(reference.answers, spaced.answers);
    assert!(reference.answers.iter().all(Option::is_some));
    assert!(reference.answers[0].as_ref().unwrap()[0].starts_with("f:"));
    // Written as values, the same numbers are not the same answer as formulas.
    assert_ne!(values.answers[0], reference.answers[0]);
    assert!(values.answers.iter().all(Option::is_some));
    assert_eq!(unchanged.answers, vec![None; task.cases.len()]);
    assert_eq!(select::by_agreement(&reports), Some(1));
    assert_eq!(select::by_oracle(&reports), Some(1));
    // Filling gaps, the range starts with its labels: unchanged is still no answer.
    let gaps = one_task(Kind::FillGaps, 3);
    assert_eq!(judge(saves, &gaps).answers, vec![None; gaps.cases.len()]);
}

#[test]
fn a_clients_workbooks_run_as_bytes_and_the_outputs_come_back() {
    // The endpoint's path: workbooks as bytes, positions without values.
    let task = one_task(Kind::Lookup, 5);
    let cases: Vec<Case> = task
        .cases
        .iter()
        .map(|c| {
            let bytes = c.input.bytes().unwrap();
            let book = read_workbook(&bytes).unwrap();
            Case {
                input: Source::Bytes(bytes),
                expected: answer_cells(&task.answer_position, &book).unwrap(),
            }
        })
        .collect();
    // The reference's answers are read back where no value is expected...
    let report = judge_cases(&task.reference, &cases, &workbook_limits()).unwrap();
    assert!(report.answers.iter().all(Option::is_some), "{report:?}");
    // ...and its output workbooks hold the generator's answers.
    let outputs = run_outputs(&task.reference, &cases, &workbook_limits()).unwrap();
    assert_eq!(outputs.len(), task.cases.len());
    for (out, case) in outputs.iter().zip(&task.cases) {
        compare(out.as_ref().unwrap(), &case.expected).unwrap();
    }
    let crashed = run_outputs("raise KeyError('Qty')", &cases[..1], &workbook_limits()).unwrap();
    assert!(
        crashed[0].as_ref().unwrap_err().contains("KeyError"),
        "{crashed:?}"
    );
    let idle = run_outputs("x = 1", &cases[..1], &workbook_limits()).unwrap();
    assert!(idle[0].is_err(), "{idle:?}");
}
