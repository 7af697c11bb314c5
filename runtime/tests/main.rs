//! Whole models through the runtime against llama.cpp in process: tiny
//! models quantized by llama.cpp's own quantizer (K-quants, IQ4) and KV caches
//! stored as f16, q8_0 and q4_0 give llama.cpp's logits bit for bit. They
//! need the `llama-cpp` feature (`cargo test -p tern-runtime --features
//! llama-cpp`, or the workspace's tests, where the binary turns it on); tests
//! that need the real model print `skipped: <why>` and pass when it is absent.
#![cfg(feature = "llama-cpp")]

mod support;

mod iq4;
mod kquant;
mod kv_dtype;
