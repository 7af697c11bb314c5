//! Token sampling: turns one step's logits into the next token id.
//!
//! Owns the sampling parameters ([`SamplingParams`], serializable so requests
//! can carry them), their validation, and a seeded, reusable [`Sampler`] that
//! applies logit bias, repetition/presence/frequency penalties, DRY, top-k,
//! typical, top-p, min-p, XTC and temperature in llama.cpp's order (or, under
//! Mirostat, bias, temperature and Mirostat, as llama.cpp chains them), then
//! draws with its own ChaCha rng so a run is reproducible from `seed` alone.
//! Pure Rust over `&[f32]`; it knows nothing of tensors or models, and the
//! tokenizer enters only as the DRY breakers a caller builds
//! ([`DryBreakers::build`]).
//!
//! Non-finite logits never panic: NaN is treated as `-inf` (never chosen) and
//! `+inf` as `f32::MAX`.

use std::cmp::Ordering;
use std::collections::BinaryHeap;
use std::fmt;

use std::sync::Arc;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

mod dry;
mod dynatemp;
mod mirostat;
mod sigma;
mod typical;
mod xtc;

use dry::Dry;
pub use dry::{DryBreakers, MAX_BREAKER_BYTES};
use mirostat::Mirostat;

/// Largest `top_logprobs` accepted, matching OpenAI's API limit.
pub const MAX_TOP_LOGPROBS: usize = 20;

/// How to pick the next token; a plain value so requests can carry and log it.
///
/// Deserializing fills missing fields from [`Default`], so a request may name
/// only what it changes.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct SamplingParams {
    /// Softmax temperature; `0` means greedy (plain argmax, no rng draw).
    pub temperature: f32,
    /// Keep only the `k` most likely tokens; `None` or `Some(0)` disables it.
    pub top_k: Option<usize>,
    /// Nucleus sampling: keep the smallest set whose mass reaches `top_p`; `1.0` disables it.
    /// Like min-p it sees temperature-1 probabilities: temperature comes after the filters.
    pub top_p: f32,
    /// Drop tokens whose probability is below `min_p` times the top one's; `0` disables it.
    pub min_p: f32,
    /// llama.cpp/HF repetition penalty for tokens in the penalty window:
    /// positive logits are divided by it, negative ones multiplied; `1.0` disables it.
    pub repetition_penalty: f32,
    /// OpenAI presence penalty: subtracted once from every token seen in the window.
    pub presence_penalty: f32,
    /// OpenAI frequency penalty: subtracted once per occurrence in the window.
    pub frequency_penalty: f32,
    /// How many of the most recent tokens the penalties look at; `0` means the whole history.
    pub penalty_last_n: usize,
    /// Additive per-token logit adjustments, applied first; `f32::NEG_INFINITY` bans a token.
    pub logit_bias: Vec<(u32, f32)>,
    /// Seed of the sampler's rng, so a generation is reproducible.
    pub seed: u64,
    /// How many most-likely alternatives to report per step (`0..=20`); `0` skips the work.
    pub top_logprobs: usize,
    /// Report the drawn token's log-probability under the distribution the
    /// draw used (`logits / temperature`, [`tempered_logprob_of`]) rather
    /// than the model's own: what an RL learner scoring the rollout at its
    /// sampling temperature compares with. The same at temperature 1.
    pub tempered_logprobs: bool,
    /// Locally typical sampling's mass (llama.cpp's `typical_p`): keep the
    /// tokens whose surprise is nearest the entropy; `1.0` disables it.
    pub typical_p: f32,
    /// XTC's chance per step of removing the top choices; `0` disables it.
    pub xtc_probability: f32,
    /// XTC's threshold: tokens at or above it are the "top choices"; above
    /// `0.5` XTC does nothing.
    pub xtc_threshold: f32,
    /// DRY's multiplier: a token extending a repeat loses
    /// `dry_multiplier * dry_base^(length - dry_allowed_length)`; `0` disables it.
    pub dry_multiplier: f32,
    /// DRY's base (at least 1).
    pub dry_base: f32,
    /// Repeats up to this many tokens go unpenalised by DRY.
    pub dry_allowed_length: usize,
    /// How many recent tokens DRY scans: `None` the whole history, `Some(0)` disables it.
    pub dry_penalty_last_n: Option<usize>,
    /// Strings that cut DRY's repeats (llama.cpp's default: newline, `:`, `"`, `*`).
    pub dry_sequence_breakers: Vec<String>,
    /// Mirostat version: `0` off, `1` or `2`. When on, as in llama.cpp,
    /// penalties, DRY and the truncation samplers are skipped.
    pub mirostat: u8,
    /// Mirostat's target surprise (bits).
    pub mirostat_tau: f32,
    /// Mirostat's learning rate.
    pub mirostat_eta: f32,
    /// Top-nσ (llama.cpp's `top_n_sigma`): keep the tokens within this many
    /// standard deviations of the top logit; `<= 0` disables it.
    pub top_n_sigma: f32,
    /// Dynamic temperature's half-width (llama.cpp's `dynatemp_range`): the
    /// temperature moves within `temperature ± range` with the candidates'
    /// entropy; `0` disables it.
    pub dynatemp_range: f32,
    /// How dynamic temperature bends the normalized entropy (`h^exponent`).
    pub dynatemp_exponent: f32,
}

impl Default for SamplingParams {
    fn default() -> Self {
        Self {
            temperature: 1.0,
            top_k: None,
            top_p: 1.0,
            min_p: 0.0,
            repetition_penalty: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            penalty_last_n: 64,
            logit_bias: Vec::new(),
            seed: 0,
            top_logprobs: 0,
            tempered_logprobs: false,
            typical_p: 1.0,
            xtc_probability: 0.0,
            xtc_threshold: 0.1,
            dry_multiplier: 0.0,
            dry_base: 1.75,
            dry_allowed_length: 2,
            dry_penalty_last_n: Some(64),
            dry_sequence_breakers: ["\n", ":", "\"", "*"].map(String::from).to_vec(),
            mirostat: 0,
            mirostat_tau: 5.0,
            mirostat_eta: 0.1,
            top_n_sigma: -1.0,
            dynatemp_range: 0.0,
            dynatemp_exponent: 1.0,
        }
    }
}

impl SamplingParams {
    /// Deterministic argmax decoding (temperature 0), e.g. for tests and evals.
    pub fn greedy() -> Self {
        Self {
            temperature: 0.0,
            ..Self::default()
        }
    }

    /// Rejects values that have no meaning, so bad requests fail up front
    /// instead of sampling something surprising.
    pub fn validate(&self) -> Result<(), SamplerError> {
        let t = self.temperature;
        if !(t.is_finite() && t >= 0.0) {
            return Err(SamplerError::Temperature(t));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(SamplerError::TopP(self.top_p));
        }
        if !(self.min_p >= 0.0 && self.min_p <= 1.0) {
            return Err(SamplerError::MinP(self.min_p));
        }
        if !(self.repetition_penalty > 0.0 && self.repetition_penalty.is_finite()) {
            return Err(SamplerError::RepetitionPenalty(self.repetition_penalty));
        }
        if !self.presence_penalty.is_finite() {
            return Err(SamplerError::PresencePenalty(self.presence_penalty));
        }
        if !self.frequency_penalty.is_finite() {
            return Err(SamplerError::FrequencyPenalty(self.frequency_penalty));
        }
        if let Some(&(token, value)) = self.logit_bias.iter().find(|(_, b)| b.is_nan()) {
            return Err(SamplerError::LogitBias { token, value });
        }
        if self.top_logprobs > MAX_TOP_LOGPROBS {
            return Err(SamplerError::TopLogprobs(self.top_logprobs));
        }
        for (name, v) in [
            ("typical_p", self.typical_p),
            ("xtc_probability", self.xtc_probability),
            ("xtc_threshold", self.xtc_threshold),
        ] {
            if !(0.0..=1.0).contains(&v) {
                return Err(SamplerError::Range {
                    name,
                    value: v,
                    range: "[0, 1]",
                });
            }
        }
        if !(self.dry_multiplier.is_finite() && self.dry_multiplier >= 0.0) {
            return Err(SamplerError::Range {
                name: "dry_multiplier",
                value: self.dry_multiplier,
                range: "a finite number >= 0",
            });
        }
        if !(self.dry_base.is_finite() && self.dry_base >= 1.0) {
            return Err(SamplerError::Range {
                name: "dry_base",
                value: self.dry_base,
                range: "a finite number >= 1",
            });
        }
        if let Some(b) = self
            .dry_sequence_breakers
            .iter()
            .find(|b| b.is_empty() || b.len() > MAX_BREAKER_BYTES)
        {
            return Err(SamplerError::DryBreaker(b.clone()));
        }
        if self.mirostat > 2 {
            return Err(SamplerError::Mirostat(self.mirostat));
        }
        if !self.top_n_sigma.is_finite() {
            return Err(SamplerError::Range {
                name: "top_n_sigma",
                value: self.top_n_sigma,
                range: "a finite number (<= 0 is off)",
            });
        }
        for (name, v) in [
            ("mirostat_tau", self.mirostat_tau),
            ("mirostat_eta", self.mirostat_eta),
            ("dynatemp_range", self.dynatemp_range),
            ("dynatemp_exponent", self.dynatemp_exponent),
        ] {
            if !(v.is_finite() && v >= 0.0) {
                return Err(SamplerError::Range {
                    name,
                    value: v,
                    range: "a finite number >= 0",
                });
            }
        }
        Ok(())
    }

