//! Attention over a sequence's cache with llama.cpp's CPU flash-attention
//! numerics, so that Tern and llama.cpp produce the same tokens.
//!
//! llama.cpp runs attention on the CPU as one fused "flash" kernel (on by
//! default), and its rounding differs from a plain softmax(QK^T)V in ways that
//! decide greedy near-ties: with fewer than 64 query rows in a batch (a short
//! prompt, every decode step) the query is rounded to f16 and the values are
//! accumulated in an f16 buffer re-rounded after every key; with 64 or more rows
//! (long prefill) it works in f32 over tiles of 64 keys with a polynomial `exp`.
//! This module repeats both: the same operations, in the same order, at the same
//! precision, one query row at a time (rows are independent in both kernels),
//! tiles counted from the first cache entry as llama.cpp counts cache cells.
//!
//! Which kernel runs is chosen by the caller's row count, as llama.cpp chooses by
//! its micro-batch: [`TILED_MIN_ROWS`]. Keys and values are the cache's f32
//! buffers holding f16-representable numbers (the cache rounds on append), which
//! converts to f32 exactly as llama.cpp widens its f16 cache.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use candle_core::Tensor;
use half::f16;

use crate::attention::{exp_nonpositive, with_views, CacheView};
use crate::error::Result;
use crate::kv::WeightsWanted;
use crate::kv_dtype::{KvDtype, QueryBlocks};
use crate::quant::pool::Pool;
use crate::visibility::Visibility;

/// Query rows from which llama.cpp takes its tiled f32 kernel.
pub const TILED_MIN_ROWS: usize = 64;
/// Keys per tile in the tiled kernel.
const KV_TILE: usize = 64;
/// Query rows (per query head) in one work item handed to a thread.
const ROWS_PER_ITEM: usize = 16;

/// The new query rows of one sequence and where they sit.
pub struct Queries<'a> {
    /// `[H, n, head_dim]` row-major, f32 (after RoPE, not rounded).
    pub q: &'a [f32],
    /// Position of each of the `n` rows.
    pub pos: &'a [u32],
    /// Query heads per KV head.
    pub group: usize,
    /// A replayed eviction record and the layer, when some entries at or
    /// before a row's position were already evicted for it.
    pub replay: Option<(&'a Visibility, usize)>,
    /// A sliding-window layer's window: a row at `p` sees only entries at
    /// positions `p - window < k <= p` (llama.cpp's standard SWA mask).
    pub window: Option<u32>,
    /// Which of llama.cpp's two kernels rounds these rows.
    pub kernel: FlashKernel,
}

/// Which kernel's rounding a call reproduces. llama.cpp picks by the rows of
/// its micro-batch; a learner scoring a sampled sequence again in one pass
/// must instead pick what the sampler ran for those rows (one row at a time
/// while decoding, the prompt's chunk size while prefilling).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FlashKernel {
    /// As llama.cpp chooses for this many rows ([`TILED_MIN_ROWS`]).
    ByRows,
    /// The f16-accumulating kernel whatever the row count (decode rows).
    Rows,
    /// The tiled f32 kernel whatever the row count.
    Tiled,
}

impl FlashKernel {
    /// Whether `n` rows run on the tiled kernel.
    pub fn tiled(self, n: usize) -> bool {
        match self {
            FlashKernel::ByRows => n >= TILED_MIN_ROWS,
            FlashKernel::Rows => false,
            FlashKernel::Tiled => true,
        }
    }
}

/// What [`attend`] returns: the output `[n, H * head_dim]` and, when asked,
/// the softmax weights `[KV, group, n, C]` (what a scoring policy observes).
pub type Attended = (Vec<f32>, Option<Vec<f32>>);

/// The attention weights a policy asked for ([`WeightsWanted`]).
#[derive(Debug, Clone)]
pub struct Observed {
    /// Softmax weights of the step's last `rows` query rows, `[KV, group, rows, C]`.
    pub weights: Vec<f32>,
    /// How many of the step's last rows `weights` holds.
    pub rows: usize,
    /// `[KV, C]`: each entry's weight averaged over the group's heads and
    /// summed over every row of the step, when asked for.
    pub column_means: Option<Vec<f32>>,
}

/// Attention of `qs` over the cache `k`, `v` (`[KV, C, hd]` views) whose entry
/// `c` of KV head `h` holds position `k_pos[h][c]`; a row sees the entries at
/// or before its own position (that the replayed record, if any, still held).
pub fn attend(
    qs: &Queries<'_>,
    k: &CacheView<'_>,
    v: &CacheView<'_>,
    k_pos: &[&[u32]],
    scale: f32,
    want_weights: bool,
) -> Attended {
    let want = want_weights.then_some(WeightsWanted::ALL_ROWS);
    let (out, seen) = attend_observed(qs, k, v, k_pos, scale, want);
    (out, seen.map(|s| s.weights))
}

