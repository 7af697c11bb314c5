//! Top-nσ (Tang et al., 2024), as llama.cpp's `top_n_sigma` sampler applies
//! it: keep the tokens whose logit is within `n` standard deviations of the
//! largest. The logits of the informative tokens stand apart from a roughly
//! normal noise floor, so the cut follows the model's confidence whatever
//! the temperature, where top-p and min-p move with it.

/// Drops from `cands` (`(token, logit)`, finite logits) every token whose
/// logit is below `max - n * sigma`, sigma the population standard
/// deviation of the candidates' logits. `n <= 0` (or NaN) keeps them all,
/// as llama.cpp's `-1` default does.
pub(crate) fn truncate(cands: &mut Vec<(u32, f32)>, n: f32) {
    if n.is_nan() || n <= 0.0 || cands.len() < 2 {
        return;
    }
    let count = cands.len() as f64;
    let mean = cands.iter().map(|c| f64::from(c.1)).sum::<f64>() / count;
    let var = cands
        .iter()
        .map(|c| (f64::from(c.1) - mean).powi(2))
        .sum::<f64>()
        / count;
    let max = cands.iter().map(|c| c.1).fold(f32::NEG_INFINITY, f32::max);
    let floor = f64::from(max) - f64::from(n) * var.sqrt();
    cands.retain(|c| f64::from(c.1) >= floor);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_tokens_within_n_sigma_of_the_top() {
        // Logits 10, 9, 1 and five 0s: mean 2.5, sigma ~3.94; n = 0.5 keeps
        // what is above ~8.03 (10 and 9), n = 3 everything above ~-1.8.
        let base: Vec<(u32, f32)> = [10.0, 9.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0]
            .iter()
            .enumerate()
            .map(|(i, &l)| (i as u32, l))
            .collect();
        let mut c = base.clone();
        truncate(&mut c, 0.5);
        assert_eq!(c.iter().map(|c| c.0).collect::<Vec<_>>(), vec![0, 1]);
        let mut c = base.clone();
        truncate(&mut c, 3.0);
        assert_eq!(c.len(), 8);
        for off in [0.0, -1.0, f32::NAN] {
            let mut c = base.clone();
            truncate(&mut c, off);
            assert_eq!(c, base);
        }
    }
}
