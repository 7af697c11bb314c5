use super::*;
use candle_core::{Device, Layout};

/// A random `[heads, len, hd]` buffer of f16-representable values.
fn buffer(heads: usize, len: usize, hd: usize, seed: u64) -> Vec<f32> {
    let mut state = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..heads * len * hd)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let u = (state >> 40) as f32 / (1u64 << 24) as f32;
            round16(2.0 * u - 1.0)
        })
        .collect()
}

/// Softmax attention in f64 over the visible entries: the exact answer both
/// kernels approximate.
fn reference(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    k_pos: &[u32],
    q_pos: u32,
    hd: usize,
    scale: f32,
) -> Vec<f64> {
    let len = k_pos.len();
    let s: Vec<f64> = (0..len)
        .map(|c| {
            let d: f64 = (0..hd).map(|i| q[i] as f64 * k[c * hd + i] as f64).sum();
            d * scale as f64
        })
        .collect();
    let max = (0..len)
        .filter(|&c| k_pos[c] <= q_pos)
        .map(|c| s[c])
        .fold(f64::NEG_INFINITY, f64::max);
    let w: Vec<f64> = (0..len)
        .map(|c| {
            if k_pos[c] <= q_pos {
                (s[c] - max).exp()
            } else {
                0.0
            }
        })
        .collect();
    let total: f64 = w.iter().sum();
    (0..hd)
        .map(|i| (0..len).map(|c| w[c] * v[c * hd + i] as f64).sum::<f64>() / total)
        .collect()
}

struct Case {
    n_kv: usize,
    group: usize,
    hd: usize,
    len: usize,
    k: Vec<f32>,
    v: Vec<f32>,
    pos: Vec<u32>,
}

impl Case {
    fn new(len: usize, seed: u64) -> Self {
        let (n_kv, group, hd) = (3, 3, 64);
        Self {
            n_kv,
            group,
            hd,
            len,
            k: buffer(n_kv, len, hd, seed),
            v: buffer(n_kv, len, hd, seed + 1),
            pos: (0..len as u32).collect(),
        }
    }

    /// The last `n` positions as new query rows.
    fn run(&self, q: &[f32], n: usize, want: bool) -> Attended {
        let (out, seen) = self.observe(q, n, want.then_some(WeightsWanted::ALL_ROWS));
        (out, seen.map(|s| s.weights))
    }

    /// [`Case::run`] handing over the weights `want` names.
    fn observe(
        &self,
        q: &[f32],
        n: usize,
        want: Option<WeightsWanted>,
    ) -> (Vec<f32>, Option<Observed>) {
        let layout = Layout::contiguous((self.n_kv, self.len, self.hd));
        let kv = CacheView::new(&self.k, &layout).unwrap();
        let vv = CacheView::new(&self.v, &layout).unwrap();
        let q_pos: Vec<u32> = self.pos[self.len - n..].to_vec();
        let k_pos: Vec<&[u32]> = (0..self.n_kv).map(|_| self.pos.as_slice()).collect();
        let qs = Queries {
            q,
            pos: &q_pos,
            group: self.group,
            replay: None,
            window: None,
            kernel: FlashKernel::ByRows,
        };
        attend_observed(&qs, &kv, &vv, &k_pos, 0.125, want)
    }

    fn head(&self, buf: &[f32], h: usize) -> Vec<f32> {
        buf[h * self.len * self.hd..(h + 1) * self.len * self.hd].to_vec()
    }
}

/// Worst error of `got` (`[n, H*hd]`) against the f64 reference.
fn worst_error(case: &Case, q: &[f32], n: usize, got: &[f32]) -> f64 {
    let (h_all, hd) = (case.n_kv * case.group, case.hd);
    let mut worst = 0f64;
    for h in 0..h_all {
        let kvh = h / case.group;
        let (k, v) = (case.head(&case.k, kvh), case.head(&case.v, kvh));
        for i in 0..n {
            let qr = &q[(h * n + i) * hd..(h * n + i + 1) * hd];
            let want = reference(qr, &k, &v, &case.pos, case.pos[case.len - n + i], hd, 0.125);
            for d in 0..hd {
                let g = got[(i * h_all + h) * hd + d] as f64;
                worst = worst.max((g - want[d]).abs());
            }
        }
    }
    worst
}

