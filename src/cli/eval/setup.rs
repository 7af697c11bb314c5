//! What both of `tern eval`'s task families set up the same way from the
//! flags: the records file, the engine, the `--limit` check.

use std::sync::Arc;

use anyhow::{bail, Context, Result};
use tern_runtime::engine::{EngineConfig, EngineHandle};

use super::args::EvalArgs;
use crate::cli::resolve;

/// The `--records` file opened to append to (none without the flag); both
/// task families write their records through it.
pub(super) fn records_sink(a: &EvalArgs) -> Result<Option<std::fs::File>> {
    a.records
        .as_ref()
        .map(|p| {
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(p)
                .with_context(|| format!("opening {} to append records", p.display()))
        })
        .transpose()
}

/// The engine serving `--model`, as both task families load it.
pub(super) fn engine(a: &EvalArgs) -> Result<EngineHandle> {
    let model = resolve::load(&a.model.model)?;
    Ok(EngineHandle::spawn(
        Arc::new(model),
        EngineConfig::default(),
    ))
}

/// `--limit 0` is refused by both task families alike.
pub(super) fn check_limit(a: &EvalArgs) -> Result<()> {
    if a.limit == 0 {
        bail!("--limit 0 evaluates no task: give at least 1");
    }
    Ok(())
}
