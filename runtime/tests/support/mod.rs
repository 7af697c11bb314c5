//! Support for the runtime's whole-model tests: the models crate's test
//! support (ggml and llama.cpp's quantizer in process, tiny generated models,
//! deterministic inputs), included rather than copied, and the real model
//! when it is there.

#[allow(dead_code)]
#[path = "../../../models/tests/support/ggml.rs"]
pub mod ggml;
#[allow(dead_code)]
#[path = "../../../models/tests/support/inputs.rs"]
mod inputs;
#[allow(dead_code)]
#[path = "../../../models/tests/support/quantize.rs"]
pub mod quantize;
#[path = "../../../models/tests/support/real.rs"]
mod real;
#[allow(dead_code)]
#[path = "../../../models/tests/support/tiny.rs"]
pub mod tiny;
#[allow(dead_code)]
#[path = "../../../models/tests/support/tiny_quant.rs"]
pub mod tiny_quant;

#[allow(unused_imports)]
pub use inputs::values;
pub use real::real_model;

/// Threads for llama.cpp in process: one, as in the models crate's and the
/// root package's tests (ggml's workers spin at every barrier, which stalls a
/// small machine running two tests at once).
pub const LLAMA_THREADS: i32 = 1;
