//! Export and quantization: a new GGUF from a source GGUF, optionally with
//! replacement tensors. With replacements it is how trained weights (a merged
//! LoRA or a full fine-tune) become a file that `tern serve` and llama.cpp
//! both load (`tern export`); without, it is `tern quantize`, Tern's own
//! `llama-quantize`.
//!
//! Every metadata entry of the source is copied (`general.file_type` and
//! `general.quantization_version` set as llama.cpp sets them;
//! `general.alignment` dropped because the writer uses GGUF's default), and
//! every tensor, in the source's order. Each tensor gets the type llama.cpp's
//! quantizer would give it for the file type ([`mix`]), and its values are
//! encoded by Tern's port of ggml's reference quantizers
//! ([`crate::quant::quantize`]), dequantizing first when the source's type
//! differs; a tensor whose type does not change is copied byte for byte.
//!
//! Tied embeddings: llama models such as SmolLM2 have no `output.weight`; the
//! token embedding doubles as the output projection. A trained output
//! projection therefore goes in as `token_embd.weight`, and asking to replace
//! `output.weight` in such a model is an error that says so, rather than a file
//! with a second, disagreeing matrix.
//!
//! The file is streamed one tensor at a time (see [`writer`]) into a temporary
//! file beside `out`, synced, then renamed over `out`: a reader sees the old file
//! or the complete new one, never a partial one. This module does not merge
//! LoRA (the trainer passes merged tensors) and does not read checkpoints.

pub mod mix;
mod writer;

#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::io::BufWriter;
use std::path::Path;

use candle_core::quantized::gguf_file::Value;
use candle_core::{DType, Device, Tensor};

use crate::error::{ModelError, Result};
use crate::gguf::GgufFile;
use crate::quant::quantize::{dequantize, quantize_to};
use crate::quant::WeightType;
pub use mix::{ModelShape, QuantType};
use writer::{GgufWriter, TensorEntry};

/// llama.cpp's `GGML_QNT_VERSION`, written as `general.quantization_version`.
const QUANTIZATION_VERSION: u32 = 2;

/// The type of an export: one of `tern quantize`'s types (see [`QuantType`]).
pub type ExportQuant = QuantType;

/// What an export wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExportReport {
    /// Tensors in the new file.
    pub tensors: usize,
    /// How many of them came from the replacements.
    pub replaced: usize,
    /// Size of the new file in bytes.
    pub bytes: u64,
    /// Tensors whose row length forced a smaller-block type than the mix
    /// asked for (llama.cpp's "fallback quantization").
    pub fallbacks: usize,
}

/// Writes `out` as a copy of `src` with the tensors in `replacements` swapped in.
///
/// Copies every metadata key of `src` (`general.file_type` set for `quant`,
/// `general.quantization_version` set as llama.cpp does) and every tensor;
/// tensors named in `replacements` (f32 candle Tensors in the GGUF's logical
/// shape, e.g. [out, in] for matrices) take the place of the source's. Each
/// tensor's type is the one `llama-quantize` would give it for `quant` (see
/// [`mix`]): for example the output projection (`output.weight`, or
/// `token_embd.weight` when tied) stays at 8 bits or more, because low-bit
/// logits cost far more quality than low-bit hidden layers, and norms keep
/// their type. Values are encoded by Tern's port of ggml's reference
/// quantizers, so the bytes equal llama.cpp's.
/// Writes to a temporary file beside `out` and renames it, so `out` is either the old file or the complete new one.
///
/// Names and shapes of the replacements are checked before anything is
/// written; a replacement holding NaN or infinity fails the export when it is
/// reached, leaving `out` untouched.
pub fn export_gguf(
    src: &Path,
    out: &Path,
    replacements: &HashMap<String, Tensor>,
    quant: ExportQuant,
) -> Result<ExportReport> {
    write_gguf(src, out, replacements, quant, &mut |_, _, _| {})
}

/// Quantizes the GGUF at `src` into `out` as `quant`, `llama-quantize`'s job
/// (default parameters, no importance matrix): every tensor gets the type and
/// the bytes llama.cpp would write. Tensors already quantized are dequantized
/// first (as llama.cpp's `--allow-requantize` does), which loses quality the
/// caller may want to warn about. `progress(done, total, name)` is called
/// after each tensor.
pub fn quantize_gguf(
    src: &Path,
    out: &Path,
    quant: QuantType,
    progress: &mut dyn FnMut(usize, usize, &str),
) -> Result<ExportReport> {
    write_gguf(src, out, &HashMap::new(), quant, progress)
}

