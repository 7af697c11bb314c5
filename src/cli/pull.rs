//! `tern pull`: fetch a registry model (or list the registry).

use anyhow::Result;
use tern_models::registry;

use super::args::PullArgs;

/// Runs the subcommand with its parsed arguments.
pub fn run(a: &PullArgs) -> Result<()> {
    if a.list {
        for e in registry::REGISTRY {
            println!("{:<24} {:<10} {}", e.name, e.license, e.description);
        }
        return Ok(());
    }
    let entry = registry::lookup(&a.name).ok_or_else(|| {
        let known: Vec<&str> = registry::REGISTRY.iter().map(|e| e.name).collect();
        tern_models::ModelError::UnknownModel {
            name: a.name.clone(),
            known: known.join(", "),
        }
    })?;
    let path = registry::pull(entry, &registry::model_dir(), true)?;
    println!("{}", path.display());
    Ok(())
}
