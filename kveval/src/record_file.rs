//! Records as JSON lines, appended as each is measured, so a long run that is
//! stopped keeps what it finished (docs tables are recomputed from them,
//! scripts/kv_table.py).

use std::io::Write;
use std::path::Path;

use crate::error::{KvEvalError, Result};

/// The records file of a run, or nowhere when none was asked for.
pub(crate) struct Records {
    file: Option<std::io::BufWriter<std::fs::File>>,
}

impl Records {
    /// Creates (or empties) `path` and its folder; `None` keeps nothing.
    pub(crate) fn create(path: Option<&Path>) -> Result<Self> {
        let file = path.map(create).transpose()?;
        Ok(Self { file })
    }

    /// Appends `record` as one line and flushes it.
    pub(crate) fn write(&mut self, record: &serde_json::Value) -> Result<()> {
        if let Some(f) = &mut self.file {
            writeln!(f, "{record}").map_err(KvEvalError::WriteRecords)?;
            f.flush().map_err(KvEvalError::WriteRecords)?;
        }
        Ok(())
    }
}

fn create(path: &Path) -> Result<std::io::BufWriter<std::fs::File>> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|source| KvEvalError::CreateRecords {
            path: dir.to_path_buf(),
            source,
        })?;
    }
    let file = std::fs::File::create(path).map_err(|source| KvEvalError::CreateRecords {
        path: path.to_path_buf(),
        source,
    })?;
    Ok(std::io::BufWriter::new(file))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_land_one_per_line_in_a_new_folder() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("new/records.jsonl");
        let mut r = Records::create(Some(&path)).unwrap();
        r.write(&serde_json::json!({"b": 1, "a": 2})).unwrap();
        r.write(&serde_json::json!({"c": 3})).unwrap();
        // Flushed as written: readable before the writer is dropped.
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(text, "{\"b\":1,\"a\":2}\n{\"c\":3}\n");
        assert!(Records::create(None)
            .unwrap()
            .write(&serde_json::json!({}))
            .is_ok());
    }

    #[test]
    fn a_folder_that_cannot_be_made_names_itself() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("plain");
        std::fs::write(&file, "").unwrap();
        let e = Records::create(Some(&file.join("x.jsonl"))).err().unwrap();
        assert!(e.to_string().starts_with("cannot create "), "{e}");
        assert!(e.to_string().ends_with("plain"), "{e}");
    }
}
