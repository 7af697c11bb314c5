//! The forward pass on the tiny model: a ragged batch equals one sequence at a
//! time, and chunked prefill equals one-shot prefill.

use candle_core::Tensor;
use tern_models::{LogitsWanted, SeqBatch};
use tern_runtime::kv::SeqCache;
use tern_runtime::LoadedModel;

use crate::support::tiny::load_tiny as tiny;

/// Runs `prompt` through `cache` straight on the model, `chunk` tokens per
/// forward; returns the last token's logits.
fn prefill(
    model: &tern_runtime::LoadedModel,
    cache: &mut SeqCache,
    prompt: &[u32],
    chunk: usize,
) -> tern_runtime::Result<Tensor> {
    let start = cache.seen();
    let mut last = None;
    for (i, piece) in prompt.chunks(chunk).enumerate() {
        let is_last = (i + 1) * chunk >= prompt.len();
        let mut batch = [SeqBatch {
            tokens: piece,
            start_pos: start + i * chunk,
            cache,
            logits: if is_last {
                LogitsWanted::Last
            } else {
                LogitsWanted::None
            },
        }];
        last = model.arch.forward(&mut batch)?.pop().flatten();
    }
    cache.finish_prefill()?;
    Ok(last.expect("a non-empty prompt"))
}

fn max_abs_diff(a: &Tensor, b: &Tensor) -> f32 {
    max_abs(&(a - b).unwrap())
}

fn max_abs(t: &Tensor) -> f32 {
    t.abs()
        .unwrap()
        .flatten_all()
        .unwrap()
        .max(0)
        .unwrap()
        .to_scalar::<f32>()
        .unwrap()
}

/// Runs `tokens` alone from an empty (or given) cache and returns all logits.
fn alone(model: &LoadedModel, cache: &mut SeqCache, tokens: &[u32], start: usize) -> Tensor {
    let mut b = [SeqBatch {
        tokens,
        start_pos: start,
        cache,
        logits: LogitsWanted::All,
    }];
    model.arch.forward(&mut b).unwrap().pop().flatten().unwrap()
}

#[test]
fn ragged_batch_equals_sequential() {
    let (_d, model) = tiny();
    let seqs: [&[u32]; 3] = [&[5, 70, 71, 72, 9, 100], &[200, 201, 3], &[42]];
    // Sequential reference: each sequence prefilled, then one decode token.
    let mut ref_prefill = Vec::new();
    let mut ref_decode = Vec::new();
    for s in seqs {
        let mut cache = SeqCache::new(model.config());
        ref_prefill.push(alone(&model, &mut cache, s, 0));
        ref_decode.push(alone(&model, &mut cache, &[11], s.len()));
    }
    // Ragged: all three prefills in one forward, then all three decodes in one.
    let mut caches: Vec<SeqCache> = seqs.iter().map(|_| SeqCache::new(model.config())).collect();
    let mut batch: Vec<SeqBatch> = seqs
        .iter()
        .zip(caches.iter_mut())
        .map(|(s, c)| SeqBatch {
            tokens: s,
            start_pos: 0,
            cache: c,
            logits: LogitsWanted::All,
        })
        .collect();
    let prefill = model.arch.forward(&mut batch).unwrap();
    let decode_tok = [11u32];
    let mut batch: Vec<SeqBatch> = seqs
        .iter()
        .zip(caches.iter_mut())
        .map(|(s, c)| SeqBatch {
            tokens: &decode_tok,
            start_pos: s.len(),
            cache: c,
            logits: LogitsWanted::Last,
        })
        .collect();
    let decode = model.arch.forward(&mut batch).unwrap();
    for i in 0..seqs.len() {
        let p = prefill[i].as_ref().unwrap();
        let d = decode[i].as_ref().unwrap();
        assert_eq!(p.dims(), ref_prefill[i].dims());
        let (dp, dd) = (
            max_abs_diff(p, &ref_prefill[i]),
            max_abs_diff(d, &ref_decode[i]),
        );
        assert!(dp < 1e-4, "seq {i} prefill logits differ by {dp}");
        assert!(dd < 1e-4, "seq {i} decode logits differ by {dd}");
    }
}

#[test]
fn chunked_prefill_equals_one_shot() {
    let (_d, model) = tiny();
    let prompt: Vec<u32> = (0..40).map(|i| (i * 37 % 250 + 3) as u32).collect();
    let mut one = SeqCache::new(model.config());
    let whole = prefill(&model, &mut one, &prompt, 512).unwrap();
    for chunk in [1, 7, 16] {
        let mut c = SeqCache::new(model.config());
        let chunked = prefill(&model, &mut c, &prompt, chunk).unwrap();
        assert_eq!(c.len(), prompt.len());
        let diff = max_abs_diff(&whole, &chunked);
        assert!(diff < 1e-4, "chunk {chunk}: last logits differ by {diff}");
        // And the caches continue identically.
        let a = alone(&model, &mut one.fork().unwrap(), &[17], prompt.len());
        let b = alone(&model, &mut c, &[17], prompt.len());
        assert!(max_abs_diff(&a, &b) < 1e-4);
    }
}

#[test]
fn long_prefill_in_chunks_of_64_or_more_equals_one_shot_exactly() {
    // From 64 rows a forward pass takes llama.cpp's tiled attention kernel,
    // whose rows do not depend on what else is in the batch: a long prompt
    // fed in such chunks gives the very same logits as in one go.
    let (_d, model) = tiny();
    let prompt: Vec<u32> = (0..150).map(|i| (i * 53 % 250 + 3) as u32).collect();
    let mut one = SeqCache::new(model.config());
    let whole = prefill(&model, &mut one, &prompt, 512).unwrap();
    let mut c = SeqCache::new(model.config());
    let chunked = prefill(&model, &mut c, &prompt, 75).unwrap();
    assert_eq!(max_abs_diff(&whole, &chunked), 0.0);
}

