//! The policies a table compares, by name and budget, with the evaluation's
//! own settings.

use tern_runtime::kv::policy::KvPolicy;

use crate::error::{KvEvalError, Result};

/// The policy `name` at `budget`, with eval-wide settings: decode-triggered
/// policies compress every 32 tokens so the cache tracks its budget closely
/// (H2O compresses every step and takes its default split, half recent).
/// A name with a `:` is a spec run as written (its own defaults, no eval-wide
/// settings) with `budget` added, e.g. `snapkv:window=32,kernel=5,pool=avg`.
pub fn policy(name: &str, budget: usize) -> Result<KvPolicy> {
    let spec = match name {
        _ if name.contains(':') => format!("{name},budget={budget}"),
        "full" => "full".to_string(),
        "streaming" => format!("streaming:budget={budget}"),
        "h2o" => format!("h2o:budget={budget}"),
        "snapkv" | "pyramidkv" | "rkv" | "adakv" | "keydiff" | "expected" => {
            format!("{name}:budget={budget},every=32")
        }
        other => return Err(KvEvalError::UnknownPolicy(other.to_string())),
    };
    spec.parse::<KvPolicy>()
        .map_err(|source| KvEvalError::Policy { spec, source })
}

/// Policy names as a comma list gives them: the list splits specs apart at
/// their own commas, so an item with `=` but no `:` continues the spec before
/// it (`snapkv:window=32,kernel=5` is one policy).
pub fn policy_names(items: &[String]) -> Vec<String> {
    let mut names: Vec<String> = Vec::new();
    for item in items {
        match names.last_mut() {
            Some(last) if item.contains('=') && !item.contains(':') && last.contains(':') => {
                last.push(',');
                last.push_str(item);
            }
            _ => names.push(item.clone()),
        }
    }
    names
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_survive_the_comma_list() {
        let items: Vec<String> = "snapkv,snapkv:window=32,kernel=5,pool=avg,h2o:,adakv"
            .split(',')
            .map(String::from)
            .collect();
        let names = policy_names(&items);
        assert_eq!(
            names,
            [
                "snapkv",
                "snapkv:window=32,kernel=5,pool=avg",
                "h2o:",
                "adakv"
            ]
        );
        let p = policy(&names[1], 128).unwrap();
        assert_eq!(
            p.to_string(),
            "snapkv:budget=128,window=32,kernel=5,pool=avg,every=128,prefill=true"
        );
        let e = policy("snapkv:budget=64", 128).unwrap_err();
        assert!(e.to_string().contains("given twice"), "{e}");
        let e = policy("lru", 128).unwrap_err();
        assert!(e.to_string().contains("unknown policy `lru`"), "{e}");
    }
}
