//! Locally typical sampling (Meister et al., 2022), as llama.cpp's
//! `typical` sampler applies it: keep the tokens whose surprise is nearest
//! the distribution's entropy, the fewest whose mass passes `p`. Front ends
//! send it as `typical_p` to cut both the dull most-likely tokens and the
//! unlikely tail when those are far from what the model "expects" to say.

/// Truncates `cands` (`(token, logit)`, any order, finite logits) to the
/// locally typical set for `p`, and leaves it sorted by logit, descending
/// (ties by lower id). `p >= 1` (or NaN) leaves the set as it is.
///
/// As llama.cpp: probabilities are the softmax of the candidates, the
/// entropy is `H = -sum p ln p`, each token's score is `|-ln p - H|`; tokens
/// are taken by ascending score until their cumulative probability exceeds
/// `p` (the crossing token included).
pub(crate) fn truncate(cands: &mut Vec<(u32, f32)>, p: f32) {
    if p.is_nan() || p >= 1.0 || cands.len() < 2 {
        return;
    }
    let max = cands.iter().map(|c| c.1).fold(f32::NEG_INFINITY, f32::max);
    let weights: Vec<f64> = cands.iter().map(|c| f64::from(c.1 - max).exp()).collect();
    let total: f64 = weights.iter().sum();
    let probs: Vec<f64> = weights.iter().map(|w| w / total).collect();
    let entropy: f64 = probs
        .iter()
        .filter(|&&q| q > 0.0)
        .map(|&q| -q * q.ln())
        .sum();
    // A zero-probability token has infinite surprise: it sorts last.
    let score = |q: f64| {
        if q > 0.0 {
            (-q.ln() - entropy).abs()
        } else {
            f64::INFINITY
        }
    };
    let mut order: Vec<usize> = (0..cands.len()).collect();
    order.sort_by(|&a, &b| {
        score(probs[a])
            .total_cmp(&score(probs[b]))
            .then(cands[a].0.cmp(&cands[b].0))
    });
    let mut cum = 0.0f64;
    let mut keep = order.len();
    for (i, &idx) in order.iter().enumerate() {
        cum += probs[idx];
        if cum > f64::from(p) {
            keep = i + 1;
            break;
        }
    }
    let mut kept: Vec<(u32, f32)> = order[..keep].iter().map(|&i| cands[i]).collect();
    kept.sort_unstable_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    *cands = kept;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(c: &[(u32, f32)]) -> Vec<u32> {
        c.iter().map(|c| c.0).collect()
    }

    #[test]
    fn keeps_the_tokens_nearest_the_entropy_not_the_most_likely() {
        // Probabilities 0.5, 0.2, 0.2, 0.05, 0.05: entropy ~1.29 nats. The
        // 0.2 tokens' surprise (1.61) is nearest it, then the 0.5 token's
        // (0.69), so p = 0.3 keeps the two 0.2 tokens and drops the top one.
        let probs = [0.5f32, 0.2, 0.2, 0.05, 0.05];
        let mut c: Vec<(u32, f32)> = probs
            .iter()
            .enumerate()
            .map(|(i, p)| (i as u32, p.ln()))
            .collect();
        truncate(&mut c, 0.3);
        assert_eq!(ids(&c), vec![1, 2]);

        // A larger p reaches the top token next, then the tail.
        let mut c: Vec<(u32, f32)> = probs
            .iter()
            .enumerate()
            .map(|(i, p)| (i as u32, p.ln()))
            .collect();
        truncate(&mut c, 0.8);
        assert_eq!(ids(&c), vec![0, 1, 2]);
    }

    #[test]
    fn p_one_keeps_everything() {
        let mut c = vec![(0, 1.0), (1, 0.0), (2, -3.0)];
        let before = c.clone();
        truncate(&mut c, 1.0);
        assert_eq!(c, before);
    }
}
