//! F16 and BF16 from f32, as ggml's `ggml_quantize_chunk` writes them: both
//! round to nearest, ties to even; a BF16 NaN is kept quiet
//! (`ggml_fp32_to_bf16_row_ref`).

use crate::quant::float::HalfFormat;

/// IEEE half precision, two bytes per value.
pub fn f16(x: &[f32], out: &mut Vec<u8>) {
    for &v in x {
        out.extend_from_slice(&HalfFormat::F16.round(v).to_le_bytes());
    }
}

/// bfloat16, two bytes per value.
pub fn bf16(x: &[f32], out: &mut Vec<u8>) {
    for &v in x {
        out.extend_from_slice(&HalfFormat::BF16.round(v).to_le_bytes());
    }
}
