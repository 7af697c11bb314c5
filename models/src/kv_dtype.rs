//! How a KV cache stores its keys and values: the element types llama.cpp
//! offers for its cache (`-ctk`/`-ctv`), with its encodings, so a cache of any
//! type holds the very numbers llama.cpp's would and attention over it rounds
//! as llama.cpp's does.
//!
//! - `f32`: four bytes a value, what Tern stored before; kept for comparison.
//! - `f16`: llama.cpp's default. Serving keys and values are f16-rounded before
//!   they reach the cache, so f16 storage holds the same numbers in half the bytes.
//! - `q8_0`: blocks of 32 values, an f16 scale and 32 signed bytes (34 bytes),
//!   written as ggml's AVX2 `quantize_row_q8_0` writes them (ties to even).
//! - `q4_0`: blocks of 32 values, an f16 scale and 16 bytes of nibbles (18 bytes),
//!   written as ggml's reference `quantize_row_q4_0` writes them.
//!
//! Quantized caches hold keys and values rotated by an orthonormal
//! Walsh-Hadamard transform, as llama.cpp's do since it added attention
//! rotation: the rotation spreads a few large channels over the whole block,
//! so 8 and 4 bits lose less. Queries are rotated with the keys (dot products
//! unchanged), and the attention output is rotated back (the transform is its
//! own inverse). See [`KvDtype::rotation`] and [`hadamard`].
//!
//! Quantized rows are kept in a `u8` tensor `[heads, capacity, row_bytes]`; f16
//! rows in an f16 tensor; a row's type is known from the cache, not the tensor.

use std::fmt;
use std::str::FromStr;

use candle_core::{DType, Device, Tensor};
use half::f16;

use crate::error::{ModelError, Result};
use crate::quant::blocks::{quantize_block_ref, QK};
use crate::quant::quantize::blocks32;

/// The element type of a KV cache's keys and values.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum KvDtype {
    /// 32-bit floats (Tern's storage before f16; twice llama.cpp's bytes).
    F32,
    /// 16-bit floats: llama.cpp's default, the same numbers as f32 here.
    #[default]
    F16,
    /// ggml's Q8_0 blocks: 8.5 bits a value.
    Q8_0,
    /// ggml's Q4_0 blocks: 4.5 bits a value.
    Q4_0,
}

/// Bytes of one Q8_0 block (f16 scale + 32 quants).
const Q8_0_BLOCK: usize = 34;
/// Bytes of one Q4_0 block (f16 scale + 16 bytes of nibbles).
const Q4_0_BLOCK: usize = 18;

impl KvDtype {
    /// Every type, in the order `--help` lists them.
    pub const ALL: [KvDtype; 4] = [KvDtype::F16, KvDtype::Q8_0, KvDtype::Q4_0, KvDtype::F32];

