//! The ggml block formats [`super::QLinear`] computes with natively, Tern's packed
//! layout of them, and the scalar reference code that defines their numbers: weight
//! dequantization and activation quantization with ggml's x86 (AVX2) semantics.
//!
//! Every format here holds 32 values per block with an f16 scale. Weights are packed
//! with all quant bytes of a matrix in one 64-byte aligned array and the f16 scale
//! bits in a second one, rows interleaved in groups of [`GROUP`] block by block
//! (see [`PackedWeights`]): the kernel dots a whole group at once and so reads one
//! sequential stream, which the prefetchers follow, instead of four short ones.
//!
//! Activations are quantized the way llama.cpp's CPU backend does it on an AVX2
//! machine (`quantize_row_q8_0` / `quantize_row_q8_1` in ggml-cpu's x86 code), which
//! is our correctness reference: `d = amax / 127` stored as f16, quants
//! `round_ties_even(x * (127 / amax))`, and for Q8_1 `s = f16(d * sum(quants))`
//! with the unrounded `d`. Scales are kept as the f32 value of that f16, which is
//! the same number ggml multiplies with.

use candle_core::quantized::GgmlDType;
use half::f16;

/// Values per block in every format here.
pub const QK: usize = 32;

/// Weight rows interleaved block by block in the packed layout.
pub const GROUP: usize = 4;

/// A weight block format [`super::QLinear`] runs with its own kernels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WeightFormat {
    /// `d * (q - 8)`, 4-bit `q`; dotted against Q8_0 activations.
    Q4_0,
    /// `d * q + m`, 4-bit `q`; dotted against Q8_1 activations.
    Q4_1,
    /// `d * q`, 8-bit signed `q`; dotted against Q8_0 activations.
    Q8_0,
    /// `d * (q - 16)`, 5-bit `q` (4 low bits in nibbles, the fifth in a 32-bit
    /// mask); dotted against Q8_0 activations. Packed as Q8_0 is, one signed
    /// byte `q - 16` per value: ggml's kernels (`ggml_vec_dot_q5_0_q8_0` and
    /// llamafile's `tinyBLAS_Q0_AVX`) expand to exactly those bytes and then
    /// run Q8_0's arithmetic.
    Q5_0,
    /// `d * q + m`, 5-bit `q`; dotted against Q8_1 activations. Packed one
    /// unsigned byte per value, computed as Q4_1 is (`ggml_vec_dot_q5_1_q8_1`).
    Q5_1,
    /// IQ4_NL: `d * kvalues[q]`, 4-bit `q` indexing a fixed non-linear table of
    /// signed bytes; dotted against Q8_0 activations. Packed as Q8_0 is, one
    /// signed byte `kvalues[q]` per value: every ggml kernel for it looks the
    /// table up into exactly those bytes first (see [`super::iq4`]).
    Iq4Nl,
}

impl WeightFormat {
    /// The native format for a ggml dtype, if there is one.
    pub fn from_ggml(dtype: GgmlDType) -> Option<Self> {
        match dtype {
            GgmlDType::Q4_0 => Some(Self::Q4_0),
            GgmlDType::Q4_1 => Some(Self::Q4_1),
            GgmlDType::Q8_0 => Some(Self::Q8_0),
            GgmlDType::Q5_0 => Some(Self::Q5_0),
            GgmlDType::Q5_1 => Some(Self::Q5_1),
            _ => None,
        }
    }

    /// Bytes of one block in ggml's (and candle's) serialized layout.
    pub const fn ggml_block_bytes(self) -> usize {
        match self {
            Self::Q4_0 => 18,
            Self::Q4_1 => 20,
            Self::Q8_0 => 34,
            Self::Q5_0 => 22,
            Self::Q5_1 => 24,
            Self::Iq4Nl => 18,
        }
    }

    /// Quant bytes per block in the packed layout.
    pub const fn quant_bytes(self) -> usize {
        match self {
            Self::Q4_0 | Self::Q4_1 => 16,
            Self::Q8_0 | Self::Q5_0 | Self::Q5_1 | Self::Iq4Nl => 32,
        }
    }