/// [`export_gguf`] and [`quantize_gguf`]: plan, stream, rename.
fn write_gguf(
    src: &Path,
    out: &Path,
    replacements: &HashMap<String, Tensor>,
    quant: QuantType,
    progress: &mut dyn FnMut(usize, usize, &str),
) -> Result<ExportReport> {
    // 1. Open the source and check the replacements against it.
    let file = GgufFile::open(src)?;
    check_replacements(&file, replacements)?;
    // 2. Plan the new file: its metadata and tensor directory.
    let metadata = export_metadata(&file, quant);
    let (entries, fallbacks) = plan_tensors(&file, quant)?;
    // 3. Stream the tensors into a temporary file beside `out`.
    let mut tmp = temp_beside(out)?;
    let write_err = |source| ModelError::Write {
        path: out.to_path_buf(),
        source,
    };
    let meta_refs: Vec<(&str, &Value)> = metadata.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let buffered = BufWriter::with_capacity(1 << 20, tmp.as_file_mut());
    let mut w = GgufWriter::new(buffered, &meta_refs, &entries).map_err(write_err)?;
    for (i, entry) in entries.iter().enumerate() {
        let data = tensor_data(&file, entry, replacements.get(&entry.name))?;
        w.write_tensor(&data).map_err(write_err)?;
        progress(i + 1, entries.len(), &entry.name);
    }
    let (buffered, bytes) = w.finish().map_err(write_err)?;
    drop(buffered);
    // 4. Make it durable and readable, then rename it over `out`.
    tmp.as_file().sync_all().map_err(write_err)?;
    set_readable(tmp.as_file()).map_err(write_err)?;
    tmp.persist(out).map_err(|e| write_err(e.error))?;
    Ok(ExportReport {
        tensors: entries.len(),
        replaced: replacements.len(),
        bytes,
        fallbacks,
    })
}

/// Every replacement must name a source tensor and have its logical shape.
fn check_replacements(file: &GgufFile, replacements: &HashMap<String, Tensor>) -> Result<()> {
    let mut names: Vec<&String> = replacements.keys().collect();
    names.sort();
    for name in names {
        let Some(expected) = file.tensor_dims(name) else {
            let tied = name == "output.weight" && file.has_tensor("token_embd.weight");
            return Err(ModelError::UnknownTensor {
                name: name.clone(),
                path: file.path().to_path_buf(),
                hint: if tied {
                    " (this model ties its output projection to `token_embd.weight`; replace that)"
                        .into()
                } else {
                    String::new()
                },
            });
        };
        let found = replacements[name].dims().to_vec();
        if found != expected {
            return Err(ModelError::ShapeMismatch {
                name: name.clone(),
                expected,
                found,
            });
        }
    }
    Ok(())
}

/// The source's metadata with `general.file_type` and
/// `general.quantization_version` set as llama.cpp sets them and
/// `general.alignment` dropped (the writer always aligns to GGUF's default).
fn export_metadata(file: &GgufFile, quant: QuantType) -> Vec<(String, Value)> {
    const SET: [&str; 3] = [
        "general.file_type",
        "general.alignment",
        "general.quantization_version",
    ];
    let mut meta: Vec<(String, Value)> = file
        .metadata()
        .into_iter()
        .filter(|(k, _)| !SET.contains(k))
        .map(|(k, v)| (k.to_string(), v.clone()))
        .collect();
    meta.push(("general.file_type".into(), Value::U32(quant.file_type())));
    meta.push((
        "general.quantization_version".into(),
        Value::U32(QUANTIZATION_VERSION),
    ));
    meta.sort_by(|a, b| a.0.cmp(&b.0));
    meta
}

/// The model facts the type mix reads, from the metadata.
fn model_shape(file: &GgufFile) -> Result<ModelShape> {
    let arch = file.str("general.architecture")?.to_string();
    let n_layer = file.u32(&format!("{arch}.block_count"))? as usize;
    let n_head = file
        .u32(&format!("{arch}.attention.head_count"))
        .unwrap_or(0) as usize;
    let n_head_kv = file
        .u32(&format!("{arch}.attention.head_count_kv"))
        .map(|v| v as usize)
        .unwrap_or(n_head);
    Ok(ModelShape {
        arch,
        n_layer,
        n_head,
        n_head_kv,
    })
}