    /// DRY's settings as the sampler applies them.
    fn dry(&self) -> Dry {
        Dry {
            multiplier: self.dry_multiplier,
            base: self.dry_base,
            allowed_length: self.dry_allowed_length,
            last_n: self.dry_penalty_last_n,
        }
    }

    /// Whether DRY is on, so a caller knows to build its breakers.
    pub fn dry_enabled(&self) -> bool {
        self.mirostat == 0 && self.dry().enabled()
    }

    /// Whether typical or XTC is on: the candidates then go through the
    /// sorted chain rather than the cutoff path.
    fn sorted_chain(&self) -> bool {
        self.typical_p < 1.0
            || xtc::active(self.xtc_probability, self.xtc_threshold)
            || self.top_n_sigma > 0.0
            || self.dynatemp_range > 0.0
    }
}

/// Why a [`SamplingParams`] was rejected; each message names the parameter and value.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum SamplerError {
    /// Temperature was NaN, infinite or negative.
    #[error("temperature must be a finite number >= 0, got {0}")]
    Temperature(f32),
    /// `top_p` was outside `(0, 1]`.
    #[error("top_p must be in (0, 1], got {0}")]
    TopP(f32),
    /// `min_p` was outside `[0, 1]`.
    #[error("min_p must be in [0, 1], got {0}")]
    MinP(f32),
    /// Repetition penalty was not a finite number `> 0`.
    #[error("repetition_penalty must be a finite number > 0, got {0}")]
    RepetitionPenalty(f32),
    /// Presence penalty was NaN or infinite.
    #[error("presence_penalty must be finite, got {0}")]
    PresencePenalty(f32),
    /// Frequency penalty was NaN or infinite.
    #[error("frequency_penalty must be finite, got {0}")]
    FrequencyPenalty(f32),
    /// A logit bias value was NaN.
    #[error("logit_bias for token {token} must not be NaN, got {value}")]
    LogitBias {
        /// The token whose bias was NaN.
        token: u32,
        /// The offending bias value.
        value: f32,
    },
    /// More than [`MAX_TOP_LOGPROBS`] alternatives were requested.
    #[error("top_logprobs must be at most 20, got {0}")]
    TopLogprobs(usize),
    /// A typical, XTC, DRY or Mirostat number was out of its range.
    #[error("{name} must be {range}, got {value}")]
    Range {
        /// The parameter's name.
        name: &'static str,
        /// The offending value.
        value: f32,
        /// Its valid range, in words.
        range: &'static str,
    },
    /// A DRY sequence breaker was empty or too long.
    #[error("dry_sequence_breakers must be non-empty strings of at most 40 bytes, got {0:?}")]
    DryBreaker(String),
    /// Mirostat was not 0, 1 or 2.
    #[error("mirostat must be 0 (off), 1 or 2, got {0}")]
    Mirostat(u8),
}

/// One sampling step's outcome: the token plus what an OpenAI-style `logprobs` reports.
#[derive(Clone, Debug, PartialEq)]
pub struct Sampled {
    /// The chosen token id.
    pub token: u32,
    /// Natural-log probability of `token` under the model's distribution after
    /// logit bias and penalties but *before* temperature and top-k/top-p/min-p
    /// truncation (what OpenAI's `logprobs` reports), via a stable log-softmax
    /// over the full vocabulary.
    pub logprob: f32,
    /// The `top_logprobs` most likely `(token, logprob)` pairs under that same
    /// distribution, most likely first (ties by lower id); empty when not requested.
    pub top: Vec<(u32, f32)>,
}

/// A seeded, reusable sampler: one per sequence, so each keeps its own rng
/// stream, and its vocabulary-sized scratch buffers are reused across steps.
///
/// [`Sampler::new`] does not validate; call [`SamplingParams::validate`] on
/// untrusted input. Invalid values never panic: they are handled defensively
/// (e.g. a non-positive temperature means greedy, out-of-range filters keep
/// at least the most likely token).
#[derive(Clone)]
pub struct Sampler {
    params: SamplingParams,
    rng: ChaCha8Rng,
    /// Working copy of the logits after bias and penalties.
    logits: Vec<f32>,
    /// Surviving `(token, logit)` candidates during truncation.
    cands: Vec<(u32, f32)>,
    /// Sorted copy of the penalty window, for counting occurrences.
    window: Vec<u32>,
    /// Softmax mass of each `BLOCK` of candidates, so a draw skips whole blocks.
    block_mass: Vec<f64>,
    /// DRY's breakers as tokens (none until [`Sampler::set_dry_breakers`]).
    breakers: Arc<DryBreakers>,
    /// Mirostat's loop, when on.
    mirostat: Option<Mirostat>,
    /// Mirostat's `mu` before the last draw, for [`Sampler::resample`].
    mu_before: f32,
    /// Temperature-scaled logits for Mirostat.
    scaled: Vec<f32>,
}

impl fmt::Debug for Sampler {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Sampler")
            .field("params", &self.params)
            .finish_non_exhaustive()
    }
}

impl Sampler {
    /// Builds a sampler whose rng is seeded from `params.seed`.
    pub fn new(params: SamplingParams) -> Self {
        let rng = ChaCha8Rng::seed_from_u64(params.seed);
        let mirostat = (params.mirostat != 0)
            .then(|| Mirostat::new(params.mirostat, params.mirostat_tau, params.mirostat_eta));
        Self {
            mirostat,
            mu_before: mirostat.map_or(0.0, |m| m.mu),
            params,
            rng,
            logits: Vec::new(),
            cands: Vec::new(),
            window: Vec::new(),
            block_mass: Vec::new(),
            breakers: Arc::default(),
            scaled: Vec::new(),
        }
    }

    /// Gives DRY its sequence breakers (built once per request from the
    /// vocabulary with [`DryBreakers::build`]); without them DRY runs with none.
    pub fn set_dry_breakers(&mut self, breakers: Arc<DryBreakers>) {
        self.breakers = breakers;
    }

    /// Mirostat's current surprise bound `mu`, when Mirostat is on.
    pub fn mirostat_mu(&self) -> Option<f32> {
        self.mirostat.map(|m| m.mu)
    }

    /// Samples again for the same step (e.g. from logits a grammar masked
    /// after refusing the first draw): Mirostat's `mu` goes back to what it
    /// was before that draw, so one step updates it once.
    pub fn resample(&mut self, logits: &[f32], history: &[u32]) -> Sampled {
        if let Some(m) = &mut self.mirostat {
            m.mu = self.mu_before;
        }
        self.sample(logits, history)
    }

    /// The parameters this sampler was built with.
    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    /// Picks the next token from one step's `logits` (one per vocabulary id);
    /// `history` is every token so far (prompt + generated), used by penalties.
    ///
    /// Order as in llama.cpp: logit bias, penalties, DRY, then argmax if
    /// temperature is 0, else top-nσ, top-k, typical, top-p, min-p, XTC,
    /// temperature (dynamic when `dynatemp_range` is set), softmax and one
    /// rng draw (XTC rolls the rng once more first). Under
    /// Mirostat: logit bias, then argmax if temperature is 0, else
    /// temperature and Mirostat's truncation and draw. Typical and XTC apply
    /// at temperature 0 too (the most likely token they leave), as in
    /// llama.cpp's chain.
    /// Empty logits yield token 0 with logprob `-inf`; if every token is
    /// `-inf` (e.g. all banned) the result is token 0 as well.
    pub fn sample(&mut self, logits: &[f32], history: &[u32]) -> Sampled {
        if logits.is_empty() {
            return Sampled {
                token: 0,
                logprob: f32::NEG_INFINITY,
                top: Vec::new(),
            };
        }
        self.logits.clear();
        self.logits.extend_from_slice(logits);
        self.apply_bias();
        if let Some(m) = &self.mirostat {
            self.mu_before = m.mu;
        } else {
            self.apply_penalties(history);
            let dry = self.params.dry();
            if dry.enabled() {
                dry.apply(&mut self.logits, history, &self.breakers);
            }
        }

        // Separate simple passes so each vectorizes; argmax is the first max.
        for l in self.logits.iter_mut() {
            *l = clean(*l);
        }
        let max = max_of(&self.logits);
        let best = self.logits.iter().position(|&l| l == max).unwrap_or(0);
        let lse = log_sum_exp_with_max(&self.logits, max);

        let temperature = self.params.temperature;
        let chain = self.mirostat.is_none() && self.params.sorted_chain();
        let token = if temperature > 0.0 && self.mirostat.is_some() {
            self.draw_mirostat(temperature).unwrap_or(best as u32)
        } else if chain {
            self.draw_chain(temperature).unwrap_or(best as u32)
        } else if temperature > 0.0 {
            self.draw(temperature).unwrap_or(best as u32)
        } else {
            best as u32
        };
        let top = if self.params.top_logprobs > 0 {
            top_n(&self.logits, self.params.top_logprobs)
                .into_iter()
                .map(|(t, l)| (t, log_prob(l, lse)))
                .collect()
        } else {
            Vec::new()
        };
        let logprob = if self.params.tempered_logprobs && temperature > 0.0 && temperature != 1.0 {
            tempered_logprob_of(&self.logits, token, temperature)
        } else {
            log_prob(self.logits[token as usize], lse)
        };
        Sampled {
            token,
            logprob,
            top,
        }
    }

