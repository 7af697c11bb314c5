//! GGUF files: open, validate, read metadata and tensors.
//!
//! The file is memory-mapped (memmap2) and parsed with candle's GGUF reader; every
//! tensor's byte range is checked against the file size up front, so a truncated
//! or corrupt file fails at open with a clear error instead of mid-load. Tensors
//! are read from the mapping into candle quantized tensors exactly once; the
//! mapping is dropped after loading so the weights are not resident twice.
//!
//! Tensors of the types candle's `GgmlDType` lacks but Tern reads itself
//! ([`OwnType`]: IQ4_NL, IQ4_XS) are listed by Tern's own walk of the tensor
//! directory; candle parses the metadata from a copy of the header whose type
//! fields for them are masked, and their bytes come straight from the mapping
//! ([`GgufFile::own_tensor`]).

use std::collections::BTreeMap;
use std::io::Cursor;
use std::path::{Path, PathBuf};

use candle_core::quantized::gguf_file::{Content, Value};
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::Device;
use memmap2::Mmap;

use crate::error::{ModelError, Result};
use crate::gguf_types::{own_tensors, OwnType};

/// An opened, validated GGUF file: its metadata and tensor directory, plus the mapping
/// tensors are read from.
pub struct GgufFile {
    path: PathBuf,
    mmap: Mmap,
    content: Content,
    /// The tensors of types candle cannot read, by name (absent from
    /// `content.tensor_infos`).
    own: BTreeMap<String, OwnInfo>,
}

/// Where an [`OwnType`] tensor lies.
#[derive(Debug, Clone)]
struct OwnInfo {
    ty: OwnType,
    dims: Vec<usize>,
    offset: u64,
}

impl OwnInfo {
    fn bytes(&self) -> u64 {
        let elems: usize = self.dims.iter().product();
        (elems / self.ty.block_values() * self.ty.block_bytes()) as u64
    }
}

/// An [`OwnType`] tensor's type, shape and bytes, borrowed from the mapping.
#[derive(Debug, Clone, Copy)]
pub struct OwnTensorData<'a> {
    /// Its type.
    pub ty: OwnType,
    /// Its shape, row-major.
    pub dims: &'a [usize],
    /// Its bytes in ggml's layout.
    pub data: &'a [u8],
}

