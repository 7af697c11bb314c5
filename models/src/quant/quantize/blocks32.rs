//! ggml's reference quantizers for the 32-value block formats (Q4_0, Q4_1,
//! Q5_0, Q5_1, Q8_0), as `quantize_row_*_ref` in ggml-quants.c computes them
//! when GCC builds ggml-base for x86-64-v3: the scaled value plus its rounding
//! offset (`x * id + 8.5`, `(x - min) * id + 0.5`, ...) is one fused
//! multiply-add, truncated toward zero. Q8_0 rounds `x * id` half away from
//! zero (`roundf`), unfused.

// Index loops keep ggml's loop structure, so the port reads against it line by line.
#![allow(clippy::needless_range_loop)]

use half::f16;

/// Values per block.
pub const QK: usize = 32;

/// The largest |value| of a block and the value itself (ggml keeps the first
/// one met on a tie).
fn signed_absmax(b: &[f32]) -> f32 {
    let (mut amax, mut max) = (0f32, 0f32);
    for &v in b {
        if amax < v.abs() {
            amax = v.abs();
            max = v;
        }
    }
    max
}

/// Smallest and largest value of a block, ggml's scan.
fn min_max(b: &[f32]) -> (f32, f32) {
    let (mut min, mut max) = (f32::MAX, -f32::MAX);
    for &v in b {
        if v < min {
            min = v;
        }
        if v > max {
            max = v;
        }
    }
    (min, max)
}

/// `1 / d`, or 0 for an all-zero block.
fn inverse(d: f32) -> f32 {
    if d != 0.0 {
        1.0 / d
    } else {
        0.0
    }
}

/// A C conversion `(int8_t)f` as the vectorized code performs it: truncation
/// toward zero, then the low byte.
fn trunc_i8(f: f32) -> i32 {
    (f as i32) as i8 as i32
}

fn put_f16(out: &mut Vec<u8>, v: f32) {
    out.extend_from_slice(&f16::from_f32(v).to_le_bytes());
}

/// Q4_0: `d = max / -8`, quants `min(15, x * id + 8.5)`.
pub fn q4_0(x: &[f32], out: &mut Vec<u8>) {
    for b in x.chunks_exact(QK) {
        let d = signed_absmax(b) / -8.0;
        let id = inverse(d);
        put_f16(out, d);
        for j in 0..QK / 2 {
            let lo = trunc_i8(b[j].mul_add(id, 8.5)).min(15) as u8;
            let hi = trunc_i8(b[j + QK / 2].mul_add(id, 8.5)).min(15) as u8;
            out.push(lo | (hi << 4));
        }
    }
}

/// Q4_1: `d = (max - min) / 15`, `m = min`, quants `min(15, (x - min) * id + 0.5)`.
pub fn q4_1(x: &[f32], out: &mut Vec<u8>) {
    for b in x.chunks_exact(QK) {
        let (min, max) = min_max(b);
        let d = (max - min) / 15.0;
        let id = inverse(d);
        put_f16(out, d);
        put_f16(out, min);
        for j in 0..QK / 2 {
            let lo = trunc_i8((b[j] - min).mul_add(id, 0.5)).min(15) as u8;
            let hi = trunc_i8((b[j + QK / 2] - min).mul_add(id, 0.5)).min(15) as u8;
            out.push(lo | (hi << 4));
        }
    }
}

/// The low nibbles and the 32-bit fifth-bit mask of 32 five-bit quants.
fn put_q5(out: &mut Vec<u8>, q: &[u8; QK]) {
    let mut qh = 0u32;
    for (j, &v) in q.iter().enumerate() {
        qh |= (((v & 0x10) >> 4) as u32) << j;
    }
    out.extend_from_slice(&qh.to_le_bytes());
    for j in 0..QK / 2 {
        out.push((q[j] & 0x0F) | ((q[j + QK / 2] & 0x0F) << 4));
    }
}

/// Q5_0: `d = max / -16`, quants `min(31, x * id + 16.5)`.
pub fn q5_0(x: &[f32], out: &mut Vec<u8>) {
    for b in x.chunks_exact(QK) {
        let d = signed_absmax(b) / -16.0;
        let id = inverse(d);
        put_f16(out, d);
        let mut q = [0u8; QK];
        for (q, &v) in q.iter_mut().zip(b) {
            *q = trunc_i8(v.mul_add(id, 16.5)).min(31) as u8;
        }
        put_q5(out, &q);
    }
}

/// Q5_1: `d = (max - min) / 31`, `m = min`, quants `(uint8_t)((x - min) * id + 0.5)`.
pub fn q5_1(x: &[f32], out: &mut Vec<u8>) {
    for b in x.chunks_exact(QK) {
        let (min, max) = min_max(b);
        let d = (max - min) / 31.0;
        let id = inverse(d);
        put_f16(out, d);
        put_f16(out, min);
        let mut q = [0u8; QK];
        for (q, &v) in q.iter_mut().zip(b) {
            *q = ((v - min).mul_add(id, 0.5) as i32) as u8;
        }
        put_q5(out, &q);
    }
}

/// Q8_0: `d = amax / 127`, quants `roundf(x * id)`.
pub fn q8_0(x: &[f32], out: &mut Vec<u8>) {
    for b in x.chunks_exact(QK) {
        let amax = b
            .iter()
            .fold(0f32, |m, v| if m > v.abs() { m } else { v.abs() });
        let d = amax / 127.0;
        let id = inverse(d);
        put_f16(out, d);
        for &v in b {
            out.push(((v * id).round() as i32) as i8 as u8);
        }
    }
}
