//! A streaming GGUF (version 3) writer: the header (metadata and tensor
//! directory) first, then each tensor's bytes as they are produced.
//!
//! candle's `gguf_file::write` wants every tensor in memory before it writes a
//! byte; an export on a memory-capped device should hold one tensor at a time,
//! so the directory is written from sizes known up front and the data follows.
//! This file only serializes; what to write is decided in `export.rs`, and
//! reading GGUF stays in `gguf.rs`.

use std::io::{self, Write};

use candle_core::quantized::gguf_file::Value;
use candle_core::quantized::GgmlDType;

use crate::quant::WeightType;

/// Alignment of the data section and of every tensor in it: GGUF's default, so
/// the file needs no `general.alignment` key.
pub const ALIGNMENT: u64 = 32;

/// One entry of the tensor directory.
#[derive(Debug, Clone)]
pub struct TensorEntry {
    /// Tensor name, e.g. `blk.0.attn_q.weight`.
    pub name: String,
    /// Logical shape, row-major (`[out, in]` for a matrix); GGUF stores it reversed.
    pub dims: Vec<usize>,
    /// Type the data is written in.
    pub dtype: WeightType,
}

impl TensorEntry {
    /// Bytes of this tensor's data (without padding).
    pub fn bytes(&self) -> u64 {
        let elems: usize = self.dims.iter().product();
        (elems / self.dtype.block_size() * self.dtype.type_size()) as u64
    }
}

/// Writes one GGUF file: [`GgufWriter::new`] writes the header, then
/// [`GgufWriter::write_tensor`] once per directory entry in order, then
/// [`GgufWriter::finish`].
pub struct GgufWriter<W: Write> {
    w: W,
    /// Bytes written so far (the stream position).
    pos: u64,
    /// Data size of each directory entry, in order.
    sizes: Vec<u64>,
    /// Index of the next tensor to write.
    next: usize,
}

impl<W: Write> GgufWriter<W> {
    /// Writes the magic, version, counts, every metadata entry, the tensor
    /// directory (offsets computed from the entries' sizes) and the padding up
    /// to the data section.
    pub fn new(w: W, metadata: &[(&str, &Value)], tensors: &[TensorEntry]) -> io::Result<Self> {
        let mut this = Self {
            w,
            pos: 0,
            sizes: tensors.iter().map(TensorEntry::bytes).collect(),
            next: 0,
        };
        this.put(b"GGUF")?;
        this.put(&3u32.to_le_bytes())?;
        this.put(&(tensors.len() as u64).to_le_bytes())?;
        this.put(&(metadata.len() as u64).to_le_bytes())?;
        for (key, value) in metadata {
            this.string(key)?;
            this.put(&value_type(value).to_le_bytes())?;
            this.value(value)?;
        }
        let mut offset = 0u64;
        for t in tensors {
            this.string(&t.name)?;
            this.put(&(t.dims.len() as u32).to_le_bytes())?;
            for &d in t.dims.iter().rev() {
                this.put(&(d as u64).to_le_bytes())?;
            }
            let id = match t.dtype {
                WeightType::Ggml(d) => ggml_type_id(d),
                WeightType::Own(o) => o.id(),
            };
            this.put(&id.to_le_bytes())?;
            this.put(&offset.to_le_bytes())?;
            offset += padded(t.bytes());
        }
        this.pad()?;
        Ok(this)
    }

    /// Appends the data of the next directory entry; its length must be the
    /// entry's size.
    pub fn write_tensor(&mut self, data: &[u8]) -> io::Result<()> {
        let Some(&size) = self.sizes.get(self.next) else {
            return Err(invalid("more tensors written than the directory lists"));
        };
        if data.len() as u64 != size {
            return Err(invalid(&format!(
                "tensor {} has {} bytes, the directory says {size}",
                self.next,
                data.len()
            )));
        }
        self.put(data)?;
        self.pad()?;
        self.next += 1;
        Ok(())
    }