    /// f16 scale words per block in the packed layout (`d`, plus `m` for Q4_1).
    pub const fn scale_words(self) -> usize {
        match self {
            Self::Q4_1 | Self::Q5_1 => 2,
            Self::Q4_0 | Self::Q8_0 | Self::Q5_0 | Self::Iq4Nl => 1,
        }
    }

    /// Whether activations carry the Q8_1 block sum `s` (needed for the offset `m`).
    pub const fn needs_act_sums(self) -> bool {
        matches!(self, Self::Q4_1 | Self::Q5_1)
    }

    /// Whether the packed quants are one byte per value (else two 4-bit rows
    /// share a byte).
    pub const fn byte_quants(self) -> bool {
        self.quant_bytes() == QK
    }
}

/// The floating-point order a matrix's products follow: which ggml kernel
/// llama.cpp's CPU backend runs for it (see [`BlockOrder::llama_cpp`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlockOrder {
    /// The plain buffer's kernels (`ggml_vec_dot_*`, and llamafile's tinyBLAS,
    /// which keeps the same per-output order): per block, eight lanes of
    /// 4-quant integer dots, each lane `fma(d_w * d_x, lane, acc)`, the lanes
    /// summed by `hsum_float_8` at the end.
    VecDot,
    /// ggml-cpu's repacked `q4_0_8x8_q8_0` kernels (`ggml_gemm_q4_0_8x8_q8_0` on
    /// activation rows in whole groups of four, `ggml_gemv_q4_0_8x8_q8_0` on the
    /// rest), and IQ4_NL's `iq4_nl_8x8_q8_0`, the same templates with a
    /// different table. Both compute each output as one chain over the blocks,
    /// `acc = fma(isum, d_w * d_x, acc)` with `isum` the block's whole integer
    /// dot, and their activation quantizers (`ggml_quantize_mat_q8_0_4x8` and
    /// `quantize_row_q8_0`) give the same quants and scales, so one order
    /// covers both.
    Repack,
}

impl BlockOrder {
    /// The order llama.cpp runs a `[rows, _]` matrix of `format` in on an AVX2
    /// build: with `use_extra_bufts` (on in-process) ggml-cpu's repack buffer
    /// takes Q4_0 and IQ4_NL matrices whose row count is a multiple of 8
    /// (`ggml_repack_get_optimal_repack_type`); everything else stays plain. A
    /// tied output is no exception: llama.cpp loads the embedding a second time
    /// as the output, a MUL_MAT weight.
    pub fn llama_cpp(format: WeightFormat, rows: usize) -> Self {
        let repacks = matches!(format, WeightFormat::Q4_0 | WeightFormat::Iq4Nl);
        if repacks && rows.is_multiple_of(8) {
            Self::Repack
        } else {
            Self::VecDot
        }
    }
}

#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line([u8; 64]);

/// A zero-initialised byte buffer whose start is 64-byte aligned.
pub struct AlignedBytes {
    lines: Vec<Line>,
    len: usize,
}

impl AlignedBytes {
    /// `len` zero bytes.
    pub fn zeroed(len: usize) -> Self {
        Self {
            lines: vec![Line([0; 64]); len.div_ceil(64)],
            len,
        }
    }

    /// The bytes.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: `Line` is a plain `[u8; 64]` with no padding, the vector holds
        // `len.div_ceil(64) * 64 >= len` initialised bytes, and the borrow of `self`
        // keeps them alive and unaliased by writers.
        unsafe { std::slice::from_raw_parts(self.lines.as_ptr().cast::<u8>(), self.len) }
    }

    /// The bytes, writable.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as in `as_slice`, and the exclusive borrow of `self` makes this the
        // only view of the bytes.
        unsafe { std::slice::from_raw_parts_mut(self.lines.as_mut_ptr().cast::<u8>(), self.len) }
    }
}