    fn apply_bias(&mut self) {
        for &(token, bias) in &self.params.logit_bias {
            if let Some(l) = self.logits.get_mut(token as usize) {
                *l += bias;
            }
        }
    }

    fn apply_penalties(&mut self, history: &[u32]) {
        let p = &self.params;
        let repeat = p.repetition_penalty;
        let use_repeat = repeat > 0.0 && repeat != 1.0 && repeat.is_finite();
        let use_additive = p.presence_penalty != 0.0 || p.frequency_penalty != 0.0;
        if history.is_empty() || !(use_repeat || use_additive) {
            return;
        }
        let start = match p.penalty_last_n {
            0 => 0,
            n => history.len().saturating_sub(n),
        };
        self.window.clear();
        self.window.extend_from_slice(&history[start..]);
        self.window.sort_unstable();
        for run in self.window.chunk_by(|a, b| a == b) {
            let Some(l) = self.logits.get_mut(run[0] as usize) else {
                continue;
            };
            if use_repeat {
                if *l > 0.0 {
                    *l /= repeat;
                } else {
                    *l *= repeat;
                }
            }
            if use_additive {
                *l -= p.presence_penalty + p.frequency_penalty * run.len() as f32;
            }
        }
    }

    /// Truncates with top-k, top-p and min-p, applies temperature and draws.
    /// `None` when no token has positive weight (every logit is `-inf`).
    fn draw(&mut self, temperature: f32) -> Option<u32> {
        self.cands.clear();
        match self.params.top_k {
            Some(k) if k > 0 && k <= HEAP_TOP_K_MAX => {
                self.cands.extend(best_k(&self.logits, k));
                self.cands.retain(|c| c.1 > f32::NEG_INFINITY);
            }
            top_k => {
                // No filtering here (an exact-size copy is much cheaper): a
                // `-inf` token gets weight exactly 0 below and is never drawn.
                self.cands
                    .extend(self.logits.iter().enumerate().map(|(i, &l)| (i as u32, l)));
                apply_top_k(&mut self.cands, top_k.unwrap_or(0));
            }
        }
        // Top-p and min-p become one cutoff that the weighting masks with.
        let max = max_logit(&self.cands);
        let cut = Cutoff {
            last: top_p_last(&self.cands, self.params.top_p).unwrap_or(Cutoff::ALL.last),
            floor: min_p_floor(max, self.params.min_p),
        };

        // Temperature and softmax: overwrite each logit with its weight (0 for
        // filtered tokens), keeping per-block masses so the draw walks blocks
        // before tokens.
        let inv_t = 1.0 / temperature;
        let mut buf = [0.0f32; BLOCK];
        self.block_mass.clear();
        for block in self.cands.chunks_mut(BLOCK) {
            let w = &mut buf[..block.len()];
            // NaN from (-inf) * 0 (infinite temperature) gets weight 0.
            weigh(w, block, max, inv_t, &cut);
            for (c, &x) in block.iter_mut().zip(w.iter()) {
                c.1 = x;
            }
            self.block_mass.push(lane_sum(w));
        }
        let total: f64 = self.block_mass.iter().sum();
        let r = self.rng.gen::<f64>() * total;
        let mut cum = 0.0f64;
        for (block, &mass) in self.cands.chunks(BLOCK).zip(&self.block_mass) {
            if r < cum + mass {
                for &(token, w) in block {
                    cum += w as f64;
                    if r < cum {
                        return Some(token);
                    }
                }
                // Rounding left `r` past this block's last token: take that token.
                return block.iter().rev().find(|c| c.1 > 0.0).map(|c| c.0);
            }
            cum += mass;
        }
        // Rounding left `r` past the total (or every weight is 0): take the
        // last weighted token, if any.
        self.cands.iter().rev().find(|c| c.1 > 0.0).map(|c| c.0)
    }
}

impl Sampler {
    /// The sorted chain for typical and XTC: top-k, typical, top-p, min-p
    /// and XTC over an explicit candidate list sorted by logit, then the
    /// temperature and one draw; at temperature 0 the best survivor.
    fn draw_chain(&mut self, temperature: f32) -> Option<u32> {
        self.cands.clear();
        // Top-nσ measures the whole distribution, so it comes before top-k.
        let sigma = self.params.top_n_sigma > 0.0;
        match self.params.top_k {
            Some(k) if !sigma && k > 0 && k <= HEAP_TOP_K_MAX => {
                self.cands.extend(best_k(&self.logits, k))
            }
            top_k => {
                self.cands
                    .extend(self.logits.iter().enumerate().map(|(i, &l)| (i as u32, l)));
                if sigma {
                    self.cands.retain(|c| c.1 > f32::NEG_INFINITY);
                    sigma::truncate(&mut self.cands, self.params.top_n_sigma);
                }
                apply_top_k(&mut self.cands, top_k.unwrap_or(0));
            }
        }
        self.cands.retain(|c| c.1 > f32::NEG_INFINITY);
        self.cands.sort_unstable_by(by_logit_desc);
        typical::truncate(&mut self.cands, self.params.typical_p);
        let max = self.cands.first()?.1;
        if let Some(last) = top_p_last_sorted(&self.cands, self.params.top_p) {
            self.cands.truncate(last + 1);
        }
        let floor = min_p_floor(max, self.params.min_p);
        self.cands.retain(|c| c.1 >= floor);
        xtc::truncate(
            &mut self.cands,
            self.params.xtc_probability,
            self.params.xtc_threshold,
            &mut self.rng,
        );
        let top = self.cands.first()?.1;
        if temperature <= 0.0 {
            return Some(self.cands[0].0);
        }
        let temperature = if self.params.dynatemp_range > 0.0 {
            let logits: Vec<f32> = self.cands.iter().map(|c| c.1).collect();
            dynatemp::temperature(
                &logits,
                temperature,
                self.params.dynatemp_range,
                self.params.dynatemp_exponent,
            )
        } else {
            temperature
        };
        if temperature <= 0.0 {
            return Some(self.cands[0].0);
        }
        let inv_t = f64::from(1.0 / temperature);
        let weights = self
            .cands
            .iter()
            .map(|c| (f64::from(c.1 - top) * inv_t).exp());
        let total: f64 = weights.clone().sum();
        let r = self.rng.gen::<f64>() * total;
        Some(pick(&self.cands, weights, r))
    }

    /// Mirostat's step: temperature, the truncation of its version, one
    /// draw from the renormalised rest, and the update of `mu`.
    fn draw_mirostat(&mut self, temperature: f32) -> Option<u32> {
        let mut m = self.mirostat?;
        let inv_t = 1.0 / temperature;
        self.scaled.clear();
        self.scaled
            .extend(self.logits.iter().map(|&l| clean(l * inv_t)));
        let max = max_of(&self.scaled);
        if max == f32::NEG_INFINITY {
            return None;
        }
        self.cands.clear();
        if m.version == 1 {
            let top: Vec<f32> = top_n(&self.scaled, mirostat::V1_M)
                .into_iter()
                .map(|c| c.1)
                .collect();
            let k = m.v1_k(&top, self.scaled.len());
            self.cands.extend(top_n(&self.scaled, k));
        } else {
            let lse = log_sum_exp_with_max(&self.scaled, max);
            let floor = m.v2_floor(lse);
            self.cands.extend(
                self.scaled
                    .iter()
                    .enumerate()
                    .filter(|(_, &l)| f64::from(l) >= floor)
                    .map(|(i, &l)| (i as u32, l)),
            );
            if self.cands.is_empty() {
                self.cands.extend(top_n(&self.scaled, 1));
            }
            self.cands.sort_unstable_by(by_logit_desc);
        }
        self.cands.retain(|c| c.1 > f32::NEG_INFINITY);
        let top = self.cands.first()?.1;
        let weights = self.cands.iter().map(|c| f64::from(c.1 - top).exp());
        let total: f64 = weights.clone().sum();
        let r = self.rng.gen::<f64>() * total;
        let token = pick(&self.cands, weights, r);
        let chosen = self.cands.iter().find(|c| c.0 == token)?.1;
        m.update(f64::from(chosen - top).exp() / total);
        self.mirostat = Some(m);
        Some(token)
    }
}

