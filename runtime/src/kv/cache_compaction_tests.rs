//! What an eviction leaves in a cache, as the model and the trainer see it:
//! the kept entries compacted to the front of the buffers with their own
//! keys and values, positions ascending per head (each head its own set
//! under a per-head score), the lengths and bytes the budget promises,
//! buffers that stop growing, and every evicted entry in the log.

use tern_models::KvDtype;

use super::test_support::{config, entry_bytes, feed, held, none};
use super::SeqCache;
use crate::kv::policy::KvPolicy;

#[test]
fn streaming_keeps_its_sinks_and_the_newest_entries_in_order() {
    let c = config();
    let policy: KvPolicy = "streaming:budget=16,sink=4".parse().unwrap();
    let mut cache = SeqCache::with_policy(&c, policy);
    let per_entry = entry_bytes(&c, KvDtype::F32.row_bytes(c.head_dim));
    let want = |seen: u32| -> Vec<Vec<u32>> {
        let kept: Vec<u32> = (0..4).chain(seen - 12..seen).collect();
        vec![kept; c.n_kv_head]
    };
    // A 40-token prompt in one chunk, then 20 tokens one at a time: back to
    // the budget after every step.
    feed(&mut cache, &c, 0, 40, none);
    for layer in 0..c.n_layer {
        assert_eq!(held(&cache, &c, layer), want(40), "layer {layer}");
    }
    assert_eq!(cache.len(), 16);
    assert_eq!(cache.seen(), 40);
    assert_eq!(cache.bytes(), 16 * c.n_layer * per_entry);
    assert_eq!(cache.full_bytes(), 40 * c.n_layer * per_entry);
    // Layers compact one at a time: one layer held the whole chunk at most.
    assert_eq!(cache.peak_bytes(), (40 + 16) * per_entry);
    let allocated = cache.allocated_bytes();
    for seen in 41..=60 {
        feed(&mut cache, &c, seen - 1, seen, none);
        for layer in 0..c.n_layer {
            assert_eq!(held(&cache, &c, layer), want(seen as u32), "{seen} read");
        }
        assert_eq!(cache.len(), 16);
        assert_eq!(cache.bytes(), 16 * c.n_layer * per_entry);
    }
    // Compaction reuses the buffers: decoding at the budget allocates nothing.
    assert_eq!(cache.allocated_bytes(), allocated);
    assert_eq!(cache.peak_bytes(), (40 + 16) * per_entry);
    assert_eq!(cache.full_bytes(), 60 * c.n_layer * per_entry);
}

#[test]
fn each_head_keeps_its_own_entries_compacted_to_the_front() {
    // H2O keeps the 12 older entries that received the most attention and
    // the 4 newest. Head 0's queries attend to positions 0, 3, 6, ..., 33,
    // head 1's to 1, 4, 7, ..., 34: the heads keep different entries, the
    // same count.
    let c = config();
    let policy: KvPolicy = "h2o:budget=16,recent=4".parse().unwrap();
    let mut cache = SeqCache::with_policy(&c, policy);
    cache.record_evictions();
    let heavy = |h: usize, p: u32| p % 3 == h as u32 && p < 36;
    let kept = |h: usize, p: u32| heavy(h, p) || p >= 36;
    feed(
        &mut cache,
        &c,
        0,
        40,
        |h, p| if heavy(h, p) { 1.0 } else { 0.0 },
    );
    for layer in 0..c.n_layer {
        let held = held(&cache, &c, layer);
        for (h, positions) in held.iter().enumerate() {
            let want: Vec<u32> = (0..40).filter(|&p| kept(h, p)).collect();
            assert_eq!(positions, &want, "layer {layer} head {h}");
        }
        assert_ne!(held[0], held[1]);
    }
    assert_eq!(cache.len(), 16);
    // Every entry that left is logged once, per layer and head: the newest
    // query (position 39) still saw it, later ones do not.
    let log = cache.evictions().expect("recording");
    assert_eq!(log.len(), c.n_layer * c.n_kv_head * (40 - 16));
    let seen = log.visibility(40);
    for layer in 0..c.n_layer {
        for h in 0..c.n_kv_head {
            for p in 0..40 {
                assert!(seen.visible(layer, h, 39, p), "{layer} {h} {p}");
                assert_eq!(seen.visible(layer, h, 40, p), kept(h, p), "{layer} {h} {p}");
            }
        }
    }
}

#[test]
fn nothing_is_evicted_below_the_budget_or_under_the_full_policy() {
    // 72 tokens, past the buffers' first allocation: growing them keeps
    // every entry where it was.
    let c = config();
    for spec in [
        "full",
        "streaming:budget=128,sink=4",
        "h2o:budget=128,recent=8",
    ] {
        let policy: KvPolicy = spec.parse().unwrap();
        let mut cache = SeqCache::with_policy(&c, policy);
        cache.record_evictions();
        for (from, to) in [(0, 32), (32, 70), (70, 71), (71, 72)] {
            feed(&mut cache, &c, from, to, |_, p| p as f32);
        }
        let all: Vec<u32> = (0..72).collect();
        for layer in 0..c.n_layer {
            assert_eq!(held(&cache, &c, layer), vec![all.clone(); 2], "{spec}");
        }
        assert_eq!(cache.len(), 72, "{spec}");
        assert_eq!(cache.bytes(), cache.full_bytes(), "{spec}");
        assert!(cache.evictions().is_some_and(|l| l.is_empty()), "{spec}");
    }
}

#[test]
fn a_frozen_cache_compacts_once_and_then_keeps_everything() {
    // Freezing over the budget compresses to it, then nothing more leaves:
    // what the trainer's replay of a finished sequence relies on.
    let c = config();
    let policy: KvPolicy = "h2o:budget=16,recent=4,prefill=false,every=64"
        .parse()
        .unwrap();
    let mut cache = SeqCache::with_policy(&c, policy);
    // Not compressed at the prompt's end, nor before 64 more tokens.
    feed(&mut cache, &c, 0, 30, |_, p| (p % 5) as f32);
    assert_eq!(cache.len(), 30);
    cache.freeze().unwrap();
    assert_eq!(cache.len(), 16);
    let frozen: Vec<Vec<Vec<u32>>> = (0..c.n_layer).map(|l| held(&cache, &c, l)).collect();
    for p in 30..50 {
        feed(&mut cache, &c, p, p + 1, |_, p| p as f32);
    }
    assert_eq!(cache.len(), 16 + 20);
    for (layer, before) in frozen.iter().enumerate() {
        let now = held(&cache, &c, layer);
        for (h, positions) in now.iter().enumerate() {
            let want: Vec<u32> = before[h].iter().copied().chain(30..50).collect();
            assert_eq!(positions, &want, "layer {layer} head {h}");
        }
    }
}