/// A weight matrix `[rows, cols]` repacked from ggml blocks. Rows are padded with
/// zero rows to whole groups of [`GROUP`]; group `g`'s block `b` is *group block*
/// `gb = g * blocks_per_row + b`, whose four rows' data sit together:
/// - quants: `GROUP * quant_bytes` bytes at `gb * GROUP * quant_bytes`. Q8_0, Q5_0
///   and Q5_1 (one byte per value, see [`WeightFormat`]): row `k`'s 32 quants at
///   `32 k`. Q4: rows `2p` and `2p + 1` share the 32 bytes at
///   `32 p`, byte `j` holding value `j` of the first in its low nibble and of the
///   second in its high one, so one load, a shift and two masks unpack two rows.
/// - scales: `GROUP * scale_words` f16 words at `gb * GROUP * scale_words`, row `k`'s
///   at `k * scale_words` (`d`, then `m` for Q4_1 and Q5_1), so one load converts
///   all of them.
pub struct PackedWeights {
    /// The block format.
    pub format: WeightFormat,
    /// Output features.
    pub rows: usize,
    /// Input features (a multiple of [`QK`]).
    pub cols: usize,
    /// Quant bytes, see the type's doc.
    pub quants: AlignedBytes,
    /// f16 scale bits, see the type's doc.
    pub scales: Vec<u16>,
    /// The order its products follow ([`BlockOrder::Repack`] only for Q4_0
    /// and IQ4_NL).
    pub order: BlockOrder,
}

impl PackedWeights {
    /// Repacks `data`, the ggml serialization of a `[rows, cols]` matrix, whose
    /// products will follow `order`. Fails on a size mismatch rather than
    /// trusting the file, and on [`BlockOrder::Repack`] for a format other than
    /// Q4_0 and IQ4_NL.
    pub fn from_ggml(
        format: WeightFormat,
        rows: usize,
        cols: usize,
        data: &[u8],
        order: BlockOrder,
    ) -> Result<Self, String> {
        if order == BlockOrder::Repack
            && !matches!(format, WeightFormat::Q4_0 | WeightFormat::Iq4Nl)
        {
            return Err(format!("no repacked order for {format:?}"));
        }
        if !cols.is_multiple_of(QK) {
            return Err(format!(
                "row length {cols} is not a multiple of the block size {QK}"
            ));
        }
        let nb = cols / QK;
        let bb = format.ggml_block_bytes();
        let expected = rows
            .checked_mul(nb)
            .and_then(|n| n.checked_mul(bb))
            .ok_or_else(|| format!("[{rows}, {cols}] overflows"))?;
        if data.len() != expected {
            return Err(format!(
                "expected {expected} bytes of {format:?} data for [{rows}, {cols}], found {}",
                data.len()
            ));
        }
        let (qb, sw) = (format.quant_bytes(), format.scale_words());
        let padded = rows.div_ceil(GROUP) * GROUP;
        let mut quants = AlignedBytes::zeroed(padded * nb * qb);
        let mut scales = vec![0u16; padded * nb * sw];
        let qdst = quants.as_mut_slice();
        for (i, block) in data.chunks_exact(bb).enumerate() {
            let (r, b) = (i / nb, i % nb);
            let (gb, k) = ((r / GROUP) * nb + b, r % GROUP);
            // Every format starts with `d`; Q4_1 and Q5_1 follow it with `m`; Q5's
            // high-bit mask comes next; the quants close it.
            for w in 0..sw {
                scales[(gb * GROUP + k) * sw + w] =
                    u16::from_le_bytes([block[2 * w], block[2 * w + 1]]);
            }
            let qs = &block[2 * sw..];
            let dst = &mut qdst[gb * GROUP * qb..(gb + 1) * GROUP * qb];
            match format {
                WeightFormat::Q8_0 => dst[k * QK..(k + 1) * QK].copy_from_slice(qs),
                WeightFormat::Iq4Nl => {
                    let v = super::iq4::nl::expand(qs);
                    for (d, v) in dst[k * QK..(k + 1) * QK].iter_mut().zip(v) {
                        *d = v as u8;
                    }
                }
                WeightFormat::Q5_0 | WeightFormat::Q5_1 => {
                    let qh = u32::from_le_bytes([qs[0], qs[1], qs[2], qs[3]]);
                    let nib = &qs[4..];
                    for j in 0..QK {
                        let lo = if j < 16 {
                            nib[j] & 0x0F
                        } else {
                            nib[j - 16] >> 4
                        };
                        let v = lo | ((((qh >> j) & 1) as u8) << 4);
                        dst[k * QK + j] = if format == WeightFormat::Q5_0 {
                            (v as i8 - 16) as u8
                        } else {
                            v
                        };
                    }
                }
                WeightFormat::Q4_0 | WeightFormat::Q4_1 => {
                    let (pair, shift) = (k / 2, 4 * (k % 2));
                    for j in 0..QK {
                        let v = if j < 16 {
                            qs[j] & 0x0F
                        } else {
                            qs[j - 16] >> 4
                        };
                        dst[pair * QK + j] |= v << shift;
                    }
                }
            }
        }
        Ok(Self {
            format,
            rows,
            cols,
            quants,
            scales,
            order,
        })
    }

