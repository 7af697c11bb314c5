//! Round trips through Tern's quantizers: each type's decoded values stay
//! within its resolution of the input, whole blocks are required, and an
//! all-zero input stays zero.

use candle_core::quantized::GgmlDType;

use super::{dequantize, quantize, QuantizeError, WRITABLE};

fn values(n: usize) -> Vec<f32> {
    let mut s = 0x2545_F491_4F6C_DD1Du64;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 40) as f32 / (1u64 << 24) as f32 - 0.5
        })
        .collect()
}

#[test]
fn every_type_round_trips_within_its_resolution() {
    let x = values(1024);
    for dtype in WRITABLE {
        let bytes = quantize(dtype, &x).unwrap();
        assert_eq!(bytes.len(), 1024 / dtype.block_size() * dtype.type_size());
        let y = dequantize(dtype, &bytes, x.len()).unwrap();
        let err = x
            .iter()
            .zip(&y)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        // Values in [-0.5, 0.5): rounding moves half a grid step, and the
        // symmetric formats clip their top quant a full step (Q4_0 steps
        // 1/16, Q5_0 1/32).
        let bound = match dtype {
            GgmlDType::F32 => 0.0,
            GgmlDType::F16 | GgmlDType::BF16 => 0.002,
            GgmlDType::Q8_0 | GgmlDType::Q6K => 0.01,
            GgmlDType::Q5_1 | GgmlDType::Q5K => 0.03,
            GgmlDType::Q5_0 => 0.035,
            _ => 0.07,
        };
        assert!(err <= bound, "{dtype:?}: max error {err} > {bound}");
        let zeros = quantize(dtype, &[0.0; 256]).unwrap();
        assert!(dequantize(dtype, &zeros, 256)
            .unwrap()
            .iter()
            .all(|v| *v == 0.0));
    }
}

#[test]
fn partial_blocks_and_unknown_types_are_refused() {
    assert_eq!(
        quantize(GgmlDType::Q4K, &[0.0; 96]),
        Err(QuantizeError::Partial {
            dtype: GgmlDType::Q4K,
            len: 96,
            block: 256
        })
    );
    assert!(matches!(
        quantize(GgmlDType::Q2K, &[0.0; 256]),
        Err(QuantizeError::Unsupported { .. })
    ));
}
