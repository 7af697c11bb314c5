//! Task-set evaluation: how often answer strategies (one greedy sample,
//! majority@N, synthesize@N, adaptive width or length, reward@N on code
//! tasks by their own tests, or `reward@N:tests=K` by K tests a model
//! writes) solve a set of tasks, at what cost in tokens and time. `tern eval`
//! drives it and prints its rows; the trainer grades its held-out accuracy
//! with the same [`judge`] and [`Totals`], so both mean the same by "solved".
//!
//! [`strategy`] parses and groups strategies, [`record`] grades one answer
//! into a resumable [`Record`], [`run`] answers tasks through the engine,
//! [`report`] sums records into rows; [`pool`] is the task loop that
//! [`run`], [`spreadsheet`] and `tern synth-data` run their tasks in.

mod error;
pub mod pool;
pub mod record;
pub mod report;
pub mod run;
pub mod spreadsheet;
pub mod spreadsheet_best;
pub mod strategy;
pub mod synthesis_data;

pub use error::EvalError;
pub use record::{judge, load_records, GeneratedRecord, Grade, Record, Records};
pub use report::{rows, totals_from_records, HeadToHead, Row, Totals};
pub use run::{read_tasks, run, Engines, Event, Plan, Settings};
pub use strategy::{check_fit, share_samples, Strategy};
pub use synthesis_data::{
    sft_control, sft_controls, synthesis_example, ControlError, DataSettings, Keep,
    SynthesisExample,
};
