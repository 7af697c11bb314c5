//! A draft verified on a compressing cache ([`SeqCache::begin_verify`],
//! then [`SeqCache::rewind`]) leaves the cache exactly as decoding the kept
//! tokens one at a time does: the same entries, positions, scores, recent
//! attention rows, query statistics and keys, bit for bit, under every
//! policy, however many rows are kept, including drafts kept whole that end
//! at a compression.

use candle_core::{Device, IndexOp, Tensor};
use tern_models::{KvStore, ModelConfig, Rotary};

use super::SeqCache;
use crate::kv::policy::KvPolicy;

fn config() -> ModelConfig {
    ModelConfig {
        architecture: "llama".into(),
        name: None,
        n_layer: 2,
        n_embd: 32,
        n_head: 4,
        n_kv_head: 2,
        head_dim: 8,
        n_ff: 8,
        vocab_size: 8,
        context_length: 1024,
        rope_base: 10_000.0,
        rope_freq_scale: 1.0,
        rms_eps: 1e-5,
        sliding: None,
    }
}

/// A deterministic value in (0, 1) for the integers `x`.
fn noise(x: &[u64]) -> f32 {
    // splitmix64's finalizer over each value in turn.
    let mut h = 0x9e37_79b9_7f4a_7c15u64;
    for &v in x {
        h = (h ^ v).wrapping_add(0x9e37_79b9_7f4a_7c15);
        h = (h ^ (h >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        h = (h ^ (h >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        h ^= h >> 31;
    }
    ((h >> 40) as f32 + 0.5) / (1u64 << 24) as f32
}

/// Keys (or values, `salt` 1) of `layer` for positions `from..from + n`:
/// `[KV, n, hd]`, a function of the position only.
fn rows(c: &ModelConfig, layer: usize, from: usize, n: usize, salt: u64) -> Tensor {
    let (kvh, hd) = (c.n_kv_head, c.head_dim);
    let mut v = Vec::with_capacity(kvh * n * hd);
    for h in 0..kvh {
        for p in from..from + n {
            for d in 0..hd {
                v.push(noise(&[salt, layer as u64, h as u64, p as u64, d as u64]) - 0.5);
            }
        }
    }
    Tensor::from_vec(v, (kvh, n, hd), &Device::Cpu).unwrap()
}

/// Queries `[H, n, hd]` for positions `from..from + n`.
fn queries(c: &ModelConfig, layer: usize, from: usize, n: usize) -> Tensor {
    let (nh, hd) = (c.n_head, c.head_dim);
    let mut v = Vec::with_capacity(nh * n * hd);
    for h in 0..nh {
        for p in from..from + n {
            for d in 0..hd {
                v.push(noise(&[2, layer as u64, h as u64, p as u64, d as u64]) - 0.5);
            }
        }
    }
    Tensor::from_vec(v, (nh, n, hd), &Device::Cpu).unwrap()
}

/// The attention row of the query at `q_pos` over the cache's first `len`
/// entries, as the model hands it over (`[KV, G, 1, len]`): a function of
/// the query's and each entry's positions, so the same in both caches.
fn weights(cache: &SeqCache, c: &ModelConfig, layer: usize, q_pos: u32, len: usize) -> Tensor {
    let (kvh, g) = (c.n_kv_head, c.n_head / c.n_kv_head);
    let mut v = Vec::with_capacity(kvh * g * len);
    for h in 0..kvh {
        let pos = &cache.positions(layer, h)[..len];
        for j in 0..g {
            v.extend(pos.iter().map(|&k| {
                if k > q_pos {
                    0.0
                } else {
                    noise(&[
                        3,
                        layer as u64,
                        h as u64,
                        j as u64,
                        u64::from(q_pos),
                        u64::from(k),
                    ])
                }
            }));
        }
    }
    Tensor::from_vec(v, (kvh, g, 1, len), &Device::Cpu).unwrap()
}

/// One forward over positions `from..from + n` as the model runs it:
/// queries, append, attention row by row (each over the entries up to its
/// own less its draft gap, as a verified draft and plain decoding both
/// attend), then the policy's turn. Returns, per row and layer, the
/// positions the row saw (KV head 0).
fn forward(
    cache: &mut SeqCache,
    c: &ModelConfig,
    rope: &Rotary,
    from: usize,
    n: usize,
) -> Vec<Vec<Vec<u32>>> {
    let positions: Vec<u32> = (from..from + n).map(|p| p as u32).collect();
    let mut seen = vec![Vec::new(); n];
    for layer in 0..c.n_layer {
        if cache.wants_queries(layer) {
            cache
                .observe_queries(layer, &queries(c, layer, from, n), &positions, rope)
                .unwrap();
        }
        let k = rows(c, layer, from, n, 0);
        let v = rows(c, layer, from, n, 1);
        let (keys, _) = cache.append(layer, &k, &v, &positions).unwrap();
        let cached = keys.dim(1).unwrap();
        for (j, &q) in positions.iter().enumerate() {
            let all = &cache.positions(layer, 0)[..cached - (n - 1 - j)];
            let gap = cache.draft_gap(layer, q).unwrap_or(0..0);
            assert!(
                gap.is_empty() || !cache.wants_attention(layer),
                "gaps are for windows"
            );
            let row = all.iter().enumerate().filter(|(i, _)| !gap.contains(i));
            seen[j].push(row.map(|(_, &p)| p).collect());
        }
        if cache.wants_attention(layer) {
            for (j, &q) in positions.iter().enumerate() {
                let w = weights(cache, c, layer, q, cached - (n - 1 - j));
                let want = cache.attention_rows(layer);
                if want.column_means {
                    // As llama.cpp's kernel hands H2O its sums: the row's
                    // group means, and only the rows asked for.
                    let (kvh, g, _, len) = w.dims4().unwrap();
                    let mut sums = vec![0f32; kvh * len];
                    super::with_group_means(&w, (kvh, g, 1, len), 0, |h, _, mean| {
                        sums[h * len..(h + 1) * len].copy_from_slice(mean);
                    })
                    .unwrap();
                    let rows = w.narrow(2, 0, want.last_rows.min(1)).unwrap();
                    cache.observe_attention(layer, &rows, Some(&sums)).unwrap();
                } else {
                    cache.observe_attention(layer, &w, None).unwrap();
                }
            }
        }
        cache.after_attention(layer).unwrap();
    }
    seen
}

/// Everything a later step or compression reads, floats as bits.
fn state(cache: &SeqCache) -> String {
    let mut out = format!("seen {} peak {}\n", cache.seen, cache.peak_bytes);
    for (i, l) in cache.layers.iter().enumerate() {
        out += &format!(
            "layer {i}: len {} since {} positions {:?}\n",
            l.len, l.since_compress, l.positions
        );
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        for (h, cum) in l.cumulative.iter().enumerate() {
            out += &format!("  cum {h}: {:?}\n", bits(cum));
        }
        for (h, rows) in l.recent.iter().enumerate() {
            for r in rows {
                out += &format!("  recent {h}: {:?}\n", bits(r));
            }
        }
        if let Some(q) = &l.queries {
            out += &format!("  queries {q:?}\n");
        }
        if let (Some(k), Some(v)) = (&l.k, &l.v) {
            for t in [k, v] {
                let x: Vec<f32> = t
                    .i((.., 0..l.len))
                    .unwrap()
                    .flatten_all()
                    .unwrap()
                    .to_vec1()
                    .unwrap();
                out += &format!("  kv {:?}\n", bits(&x));
            }
        }
    }
    out
}

#[test]
fn a_verified_draft_leaves_the_cache_as_plain_decoding_does() {
    let c = config();
    let rope = Rotary::new(&c, true, None);
    let (prompt, end) = (40usize, 150usize);
    for spec in [
        "snapkv:budget=24,window=4,every=8",
        "pyramidkv:budget=24,window=4,every=8",
        "h2o:budget=24,recent=4,every=6",
        "h2o:budget=24,recent=4",
        "rkv:budget=24,window=4,every=8",
        "keydiff:budget=24,window=4,every=8",
        "expected:budget=24,window=4,every=8",
        "adakv:budget=24,window=4,every=8",
        "streaming:budget=24,sink=2",
        "snapkv:budget=50%,min_budget=12,window=4,every=8",
    ] {
        let policy: KvPolicy = spec.parse().unwrap();
        let mut plain = SeqCache::with_policy(&c, policy.clone());
        let mut fast = SeqCache::with_policy(&c, policy);
        for cache in [&mut plain, &mut fast] {
            forward(cache, &c, &rope, 0, prompt);
            cache.finish_prefill().unwrap();
        }
        let (mut p, mut step, mut kept_whole, mut compressed_at_end) = (prompt, 0u64, 0, 0);
        while p < end {
            // The draft's rows, capped where the policy next compresses,
            // and how many of them are kept (at least the first).
            let most = fast.verify_rows().min(end - p);
            let n = most.min(1 + (noise(&[9, step]) * 6.0) as usize);
            let keep = 1 + ((noise(&[10, step]) * n as f32) as usize).min(n - 1);
            let before = fast.layers[0].len;
            fast.begin_verify();
            let verified = forward(&mut fast, &c, &rope, p, n);
            assert!(fast.rewind(p + keep).unwrap(), "{spec}: rewind");
            for (j, q) in (p..p + keep).enumerate() {
                let one = forward(&mut plain, &c, &rope, q, 1);
                assert_eq!(
                    verified[j], one[0],
                    "{spec}: what row {j} of {n} at {p} saw"
                );
            }
            let (f, w) = (state(&fast), state(&plain));
            if let Some((a, b)) = f.lines().zip(w.lines()).find(|(a, b)| a != b) {
                panic!(
                    "{spec}: {n} rows at {p}, {keep} kept:\n verified {a:.300}\n plain    {b:.300}"
                );
            }
            assert_eq!(f, w, "{spec}");
            kept_whole += usize::from(keep == n && n > 1);
            compressed_at_end += usize::from(keep == n && fast.layers[0].len < before + keep);
            p += keep;
            step += 1;
        }
        let mut probe = SeqCache::with_policy(&c, spec.parse().unwrap());
        if spec == "h2o:budget=24,recent=4" {
            // Scoring and evicting every step: a draft never fits.
            assert_eq!(kept_whole, 0, "{spec}");
            forward(&mut probe, &c, &rope, 0, prompt);
            probe.finish_prefill().unwrap();
            assert_eq!(probe.verify_rows(), 1, "{spec}");
        } else {
            assert!(kept_whole > 0, "{spec}: no draft was kept whole");
            assert!(
                compressed_at_end > 0,
                "{spec}: no kept draft ended at a compression"
            );
        }
    }
}

#[test]
fn verification_rows_stop_where_the_policy_next_compresses() {
    let c = config();
    let rope = Rotary::new(&c, true, None);
    let full = SeqCache::with_policy(&c, KvPolicy::Full);
    assert_eq!(full.verify_rows(), usize::MAX);
    // A window slides by position alone: a draft's rows skip what it slid
    // past, so no bound; h2o's every-step eviction by score: one row.
    let mut window = SeqCache::with_policy(&c, "streaming:budget=24,sink=2".parse().unwrap());
    forward(&mut window, &c, &rope, 0, 30);
    assert_eq!(window.verify_rows(), usize::MAX);
    let mut h2o = SeqCache::with_policy(&c, "h2o:budget=24,recent=4".parse().unwrap());
    forward(&mut h2o, &c, &rope, 0, 30);
    assert_eq!(h2o.verify_rows(), 1);
    // Every 8 tokens: the rows left until the next compression.
    let mut snap = SeqCache::with_policy(&c, "snapkv:budget=24,window=4,every=8".parse().unwrap());
    forward(&mut snap, &c, &rope, 0, 40);
    snap.finish_prefill().unwrap();
    assert_eq!(snap.verify_rows(), 8);
    for p in 40..43 {
        forward(&mut snap, &c, &rope, p, 1);
    }
    assert_eq!(snap.verify_rows(), 5);
    // A rewind outside the verified draft changes nothing.
    snap.begin_verify();
    forward(&mut snap, &c, &rope, 43, 4);
    assert!(!snap.rewind(42).unwrap());
    assert!(!snap.rewind(48).unwrap());
    assert!(snap.rewind(45).unwrap());
    assert_eq!(snap.verify_rows(), 3);
    // A compressing cache not verifying only "rewinds" to where it is.
    assert!(snap.rewind(45).unwrap());
    assert!(!snap.rewind(44).unwrap());
}
