//! Tern's own weight quantizer: f32 values into the GGUF block formats,
//! byte for byte as ggml's reference quantizers (ggml-quants.c, no importance
//! matrix) write them, and the dequantization a requantization starts from,
//! as ggml's `to_float` computes it.
//!
//! - [`blocks32`]: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0.
//! - [`kquants`]: Q4_K, Q5_K, Q6_K.
//! - [`floats`]: F16, BF16.
//! - [`iq4`]: IQ4_NL, IQ4_XS (bytes only: candle's `GgmlDType` lacks them).
//!
//! Which tensor gets which type is decided elsewhere (`export::mix`); this
//! module only encodes and decodes rows.

pub mod blocks32;
pub mod floats;
pub mod iq4;
pub mod kquants;

#[cfg(test)]
mod tests;

use candle_core::quantized::GgmlDType;

use super::blocks::{BlockOrder, PackedWeights, WeightFormat};
use super::float::HalfFormat;
use super::k::{q4k, q5k, q6k};

/// The types [`quantize`] writes, in llama.cpp's naming order.
pub const WRITABLE: [GgmlDType; 11] = [
    GgmlDType::F32,
    GgmlDType::F16,
    GgmlDType::BF16,
    GgmlDType::Q4_0,
    GgmlDType::Q4_1,
    GgmlDType::Q5_0,
    GgmlDType::Q5_1,
    GgmlDType::Q8_0,
    GgmlDType::Q4K,
    GgmlDType::Q5K,
    GgmlDType::Q6K,
];

/// Why values could not be encoded or decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuantizeError {
    /// A type this module does not encode or decode.
    #[error("Tern cannot {what} {dtype:?}")]
    Unsupported {
        /// `quantize to` or `dequantize from`.
        what: &'static str,
        /// The type.
        dtype: GgmlDType,
    },
    /// A row length that is not whole blocks of the type.
    #[error("{len} values are not whole {dtype:?} blocks of {block}")]
    Partial {
        /// The type.
        dtype: GgmlDType,
        /// The number of values given.
        len: usize,
        /// The type's block size.
        block: usize,
    },
    /// A row length that is not whole blocks of a type candle lacks.
    #[error("{len} values are not whole {name} blocks of {block}")]
    PartialOwn {
        /// The type's name.
        name: &'static str,
        /// The number of values given.
        len: usize,
        /// The type's block size.
        block: usize,
    },
}

/// `x` (whole blocks of `dtype`) encoded as `dtype`, ggml's bytes.
pub fn quantize(dtype: GgmlDType, x: &[f32]) -> Result<Vec<u8>, QuantizeError> {
    let block = dtype.block_size();
    if !x.len().is_multiple_of(block) {
        return Err(QuantizeError::Partial {
            dtype,
            len: x.len(),
            block,
        });
    }
    let mut out = Vec::with_capacity(x.len() / block * dtype.type_size());
    match dtype {
        GgmlDType::F32 => x
            .iter()
            .for_each(|v| out.extend_from_slice(&v.to_le_bytes())),
        GgmlDType::F16 => floats::f16(x, &mut out),
        GgmlDType::BF16 => floats::bf16(x, &mut out),
        GgmlDType::Q4_0 => blocks32::q4_0(x, &mut out),
        GgmlDType::Q4_1 => blocks32::q4_1(x, &mut out),
        GgmlDType::Q5_0 => blocks32::q5_0(x, &mut out),
        GgmlDType::Q5_1 => blocks32::q5_1(x, &mut out),
        GgmlDType::Q8_0 => blocks32::q8_0(x, &mut out),
        GgmlDType::Q4K => kquants::q4_k(x, &mut out),
        GgmlDType::Q5K => kquants::q5_k(x, &mut out),
        GgmlDType::Q6K => kquants::q6_k(x, &mut out),
        _ => {
            return Err(QuantizeError::Unsupported {
                what: "quantize to",
                dtype,
            })
        }
    }
    Ok(out)
}

/// `x` (whole blocks of `t`) encoded as `t`, ggml's bytes: [`quantize`], plus
/// the types candle lacks.
pub fn quantize_to(t: super::WeightType, x: &[f32]) -> Result<Vec<u8>, QuantizeError> {
    let own = match t {
        super::WeightType::Ggml(dtype) => return quantize(dtype, x),
        super::WeightType::Own(own) => own,
    };
    if !x.len().is_multiple_of(own.block_values()) {
        return Err(QuantizeError::PartialOwn {
            name: own.name(),
            len: x.len(),
            block: own.block_values(),
        });
    }
    let mut out = Vec::with_capacity(x.len() / own.block_values() * own.block_bytes());
    match own {
        crate::gguf_types::OwnType::Iq4Nl => iq4::iq4_nl(x, &mut out),
        crate::gguf_types::OwnType::Iq4Xs => iq4::iq4_xs(x, &mut out),
    }
    Ok(out)
}

/// `data` (`n` values of `dtype`, ggml's bytes) as f32, as ggml's `to_float`
/// computes them (Tern's dequantizers repeat ggml's, see [`super::blocks`] and
/// [`super::k`]).
pub fn dequantize(dtype: GgmlDType, data: &[u8], n: usize) -> Result<Vec<f32>, QuantizeError> {
    let block = dtype.block_size();
    if !n.is_multiple_of(block) || data.len() != n / block * dtype.type_size() {
        return Err(QuantizeError::Partial {
            dtype,
            len: n,
            block,
        });
    }
    let mut out = vec![0f32; n];
    match dtype {
        GgmlDType::F32 => {
            for (o, b) in out.iter_mut().zip(data.chunks_exact(4)) {
                *o = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            }
        }
        GgmlDType::F16 | GgmlDType::BF16 => {
            let f = HalfFormat::from_ggml(dtype).expect("a half format");
            for (o, b) in out.iter_mut().zip(data.chunks_exact(2)) {
                *o = f.to_f32(u16::from_le_bytes([b[0], b[1]]));
            }
        }
        GgmlDType::Q4K | GgmlDType::Q5K | GgmlDType::Q6K => {
            let decode: fn(&[u8], &mut [f32]) = match dtype {
                GgmlDType::Q4K => q4k::dequantize_block,
                GgmlDType::Q5K => q5k::dequantize_block,
                _ => q6k::dequantize_block,
            };
            for (b, o) in data
                .chunks_exact(dtype.type_size())
                .zip(out.chunks_exact_mut(block))
            {
                decode(b, o);
            }
        }
        _ => {
            let format = WeightFormat::from_ggml(dtype).ok_or(QuantizeError::Unsupported {
                what: "dequantize from",
                dtype,
            })?;
            // One row of all the blocks: the packed layout's reference
            // dequantization is ggml's.
            let packed =
                PackedWeights::from_ggml(format, 1, n, data, BlockOrder::VecDot).map_err(|_| {
                    QuantizeError::Partial {
                        dtype,
                        len: n,
                        block,
                    }
                })?;
            packed.dequantize_row(0, &mut out);
        }
    }
    Ok(out)
}
