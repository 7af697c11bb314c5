//! `tern-models`: model architectures and their weights.
//!
//! Owns GGUF loading (memmap2 + candle quantized tensors), the model
//! configuration read from GGUF metadata, the shared decoder's forward pass over
//! a ragged batch ([`decoder`]), each architecture's features behind one seam
//! ([`arch`]), the KV seam trait the runtime implements, the export of trained weights
//! back to GGUF. It knows nothing of tokenizers, sampling or serving, and never
//! fetches anything (that is `tern-hub`).

pub mod adapter_file;
pub mod arch;
pub mod attention;
mod batch;
mod config;
pub mod decoder;
mod error;
mod exact;
pub mod export;
pub mod flash;
mod frozen;
pub mod gguf;
pub mod gguf_types;
mod grad;
mod kv;
pub mod kv_dtype;
mod lora;
mod mask;
pub mod quant;
mod rope;
mod visibility;
mod weight;

pub use adapter_file::{load_adapter, save_adapter};
pub use arch::{Arch, Model};
pub use batch::{LogitsWanted, SeqBatch};
pub use config::ModelConfig;
pub use decoder::{Decoder, Trunk};
pub use error::{ModelError, Result};
pub use export::{export_gguf, quantize_gguf, ExportQuant, ExportReport, QuantType};
pub use flash::FlashKernel;
pub use gguf::GgufFile;
pub use kv::{KvStore, WeightsWanted, HIDDEN_POSITION};
pub use kv_dtype::KvDtype;
pub use lora::{LoraAdapter, LoraSet, LoraTarget};
pub use rope::Rotary;
pub use visibility::{EvictionLog, Visibility};
pub use weight::Precision;
