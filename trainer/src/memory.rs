//! The memory cap: an estimate of each phase's peak, a plan that fits the cap
//! (learner micro-batch, rollout KV), and the measured peak (`VmHWM`) checked
//! after every phase so a run stops with a message instead of growing past it.

use tern_models::ModelConfig;
use tern_runtime::size::format_size;

use crate::error::{Result, TrainError};
use crate::logprob::CHUNK;

/// Bytes of the process before any model is loaded (binary, allocator,
/// thread stacks), measured on this project's builds.
pub const BASE_BYTES: u64 = 48 << 20;
/// Share of the cap plans may use; the rest absorbs allocator slack.
pub const PLAN_SHARE: f64 = 0.85;

/// What one phase is expected to need at its peak.
#[derive(Clone, Debug, PartialEq)]
pub struct Estimate {
    /// Dense f32 weights of the learner.
    pub learner_weights: u64,
    /// The rollout engine's quantized weights.
    pub rollout_weights: u64,
    /// Parameters, gradients and AdamW moments of what is trained.
    pub trainable_state: u64,
    /// Activations kept for the backward pass, per token of a micro-batch.
    pub activation_per_token: u64,
}

impl Estimate {
    /// Estimates from the model's shape, its GGUF size and the trainable count.
    pub fn new(cfg: &ModelConfig, gguf_bytes: u64, trainable_params: u64) -> Estimate {
        let (d, f, kvd, l) = (
            cfg.n_embd as u64,
            cfg.n_ff as u64,
            (cfg.n_kv_head * cfg.head_dim) as u64,
            cfg.n_layer as u64,
        );
        let params = tern_models::arch::parameter_count(cfg);
        Estimate {
            learner_weights: params * 4,
            rollout_weights: gguf_bytes,
            // value, accumulated gradient, two moments, one transient gradient
            trainable_state: trainable_params * 4 * 5,
            // f32 values alive per token and layer at the backward's peak (the
            // forward's saved tensors plus the gradients in flight): about 55 of
            // width D, 11 of width F and the K/V rows. Calibrated on SmolLM2-135M
            // (6 MB per token) and the tiny test model.
            activation_per_token: l * 4 * (55 * d + 11 * f + 4 * kvd),
        }
    }

    /// Peak while loading: both models plus one f32 copy of the embedding
    /// being dequantized.
    pub fn load_peak(&self, cfg: &ModelConfig) -> u64 {
        BASE_BYTES
            + self.learner_weights
            + self.rollout_weights
            + (cfg.vocab_size * cfg.n_embd * 4) as u64
    }

    /// Peak of a learner pass over `tokens` tokens in sequences of at most
    /// `seq_len`: fixed state, activations, attention rows and logit chunks.
    pub fn learner_peak(&self, cfg: &ModelConfig, tokens: u64, seq_len: u64) -> u64 {
        let attn = cfg.n_layer as u64 * cfg.n_head as u64 * seq_len * tokens * 4 * 4;
        let logits = tokens * CHUNK as u64 * 4 * 3;
        BASE_BYTES
            + self.learner_weights
            + self.rollout_weights
            + self.trainable_state
            + self.activation_per_token * tokens
            + attn
            + logits
    }
}

/// How the run fits its cap.
#[derive(Clone, Debug, PartialEq)]
pub struct Plan {
    /// The cap, if any.
    pub cap: Option<u64>,
    /// Sequences per learner micro-batch.
    pub micro_batch: usize,
    /// KV bytes the rollout engine may hold at once.
    pub rollout_kv_bytes: usize,
    /// The learner phase's estimated peak at that micro-batch.
    pub learner_peak: u64,
    /// Rollout sequences the engine can decode at once in that KV memory
    /// under the run's policy (filled in by the caller, who knows the policy).
    pub rollout_at_once: usize,
}

