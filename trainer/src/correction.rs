//! Off-policy corrections of the sampler/learner mismatch. The sampler that
//! wrote a rollout is not exactly the policy the learner scores as pi_old:
//! under a compressed KV cache it is pi_sparse (Sparse-RL, DESIGN.md section
//! 6), and with a learner on other arithmetic than the sampler's (`--learner-weights
//! f32`) even a dense rollout's probabilities differ by rounding. Each token
//! carries `rho = pi_old / pi_sampler`, and the loss is corrected with it.
//!
//! Sparse-RL's corrections ([`Correction`], `--correction`):
//! - `none`: the plain GRPO loss (weights 1).
//! - `tis`: truncated importance sampling, `w = min(rho, cap)`.
//! - `sparse-rl`: sequence veto (any `rho < veto` drops the rollout), token
//!   rejection (`rho` outside `[low, high]` leaves the loss and its
//!   denominator), `w = min(rho, cap)` on kept tokens divided by their batch
//!   mean. At the sequence level one ratio per rollout (the geometric mean of
//!   its tokens') stands for all of its tokens.
//!
//! Numerics corrections ([`NumericsCorrection`], `--numerics-correction`), in
//! TRL's vocabulary (`vllm_importance_sampling_mode`), for the same ratio when
//! what separates sampler and learner is arithmetic rather than sparsity:
//! `token_truncate`, `token_mask`, `sequence_truncate`, `sequence_mask`. A
//! sequence's ratio is, as TRL defines it, the product of its tokens' ratios.
//!
//! Every correction also reports the ratio's statistics ([`RhoSummary`]),
//! histogram included, so dense runs show their mismatch (or its absence).

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// Which Sparse-RL correction the loss uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Correction {
    /// No correction.
    None,
    /// Truncated importance weights.
    Tis,
    /// Veto, rejection and normalised truncated weights.
    SparseRl,
}

impl FromStr for Correction {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "none" => Ok(Correction::None),
            "tis" => Ok(Correction::Tis),
            "sparse-rl" => Ok(Correction::SparseRl),
            o => Err(format!("unknown correction `{o}` (none, tis or sparse-rl)")),
        }
    }
}

impl fmt::Display for Correction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Correction::None => "none",
            Correction::Tis => "tis",
            Correction::SparseRl => "sparse-rl",
        })
    }
}

/// Which numerics correction the loss uses: TRL's
/// `vllm_importance_sampling_mode` values (TRL's default mode, when its
/// correction is on, is `sequence_mask`; here the default is `none`, so runs
/// recorded before this option keep their loss).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NumericsCorrection {
    /// No numerics correction.
    None,
    /// `w = clamp(rho, clip_min, clip_max)` per token.
    TokenTruncate,
    /// `w = rho` per token, 0 (out of the loss and its denominator) where
    /// `rho` is outside `[clip_min, clip_max]`.
    TokenMask,
    /// The sequence's ratio `R = prod rho` clamped to `[clip_min, clip_max]`
    /// weighs every token of it.
    SequenceTruncate,
    /// `w = R` for every token; a sequence whose `R` is outside
    /// `[clip_min, clip_max]` is dropped.
    SequenceMask,
}

impl FromStr for NumericsCorrection {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "none" => Ok(NumericsCorrection::None),
            "token_truncate" => Ok(NumericsCorrection::TokenTruncate),
            "token_mask" => Ok(NumericsCorrection::TokenMask),
            "sequence_truncate" => Ok(NumericsCorrection::SequenceTruncate),
            "sequence_mask" => Ok(NumericsCorrection::SequenceMask),
            o => Err(format!(
                "unknown numerics_correction `{o}` (none, token_truncate, token_mask, sequence_truncate or sequence_mask)"
            )),
        }
    }
}