    /// The spelling used on the command line and in requests (llama.cpp's).
    pub fn name(self) -> &'static str {
        match self {
            KvDtype::F32 => "f32",
            KvDtype::F16 => "f16",
            KvDtype::Q8_0 => "q8_0",
            KvDtype::Q4_0 => "q4_0",
        }
    }

    /// Whether rows are ggml quant blocks (read by the per-row kernel only, as
    /// llama.cpp reads a quantized cache).
    pub fn is_quantized(self) -> bool {
        matches!(self, KvDtype::Q8_0 | KvDtype::Q4_0)
    }

    /// Bytes one row of `head_dim` values takes.
    pub fn row_bytes(self, head_dim: usize) -> usize {
        match self {
            KvDtype::F32 => 4 * head_dim,
            KvDtype::F16 => 2 * head_dim,
            KvDtype::Q8_0 => head_dim / QK * Q8_0_BLOCK,
            KvDtype::Q4_0 => head_dim / QK * Q4_0_BLOCK,
        }
    }

    /// Refuses a type the model's head size cannot be stored in (block types
    /// need a multiple of 32 values a row).
    pub fn check(self, head_dim: usize) -> Result<()> {
        if self.is_quantized() && !head_dim.is_multiple_of(QK) {
            return Err(ModelError::KvDtypeShape {
                dtype: self.name().to_string(),
                head_dim,
            });
        }
        Ok(())
    }

    /// The Walsh-Hadamard blocks keys (with queries) and values are rotated
    /// in before they are stored, as llama.cpp chooses them: for quantized
    /// types and heads of a multiple of 64 values, keys in the largest
    /// power-of-two block (from 64) dividing the head, values in blocks of 64.
    /// `None` stores rows as they come.
    pub fn rotation(self, head_dim: usize) -> Option<Rotation> {
        if !self.is_quantized() || head_dim == 0 || !head_dim.is_multiple_of(64) {
            return None;
        }
        let mut k = 64;
        while head_dim.is_multiple_of(2 * k) {
            k *= 2;
        }
        Some(Rotation { k, v: 64 })
    }

    /// The tensor element type rows are kept in.
    pub fn storage(self) -> DType {
        match self {
            KvDtype::F32 => DType::F32,
            KvDtype::F16 => DType::F16,
            KvDtype::Q8_0 | KvDtype::Q4_0 => DType::U8,
        }
    }

    /// Zeroed storage for `[heads, capacity]` rows of `head_dim` values.
    pub fn zeros(
        self,
        heads: usize,
        capacity: usize,
        head_dim: usize,
    ) -> candle_core::Result<Tensor> {
        let width = match self {
            KvDtype::F32 | KvDtype::F16 => head_dim,
            _ => self.row_bytes(head_dim),
        };
        Tensor::zeros((heads, capacity, width), self.storage(), &Device::Cpu)
    }

    /// `x` (`[heads, n, head_dim]` f32) in this type's storage layout.
    pub fn encode(self, x: &Tensor) -> Result<Tensor> {
        match self {
            KvDtype::F32 => Ok(x.to_dtype(DType::F32)?),
            KvDtype::F16 => Ok(x.to_dtype(DType::F16)?),
            KvDtype::Q8_0 | KvDtype::Q4_0 => {
                let (heads, n, hd) = x.dims3()?;
                self.check(hd)?;
                let values: Vec<f32> = x.flatten_all()?.to_vec1()?;
                let mut bytes = Vec::with_capacity(heads * n * self.row_bytes(hd));
                for row in values.chunks_exact(hd) {
                    self.encode_row(row, &mut bytes);
                }
                Ok(Tensor::from_vec(
                    bytes,
                    (heads, n, self.row_bytes(hd)),
                    &Device::Cpu,
                )?)
            }
        }
    }

    /// Appends one row's blocks to `out` (quantized types only).
    fn encode_row(self, row: &[f32], out: &mut Vec<u8>) {
        match self {
            KvDtype::Q8_0 => {
                let mut q = [0i8; QK];
                for block in row.chunks_exact(QK) {
                    let (d, _) = quantize_block_ref(block, &mut q, false);
                    out.extend_from_slice(&f16::from_f32(d).to_le_bytes());
                    out.extend(q.iter().map(|&v| v as u8));
                }
            }
            KvDtype::Q4_0 => blocks32::q4_0(row, out),
            KvDtype::F32 | KvDtype::F16 => unreachable!("float rows are not blocks"),
        }
    }

    /// `x` (`[heads, n, width]` in this type's storage) as f32 `[heads, n, head_dim]`.
    pub fn decode(self, x: &Tensor, head_dim: usize) -> Result<Tensor> {
        match self {
            KvDtype::F32 | KvDtype::F16 => Ok(x.to_dtype(DType::F32)?),
            KvDtype::Q8_0 | KvDtype::Q4_0 => {
                let (heads, n, _) = x.dims3()?;
                let bytes: Vec<u8> = x.flatten_all()?.to_vec1()?;
                let mut out = vec![0f32; heads * n * head_dim];
                for (row, dst) in bytes
                    .chunks_exact(self.row_bytes(head_dim))
                    .zip(out.chunks_exact_mut(head_dim))
                {
                    dequantize_row(self, row, dst);
                }
                Ok(Tensor::from_vec(out, (heads, n, head_dim), &Device::Cpu)?)
            }
        }
    }
}

/// The Walsh-Hadamard block sizes of a rotated cache ([`KvDtype::rotation`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rotation {
    /// Block of keys and queries.
    pub k: usize,
    /// Block of values and of the attention output.
    pub v: usize,
}

