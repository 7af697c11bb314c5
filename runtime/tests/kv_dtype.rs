//! KV cache storage types: f16 (the default) changes no output against f32,
//! q8_0 and q4_0 caches give llama.cpp's own logits (`-ctk/-ctv`), bytes per
//! position are what the types promise, and a type that cannot be honoured
//! is refused by name. (Perplexity under each type: kveval's
//! `tests/perplexity.rs`.)

use std::sync::Arc;

use tern_runtime::backend::{Backend, LogitsWanted, Row, TernBackend};
use tern_runtime::kv::policy::KvPolicy;
use tern_runtime::kv::{KvDtype, SeqCache};
use tern_runtime::LoadedModel;

use crate::support::tiny::{write_tiny_model, TinySpec};
use crate::support::{real_model, LLAMA_THREADS};

/// A tiny llama whose heads hold 64 values (block types need multiples of
/// 32) and whose context passes 512 positions, where decode takes its own
/// kernel.
fn tiny_spec() -> TinySpec {
    TinySpec {
        n_embd: 128,
        n_head: 2,
        n_kv_head: 1,
        context_length: 640,
        ..TinySpec::default()
    }
}

/// Teacher-forced logits of `tokens` fed in `chunks` to one sequence stored
/// as `dtype`.
pub(crate) fn forced(
    backend: &mut dyn Backend,
    dtype: KvDtype,
    tokens: &[u32],
    chunks: &[usize],
    vocab: usize,
) -> Vec<Vec<f32>> {
    let seq = backend
        .new_seq(&KvPolicy::Full, dtype, tokens.len())
        .unwrap();
    let mut out = Vec::new();
    let mut start = 0;
    for &len in chunks {
        let rows = [Row {
            seq,
            tokens: &tokens[start..start + len],
            start_pos: start,
            logits: LogitsWanted::All,
        }];
        let flat = backend.forward(&rows).unwrap().pop().flatten().unwrap();
        out.extend(flat.chunks(vocab).map(<[f32]>::to_vec));
        start += len;
    }
    assert_eq!(start, tokens.len());
    backend.free(seq);
    out
}

/// Chunks reaching every attention kernel: per-row (under 64 rows), tiled
/// (64 and more), single-token decode under 512 cached positions and past it.
fn chunks_through_every_kernel(n: usize) -> Vec<usize> {
    let mut chunks = vec![40, 100, 340];
    let fed: usize = chunks.iter().sum();
    chunks.extend(std::iter::repeat_n(1, n - fed));
    chunks
}

#[test]
fn f16_storage_gives_the_logits_of_f32_storage_bit_for_bit() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tiny.gguf");
    let spec = tiny_spec();
    write_tiny_model(&path, &spec);
    let model = Arc::new(LoadedModel::load(&path).unwrap());
    let vocab = model.config().vocab_size;
    let n = 600;
    let tokens: Vec<u32> = (0..n).map(|i| ((i * 37 + 11) % vocab) as u32).collect();
    let chunks = chunks_through_every_kernel(n);
    let mut tern = TernBackend::new(Arc::clone(&model));
    let f32s = forced(&mut tern, KvDtype::F32, &tokens, &chunks, vocab);
    let f16s = forced(&mut tern, KvDtype::F16, &tokens, &chunks, vocab);
    let same = f32s.iter().zip(&f16s).filter(|(a, b)| a == b).count();
    assert_eq!(same, n, "f16 storage changed {} of {n} positions", n - same);
    // The quantized types do change the numbers (a test that could not fail
    // otherwise): their logits stay close but not equal.
    let q8 = forced(&mut tern, KvDtype::Q8_0, &tokens, &chunks, vocab);
    assert!(q8.iter().zip(&f16s).any(|(a, b)| a != b));
}

