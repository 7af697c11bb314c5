//! IQ4_NL: per 32 values an f16 `d` and 16 bytes of 4-bit indices; value `j` is
//! `d * KVALUES[q_j]`, byte `j` holding value `j` in its low nibble and value
//! `j + 16` in its high one.
//!
//! The weights run in [`super::super::blocks::PackedWeights`] as signed bytes.
//! The one order of its own is `ggml_vec_dot_iq4_nl_q8_0`'s (AVX2), which
//! llama.cpp runs for a matrix it does not repack against a single activation
//! row: blocks in pairs, eight lanes of 4-value integer dots per block, the
//! even block of each pair into one accumulator and the odd one into a second,
//! each `acc = fma(d_x * d_w, lane, acc)`; then `hsum_float_8(acc1 + acc2)`;
//! a last unpaired block is added as `fma(d_x * d_w, isum, sum)` with `isum`
//! its whole integer dot (GCC contracts the C `sumf += d * isum`).

use super::{expand16, KVALUES};
use crate::quant::k::hsum8;

/// Bytes of one IQ4_NL block.
pub const BLOCK_BYTES: usize = 18;

/// A block's 32 values as the signed bytes the kernels multiply, from its 16
/// index bytes.
#[inline(always)]
pub fn expand(qs: &[u8]) -> [i8; 32] {
    expand16(qs)
}

/// ggml's `dequantize_row_iq4_nl` for one block: `d * KVALUES[q]`.
pub fn dequantize_block(b: &[u8], out: &mut [f32]) {
    let d = half::f16::from_le_bytes([b[0], b[1]]).to_f32();
    for (j, o) in out[..32].iter_mut().enumerate() {
        let q = b[2 + j % 16];
        let i = if j < 16 { q & 0xF } else { q >> 4 };
        *o = d * KVALUES[i as usize] as f32;
    }
}

/// `ggml_vec_dot_iq4_nl_q8_0`'s floating-point order over a row's blocks,
/// given each block's `d_w * d_x` and eight exact integer lanes (lane `l` the
/// dot of values `4l .. 4l + 4`).
pub fn vec_dot_order(dd: &[f32], lanes: &[[i32; 8]]) -> f32 {
    let nb = dd.len();
    let (mut acc1, mut acc2) = ([0f32; 8], [0f32; 8]);
    let mut b = 0;
    while b + 1 < nb {
        for l in 0..8 {
            acc1[l] = dd[b].mul_add(lanes[b][l] as f32, acc1[l]);
            acc2[l] = dd[b + 1].mul_add(lanes[b + 1][l] as f32, acc2[l]);
        }
        b += 2;
    }
    let sum: [f32; 8] = std::array::from_fn(|l| acc1[l] + acc2[l]);
    let mut s = hsum8(&sum);
    if b < nb {
        let isum: i32 = lanes[b].iter().sum();
        s = dd[b].mul_add(isum as f32, s);
    }
    s
}