/// [`attend`], handing over only the weights `want` names: the last rows in
/// full and, if asked, per-entry sums over all rows, so a long prompt's
/// `n x n` weights never exist at once.
pub fn attend_observed(
    qs: &Queries<'_>,
    k: &CacheView<'_>,
    v: &CacheView<'_>,
    k_pos: &[&[u32]],
    scale: f32,
    want: Option<WeightsWanted>,
) -> (Vec<f32>, Option<Observed>) {
    let n = qs.pos.len();
    let hd = k.head_dim();
    let n_kv = k_pos.len();
    let (group, len) = (qs.group, k.len);
    let n_head = n_kv * group;
    // Rows from `from_row` on are handed over in full.
    let from_row = want.map_or(n, |w| n.saturating_sub(w.last_rows));
    let sums = want.is_some_and(|w| w.column_means);
    // Work items: (KV head, block of rows), all query heads of the group.
    let blocks = n.div_ceil(ROWS_PER_ITEM);
    let items = n_kv * blocks;
    let next = AtomicUsize::new(0);
    let done: Mutex<Vec<(usize, Block)>> = Mutex::new(Vec::with_capacity(items));
    let job = || loop {
        let item = next.fetch_add(1, Ordering::Relaxed);
        if item >= items {
            break;
        }
        let (kvh, b) = (item / blocks, item % blocks);
        let rows = b * ROWS_PER_ITEM..((b + 1) * ROWS_PER_ITEM).min(n);
        let heads = Heads {
            qs,
            k,
            v,
            kvh,
            k_pos: k_pos[kvh],
            scale,
            want_weights: want.is_some() && (sums || rows.end > from_row),
        };
        // llama.cpp reads a quantized cache with the per-row kernel only.
        let mut block = if k.dtype().is_quantized() {
            heads.one_chunk_blocks(rows.clone())
        } else if qs.kernel.tiled(n) {
            heads.tiled(rows.clone())
        } else {
            heads.one_chunk(rows.clone())
        };
        if heads.want_weights {
            block.reduce(group, len, rows, from_row, sums);
        }
        done.lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((item, block));
    };
    if items > 1 {
        Pool::global().run(&job);
    } else {
        job();
    }
    let mut done = done.into_inner().unwrap_or_else(|p| p.into_inner());
    // Sums add up block by block in row order, whatever order threads finished.
    done.sort_unstable_by_key(|&(item, _)| item);
    let kept = n - from_row;
    let mut out = vec![0f32; n * n_head * hd];
    let mut weights = want.map(|_| vec![0f32; n_head * kept * len]);
    let mut column_means = sums.then(|| vec![0f32; n_kv * len]);
    for (item, block) in done {
        let (kvh, b) = (item / blocks, item % blocks);
        let first = b * ROWS_PER_ITEM;
        let rows = ((b + 1) * ROWS_PER_ITEM).min(n) - first;
        for j in 0..group {
            let head = kvh * group + j;
            for r in 0..rows {
                let src = &block.out[(j * rows + r) * hd..(j * rows + r + 1) * hd];
                let at = ((first + r) * n_head + head) * hd;
                out[at..at + hd].copy_from_slice(src);
            }
        }
        if let Some(all) = column_means.as_mut() {
            for (s, x) in all[kvh * len..(kvh + 1) * len]
                .iter_mut()
                .zip(&block.column)
            {
                *s += x;
            }
        }
        let held = (first + rows).saturating_sub(first.max(from_row));
        if let (Some(all), true) = (weights.as_mut(), held > 0) {
            // `[KV, group, kept, C]` rows are laid out as `[H, kept, C]`.
            for j in 0..group {
                let head = kvh * group + j;
                let at = (head * kept + first.max(from_row) - from_row) * len;
                let src = &block.weights[j * held * len..(j + 1) * held * len];
                all[at..at + held * len].copy_from_slice(src);
            }
        }
    }
    let observed = weights.map(|weights| Observed {
        weights,
        rows: kept,
        column_means,
    });
    (out, observed)
}

/// Runs [`attend`] on tensors: `q` `[H, n, hd]`, cache `k`, `v` `[KV, C, hd]`
/// views. `None` when a tensor is not a CPU f32 view this path reads in place
/// (the caller then takes the tensor path).
#[allow(clippy::too_many_arguments)]
pub fn attend_tensors(
    q: &Tensor,
    q_pos: &[u32],
    k: &Tensor,
    v: &Tensor,
    k_pos: &[&[u32]],
    replay: Option<(&Visibility, usize)>,
    scale: f32,
    want_weights: bool,
) -> Result<Option<Attended>> {
    let want = want_weights.then_some(WeightsWanted::ALL_ROWS);
    Ok(attend_tensors_windowed(
        q,
        q_pos,
        k,
        v,
        KvDtype::F32,
        k_pos,
        replay,
        None,
        scale,
        want,
        None,
    )?
    .map(|(out, seen)| (out, seen.map(|s| s.weights))))
}