impl fmt::Display for NumericsCorrection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            NumericsCorrection::None => "none",
            NumericsCorrection::TokenTruncate => "token_truncate",
            NumericsCorrection::TokenMask => "token_mask",
            NumericsCorrection::SequenceTruncate => "sequence_truncate",
            NumericsCorrection::SequenceMask => "sequence_mask",
        })
    }
}

/// Thresholds of the Sparse-RL corrections.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Thresholds {
    /// A rollout with any token ratio below this is dropped (sparse-rl).
    pub veto: f64,
    /// Tokens with a ratio below this are masked (sparse-rl).
    pub low: f64,
    /// Tokens with a ratio above this are masked (sparse-rl).
    pub high: f64,
    /// Importance weights are truncated at this (tis, sparse-rl).
    pub cap: f64,
    /// One ratio per rollout instead of per token.
    pub sequence_level: bool,
}

impl Default for Thresholds {
    fn default() -> Self {
        Thresholds {
            veto: 1e-4,
            low: 0.5,
            high: 1.5,
            cap: 1.5,
            sequence_level: false,
        }
    }
}

/// Thresholds of the numerics corrections, named and defaulted as TRL's
/// (`vllm_importance_sampling_clip_max` = 3.0,
/// `vllm_importance_sampling_clip_min` = unset).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct NumericsThresholds {
    /// Upper bound of the ratio: truncated to it, or masked above it.
    pub clip_max: f64,
    /// Lower bound of the ratio (unset: none): truncated to it, or masked
    /// below it.
    pub clip_min: Option<f64>,
}

impl Default for NumericsThresholds {
    fn default() -> Self {
        NumericsThresholds {
            clip_max: 3.0,
            clip_min: None,
        }
    }
}

/// Edges of the per-token ratio histogram: bin `i` counts
/// `edges[i] <= rho < edges[i + 1]`, the last bin is `[2, inf)`. Tight around
/// 1 (`[0.99, 1.01)` is the exact-numerics bin), coarse in the tails.
pub const RHO_HIST_EDGES: [f64; 11] = [0.0, 0.5, 0.8, 0.9, 0.95, 0.99, 1.01, 1.05, 1.1, 1.25, 2.0];

/// Statistics of the per-token ratios of a batch.
#[derive(Clone, Debug, PartialEq)]
pub struct RhoSummary {
    /// Mean token ratio (1 with no tokens).
    pub mean_rho: f64,
    /// Smallest token ratio.
    pub min_rho: f64,
    /// Largest token ratio.
    pub max_rho: f64,
    /// Estimate of KL(pi_old || pi_sampler) from the sampler's samples,
    /// `mean(rho log rho)`.
    pub kl_old_sparse: f64,
    /// Token counts per bin of [`RHO_HIST_EDGES`].
    pub hist: Vec<usize>,
}

/// What a correction decided, with the ratios' statistics.
#[derive(Clone, Debug, PartialEq)]
pub struct Corrected {
    /// Per rollout and token, the loss weight (0: masked or vetoed).
    pub weights: Vec<Vec<f64>>,
    /// Rollouts dropped whole (veto, `sequence_mask`).
    pub rejected_rollouts: usize,
    /// Tokens masked (dropped rollouts' tokens included).
    pub rejected_tokens: usize,
    /// Tokens that keep a non-zero weight.
    pub kept_tokens: usize,
    /// The token ratios' statistics (before any correction).
    pub stats: RhoSummary,
}

/// `rho = exp(clamp(log pi_old - log pi_sampler, -20, 20))`.
pub fn rho(logp_old: f64, logp_sparse: f64) -> f64 {
    (logp_old - logp_sparse).clamp(-20.0, 20.0).exp()
}

/// Every token's ratio from the learner's `old` and the sampler's `sparse`
/// log-probabilities (same shapes).
pub fn ratios(old: &[Vec<f64>], sparse: &[Vec<f64>]) -> Vec<Vec<f64>> {
    old.iter()
        .zip(sparse)
        .map(|(o, s)| o.iter().zip(s).map(|(&a, &b)| rho(a, b)).collect())
        .collect()
}

