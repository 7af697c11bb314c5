//! Cost of output constraints per generated token on SmolLM2-135M's
//! vocabulary (49,152 tokens), walking one fixed JSON answer token by token:
//! the full token mask (what a sampler needs when the free draw is refused)
//! and the per-token check of the drawn token (the common path), for
//! llguidance (`Grammar`, JSON object schema). The hand-written JSON prefix
//! checker it replaced was timed beside it at commit 2857b1f
//! (docs/BENCHMARKS.md). Needs the real model (`tern pull`). Run:
//! `cargo bench --bench constraint -- --noplot`.

use std::path::Path;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use tern_runtime::constraint::Constraint;
use tern_runtime::LoadedModel;

const MODEL: &str = "models/cache/SmolLM2-135M-Instruct.Q4_1.gguf";
const ANSWER: &str =
    r#"{"name": "Ann", "age": 31, "mood": "happy", "likes": ["cats", "tea", "long walks"]}"#;

fn bench(c: &mut Criterion) {
    if !Path::new(MODEL).exists() {
        eprintln!("skipping: {MODEL} is missing (run `tern pull`)");
        return;
    }
    let model = LoadedModel::load(Path::new(MODEL)).unwrap();
    let tok = &model.tokenizer;
    let ids = tok.encode(ANSWER, false, false).unwrap();
    let grammar = model.grammar(&Constraint::JsonObject).unwrap();
    let mut g = c.benchmark_group("constraint_per_token");
    g.throughput(Throughput::Elements(ids.len() as u64));
    g.sample_size(10);
    g.bench_function("llguidance_full_mask", |b| {
        b.iter(|| {
            let mut gr = grammar.clone();
            let mut allowed = 0;
            for &t in &ids {
                allowed += gr.mask().unwrap().num_set();
                assert!(gr.commit(t));
            }
            allowed
        })
    });
    g.bench_function("llguidance_check_drawn", |b| {
        b.iter(|| {
            let mut gr = grammar.clone();
            for &t in &ids {
                assert!(gr.allows(t));
                assert!(gr.commit(t));
            }
        })
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