/// [`attend_tensors`] over a cache stored as `dtype`, for any layer: on a
/// sliding-window layer each row sees only the entries less than `window`
/// positions behind it (`None`: every earlier one); hands over the weights
/// `want` names. `gap`: stored entries read as if absent
/// ([`CacheView::skipping`]; `k_pos` then lists the others).
#[allow(clippy::too_many_arguments)]
pub fn attend_tensors_windowed(
    q: &Tensor,
    q_pos: &[u32],
    k: &Tensor,
    v: &Tensor,
    dtype: KvDtype,
    k_pos: &[&[u32]],
    replay: Option<(&Visibility, usize)>,
    window: Option<u32>,
    scale: f32,
    want: Option<WeightsWanted>,
    gap: Option<std::ops::Range<usize>>,
) -> Result<Option<(Vec<f32>, Option<Observed>)>> {
    if k.dims3()?.0 != k_pos.len() || v.dims3()?.0 != k_pos.len() {
        return Ok(None);
    }
    let head_dim = q.dim(candle_core::D::Minus1)?;
    let q: Vec<f32> = q.flatten_all()?.to_vec1()?;
    let n_kv = k_pos.len();
    let n = q_pos.len();
    Ok(with_views(k, v, dtype, head_dim, gap, |kv, vv| {
        let hd = kv.head_dim();
        let fits = n > 0
            && n_kv > 0
            && kv.len == vv.len
            && hd == vv.head_dim()
            && k_pos.iter().all(|p| p.len() == kv.len)
            && q.len().is_multiple_of(n_kv * n * hd);
        fits.then(|| {
            let qs = Queries {
                q: &q,
                pos: q_pos,
                group: q.len() / (n_kv * n * hd),
                replay,
                window,
                kernel: FlashKernel::ByRows,
            };
            attend_observed(&qs, kv, vv, k_pos, scale, want)
        })
    })
    .flatten())
}

/// One work item's results, rows ordered `[group][rows]`.
struct Block {
    out: Vec<f32>,
    weights: Vec<f32>,
    /// The block's rows' group-mean weights summed, when asked for.
    column: Vec<f32>,
}

impl Block {
    /// Keeps only the weights of rows `from_row..` of the step (this block
    /// covers `rows`) and, if `sums`, first adds every row's group mean into
    /// `column` (heads summed in order, times `1/group`, rows in order).
    fn reduce(
        &mut self,
        group: usize,
        len: usize,
        rows: std::ops::Range<usize>,
        from_row: usize,
        sums: bool,
    ) {
        let nr = rows.len();
        if sums {
            let scale = (1f64 / group as f64) as f32;
            let mut mean = vec![0f32; len];
            self.column = vec![0f32; len];
            for r in 0..nr {
                mean.fill(0.0);
                for j in 0..group {
                    let row = &self.weights[(j * nr + r) * len..(j * nr + r + 1) * len];
                    for (m, x) in mean.iter_mut().zip(row) {
                        *m += x;
                    }
                }
                for (s, m) in self.column.iter_mut().zip(&mean) {
                    *s += m * scale;
                }
            }
        }
        let skip = from_row.saturating_sub(rows.start).min(nr);
        if skip == nr {
            self.weights = Vec::new();
        } else if skip > 0 {
            let held = nr - skip;
            let mut kept = Vec::with_capacity(group * held * len);
            for j in 0..group {
                kept.extend_from_slice(&self.weights[(j * nr + skip) * len..(j + 1) * nr * len]);
            }
            self.weights = kept;
        }
    }
}

/// The query heads of one KV head, against that head's cache entries.
struct Heads<'a, 'b> {
    qs: &'b Queries<'b>,
    k: &'b CacheView<'a>,
    v: &'b CacheView<'a>,
    kvh: usize,
    k_pos: &'b [u32],
    scale: f32,
    want_weights: bool,
}

impl Heads<'_, '_> {
    /// Whether the row at `q_pos` sees the entry at `k_pos`.
    #[inline]
    fn sees(&self, q_pos: u32, k_pos: u32) -> bool {
        let seen = match self.qs.replay {
            None => k_pos <= q_pos,
            Some((vis, layer)) => vis.visible(layer, self.kvh, q_pos, k_pos),
        };
        seen && self.qs.window.is_none_or(|w| in_window(q_pos, k_pos, w))
    }

    /// Query row `i` of the group's `j`-th head.
    fn query(&self, j: usize, i: usize) -> &[f32] {
        let (n, hd) = (self.qs.pos.len(), self.k.head_dim());
        let head = self.kvh * self.qs.group + j;
        &self.qs.q[(head * n + i) * hd..(head * n + i + 1) * hd]
    }

    /// Softmax weights `exp(s - max) / sum` over the visible scores, for a
    /// policy to rank entries by (a vectorizable `exp`: these weights steer
    /// eviction, they are not part of the output).
    fn weights_of(&self, scores: &[f32], q_pos: u32, max: f32, sum: f32, into: &mut Vec<f32>) {
        let inv = if sum > 0.0 { 1.0 / sum } else { 0.0 };
        if self.qs.replay.is_none() && self.qs.window.is_none() {
            // Causal only: a select after the `exp`, so the loop vectorizes
            // (an unseen entry's score may be stale or -inf; it is dropped).
            into.extend(scores.iter().zip(self.k_pos).map(|(&s, &p)| {
                let w = exp_nonpositive((s - max).min(0.0)) * inv;
                if p <= q_pos {
                    w
                } else {
                    0.0
                }
            }));
            return;
        }
        into.extend(scores.iter().zip(self.k_pos).map(|(&s, &p)| {
            if self.sees(q_pos, p) {
                exp_nonpositive(s - max) * inv
            } else {
                0.0
            }
        }));
    }

