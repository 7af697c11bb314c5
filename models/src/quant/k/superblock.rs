//! What a 256-value super-block format must say about itself ([`SuperBlock`])
//! and the two drivers written once over it: [`dot`] (one output) and
//! [`dot_rows`] (one weight row against many activation rows, each super-block
//! unpacked once for all of them).
//!
//! A format supplies its unpacking and the exact integer parts of one
//! super-block product, in a scalar and an AVX2 version (the integers are
//! exact, so both give the same ones), and ggml's floating-point order over
//! them (`step` per super-block, `finish` at the end), which differs by
//! format and by [`Variant`]. The drivers only walk the blocks, so every
//! format's outputs are bit for bit what its own ggml kernel gives.

use super::q8k::Q8KBlock;
use super::{hsum8, Variant, ROWS_AT_ONCE};

/// One K-quant super-block format (see the module doc).
pub(crate) trait SuperBlock {
    /// Bytes of one super-block in ggml's layout.
    const BLOCK_BYTES: usize;
    /// The exact integer parts of one super-block product.
    type Ints;
    /// One output's running floating-point state.
    type Acc: Default + Copy;
    /// A super-block unpacked by the scalar kernel.
    type Unpacked;

    /// Unpacks super-block `w`, scalar.
    fn unpack(w: &[u8]) -> Self::Unpacked;

    /// The integer parts against activation block `a`, scalar.
    fn ints(u: &Self::Unpacked, a: &Q8KBlock) -> Self::Ints;

    /// The integer parts of one super-block against one activation block,
    /// scalar (formats with a direct form override it).
    #[inline(always)]
    fn ints_one(w: &[u8], a: &Q8KBlock) -> Self::Ints {
        Self::ints(&Self::unpack(w), a)
    }

    /// Adds one super-block's integer parts to `acc` in the order of `v`'s
    /// ggml kernel (`wb` the weight block, for its scales).
    fn step(v: Variant, acc: &mut Self::Acc, wb: &[u8], ab: &Q8KBlock, i: &Self::Ints);

    /// The output from the state after the last super-block.
    fn finish(v: Variant, acc: &Self::Acc) -> f32;

    /// A super-block unpacked by the AVX2 kernel.
    #[cfg(target_arch = "x86_64")]
    type Vectors;

    /// Unpacks super-block `w` with AVX2.
    ///
    /// # Safety
    /// AVX2 and FMA available; `w` one whole super-block.
    #[cfg(target_arch = "x86_64")]
    unsafe fn unpack_avx2(w: &[u8]) -> Self::Vectors;

    /// The integer parts against activation block `a`, with AVX2.
    ///
    /// # Safety
    /// As [`SuperBlock::unpack_avx2`].
    #[cfg(target_arch = "x86_64")]
    unsafe fn ints_avx2(u: &Self::Vectors, a: &Q8KBlock) -> Self::Ints;

    /// One super-block against one activation block, with AVX2 (formats with
    /// a direct form, as ggml's `vec_dot`, override it).
    ///
    /// # Safety
    /// As [`SuperBlock::unpack_avx2`].
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn ints_one_avx2(w: &[u8], a: &Q8KBlock) -> Self::Ints {
        Self::ints_avx2(&Self::unpack_avx2(w), a)
    }
}

/// ggml's order for the formats whose integer parts are eight lanes with no
/// minimums (Q3_K, Q6_K, IQ4_XS; `d` the weight block's scale): `vec_dot`
/// keeps `acc[l] = fma(d_x * d, lane l, acc[l])`, the tiled matmul one sum
/// `fma(d * total, d_x, acc)` in lane 0.
#[inline(always)]
pub(crate) fn lanes_step(v: Variant, acc: &mut [f32; 8], d: f32, ab: &Q8KBlock, lanes: &[i32; 8]) {
    if v == Variant::Tiled {
        let s1: i32 = lanes.iter().sum();
        acc[0] = (d * s1 as f32).mul_add(ab.d, acc[0]);
    } else {
        let d = ab.d * d;
        for (acc, &p) in acc.iter_mut().zip(lanes) {
            *acc = d.mul_add(p as f32, *acc);
        }
    }
}

