//! Tern's quantized linear layer, [`QLinear`], and what it is built from.
//!
//! candle 0.11's `QMatMul` has no SIMD Q4_1 kernel and its thread pool spends much
//! of a decode step spinning, so Tern runs the GGUF block formats its models ship
//! in (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, F16, BF16) on its own kernels, numerically
//! equivalent to llama.cpp's CPU path, our correctness reference.
//!
//! - [`blocks`]: the block formats, Tern's packed layout, and the reference
//!   (scalar) activation quantization and weight dequantization.
//! - [`dot`]: AVX2+FMA and portable dot kernels, chosen once at run time.
//! - [`float`]: F16 and BF16 weights, in llama.cpp's two summation orders.
//! - [`pool`]: the persistent worker pool the products run on.
//! - [`k`]: the K-quant formats (256-value super-blocks, Q8_K activations).
//! - [`iq4`]: IQ4_NL and IQ4_XS, the formats with a non-linear value table,
//!   read past candle (its `GgmlDType` has no such types).
//! - [`linear`]: the layer itself.
//! - [`quantize`]: Tern's own quantizer, f32 into these formats as ggml's
//!   reference quantizers write them.
//! - [`alone`]: products that give each activation row its one-row bits
//!   (speculative decoding's verify step).

pub mod alone;
pub mod blocks;
pub mod dot;
pub mod float;
pub mod iq4;
pub mod k;
pub mod linear;
pub mod pool;
pub mod quantize;

#[cfg(test)]
mod tests;

pub use dot::{best_kernel, Kernel};
pub use linear::{dequantize, dequantize_own, glu, QLinear, WeightType};