    /// llama.cpp's per-row kernel: query in f16, online softmax with libm
    /// `exp`, values accumulated in f16.
    fn one_chunk(&self, rows: std::ops::Range<usize>) -> Block {
        let hd = self.k.head_dim();
        let len = self.k.len;
        let mut block = Block {
            out: Vec::with_capacity(self.qs.group * rows.len() * hd),
            weights: Vec::new(),
            column: Vec::new(),
        };
        let mut scores = vec![0f32; if self.want_weights { len } else { 0 }];
        let mut acc = vec![0u16; hd];
        let (mut ks, mut vs_row) = (vec![0f32; hd], vec![0f32; hd]);
        for j in 0..self.qs.group {
            for i in rows.clone() {
                let q_pos = self.qs.pos[i];
                let q16: Vec<f32> = self.query(j, i).iter().map(|&x| round16(x)).collect();
                acc.iter_mut().for_each(|a| *a = 0);
                let (mut max, mut sum) = (f32::NEG_INFINITY, 0f32);
                for (c, &kp) in self.k_pos[..len].iter().enumerate() {
                    if !self.sees(q_pos, kp) {
                        continue;
                    }
                    let score = dot_f16(self.k.row(self.kvh, c, &mut ks), &q16) * self.scale;
                    if self.want_weights {
                        scores[c] = score;
                    }
                    let (mut ms, mut vs) = (1f32, 1f32);
                    if score > max {
                        ms = (max - score).exp();
                        max = score;
                        f16x::scale(&mut acc, ms);
                    } else {
                        vs = (score - max).exp();
                    }
                    f16x::mad(&mut acc, self.v.row(self.kvh, c, &mut vs_row), vs);
                    // llama.cpp's build contracts `S*ms + vs` into one fused op.
                    sum = sum.mul_add(ms, vs);
                }
                let inv = if sum == 0.0 { 0.0 } else { 1.0 / sum };
                block
                    .out
                    .extend(acc.iter().map(|&a| f16::from_bits(a).to_f32() * inv));
                if self.want_weights {
                    self.weights_of(&scores, q_pos, max, sum, &mut block.weights);
                }
            }
        }
        block
    }

    /// llama.cpp's per-row kernel over a quantized cache: the query
    /// quantized to Q8_0 blocks, each score the block dot of the stored key
    /// against it, values dequantized and accumulated in f32.
    fn one_chunk_blocks(&self, rows: std::ops::Range<usize>) -> Block {
        let hd = self.k.head_dim();
        let len = self.k.len;
        let dtype = self.k.dtype();
        let mut block = Block {
            out: Vec::with_capacity(self.qs.group * rows.len() * hd),
            weights: Vec::new(),
            column: Vec::new(),
        };
        let mut scores = vec![0f32; if self.want_weights { len } else { 0 }];
        let mut acc = vec![0f32; hd];
        // The value rows any row of the block can see, dequantized once for
        // all of them rather than once per query row (the same floats).
        let last_pos = rows.clone().map(|i| self.qs.pos[i]).max().unwrap_or(0);
        let mut values = vec![0f32; len * hd];
        let mut scratch = vec![0f32; hd];
        for (c, &kp) in self.k_pos[..len].iter().enumerate() {
            if kp <= last_pos {
                let v = self.v.row(self.kvh, c, &mut scratch);
                values[c * hd..(c + 1) * hd].copy_from_slice(v);
            }
        }
        for j in 0..self.qs.group {
            for i in rows.clone() {
                let q_pos = self.qs.pos[i];
                let qb = QueryBlocks::new(self.query(j, i));
                acc.fill(0.0);
                let (mut max, mut sum) = (f32::NEG_INFINITY, 0f32);
                for (c, &kp) in self.k_pos[..len].iter().enumerate() {
                    if !self.sees(q_pos, kp) {
                        continue;
                    }
                    let score = qb.dot(dtype, self.k.blocks(self.kvh, c)) * self.scale;
                    if self.want_weights {
                        scores[c] = score;
                    }
                    let (mut ms, mut vs) = (1f32, 1f32);
                    if score > max {
                        ms = (max - score).exp();
                        max = score;
                        acc.iter_mut().for_each(|a| *a *= ms);
                    } else {
                        vs = (score - max).exp();
                    }
                    let v = &values[c * hd..(c + 1) * hd];
                    for (a, &x) in acc.iter_mut().zip(v) {
                        *a = x.mul_add(vs, *a);
                    }
                    sum = sum.mul_add(ms, vs);
                }
                let inv = if sum == 0.0 { 0.0 } else { 1.0 / sum };
                block.out.extend(acc.iter().map(|&a| a * inv));
                if self.want_weights {
                    self.weights_of(&scores, q_pos, max, sum, &mut block.weights);
                }
            }
        }
        block
    }

