//! The kernel tests: Tern's quantized kernels, dequantization and quantizers
//! against ggml's and llama.cpp's own code, called in process (linked
//! through llama-cpp-sys-2), bit for bit. Tests that need the real model
//! print `skipped: <why>` and pass when it is absent.

mod support;

mod iq4;
mod kquant;
mod quantize;
mod repack;