#[test]
fn both_kernels_compute_causal_softmax_attention() {
    let case = Case::new(200, 7);
    for n in [1, 5, 63, 64, 100] {
        let q = buffer(case.n_kv * case.group, n, case.hd, 99 + n as u64);
        let (out, w) = case.run(&q, n, true);
        let err = worst_error(&case, &q, n, &out);
        // The short-batch kernel rounds the query and its accumulator to f16.
        let bound = if n >= TILED_MIN_ROWS { 1e-5 } else { 4e-3 };
        assert!(err < bound, "n={n}: max error {err}");
        // Weights `[KV, group, n, C]`: each row a distribution over the
        // entries its query can see.
        let w = w.unwrap();
        assert_eq!(w.len(), case.n_kv * case.group * n * case.len);
        for (r, row) in w.chunks(case.len).enumerate() {
            let q_pos = case.pos[case.len - n + r % n] as usize;
            let total: f32 = row.iter().sum();
            assert!((total - 1.0).abs() < 1e-4, "n={n} row {r}: {total}");
            assert!(row[q_pos + 1..].iter().all(|&x| x == 0.0));
        }
        // Asking for the weights changes nothing else.
        assert_eq!(case.run(&q, n, false).0, out);
    }
}

#[test]
fn a_row_is_computed_the_same_whatever_else_is_in_the_batch() {
    // llama.cpp and the engine batch prompts differently; results must only
    // depend on the row and on which kernel runs.
    let case = Case::new(300, 3);
    let heads = case.n_kv * case.group;
    let (n_big, n_small) = (90, 70);
    let q_big = buffer(heads, n_big, case.hd, 5);
    // The last 70 rows of the 90-row batch, as their own batch.
    let mut q_small = Vec::new();
    for h in 0..heads {
        let from = (h * n_big + (n_big - n_small)) * case.hd;
        q_small.extend_from_slice(&q_big[from..from + n_small * case.hd]);
    }
    let (big, _) = case.run(&q_big, n_big, false);
    let (small, _) = case.run(&q_small, n_small, false);
    let row = heads * case.hd;
    assert_eq!(&big[(n_big - n_small) * row..], &small[..]);
}

#[test]
fn future_entries_are_invisible() {
    let mut case = Case::new(128, 11);
    let n = 1;
    let q = buffer(case.n_kv * case.group, n, case.hd, 1);
    // The query sits at position 100: entries 101.. are in the future.
    case.pos = (0..128).collect();
    let q_pos = [100u32];
    let layout = Layout::contiguous((case.n_kv, case.len, case.hd));
    let run = |case: &Case| {
        let kv = CacheView::new(&case.k, &layout).unwrap();
        let vv = CacheView::new(&case.v, &layout).unwrap();
        let k_pos: Vec<&[u32]> = (0..case.n_kv).map(|_| case.pos.as_slice()).collect();
        let qs = Queries {
            q: &q,
            pos: &q_pos,
            group: case.group,
            replay: None,
            window: None,
            kernel: FlashKernel::ByRows,
        };
        attend(&qs, &kv, &vv, &k_pos, 0.125, true)
    };
    let (before, w) = run(&case);
    for h in 0..case.n_kv {
        for c in 101..128 {
            for d in 0..case.hd {
                case.k[(h * 128 + c) * case.hd + d] = 3.0;
                case.v[(h * 128 + c) * case.hd + d] = -5.0;
            }
        }
    }
    let (after, _) = run(&case);
    assert_eq!(before, after);
    let w = w.unwrap();
    for row in w.chunks(128) {
        let total: f32 = row.iter().sum();
        assert!((total - 1.0).abs() < 1e-5, "{total}");
        assert!(row[101..].iter().all(|&x| x == 0.0));
    }
}

#[test]
fn tensors_in_place_match_the_slices() {
    let case = Case::new(80, 21);
    let n = 4;
    let heads = case.n_kv * case.group;
    let q = buffer(heads, n, case.hd, 8);
    let dev = Device::Cpu;
    let qt = Tensor::from_vec(q.clone(), (heads, n, case.hd), &dev).unwrap();
    let kt = Tensor::from_vec(case.k.clone(), (case.n_kv, case.len, case.hd), &dev).unwrap();
    let vt = Tensor::from_vec(case.v.clone(), (case.n_kv, case.len, case.hd), &dev).unwrap();
    let k_pos: Vec<&[u32]> = (0..case.n_kv).map(|_| case.pos.as_slice()).collect();
    let q_pos: Vec<u32> = case.pos[case.len - n..].to_vec();
    let (got, _) = attend_tensors(&qt, &q_pos, &kt, &vt, &k_pos, None, 0.125, false)
        .unwrap()
        .expect("a contiguous f32 cache is read in place");
    assert_eq!(got, case.run(&q, n, false).0);
    // Positions that do not match the cache are refused, not misread.
    let short: Vec<&[u32]> = (0..case.n_kv).map(|_| &case.pos[..10]).collect();
    assert!(
        attend_tensors(&qt, &q_pos, &kt, &vt, &short, None, 0.125, false)
            .unwrap()
            .is_none()
    );
}

