//! Tiny models quantized by ggml's own quantizer to the K-quants, run by Tern
//! and by llama.cpp in process: teacher-forced logits bit-identical over 256
//! positions, and a speculative draft scored alone equal to one-token steps.
//! (The kernels themselves against ggml's: the models crate's
//! `models/tests/kquant.rs`.)
#![cfg(feature = "llama-cpp")]

use crate::kv_dtype::forced;
use crate::support::tiny_quant::{q4_k_m_mix, tiny_kquant_model, Pick, Q2K, Q3K, Q4K, Q5K, Q6K};
use crate::support::LLAMA_THREADS;

/// The model at `path`, Tern and llama.cpp teacher-forced over its whole
/// context in `chunks` (the last few rows single and double steps).
/// Returns (identical positions, max |diff|, positions).
pub(crate) fn agreement(path: &std::path::Path, chunks: &[usize]) -> (usize, f32, usize) {
    use std::sync::Arc;
    use tern_runtime::backend::{LlamaCppBackend, LlamaCppOptions, TernBackend};
    let model = Arc::new(tern_runtime::LoadedModel::load(path).unwrap());
    let vocab = model.config().vocab_size;
    let n = chunks.iter().sum::<usize>();
    let tokens: Vec<u32> = (0..n).map(|i| ((i * 37 + 11) % vocab) as u32).collect();
    let mut tern = TernBackend::new(Arc::clone(&model));
    let ours = forced(&mut tern, Default::default(), &tokens, chunks, vocab);
    let opts = LlamaCppOptions {
        n_ctx: n as u32,
        n_seq_max: 1,
        n_threads: LLAMA_THREADS,
        kv_dtype: Default::default(),
    };
    let mut llama = LlamaCppBackend::load(path, model.config(), &opts).unwrap();
    let theirs = forced(&mut llama, Default::default(), &tokens, chunks, vocab);
    let identical = ours.iter().zip(&theirs).filter(|(a, b)| a == b).count();
    let max_diff = ours
        .iter()
        .zip(&theirs)
        .flat_map(|(a, b)| a.iter().zip(b).map(|(x, y)| (x - y).abs()))
        .fold(0f32, f32::max);
    (identical, max_diff, n)
}

/// The tiny K-quant model (see [`tiny_kquant_model`]); Tern and llama.cpp
/// teacher-forced over 256 positions. Returns (identical positions, max |diff|, positions).
fn tiny_kquant_agreement(pick: impl Fn(&str) -> Pick) -> (usize, f32, usize) {
    let dir = tempfile::tempdir().unwrap();
    let (path, spec) = tiny_kquant_model(dir.path(), pick);
    // A prefill whose rows are not a multiple of four (llama.cpp's repacked
    // Q4_K runs gemm on 252 rows and gemv on 1), then single and double steps.
    assert_eq!(spec.context_length, 256);
    agreement(&path, &[253, 1, 2])
}

#[test]
fn tiny_q4_k_model_matches_llama_cpp_bit_for_bit() {
    // Every projection Q4_K: rows of 128, 256 and 512 are repacked by llama.cpp;
    // the tied output (263 rows) runs ggml_vec_dot_q4_K_q8_K.
    let (identical, max_diff, n) = tiny_kquant_agreement(|name| {
        (name.starts_with("blk.") || name == "token_embd.weight").then_some(Q4K)?
    });
    eprintln!("Q4_K: {identical}/{n} positions bit-identical, max |diff| {max_diff:e}");
    assert_eq!(identical, n, "max |diff| {max_diff:e}");
}

#[test]
fn tiny_q6_k_model_matches_llama_cpp_bit_for_bit() {
    let (identical, max_diff, n) = tiny_kquant_agreement(q4_k_m_mix);
    eprintln!("Q6_K + Q4_K: {identical}/{n} positions bit-identical, max |diff| {max_diff:e}");
    assert_eq!(identical, n, "max |diff| {max_diff:e}");
}

