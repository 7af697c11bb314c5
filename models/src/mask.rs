//! The attention mask of the tensor path: causal, per KV head (heads may keep
//! different entries after eviction), and honouring a replayed eviction record.

use candle_core::{Device, Tensor};

use crate::error::Result;
use crate::kv::KvStore;

/// `[KV, 1, n, C]` f32: 0 where a cached entry's position <= the query's
/// position (and, under a replayed eviction record, the entry was still cached
/// for that query), -inf elsewhere; per KV head, since heads may keep different
/// entries. On a sliding-window layer (`window`), entries `window` or more
/// positions behind the query are hidden too. Only the first `n_cached`
/// entries are masked (the rest are not attended over).
pub(crate) fn causal_mask(
    q_pos: &[u32],
    cache: &dyn KvStore,
    layer: usize,
    n_kv_head: usize,
    n_cached: usize,
    window: Option<u32>,
) -> Result<Tensor> {
    let mut m = Vec::with_capacity(n_kv_head * q_pos.len() * n_cached);
    let replay = cache.visibility();
    for h in 0..n_kv_head {
        let k_pos = &cache.positions(layer, h)[..n_cached];
        for &qp in q_pos {
            m.extend(k_pos.iter().map(|&kp| {
                let seen = match replay {
                    Some(v) => v.visible(layer, h, qp, kp),
                    None => kp <= qp,
                };
                let near = window.is_none_or(|w| crate::flash::in_window(qp, kp, w));
                if seen && near {
                    0.0f32
                } else {
                    f32::NEG_INFINITY
                }
            }));
        }
    }
    Ok(Tensor::from_vec(
        m,
        (n_kv_head, 1, q_pos.len(), n_cached),
        &Device::Cpu,
    )?)
}
