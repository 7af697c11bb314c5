//! Dynamic temperature (llama.cpp's `dynatemp_range`, `dynatemp_exponent`):
//! the temperature moves within `temperature ± range` with the entropy of
//! the candidates left, low when the model is sure of a few tokens and
//! high when it spreads its mass, so a confident step stays sharp and an
//! open one is explored.

/// The temperature for candidates with logits `logits` (finite): with
/// `h` their softmax entropy over its maximum `ln(count)`, `lo + (hi - lo)
/// * h^exponent`, `lo = max(0, t - range)` and `hi = t + range`. A single
/// candidate, or `range <= 0`, keeps `t`.
pub(crate) fn temperature(logits: &[f32], t: f32, range: f32, exponent: f32) -> f32 {
    if range.is_nan() || range <= 0.0 || logits.len() < 2 {
        return t;
    }
    let (lo, hi) = ((t - range).max(0.0), t + range);
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let weights: Vec<f64> = logits.iter().map(|&l| f64::from(l - max).exp()).collect();
    let total: f64 = weights.iter().sum();
    let entropy: f64 = weights
        .iter()
        .map(|w| w / total)
        .filter(|&p| p > 0.0)
        .map(|p| -p * p.ln())
        .sum();
    let normalized = (entropy / (logits.len() as f64).ln()).clamp(0.0, 1.0);
    lo + (hi - lo) * normalized.powf(f64::from(exponent)) as f32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_temperature_follows_the_entropy_within_its_range() {
        // Equal logits: the most entropy, the top of the range.
        assert!((temperature(&[1.0; 4], 1.0, 0.5, 1.0) - 1.5).abs() < 1e-6);
        // One token all but certain: the bottom (clamped at 0).
        assert!(temperature(&[50.0, 0.0, 0.0], 0.8, 1.0, 1.0) < 1e-6);
        // Two tokens at 3:1 odds: h = 0.811 bits over 1 bit.
        let h = -(0.75f64 * 0.75f64.ln() + 0.25 * 0.25f64.ln()) / 2f64.ln();
        let want = 0.5 + h as f32;
        let got = temperature(&[3f32.ln(), 0.0], 1.0, 0.5, 1.0);
        assert!((got - want).abs() < 1e-5, "{got} vs {want}");
        // The exponent bends it: h^2 < h.
        assert!(temperature(&[3f32.ln(), 0.0], 1.0, 0.5, 2.0) < got);
        // Off: the temperature as given.
        assert_eq!(temperature(&[3f32.ln(), 0.0], 0.7, 0.0, 1.0), 0.7);
    }
}