    /// Checks that every listed tensor was written, flushes, and returns the
    /// inner writer and the file's size in bytes.
    pub fn finish(mut self) -> io::Result<(W, u64)> {
        if self.next != self.sizes.len() {
            return Err(invalid(&format!(
                "{} of {} tensors written",
                self.next,
                self.sizes.len()
            )));
        }
        self.w.flush()?;
        Ok((self.w, self.pos))
    }

    fn put(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.w.write_all(bytes)?;
        self.pos += bytes.len() as u64;
        Ok(())
    }

    fn pad(&mut self) -> io::Result<()> {
        let n = padded(self.pos) - self.pos;
        self.put(&[0u8; ALIGNMENT as usize][..n as usize])
    }

    fn string(&mut self, s: &str) -> io::Result<()> {
        self.put(&(s.len() as u64).to_le_bytes())?;
        self.put(s.as_bytes())
    }

    fn value(&mut self, v: &Value) -> io::Result<()> {
        match v {
            Value::U8(x) => self.put(&x.to_le_bytes()),
            Value::I8(x) => self.put(&x.to_le_bytes()),
            Value::U16(x) => self.put(&x.to_le_bytes()),
            Value::I16(x) => self.put(&x.to_le_bytes()),
            Value::U32(x) => self.put(&x.to_le_bytes()),
            Value::I32(x) => self.put(&x.to_le_bytes()),
            Value::U64(x) => self.put(&x.to_le_bytes()),
            Value::I64(x) => self.put(&x.to_le_bytes()),
            Value::F32(x) => self.put(&x.to_le_bytes()),
            Value::F64(x) => self.put(&x.to_le_bytes()),
            Value::Bool(x) => self.put(&[u8::from(*x)]),
            Value::String(s) => self.string(s),
            Value::Array(items) => {
                // GGUF arrays are homogeneous; an empty one still needs a type.
                let elem = match items.first() {
                    Some(first) => value_type(first),
                    None => 4,
                };
                for item in items {
                    if value_type(item) != elem {
                        return Err(invalid("a metadata array mixes value types"));
                    }
                }
                self.put(&elem.to_le_bytes())?;
                self.put(&(items.len() as u64).to_le_bytes())?;
                items.iter().try_for_each(|item| self.value(item))
            }
        }
    }
}

/// `n` rounded up to the alignment.
fn padded(n: u64) -> u64 {
    n.div_ceil(ALIGNMENT) * ALIGNMENT
}

/// GGUF's numeric id of a metadata value's type.
fn value_type(v: &Value) -> u32 {
    match v {
        Value::U8(_) => 0,
        Value::I8(_) => 1,
        Value::U16(_) => 2,
        Value::I16(_) => 3,
        Value::U32(_) => 4,
        Value::I32(_) => 5,
        Value::F32(_) => 6,
        Value::Bool(_) => 7,
        Value::String(_) => 8,
        Value::Array(_) => 9,
        Value::U64(_) => 10,
        Value::I64(_) => 11,
        Value::F64(_) => 12,
    }
}

/// ggml's numeric id of a tensor type (candle keeps its own mapping private).
pub fn ggml_type_id(t: GgmlDType) -> u32 {
    match t {
        GgmlDType::F32 => 0,
        GgmlDType::F16 => 1,
        GgmlDType::Q4_0 => 2,
        GgmlDType::Q4_1 => 3,
        GgmlDType::Q5_0 => 6,
        GgmlDType::Q5_1 => 7,
        GgmlDType::Q8_0 => 8,
        GgmlDType::Q8_1 => 9,
        GgmlDType::Q2K => 10,
        GgmlDType::Q3K => 11,
        GgmlDType::Q4K => 12,
        GgmlDType::Q5K => 13,
        GgmlDType::Q6K => 14,
        GgmlDType::Q8K => 15,
        GgmlDType::BF16 => 30,
    }
}

fn invalid(msg: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, msg.to_string())
}
