//! Export: a new GGUF from a source GGUF plus replacement tensors, which is how
//! trained weights (a merged LoRA or a full fine-tune) become a file that
//! `tern serve` and llama.cpp both load.
//!
//! Every metadata entry of the source is copied (`general.file_type` set to the
//! export type; `general.alignment` dropped because the writer uses GGUF's
//! default), and every tensor, in the source's order. Matrices are written in
//! the export type, dequantized and re-quantized when the source's type differs
//! (a matrix whose rows are not whole blocks falls back to F16, as llama.cpp's
//! quantizer does; at q4_0 the output projection stays 8-bit, see
//! [`export_gguf`]); vectors (norms) are written as F32.
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

mod writer;

#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::fmt;
use std::io::BufWriter;
use std::path::Path;
use std::str::FromStr;

use candle_core::quantized::gguf_file::Value;
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{DType, Device, Tensor};

use crate::error::{ModelError, Result};
use crate::gguf::{first_line, GgufFile};
use writer::{GgufWriter, TensorEntry};

/// Weight type of the exported matrices.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExportQuant {
    /// 8-bit blocks of 32 with an f16 scale: near-lossless, about half of F16's size.
    Q8_0,
    /// 4-bit blocks of 32 with an f16 scale: smallest, and fastest to decode.
    Q4_0,
    /// Plain half precision: no quantization error beyond f16 rounding.
    F16,
}

impl ExportQuant {
    /// The ggml tensor type matrices are written in.
    pub fn ggml_dtype(self) -> GgmlDType {
        match self {
            Self::Q8_0 => GgmlDType::Q8_0,
            Self::Q4_0 => GgmlDType::Q4_0,
            Self::F16 => GgmlDType::F16,
        }
    }

    /// llama.cpp's `general.file_type` value for a file mostly of this type
    /// (`LLAMA_FTYPE_MOSTLY_*`), which tools show as the file's quantization.
    pub fn file_type(self) -> u32 {
        match self {
            Self::Q8_0 => 7,
            Self::Q4_0 => 2,
            Self::F16 => 1,
        }
    }
}

impl FromStr for ExportQuant {
    type Err = ModelError;

    /// Parses `q8_0`, `q4_0` or `f16` (any case), the names llama.cpp uses.
    fn from_str(s: &str) -> Result<Self> {
        match s.to_ascii_lowercase().as_str() {
            "q8_0" => Ok(Self::Q8_0),
            "q4_0" => Ok(Self::Q4_0),
            "f16" => Ok(Self::F16),
            _ => Err(ModelError::UnknownExportType(s.to_string())),
        }
    }
}

impl fmt::Display for ExportQuant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Q8_0 => "q8_0",
            Self::Q4_0 => "q4_0",
            Self::F16 => "f16",
        })
    }
}

/// What an export wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExportReport {
    /// Tensors in the new file.
    pub tensors: usize,
    /// How many of them came from the replacements.
    pub replaced: usize,
    /// Size of the new file in bytes.
    pub bytes: u64,
}