    /// Blocks per row.
    pub fn blocks_per_row(&self) -> usize {
        self.cols / QK
    }

    /// Quant `j` of block `b` of row `r`, as the integer the block's `d` scales:
    /// `q - 8` for Q4_0, `q - 16` for Q5_0, `q` for Q4_1 and Q5_1 (offset by `m`)
    /// and Q8_0, `kvalues[q]` for IQ4_NL.
    #[inline(always)]
    pub fn quant(&self, r: usize, b: usize, j: usize) -> i32 {
        let qb = self.format.quant_bytes();
        let gb = (r / GROUP) * self.blocks_per_row() + b;
        let base = &self.quants.as_slice()[gb * GROUP * qb..];
        let k = r % GROUP;
        match self.format {
            WeightFormat::Q8_0 | WeightFormat::Q5_0 | WeightFormat::Iq4Nl => {
                base[k * QK + j] as i8 as i32
            }
            WeightFormat::Q5_1 => base[k * QK + j] as i32,
            WeightFormat::Q4_0 | WeightFormat::Q4_1 => {
                let v = ((base[(k / 2) * QK + j] >> (4 * (k % 2))) & 0x0F) as i32;
                if self.format == WeightFormat::Q4_0 {
                    v - 8
                } else {
                    v
                }
            }
        }
    }

    /// `(d, m)` of block `b` of row `r` (`m` = 0 unless Q4_1 or Q5_1).
    #[inline(always)]
    pub fn scale(&self, r: usize, b: usize) -> (f32, f32) {
        let sw = self.format.scale_words();
        let gb = (r / GROUP) * self.blocks_per_row() + b;
        let i = (gb * GROUP + r % GROUP) * sw;
        let m = if sw == 2 {
            f16::from_bits(self.scales[i + 1]).to_f32()
        } else {
            0.0
        };
        (f16::from_bits(self.scales[i]).to_f32(), m)
    }

    /// Block `b` of every row of group `g`, unpacked for the scalar kernel (rows past
    /// the matrix's end read as zeros).
    pub fn group_block(&self, g: usize, b: usize) -> GroupBlock {
        let mut out = GroupBlock {
            d: [0.0; GROUP],
            m: [0.0; GROUP],
            q: [[0; QK]; GROUP],
        };
        for k in 0..GROUP {
            let r = g * GROUP + k;
            if r >= self.rows {
                break;
            }
            (out.d[k], out.m[k]) = self.scale(r, b);
            for (j, q) in out.q[k].iter_mut().enumerate() {
                *q = self.quant(r, b, j) as i8;
            }
        }
        out
    }

