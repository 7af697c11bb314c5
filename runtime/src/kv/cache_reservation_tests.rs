//! What the engine reserves before admitting a request
//! ([`SeqCache::reservation_bytes`]) against what the cache then holds:
//! exactly the full cache's bytes in every storage type, and never less
//! than a budgeted cache's peak, however the budget is kept.

use tern_models::KvDtype;

use super::test_support::{config, entry_bytes, feed};
use super::SeqCache;
use crate::kv::policy::KvPolicy;

/// Runs a `prompt`-token prompt in chunks of `chunk`, then `decode` tokens
/// one at a time, attention falling off with distance from the start.
fn run(cache: &mut SeqCache, prompt: usize, chunk: usize, decode: usize) {
    let c = config();
    let weight = |h: usize, p: u32| 1.0 / (1 + p as usize + h) as f32;
    for from in (0..prompt).step_by(chunk) {
        feed(cache, &c, from, (from + chunk).min(prompt), weight);
    }
    for p in prompt..prompt + decode {
        feed(cache, &c, p, p + 1, weight);
    }
}

#[test]
fn a_full_cache_reserves_exactly_what_it_then_holds() {
    let c = config();
    let reserve = |dtype| SeqCache::reservation_bytes(&c, &KvPolicy::Full, dtype, 40, 10, 16);
    for dtype in [KvDtype::F32, KvDtype::F16, KvDtype::Q8_0, KvDtype::Q4_0] {
        let mut cache = SeqCache::with_storage(&c, KvPolicy::Full, dtype).unwrap();
        run(&mut cache, 40, 16, 10);
        let reserved = reserve(dtype);
        assert_eq!(cache.bytes(), reserved, "{dtype}");
        assert_eq!(cache.peak_bytes(), reserved, "{dtype}");
        let per_entry = entry_bytes(&c, dtype.row_bytes(c.head_dim));
        assert_eq!(reserved, 50 * c.n_layer * per_entry, "{dtype}");
    }
    // 32 values a row: f32 128 bytes, f16 64, q8_0 34, q4_0 18.
    assert_eq!(reserve(KvDtype::F32), 2 * reserve(KvDtype::F16));
    assert_eq!(reserve(KvDtype::Q8_0) * 128, reserve(KvDtype::F32) * 34);
    assert_eq!(reserve(KvDtype::Q4_0) * 128, reserve(KvDtype::F32) * 18);
}

#[test]
fn a_budgeted_cache_never_holds_more_than_it_reserved() {
    let c = config();
    let full = SeqCache::reservation_bytes(&c, &KvPolicy::Full, KvDtype::F32, 100, 40, 32);
    for spec in [
        // Compressed while the prompt is read: the budget plus one chunk.
        "streaming:budget=16,sink=4",
        "h2o:budget=16,recent=4",
        "snapkv:budget=16,window=4,every=8",
        // Compressed from decode on: the whole prompt, then the budget plus
        // the tokens between two compressions.
        "h2o:budget=16,recent=4,prefill=false,every=8",
        "snapkv:budget=24,window=4,every=16,prefill=false",
    ] {
        let policy: KvPolicy = spec.parse().unwrap();
        let mut cache = SeqCache::with_policy(&c, policy.clone());
        run(&mut cache, 100, 32, 40);
        let reserved = SeqCache::reservation_bytes(&c, &policy, KvDtype::F32, 100, 40, 32);
        let peak = cache.peak_bytes() + cache.scoring_held_bytes();
        assert!(peak <= reserved, "{spec}: held {peak}, reserved {reserved}");
        assert!(cache.len() < 140, "{spec}: nothing was evicted");
        assert!(
            reserved < full,
            "{spec}: reserved {reserved}, a full cache {full}"
        );
    }
    // Streaming scores nothing: its reservation is its entries alone, per
    // layer the budget and one chunk.
    let streaming: KvPolicy = "streaming:budget=16,sink=4".parse().unwrap();
    let per_entry = entry_bytes(&c, KvDtype::F32.row_bytes(c.head_dim));
    assert_eq!(
        SeqCache::reservation_bytes(&c, &streaming, KvDtype::F32, 100, 40, 32),
        c.n_layer * (16 + 32) * per_entry
    );
}
