//! XTC, "exclude top choices" (from text-generation-webui, as llama.cpp's
//! `xtc` sampler applies it): with probability `xtc_probability`, every
//! token at or above `xtc_threshold` is removed except the least likely of
//! them, so the reply leaves the most predictable path while staying among
//! tokens the model finds plausible. Chat front ends send it for creative
//! writing.

use rand::Rng;

/// Whether these settings can ever remove a token: a positive probability
/// and a threshold of at most 0.5 (above it, at most one token could pass,
/// and XTC never removes the last one).
pub(crate) fn active(probability: f32, threshold: f32) -> bool {
    probability > 0.0 && threshold <= 0.5
}

/// Applies XTC to `cands`, sorted by logit descending (finite logits):
/// rolls `rng` once (only when [`active`] and there are two or more
/// candidates) and, when the roll is at most `probability`, drops the
/// tokens above the least likely one whose softmax probability (over
/// `cands`) is at least `threshold`.
pub(crate) fn truncate<R: Rng>(
    cands: &mut Vec<(u32, f32)>,
    probability: f32,
    threshold: f32,
    rng: &mut R,
) {
    if !active(probability, threshold) || cands.len() < 2 {
        return;
    }
    let chance: f32 = rng.gen();
    if chance > probability {
        return;
    }
    let max = cands[0].1;
    let total: f64 = cands.iter().map(|c| f64::from(c.1 - max).exp()).sum();
    let last_above = cands
        .iter()
        .take_while(|c| f64::from(c.1 - max).exp() / total >= f64::from(threshold))
        .count()
        .saturating_sub(1);
    if last_above > 0 {
        cands.drain(..last_above);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand_chacha::ChaCha8Rng;

    fn cands(probs: &[f32]) -> Vec<(u32, f32)> {
        probs
            .iter()
            .enumerate()
            .map(|(i, p)| (i as u32, p.ln()))
            .collect()
    }

    #[test]
    fn probability_one_removes_the_top_choices_but_the_least_likely_of_them() {
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        // Three tokens at or above 0.1: the two likeliest go, 0.15 stays.
        let mut c = cands(&[0.4, 0.3, 0.15, 0.08, 0.07]);
        truncate(&mut c, 1.0, 0.1, &mut rng);
        assert_eq!(c.iter().map(|c| c.0).collect::<Vec<_>>(), vec![2, 3, 4]);

        // Only one token above the threshold: nothing is removed.
        let mut c = cands(&[0.6, 0.05, 0.05]);
        truncate(&mut c, 1.0, 0.1, &mut rng);
        assert_eq!(c.len(), 3);
    }

    #[test]
    fn off_when_probability_is_zero_or_threshold_above_half() {
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        for (p, t) in [(0.0, 0.1), (1.0, 0.6)] {
            let mut c = cands(&[0.4, 0.3, 0.3]);
            truncate(&mut c, p, t, &mut rng);
            assert_eq!(c.len(), 3, "p={p} t={t}");
        }
    }

    #[test]
    fn fires_about_as_often_as_its_probability() {
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        let fired = (0..2000)
            .filter(|_| {
                let mut c = cands(&[0.5, 0.4, 0.1]);
                truncate(&mut c, 0.25, 0.1, &mut rng);
                c.len() < 3
            })
            .count();
        assert!((400..600).contains(&fired), "{fired}");
    }
}