/// Picks the micro-batch (largest up to `max_micro` or the forced one) and the
/// rollout KV budget that fit `cap`; refuses with the phase that cannot fit.
#[allow(clippy::too_many_arguments)]
pub fn plan(
    cfg: &ModelConfig,
    est: &Estimate,
    cap: Option<u64>,
    seq_len: usize,
    max_micro: usize,
    forced_micro: Option<usize>,
    rollout_kv_full: usize,
) -> Result<Plan> {
    let seq = seq_len as u64;
    let peak_for = |m: usize| est.learner_peak(cfg, m as u64 * seq, seq);
    let Some(cap) = cap else {
        let m = forced_micro.unwrap_or(max_micro.min(4));
        return Ok(Plan {
            cap: None,
            micro_batch: m,
            rollout_kv_bytes: rollout_kv_full.max(1 << 20),
            learner_peak: peak_for(m),
            rollout_at_once: 0,
        });
    };
    let usable = (cap as f64 * PLAN_SHARE) as u64;
    let refuse = |phase: &'static str, needed: u64, advice: &str| TrainError::MemoryCap {
        cap: format_size(cap as usize),
        phase,
        needed: format_size(needed as usize),
        advice: advice.to_string(),
    };
    if est.load_peak(cfg) > usable {
        return Err(refuse(
            "loading the weights (learner f32 + rollout model)",
            est.load_peak(cfg),
            "raise --memory-cap or use a smaller model",
        ));
    }
    let micro = match forced_micro {
        Some(m) => {
            if peak_for(m) > usable {
                return Err(refuse(
                    "a learner micro-batch",
                    peak_for(m),
                    "lower --micro-batch or --max-new-tokens, or raise --memory-cap",
                ));
            }
            m
        }
        None => {
            let m = (1..=max_micro.max(1))
                .take_while(|&m| peak_for(m) <= usable)
                .last();
            match m {
                Some(m) => m,
                None => {
                    return Err(refuse(
                        "one learner sequence with its activations",
                        peak_for(1),
                        "lower --max-new-tokens, use LoRA, or raise --memory-cap",
                    ))
                }
            }
        }
    };
    // Rollouts run when the learner's activations are free: what the learner
    // phase would use beyond the fixed state is theirs, up to a full cache.
    let fixed = BASE_BYTES + est.learner_weights + est.rollout_weights + est.trainable_state;
    let kv = usable.saturating_sub(fixed) as usize;
    if kv < rollout_kv_full.min(64 << 10) {
        return Err(refuse(
            "rollout KV cache",
            fixed + (64 << 10),
            "raise --memory-cap or use a sparse --rollout-kv-policy",
        ));
    }
    Ok(Plan {
        cap: Some(cap),
        micro_batch: micro,
        rollout_kv_bytes: kv.min(rollout_kv_full.max(1 << 20)),
        learner_peak: peak_for(micro),
        rollout_at_once: 0,
    })
}

/// Fails with the phase's name if the measured peak passed the cap.
pub fn check(cap: Option<u64>, phase: &'static str) -> Result<u64> {
    let peak = tern_runtime::memory::peak_rss_bytes().unwrap_or(0);
    if let Some(cap) = cap {
        if peak > cap {
            return Err(TrainError::MemoryCap {
                cap: format_size(cap as usize),
                phase,
                needed: format!("{} (measured peak)", format_size(peak as usize)),
                advice: "lower --micro-batch or --prompts-per-step, or raise --memory-cap".into(),
            });
        }
    }
    Ok(peak)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn smollm() -> ModelConfig {
        ModelConfig {
            architecture: "llama".into(),
            name: None,
            n_layer: 30,
            n_embd: 576,
            n_head: 9,
            n_kv_head: 3,
            head_dim: 64,
            n_ff: 1536,
            vocab_size: 49152,
            context_length: 8192,
            rope_base: 100000.0,
            rope_freq_scale: 1.0,
            rms_eps: 1e-5,
            sliding: None,
        }
    }

    #[test]
    fn a_cap_below_the_weights_is_refused_at_load() {
        let c = smollm();
        let e = Estimate::new(&c, 100 << 20, 1 << 20);
        let err = plan(&c, &e, Some(256 << 20), 100, 8, None, 1 << 20).unwrap_err();
        assert!(err.to_string().contains("loading the weights"), "{err}");
    }

    #[test]
    fn bigger_caps_allow_bigger_micro_batches() {
        let c = smollm();
        let e = Estimate::new(&c, 100 << 20, 5 << 20);
        let small = plan(&c, &e, Some(2 << 30), 100, 16, None, 1 << 20).unwrap();
        let big = plan(&c, &e, Some(8 << 30), 100, 16, None, 1 << 20).unwrap();
        assert!(small.micro_batch >= 1 && big.micro_batch > small.micro_batch);
        assert!(small.learner_peak <= (2u64 << 30));
        let forced = plan(&c, &e, Some(2 << 30), 100, 16, Some(64), 1 << 20);
        assert!(forced.unwrap_err().to_string().contains("micro-batch"));
    }
}