#[test]
fn logits_select_rows() {
    let (_d, model) = tiny();
    let mut c1 = SeqCache::new(model.config());
    let all = alone(&model, &mut c1, &[4, 5, 6, 7], 0);
    let mut c2 = SeqCache::new(model.config());
    let mut b = [SeqBatch {
        tokens: &[4, 5, 6, 7],
        start_pos: 0,
        cache: &mut c2,
        logits: LogitsWanted::Last,
    }];
    let last = model.arch.forward(&mut b).unwrap().pop().flatten().unwrap();
    assert_eq!(all.dims(), &[4, model.config().vocab_size]);
    assert_eq!(last.dims(), &[1, model.config().vocab_size]);
    assert!(max_abs_diff(&all.narrow(0, 3, 1).unwrap(), &last) < 1e-5);
}

#[test]
fn out_of_range_tokens_and_positions_are_errors() {
    let (_d, model) = tiny();
    let mut c = SeqCache::new(model.config());
    let mut b = [SeqBatch {
        tokens: &[100_000],
        start_pos: 0,
        cache: &mut c,
        logits: LogitsWanted::Last,
    }];
    let err = model.arch.forward(&mut b).err().unwrap().to_string();
    assert!(err.contains("outside the vocabulary"), "{err}");
    let mut b = [SeqBatch {
        tokens: &[1, 2],
        start_pos: 255,
        cache: &mut c,
        logits: LogitsWanted::Last,
    }];
    let err = model.arch.forward(&mut b).err().unwrap().to_string();
    assert!(err.contains("context length"), "{err}");
}

/// The learner's dense f32 forward (differentiable ops, candle's RoPE) and the
/// serving forward (quantized kernels, llama.cpp's rounding) of one tiny
/// model of every architecture: the same function up to rounding, so a LoRA
/// trained on one serves on the other.
#[test]
fn the_learner_forward_matches_serving_on_every_architecture() {
    use crate::support::tiny::{write_tiny_model, TinySpec};
    use tern_models::Precision;
    for arch in tern_models::arch::SUPPORTED {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tiny.gguf");
        let spec = TinySpec::for_architecture(arch);
        write_tiny_model(&path, &spec);
        let serving = LoadedModel::load(&path).unwrap();
        let learner = LoadedModel::load_as(&path, Precision::DenseF32).unwrap();
        let tokens: Vec<u32> = (0..48).map(|i| (i * 29 + 3) % 200).collect();
        let a = alone(&serving, &mut SeqCache::new(serving.config()), &tokens, 0);
        let b = alone(&learner, &mut SeqCache::new(learner.config()), &tokens, 0);
        let diff = max_abs_diff(&a, &b);
        let scale = max_abs(&a);
        // Q8_0 activations and f16 attention against f32 throughout: llama
        // itself differs by ~2.3% of the logits' range here (0.23 of 9.7).
        assert!(
            diff <= 0.04 * scale,
            "{arch}: serving and learner differ by {diff} (logits up to {scale})"
        );
        let (ta, tb) = (a.argmax(1).unwrap(), b.argmax(1).unwrap());
        let same: u32 = ta
            .eq(&tb)
            .unwrap()
            .to_dtype(candle_core::DType::U32)
            .unwrap()
            .sum_all()
            .unwrap()
            .to_scalar()
            .unwrap();
        assert!(same >= 45, "{arch}: top-1 agrees at {same}/48 positions");
    }
}

/// What the trainer sizes and shapes through the architecture seam, for a
/// tiny model of every architecture: the planner's parameter count is every
/// element the GGUF holds, and each LoRA target's `(out, in)` is its
/// projection's shape in the file.
#[test]
fn parameter_count_and_lora_shapes_match_the_file_on_every_architecture() {
    use crate::support::tiny::{write_tiny_model, TinySpec};
    use tern_models::{GgufFile, LoraTarget};
    for arch in tern_models::arch::SUPPORTED {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tiny.gguf");
        write_tiny_model(&path, &TinySpec::for_architecture(arch));
        let model = LoadedModel::load(&path).unwrap();
        let file = GgufFile::open(&path).unwrap();
        assert_eq!(
            tern_models::arch::parameter_count(model.config()),
            file.tensor_summary().params,
            "{arch}"
        );
        for t in LoraTarget::ALL {
            let (out, inp) = model.arch.projection_shape(t);
            // Phi-3 keeps Q/K/V in one `attn_qkv` and gate/up in one
            // `ffn_up`: there the target is a block of that tensor's rows.
            let has = |stem: &str| file.tensor_dims(&format!("blk.0.{stem}.weight")).is_some();
            let fused = match t {
                LoraTarget::Q | LoraTarget::K | LoraTarget::V if has("attn_qkv") => {
                    Some("attn_qkv")
                }
                LoraTarget::Gate | LoraTarget::Up if !has("ffn_gate") => Some("ffn_up"),
                _ => None,
            };
            let stem = fused.unwrap_or(t.gguf_stem());
            let dims = file
                .tensor_dims(&format!("blk.0.{stem}.weight"))
                .unwrap_or_else(|| panic!("{arch} {t:?}: no {stem}"));
            if fused.is_some() {
                assert_eq!(dims[1], inp, "{arch} {t:?}");
                assert!(dims[0] > out, "{arch} {t:?}: {dims:?} vs {out}");
            } else {
                assert_eq!(dims, vec![out, inp], "{arch} {t:?}");
            }
        }
    }
}
