//! Mirostat (Basu et al., 2021), versions 1 and 2 as llama.cpp defines
//! them: a feedback loop that truncates each step's distribution so the
//! surprise of the drawn tokens (`-log2 p`) tracks a target `tau`, keeping
//! the text's perplexity steady over a long reply instead of letting it
//! drift into repetition or nonsense. Front ends send `mirostat` (1 or 2),
//! `mirostat_tau` and `mirostat_eta`.
//!
//! This file holds the arithmetic: how many tokens version 1 keeps, the
//! logit floor of version 2, and the update of `mu`. The sampler owns the
//! state (one `mu` per sequence) and the draw.

/// Tokens version 1 uses to estimate the distribution's Zipf exponent.
pub(crate) const V1_M: usize = 100;

/// The state of one sequence's Mirostat: the surprise bound `mu`, starting
/// at `2 * tau` as llama.cpp's does.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Mirostat {
    /// 1 or 2.
    pub version: u8,
    /// Target surprise, in bits.
    pub tau: f32,
    /// Learning rate of `mu`.
    pub eta: f32,
    /// Current surprise bound.
    pub mu: f32,
}

impl Mirostat {
    /// A fresh loop for `version` (1 or 2), `mu = 2 * tau`.
    pub(crate) fn new(version: u8, tau: f32, eta: f32) -> Self {
        Self {
            version,
            tau,
            eta,
            mu: 2.0 * tau,
        }
    }

    /// Version 1's `k`: from the `top` logits (temperature applied, sorted
    /// descending, up to [`V1_M`] of them), the Zipf exponent `s` is
    /// estimated by least squares on `ln(p_i / p_{i+1})` against
    /// `ln((i + 2) / (i + 1))`, and `k = (e * 2^mu / (1 - n^-e))^(1 / s)`
    /// with `e = s - 1` and `n` the vocabulary size. At least 1; where the
    /// estimate is undefined (one candidate, a flat distribution), `n`.
    pub(crate) fn v1_k(&self, top: &[f32], n_vocab: usize) -> usize {
        let (mut sum_tb, mut sum_tt) = (0.0f64, 0.0f64);
        for (i, w) in top.windows(2).enumerate().take(V1_M - 1) {
            let t = ((i as f64 + 2.0) / (i as f64 + 1.0)).ln();
            // ln(p_i / p_{i+1}) is the logits' difference.
            let b = f64::from(w[0]) - f64::from(w[1]);
            sum_tb += t * b;
            sum_tt += t * t;
        }
        let s = sum_tb / sum_tt;
        let e = s - 1.0;
        let k =
            ((e * 2f64.powf(f64::from(self.mu))) / (1.0 - (n_vocab as f64).powf(-e))).powf(1.0 / s);
        if k.is_finite() && k >= 1.0 {
            (k as usize).min(n_vocab.max(1))
        } else if k.is_finite() {
            1
        } else {
            n_vocab.max(1)
        }
    }

    /// Version 2's floor: tokens whose surprise `-log2 p` is above `mu`
    /// are dropped, i.e. those whose logit (temperature applied) is below
    /// `lse - mu * ln 2`, `lse` being the log-sum-exp of all logits. The
    /// caller keeps the most likely token when none passes.
    pub(crate) fn v2_floor(&self, lse: f64) -> f64 {
        lse - f64::from(self.mu) * std::f64::consts::LN_2
    }

    /// Feeds back the drawn token's probability `p` (renormalised over the
    /// kept set): `mu -= eta * (-log2 p - tau)`.
    pub(crate) fn update(&mut self, p: f64) {
        let surprise = -p.log2() as f32;
        if surprise.is_finite() {
            self.mu -= self.eta * (surprise - self.tau);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mu_moves_toward_tau() {
        let mut m = Mirostat::new(2, 3.0, 0.5);
        assert_eq!(m.mu, 6.0);
        // A token of probability 1/2 (surprise 1 bit, below tau = 3) raises
        // mu by eta * 2: the next step admits less likely tokens.
        m.update(0.5);
        assert!((m.mu - 7.0).abs() < 1e-6, "{}", m.mu);
        // A surprising one (1/256: 8 bits, above tau) lowers it.
        m.update(1.0 / 256.0);
        assert!((m.mu - 4.5).abs() < 1e-6, "{}", m.mu);
    }

    #[test]
    fn v2_floor_drops_tokens_more_surprising_than_mu() {
        let m = Mirostat {
            mu: 2.0,
            ..Mirostat::new(2, 1.0, 0.1)
        };
        // Probabilities 1/2, 1/4, 1/8, 1/8 as logits with lse = 0: surprises
        // 1, 2, 3, 3 bits; mu = 2 keeps the first two.
        let logits = [0.5f64.ln(), 0.25f64.ln(), 0.125f64.ln(), 0.125f64.ln()];
        let floor = m.v2_floor(0.0);
        let kept = logits.iter().filter(|&&l| l >= floor - 1e-9).count();
        assert_eq!(kept, 2);
    }

    #[test]
    fn v1_keeps_more_tokens_as_mu_grows() {
        // A Zipf distribution over 1000 tokens, p_i ~ (i + 1)^-1.5: s = 1.5,
        // so k = (0.5 * 2^mu / (1 - 1000^-0.5))^(1 / 1.5): 1 at mu = 2, 25 at mu = 8.
        let top: Vec<f32> = (0..100).map(|i| -1.5 * ((i as f32) + 1.0).ln()).collect();
        let low = Mirostat {
            mu: 2.0,
            ..Mirostat::new(1, 1.0, 0.1)
        }
        .v1_k(&top, 1000);
        let high = Mirostat {
            mu: 8.0,
            ..Mirostat::new(1, 1.0, 0.1)
        }
        .v1_k(&top, 1000);
        assert_eq!((low, high), (1, 25));
    }
}
