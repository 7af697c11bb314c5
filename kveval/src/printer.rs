//! Where an evaluation's text goes while it runs.
//!
//! Runs take hours, so tables come out row by row as they are measured
//! rather than at the end: the caller decides where (the CLI prints tables to
//! stdout, docs/KV.md is made from them, and progress to stderr).

/// Receives an evaluation's Markdown tables and progress notes as they come.
pub trait Printer {
    /// A piece of the Markdown tables: one line, or a heading with its blank
    /// lines, without the final newline.
    fn table(&mut self, text: &str);
    /// A one-line progress note (a score as it is measured).
    fn progress(&mut self, text: &str);
}
