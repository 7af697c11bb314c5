//! Shared support for the kernel tests: ggml and llama.cpp's quantizer
//! called in process, tiny generated models, deterministic inputs, and the
//! real model when it is there. The runtime's whole-model tests and the root
//! package's end-to-end tests include several of these files (`ggml`,
//! `inputs`, `quantize`, `tiny`, `tiny_quant`) into their own `support`, so
//! each exists once.

// The files the root package's tests include too: each side uses its part.
#[allow(dead_code)]
pub mod ggml;
mod inputs;
#[allow(dead_code)]
pub mod quantize;
#[allow(dead_code)]
pub mod tiny;
#[allow(dead_code)]
pub mod tiny_quant;

mod real;
pub mod repacked;

pub use real::real_model;

use tern_models::quant::Kernel;

pub use inputs::values;

/// Threads for ggml's graph compute in the tests: one, as the root
/// package's tests run llama.cpp (see `LLAMA_THREADS` in tests/support
/// there): ggml's workers spin at every barrier, which stalls a small
/// machine running two tests at once.
pub const LLAMA_THREADS: i32 = 1;

/// The kernels this machine runs: AVX2 (when present) and always the
/// scalar reference.
pub fn kernels() -> Vec<Kernel> {
    if tern_models::quant::best_kernel() == Kernel::Avx2 {
        vec![Kernel::Avx2, Kernel::Scalar]
    } else {
        vec![Kernel::Scalar]
    }
}

/// The bits of `v`, for bit-for-bit comparisons.
pub fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}
