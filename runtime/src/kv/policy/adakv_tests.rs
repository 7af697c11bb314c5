//! AdaKV's budgets as a user of the policy sees them: a peaked head keeps
//! fewer entries than a flat one, the floor holds, padded heads are never
//! kept, and the inner policy's own budgets and triggers carry through.

use super::super::test_support::*;
use super::super::{select as select_policy, should_compress};
use super::*;

fn input<'a>(
    c: usize,
    positions: &'a [Vec<u32>],
    rows: &'a [Vec<Vec<f32>>],
    cumulative: &'a [Vec<f32>],
) -> ScoreInput<'a> {
    ScoreInput {
        layer: 0,
        n_layer: 1,
        n_cached: c,
        positions,
        cumulative,
        recent_rows: rows,
        keys: &[],
        values: &[],
        queries: None,
        head_dim: 0,
    }
}

fn policy(spec: &str) -> KvPolicy {
    spec.parse().unwrap()
}

/// A peaked head (attention on 2 entries) and a flat one, 20 entries each.
fn peaked_and_flat(c: usize) -> Vec<Vec<Vec<f32>>> {
    let mut peaked = vec![0.001; c];
    peaked[3] = 0.5;
    peaked[9] = 0.4;
    let flat = vec![1.0 / c as f32; c];
    vec![vec![peaked], vec![flat]]
}

#[test]
fn a_peaked_head_keeps_fewer_than_a_flat_one() {
    let c = 20;
    let pos = positions(2, c);
    let rows = peaked_and_flat(c);
    let p = policy("adakv:inner=snapkv,budget=8,window=2,kernel=1,floor=0.25");
    let keep = select_policy(&p, &input(c, &pos, &rows, &[]));
    let (peaked, flat) = (&keep.per_head[0], &keep.per_head[1]);
    // Same total as SnapKV (8 per head), split unevenly.
    assert_eq!(peaked.len() + flat.len(), 16);
    assert!(peaked.len() < flat.len(), "{peaked:?} vs {flat:?}");
    // The peaked head keeps its two spikes, its window and its floor of 2
    // (window 2 covers it), nothing else: its other entries score 0.001,
    // below the flat head's 0.05.
    assert_eq!(peaked, &[3, 9, 18, 19]);
    assert_eq!(flat.len(), 12);
    assert!(flat.ends_with(&[18, 19]));
    // Plain SnapKV gives both heads 8.
    let snap = select_policy(
        &policy("snapkv:budget=8,window=2,kernel=1"),
        &input(c, &pos, &rows, &[]),
    );
    assert_eq!(
        snap.per_head.iter().map(Vec::len).collect::<Vec<_>>(),
        [8, 8]
    );
}

#[test]
fn the_floor_is_respected_and_one_is_the_inner_policy() {
    let c = 20;
    let pos = positions(2, c);
    let rows = peaked_and_flat(c);
    let inp = input(c, &pos, &rows, &[]);
    // floor 0.75 of 8: the peaked head keeps at least 6.
    let keep = select_policy(&policy("adakv:budget=8,window=2,kernel=1,floor=0.75"), &inp);
    assert_eq!(keep.per_head[0].len(), 6);
    assert_eq!(keep.per_head[1].len(), 10);
    // floor 1: each head keeps exactly its own top 8, as SnapKV does.
    let ada = select_policy(&policy("adakv:budget=8,window=2,kernel=1,floor=1"), &inp);
    let snap = select_policy(&policy("snapkv:budget=8,window=2,kernel=1"), &inp);
    assert_eq!(ada, snap);
    // floor 0: only the window is guaranteed.
    let keep = select_policy(&policy("adakv:budget=8,window=2,kernel=1,floor=0"), &inp);
    assert_eq!(keep.per_head[0], [3, 9, 18, 19]);
}

#[test]
fn padding_is_never_kept_and_the_window_is_each_heads_newest() {
    // Head 0 holds 6 real entries then 4 padding slots, then 4 new ones;
    // head 1 holds 14 real entries.
    let h = HIDDEN_POSITION;
    let p0: Vec<u32> = (0..6).chain([h; 4]).chain(20..24).collect();
    let p1: Vec<u32> = (0..10).chain(20..24).collect();
    let pos = vec![p0, p1];
    // H2O scores: padding would score highest if it were ranked.
    let cum = vec![
        vec![
            0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 9.0, 9.0, 9.0, 9.0, 0.0, 0.0, 0.0, 0.0,
        ],
        (0..14).map(|i| i as f32 * 0.01).collect(),
    ];
    let p = policy("adakv:inner=h2o,budget=6,recent=2,floor=0.5");
    let keep = select_policy(&p, &input(14, &pos, &[], &cum));
    let real = |h: usize| -> Vec<u32> { keep.per_head[h].iter().map(|&i| pos[h][i]).collect() };
    for head in 0..2 {
        assert!(!real(head).contains(&h), "{:?}", real(head));
        assert!(real(head).ends_with(&[22, 23]), "{:?}", real(head));
    }
    assert_eq!(keep.per_head[0].len() + keep.per_head[1].len(), 12);
    // Guaranteed: each window and each head's best candidate (0.6 at 5;
    // 0.11 at 21). The 6 shared slots: head 0's 0.5..0.1, then head 1's 0.10.
    assert_eq!(real(0), [0, 1, 2, 3, 4, 5, 22, 23]);
    assert_eq!(real(1), [20, 21, 22, 23]);
}

#[test]
fn under_budget_keeps_every_real_entry_and_drops_padding() {
    let h = HIDDEN_POSITION;
    let pos = vec![vec![0, 1, h, h, 5], vec![0, 1, 2, 3, 5]];
    let keep = select_policy(
        &policy("adakv:budget=8,window=2"),
        &input(5, &pos, &[], &[]),
    );
    assert_eq!(keep.per_head, [vec![0, 1, 4], vec![0, 1, 2, 3, 4]]);
}

#[test]
fn keydiff_and_pyramidkv_inners_use_their_own_budgets() {
    let c = 30;
    let pos = positions(2, c);
    let rows = peaked_and_flat(c);
    let p = policy("adakv:inner=pyramidkv,budget=8,window=2,kernel=1,min_ratio=0.5");
    let at = |layer: usize| {
        let inp = ScoreInput {
            layer,
            n_layer: 3,
            ..input(c, &pos, &rows, &[])
        };
        select_policy(&p, &inp)
            .per_head
            .iter()
            .map(Vec::len)
            .sum::<usize>()
    };
    assert_eq!([at(0), at(1), at(2)], [24, 16, 8]);
    let k = policy("adakv:inner=keydiff,budget=4,window=1");
    assert!(k.needs_keys() && !k.needs_attention());
    let keep = select_policy(&k, &input(c, &pos, &[], &[]));
    assert_eq!(keep.per_head.iter().map(Vec::len).sum::<usize>(), 8);
}

#[test]
fn triggers_follow_the_inner_policy() {
    let a = policy("adakv:inner=snapkv,budget=16,window=2,every=4,prefill=false");
    assert!(!should_compress(&a, 100, 0, true));
    assert!(should_compress(&a, 20, 4, false));
    assert!(!should_compress(&a, 19, 3, false));
    let h = policy("adakv:inner=h2o,budget=16,recent=2");
    assert!(should_compress(&h, 17, 1, false));
    assert!(h.needs_cumulative() && !h.needs_recent_rows());
    assert_eq!((h.window(), h.budget(), h.every()), (2, Some(16), 1));
    assert!(h.is_head_wise() && !policy("snapkv").is_head_wise());
}