    /// llama.cpp's tiled kernel: f32 throughout, 64 keys at a time, the
    /// polynomial `exp` and a double-precision running sum per tile. Each key
    /// tile is transposed once for every row of the block (as llama.cpp does),
    /// so scores vectorize across keys while each stays a sequential chain of
    /// fused multiply-adds over the head dimension.
    fn tiled(&self, rows: std::ops::Range<usize>) -> Block {
        let hd = self.k.head_dim();
        let len = self.k.len;
        let group = self.qs.group;
        let n_rows = group * rows.len();
        let mut acc = vec![0f32; n_rows * hd];
        let mut max = vec![f32::NEG_INFINITY; n_rows];
        let mut sum = vec![0f32; n_rows];
        let mut scores = vec![0f32; if self.want_weights { n_rows * len } else { 0 }];
        let mut kt = vec![0f32; hd * KV_TILE];
        let mut row = vec![0f32; hd];
        // Value rows of the tile as f32, unless the cache is f32 already.
        let direct = self.v.dtype() == KvDtype::F32;
        let mut vt = vec![0f32; if direct { 0 } else { hd * KV_TILE }];
        let last_pos = rows.clone().map(|i| self.qs.pos[i]).max().unwrap_or(0);
        let mut p = [0f32; KV_TILE];
        for start in (0..len).step_by(KV_TILE) {
            let tile = KV_TILE.min(len - start);
            let keys = &self.k_pos[start..start + tile];
            // No row of the block sees any key of this tile.
            if keys.iter().all(|&kp| kp > last_pos) {
                continue;
            }
            for t in 0..tile {
                for (kk, &x) in self.k.row(self.kvh, start + t, &mut row).iter().enumerate() {
                    kt[kk * KV_TILE + t] = x;
                }
                if !direct {
                    let r = self.v.row(self.kvh, start + t, &mut row);
                    vt[t * hd..(t + 1) * hd].copy_from_slice(r);
                }
            }
            for j in 0..group {
                for (ri, i) in rows.clone().enumerate() {
                    let r = j * rows.len() + ri;
                    let q_pos = self.qs.pos[i];
                    tile_scores(&kt, self.query(j, i), &mut p);
                    let plain = self.qs.replay.is_none() && self.qs.window.is_none();
                    let tile_max = if plain && tile == KV_TILE {
                        causal_tile(&mut p, keys, q_pos, self.scale)
                    } else {
                        let mut tile_max = f32::NEG_INFINITY;
                        for (t, x) in p.iter_mut().enumerate() {
                            *x = if t < tile && self.sees(q_pos, keys[t]) {
                                *x * self.scale
                            } else {
                                f32::NEG_INFINITY
                            };
                            tile_max = if tile_max > *x { tile_max } else { *x };
                        }
                        tile_max
                    };
                    if self.want_weights {
                        scores[r * len + start..r * len + start + tile].copy_from_slice(&p[..tile]);
                    }
                    if tile_max == f32::NEG_INFINITY {
                        continue;
                    }
                    let a = &mut acc[r * hd..(r + 1) * hd];
                    let new_max = max[r].max(tile_max);
                    if new_max > max[r] {
                        let ms = (max[r] - new_max).exp();
                        a.iter_mut().for_each(|x| *x *= ms);
                        sum[r] *= ms;
                    }
                    max[r] = new_max;
                    crate::exact::expf_poly_shifted(&mut p, new_max);
                    let tile_sum: f64 = p.chunks_exact(8).map(|l| hsum8(l) as f64).sum();
                    sum[r] = (sum[r] as f64 + tile_sum) as f32;
                    if direct {
                        tile_values(a, &p[..tile], |t| self.v.row(self.kvh, start + t, &mut []));
                    } else {
                        tile_values(a, &p[..tile], |t| &vt[t * hd..(t + 1) * hd]);
                    }
                }
            }
        }
        let mut block = Block {
            out: Vec::with_capacity(n_rows * hd),
            weights: Vec::new(),
            column: Vec::new(),
        };
        for j in 0..group {
            for (ri, i) in rows.clone().enumerate() {
                let r = j * rows.len() + ri;
                let inv = if sum[r] == 0.0 { 0.0 } else { 1.0 / sum[r] };
                block
                    .out
                    .extend(acc[r * hd..(r + 1) * hd].iter().map(|&x| x * inv));
                if self.want_weights {
                    let s = &scores[r * len..(r + 1) * len];
                    self.weights_of(s, self.qs.pos[i], max[r], sum[r], &mut block.weights);
                }
            }
        }
        block
    }
}

/// Whether an entry at `k_pos` lies inside the sliding window of a query at
/// `q_pos`: llama.cpp masks it once `q_pos - k_pos >= window`.
#[inline]
pub fn in_window(q_pos: u32, k_pos: u32, window: u32) -> bool {
    (q_pos as i64 - k_pos as i64) < window as i64
}