/// The candidate where the cumulative `weights` pass `r` (the last one
/// with weight when rounding leaves `r` past the total).
fn pick(cands: &[(u32, f32)], weights: impl Iterator<Item = f64>, r: f64) -> u32 {
    let mut cum = 0.0f64;
    let mut last = cands[0].0;
    for (c, w) in cands.iter().zip(weights) {
        if w > 0.0 {
            last = c.0;
        }
        cum += w;
        if r < cum {
            return c.0;
        }
    }
    last
}

/// Top-p over candidates sorted by logit, descending: the index of the
/// token whose (temperature-1) cumulative probability first reaches `p`;
/// `None` keeps everything.
fn top_p_last_sorted(cands: &[(u32, f32)], p: f32) -> Option<usize> {
    if p.is_nan() || p >= 1.0 || cands.len() <= 1 {
        return None;
    }
    let max = cands[0].1;
    let total: f64 = cands.iter().map(|c| f64::from(c.1 - max).exp()).sum();
    let target = f64::from(p) * total;
    let mut cum = 0.0f64;
    cands.iter().position(|c| {
        cum += f64::from(c.1 - max).exp();
        cum >= target
    })
}

/// Natural-log softmax probability of `token` under `logits`, computed stably
/// over the whole slice in O(vocab) without allocating; shared with perplexity.
///
/// NaN logits count as `-inf`; an out-of-range token or an all-`-inf` slice gives `-inf`.
pub fn log_softmax_at(logits: &[f32], token: u32) -> f32 {
    let Some(&l) = logits.get(token as usize) else {
        return f32::NEG_INFINITY;
    };
    let max = logits
        .iter()
        .map(|&x| clean(x))
        .fold(f32::NEG_INFINITY, f32::max);
    log_prob(clean(l), log_sum_exp_with_max(logits, max))
}

/// The log-probability of `token` under `logits` exactly as
/// [`Sampler::sample`] reports it for a sampler with no bias or penalties:
/// the same cleaning, maximum and f64 log-sum-exp, so a learner scoring a
/// sampled sequence again gets the sampler's own number, bit for bit.
pub fn logprob_of(logits: &[f32], token: u32) -> f32 {
    let Some(&picked) = logits.get(token as usize) else {
        return f32::NEG_INFINITY;
    };
    let cleaned: Vec<f32> = logits.iter().map(|&l| clean(l)).collect();
    let lse = log_sum_exp_with_max(&cleaned, max_of(&cleaned));
    log_prob(clean(picked), lse)
}

/// The log-probability of `token` under `softmax(logits / temperature)`:
/// each logit times `1 / temperature` in f32, the maximum of those, and the
/// log-sum-exp in f64. The sampler reports this number when
/// [`SamplingParams::tempered_logprobs`] asks, and the learner computes the
/// same, so a rollout's ratio to pi_old is exactly 1 at any temperature.
/// Temperature 1 is [`logprob_of`].
pub fn tempered_logprob_of(logits: &[f32], token: u32, temperature: f32) -> f32 {
    if temperature == 1.0 {
        return logprob_of(logits, token);
    }
    if token as usize >= logits.len() {
        return f32::NEG_INFINITY;
    }
    let inv = 1.0 / temperature;
    let scaled: Vec<f32> = logits.iter().map(|&l| clean(l) * inv).collect();
    let max = max_of(&scaled);
    if max == f32::NEG_INFINITY {
        return f32::NEG_INFINITY;
    }
    let sum: f64 = scaled.iter().map(|&z| (z as f64 - max as f64).exp()).sum();
    (scaled[token as usize] as f64 - (max as f64 + sum.ln())) as f32
}

/// NaN becomes `-inf` (never chosen); `+inf` becomes `f32::MAX` so softmax stays defined.
fn clean(x: f32) -> f32 {
    if x.is_nan() {
        f32::NEG_INFINITY
    } else if x == f32::INFINITY {
        f32::MAX
    } else {
        x
    }
}

/// `log(sum(exp(l)))` given the (cleaned) maximum, accumulated in f64.
fn log_sum_exp_with_max(logits: &[f32], max: f32) -> f64 {
    if max == f32::NEG_INFINITY {
        return f64::NEG_INFINITY;
    }
    let sum = sum_exp(logits, max);
    max as f64 + sum.ln()
}

/// Items per block in the vectorized exp helpers.
const BLOCK: usize = 64;

/// `sum(e^(l - max))` over cleaned logits. Stable Rust cannot reassociate a
/// float reduction, so a plain running sum stays scalar: instead each block is
/// mapped into a stack buffer (vectorized), summed in eight f32 lanes, and the
/// block sums are accumulated in f64.
fn sum_exp(logits: &[f32], max: f32) -> f64 {
    let mut buf = [0.0f32; BLOCK];
    let mut total = 0.0f64;
    for block in logits.chunks(BLOCK) {
        let e = &mut buf[..block.len()];
        for (o, &l) in e.iter_mut().zip(block) {
            *o = exp_nonpos(clean(l) - max);
        }
        total += lane_sum(e);
    }
    total
}

/// Sum of a short slice in eight independent f32 lanes (so it vectorizes).
fn lane_sum(xs: &[f32]) -> f64 {
    let mut lanes = [0.0f32; 8];
    let chunks = xs.chunks_exact(8);
    let rest: f32 = chunks.remainder().iter().sum();
    for c in chunks {
        for (acc, &v) in lanes.iter_mut().zip(c) {
            *acc += v;
        }
    }
    (lanes.iter().sum::<f32>() + rest) as f64
}

/// Fills `w` with the softmax weights `e^((l - max) * inv_t)` of `block`, 0
/// where `cut` drops the token: a gather then a separate vectorizable exp loop.
fn weigh(w: &mut [f32], block: &[(u32, f32)], max: f32, inv_t: f32, cut: &Cutoff) {
    for (o, c) in w.iter_mut().zip(block) {
        *o = if cut.keeps(c) {
            (c.1 - max) * inv_t
        } else {
            f32::NEG_INFINITY
        };
    }
    for o in w.iter_mut() {
        *o = exp_nonpos(*o);
    }
}

fn max_of(logits: &[f32]) -> f32 {
    logits.iter().copied().fold(f32::NEG_INFINITY, f32::max)
}

/// `e^x` for `x <= 0` (0 below -87 and for NaN), branch-free so loops over the
/// vocabulary vectorize, unlike libm's scalar `expf`. Relative error < 1e-6:
/// `2^n * e^y` with `n = round(x / ln 2)` and a degree-7 Taylor series on `|y| <= 0.35`.
#[inline]
fn exp_nonpos(x: f32) -> f32 {
    // Adding 1.5 * 2^23 rounds to an integer, which lands in the low mantissa bits.
    const MAGIC: f32 = 12_582_912.0;
    const MAGIC_BITS: i32 = 0x4B40_0000;
    let t = (x * std::f32::consts::LOG2_E).clamp(-126.0, 0.0);
    let r = t + MAGIC;
    let n_f = r - MAGIC;
    // Cody-Waite: ln 2 split in two so `x - n ln 2` stays exact for large |x|.
    let y = (x - n_f * 0.693_359_4) + n_f * 2.121_944_4e-4;
    let poly = 1.0
        + y * (1.0
            + y * (1.0 / 2.0
                + y * (1.0 / 6.0
                    + y * (1.0 / 24.0
                        + y * (1.0 / 120.0 + y * (1.0 / 720.0 + y * (1.0 / 5040.0)))))));
    let n = (r.to_bits() as i32).wrapping_sub(MAGIC_BITS);
    let scale = f32::from_bits((n.wrapping_add(127) << 23) as u32);
    if x >= -87.0 {
        poly * scale
    } else {
        0.0
    }
}

fn log_prob(logit: f32, lse: f64) -> f32 {
    if lse == f64::NEG_INFINITY || logit == f32::NEG_INFINITY {
        f32::NEG_INFINITY
    } else {
        (logit as f64 - lse) as f32
    }
}

/// Descending by logit, ties by ascending id, so truncation is deterministic.
fn by_logit_desc(a: &(u32, f32), b: &(u32, f32)) -> Ordering {
    b.1.total_cmp(&a.1).then(a.0.cmp(&b.0))
}

fn max_logit(cands: &[(u32, f32)]) -> f32 {
    cands.iter().map(|c| c.1).fold(f32::NEG_INFINITY, f32::max)
}

/// The `n` largest cleaned logits, descending (ties by lower id).
fn top_n(logits: &[f32], n: usize) -> Vec<(u32, f32)> {
    let mut top = best_k(logits, n);
    top.sort_unstable_by(by_logit_desc);
    top
}

/// Up to this `top_k`, candidates come from one heap scan of the logits
/// instead of materializing the whole vocabulary and partially selecting it.
const HEAP_TOP_K_MAX: usize = 256;

/// A candidate ordered so that the *worse* one is greater: a max-heap of
/// these keeps its worst kept token on top, ready to be replaced.
#[derive(Clone, Copy)]
struct Worst((u32, f32));

impl Ord for Worst {
    fn cmp(&self, other: &Self) -> Ordering {
        by_logit_desc(&self.0, &other.0)
    }
}

