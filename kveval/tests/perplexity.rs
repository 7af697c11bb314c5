//! Perplexity under each KV storage type on the real model: f16 (the
//! default) leaves it unchanged to the last digit against f32 and halves the
//! bytes; q8_0 moves it a little, as llama.cpp's `-ctk q8_0` does. Prints
//! `skipped: <why>` and passes where the model or the text is absent.

use std::path::PathBuf;

#[path = "../../models/tests/support/real.rs"]
mod real;
use real::real_model;

use tern_kveval::perplexity::perplexity_stored;
use tern_runtime::kv::policy::KvPolicy;
use tern_runtime::kv::KvDtype;
use tern_runtime::LoadedModel;

/// The repository root (this crate's parent).
fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// `../shared/reference/smollm2/<name>` beside the repository.
fn reference(test: &str, name: &str) -> Option<PathBuf> {
    let path = repo_root().join("../shared/reference/smollm2").join(name);
    if path.is_file() {
        return Some(path);
    }
    eprintln!("skipped: {test}: {} is absent", path.display());
    None
}

#[test]
fn f16_storage_leaves_smollm2_perplexity_unchanged_to_the_last_digit() {
    let test = "f16_storage_leaves_smollm2_perplexity_unchanged_to_the_last_digit";
    let (Some(path), Some(text)) = (real_model(test), reference(test, "gpl-3.txt")) else {
        return;
    };
    let model = LoadedModel::load(&path).unwrap();
    let text = std::fs::read_to_string(text).unwrap();
    let tokens = model.tokenizer.encode(&text, true, false).unwrap();
    let tokens = &tokens[..1024];
    let run = |dtype| {
        perplexity_stored(&model, tokens, 1024, &KvPolicy::Full, dtype, |_, _, _| {}).unwrap()
    };
    let (a, b) = (run(KvDtype::F32), run(KvDtype::F16));
    assert_eq!(a.perplexity.to_bits(), b.perplexity.to_bits());
    assert_eq!(b.kv_bytes * 2, a.kv_bytes);
    // q8_0 moves it a little, as llama.cpp's `-ctk q8_0` does.
    let q8 = run(KvDtype::Q8_0);
    assert!(q8.perplexity != a.perplexity);
    assert!(
        (q8.perplexity / a.perplexity - 1.0).abs() < 0.02,
        "{}",
        q8.perplexity
    );
}