#[test]
fn quantized_caches_give_llama_cpps_logits_bit_for_bit() {
    use tern_runtime::backend::{LlamaCppBackend, LlamaCppOptions};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tiny.gguf");
    let spec = tiny_spec();
    write_tiny_model(&path, &spec);
    let model = Arc::new(LoadedModel::load(&path).unwrap());
    let vocab = model.config().vocab_size;
    let n = 560;
    let tokens: Vec<u32> = (0..n).map(|i| ((i * 29 + 5) % vocab) as u32).collect();
    // A prefill chunk within llama.cpp's 512-token micro-batch, single
    // tokens, then decode steps past 512 cached positions (llama.cpp reads a
    // quantized cache with its per-row kernel at every depth).
    let mut chunks = vec![253, 1, 2, 250];
    chunks.extend(std::iter::repeat_n(1, n - 506));
    let mut tern = TernBackend::new(Arc::clone(&model));
    for dtype in [KvDtype::Q8_0, KvDtype::Q4_0] {
        let ours = forced(&mut tern, dtype, &tokens, &chunks, vocab);
        let opts = LlamaCppOptions {
            n_ctx: n as u32 + 64,
            n_seq_max: 1,
            n_threads: LLAMA_THREADS,
            kv_dtype: dtype,
        };
        let mut llama = LlamaCppBackend::load(&path, model.config(), &opts).unwrap();
        let theirs = forced(&mut llama, dtype, &tokens, &chunks, vocab);
        let identical = ours.iter().zip(&theirs).filter(|(a, b)| a == b).count();
        let max_diff = ours
            .iter()
            .zip(&theirs)
            .flat_map(|(a, b)| a.iter().zip(b).map(|(x, y)| (x - y).abs()))
            .fold(0f32, f32::max);
        eprintln!("{dtype}: {identical}/{n} positions bit-identical, max |diff| {max_diff:e}");
        assert_eq!(identical, n, "{dtype}: max |diff| {max_diff:e}");
        // And the backend refuses a sequence of another type.
        let err = llama
            .new_seq(&KvPolicy::Full, KvDtype::F16, 8)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("kv_dtype") && err.contains(dtype.name()),
            "{err}"
        );
    }
}

#[test]
fn bytes_per_position_follow_the_storage_type_on_smollm2() {
    let Some(path) = real_model("bytes_per_position_follow_the_storage_type_on_smollm2") else {
        return;
    };
    let model = LoadedModel::load(&path).unwrap();
    let c = model.config();
    let tokens: Vec<u32> = (0..40).map(|i| 1000 + i).collect();
    let mut per_position = Vec::new();
    for dtype in [KvDtype::F32, KvDtype::F16, KvDtype::Q8_0, KvDtype::Q4_0] {
        let mut cache = SeqCache::with_storage(c, KvPolicy::Full, dtype).unwrap();
        let mut batch = [tern_models::SeqBatch {
            tokens: &tokens,
            start_pos: 0,
            cache: &mut cache as &mut dyn tern_models::KvStore,
            logits: LogitsWanted::Last,
        }];
        model.arch.forward(&mut batch).unwrap();
        assert_eq!(cache.len(), tokens.len());
        per_position.push(cache.bytes() / tokens.len());
        // Admission reserves what the cache then holds.
        let reserved = SeqCache::reservation_bytes(c, &KvPolicy::Full, dtype, 40, 0, 16);
        assert_eq!(reserved, cache.bytes(), "{dtype}");
    }
    // 30 layers x 3 KV heads x 64 values, keys and values: f32 46,080 B;
    // f16 half of it, as llama.cpp's default cache; q8_0 34/64 of f16's
    // bytes, q4_0 18/64.
    assert_eq!(per_position, vec![46_080, 23_040, 12_240, 6_480]);
}

#[test]
fn a_storage_type_the_model_cannot_hold_is_refused_by_name() {
    // The default tiny model's heads hold 16 values: no block fits.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tiny.gguf");
    write_tiny_model(&path, &TinySpec::default());
    let model = LoadedModel::load(&path).unwrap();
    let err = SeqCache::with_storage(model.config(), KvPolicy::Full, KvDtype::Q8_0)
        .err()
        .expect("q8_0 needs heads of a multiple of 32 values")
        .to_string();
    assert!(err.contains("q8_0") && err.contains("16"), "{err}");
    let engine = tern_runtime::engine::EngineHandle::spawn(
        Arc::new(model),
        tern_runtime::engine::EngineConfig::default(),
    );
    let mut req = tern_runtime::engine::SubmitRequest::new(
        vec![1, 2, 3],
        tern_runtime::sampler::SamplingParams::default(),
        4,
    );
    req.kv_dtype = KvDtype::Q4_0;
    let err = engine.submit(req).err().expect("refused").to_string();
    assert!(err.contains("kv_dtype"), "{err}");
}
