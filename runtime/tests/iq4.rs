//! Tiny models quantized by llama.cpp's quantizer to IQ4_NL and IQ4_XS,
//! teacher-forced through Tern and llama.cpp over 256 positions: logits bit
//! for bit. (The IQ4 kernels and quantizers against ggml's: the models
//! crate's `models/tests/iq4.rs`.)
#![cfg(feature = "llama-cpp")]

use tern_models::gguf_types::OwnType;

use crate::kquant::agreement;
use crate::support::quantize::{self, LLAMA_FTYPE_MOSTLY_IQ4_NL};
use crate::support::tiny::TinySpec;
use crate::support::tiny_quant::{tiny_iq4, PROJECTIONS};

/// [`tiny_iq4`]'s model, Tern and llama.cpp teacher-forced over its 256
/// positions in chunks of 253 (a prefill: gemm on 252 rows and gemv on 1
/// where repacked, tinyBLAS or tiled where not), 1 and 2 tokens. Returns how
/// many tensors are `own` and the (identical positions, max |diff|,
/// positions).
fn tiny_agreement(
    spec: &TinySpec,
    ftype: quantize::llama_ftype,
    own: OwnType,
    embd: bool,
) -> (usize, usize, f32, usize) {
    let dir = tempfile::tempdir().unwrap();
    let (path, count) = tiny_iq4(dir.path(), spec, ftype, own, embd);
    let n = spec.context_length;
    let (identical, max_diff, n) = agreement(&path, &[n - 3, 1, 2]);
    (count, identical, max_diff, n)
}

#[test]
fn tiny_iq4_nl_matches_llama_cpp_bit_for_bit() {
    // The default tiny model: projections of 32, 64 and 128 rows repacked by
    // llama.cpp. Its mix gives the tied embedding Q8_0; forced to IQ4_NL, the
    // output (263 rows) runs plain and the lookups dequantize.
    for embd in [false, true] {
        let (count, identical, max_diff, n) = tiny_agreement(
            &TinySpec::default(),
            LLAMA_FTYPE_MOSTLY_IQ4_NL,
            OwnType::Iq4Nl,
            embd,
        );
        eprintln!("IQ4_NL ({count} tensors): {identical}/{n} positions bit-identical, max |diff| {max_diff:e}");
        assert!(
            count >= PROJECTIONS + embd as usize,
            "{count} IQ4_NL tensors"
        );
        assert_eq!(identical, n, "max |diff| {max_diff:e}");
    }
}

#[test]
fn tiny_iq4_xs_matches_llama_cpp_bit_for_bit() {
    // Rows of 256 values (IQ4_XS's super-blocks; shorter rows would fall back
    // to IQ4_NL): tiled matmul for the prefill, vec_dot for the steps.
    let spec = TinySpec {
        n_embd: 256,
        n_ff: 512,
        ..TinySpec::default()
    };
    // The mix gives the tied embedding Q6_K; forced to IQ4_XS, it runs too.
    for embd in [false, true] {
        let (count, identical, max_diff, n) = tiny_agreement(
            &spec,
            quantize::LLAMA_FTYPE_MOSTLY_IQ4_XS,
            OwnType::Iq4Xs,
            embd,
        );
        eprintln!("IQ4_XS ({count} tensors): {identical}/{n} positions bit-identical, max |diff| {max_diff:e}");
        assert!(
            count >= PROJECTIONS + embd as usize,
            "{count} IQ4_XS tensors"
        );
        assert_eq!(identical, n, "max |diff| {max_diff:e}");
    }
}