    /// Dequantizes row `r` into `out` (`cols` values): the reference meaning of the
    /// packed bits, as ggml's `dequantize_row_*` computes it: `q * d`, and for the
    /// offset formats `q * d + m` as one fused multiply-add (ggml-base is built
    /// for x86-64-v3 and GCC contracts the expression; its object code shows it).
    /// With at most 5-bit `q` the product is exact, so the fusion cannot change
    /// a bit; it is kept to read as ggml's code does.
    pub fn dequantize_row(&self, r: usize, out: &mut [f32]) {
        let offset = self.format.needs_act_sums();
        for b in 0..self.blocks_per_row() {
            let (d, m) = self.scale(r, b);
            for j in 0..QK {
                let q = self.quant(r, b, j) as f32;
                out[b * QK + j] = if offset { q.mul_add(d, m) } else { q * d };
            }
        }
    }
}

/// 32 activation quants, 32-byte aligned so the AVX2 kernel loads them aligned.
#[derive(Clone, Copy)]
#[repr(C, align(32))]
pub struct ActBlock(pub [i8; QK]);

/// One block of each row of a weight group, unpacked: scales, offsets and quants.
pub struct GroupBlock {
    /// `d` per row.
    pub d: [f32; GROUP],
    /// `m` per row (Q4_1; zero otherwise).
    pub m: [f32; GROUP],
    /// Quants per row, as [`PackedWeights::quant`] gives them.
    pub q: [[i8; QK]; GROUP],
}

/// Activations `[rows, cols]` quantized to Q8_0 or Q8_1: per row `cols / 32`
/// blocks of quants, their scales `d` and (Q8_1 only) `s = d * sum(quants)`, the
/// scales as the exact f32 values of their f16 roundings.
pub struct QuantizedActs {
    /// Activation rows.
    pub rows: usize,
    /// Blocks per row.
    pub blocks: usize,
    /// `rows * blocks` quant blocks.
    pub qs: Vec<ActBlock>,
    /// `rows * blocks` scales.
    pub d: Vec<f32>,
    /// `rows * blocks` Q8_1 sums, empty for Q8_0.
    pub s: Vec<f32>,
}

impl QuantizedActs {
    /// Zeroed storage for `rows` rows of `blocks` blocks, with sums if `with_sums`.
    pub fn zeroed(rows: usize, blocks: usize, with_sums: bool) -> Self {
        let n = rows * blocks;
        Self {
            rows,
            blocks,
            qs: vec![ActBlock([0; QK]); n],
            d: vec![0.0; n],
            s: if with_sums { vec![0.0; n] } else { Vec::new() },
        }
    }
}

/// Quantizes one 32-value block the way ggml's AVX2 `quantize_row_q8_{0,1}` does,
/// returning `(d, s)` as f32 values of their f16 roundings (`s` is 0 unless
/// `with_sum`). Scalar reference; the AVX2 version in `dot` matches it bit for bit.
pub fn quantize_block_ref(x: &[f32], q: &mut [i8; QK], with_sum: bool) -> (f32, f32) {
    let amax = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    let d = amax / 127.0;
    let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
    let mut sum = 0i32;
    for (q, &v) in q.iter_mut().zip(x) {
        // `as` saturates, as the AVX2 pack instructions do.
        *q = (v * id).round_ties_even() as i8;
        sum += *q as i32;
    }
    let s = if with_sum {
        f16::from_f32(d * sum as f32).to_f32()
    } else {
        0.0
    };
    (f16::from_f32(d).to_f32(), s)
}

/// Quantizes rows `rows` of `x` (`cols` values per row) into `acts` with the scalar
/// reference code.
pub fn quantize_rows_ref(
    x: &[f32],
    cols: usize,
    rows: std::ops::Range<usize>,
    acts: &mut QuantizedActs,
) {
    let nb = cols / QK;
    let with_sum = !acts.s.is_empty();
    for r in rows {
        for b in 0..nb {
            let i = r * nb + b;
            let src = &x[r * cols + b * QK..r * cols + (b + 1) * QK];
            let (d, s) = quantize_block_ref(src, &mut acts.qs[i].0, with_sum);
            acts.d[i] = d;
            if with_sum {
                acts.s[i] = s;
            }
        }
    }
}
