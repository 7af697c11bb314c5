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
/// What the learner phase holds beyond its tensors: freed blocks the
/// allocator keeps between micro-batches. Fitted with the per-token figures
/// below on SmolLM2-135M's measured learner-phase peaks (`learner_peak_bytes`,
/// 267 to 1,353 tokens per micro-batch, recompute on and off; records in
/// records/planner-calibration/).
pub const LEARNER_SLACK: u64 = 48 << 20;

/// What one phase is expected to need at its peak.
#[derive(Clone, Debug, PartialEq)]
pub struct Estimate {
    /// The process before any weights: [`BASE_BYTES`], or what was measured
    /// once the rollout model was loaded (see [`Estimate::measured_base`]).
    pub base: u64,
    /// Dense f32 weights of the learner (0 when the LoRA learner shares the
    /// rollout engine's quantized weights).
    pub learner_weights: u64,
    /// The rollout engine's quantized weights.
    pub rollout_weights: u64,
    /// A second model that writes the tests of `generated_tests:K`
    /// (`test_model`): its weights and the KV its engine may hold for one
    /// step's test replies (0 when the policy writes them).
    pub writer: u64,
    /// Parameters, gradients and AdamW moments of what is trained.
    pub trainable_state: u64,
    /// Activations kept for the backward pass, per token of a micro-batch.
    pub activation_per_token: u64,
    /// The same with recompute: each block's input, plus one block's
    /// activations while it runs again.
    pub recompute_per_token: u64,
    /// Width of the attention rows the backward builds, per head (0 for the
    /// f32 learner, whose graph keeps them per layer instead: see
    /// [`Estimate::learner_peak`]).
    attention_layers: u64,
}

impl Estimate {
    /// Estimates from the model's shape, its GGUF size, the trainable count
    /// and whether the learner holds its own f32 copy of the weights
    /// (`f32_base`: full fine-tuning or `learner_weights = "f32"`).
    pub fn new(
        cfg: &ModelConfig,
        gguf_bytes: u64,
        trainable_params: u64,
        f32_base: bool,
    ) -> Estimate {
        let (d, f, kvd, l) = (
            cfg.n_embd as u64,
            cfg.n_ff as u64,
            (cfg.n_kv_head * cfg.head_dim) as u64,
            cfg.n_layer as u64,
        );
        let params = tern_models::arch::parameter_count(cfg);
        // f32 values alive per token and layer at the backward's peak (the
        // forward's saved tensors plus the gradients in flight): about 55 of
        // width D, 11 of width F and the K/V rows. Calibrated on SmolLM2-135M
        // (6 MB per token) and the tiny test model with the f32 learner.
        let per_layer = if f32_base {
            4 * (55 * d + 11 * f + 4 * kvd)
        } else {
            // The quantized learner's ops keep their inputs only: 2.9 MB
            // per token on SmolLM2-135M, measured as the learner phase's own
            // peak at 299 tokens per micro-batch (with LEARNER_SLACK).
            4 * (25 * d + 6 * f + 4 * kvd)
        };
        Estimate {
            base: BASE_BYTES,
            learner_weights: if f32_base { params * 4 } else { 0 },
            rollout_weights: gguf_bytes,
            writer: 0,
            // value, accumulated gradient, two moments, one transient gradient
            trainable_state: trainable_params * 4 * 5,
            activation_per_token: l * per_layer,
            // Each block's input (and its gradient in flight), plus the block
            // being run again, its backward's gradients and what the
            // allocator has not reused yet: about four blocks' worth in all.
            // SmolLM2-135M's learner phase measured 0.6 MB per token with
            // the logit chunks and attention rows (267 to 1,353 tokens).
            recompute_per_token: l * 4 * d * 2 + 4 * per_layer,
            attention_layers: if f32_base { l } else { 1 },
        }
    }

    /// Takes the process's resident size once the rollout model is loaded
    /// (`resident`) as the truth about everything but the weights: the
    /// tokenizer, the engine's buffers and the runtime are larger for some
    /// models than [`BASE_BYTES`] says (SmolLM2-135M: 32 MiB more).
    pub fn measured_base(&mut self, resident: u64) {
        self.base = self.base.max(resident.saturating_sub(self.rollout_weights));
    }