impl PartialOrd for Worst {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl PartialEq for Worst {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Worst {}

/// The `k` best cleaned logits in no particular order, by one scan with a
/// size-`k` heap: O(n log k) worst case, and most blocks of tokens are
/// rejected by one vectorized max against the current worst. Same set as a
/// full sort gives.
fn best_k(logits: &[f32], k: usize) -> Vec<(u32, f32)> {
    let k = k.min(logits.len());
    let mut heap: BinaryHeap<Worst> = BinaryHeap::with_capacity(k);
    if k == 0 {
        return Vec::new();
    }
    let mut floor = f32::NEG_INFINITY;
    for (b, block) in logits.chunks(BLOCK).enumerate() {
        // Skip whole blocks that cannot beat the current worst (vectorized max;
        // `f32::max` ignores NaN, which counts as -inf anyway).
        if heap.len() == k && block.iter().copied().fold(f32::NEG_INFINITY, f32::max) < floor {
            continue;
        }
        for (j, &l) in block.iter().enumerate() {
            let c = ((b * BLOCK + j) as u32, clean(l));
            if heap.len() < k {
                heap.push(Worst(c));
                if heap.len() == k {
                    floor = heap.peek().map_or(floor, |w| w.0 .1);
                }
            } else if c.1 >= floor {
                if let Some(mut worst) = heap.peek_mut() {
                    if by_logit_desc(&c, &worst.0) == Ordering::Less {
                        *worst = Worst(c);
                    }
                }
                floor = heap.peek().map_or(floor, |w| w.0 .1);
            }
        }
    }
    heap.into_vec().into_iter().map(|w| w.0).collect()
}

/// Keeps the `k` highest logits with an O(n) partial select; `0` is off.
fn apply_top_k(cands: &mut Vec<(u32, f32)>, k: usize) {
    if k > 0 && k < cands.len() {
        cands.select_nth_unstable_by(k - 1, by_logit_desc);
        cands.truncate(k);
    }
}

/// Buckets used by top-p, each `TOP_P_SPAN / TOP_P_BUCKETS` logits wide.
const TOP_P_BUCKETS: usize = 256;
/// Logit distance below the max that top-p buckets cover; beyond it
/// (`e^-32 ~ 1e-14`) everything shares the last bucket.
const TOP_P_SPAN: f32 = 32.0;

/// What top-p and min-p keep, as thresholds rather than a compacted list: a
/// candidate survives iff `logit >= floor` and it sorts at or before `last`
/// in [`by_logit_desc`] order. The weighting pass masks with it, so neither
/// filter rewrites a vocabulary-sized candidate list.
#[derive(Clone, Copy, Debug)]
struct Cutoff {
    last: (u32, f32),
    floor: f32,
}

impl Cutoff {
    /// Keeps every finite candidate.
    const ALL: Self = Self {
        last: (u32::MAX, f32::NEG_INFINITY),
        floor: f32::NEG_INFINITY,
    };