#[test]
fn f16_dot_adds_in_ggml_order() {
    // 2^24 + 1 - 2^24: summed in ggml's lane order the 1 survives in lane 3
    // of the second accumulator, where a left-to-right sum would drop it.
    let mut x = vec![0f32; 64];
    let y = vec![1f32; 64];
    x[0] = 16_777_216.0;
    x[8 + 3] = 1.0;
    x[32] = -16_777_216.0;
    assert_eq!(dot_f16(&x, &y), 1.0);
    // The tail past a multiple of 32 is added in double.
    let x: Vec<f32> = (0..40).map(|i| i as f32).collect();
    let y = vec![0.5f32; 40];
    assert_eq!(
        dot_f16(&x, &y),
        (0..40).map(|i| i as f32 * 0.5).sum::<f32>()
    );
}

#[test]
fn asking_for_the_last_rows_and_sums_hands_over_exactly_those() {
    // A scorer that reads the last rows, or H2O's per-entry totals, must see
    // what the full weights say, without the full `n x n` ever being built.
    let case = Case::new(150, 21);
    for n in [1, 20, 100] {
        let q = buffer(case.n_kv * case.group, n, case.hd, 7 + n as u64);
        let (out, full) = case.run(&q, n, true);
        let full = full.unwrap();
        let want = WeightsWanted {
            last_rows: 8,
            column_means: true,
        };
        let (got, seen) = case.observe(&q, n, Some(want));
        assert_eq!(
            got, out,
            "n={n}: the output does not depend on what is observed"
        );
        let seen = seen.unwrap();
        let kept = n.min(8);
        assert_eq!(seen.rows, kept);
        let len = case.len;
        for h in 0..case.n_kv * case.group {
            for r in 0..kept {
                let want_row = &full[(h * n + n - kept + r) * len..][..len];
                let got_row = &seen.weights[(h * kept + r) * len..][..len];
                assert_eq!(got_row, want_row, "n={n} head {h} row {r}");
            }
        }
        let sums = seen.column_means.unwrap();
        for kvh in 0..case.n_kv {
            for c in 0..len {
                let mut total = 0f64;
                for j in 0..case.group {
                    let h = kvh * case.group + j;
                    total += (0..n)
                        .map(|i| full[(h * n + i) * len + c] as f64)
                        .sum::<f64>();
                }
                let total = total / case.group as f64;
                let got = sums[kvh * len + c] as f64;
                assert!(
                    (got - total).abs() <= 1e-5 * total.max(1.0),
                    "n={n} {kvh}/{c}"
                );
            }
        }
    }
}

/// The AVX-512 score and value products give the portable loops' bits:
/// every score and accumulator element a chain of fused multiply-adds in
/// key (or dimension) order, whatever the vector width.
#[cfg(target_arch = "x86_64")]
#[test]
fn sixteen_lane_tile_products_equal_the_portable_chains() {
    if !crate::quant::dot::avx512_vnni() {
        eprintln!("no AVX-512 on this CPU (or TERN_AVX512=0): nothing to compare");
        return;
    }
    let hd = 128;
    let kt = buffer(1, KV_TILE, hd, 7);
    let q = buffer(1, 1, hd, 8);
    let mut got = [0f32; KV_TILE];
    // SAFETY: AVX-512 F detected; `kt` holds `hd * KV_TILE` floats.
    unsafe { wide::tile_scores(&kt, &q, &mut got) };
    let mut want = [0f32; KV_TILE];
    for (k, &qk) in q.iter().enumerate() {
        for (t, x) in want.iter_mut().enumerate() {
            *x = kt[k * KV_TILE + t].mul_add(qk, *x);
        }
    }
    assert_eq!(got.map(f32::to_bits), want.map(f32::to_bits));
    let values = buffer(1, KV_TILE, hd, 9);
    let mut w = buffer(1, 1, KV_TILE, 10);
    w[5] = 0.0;
    let start = buffer(1, 1, hd, 11);
    let mut a = start.clone();
    // SAFETY: as above; `a` and every value row hold 128 floats.
    unsafe { wide::tile_values_128(&mut a, &w, |t| &values[t * hd..(t + 1) * hd]) };
    let mut b = start;
    for (t, &wt) in w.iter().enumerate() {
        if wt != 0.0 {
            for (x, &vx) in b.iter_mut().zip(&values[t * hd..(t + 1) * hd]) {
                *x = vx.mul_add(wt, *x);
            }
        }
    }
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&a), bits(&b));
}
