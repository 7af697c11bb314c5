//! IQ4_NL and IQ4_XS: 4-bit indices into one fixed table of sixteen signed
//! bytes (ggml's `kvalues_iq4nl`), non-linearly spaced so that small values
//! get finer steps. candle's `GgmlDType` has no such types, so Tern reads
//! their bytes itself ([`crate::GgufFile::own_tensor`]) and runs them here.
//!
//! Every ggml kernel for them first looks the table up, so the weights become
//! signed bytes, and from there runs the arithmetic of a format Tern already
//! has; only the floating-point order differs by kernel:
//! - [`nl`]: IQ4_NL, 32-value blocks dotted against Q8_0 activations. Packed
//!   by [`super::blocks::PackedWeights`] as Q8_0 is (one signed byte per value).
//!   llama.cpp's repack buffer takes matrices with a row count divisible by 8
//!   (`iq4_nl_8x8_q8_0`, Q4_0's repacked templates with this table); other
//!   matrices run llamafile's `tinyBLAS_Q0_AVX` for two or more activation rows
//!   (Q8_0's order) and `ggml_vec_dot_iq4_nl_q8_0` for one, whose order is its
//!   own (see [`nl`]).
//! - [`xs`]: IQ4_XS, 256-value super-blocks dotted against Q8_K activations,
//!   run as a K-quant ([`super::k::KFormat::Iq4Xs`]): `ggml_vec_dot_iq4_xs_q8_K`
//!   below 8 activation rows, ggml-cpu's tiled matmul from there.

pub mod nl;
pub mod xs;

#[cfg(test)]
pub(crate) mod tests;

/// ggml's `kvalues_iq4nl`: the value of each 4-bit index.
pub const KVALUES: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];

/// The 32 values of a run of 16 index bytes in position order: the low
/// nibbles are values 0..16, the high ones 16..32 (both formats' layout).
#[inline(always)]
pub fn expand16(qs: &[u8]) -> [i8; 32] {
    std::array::from_fn(|j| {
        let b = qs[j % 16];
        KVALUES[if j < 16 { b & 0xF } else { b >> 4 } as usize]
    })
}