/// llama.cpp's f16 accumulator operations: widen, one f32 operation, round
/// back to f16 (F16C instructions where the build has them).
mod f16x {
    use half::f16;

    /// `acc = f16(acc * s)`.
    #[inline]
    pub fn scale(acc: &mut [u16], s: f32) {
        for a in acc.iter_mut() {
            *a = f16::from_f32(f16::from_bits(*a).to_f32() * s).to_bits();
        }
    }

    /// `acc = f16(fma(x, w, acc))`.
    #[inline]
    pub fn mad(acc: &mut [u16], x: &[f32], w: f32) {
        #[cfg(all(
            target_arch = "x86_64",
            target_feature = "f16c",
            target_feature = "fma"
        ))]
        if acc.len().is_multiple_of(8) {
            // SAFETY: the target features are enabled at compile time; loads
            // and stores stay inside the slices (8 lanes at a time, lengths
            // checked equal and a multiple of 8).
            unsafe { mad_f16c(acc, x, w) };
            return;
        }
        for (a, &xi) in acc.iter_mut().zip(x) {
            *a = f16::from_f32(xi.mul_add(w, f16::from_bits(*a).to_f32())).to_bits();
        }
    }

    #[cfg(all(
        target_arch = "x86_64",
        target_feature = "f16c",
        target_feature = "fma"
    ))]
    #[inline]
    unsafe fn mad_f16c(acc: &mut [u16], x: &[f32], w: f32) {
        use std::arch::x86_64::*;
        assert_eq!(acc.len(), x.len());
        let wv = _mm256_set1_ps(w);
        for (a, xs) in acc.chunks_exact_mut(8).zip(x.chunks_exact(8)) {
            let ap = a.as_mut_ptr() as *mut __m128i;
            let av = _mm256_cvtph_ps(_mm_loadu_si128(ap));
            let xv = _mm256_loadu_ps(xs.as_ptr());
            let r = _mm256_fmadd_ps(xv, wv, av);
            _mm_storeu_si128(ap, _mm256_cvtps_ph::<0>(r));
        }
    }
}

/// One query row's scores against a key tile: `p[t] = sum_k q[k] * kt[k][t]`
/// (`kt` the tile transposed, `[hd][KV_TILE]`), each a chain of fused
/// multiply-adds over `k` in order, as llama.cpp computes them. The 8-lane
/// path keeps the 64 sums in registers for the whole chain; same operations,
/// same order, so the same bits as the portable loop.
#[inline]
fn tile_scores(kt: &[f32], q: &[f32], p: &mut [f32; KV_TILE]) {
    assert!(kt.len() >= q.len() * KV_TILE);
    #[cfg(target_arch = "x86_64")]
    if crate::quant::dot::avx512_vnni() {
        // SAFETY: AVX-512 F detected; bounds as asserted.
        unsafe { wide::tile_scores(kt, q, p) };
        return;
    }
    #[cfg(all(target_arch = "x86_64", target_feature = "avx", target_feature = "fma"))]
    // SAFETY: AVX and FMA are enabled at compile time; column `k` is
    // `kt[k * KV_TILE..(k + 1) * KV_TILE]`, inside `kt` by the assert, and the
    // stores write the 64 floats of `p`.
    unsafe {
        use std::arch::x86_64::*;
        let mut acc = [_mm256_setzero_ps(); KV_TILE / 8];
        for (k, &qk) in q.iter().enumerate() {
            let qb = _mm256_set1_ps(qk);
            let col = kt.as_ptr().add(k * KV_TILE);
            for (j, a) in acc.iter_mut().enumerate() {
                *a = _mm256_fmadd_ps(_mm256_loadu_ps(col.add(8 * j)), qb, *a);
            }
        }
        for (j, a) in acc.iter().enumerate() {
            _mm256_storeu_ps(p.as_mut_ptr().add(8 * j), *a);
        }
    }
    #[cfg(not(all(target_arch = "x86_64", target_feature = "avx", target_feature = "fma")))]
    {
        p.fill(0.0);
        for (k, &qk) in q.iter().enumerate() {
            let col = &kt[k * KV_TILE..(k + 1) * KV_TILE];
            for (x, &kx) in p.iter_mut().zip(col) {
                *x = kx.mul_add(qk, *x);
            }
        }
    }
}