impl GgufFile {
    /// Maps and parses `path`, checking that every tensor lies inside the file.
    pub fn open(path: &Path) -> Result<Self> {
        if !path.exists() {
            return Err(ModelError::NotFound(path.to_path_buf()));
        }
        let file = std::fs::File::open(path).map_err(|source| ModelError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        // SAFETY: the file is opened read-only and Tern never writes to a model it
        // has open; a concurrent external truncation would be a user error.
        let mmap = unsafe { Mmap::map(&file) }.map_err(|source| ModelError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        let invalid = |reason: String| ModelError::InvalidGguf {
            path: path.to_path_buf(),
            reason,
        };
        if mmap.len() < 4 || &mmap[..4] != b"GGUF" {
            return Err(invalid("missing GGUF magic bytes".into()));
        }
        // Tern's own types: candle reads a copy of the header with their type
        // fields masked as F32 (its reader only parses the header), and Tern
        // keeps their directory entries.
        let dir = own_tensors(&mmap[..]).filter(|d| !d.tensors.is_empty());
        let masked = dir.as_ref().map(|d| {
            let mut h = mmap[..d.header_len].to_vec();
            for t in &d.tensors {
                h[t.type_field_at..t.type_field_at + 4].copy_from_slice(&0u32.to_le_bytes());
            }
            h
        });
        let header: &[u8] = masked.as_deref().unwrap_or(&mmap[..]);
        let mut content = Content::read(&mut Cursor::new(header)).map_err(|e| {
            // candle's reader stops at a type it does not know without
            // naming the tensor: walk the header to name both.
            match crate::gguf_types::first_unreadable_tensor(&mmap[..]) {
                Some(t) => invalid(t.to_string()),
                None => invalid(first_line(&e)),
            }
        })?;
        let file_len = mmap.len() as u64;
        let mut own = BTreeMap::new();
        for t in dir.map(|d| d.tensors).unwrap_or_default() {
            content.tensor_infos.remove(&t.name);
            let (block, row) = (t.ty.block_values(), t.dims.last().copied().unwrap_or(0));
            if row % block != 0 {
                return Err(invalid(format!(
                    "tensor {}: row length {row} is not a multiple of the {block}-value \
                     blocks of its type {}",
                    t.name,
                    t.ty.name()
                )));
            }
            let info = OwnInfo {
                ty: t.ty,
                dims: t.dims,
                offset: t.offset,
            };
            let end = content.tensor_data_offset + info.offset + info.bytes();
            if end > file_len {
                return Err(invalid(format!(
                    "truncated: tensor {} ends at byte {end} but the file has {file_len}",
                    t.name
                )));
            }
            own.insert(t.name, info);
        }
        for (name, info) in &content.tensor_infos {
            let elems = info.shape.elem_count();
            let block = info.ggml_dtype.block_size();
            let row = info.shape.dims().last().copied().unwrap_or(0);
            if block > 1 && row % block != 0 {
                return Err(invalid(format!(
                    "tensor {name}: row length {row} is not a multiple of the {block}-value \
                     blocks of its type {:?}",
                    info.ggml_dtype
                )));
            }
            if elems % block != 0 {
                return Err(invalid(format!(
                    "tensor {name} has {elems} elements, not a multiple of its block size {block}"
                )));
            }
            let bytes = (elems / block * info.ggml_dtype.type_size()) as u64;
            let end = content.tensor_data_offset + info.offset + bytes;
            if end > file_len {
                return Err(invalid(format!(
                    "truncated: tensor {name} ends at byte {end} but the file has {file_len}"
                )));
            }
        }
        Ok(Self {
            path: path.to_path_buf(),
            mmap,
            content,
            own,
        })
    }

    /// The path this file was opened from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Size of the file in bytes.
    pub fn file_bytes(&self) -> u64 {
        self.mmap.len() as u64
    }

    /// The raw metadata value under `key`, if present.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.content.metadata.get(key)
    }

    /// A required unsigned integer (any integer width accepted).
    pub fn u32(&self, key: &str) -> Result<u32> {
        self.get(key)
            .and_then(|v| match v {
                Value::U8(x) => Some(*x as u32),
                Value::U16(x) => Some(*x as u32),
                Value::U32(x) => Some(*x),
                Value::U64(x) => u32::try_from(*x).ok(),
                Value::I32(x) => u32::try_from(*x).ok(),
                Value::I64(x) => u32::try_from(*x).ok(),
                _ => None,
            })
            .ok_or_else(|| missing(key))
    }

    /// A required float.
    pub fn f32(&self, key: &str) -> Result<f32> {
        self.get(key)
            .and_then(|v| match v {
                Value::F32(x) => Some(*x),
                Value::F64(x) => Some(*x as f32),
                _ => None,
            })
            .ok_or_else(|| missing(key))
    }

    /// A required string.
    pub fn str(&self, key: &str) -> Result<&str> {
        match self.get(key) {
            Some(Value::String(s)) => Ok(s.as_str()),
            _ => Err(missing(key)),
        }
    }

    /// An optional boolean.
    pub fn bool_opt(&self, key: &str) -> Option<bool> {
        match self.get(key) {
            Some(Value::Bool(b)) => Some(*b),
            _ => None,
        }
    }

    /// A required array of strings (e.g. the vocabulary or merges).
    pub fn str_array(&self, key: &str) -> Result<Vec<&str>> {
        match self.get(key) {
            Some(Value::Array(items)) => items
                .iter()
                .map(|v| match v {
                    Value::String(s) => Ok(s.as_str()),
                    _ => Err(missing(key)),
                })
                .collect(),
            _ => Err(missing(key)),
        }
    }

    /// A required array of integers (e.g. token types).
    pub fn i32_array(&self, key: &str) -> Result<Vec<i32>> {
        match self.get(key) {
            Some(Value::Array(items)) => items
                .iter()
                .map(|v| match v {
                    Value::I32(x) => Ok(*x),
                    Value::U32(x) => Ok(*x as i32),
                    Value::I8(x) => Ok(*x as i32),
                    Value::U8(x) => Ok(*x as i32),
                    _ => Err(missing(key)),
                })
                .collect(),
            _ => Err(missing(key)),
        }
    }

    /// Every metadata entry, sorted by key: GGUF readers do not depend on the
    /// order, and a sorted copy makes an exported file reproducible.
    pub fn metadata(&self) -> Vec<(&str, &Value)> {
        let mut entries: Vec<(&str, &Value)> = self
            .content
            .metadata
            .iter()
            .map(|(k, v)| (k.as_str(), v))
            .collect();
        entries.sort_by_key(|(k, _)| *k);
        entries
    }

    /// Tensor names in the order their data lies in the file, so a copy reads
    /// the mapping front to back.
    pub fn tensor_names(&self) -> Vec<&str> {
        let mut names: Vec<(&str, u64)> = self
            .content
            .tensor_infos
            .iter()
            .map(|(name, info)| (name.as_str(), info.offset))
            .chain(self.own.iter().map(|(n, i)| (n.as_str(), i.offset)))
            .collect();
        names.sort_by_key(|&(name, offset)| (offset, name));
        names.into_iter().map(|(name, _)| name).collect()
    }

    /// The stored ggml type of tensor `name`, if present and of a type candle
    /// knows (see [`GgufFile::own_type`] for the others).
    pub fn tensor_dtype(&self, name: &str) -> Option<GgmlDType> {
        self.content.tensor_infos.get(name).map(|t| t.ggml_dtype)
    }

    /// The type of tensor `name` if it is one Tern reads past candle.
    pub fn own_type(&self, name: &str) -> Option<OwnType> {
        self.own.get(name).map(|t| t.ty)
    }

    /// Whether a tensor named `name` exists.
    pub fn has_tensor(&self, name: &str) -> bool {
        self.content.tensor_infos.contains_key(name) || self.own.contains_key(name)
    }

    /// Tensor `name`'s type, shape and bytes if it is of an [`OwnType`]: the
    /// one way such a tensor's data leaves the file.
    pub fn own_tensor(&self, name: &str) -> Option<OwnTensorData<'_>> {
        let info = self.own.get(name)?;
        let start = (self.content.tensor_data_offset + info.offset) as usize;
        // Bounds were checked at open.
        let data = &self.mmap[start..start + info.bytes() as usize];
        Some(OwnTensorData {
            ty: info.ty,
            dims: &info.dims,
            data,
        })
    }

