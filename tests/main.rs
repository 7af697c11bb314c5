//! End-to-end tests: the tiny generated model for fast paths, the real
//! SmolLM2-135M-Instruct for agreement with llama.cpp's reference outputs.

mod support;

mod architecture;
mod backend;
mod cli;
mod engine;
mod export;
mod fleet;
mod formats;
mod forward;
mod humaneval;
mod kv;
mod kv_tee;
mod learner;
mod overflow;
mod plot;
mod quantize;
mod qwen;
mod reasoning;
mod reference;
mod ruler;
mod security;
mod speculative;
mod spm;
mod spreadsheet;
mod templates;
mod tokenizer;
mod train;
mod vocab;