/// The output of [`lanes_step`]'s sums: `hsum_float_8`, or the tiled sum.
#[inline(always)]
pub(crate) fn lanes_finish(v: Variant, acc: &[f32; 8]) -> f32 {
    if v == Variant::Tiled {
        acc[0]
    } else {
        hsum8(acc)
    }
}

/// ggml's floating-point combination over a whole row.
#[inline(always)]
fn combine<F: SuperBlock>(
    v: Variant,
    w: &[u8],
    a: &[Q8KBlock],
    ints: impl Fn(&[u8], &Q8KBlock) -> F::Ints,
) -> f32 {
    let mut acc = F::Acc::default();
    for (wb, ab) in w.chunks_exact(F::BLOCK_BYTES).zip(a) {
        F::step(v, &mut acc, wb, ab, &ints(wb, ab));
    }
    F::finish(v, &acc)
}

/// [`dot_rows`] with the unpacking and integer parts given.
#[inline(always)]
fn rows_with<F: SuperBlock, U>(
    v: &[Variant],
    w: &[u8],
    a: &[&[Q8KBlock]],
    out: &mut [f32],
    unpack: impl Fn(&[u8]) -> U,
    ints: impl Fn(&U, &Q8KBlock) -> F::Ints,
) {
    let n = ROWS_AT_ONCE;
    for ((v, a), out) in v.chunks(n).zip(a.chunks(n)).zip(out.chunks_mut(n)) {
        let mut accs = [F::Acc::default(); ROWS_AT_ONCE];
        for (b, wb) in w.chunks_exact(F::BLOCK_BYTES).enumerate() {
            let u = unpack(wb);
            for ((s, ar), &vi) in accs.iter_mut().zip(a).zip(v) {
                F::step(vi, s, wb, &ar[b], &ints(&u, &ar[b]));
            }
        }
        for ((o, s), &vi) in out.iter_mut().zip(&accs).zip(v) {
            *o = F::finish(vi, s);
        }
    }
}

/// One weight row `w` against several activation rows `a[i]` (kernel `v[i]`),
/// into `out[i]`: each weight super-block is unpacked once for all of them,
/// and each output keeps its own kernel's order, so `out[i]` equals
/// `dot::<F>(avx2, v[i], w, a[i])` bit for bit.
pub(crate) fn dot_rows<F: SuperBlock>(
    avx2: bool,
    v: &[Variant],
    w: &[u8],
    a: &[&[Q8KBlock]],
    out: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    if avx2 {
        // SAFETY: the caller checked AVX2 and FMA.
        return unsafe { avx2::dot_rows::<F>(v, w, a, out) };
    }
    let _ = avx2;
    rows_with::<F, _>(v, w, a, out, F::unpack, F::ints);
}

/// One output: weight row `w` against activation row `a`; `avx2` picks the
/// AVX2 integer kernel (the caller checked the CPU has it).
pub(crate) fn dot<F: SuperBlock>(avx2: bool, v: Variant, w: &[u8], a: &[Q8KBlock]) -> f32 {
    debug_assert_eq!(w.len(), a.len() * F::BLOCK_BYTES);
    #[cfg(target_arch = "x86_64")]
    if avx2 {
        // SAFETY: the caller checked AVX2 and FMA; the lengths match.
        return unsafe { avx2::dot::<F>(v, w, a) };
    }
    let _ = avx2;
    combine::<F>(v, w, a, F::ints_one)
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::{combine, rows_with, Q8KBlock, SuperBlock, Variant};

    /// # Safety
    /// AVX2 and FMA available; every `a[i]` as long as `w` in super-blocks.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn dot_rows<F: SuperBlock>(
        v: &[Variant],
        w: &[u8],
        a: &[&[Q8KBlock]],
        out: &mut [f32],
    ) {
        rows_with::<F, _>(
            v,
            w,
            a,
            out,
            |wb| unsafe { F::unpack_avx2(wb) },
            |u, ab| unsafe { F::ints_avx2(u, ab) },
        );
    }

    /// # Safety
    /// AVX2 and FMA available; `w.len() == a.len() * F::BLOCK_BYTES`.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn dot<F: SuperBlock>(v: Variant, w: &[u8], a: &[Q8KBlock]) -> f32 {
        combine::<F>(v, w, a, |wb, ab| unsafe { F::ints_one_avx2(wb, ab) })
    }
}