    /// Reads tensor `name` from the mapping into a quantized tensor on the CPU.
    pub fn tensor(&self, name: &str) -> Result<QTensor> {
        if let Some(t) = self.own.get(name) {
            return Err(ModelError::BadTensor {
                name: name.into(),
                reason: format!(
                    "{} is read only as a weight matrix of a llama-family model",
                    t.ty.name()
                ),
            });
        }
        if !self.has_tensor(name) {
            return Err(ModelError::BadTensor {
                name: name.into(),
                reason: "missing from the file".into(),
            });
        }
        let tensor = self
            .content
            .tensor(&mut Cursor::new(&self.mmap[..]), name, &Device::Cpu)
            .map_err(|e| ModelError::BadTensor {
                name: name.into(),
                reason: first_line(&e),
            })?;
        self.release_pages(name);
        Ok(tensor)
    }

    /// [`GgufFile::tensor`], refused unless its shape is `dims`: what a loader
    /// that knows the model's shape reads a weight with.
    pub fn tensor_shaped(&self, name: &str, dims: &[usize]) -> Result<QTensor> {
        let t = self.tensor(name)?;
        if t.shape().dims() != dims {
            return Err(ModelError::BadTensor {
                name: name.into(),
                reason: format!("expected shape {dims:?}, found {:?}", t.shape().dims()),
            });
        }
        Ok(t)
    }