    /// Peak while loading: the rollout model, plus for an f32 learner its
    /// weights and one f32 copy of the embedding being dequantized.
    pub fn load_peak(&self, cfg: &ModelConfig) -> u64 {
        let dequantizing = if self.learner_weights > 0 {
            (cfg.vocab_size * cfg.n_embd * 4) as u64
        } else {
            0
        };
        self.base + self.learner_weights + self.rollout_weights + self.writer + dequantizing
    }

    /// What every phase holds: the process, the weights (a test writer's
    /// included) and the trainable state.
    pub fn fixed(&self) -> u64 {
        self.base + self.learner_weights + self.rollout_weights + self.writer + self.trainable_state
    }

    /// Peak of the rollout phase when the engine holds `kv_bytes` of KV
    /// cache at once (the plan's budget is the most it may): the fixed
    /// state plus the cache. The forward's scratch (a batch's activations
    /// and logits) is left to the share of the cap plans do not use.
    pub fn rollout_peak(&self, kv_bytes: u64) -> u64 {
        self.fixed() + kv_bytes
    }

    /// Peak of a learner pass over `tokens` tokens in sequences of at most
    /// `seq_len`: fixed state, activations (kept or recomputed), attention
    /// rows and logit chunks.
    pub fn learner_peak(
        &self,
        cfg: &ModelConfig,
        tokens: u64,
        seq_len: u64,
        recompute: bool,
    ) -> u64 {
        let attn = self.attention_layers * cfg.n_head as u64 * seq_len * tokens * 4 * 4;
        let logits = tokens * CHUNK as u64 * 4 * 3;
        let act = if recompute {
            self.recompute_per_token
        } else {
            self.activation_per_token
        };
        self.base
            + LEARNER_SLACK
            + self.learner_weights
            + self.rollout_weights
            + self.trainable_state
            + act * tokens
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
    /// Whether the learner recomputes blocks in its backward pass.
    pub recompute: bool,
    /// What takes most of the cap beyond the weights and trainable state:
    /// the learner's activations or the rollout KV cache.
    pub binds: &'static str,
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
    recompute: Option<bool>,
) -> Result<Plan> {
    let seq = seq_len as u64;
    let Some(cap) = cap else {
        let m = forced_micro.unwrap_or(max_micro.min(4));
        let r = recompute.unwrap_or(false);
        return Ok(Plan {
            cap: None,
            micro_batch: m,
            rollout_kv_bytes: rollout_kv_full.max(1 << 20),
            learner_peak: est.learner_peak(cfg, m as u64 * seq, seq, r),
            rollout_at_once: 0,
            recompute: r,
            binds: "nothing (no cap)",
        });
    };
    let usable = (cap as f64 * PLAN_SHARE) as u64;
    // Recompute when asked, or when keeping activations would not let the
    // largest wanted micro-batch fit (it costs one more forward per block).
    let want = forced_micro.unwrap_or(max_micro.max(1)) as u64;
    let recompute = recompute.unwrap_or_else(|| {
        est.learner_peak(cfg, want * seq, seq, false) > usable && est.learner_weights == 0
    });
    let peak_for = |m: usize| est.learner_peak(cfg, m as u64 * seq, seq, recompute);
    let refuse = |phase: &'static str, needed: u64, advice: &str| TrainError::MemoryCap {
        cap: format_size(cap as usize),
        phase,
        needed: format_size(needed as usize),
        advice: advice.to_string(),
    };
    if est.load_peak(cfg) > usable {
        return Err(refuse(
            "loading the weights",
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
    let fixed = est.fixed();
    let kv = usable.saturating_sub(fixed) as usize;
    if kv < rollout_kv_full.min(64 << 10) {
        return Err(refuse(
            "rollout KV cache",
            fixed + (64 << 10),
            "raise --memory-cap or use a sparse --rollout-kv-policy",
        ));
    }
    let rollout_kv_bytes = kv.min(rollout_kv_full.max(1 << 20));
    let activations = peak_for(micro).saturating_sub(fixed);
    Ok(Plan {
        cap: Some(cap),
        micro_batch: micro,
        rollout_kv_bytes,
        learner_peak: peak_for(micro),
        rollout_at_once: 0,
        recompute,
        binds: if rollout_kv_bytes as u64 >= activations {
            "the rollout KV cache"
        } else {
            "the learner's activations"
        },
    })
}

/// Tokens one learner pass over `seqs` feeds at `micro` sequences per
/// micro-batch (the most of any micro-batch), and the longest sequence.
/// `seqs` holds each sequence's prompt and response length, in batch order;
/// consecutive sequences with one prompt share its pass, so it counts once.
pub fn micro_batch_tokens(seqs: &[(&[u32], usize)], micro: usize) -> (u64, u64) {
    let (mut tokens, mut longest) = (0u64, 0u64);
    for chunk in seqs.chunks(micro.max(1)) {
        let mut fed = 0u64;
        for (i, (prompt, response)) in chunk.iter().enumerate() {
            if i == 0 || chunk[i - 1].0 != *prompt {
                fed += prompt.len() as u64;
            }
            fed += *response as u64;
            longest = longest.max((prompt.len() + response) as u64);
        }
        tokens = tokens.max(fed);
    }
    (tokens, longest)
}

/// The learner's micro-batch and recompute for one step, planned from the
/// sequences it is about to train (`seqs`, see [`micro_batch_tokens`])
/// rather than the start plan's worst case, where every answer is
/// `max_new_tokens` long. Keeping activations saves a forward pass per block,
/// so it is chosen whenever a micro-batch of two sequences (or the one
/// forced) fits the cap; otherwise blocks are recomputed, with the largest
/// micro-batch that fits. Forced settings (`--micro-batch`, `--recompute`)
/// are kept; without a cap, or with nothing to train, the start plan stands.
pub fn step_plan(
    cfg: &ModelConfig,
    est: &Estimate,
    start: &Plan,
    forced_micro: Option<usize>,
    forced_recompute: Option<bool>,
    seqs: &[(&[u32], usize)],
) -> (usize, bool) {
    let Some(cap) = start.cap else {
        return (start.micro_batch, start.recompute);
    };
    if seqs.is_empty() {
        return (start.micro_batch, start.recompute);
    }
    let usable = (cap as f64 * PLAN_SHARE) as u64;
    let fits = |m: usize, recompute: bool| {
        let (tokens, longest) = micro_batch_tokens(seqs, m);
        est.learner_peak(cfg, tokens, longest, recompute) <= usable
    };
    // Recompute exists only for the quantized LoRA learner.
    let options: &[bool] = match forced_recompute {
        Some(true) if est.learner_weights == 0 => &[true],
        _ if est.learner_weights != 0 => &[false],
        Some(_) => &[false],
        None => &[false, true],
    };
    if let Some(m) = forced_micro {
        let recompute = options.iter().copied().find(|&r| fits(m, r));
        return (m, recompute.unwrap_or(*options.last().unwrap_or(&false)));
    }
    let most = seqs.len();
    for &recompute in options {
        let best = (1..=most).rev().find(|&m| fits(m, recompute));
        match best {
            Some(m) if recompute || m >= 2.min(most) || options.len() == 1 => {
                return (m, recompute)
            }
            _ => {}
        }
    }
    (1, *options.last().unwrap_or(&false))
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
        let e = Estimate::new(&c, 100 << 20, 1 << 20, true);
        let err = plan(&c, &e, Some(256 << 20), 100, 8, None, 1 << 20, None).unwrap_err();
        assert!(err.to_string().contains("loading the weights"), "{err}");
    }

    #[test]
    fn bigger_caps_allow_bigger_micro_batches() {
        let c = smollm();
        let e = Estimate::new(&c, 100 << 20, 5 << 20, true);
        let small = plan(&c, &e, Some(2 << 30), 100, 16, None, 1 << 20, None).unwrap();
        let big = plan(&c, &e, Some(8 << 30), 100, 16, None, 1 << 20, None).unwrap();
        assert!(small.micro_batch >= 1 && big.micro_batch > small.micro_batch);
        assert!(small.learner_peak <= (2u64 << 30));
        let forced = plan(&c, &e, Some(2 << 30), 100, 16, Some(64), 1 << 20, None);
        assert!(forced.unwrap_err().to_string().contains("micro-batch"));
    }

    #[test]
    fn the_planned_rollout_phase_fits_the_caps_planning_share() {
        let c = smollm();
        let e = Estimate::new(&c, 100 << 20, 5 << 20, false);
        for (cap, kv_full) in [(1u64 << 30, 64usize << 20), (512 << 20, 1 << 30)] {
            let p = plan(&c, &e, Some(cap), 100, 16, None, kv_full, None).unwrap();
            let rollout = e.rollout_peak(p.rollout_kv_bytes as u64);
            assert!(
                rollout <= (cap as f64 * PLAN_SHARE) as u64,
                "{rollout} over {cap}"
            );
            // A full cache that fits is given whole; one that does not is cut.
            assert_eq!(p.rollout_kv_bytes == kv_full, kv_full < (200 << 20));
        }
    }

    /// 32 sequences, 4 prompts of `prompt` tokens x 8 answers of `answer`.
    fn groups(prompt: usize, answer: usize) -> (Vec<Vec<u32>>, usize) {
        ((0..4).map(|p| vec![p as u32; prompt]).collect(), answer)
    }

    fn seqs(g: &(Vec<Vec<u32>>, usize)) -> Vec<(&[u32], usize)> {
        g.0.iter()
            .flat_map(|p| std::iter::repeat_n((p.as_slice(), g.1), 8))
            .collect()
    }

    #[test]
    fn a_micro_batch_counts_a_shared_prompt_once() {
        let g = groups(58, 100);
        let s = seqs(&g);
        assert_eq!(micro_batch_tokens(&s, 1), (158, 158));
        assert_eq!(micro_batch_tokens(&s, 4), (58 + 400, 158));
        // 5 + 3 per prompt: the second chunk of 5 spans two prompts.
        assert_eq!(
            micro_batch_tokens(&s, 5),
            (58 + 3 * 100 + 58 + 2 * 100, 158)
        );
    }

    #[test]
    fn steps_keep_activations_when_their_sequences_fit_and_recompute_when_not() {
        let c = smollm();
        // The quantized LoRA learner (no f32 copy of the weights).
        let e = Estimate::new(&c, 100 << 20, 5 << 20, false);
        // The start plan assumes 256-token answers and recomputes.
        let start = plan(&c, &e, Some(2 << 30), 58 + 256, 32, None, 1 << 20, None).unwrap();
        assert!(start.recompute);
        // Answers of 60 tokens: activations kept, more than one sequence at once,
        // and the step's peak within the plan's share of the cap.
        let short = groups(58, 60);
        let (m, r) = step_plan(&c, &e, &start, None, None, &seqs(&short));
        assert!(!r && m >= 2, "micro {m}, recompute {r}");
        let (t, l) = micro_batch_tokens(&seqs(&short), m);
        assert!(e.learner_peak(&c, t, l, false) as f64 <= (2u64 << 30) as f64 * PLAN_SHARE);
        // Answers of 1,000 tokens: two do not fit with activations kept.
        let long = groups(58, 1000);
        let (m, r) = step_plan(&c, &e, &start, None, None, &seqs(&long));
        assert!(r && m >= 1, "micro {m}, recompute {r}");
        // Forced settings stand.
        assert_eq!(
            step_plan(&c, &e, &start, Some(3), Some(true), &seqs(&short)),
            (3, true)
        );
        let (_, r) = step_plan(&c, &e, &start, None, Some(true), &seqs(&short));
        assert!(r);
        // No cap: the start plan.
        let free = plan(&c, &e, None, 58 + 256, 32, None, 1 << 20, None).unwrap();
        let got = step_plan(&c, &e, &free, None, None, &seqs(&short));
        assert_eq!(got, (free.micro_batch, free.recompute));
    }
}