/// The directory of the new file: every source tensor, in source order, with
/// the type llama.cpp's mix gives it; and how many fell back.
fn plan_tensors(file: &GgufFile, quant: QuantType) -> Result<(Vec<TensorEntry>, usize)> {
    let mut tensors = Vec::new();
    for name in file.tensor_names() {
        if let Some(t) = file.own_type(name) {
            return Err(ModelError::BadTensor {
                name: name.into(),
                reason: format!("{} tensors cannot be requantized or exported yet", t.name()),
            });
        }
        let (Some(dims), Some(dtype)) = (file.tensor_dims(name), file.tensor_dtype(name)) else {
            return Err(ModelError::BadTensor {
                name: name.into(),
                reason: "missing from the file".into(),
            });
        };
        tensors.push((name.to_string(), dims, dtype));
    }
    let (types, fallbacks) = mix::Mix::plan(quant, model_shape(file)?, &tensors);
    let entries = tensors
        .into_iter()
        .map(|(name, dims, _)| TensorEntry {
            dtype: types[&name],
            name,
            dims,
        })
        .collect();
    Ok((entries, fallbacks))
}

/// The bytes of one tensor in its target type: the source's bytes as they are
/// when there is no replacement and the type already matches; otherwise the
/// replacement's or the dequantized source's values, quantized.
fn tensor_data(
    file: &GgufFile,
    entry: &TensorEntry,
    replacement: Option<&Tensor>,
) -> Result<Vec<u8>> {
    let bad = |reason: String| ModelError::BadTensor {
        name: entry.name.clone(),
        reason,
    };
    let values = match replacement {
        Some(t) => {
            let values = t
                .to_device(&Device::Cpu)?
                .to_dtype(DType::F32)?
                .flatten_all()?
                .to_vec1::<f32>()?;
            if values.iter().any(|v| !v.is_finite()) {
                return Err(ModelError::NonFiniteTensor {
                    name: entry.name.clone(),
                });
            }
            values
        }
        None => {
            let q = file.tensor(&entry.name)?;
            let data = q.data()?;
            if WeightType::Ggml(q.dtype()) == entry.dtype {
                return Ok(data.into_owned());
            }
            let n: usize = entry.dims.iter().product();
            dequantize(q.dtype(), &data, n).map_err(|e| bad(e.to_string()))?
        }
    };
    encode(entry, &values).map_err(bad)
}

/// `values` (the tensor flattened, row-major) in `entry`'s type, rows spread
/// over the machine's cores (every row is encoded on its own, so the split
/// cannot change a byte).
fn encode(entry: &TensorEntry, values: &[f32]) -> std::result::Result<Vec<u8>, String> {
    let cols = entry.dims.last().copied().unwrap_or(1).max(1);
    let rows = values.len() / cols;
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let per = rows.div_ceil(threads).max(1);
    let chunks: Vec<&[f32]> = values.chunks(per * cols).collect();
    let parts: Vec<std::result::Result<Vec<u8>, String>> = std::thread::scope(|s| {
        let handles: Vec<_> = chunks
            .iter()
            .map(|c| s.spawn(move || quantize_to(entry.dtype, c).map_err(|e| e.to_string())))
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err("a quantizer thread panicked".into()))
            })
            .collect()
    });
    let mut out = Vec::with_capacity(entry.bytes() as usize);
    for p in parts {
        out.extend_from_slice(&p?);
    }
    Ok(out)
}

/// A temporary file in `out`'s directory (a rename is only atomic within one
/// file system), named after `out` so a leftover from a killed run is recognisable.
fn temp_beside(out: &Path) -> Result<tempfile::NamedTempFile> {
    let write_err = |source| ModelError::Write {
        path: out.to_path_buf(),
        source,
    };
    let name = out.file_name().ok_or_else(|| {
        write_err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "the output path names no file",
        ))
    })?;
    let dir = match out.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    tempfile::Builder::new()
        .prefix(&format!(".{}.", name.to_string_lossy()))
        .suffix(".partial")
        .tempfile_in(dir)
        .map_err(write_err)
}

/// Temporary files are created owner-only; a model is read by other processes
/// (a server under another user), so the final file gets the usual 0644.
#[cfg(unix)]
fn set_readable(f: &std::fs::File) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    f.set_permissions(std::fs::Permissions::from_mode(0o644))
}

#[cfg(not(unix))]
fn set_readable(_f: &std::fs::File) -> std::io::Result<()> {
    Ok(())
}