    /// Drops the mapped pages of tensor `name` from this process's resident set
    /// once it has been copied out, so the weights are never resident twice.
    #[cfg(unix)]
    pub(crate) fn release_pages(&self, name: &str) {
        let (offset, len) = if let Some(info) = self.content.tensor_infos.get(name) {
            let elems = info.shape.elem_count();
            let len = elems / info.ggml_dtype.block_size() * info.ggml_dtype.type_size();
            (info.offset, len)
        } else if let Some(info) = self.own.get(name) {
            (info.offset, info.bytes() as usize)
        } else {
            return;
        };
        let start = (self.content.tensor_data_offset + offset) as usize;
        // SAFETY: the mapping is private and read-only and no reference into this
        // range outlives the copy just made; after MADV_DONTNEED a later read
        // simply faults the file's pages back in. Bounds were checked at open.
        // A failed hint only costs memory, so its result is ignored.
        let _ = unsafe {
            self.mmap
                .unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, start, len)
        };
    }

    #[cfg(not(unix))]
    pub(crate) fn release_pages(&self, _name: &str) {}

    /// The logical shape of tensor `name` (GGUF order reversed into row-major dims).
    pub fn tensor_dims(&self, name: &str) -> Option<Vec<usize>> {
        self.content
            .tensor_infos
            .get(name)
            .map(|t| t.shape.dims().to_vec())
            .or_else(|| self.own.get(name).map(|t| t.dims.clone()))
    }

    /// A summary of the tensors: count and bytes per quantization type, total bytes
    /// and element count.
    pub fn tensor_summary(&self) -> TensorSummary {
        let mut by_type: BTreeMap<String, (usize, u64)> = BTreeMap::new();
        let mut bytes = 0u64;
        let mut params = 0u64;
        for info in self.content.tensor_infos.values() {
            let elems = info.shape.elem_count();
            let b = (elems / info.ggml_dtype.block_size() * info.ggml_dtype.type_size()) as u64;
            let e = by_type.entry(dtype_name(info.ggml_dtype)).or_default();
            e.0 += 1;
            e.1 += b;
            bytes += b;
            params += elems as u64;
        }
        for info in self.own.values() {
            let b = info.bytes();
            let e = by_type.entry(info.ty.name().to_string()).or_default();
            e.0 += 1;
            e.1 += b;
            bytes += b;
            params += info.dims.iter().product::<usize>() as u64;
        }
        TensorSummary {
            tensors: self.content.tensor_infos.len() + self.own.len(),
            bytes,
            params,
            by_type,
        }
    }
}

/// Counts and sizes of a file's tensors, for `tern info`.
#[derive(Debug, Clone, serde::Serialize)]
pub struct TensorSummary {
    /// Number of tensors.
    pub tensors: usize,
    /// Bytes of tensor data in the file.
    pub bytes: u64,
    /// Total element count (parameters).
    pub params: u64,
    /// Per quantization type: (tensor count, bytes).
    pub by_type: BTreeMap<String, (usize, u64)>,
}

/// The GGUF name of a quantization type (`Q4_1`, `F32`, ...).
pub fn dtype_name(t: GgmlDType) -> String {
    format!("{t:?}").to_uppercase()
}

fn missing(key: &str) -> ModelError {
    ModelError::MissingMetadata { key: key.into() }
}

/// The first line of an error's message: candle appends backtraces to some.
pub(crate) fn first_line(e: &dyn std::fmt::Display) -> String {
    e.to_string().lines().next().unwrap_or_default().to_string()
}

/// One metadata value on one line (arrays by their length, long strings
/// cut): how `tern info` lists a file it cannot run.
pub fn value_summary(v: &Value) -> String {
    match v {
        Value::String(s) if s.chars().count() > 80 => {
            format!(
                "{:?}... ({} chars)",
                s.chars().take(80).collect::<String>(),
                s.chars().count()
            )
        }
        Value::String(s) => format!("{s:?}"),
        Value::Array(items) => format!("[{} items]", items.len()),
        Value::U8(x) => x.to_string(),
        Value::I8(x) => x.to_string(),
        Value::U16(x) => x.to_string(),
        Value::I16(x) => x.to_string(),
        Value::U32(x) => x.to_string(),
        Value::I32(x) => x.to_string(),
        Value::U64(x) => x.to_string(),
        Value::I64(x) => x.to_string(),
        Value::F32(x) => x.to_string(),
        Value::F64(x) => x.to_string(),
        Value::Bool(x) => x.to_string(),
    }
}