    fn keeps(&self, c: &(u32, f32)) -> bool {
        // Non-short-circuit `&`/`|` keep this a branch-free select.
        (c.1 >= self.floor) & ((c.1 > self.last.1) | ((c.1 == self.last.1) & (c.0 <= self.last.0)))
    }
}

/// Top-p: the last token of the smallest most-likely set whose
/// (temperature-1) probability mass reaches `p`, the crossing token included;
/// `None` keeps everything. Bucket sort by distance from the max logit, as
/// llama.cpp does for large vocabularies: one O(n) pass sums mass per bucket,
/// and only the crossing bucket's few tokens are sorted.
fn top_p_last(cands: &[(u32, f32)], p: f32) -> Option<(u32, f32)> {
    if p.is_nan() || p >= 1.0 || cands.len() <= 1 {
        return None;
    }
    let max = max_logit(cands);
    let scale = TOP_P_BUCKETS as f32 / TOP_P_SPAN;
    // Distance from the max in bucket units; clamped before the cast, so an
    // infinite distance lands in the last bucket.
    let last = (TOP_P_BUCKETS - 1) as f32;
    let pos = |l: f32| ((max - l) * scale).min(last);
    // Four interleaved histograms: consecutive tokens in the same bucket (the
    // far tail is one bucket) would otherwise serialize on one f64 add chain.
    let mut hist = [[0.0f64; TOP_P_BUCKETS]; 4];
    let mut buf = [0.0f32; BLOCK];
    for block in cands.chunks(BLOCK) {
        let w = &mut buf[..block.len()];
        weigh(w, block, max, 1.0, &Cutoff::ALL);
        for (i, (c, &x)) in block.iter().zip(w.iter()).enumerate() {
            hist[i % 4][pos(c.1) as usize] += x as f64;
        }
    }
    let mut mass = [0.0f64; TOP_P_BUCKETS];
    for (b, m) in mass.iter_mut().enumerate() {
        *m = hist.iter().map(|h| h[b]).sum();
    }
    let target = p as f64 * mass.iter().sum::<f64>();
    let mut before = 0.0f64;
    let mut crossing = None;
    for (b, &m) in mass.iter().enumerate() {
        if before + m >= target {
            crossing = Some(b);
            break;
        }
        before += m;
    }
    // Rounding kept the total just under `target`: keep everything.
    let crossing = crossing?;
    // `floor(x) == c` iff `c <= x < c + 1`, so float compares replace the cast.
    let (lo, hi) = (crossing as f32, crossing as f32 + 1.0);
    // `&`, not `&&`: one well-predicted branch (edge tokens are few).
    let mut edge: Vec<(u32, f32)> = cands
        .iter()
        .filter(|c| {
            let x = pos(c.1);
            (x >= lo) & (x < hi)
        })
        .copied()
        .collect();
    edge.sort_unstable_by(by_logit_desc);
    let mut cum = before;
    let at = edge
        .iter()
        .position(|c| {
            cum += exp_nonpos(c.1 - max) as f64;
            cum >= target
        })
        .unwrap_or(edge.len().saturating_sub(1));
    edge.get(at).copied()
}

/// Min-p: the logit floor `max + ln(min_p)` below which a token's probability
/// is under `min_p` times the best one's; `-inf` (keep all) when off. The best
/// token always survives.
fn min_p_floor(max: f32, min_p: f32) -> f32 {
    if min_p.is_nan() || min_p <= 0.0 {
        f32::NEG_INFINITY
    } else {
        max + min_p.min(1.0).ln()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Deterministic pseudo-random logits in roughly [-8, 8).
    fn logits(n: usize, seed: u64) -> Vec<f32> {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        (0..n).map(|_| rng.gen_range(-8.0f32..8.0)).collect()
    }

    fn argmax(xs: &[f32]) -> u32 {
        let mut best = 0;
        for (i, &x) in xs.iter().enumerate() {
            if x > xs[best] {
                best = i;
            }
        }
        best as u32
    }

    fn params(f: impl FnOnce(&mut SamplingParams)) -> SamplingParams {
        let mut p = SamplingParams::default();
        f(&mut p);
        p
    }

    /// The candidates top-p keeps, via the same cutoff the sampler masks with.
    fn cut_top_p(cands: &[(u32, f32)], p: f32) -> Vec<(u32, f32)> {
        let cut = Cutoff {
            last: top_p_last(cands, p).unwrap_or(Cutoff::ALL.last),
            ..Cutoff::ALL
        };
        cands.iter().filter(|c| cut.keeps(c)).copied().collect()
    }

    fn draws(p: SamplingParams, logits: &[f32], n: usize) -> Vec<u32> {
        let mut s = Sampler::new(p);
        (0..n).map(|_| s.sample(logits, &[]).token).collect()
    }

    #[test]
    fn tempered_logprobs_are_those_of_the_drawn_distribution() {
        let l = logits(1000, 3);
        let t = 0.6f32;
        let plain = Sampler::new(params(|p| p.temperature = t)).sample(&l, &[]);
        let tempered = Sampler::new(params(|p| {
            p.temperature = t;
            p.tempered_logprobs = true;
        }))
        .sample(&l, &[]);
        // The same draw; only the reported number differs.
        assert_eq!(plain.token, tempered.token);
        assert_eq!(plain.logprob, logprob_of(&l, plain.token));
        assert_eq!(tempered.logprob, tempered_logprob_of(&l, plain.token, t));
        // log softmax(l / t) at the drawn token, computed in f64.
        let z: Vec<f64> = l.iter().map(|&x| (x * (1.0 / t)) as f64).collect();
        let m = z.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let lse = m + z.iter().map(|x| (x - m).exp()).sum::<f64>().ln();
        let want = z[plain.token as usize] - lse;
        assert!((tempered.logprob as f64 - want).abs() < 1e-5, "{}", want);
        assert_ne!(tempered.logprob, plain.logprob);
        // At temperature 1 the flag changes nothing.
        assert_eq!(tempered_logprob_of(&l, 7, 1.0), logprob_of(&l, 7));
    }

    #[test]
    fn greedy_picks_argmax_deterministically() {
        let l = logits(49_152, 1);
        let want = argmax(&l);
        let a = draws(SamplingParams::greedy(), &l, 5);
        assert!(a.iter().all(|&t| t == want));
        let b = draws(params(|p| p.temperature = 0.0), &l, 5);
        assert_eq!(a, b);
        // Ties break toward the lower id.
        let s = Sampler::new(SamplingParams::greedy()).sample(&[1.0, 3.0, 3.0], &[]);
        assert_eq!(s.token, 1);
    }

    #[test]
    fn same_seed_same_sequence_different_seed_differs() {
        let l = logits(1000, 2);
        let soft = |seed| params(|p| p.seed = seed);
        let a = draws(soft(7), &l, 100);
        assert_eq!(a, draws(soft(7), &l, 100));
        assert_ne!(a, draws(soft(8), &l, 100));
        // A cloned sampler continues the same stream.
        let mut s = Sampler::new(soft(7));
        s.sample(&l, &[]);
        let mut c = s.clone();
        assert_eq!(s.sample(&l, &[]), c.sample(&l, &[]));
    }

    #[test]
    fn top_k_one_is_greedy_at_any_temperature() {
        let l = logits(5000, 3);
        let want = argmax(&l);
        for t in [0.1, 1.0, 5.0, 1000.0] {
            let p = params(|p| {
                p.temperature = t;
                p.top_k = Some(1);
                p.seed = 11;
            });
            assert!(draws(p, &l, 50).iter().all(|&x| x == want), "t={t}");
        }
    }

    #[test]
    fn top_k_keeps_the_k_best() {
        let l = logits(5000, 4);
        let mut sorted: Vec<f32> = l.clone();
        sorted.sort_by(|a, b| b.total_cmp(a));
        // Below and above HEAP_TOP_K_MAX: the heap and the partial-select paths.
        for k in [10, 500] {
            let kth = sorted[k - 1];
            let p = params(|p| {
                p.top_k = Some(k);
                p.temperature = 50.0;
            });
            let got = draws(p, &l, 500);
            assert!(got.iter().all(|&t| l[t as usize] >= kth), "k={k}");
            assert!(got.iter().any(|&t| l[t as usize] > kth), "k={k}");
        }
        // Fewer finite logits than k: banned tokens stay banned.
        let few = [1.0f32, f32::NEG_INFINITY, 0.5, f32::NAN];
        let p = params(|p| p.top_k = Some(3));
        assert!(draws(p, &few, 200).iter().all(|&t| t == 0 || t == 2));
    }

    #[test]
    fn best_k_matches_full_sort() {
        // Coarse values force ties; NaNs count as -inf; ascending order is the
        // heap's worst case.
        let mut tied: Vec<f32> = logits(3000, 15).iter().map(|x| x.round()).collect();
        tied[17] = f32::NAN;
        let ascending: Vec<f32> = (0..3000).map(|i| i as f32 * 0.01).collect();
        for l in [tied, ascending] {
            let mut full: Vec<(u32, f32)> = l
                .iter()
                .enumerate()
                .map(|(i, &x)| (i as u32, clean(x)))
                .collect();
            full.sort_by(by_logit_desc);
            for k in [1, 2, 7, 64, 65, 256, 2999, 3000, 5000] {
                assert_eq!(top_n(&l, k), full[..k.min(l.len())].to_vec(), "k={k}");
                let mut sel = full.clone();
                apply_top_k(&mut sel, k);
                sel.sort_by(by_logit_desc);
                assert_eq!(sel, full[..k.min(l.len())].to_vec(), "k={k}");
            }
        }
    }

    #[test]
    fn tiny_top_p_keeps_only_the_top_token() {
        let l = logits(49_152, 5);
        let want = argmax(&l);
        let p = params(|p| {
            p.top_p = 1e-6;
            p.temperature = 10.0;
        });
        assert!(draws(p, &l, 100).iter().all(|&t| t == want));
    }

    #[test]
    fn top_p_matches_full_sort_reference() {
        for (seed, n) in [(6u64, 3usize), (7, 200), (8, 5000), (9, 49_152)] {
            let l: Vec<f32> = logits(n, seed).iter().map(|x| x * 0.3).collect();
            for p in [0.05f32, 0.3, 0.5, 0.9, 0.99, 0.999_99] {
                let mut sorted: Vec<(u32, f32)> =
                    l.iter().enumerate().map(|(i, &x)| (i as u32, x)).collect();
                sorted.sort_by(by_logit_desc);
                let z: f64 = sorted.iter().map(|c| (c.1 as f64).exp()).sum();
                let mut cum = 0.0;
                let mut keep = sorted.len();
                for (i, c) in sorted.iter().enumerate() {
                    cum += (c.1 as f64).exp() / z;
                    if cum >= p as f64 {
                        keep = i + 1;
                        break;
                    }
                }
                let mut got = sorted.clone();
                got.reverse();
                let got = cut_top_p(&got, p);
                // Summation order differs: allow one token of slack at the edge.
                let diff = got.len().abs_diff(keep);
                assert!(diff <= 1, "n={n} p={p}: {} vs {keep}", got.len());
                // Whatever the size, the kept set is exactly the most likely tokens.
                let mut got_ids: Vec<u32> = got.iter().map(|c| c.0).collect();
                let mut want_ids: Vec<u32> = sorted[..got.len()].iter().map(|c| c.0).collect();
                got_ids.sort_unstable();
                want_ids.sort_unstable();
                assert_eq!(got_ids, want_ids, "n={n} p={p}");
            }
        }
        // A flat distribution puts everything in one bucket: still exact.
        let flat: Vec<(u32, f32)> = (0..100).map(|i| (i, 0.0)).collect();
        let flat = cut_top_p(&flat, 0.5);
        let mut ids: Vec<u32> = flat.iter().map(|c| c.0).collect();
        ids.sort_unstable();
        assert_eq!(ids, (0..50).collect::<Vec<u32>>());
    }

    #[test]
    fn exp_nonpos_matches_libm() {
        for i in 0..=200_000 {
            let x = -87.0 * i as f32 / 200_000.0;
            let want = (x as f64).exp();
            let got = exp_nonpos(x) as f64;
            assert!(((got - want) / want).abs() < 1e-6, "x={x}: {got} vs {want}");
        }
        assert_eq!(exp_nonpos(0.0), 1.0);
        assert_eq!(exp_nonpos(-100.0), 0.0);
        assert_eq!(exp_nonpos(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp_nonpos(f32::NAN), 0.0);
    }

    #[test]
    fn min_p_one_keeps_only_the_max() {
        let l = logits(49_152, 10);
        let want = argmax(&l);
        let p = params(|p| {
            p.min_p = 1.0;
            p.temperature = 100.0;
        });
        assert!(draws(p, &l, 100).iter().all(|&t| t == want));
        // A moderate min_p keeps exactly the tokens above the ratio.
        let cut = Cutoff {
            floor: min_p_floor(0.0, 0.2), // ln 0.2 = -1.609
            ..Cutoff::ALL
        };
        let c: Vec<(u32, f32)> = [(0, 0.0), (1, -1.0), (2, -3.0)]
            .into_iter()
            .filter(|c| cut.keeps(c))
            .collect();
        assert_eq!(c.iter().map(|c| c.0).collect::<Vec<_>>(), vec![0, 1]);
    }

    #[test]
    fn logit_bias_forces_and_bans() {
        let l = logits(2000, 12);
        let force = params(|p| {
            p.logit_bias = vec![(1234, 100.0)];
            p.temperature = 1.5;
        });
        assert!(draws(force, &l, 100).iter().all(|&t| t == 1234));

        let small = [2.0f32, 1.0, 0.5];
        for ban in [f32::NEG_INFINITY, -100.0] {
            // Through every truncation path, including infinite temperature.
            for (top_k, top_p, temperature) in [
                (None, 1.0, 1.0),
                (None, 0.999, 1.0),
                (Some(3), 1.0, 1.0),
                (Some(1000), 0.999, 1.0),
                (None, 1.0, f32::INFINITY),
            ] {
                if ban > f32::NEG_INFINITY && temperature == f32::INFINITY {
                    continue; // a finite bias is flattened away by infinite temperature
                }
                let p = params(|p| {
                    p.logit_bias = vec![(0, ban), (99_999, 5.0)]; // out of range ignored
                    p.seed = 3;
                    p.top_k = top_k;
                    p.top_p = top_p;
                    p.temperature = temperature;
                });
                let got = draws(p, &small, 500);
                assert!(got.iter().all(|&t| t != 0), "ban={ban} {top_k:?} {top_p}");
            }
            let g = params(|p| {
                p.logit_bias = vec![(0, ban)];
                p.temperature = 0.0;
            });
            assert_eq!(draws(g, &small, 1), vec![1]);
        }
    }

    #[test]
    fn repetition_penalty_discourages_seen_tokens() {
        // Greedy would repeat token 0 (seen) without a penalty.
        let l = [2.0f32, 1.9, 0.5];
        let mut plain = Sampler::new(SamplingParams::greedy());
        assert_eq!(plain.sample(&l, &[0, 2]).token, 0);
        let mut pen = Sampler::new(params(|p| {
            p.temperature = 0.0;
            p.repetition_penalty = 1.5;
        }));
        let s = pen.sample(&l, &[0, 2]);
        assert_eq!(s.token, 1);
        // The seen token's probability went down.
        let before = log_softmax_at(&l, 0);
        let mut lp = Sampler::new(params(|p| {
            p.repetition_penalty = 1.5;
            p.top_logprobs = 3;
        }));
        let top = lp.sample(&l, &[0]).top;
        let after = top.iter().find(|t| t.0 == 0).map(|t| t.1);
        assert!(after.is_some_and(|a| a < before));

        // Negative logits are multiplied, pushing them further down.
        let neg = [-1.0f32, -1.1];
        let mut pen = Sampler::new(params(|p| {
            p.temperature = 0.0;
            p.repetition_penalty = 1.2;
        }));
        assert_eq!(pen.sample(&neg, &[0]).token, 1);

        // The window only sees the last `penalty_last_n` tokens.
        let mut windowed = Sampler::new(params(|p| {
            p.temperature = 0.0;
            p.repetition_penalty = 1.5;
            p.penalty_last_n = 1;
        }));
        assert_eq!(windowed.sample(&l, &[0, 2]).token, 0);
        let mut whole = Sampler::new(params(|p| {
            p.temperature = 0.0;
            p.repetition_penalty = 1.5;
            p.penalty_last_n = 0;
        }));
        let mut long = vec![2u32; 501];
        long[0] = 0;
        assert_eq!(whole.sample(&l, &long).token, 1);
    }

    #[test]
    fn presence_and_frequency_penalties_use_counts() {
        let l = [1.0f32, 0.0, 0.0, 0.0];
        let mut s = Sampler::new(params(|p| {
            p.temperature = 0.0;
            p.presence_penalty = 0.5;
            p.frequency_penalty = 0.25;
            p.top_logprobs = 4;
        }));
        // Token 0 seen 3 times, token 1 once, 99_999 out of range (ignored).
        let out = s.sample(&l, &[0, 1, 0, 99_999, 0]);
        let adjusted = [1.0 - 0.5 - 0.75, 0.0 - 0.5 - 0.25, 0.0, 0.0];
        assert_eq!(out.token, 2);
        assert_eq!(out.top.len(), 4);
        for &(t, lp) in &out.top {
            let want = log_softmax_at(&adjusted, t);
            assert!((lp - want).abs() < 1e-5, "token {t}: {lp} vs {want}");
        }
        assert_eq!(
            out.top.iter().map(|t| t.0).collect::<Vec<_>>(),
            [2, 3, 0, 1]
        );
    }

    #[test]
    fn empirical_frequencies_match_softmax() {
        let l = [1.0f32, 0.0, -0.5];
        let n = 5000;
        let mut counts = [0usize; 3];
        for t in draws(params(|p| p.seed = 42), &l, n) {
            counts[t as usize] += 1;
        }
        for (i, &c) in counts.iter().enumerate() {
            let want = log_softmax_at(&l, i as u32).exp();
            let got = c as f32 / n as f32;
            assert!((got - want).abs() < 0.03, "token {i}: {got} vs {want}");
        }
    }

    #[test]
    fn logprob_is_pre_temperature_log_softmax() {
        let l = logits(49_152, 13);
        let mut s = Sampler::new(params(|p| {
            p.temperature = 0.7;
            p.top_k = Some(40);
            p.top_p = 0.9;
            p.seed = 5;
        }));
        for _ in 0..20 {
            let out = s.sample(&l, &[]);
            let want = log_softmax_at(&l, out.token);
            assert!((out.logprob - want).abs() < 1e-5);
            assert!(out.top.is_empty());
        }
        // With bias the reference is the biased distribution.
        let mut b = l.clone();
        b[7] += 3.0;
        let mut s = Sampler::new(params(|p| {
            p.logit_bias = vec![(7, 3.0)];
            p.temperature = 0.0;
        }));
        let out = s.sample(&l, &[]);
        assert!((out.logprob - log_softmax_at(&b, out.token)).abs() < 1e-5);
    }

    #[test]
    fn top_logprobs_sorted_and_sized() {
        let l = logits(49_152, 14);
        for k in [1usize, 5, 20] {
            let mut s = Sampler::new(params(|p| p.top_logprobs = k));
            let out = s.sample(&l, &[]);
            assert_eq!(out.top.len(), k);
            assert!(out.top.windows(2).all(|w| w[0].1 >= w[1].1));
            assert_eq!(out.top[0].0, argmax(&l));
            let mut sorted = l.clone();
            sorted.sort_by(|a, b| b.total_cmp(a));
            for (i, &(t, lp)) in out.top.iter().enumerate() {
                assert_eq!(l[t as usize], sorted[i]);
                assert!((lp - log_softmax_at(&l, t)).abs() < 1e-5);
            }
        }
        // Asking for more than the vocabulary returns the whole vocabulary.
        let mut s = Sampler::new(params(|p| p.top_logprobs = 20));
        assert_eq!(s.sample(&[0.0, 1.0], &[]).top.len(), 2);
    }

    #[test]
    fn log_softmax_at_is_stable() {
        let l = [1000.0f32, 0.0, -1000.0];
        assert!(log_softmax_at(&l, 0).abs() < 1e-6);
        assert!((log_softmax_at(&l, 1) + 1000.0).abs() < 1e-3);
        let u = [5.0f32; 4];
        assert!((log_softmax_at(&u, 2) - (0.25f32).ln()).abs() < 1e-6);
        assert_eq!(log_softmax_at(&u, 4), f32::NEG_INFINITY);
        assert_eq!(log_softmax_at(&[], 0), f32::NEG_INFINITY);
        assert_eq!(log_softmax_at(&[f32::NAN, 0.0], 0), f32::NEG_INFINITY);
        assert_eq!(log_softmax_at(&[f32::NAN, 0.0], 1), 0.0);
    }

    #[test]
    fn nan_and_degenerate_logits_do_not_panic() {
        let l = [f32::NAN, 1.0, f32::NAN, 0.5];
        for p in [SamplingParams::greedy(), params(|p| p.top_logprobs = 4)] {
            let mut s = Sampler::new(p);
            for _ in 0..50 {
                let out = s.sample(&l, &[0, 2]);
                assert!(out.token == 1 || out.token == 3);
                assert!(out.logprob.is_finite());
            }
        }
        let all_nan = [f32::NAN; 3];
        let out = Sampler::new(SamplingParams::default()).sample(&all_nan, &[]);
        assert_eq!((out.token, out.logprob), (0, f32::NEG_INFINITY));
        let out = Sampler::new(SamplingParams::greedy()).sample(&[], &[]);
        assert_eq!(out.token, 0);
        let inf = [0.0, f32::INFINITY, 1.0];
        let out = Sampler::new(SamplingParams::default()).sample(&inf, &[]);
        assert_eq!(out.token, 1);
        assert!(out.logprob.abs() < 1e-6);
        // Invalid (unvalidated) parameters are handled defensively.
        let bad = params(|p| {
            p.temperature = f32::INFINITY;
            p.top_p = f32::NAN;
            p.min_p = 7.0;
            p.repetition_penalty = -1.0;
        });
        let out = Sampler::new(bad).sample(&[0.0, 1.0, f32::NEG_INFINITY], &[1]);
        assert!(out.token < 2);
    }

    #[test]
    fn validate_rejects_bad_values() {
        assert_eq!(SamplingParams::default().validate(), Ok(()));
        assert_eq!(SamplingParams::greedy().validate(), Ok(()));
        let cases: Vec<(SamplingParams, &str)> = vec![
            (params(|p| p.temperature = f32::NAN), "temperature"),
            (params(|p| p.temperature = -0.5), "temperature"),
            (params(|p| p.top_p = 0.0), "top_p"),
            (params(|p| p.top_p = 1.5), "top_p"),
            (params(|p| p.min_p = -0.1), "min_p"),
            (params(|p| p.min_p = 1.1), "min_p"),
            (params(|p| p.repetition_penalty = 0.0), "repetition_penalty"),
            (
                params(|p| p.presence_penalty = f32::NAN),
                "presence_penalty",
            ),
            (
                params(|p| p.frequency_penalty = f32::INFINITY),
                "frequency_penalty",
            ),
            (params(|p| p.logit_bias = vec![(3, f32::NAN)]), "logit_bias"),
            (params(|p| p.top_logprobs = 21), "top_logprobs"),
        ];
        for (p, name) in cases {
            let err = p.validate().expect_err(name);
            let msg = err.to_string();
            assert!(msg.contains(name), "{msg}");
        }
        let msg = params(|p| p.top_p = 1.5)
            .validate()
            .unwrap_err()
            .to_string();
        assert!(msg.contains("1.5"), "{msg}");
        let msg = params(|p| p.top_logprobs = 21)
            .validate()
            .unwrap_err()
            .to_string();
        assert!(msg.contains("21"), "{msg}");
        assert_eq!(
            params(|p| p.top_logprobs = 20).validate(),
            Ok(()),
            "20 is allowed"
        );
    }

    /// Logits with the given probabilities (ids in order).
    fn from_probs(probs: &[f32]) -> Vec<f32> {
        probs.iter().map(|p| p.ln()).collect()
    }

    #[test]
    fn xtc_at_probability_one_never_draws_the_top_choices() {
        // 0.35, 0.3 and 0.2 are above the 0.1 threshold: only the least
        // likely of them (id 2) and the tail below it remain.
        let l = from_probs(&[0.35, 0.3, 0.2, 0.1, 0.05]);
        let p = params(|p| {
            p.xtc_probability = 1.0;
            p.xtc_threshold = 0.1;
            p.seed = 4;
        });
        let d = draws(p.clone(), &l, 500);
        assert!(d.iter().all(|&t| t >= 2), "{d:?}");
        assert!(d.contains(&2) && d.contains(&3));
        // Greedy takes the best survivor, as llama.cpp's chain does.
        let g = draws(
            params(|q| {
                *q = SamplingParams {
                    temperature: 0.0,
                    ..p.clone()
                }
            }),
            &l,
            5,
        );
        assert_eq!(g, vec![2; 5]);
        // Off, the top token is drawn often.
        let off = draws(params(|q| q.seed = 4), &l, 500);
        assert!(off.iter().filter(|&&t| t == 0).count() > 100);
    }

    #[test]
    fn top_n_sigma_draws_only_from_the_tokens_that_stand_out() {
        // See sigma.rs: n = 0.5 keeps ids 0 and 1; temperature 5 would
        // otherwise reach the rest.
        let l = [10.0, 9.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0];
        let hot = |p: &mut SamplingParams| p.temperature = 5.0;
        let d = draws(
            params(|p| {
                hot(p);
                p.top_n_sigma = 0.5
            }),
            &l,
            400,
        );
        assert!(d.iter().all(|&t| t <= 1) && d.contains(&0) && d.contains(&1));
        assert!(draws(params(hot), &l, 400).iter().any(|&t| t > 1));
    }

    #[test]
    fn dynamic_temperature_draws_at_the_entropys_temperature() {
        // Odds 3:1 at temperature 1, range 0.5: dynamic temperature
        // 0.5 + 0.811 = 1.311 (dynatemp.rs), so token 0 comes 3^(1/1.311)
        // : 1, about 69.8% of draws, where plain sampling gives 75%.
        let l = [3f32.ln(), 0.0];
        let n = 6000;
        let share = |p: SamplingParams| {
            draws(p, &l, n).iter().filter(|&&t| t == 0).count() as f64 / n as f64
        };
        let dynamic = share(params(|p| p.dynatemp_range = 0.5));
        let plain = share(params(|_| {}));
        assert!((dynamic - 0.698).abs() < 0.02, "{dynamic}");
        assert!((plain - 0.75).abs() < 0.02, "{plain}");
    }

    #[test]
    fn typical_p_draws_only_tokens_near_the_entropy() {
        // See typical.rs: p = 0.3 keeps ids 1 and 2, never the top id 0.
        let l = from_probs(&[0.5, 0.2, 0.2, 0.05, 0.05]);
        let d = draws(params(|p| p.typical_p = 0.3), &l, 400);
        assert!(d.iter().all(|&t| t == 1 || t == 2), "{d:?}");
        assert!(d.contains(&1) && d.contains(&2));
    }

    #[test]
    fn dry_turns_greedy_away_from_extending_a_repeat() {
        // Token 4 is best, but "1 2 3 4" already occurred and the history
        // ends in "1 2 3": DRY (1.0 * 1.75^(3 - 2) = 1.75) puts 5 ahead.
        let mut l = vec![0.0f32; 10];
        l[4] = 2.0;
        l[5] = 1.0;
        let history = [1, 2, 3, 4, 9, 8, 1, 2, 3];
        let plain = Sampler::new(SamplingParams::greedy()).sample(&l, &history);
        assert_eq!(plain.token, 4);
        let mut dry = Sampler::new(params(|p| {
            p.temperature = 0.0;
            p.dry_multiplier = 1.0;
        }));
        assert_eq!(dry.sample(&l, &history).token, 5);
        // With token 3 a breaker, the repeat is cut and 4 stays best.
        dry.set_dry_breakers(Arc::new(DryBreakers::from_sequences(&[vec![3]])));
        assert_eq!(dry.sample(&l, &history).token, 4);
    }

    #[test]
    fn mirostat_adapts_mu_and_its_tau_sets_the_surprise() {
        // Zipf-like logits over 2000 tokens.
        let l: Vec<f32> = (0..2000).map(|i| -1.2 * ((i as f32) + 1.0).ln()).collect();
        let lse = log_sum_exp_with_max(&l, max_of(&l));
        let mean_surprise = |version: u8, tau: f32| {
            let mut s = Sampler::new(params(|p| {
                p.mirostat = version;
                p.mirostat_tau = tau;
                p.mirostat_eta = 0.1;
                p.seed = 11;
            }));
            assert_eq!(s.mirostat_mu(), Some(2.0 * tau));
            let d: Vec<u32> = (0..600).map(|_| s.sample(&l, &[]).token).collect();
            let mu = s.mirostat_mu().unwrap();
            assert!(
                (mu - 2.0 * tau).abs() > 0.1,
                "v{version}: mu stayed at {mu}"
            );
            d[100..]
                .iter()
                .map(|&t| -(f64::from(l[t as usize]) - lse) / std::f64::consts::LN_2)
                .sum::<f64>()
                / 500.0
        };
        for v in [1, 2] {
            let (low, high) = (mean_surprise(v, 2.0), mean_surprise(v, 6.0));
            assert!(
                low + 1.5 < high,
                "v{v}: tau 2 -> {low:.2} bits, tau 6 -> {high:.2}"
            );
        }
    }

    #[test]
    fn resample_updates_mirostat_once_per_step() {
        // One token holds all the mass: each draw has surprise 0, so one
        // update raises mu by eta * tau (5 * 0.1 from 10).
        let mut l = vec![-200.0f32; 50];
        l[7] = 0.0;
        let mut s = Sampler::new(params(|p| p.mirostat = 2));
        assert_eq!(s.sample(&l, &[]).token, 7);
        assert!((s.mirostat_mu().unwrap() - 10.5).abs() < 1e-5);
        assert_eq!(s.resample(&l, &[]).token, 7);
        assert!(
            (s.mirostat_mu().unwrap() - 10.5).abs() < 1e-5,
            "{:?}",
            s.mirostat_mu()
        );
        s.sample(&l, &[]);
        assert!((s.mirostat_mu().unwrap() - 11.0).abs() < 1e-5);
    }

    #[test]
    fn new_samplers_stay_deterministic_under_a_seed() {
        let l = logits(3000, 5);
        let history: Vec<u32> = (0..200).map(|i| (i * 7 % 50) as u32).collect();
        for f in [
            (|p: &mut SamplingParams| p.typical_p = 0.9) as fn(&mut SamplingParams),
            |p| p.xtc_probability = 0.5,
            |p| p.dry_multiplier = 0.8,
            |p| p.mirostat = 1,
            |p| p.mirostat = 2,
        ] {
            let p = params(|p| {
                p.seed = 21;
                f(p);
            });
            let run = |p: SamplingParams| {
                let mut s = Sampler::new(p);
                (0..50)
                    .map(|_| s.sample(&l, &history).token)
                    .collect::<Vec<_>>()
            };
            assert_eq!(run(p.clone()), run(p.clone()), "{p:?}");
        }
    }

    #[test]
    fn new_samplers_validate_their_ranges() {
        for (p, name) in [
            (params(|p| p.typical_p = 1.5), "typical_p"),
            (params(|p| p.xtc_probability = -0.1), "xtc_probability"),
            (params(|p| p.xtc_threshold = 2.0), "xtc_threshold"),
            (params(|p| p.dry_multiplier = -1.0), "dry_multiplier"),
            (params(|p| p.dry_base = 0.5), "dry_base"),
            (
                params(|p| p.dry_sequence_breakers = vec![String::new()]),
                "dry_sequence_breakers",
            ),
            (params(|p| p.mirostat = 3), "mirostat"),
            (params(|p| p.mirostat_tau = f32::NAN), "mirostat_tau"),
            (params(|p| p.mirostat_eta = -0.1), "mirostat_eta"),
        ] {
            let msg = p.validate().expect_err(name).to_string();
            assert!(msg.contains(name), "{msg}");
        }
    }

    #[test]
    fn params_round_trip_through_json() {
        let p = params(|p| {
            p.top_k = Some(40);
            p.logit_bias = vec![(5, -1.5)];
            p.seed = 99;
        });
        let json = serde_json::to_string(&p).expect("serialize");
        let back: SamplingParams = serde_json::from_str(&json).expect("deserialize");
        assert_eq!(back, p);
        let partial: SamplingParams =
            serde_json::from_str(r#"{"temperature":0.0,"seed":3}"#).expect("partial");
        assert_eq!(partial.penalty_last_n, 64);
        assert_eq!(partial.seed, 3);
        assert_eq!(partial.temperature, 0.0);
    }
}