/// Mean, extremes, KL estimate and histogram of the ratios `rhos`.
pub fn summarize(rhos: &[Vec<f64>]) -> RhoSummary {
    let all: Vec<f64> = rhos.iter().flatten().copied().collect();
    let n = all.len().max(1) as f64;
    let mut hist = vec![0; RHO_HIST_EDGES.len()];
    for &r in &all {
        let bin = RHO_HIST_EDGES.iter().rposition(|&e| r >= e).unwrap_or(0);
        hist[bin] += 1;
    }
    RhoSummary {
        mean_rho: if all.is_empty() {
            1.0
        } else {
            all.iter().sum::<f64>() / n
        },
        min_rho: if all.is_empty() {
            1.0
        } else {
            all.iter().copied().fold(f64::INFINITY, f64::min)
        },
        max_rho: if all.is_empty() {
            1.0
        } else {
            all.iter().copied().fold(f64::NEG_INFINITY, f64::max)
        },
        kl_old_sparse: all.iter().map(|r| r * r.ln()).sum::<f64>() / n,
        hist,
    }
}

/// Per rollout of `rhos`: its tokens outside `[th.low, th.high]` and
/// whether one fell below `th.veto`, as Sparse-RL would judge it whichever
/// correction the run uses.
pub fn band_counts(th: &Thresholds, rhos: &[Vec<f64>]) -> Vec<(usize, bool)> {
    rhos.iter()
        .map(|r| {
            let outside = r.iter().filter(|&&x| x < th.low || x > th.high).count();
            (outside, r.iter().any(|&x| x < th.veto))
        })
        .collect()
}

/// Sparse-RL's weights for every token of every rollout from the learner's
/// `old` and the sampler's `sparse` log-probabilities (same shapes).
pub fn correct(
    kind: Correction,
    th: &Thresholds,
    old: &[Vec<f64>],
    sparse: &[Vec<f64>],
) -> Corrected {
    let mut rhos = ratios(old, sparse);
    let stats = summarize(&rhos);
    if th.sequence_level {
        for r in &mut rhos {
            let len = r.len().max(1) as f64;
            let g = (r.iter().map(|x| x.ln()).sum::<f64>() / len).exp();
            r.iter_mut().for_each(|x| *x = g);
        }
    }
    let (mut rejected_rollouts, mut rejected_tokens) = (0, 0);
    let mut weights: Vec<Vec<f64>> = Vec::with_capacity(rhos.len());
    for r in &rhos {
        let w: Vec<f64> = match kind {
            Correction::None => vec![1.0; r.len()],
            Correction::Tis => r.iter().map(|&x| x.min(th.cap)).collect(),
            Correction::SparseRl => {
                if r.iter().any(|&x| x < th.veto) {
                    rejected_rollouts += 1;
                    rejected_tokens += r.len();
                    vec![0.0; r.len()]
                } else {
                    r.iter()
                        .map(|&x| {
                            if x < th.low || x > th.high {
                                rejected_tokens += 1;
                                0.0
                            } else {
                                x.min(th.cap)
                            }
                        })
                        .collect()
                }
            }
        };
        weights.push(w);
    }
    let kept = weights.iter().flatten().filter(|&&w| w > 0.0).count();
    if kind == Correction::SparseRl && kept > 0 {
        let mean = weights.iter().flatten().sum::<f64>() / kept as f64;
        for w in weights.iter_mut().flatten() {
            *w /= mean;
        }
    }
    Corrected {
        kept_tokens: kept,
        weights,
        rejected_rollouts,
        rejected_tokens,
        stats,
    }
}