/// A whole tile's scores under the causal mask: `p[t] * scale` where key `t`
/// (at `keys[t]`) is at or before `q_pos`, minus infinity elsewhere; returns
/// their maximum. The same products as the per-key loop (a maximum of
/// finite numbers does not depend on the order it is taken in).
#[inline]
fn causal_tile(p: &mut [f32; KV_TILE], keys: &[u32], q_pos: u32, scale: f32) -> f32 {
    assert!(keys.len() >= KV_TILE);
    #[cfg(all(target_arch = "x86_64", target_feature = "avx2"))]
    // SAFETY: AVX2 is enabled at compile time; loads and stores touch 8
    // lanes inside the 64 of `p` and of `keys` (length asserted).
    unsafe {
        use std::arch::x86_64::*;
        // Positions stay far below 2^31, so a signed compare is exact.
        let qp = _mm256_set1_epi32(q_pos as i32);
        let sc = _mm256_set1_ps(scale);
        let ninf = _mm256_set1_ps(f32::NEG_INFINITY);
        let mut m = ninf;
        for j in 0..KV_TILE / 8 {
            let k = _mm256_loadu_si256(keys.as_ptr().add(8 * j) as *const __m256i);
            let hidden = _mm256_castsi256_ps(_mm256_cmpgt_epi32(k, qp));
            let x = _mm256_mul_ps(_mm256_loadu_ps(p.as_ptr().add(8 * j)), sc);
            let x = _mm256_blendv_ps(x, ninf, hidden);
            _mm256_storeu_ps(p.as_mut_ptr().add(8 * j), x);
            m = _mm256_max_ps(m, x);
        }
        let m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps::<1>(m));
        let m2 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        _mm_cvtss_f32(_mm_max_ss(m2, _mm_movehdup_ps(m2)))
    }
    #[cfg(not(all(target_arch = "x86_64", target_feature = "avx2")))]
    {
        let mut tile_max = f32::NEG_INFINITY;
        for (x, &kp) in p.iter_mut().zip(keys) {
            *x = if kp <= q_pos {
                *x * scale
            } else {
                f32::NEG_INFINITY
            };
            tile_max = tile_max.max(*x);
        }
        tile_max
    }
}

/// Adds a tile's weighted values into one row's accumulator:
/// `a = fma(v_t, w[t], a)` for each key `t` in order, skipping keys of weight
/// 0 (hidden ones; adding `0 * v` would change nothing). A 64-wide piece of
/// the accumulator at a time stays in registers across the tile (each
/// element's chain is its own); same bits as the loop.
#[inline]
fn tile_values<'v>(a: &mut [f32], w: &[f32], value: impl Fn(usize) -> &'v [f32]) {
    #[cfg(target_arch = "x86_64")]
    if a.len().is_multiple_of(128) && crate::quant::dot::avx512_vnni() {
        // Each element's chain is its own: 128 at a time in registers.
        for h in 0..a.len() / 128 {
            let piece = &mut a[128 * h..128 * h + 128];
            // SAFETY: AVX-512 F detected; `piece` and each value piece hold
            // 128 floats.
            unsafe { wide::tile_values_128(piece, w, |t| &value(t)[128 * h..128 * h + 128]) };
        }
        return;
    }
    #[cfg(all(target_arch = "x86_64", target_feature = "avx", target_feature = "fma"))]
    if a.len().is_multiple_of(64) {
        // Each element's chain is its own: 64 at a time in registers.
        for h in 0..a.len() / 64 {
            let piece = &mut a[64 * h..64 * h + 64];
            // SAFETY: AVX and FMA are enabled at compile time; every load and
            // store touches 8 floats inside the 64 of `piece` or of the
            // value row's piece, whose length is checked.
            unsafe {
                use std::arch::x86_64::*;
                let mut acc = [_mm256_setzero_ps(); 8];
                for (j, r) in acc.iter_mut().enumerate() {
                    *r = _mm256_loadu_ps(piece.as_ptr().add(8 * j));
                }
                for (t, &wt) in w.iter().enumerate() {
                    if wt != 0.0 {
                        let v = &value(t)[64 * h..64 * h + 64];
                        let wb = _mm256_set1_ps(wt);
                        for (j, r) in acc.iter_mut().enumerate() {
                            *r = _mm256_fmadd_ps(_mm256_loadu_ps(v.as_ptr().add(8 * j)), wb, *r);
                        }
                    }
                }
                for (j, r) in acc.iter().enumerate() {
                    _mm256_storeu_ps(piece.as_mut_ptr().add(8 * j), *r);
                }
            }
        }
        return;
    }
    for (t, &wt) in w.iter().enumerate() {
        if wt != 0.0 {
            for (x, &vx) in a.iter_mut().zip(value(t)) {
                *x = vx.mul_add(wt, *x);
            }
        }
    }
}

/// The tiled kernel's two products on 16-lane vectors where the CPU has
/// AVX-512: each score and each accumulator element is still its own chain
/// of FMAs in the same order, so the same bits as the 8-lane and portable
/// loops, in half the instructions.
#[cfg(target_arch = "x86_64")]
mod wide {
    use std::arch::x86_64::*;

    use super::KV_TILE;