/// Rotates every `block` values of `x` by the orthonormal Walsh-Hadamard
/// matrix (Sylvester order), as ggml's fast transform does: each value
/// scaled by `1 / sqrt(block)` first, then the butterflies `(u + v, u - v)`
/// from span 1 upwards. Applying it twice gives `x` back up to rounding.
pub fn hadamard(x: &mut [f32], block: usize) {
    debug_assert!(block.is_power_of_two() && x.len().is_multiple_of(block));
    let scale = 1.0 / (block as f32).sqrt();
    for row in x.chunks_exact_mut(block) {
        for v in row.iter_mut() {
            *v *= scale;
        }
        let mut span = 1;
        while span < block {
            for i in (0..block).step_by(2 * span) {
                for j in i..i + span {
                    let (u, v) = (row[j], row[j + span]);
                    row[j] = u + v;
                    row[j + span] = u - v;
                }
            }
            span *= 2;
        }
    }
}

/// One stored row of a quantized type as f32 (ggml's `dequantize_row_*`: each
/// value `q * d` exactly, so the order does not matter).
pub fn dequantize_row(dtype: KvDtype, row: &[u8], out: &mut [f32]) {
    match dtype {
        KvDtype::Q8_0 => {
            for (b, dst) in row.chunks_exact(Q8_0_BLOCK).zip(out.chunks_exact_mut(QK)) {
                let d = f16::from_le_bytes([b[0], b[1]]).to_f32();
                for (o, &q) in dst.iter_mut().zip(&b[2..]) {
                    *o = q as i8 as f32 * d;
                }
            }
        }
        KvDtype::Q4_0 => {
            for (b, dst) in row.chunks_exact(Q4_0_BLOCK).zip(out.chunks_exact_mut(QK)) {
                let d = f16::from_le_bytes([b[0], b[1]]).to_f32();
                for (j, &byte) in b[2..].iter().enumerate() {
                    dst[j] = ((byte & 0x0f) as i32 - 8) as f32 * d;
                    dst[j + QK / 2] = ((byte >> 4) as i32 - 8) as f32 * d;
                }
            }
        }
        KvDtype::F32 | KvDtype::F16 => unreachable!("float rows are read directly"),
    }
}

/// A query row quantized as ggml quantizes it against a quantized cache
/// (`quantize_row_q8_0`): per block its f16 scale (as f32) and 32 quants.
pub struct QueryBlocks {
    d: Vec<f32>,
    q: Vec<[i8; QK]>,
}

impl QueryBlocks {
    /// Quantizes `x` (a multiple of 32 values).
    pub fn new(x: &[f32]) -> Self {
        let mut d = Vec::with_capacity(x.len() / QK);
        let mut q = Vec::with_capacity(x.len() / QK);
        for block in x.chunks_exact(QK) {
            let mut qs = [0i8; QK];
            d.push(quantize_block_ref(block, &mut qs, false).0);
            q.push(qs);
        }
        Self { d, q }
    }

    /// ggml's `vec_dot_{q8_0,q4_0}_q8_0` of a stored row against this query:
    /// per block, the integer sum of each run of four products goes to one of
    /// eight lanes as `fma(d_k * d_q, sum, lane)`; the lanes are then added in
    /// `hsum_float_8`'s order. Integer sums are exact, so the AVX2 kernel
    /// (used when the CPU has it) and the scalar one give the same bits.
    pub fn dot(&self, dtype: KvDtype, row: &[u8]) -> f32 {
        #[cfg(target_arch = "x86_64")]
        if crate::quant::dot::best_kernel() == crate::quant::dot::Kernel::Avx2 {
            // SAFETY: the CPU has AVX2 and FMA (checked once, cached).
            return unsafe { self.dot_avx2(dtype, row) };
        }
        self.dot_scalar(dtype, row)
    }