/// Writes `out` as a copy of `src` with the tensors in `replacements` swapped in.
///
/// Copies every metadata key of `src` (general.file_type updated to match `quant`) and every tensor;
/// tensors named in `replacements` (f32 candle Tensors in the GGUF's logical shape, e.g. [out, in] for
/// matrices) take the place of the source's; every 2-D weight matrix is written as `quant` (source
/// matrices are dequantized and re-quantized when their type differs), 1-D tensors (norms) as F32.
/// Writes to a temporary file beside `out` and renames it, so `out` is either the old file or the complete new one.
///
/// One exception to the matrix rule, as in llama.cpp's quantizer: at q4_0 the
/// output projection (`output.weight`, or `token_embd.weight` when tied) is
/// written as Q8_0, because 4-bit logits cost far more quality than 4-bit
/// hidden layers (SmolLM2 on a short text: +26% perplexity over the Q4_1
/// source instead of +17%).
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
    // 1. Open the source and check the replacements against it.
    let file = GgufFile::open(src)?;
    check_replacements(&file, replacements)?;
    // 2. Plan the new file: its metadata and tensor directory.
    let metadata = export_metadata(&file, quant);
    let entries = plan_tensors(&file, quant)?;
    // 3. Stream the tensors into a temporary file beside `out`.
    let mut tmp = temp_beside(out)?;
    let write_err = |source| ModelError::Write {
        path: out.to_path_buf(),
        source,
    };
    let meta_refs: Vec<(&str, &Value)> = metadata.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let buffered = BufWriter::with_capacity(1 << 20, tmp.as_file_mut());
    let mut w = GgufWriter::new(buffered, &meta_refs, &entries).map_err(write_err)?;
    for entry in &entries {
        let data = tensor_data(&file, entry, replacements.get(&entry.name))?;
        w.write_tensor(&data).map_err(write_err)?;
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

/// The source's metadata with `general.file_type` set for `quant` and
/// `general.alignment` dropped (the writer always aligns to GGUF's default).
fn export_metadata(file: &GgufFile, quant: ExportQuant) -> Vec<(String, Value)> {
    let mut meta: Vec<(String, Value)> = file
        .metadata()
        .into_iter()
        .filter(|(k, _)| *k != "general.file_type" && *k != "general.alignment")
        .map(|(k, v)| (k.to_string(), v.clone()))
        .collect();
    meta.push(("general.file_type".into(), Value::U32(quant.file_type())));
    meta.sort_by(|a, b| a.0.cmp(&b.0));
    meta
}

/// The directory of the new file: every source tensor, in source order, with
/// the type it will be written in.
fn plan_tensors(file: &GgufFile, quant: ExportQuant) -> Result<Vec<TensorEntry>> {
    file.tensor_names()
        .into_iter()
        .map(|name| {
            let dims = file
                .tensor_dims(name)
                .ok_or_else(|| ModelError::BadTensor {
                    name: name.into(),
                    reason: "missing from the file".into(),
                })?;
            let dtype = if name == output_projection(file) && quant == ExportQuant::Q4_0 {
                GgmlDType::Q8_0
            } else {
                target_dtype(&dims, quant)
            };
            Ok(TensorEntry {
                name: name.to_string(),
                dims,
                dtype,
            })
        })
        .collect()
}

/// The matrix that projects to the vocabulary: `output.weight`, or the token
/// embedding in a model that ties the two.
fn output_projection(file: &GgufFile) -> &'static str {
    if file.has_tensor("output.weight") {
        "output.weight"
    } else {
        "token_embd.weight"
    }
}

/// Vectors as F32; matrices as `quant`, or F16 when a row is not whole blocks.
fn target_dtype(dims: &[usize], quant: ExportQuant) -> GgmlDType {
    if dims.len() < 2 {
        return GgmlDType::F32;
    }
    let t = quant.ggml_dtype();
    let row = dims.last().copied().unwrap_or(0);
    if row.is_multiple_of(t.block_size()) {
        t
    } else {
        GgmlDType::F16
    }
}

/// The bytes of one tensor in its target type: the source's bytes as they are
/// when there is no replacement and the type already matches; otherwise the
/// replacement's or the dequantized source's values, quantized.
fn tensor_data(
    file: &GgufFile,
    entry: &TensorEntry,
    replacement: Option<&Tensor>,
) -> Result<Vec<u8>> {
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
            if q.dtype() == entry.dtype {
                return Ok(q.data()?.into_owned());
            }
            q.dequantize(&Device::Cpu)?
                .flatten_all()?
                .to_vec1::<f32>()?
        }
    };
    encode(entry, values)
}

/// `values` (the tensor flattened, row-major) in `entry`'s type, by candle's
/// quantizer (ggml's reference rounding; a least-squares scale search was
/// tried for Q4_0 and scored worse perplexity on SmolLM2).
fn encode(entry: &TensorEntry, values: Vec<f32>) -> Result<Vec<u8>> {
    let t = Tensor::from_vec(values, entry.dims.as_slice(), &Device::Cpu)?;
    let q = QTensor::quantize(&t, entry.dtype).map_err(|e| ModelError::BadTensor {
        name: entry.name.clone(),
        reason: first_line(&e),
    })?;
    Ok(q.data()?.into_owned())
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