#[test]
fn tiny_q5_k_model_matches_llama_cpp_bit_for_bit() {
    // Q5_K_M's mix: Q6_K for ffn_down, Q5_K elsewhere (the tied output too).
    let (identical, max_diff, n) = tiny_kquant_agreement(|name| {
        if name.ends_with("ffn_down.weight") {
            Q6K
        } else if name.starts_with("blk.") || name == "token_embd.weight" {
            Q5K
        } else {
            None
        }
    });
    eprintln!("Q5_K + Q6_K: {identical}/{n} positions bit-identical, max |diff| {max_diff:e}");
    assert_eq!(identical, n, "max |diff| {max_diff:e}");
}

#[test]
fn tiny_q2_k_model_matches_llama_cpp_bit_for_bit() {
    // Every projection and the tied output Q2_K: no repack on AVX2, so the
    // 253-row prefill runs ggml's tiled matmul and the 1- and 2-row steps
    // ggml_vec_dot_q2_K_q8_K.
    let (identical, max_diff, n) = tiny_kquant_agreement(|name| {
        (name.starts_with("blk.") || name == "token_embd.weight").then_some(Q2K)?
    });
    eprintln!("Q2_K: {identical}/{n} positions bit-identical, max |diff| {max_diff:e}");
    assert_eq!(identical, n, "max |diff| {max_diff:e}");
}

#[test]
fn tiny_q3_k_model_matches_llama_cpp_bit_for_bit() {
    // Every projection and the tied output Q3_K (tiled from 8 rows, vec_dot below).
    let (identical, max_diff, n) = tiny_kquant_agreement(|name| {
        (name.starts_with("blk.") || name == "token_embd.weight").then_some(Q3K)?
    });
    eprintln!("Q3_K: {identical}/{n} positions bit-identical, max |diff| {max_diff:e}");
    assert_eq!(identical, n, "max |diff| {max_diff:e}");
}

/// What speculative decoding's verify step relies on: on Q4_K_M's mix
/// (Q4_K repacked, Q6_K), a draft of 9 tokens scored in one forward through
/// `forward_alone` gets, token for token, the logits bits of decoding them
/// one at a time; the plain batched forward does not (its gemm and tiled
/// kernels round otherwise), which is why the engine does not use it there.
#[test]
fn tiny_kquant_draft_rows_scored_alone_equal_one_token_steps() {
    use std::sync::Arc;
    use tern_runtime::backend::{Backend, LogitsWanted, Row, TernBackend};
    use tern_runtime::kv::policy::KvPolicy;
    let dir = tempfile::tempdir().unwrap();
    let (path, _) = tiny_kquant_model(dir.path(), q4_k_m_mix);
    let model = Arc::new(tern_runtime::LoadedModel::load(&path).unwrap());
    let vocab = model.config().vocab_size;
    let tokens: Vec<u32> = (0..29).map(|i| ((i * 37 + 11) % vocab) as u32).collect();
    let (prefix, draft) = tokens.split_at(20);
    let mut tern = TernBackend::new(Arc::clone(&model));
    // Logits of `draft` after `prefix`, the draft fed in `chunks`.
    let mut score = |chunks: &[usize], alone: bool| -> Vec<u32> {
        let seq = tern
            .new_seq(&KvPolicy::Full, Default::default(), 64)
            .unwrap();
        let first = Row {
            seq,
            tokens: prefix,
            start_pos: 0,
            logits: LogitsWanted::None,
        };
        tern.forward(&[first]).unwrap();
        let (mut out, mut at) = (Vec::new(), 0);
        for &n in chunks {
            let rows = [Row {
                seq,
                tokens: &draft[at..at + n],
                start_pos: prefix.len() + at,
                logits: LogitsWanted::All,
            }];
            let l = if alone {
                tern.forward_alone(&rows)
            } else {
                tern.forward(&rows)
            };
            out.extend(
                l.unwrap()
                    .pop()
                    .flatten()
                    .unwrap()
                    .iter()
                    .map(|v| v.to_bits()),
            );
            at += n;
        }
        tern.free(seq);
        assert_eq!(out.len(), draft.len() * vocab);
        out
    };
    let steps = score(&[1; 9], false);
    assert_eq!(score(&[9], true), steps, "a 9-token draft scored alone");
    assert_eq!(
        score(&[4, 5], true),
        steps,
        "drafts of 4 and 5 scored alone"
    );
    assert_ne!(
        score(&[9], false),
        steps,
        "the batched kernels round otherwise"
    );
}
