//! Q8_K, the activation format the K-quants are dotted against: per 256 values
//! one f32 scale `d`, 256 signed 8-bit quants and the 16 sums of each run of 16
//! quants (`bsums`, which carry the weights' offsets and minimums).
//!
//! llama.cpp quantizes activations two ways on an AVX2 machine, and the products
//! that follow depend on which, so both are here:
//! - [`quantize_block`]: `quantize_row_q8_K`, which the x86 build maps to the
//!   reference C code. GCC (`-O2 -march=x86-64-v3`, GNU C, so `-ffp-contract=fast`)
//!   contracts its `nearest_int(iscale * x)` into one fused multiply-add with the
//!   rounding constant, so each quant is the *exact* product rounded once (checked
//!   in the object code: `vfmadd132ps` in `quantize_row_q8_K_ref`). The sign of
//!   `d` is that of the first value of largest magnitude.
//! - [`quantize_block_x4`]: `ggml_quantize_mat_q8_K_4x8`, which the repacked Q4_K
//!   matrix product uses for activation rows in groups of four: the product
//!   `x * iscale` is rounded to f32 first, then to an integer, and `d` is negative
//!   whenever some value equals `+amax`.

use super::QK_K;

/// One Q8_K block, aligned for 32-byte loads of its quants.
#[derive(Clone, Copy)]
#[repr(C, align(32))]
pub struct Q8KBlock {
    /// The quants.
    pub qs: [i8; QK_K],
    /// Sums of each run of 16 quants.
    pub bsums: [i16; QK_K / 16],
    /// The scale: value = `d * q`.
    pub d: f32,
}

impl Q8KBlock {
    /// An all-zero block.
    pub const ZERO: Self = Self {
        qs: [0; QK_K],
        bsums: [0; QK_K / 16],
        d: 0.0,
    };

    fn set_sums(&mut self) {
        for (s, run) in self.bsums.iter_mut().zip(self.qs.chunks_exact(16)) {
            *s = run.iter().map(|&q| q as i16).sum();
        }
    }
}

/// ggml's `nearest_int` after GCC's contraction: `round_ties_even(a * b)` of the
/// exact product, through the same 1.5 * 2^23 trick.
#[inline(always)]
fn nearest_int_fused(a: f32, b: f32) -> i32 {
    let v = a.mul_add(b, 12_582_912.0);
    (v.to_bits() & 0x007f_ffff) as i32 - 0x0040_0000
}

/// `quantize_row_q8_K` for one block of 256 values (see the module doc).
pub fn quantize_block(x: &[f32], out: &mut Q8KBlock) {
    let x = &x[..QK_K];
    let (mut amax, mut max) = (0.0f32, 0.0f32);
    for &v in x {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    if amax == 0.0 {
        *out = Q8KBlock::ZERO;
        return;
    }
    let iscale = -127.0 / max;
    for (q, &v) in out.qs.iter_mut().zip(x) {
        *q = nearest_int_fused(iscale, v).min(127) as i8;
    }
    out.set_sums();
    out.d = 1.0 / iscale;
}

/// `ggml_quantize_mat_q8_K_4x8`'s arithmetic for one row's block of 256 values
/// (its interleaving of four rows is a layout matter only).
pub fn quantize_block_x4(x: &[f32], out: &mut Q8KBlock) {
    let x = &x[..QK_K];
    let amax = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    let positive_max = x.contains(&amax);
    let iscale = match (amax != 0.0, positive_max) {
        (false, _) => 0.0,
        (true, true) => -127.0 / amax,
        (true, false) => 127.0 / amax,
    };
    for (q, &v) in out.qs.iter_mut().zip(x) {
        // Saturating, as the pack instructions are.
        *q = (v * iscale).round_ties_even().clamp(-128.0, 127.0) as i8;
    }
    out.set_sums();
    out.d = if amax != 0.0 { 1.0 / iscale } else { 0.0 };
}

/// Activations `[rows, cols]` quantized to Q8_K, `cols / 256` blocks per row.
pub struct Q8KActs {
    /// Activation rows.
    pub rows: usize,
    /// Blocks per row.
    pub blocks: usize,
    /// `rows * blocks` blocks, row-major.
    pub data: Vec<Q8KBlock>,
    /// Rows `0..grouped` were quantized as ggml's repacked product does for its
    /// groups of four ([`quantize_block_x4`]); the rest by [`quantize_block`].
    pub grouped: usize,
    /// Every row runs the one-row kernels' order whatever the row count
    /// ([`crate::quant::alone`]); `grouped` is then 0.
    pub alone: bool,
}

impl Q8KActs {
    /// Quantizes `x` (`rows * cols` f32, `cols` a multiple of 256); the first
    /// `grouped` rows with [`quantize_block_x4`], the others with [`quantize_block`].
    pub fn quantize(x: &[f32], cols: usize, rows: usize, grouped: usize) -> Self {
        assert!(cols.is_multiple_of(QK_K) && x.len() >= rows * cols && grouped <= rows);
        let blocks = cols / QK_K;
        let mut data = vec![Q8KBlock::ZERO; rows * blocks];
        // A prefill's rows on the kernel pool, 16 blocks to a chunk; each
        // block's quantization depends on its own values only.
        crate::quant::pool::Pool::global().fill_chunks(&mut data, 16, &|start, part| {
            for (j, out) in part.iter_mut().enumerate() {
                let (r, b) = ((start + j) / blocks, (start + j) % blocks);
                let src = &x[r * cols + b * QK_K..r * cols + (b + 1) * QK_K];
                if r < grouped {
                    quantize_block_x4(src, out);
                } else {
                    quantize_block(src, out);
                }
            }
        });
        Self {
            rows,
            blocks,
            data,
            grouped,
            alone: false,
        }
    }

    /// [`Self::quantize`] for a product inside [`crate::quant::alone::scope`]:
    /// every row by [`quantize_block`], and marked to run the one-row order.
    pub fn quantize_alone(x: &[f32], cols: usize, rows: usize) -> Self {
        Self {
            alone: true,
            ..Self::quantize(x, cols, rows, 0)
        }
    }

    /// Row `r`'s blocks.
    #[inline(always)]
    pub fn row(&self, r: usize) -> &[Q8KBlock] {
        &self.data[r * self.blocks..(r + 1) * self.blocks]
    }
}
