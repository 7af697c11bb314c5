//! `tern pull`: fetch a catalog model (or list the catalog).

use anyhow::Result;
use tern_hub as registry;

use clap::Args;

/// `tern pull`.
#[derive(Debug, Args)]
pub struct PullArgs {
    /// Registry name of the model to fetch.
    #[arg(default_value = tern_hub::DEFAULT_MODEL)]
    pub name: String,
    /// List the registry instead of pulling.
    #[arg(long)]
    pub list: bool,
}

/// Runs the subcommand with its parsed arguments.
pub fn run(a: &PullArgs) -> Result<()> {
    if a.list {
        let dir = registry::model_dir();
        println!(
            "{:<28} {:>9}  {:<10} {:<7} description",
            "name", "size", "license", "pulled"
        );
        for e in registry::REGISTRY {
            let pulled = if dir.join(e.file_name).is_file() {
                "yes"
            } else {
                "no"
            };
            println!(
                "{:<28} {:>6} MB  {:<10} {:<7} {}",
                e.name,
                e.size.div_ceil(1_000_000),
                e.license,
                pulled,
                e.description
            );
        }
        return Ok(());
    }
    let entry = registry::entry(&a.name)?;
    let path = registry::pull(entry, &registry::model_dir(), true)?;
    println!("{}", path.display());
    Ok(())
}