    /// [`super::tile_scores`] with four 16-lane accumulators.
    ///
    /// # Safety
    /// AVX-512 F available; `kt` holds `q.len() * KV_TILE` floats.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn tile_scores(kt: &[f32], q: &[f32], p: &mut [f32; KV_TILE]) {
        let mut acc = [_mm512_setzero_ps(); KV_TILE / 16];
        for (k, &qk) in q.iter().enumerate() {
            let qb = _mm512_set1_ps(qk);
            let col = kt.as_ptr().add(k * KV_TILE);
            for (j, a) in acc.iter_mut().enumerate() {
                *a = _mm512_fmadd_ps(_mm512_loadu_ps(col.add(16 * j)), qb, *a);
            }
        }
        for (j, a) in acc.iter().enumerate() {
            _mm512_storeu_ps(p.as_mut_ptr().add(16 * j), *a);
        }
    }

    /// [`super::tile_values`] for a 128-wide head, the accumulator whole in
    /// eight 16-lane registers.
    ///
    /// # Safety
    /// AVX-512 F available; `a` and every value row hold 128 floats.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn tile_values_128<'v>(
        a: &mut [f32],
        w: &[f32],
        value: impl Fn(usize) -> &'v [f32],
    ) {
        assert!(a.len() == 128);
        let mut acc = [_mm512_setzero_ps(); 8];
        for (j, r) in acc.iter_mut().enumerate() {
            *r = _mm512_loadu_ps(a.as_ptr().add(16 * j));
        }
        for (t, &wt) in w.iter().enumerate() {
            if wt != 0.0 {
                let v = &value(t)[..128];
                let wb = _mm512_set1_ps(wt);
                for (j, r) in acc.iter_mut().enumerate() {
                    *r = _mm512_fmadd_ps(_mm512_loadu_ps(v.as_ptr().add(16 * j)), wb, *r);
                }
            }
        }
        for (j, r) in acc.iter().enumerate() {
            _mm512_storeu_ps(a.as_mut_ptr().add(16 * j), *r);
        }
    }
}

/// Rounds to the nearest f16 (ties to even), kept as f32.
#[inline]
fn round16(x: f32) -> f32 {
    f16::from_f32(x).to_f32()
}

/// ggml's f16 dot product on AVX2: four 8-lane fused accumulators over blocks
/// of 32, reduced pairwise, the tail added in double. `x`, `y` hold
/// f16-representable values, widened to f32 as ggml widens them.
#[inline]
fn dot_f16(x: &[f32], y: &[f32]) -> f32 {
    let n = x.len().min(y.len());
    let np = n & !31;
    let mut sumf = sum_blocks(&x[..np], &y[..np]) as f64;
    for (a, b) in x[np..n].iter().zip(&y[np..n]) {
        sumf += (a * b) as f64;
    }
    sumf as f32
}

/// The SIMD part of [`dot_f16`] over whole blocks of 32.
#[cfg(all(target_arch = "x86_64", target_feature = "avx", target_feature = "fma"))]
#[inline]
fn sum_blocks(x: &[f32], y: &[f32]) -> f32 {
    use std::arch::x86_64::*;
    debug_assert!(x.len() == y.len() && x.len().is_multiple_of(32));
    // SAFETY: AVX and FMA are enabled at compile time; every load reads 8
    // floats inside a 32-float chunk of `x` or `y`.
    unsafe {
        let mut acc = [_mm256_setzero_ps(); 4];
        for (xc, yc) in x.chunks_exact(32).zip(y.chunks_exact(32)) {
            for (j, a) in acc.iter_mut().enumerate() {
                let xv = _mm256_loadu_ps(xc.as_ptr().add(8 * j));
                let yv = _mm256_loadu_ps(yc.as_ptr().add(8 * j));
                *a = _mm256_fmadd_ps(xv, yv, *a);
            }
        }
        let s = _mm256_add_ps(_mm256_add_ps(acc[0], acc[2]), _mm256_add_ps(acc[1], acc[3]));
        let t0 = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps::<1>(s));
        let t1 = _mm_hadd_ps(t0, t0);
        _mm_cvtss_f32(_mm_hadd_ps(t1, t1))
    }
}

/// The portable part of [`dot_f16`], in the same order.
#[cfg(not(all(target_arch = "x86_64", target_feature = "avx", target_feature = "fma")))]
fn sum_blocks(x: &[f32], y: &[f32]) -> f32 {
    let mut acc = [[0f32; 8]; 4];
    for (xc, yc) in x.chunks_exact(32).zip(y.chunks_exact(32)) {
        for (j, lanes) in acc.iter_mut().enumerate() {
            let (xs, ys) = (&xc[8 * j..8 * j + 8], &yc[8 * j..8 * j + 8]);
            for ((a, &xv), &yv) in lanes.iter_mut().zip(xs).zip(ys) {
                *a = xv.mul_add(yv, *a);
            }
        }
    }
    let mut s = [0f32; 8];
    for (l, sl) in s.iter_mut().enumerate() {
        *sl = (acc[0][l] + acc[2][l]) + (acc[1][l] + acc[3][l]);
    }
    let t = [s[0] + s[4], s[1] + s[5], s[2] + s[6], s[3] + s[7]];
    (t[0] + t[1]) + (t[2] + t[3])
}

/// The horizontal sum of 8 lanes in the order ggml's AVX2 softmax adds them.
#[inline]
fn hsum8(v: &[f32]) -> f32 {
    let a = [v[0] + v[4], v[1] + v[5], v[2] + v[6], v[3] + v[7]];
    (a[0] + a[2]) + (a[1] + a[3])
}

#[cfg(test)]
mod tests;