    /// [`QueryBlocks::dot`] with AVX2, as ggml's x86 kernels: the key block's
    /// signed bytes (Q4_0: nibbles minus 8) against the query's by
    /// `maddubs(|k|, sign(q, k))`, pairs summed to eight i32 lanes of four
    /// products, one FMA per block into eight float lanes.
    ///
    /// # Safety
    /// AVX2 and FMA available.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn dot_avx2(&self, dtype: KvDtype, row: &[u8]) -> f32 {
        use std::arch::x86_64::*;
        let block = match dtype {
            KvDtype::Q8_0 => Q8_0_BLOCK,
            KvDtype::Q4_0 => Q4_0_BLOCK,
            _ => unreachable!("float rows use the float kernels"),
        };
        let ones = _mm256_set1_epi16(1);
        let mut acc = _mm256_setzero_ps();
        for ((b, &dq), qq) in row.chunks_exact(block).zip(&self.d).zip(&self.q) {
            let dk = f16::from_le_bytes([b[0], b[1]]).to_f32();
            let k = if dtype == KvDtype::Q8_0 {
                _mm256_loadu_si256(b.as_ptr().add(2).cast())
            } else {
                let x = _mm_loadu_si128(b.as_ptr().add(2).cast());
                let m = _mm_set1_epi8(0x0f);
                let lo = _mm_and_si128(x, m);
                let hi = _mm_and_si128(_mm_srli_epi16::<4>(x), m);
                _mm256_sub_epi8(_mm256_set_m128i(hi, lo), _mm256_set1_epi8(8))
            };
            let q = _mm256_loadu_si256(qq.as_ptr().cast());
            let p = _mm256_maddubs_epi16(_mm256_sign_epi8(k, k), _mm256_sign_epi8(q, k));
            let lanes = _mm256_cvtepi32_ps(_mm256_madd_epi16(p, ones));
            acc = _mm256_fmadd_ps(_mm256_set1_ps(dk * dq), lanes, acc);
        }
        let mut l = [0f32; 8];
        _mm256_storeu_ps(l.as_mut_ptr(), acc);
        let a = [l[0] + l[4], l[1] + l[5], l[2] + l[6], l[3] + l[7]];
        (a[0] + a[2]) + (a[1] + a[3])
    }

    /// [`QueryBlocks::dot`] in portable scalar code.
    pub fn dot_scalar(&self, dtype: KvDtype, row: &[u8]) -> f32 {
        let mut lanes = [0f32; 8];
        let mut k = [0i32; QK];
        let block = match dtype {
            KvDtype::Q8_0 => Q8_0_BLOCK,
            KvDtype::Q4_0 => Q4_0_BLOCK,
            _ => unreachable!("float rows use the float kernels"),
        };
        for ((b, &dq), qq) in row.chunks_exact(block).zip(&self.d).zip(&self.q) {
            let dk = f16::from_le_bytes([b[0], b[1]]).to_f32();
            match dtype {
                KvDtype::Q8_0 => {
                    for (kj, &byte) in k.iter_mut().zip(&b[2..]) {
                        *kj = byte as i8 as i32;
                    }
                }
                _ => {
                    for (j, &byte) in b[2..].iter().enumerate() {
                        k[j] = (byte & 0x0f) as i32 - 8;
                        k[j + QK / 2] = (byte >> 4) as i32 - 8;
                    }
                }
            }
            let scale = dk * dq;
            for (l, lane) in lanes.iter_mut().enumerate() {
                let s: i32 = (4 * l..4 * l + 4).map(|j| k[j] * qq[j] as i32).sum();
                *lane = scale.mul_add(s as f32, *lane);
            }
        }
        let a = [
            lanes[0] + lanes[4],
            lanes[1] + lanes[5],
            lanes[2] + lanes[6],
            lanes[3] + lanes[7],
        ];
        (a[0] + a[2]) + (a[1] + a[3])
    }
}

impl fmt::Display for KvDtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Why a `kv_dtype` string was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown kv_dtype `{0}` (known: f16, q8_0, q4_0, f32)")]
pub struct UnknownKvDtype(pub String);

impl FromStr for KvDtype {
    type Err = UnknownKvDtype;

    fn from_str(s: &str) -> std::result::Result<Self, Self::Err> {
        let t = s.trim().to_ascii_lowercase();
        KvDtype::ALL
            .into_iter()
            .find(|d| d.name() == t)
            .ok_or_else(|| UnknownKvDtype(s.to_string()))
    }
}

impl serde::Serialize for KvDtype {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

impl<'de> serde::Deserialize<'de> for KvDtype {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(n: usize, seed: u32) -> Vec<f32> {
        let mut s = seed;
        (0..n)
            .map(|_| {
                s = s.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                ((s >> 8) as f32 / (1u32 << 24) as f32 - 0.5) * 6.0
            })
            .collect()
    }

