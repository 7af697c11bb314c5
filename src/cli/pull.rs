//! `tern pull`: fetch a catalog model (or list the catalog).

use anyhow::Result;
use tern_hub as registry;

use super::args::PullArgs;

/// Runs the subcommand with its parsed arguments.
pub fn run(a: &PullArgs) -> Result<()> {
    if a.list {
        for e in registry::REGISTRY {
            println!("{:<24} {:<10} {}", e.name, e.license, e.description);
        }
        return Ok(());
    }
    let entry = registry::entry(&a.name)?;
    let path = registry::pull(entry, &registry::model_dir(), true)?;
    println!("{}", path.display());
    Ok(())
}