/// The numerics correction's weights for every token of every rollout from
/// the learner's `old` and the sampler's `sampled` log-probabilities (same
/// shapes). Weights are not normalised (as TRL's are not); masked tokens
/// leave the loss's denominator, as Sparse-RL's rejected tokens do (TRL keeps
/// them in it).
pub fn correct_numerics(
    mode: NumericsCorrection,
    th: &NumericsThresholds,
    old: &[Vec<f64>],
    sampled: &[Vec<f64>],
) -> Corrected {
    let rhos = ratios(old, sampled);
    let stats = summarize(&rhos);
    let (lo, hi) = (th.clip_min.unwrap_or(0.0), th.clip_max);
    let inside = |x: f64| x >= lo && x <= hi;
    let (mut rejected_rollouts, mut rejected_tokens) = (0, 0);
    let mut weights: Vec<Vec<f64>> = Vec::with_capacity(rhos.len());
    for (r, (o, s)) in rhos.iter().zip(old.iter().zip(sampled)) {
        // TRL's sequence ratio: the exponential of the summed log-ratio.
        let seq = || {
            let sum: f64 = o.iter().zip(s).map(|(a, b)| a - b).sum();
            sum.clamp(-20.0, 20.0).exp()
        };
        let w: Vec<f64> = match mode {
            NumericsCorrection::None => vec![1.0; r.len()],
            NumericsCorrection::TokenTruncate => r.iter().map(|&x| x.clamp(lo, hi)).collect(),
            NumericsCorrection::TokenMask => r
                .iter()
                .map(|&x| {
                    if inside(x) {
                        x
                    } else {
                        rejected_tokens += 1;
                        0.0
                    }
                })
                .collect(),
            NumericsCorrection::SequenceTruncate => vec![seq().clamp(lo, hi); r.len()],
            NumericsCorrection::SequenceMask => {
                let big = seq();
                if inside(big) {
                    vec![big; r.len()]
                } else {
                    rejected_rollouts += 1;
                    rejected_tokens += r.len();
                    vec![0.0; r.len()]
                }
            }
        };
        weights.push(w);
    }
    let kept = weights.iter().flatten().filter(|&&w| w > 0.0).count();
    Corrected {
        kept_tokens: kept,
        weights,
        rejected_rollouts,
        rejected_tokens,
        stats,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lp(rhos: &[f64]) -> (Vec<f64>, Vec<f64>) {
        // old = ln rho, sparse = 0: the ratio of each token is rho.
        (rhos.iter().map(|r| r.ln()).collect(), vec![0.0; rhos.len()])
    }

    #[test]
    fn band_counts_judge_each_rollout_by_sparse_rls_thresholds() {
        // Default band [0.5, 1.5], veto 1e-4: the first rollout has two
        // tokens outside the band and none vetoed, the second one vetoed
        // token (also outside), the third none.
        let rhos = vec![vec![0.4, 1.0, 1.6], vec![1.0, 1e-5], vec![0.9, 1.1]];
        assert_eq!(
            band_counts(&Thresholds::default(), &rhos),
            vec![(2, false), (1, true), (0, false)]
        );
    }

    /// The log-probabilities of several rollouts with these ratios.
    fn batch(rollouts: &[&[f64]]) -> (Vec<Vec<f64>>, Vec<Vec<f64>>) {
        rollouts.iter().map(|r| lp(r)).unzip()
    }

    fn close(got: &[Vec<f64>], want: &[Vec<f64>]) {
        assert_eq!(got.len(), want.len(), "{got:?}");
        for (g, w) in got.iter().zip(want) {
            assert_eq!(g.len(), w.len(), "{got:?}");
            for (a, b) in g.iter().zip(w) {
                assert!((a - b).abs() < 1e-9, "{got:?} vs {want:?}");
            }
        }
    }

    #[test]
    fn sparse_rl_vetoes_masks_truncates_and_normalises() {
        let th = Thresholds::default();
        let (o, s) = batch(&[
            &[1.0, 1.2, 0.4, 1.4], // 0.4 masked
            &[1.0, 5e-5],          // vetoed
            &[2.0, 0.8],           // 2.0 masked
        ]);
        let c = correct(Correction::SparseRl, &th, &o, &s);
        assert_eq!(c.rejected_rollouts, 1);
        assert_eq!(c.rejected_tokens, 2 + 2);
        assert_eq!(c.kept_tokens, 4);
        // Kept raw weights 1.0, 1.2, 1.4, 0.8: mean 1.1.
        let want = [
            vec![1.0 / 1.1, 1.2 / 1.1, 0.0, 1.4 / 1.1],
            vec![0.0, 0.0],
            vec![0.0, 0.8 / 1.1],
        ];
        close(&c.weights, &want);
        assert!((c.stats.min_rho - 5e-5).abs() < 1e-12);
        assert!((c.stats.max_rho - 2.0).abs() < 1e-12);
    }

    #[test]
    fn tis_truncates_only_and_none_is_all_ones() {
        let th = Thresholds::default();
        let (o, s) = batch(&[&[0.1, 1.0, 3.0]]);
        let c = correct(Correction::Tis, &th, &o, &s);
        close(&c.weights, &[vec![0.1, 1.0, 1.5]]);
        assert_eq!(c.rejected_tokens, 0);
        let c = correct(Correction::None, &th, &o, &s);
        assert_eq!(c.weights[0], vec![1.0; 3]);
    }

    #[test]
    fn sequence_level_uses_the_geometric_mean() {
        let th = Thresholds {
            sequence_level: true,
            ..Default::default()
        };
        // Geometric mean of 0.5 and 2.0 is 1.0: kept although both tokens
        // would be masked one by one.
        let (o, s) = batch(&[&[0.5, 2.0]]);
        let c = correct(Correction::SparseRl, &th, &o, &s);
        assert_eq!(c.rejected_tokens, 0);
        assert!(c.weights[0].iter().all(|&w| (w - 1.0).abs() < 1e-9));
    }

    #[test]
    fn identical_policies_have_ratio_one_and_zero_kl() {
        let c = correct(
            Correction::SparseRl,
            &Thresholds::default(),
            &[vec![-1.0, -2.0]],
            &[vec![-1.0, -2.0]],
        );
        let st = &c.stats;
        assert_eq!((st.mean_rho, st.min_rho, st.max_rho), (1.0, 1.0, 1.0));
        assert_eq!(st.kl_old_sparse, 0.0);
        // Both tokens in the exact bin [0.99, 1.01).
        assert_eq!(st.hist, vec![0, 0, 0, 0, 0, 2, 0, 0, 0, 0, 0]);
        assert_eq!(rho(0.0, 30.0), (-20f64).exp());
    }

    #[test]
    fn the_histogram_counts_each_token_in_its_bin() {
        let (o, s) = batch(&[&[0.3, 0.6, 0.85], &[1.0, 1.0, 1.2, 3.0]]);
        let st = summarize(&ratios(&o, &s));
        // [0,.5) [.5,.8) [.8,.9) [.9,.95) [.95,.99) [.99,1.01) [1.01,1.05)
        // [1.05,1.1) [1.1,1.25) [1.25,2) [2,inf)
        assert_eq!(st.hist, vec![1, 1, 1, 0, 0, 2, 0, 0, 1, 0, 1]);
        assert_eq!(st.hist.iter().sum::<usize>(), 7);
        assert!((st.min_rho - 0.3).abs() < 1e-12 && (st.max_rho - 3.0).abs() < 1e-12);
        let mean = (0.3 + 0.6 + 0.85 + 1.0 + 1.0 + 1.2 + 3.0) / 7.0;
        assert!((st.mean_rho - mean).abs() < 1e-12);
        // No tokens: neutral statistics, nothing in the histogram.
        let st = summarize(&[]);
        assert_eq!((st.mean_rho, st.min_rho, st.max_rho), (1.0, 1.0, 1.0));
        assert_eq!(st.hist.iter().sum::<usize>(), 0);
    }

    #[test]
    fn token_truncate_clamps_each_ratio_to_the_clip_range() {
        let (o, s) = batch(&[&[0.1, 1.0, 4.0]]);
        let th = NumericsThresholds::default(); // clip_max 3, no clip_min
        let c = correct_numerics(NumericsCorrection::TokenTruncate, &th, &o, &s);
        close(&c.weights, &[vec![0.1, 1.0, 3.0]]);
        assert_eq!((c.rejected_tokens, c.kept_tokens), (0, 3));
        let th = NumericsThresholds {
            clip_min: Some(0.2),
            clip_max: 2.0,
        };
        let c = correct_numerics(NumericsCorrection::TokenTruncate, &th, &o, &s);
        close(&c.weights, &[vec![0.2, 1.0, 2.0]]);
    }

    #[test]
    fn token_mask_drops_tokens_outside_the_range_and_keeps_rho_as_weight() {
        let th = NumericsThresholds {
            clip_min: Some(0.2),
            clip_max: 3.0,
        };
        let (o, s) = batch(&[&[0.1, 1.0, 4.0, 2.5], &[0.5]]);
        let c = correct_numerics(NumericsCorrection::TokenMask, &th, &o, &s);
        // Not normalised: kept weights 1.0, 2.5, 0.5 stay as they are.
        close(&c.weights, &[vec![0.0, 1.0, 0.0, 2.5], vec![0.5]]);
        assert_eq!(
            (c.rejected_rollouts, c.rejected_tokens, c.kept_tokens),
            (0, 2, 3)
        );
        // Without clip_min only the upper bound masks.
        let c = correct_numerics(
            NumericsCorrection::TokenMask,
            &NumericsThresholds::default(),
            &o,
            &s,
        );
        close(&c.weights, &[vec![0.1, 1.0, 0.0, 2.5], vec![0.5]]);
    }

    #[test]
    fn sequence_modes_use_the_product_of_the_ratios() {
        let th = NumericsThresholds::default(); // [no min, 3]
        let (o, s) = batch(&[
            &[2.0, 2.0], // R = 4 > 3: dropped, though each token is inside
            &[0.5, 4.0], // R = 2: kept, though 4.0 alone is outside
            &[0.5, 0.5], // R = 0.25: kept (no lower bound)
        ]);
        let c = correct_numerics(NumericsCorrection::SequenceMask, &th, &o, &s);
        close(
            &c.weights,
            &[vec![0.0, 0.0], vec![2.0, 2.0], vec![0.25, 0.25]],
        );
        assert_eq!((c.rejected_rollouts, c.rejected_tokens), (1, 2));
        let lo = NumericsThresholds {
            clip_min: Some(0.3),
            ..th
        };
        let c = correct_numerics(NumericsCorrection::SequenceMask, &lo, &o, &s);
        close(
            &c.weights,
            &[vec![0.0, 0.0], vec![2.0, 2.0], vec![0.0, 0.0]],
        );
        assert_eq!((c.rejected_rollouts, c.rejected_tokens), (2, 4));
        let c = correct_numerics(NumericsCorrection::SequenceTruncate, &lo, &o, &s);
        close(
            &c.weights,
            &[vec![3.0, 3.0], vec![2.0, 2.0], vec![0.3, 0.3]],
        );
        // The statistics are the tokens' ratios whatever the mode.
        assert!((c.stats.max_rho - 4.0).abs() < 1e-9);
        let c = correct_numerics(NumericsCorrection::None, &lo, &o, &s);
        assert!(c.weights.iter().flatten().all(|&w| w == 1.0));
    }

    #[test]
    fn names_parse_and_print_as_trl_spells_them() {
        for m in [
            "none",
            "token_truncate",
            "token_mask",
            "sequence_truncate",
            "sequence_mask",
        ] {
            assert_eq!(m.parse::<NumericsCorrection>().unwrap().to_string(), m);
        }
        assert!("token-mask".parse::<NumericsCorrection>().is_err());
    }
}