    #[test]
    fn names_round_trip_and_unknown_names_are_refused() {
        for d in KvDtype::ALL {
            assert_eq!(d.name().parse::<KvDtype>().unwrap(), d);
        }
        assert_eq!(" Q8_0 ".parse::<KvDtype>().unwrap(), KvDtype::Q8_0);
        let e = "q5_k".parse::<KvDtype>().unwrap_err().to_string();
        assert!(e.contains("q5_k") && e.contains("q8_0"), "{e}");
        assert_eq!(KvDtype::default(), KvDtype::F16);
    }

    #[test]
    fn the_rotation_is_orthonormal_and_its_own_inverse() {
        assert_eq!(KvDtype::F16.rotation(64), None);
        assert_eq!(KvDtype::Q8_0.rotation(32), None);
        assert_eq!(KvDtype::Q8_0.rotation(64), Some(Rotation { k: 64, v: 64 }));
        assert_eq!(
            KvDtype::Q4_0.rotation(256),
            Some(Rotation { k: 256, v: 64 })
        );
        assert_eq!(KvDtype::Q4_0.rotation(192), Some(Rotation { k: 64, v: 64 }));
        let x = sample(128, 5);
        let mut y = x.clone();
        hadamard(&mut y, 64);
        // Norms and dot products survive; a spike spreads over the block.
        let norm = |v: &[f32]| v.iter().map(|a| a * a).sum::<f32>();
        assert!((norm(&x[..64]) - norm(&y[..64])).abs() < 1e-3 * norm(&x[..64]));
        let mut spike = vec![0f32; 64];
        spike[3] = 8.0;
        hadamard(&mut spike, 64);
        assert!(spike.iter().all(|&v| v.abs() == 1.0));
        hadamard(&mut y, 64);
        for (a, b) in x.iter().zip(&y) {
            assert!((a - b).abs() < 1e-5, "{a} vs {b}");
        }
    }

    #[test]
    fn row_bytes_match_llama_cpp_blocks() {
        // SmolLM2: 64 values a row.
        assert_eq!(KvDtype::F32.row_bytes(64), 256);
        assert_eq!(KvDtype::F16.row_bytes(64), 128);
        assert_eq!(KvDtype::Q8_0.row_bytes(64), 68);
        assert_eq!(KvDtype::Q4_0.row_bytes(64), 36);
        assert!(KvDtype::Q8_0.check(80).is_err());
        assert!(KvDtype::F16.check(80).is_ok());
    }

    #[test]
    fn quantized_rows_decode_close_to_their_values() {
        let x = sample(4 * 3 * 64, 7);
        let t = Tensor::from_vec(x.clone(), (4, 3, 64), &Device::Cpu).unwrap();
        for (dtype, tol) in [(KvDtype::Q8_0, 0.03f32), (KvDtype::Q4_0, 0.5)] {
            let enc = dtype.encode(&t).unwrap();
            assert_eq!(enc.dims3().unwrap(), (4, 3, dtype.row_bytes(64)));
            let back: Vec<f32> = dtype
                .decode(&enc, 64)
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1()
                .unwrap();
            let err = x
                .iter()
                .zip(&back)
                .map(|(a, b)| (a - b).abs())
                .fold(0f32, f32::max);
            assert!(err < tol, "{dtype}: max error {err}");
        }
    }

    #[test]
    fn the_quantized_dot_equals_the_dot_of_the_decoded_values_up_to_rounding() {
        let k = sample(128, 3);
        let q = sample(128, 11);
        let qb = QueryBlocks::new(&q);
        for dtype in [KvDtype::Q8_0, KvDtype::Q4_0] {
            let mut row = Vec::new();
            dtype.encode_row(&k, &mut row);
            let mut kd = vec![0f32; 128];
            dequantize_row(dtype, &row, &mut kd);
            // The query as its blocks hold it.
            let qd: Vec<f32> =
                qb.q.iter()
                    .zip(&qb.d)
                    .flat_map(|(qs, &d)| qs.iter().map(move |&v| v as f32 * d))
                    .collect();
            let want: f64 = kd.iter().zip(&qd).map(|(a, b)| (a * b) as f64).sum();
            let got = qb.dot(dtype, &row) as f64;
            assert_eq!(
                qb.dot(dtype, &row).to_bits(),
                qb.dot_scalar(dtype, &row).to_bits(),
                "{dtype}: the AVX2 and scalar dots differ"
            );
            assert!(
                (got - want).abs() < 1e-4 * want.abs().max(1.0),
                "{dtype}: {got} vs {want}"
            );
        }
    }
}
