//! Shared by the cache's unit tests in their own files: a small model's
//! shape, keys and values that name their entry, and one forward step's
//! calls into the cache as the model makes them.

use candle_core::{Device, IndexOp, Tensor};
use tern_models::{KvStore, ModelConfig, HIDDEN_POSITION};

use super::SeqCache;

/// Two layers, two KV heads of 32 values (a multiple of the block types'
/// 32, so every storage type holds them) shared by four query heads.
pub(super) fn config() -> ModelConfig {
    ModelConfig {
        architecture: "llama".into(),
        name: None,
        n_layer: 2,
        n_embd: 128,
        n_head: 4,
        n_kv_head: 2,
        head_dim: 32,
        n_ff: 8,
        vocab_size: 8,
        context_length: 1024,
        rope_base: 10_000.0,
        rope_freq_scale: 1.0,
        rms_eps: 1e-5,
        sliding: None,
    }
}

/// Value `d` of the key (`salt` 0) or value (`salt` 1) that `layer`'s KV
/// `head` caches for position `pos`: distinct for every entry, exact in f32.
pub(super) fn entry(salt: usize, layer: usize, head: usize, pos: u32, d: usize) -> f32 {
    (layer * 100_000 + pos as usize * 64 + head * 32 + d) as f32 + 0.5 * salt as f32
}

/// Keys or values of `layer` for `positions`: `[KV, n, hd]`.
fn rows(c: &ModelConfig, salt: usize, layer: usize, positions: &[u32]) -> Tensor {
    let (kvh, hd) = (c.n_kv_head, c.head_dim);
    let mut v = Vec::with_capacity(kvh * positions.len() * hd);
    for h in 0..kvh {
        for &p in positions {
            v.extend((0..hd).map(|d| entry(salt, layer, h, p, d)));
        }
    }
    Tensor::from_vec(v, (kvh, positions.len(), hd), &Device::Cpu).unwrap()
}

/// One forward step over `positions` as the model drives the cache, layer
/// by layer: append the keys and values, hand over the attention weights
/// when the cache asks for them (`weight(head, entry_position)` for every
/// query row and query head), then let it compress.
pub(super) fn step(
    cache: &mut SeqCache,
    c: &ModelConfig,
    positions: &[u32],
    weight: impl Fn(usize, u32) -> f32,
) {
    let (kvh, g) = (c.n_kv_head, c.n_head / c.n_kv_head);
    for layer in 0..c.n_layer {
        let k = rows(c, 0, layer, positions);
        let v = rows(c, 1, layer, positions);
        cache.append(layer, &k, &v, positions).unwrap();
        if cache.wants_attention(layer) {
            let n = positions.len();
            let mut w = Vec::new();
            for h in 0..kvh {
                let row: Vec<f32> = cache
                    .positions(layer, h)
                    .iter()
                    .map(|&p| weight(h, p))
                    .collect();
                for _ in 0..g * n {
                    w.extend_from_slice(&row);
                }
            }
            let cached = w.len() / (kvh * g * n);
            let w = Tensor::from_vec(w, (kvh, g, n, cached), &Device::Cpu).unwrap();
            cache.observe_attention(layer, &w, None).unwrap();
        }
        cache.after_attention(layer).unwrap();
    }
}

/// `step` over tokens `from..to` in one chunk.
pub(super) fn feed(
    cache: &mut SeqCache,
    c: &ModelConfig,
    from: usize,
    to: usize,
    weight: impl Fn(usize, u32) -> f32,
) {
    let positions: Vec<u32> = (from as u32..to as u32).collect();
    step(cache, c, &positions, weight);
}

/// No attention anywhere (for caches that do not score by it).
pub(super) fn none(_: usize, _: u32) -> f32 {
    0.0
}

/// Asserts every entry `layer` holds is the key and value appended for
/// its position (the compaction moved data and positions together) and
/// that each head's positions ascend; returns each head's positions, padding
/// left out.
pub(super) fn held(cache: &SeqCache, c: &ModelConfig, layer: usize) -> Vec<Vec<u32>> {
    // The buffers as the model reads them: the views the next append
    // returns, on a copy so the cache itself is left as it was.
    let mut copy = cache.fork().unwrap();
    let next = [cache.seen() as u32];
    let (k, v) = copy
        .append(
            layer,
            &rows(c, 0, layer, &next),
            &rows(c, 1, layer, &next),
            &next,
        )
        .unwrap();
    let mut out = Vec::new();
    for h in 0..c.n_kv_head {
        let positions = cache.positions(layer, h);
        let keys: Vec<Vec<f32>> = k.i(h).unwrap().to_vec2().unwrap();
        let values: Vec<Vec<f32>> = v.i(h).unwrap().to_vec2().unwrap();
        assert_eq!(keys.len(), positions.len() + 1, "layer {layer} head {h}");
        let real: Vec<u32> = positions
            .iter()
            .copied()
            .filter(|&p| p != HIDDEN_POSITION)
            .collect();
        assert!(
            real.windows(2).all(|w| w[0] < w[1]),
            "layer {layer} head {h}: positions out of order {real:?}"
        );
        for (i, &p) in positions.iter().enumerate() {
            if p == HIDDEN_POSITION {
                continue;
            }
            let want_k: Vec<f32> = (0..c.head_dim).map(|d| entry(0, layer, h, p, d)).collect();
            let want_v: Vec<f32> = (0..c.head_dim).map(|d| entry(1, layer, h, p, d)).collect();
            assert_eq!(keys[i], want_k, "layer {layer} head {h}: key of {p}");
            assert_eq!(values[i], want_v, "layer {layer} head {h}: value of {p}");
        }
        out.push(real);
    }
    out
}

/// Bytes one cached entry takes in one layer: its key and value in every
/// KV head, each a row of `row_bytes`.
pub(super) fn entry_bytes(c: &ModelConfig, row_bytes: usize) -> usize {
    2 * c.n_kv_head * row_bytes
}
