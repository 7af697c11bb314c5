//! docs/ARCHITECTURE.md is the map a newcomer reads first: it must name
//! every crate of the workspace and every top-level module of each, so a
//! module added without a line on the map fails here rather than going
//! unnoticed.

use std::collections::BTreeSet;
use std::path::Path;

/// The workspace's member folders, as the root Cargo.toml lists them.
fn members(root: &Path) -> Vec<String> {
    let manifest = std::fs::read_to_string(root.join("Cargo.toml")).unwrap();
    let line = manifest
        .lines()
        .find(|l| l.trim_start().starts_with("members"))
        .expect("the root Cargo.toml lists its members on one line");
    line.split('"')
        .skip(1)
        .step_by(2)
        .map(str::to_string)
        .collect()
}

/// A crate's package name (`name = "..."` in its manifest).
fn package(dir: &Path) -> String {
    let manifest = std::fs::read_to_string(dir.join("Cargo.toml")).unwrap();
    manifest
        .lines()
        .find_map(|l| {
            let l = l.trim();
            l.strip_prefix("name").map(|rest| {
                rest.trim_start_matches([' ', '='])
                    .trim_matches('"')
                    .to_string()
            })
        })
        .expect("a package name")
}

/// The modules declared at the top of a crate root (`mod x;` / `pub mod x;`).
fn top_modules(root_file: &Path) -> BTreeSet<String> {
    let text = std::fs::read_to_string(root_file).unwrap();
    text.lines()
        .filter_map(|l| {
            let l = l.trim();
            let l = l.strip_prefix("pub ").unwrap_or(l);
            let l = l.strip_prefix("pub(crate) ").unwrap_or(l);
            l.strip_prefix("mod ")?
                .strip_suffix(';')
                .map(|m| m.trim().to_string())
        })
        .collect()
}

/// The text of the map's section for `folder` (from its `### folder` heading
/// to the next heading of that level or higher).
fn section<'a>(doc: &'a str, folder: &str) -> &'a str {
    let heading = format!("### {folder}");
    let start = doc
        .find(&heading)
        .unwrap_or_else(|| panic!("docs/ARCHITECTURE.md has no `{heading}` section"));
    let rest = &doc[start + heading.len()..];
    let end = rest
        .find("\n### ")
        .into_iter()
        .chain(rest.find("\n## "))
        .min()
        .unwrap_or(rest.len());
    &rest[..end]
}

/// Whether the section names module `m` as `m.rs`, `m/` or `m` in backticks.
fn names(section: &str, m: &str) -> bool {
    [format!("`{m}.rs`"), format!("`{m}/`"), format!("`{m}`")]
        .iter()
        .any(|form| section.contains(form.as_str()))
}

#[test]
fn the_architecture_map_names_every_crate_and_top_level_module() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let doc = std::fs::read_to_string(root.join("docs/ARCHITECTURE.md")).unwrap();
    let mut missing = Vec::new();
    let mut crates = vec![("src".to_string(), root.join("src/main.rs"), package(root))];
    for m in members(root) {
        let dir = root.join(&m);
        crates.push((format!("{m}/src"), dir.join("src/lib.rs"), package(&dir)));
    }
    assert!(
        crates.len() >= 7,
        "the workspace has its six crates and the binary"
    );
    for (folder, root_file, name) in &crates {
        if !doc.contains(&format!("`{name}`")) {
            missing.push(format!("crate `{name}`"));
        }
        let text = section(&doc, folder);
        for m in top_modules(root_file) {
            if !names(text, &m) {
                missing.push(format!("module `{m}` of {folder}"));
            }
        }
    }
    // The binary's subcommands are its real top level.
    let cli = section(&doc, "src");
    for m in top_modules(&root.join("src/cli/mod.rs")) {
        if !names(cli, &m) {
            missing.push(format!("module `cli/{m}` of src"));
        }
    }
    assert!(
        missing.is_empty(),
        "docs/ARCHITECTURE.md does not name: {}",
        missing.join(", ")
    );
}

#[test]
fn the_map_check_sees_a_missing_module() {
    let doc = "### models/src\n- `arch/`: x. `gguf.rs`: y.\n### runtime/src\n- `engine`\n";
    let models = section(doc, "models/src");
    assert!(names(models, "arch") && names(models, "gguf"));
    assert!(
        !names(models, "engine"),
        "a module named only in another crate's section"
    );
    assert!(!names(models, "kv"));
}
