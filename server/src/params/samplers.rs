//! llama-server's sampler fields on the OpenAI endpoints: typical, XTC,
//! DRY, Mirostat, top-nσ, dynamic temperature and the native
//! `repeat_penalty` / `repeat_last_n`, each
//! range-checked into [`SamplingParams`] with a 400 naming its field, so a
//! chat front end written for llama-server gets the sampler it asked for
//! or a clear refusal, never a silently ignored setting.

use tern_runtime::sampler::{SamplingParams, MAX_BREAKER_BYTES};

use crate::openai::error::ApiError;
use crate::openai::request::GenerationFields;

/// The request fields [`apply`] reads: the endpoints that map their own
/// shape onto chat's (Responses, Anthropic's Messages) pass them on as
/// they are, so every endpoint takes the same samplers.
pub const FIELDS: [&str; 16] = [
    "typical_p",
    "xtc_probability",
    "xtc_threshold",
    "dry_multiplier",
    "dry_base",
    "dry_allowed_length",
    "dry_penalty_last_n",
    "dry_sequence_breakers",
    "mirostat",
    "mirostat_tau",
    "mirostat_eta",
    "repeat_penalty",
    "repeat_last_n",
    "top_n_sigma",
    "dynatemp_range",
    "dynatemp_exponent",
];

/// Most DRY sequence breakers a request may give.
pub const MAX_BREAKERS: usize = 16;

/// Sets `p`'s typical, XTC, DRY and Mirostat fields and the llama-server
/// penalty aliases from the request.
pub fn apply(f: &GenerationFields, p: &mut SamplingParams) -> Result<(), ApiError> {
    if let Some(v) = f.typical_p {
        p.typical_p = unit("typical_p", v)?;
    }
    if let Some(v) = f.xtc_probability {
        p.xtc_probability = unit("xtc_probability", v)?;
    }
    if let Some(v) = f.xtc_threshold {
        p.xtc_threshold = unit("xtc_threshold", v)?;
    }
    if let Some(v) = f.dry_multiplier {
        p.dry_multiplier = at_least("dry_multiplier", v, 0.0)?;
    }
    if let Some(v) = f.dry_base {
        p.dry_base = at_least("dry_base", v, 1.0)?;
    }
    if let Some(v) = f.dry_allowed_length {
        p.dry_allowed_length = count("dry_allowed_length", v)?;
    }
    if let Some(v) = f.dry_penalty_last_n {
        p.dry_penalty_last_n = window("dry_penalty_last_n", v)?;
    }
    if let Some(b) = &f.dry_sequence_breakers {
        p.dry_sequence_breakers = breakers(b)?;
    }
    if let Some(v) = f.mirostat {
        p.mirostat = match v {
            0..=2 => v as u8,
            _ => {
                return Err(ApiError::invalid_param(
                    "mirostat",
                    format!("mirostat must be 0 (off), 1 or 2, got {v}"),
                ))
            }
        };
    }
    if let Some(v) = f.mirostat_tau {
        p.mirostat_tau = at_least("mirostat_tau", v, 0.0)?;
    }
    if let Some(v) = f.mirostat_eta {
        p.mirostat_eta = at_least("mirostat_eta", v, 0.0)?;
    }
    if let Some(v) = f.top_n_sigma {
        if !(v.is_finite() && v.abs() <= f64::from(f32::MAX)) {
            return Err(ApiError::invalid_param(
                "top_n_sigma",
                format!("top_n_sigma must be a finite number (<= 0 is off), got {v}"),
            ));
        }
        p.top_n_sigma = v as f32;
    }
    if let Some(v) = f.dynatemp_range {
        p.dynatemp_range = at_least("dynatemp_range", v, 0.0)?;
    }
    if let Some(v) = f.dynatemp_exponent {
        p.dynatemp_exponent = at_least("dynatemp_exponent", v, 0.0)?;
    }
    if let Some(v) = f.repeat_last_n {
        match window("repeat_last_n", v)? {
            // As llama.cpp: a window of 0 turns every penalty off.
            Some(0) => {
                p.repetition_penalty = 1.0;
                p.presence_penalty = 0.0;
                p.frequency_penalty = 0.0;
            }
            Some(n) => p.penalty_last_n = n,
            None => p.penalty_last_n = 0,
        }
    }
    Ok(())
}

/// `repetition_penalty`, or llama-server's `repeat_penalty` (not both
/// with different values).
pub fn repetition_penalty(f: &GenerationFields) -> Result<Option<f64>, ApiError> {
    match (f.repetition_penalty, f.repeat_penalty) {
        (Some(a), Some(b)) if a != b => Err(ApiError::invalid_param(
            "repeat_penalty",
            format!("repeat_penalty ({b}) and repetition_penalty ({a}) disagree: give one"),
        )),
        (Some(a), _) => Ok(Some(a)),
        (None, b) => Ok(b),
    }
}

/// Whether any of these samplers changes the distribution drawn from (so
/// `processed_logprobs`, which reports the tempered one, would not be it).
pub fn shapes_distribution(f: &GenerationFields) -> bool {
    f.typical_p.is_some_and(|v| v < 1.0)
        || f.xtc_probability.is_some_and(|v| v > 0.0)
        || f.dry_multiplier.is_some_and(|v| v > 0.0)
        || f.mirostat.is_some_and(|v| v != 0)
        || f.top_n_sigma.is_some_and(|v| v > 0.0)
        || f.dynatemp_range.is_some_and(|v| v > 0.0)
}

fn unit(param: &str, v: f64) -> Result<f32, ApiError> {
    if v.is_finite() && (0.0..=1.0).contains(&v) {
        Ok(v as f32)
    } else {
        Err(ApiError::invalid_param(
            param,
            format!("{param} must be between 0 and 1, got {v}"),
        ))
    }
}

fn at_least(param: &str, v: f64, lo: f64) -> Result<f32, ApiError> {
    if v.is_finite() && v >= lo && v <= f64::from(f32::MAX) {
        Ok(v as f32)
    } else {
        Err(ApiError::invalid_param(
            param,
            format!("{param} must be a finite number >= {lo}, got {v}"),
        ))
    }
}

fn count(param: &str, v: i64) -> Result<usize, ApiError> {
    usize::try_from(v).map_err(|_| {
        ApiError::invalid_param(param, format!("{param} must be an integer >= 0, got {v}"))
    })
}

/// llama-server's windows: `-1` is the whole history (`None`), `0` off.
fn window(param: &str, v: i64) -> Result<Option<usize>, ApiError> {
    match v {
        -1 => Ok(None),
        v => count(param, v).map(Some).map_err(|_| {
            ApiError::invalid_param(
                param,
                format!("{param} must be -1 (the whole history) or an integer >= 0, got {v}"),
            )
        }),
    }
}

fn breakers(b: &[String]) -> Result<Vec<String>, ApiError> {
    let bad = |msg: String| ApiError::invalid_param("dry_sequence_breakers", msg);
    if b.is_empty() {
        return Err(bad(
            "dry_sequence_breakers must be a non-empty list of strings".into(),
        ));
    }
    if b.len() > MAX_BREAKERS {
        return Err(bad(format!(
            "at most {MAX_BREAKERS} dry_sequence_breakers are allowed, got {}",
            b.len()
        )));
    }
    if let Some(s) = b
        .iter()
        .find(|s| s.is_empty() || s.len() > MAX_BREAKER_BYTES)
    {
        return Err(bad(format!(
            "each dry_sequence_breaker must be 1 to {MAX_BREAKER_BYTES} bytes, got {s:?}"
        )));
    }
    Ok(b.to_vec())
}
