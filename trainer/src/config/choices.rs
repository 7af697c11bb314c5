//! The values a training setting takes that are not plain numbers or text:
//! each enum reads from the same spelling in the TOML file and on the
//! command line (serde's names, one list for both).

use serde::{Deserialize, Serialize};

use crate::data::Selection;

/// What the learner optimises.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Algorithm {
    /// Supervised: maximise the log-likelihood of the task's reference answer.
    Sft,
    /// Group-relative policy optimisation on sampled rollouts and verified rewards.
    Grpo,
}

/// Learning-rate schedule over the run's steps.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Schedule {
    /// The same rate every step (after warm-up).
    Constant,
    /// Linear decay to zero at the last step.
    Linear,
    /// Cosine decay to zero at the last step.
    Cosine,
}

/// What attention the learner scores rollouts with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum LearnerKv {
    /// Full attention over prompt and response (Sparse-RL's learner).
    Dense,
    /// Each token sees only the entries the rollout's KV policy still held
    /// when it was sampled (the eviction record replayed as a mask): the
    /// model is trained as it will be served.
    SparseReplay,
}

/// Which rollouts of a group its advantages are computed over.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Advantages {
    /// The group's mean and standard deviation over all `G` rollouts, before
    /// any correction drops one (what every run before the switch did).
    #[default]
    All,
    /// Over the rollouts that survive the correction (a vetoed or
    /// sequence-masked rollout no longer moves its group's baseline).
    Kept,
}

/// How the KL penalty to the reference model is estimated per token.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum KlEstimator {
    /// Schulman's k3, `exp(ref - logp) - (ref - logp) - 1`, unbounded above
    /// (every run up to the Sparse-RL ablation used it).
    #[default]
    #[serde(rename = "k3")]
    K3,
    /// k3 clamped to at most 10 per token, with no gradient where the clamp
    /// binds: slime's and verl's `low_var_kl`, which the Sparse-RL paper's
    /// scripts use. A token the policy now finds far less likely than the
    /// reference does then stops pulling on the update.
    #[serde(rename = "low_var_kl")]
    LowVarKl,
}

/// What the loss averages over.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LossAverage {
    /// One mean over all the batch's counted tokens (every recorded run):
    /// a long response weighs in proportion to its length.
    #[default]
    Token,
    /// A mean over each response's counted tokens, then over responses
    /// (slime's default, the Sparse-RL paper's runs): every response weighs
    /// the same whatever its length or how many of its tokens a correction
    /// masked.
    Response,
}

/// How the LoRA learner holds the frozen base.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LearnerWeights {
    /// The GGUF blocks on the sampler's own kernels (one copy shared with the
    /// rollout engine; dense rollouts' log-probabilities equal pi_old where
    /// the weights' kernels give a row the same result in any batch).
    Gguf,
    /// Dequantized to f32 (the learner before the quantized one: ~5x the
    /// weights' memory, and its own rounding).
    F32,
}

/// A config enum from its TOML spelling (serde's names), for the CLI's
/// flags: one list of names for both.
fn parse_named<T: serde::de::DeserializeOwned>(
    s: &str,
    what: &str,
    choices: &str,
) -> Result<T, String> {
    T::deserialize(serde::de::value::StrDeserializer::<serde::de::value::Error>::new(s))
        .map_err(|_| format!("unknown {what} `{s}` ({choices})"))
}

macro_rules! from_str_by_name {
    ($($t:ty => $what:literal, $choices:literal;)*) => {$(
        impl std::str::FromStr for $t {
            type Err = String;
            fn from_str(s: &str) -> std::result::Result<Self, String> {
                parse_named(s, $what, $choices)
            }
        }
    )*};
}

from_str_by_name! {
    Algorithm => "algorithm", "grpo or sft";
    Schedule => "schedule", "constant, linear or cosine";
    Selection => "selection", "uniform or difficulty";
    LearnerKv => "learner_kv", "dense or sparse-replay";
    LossAverage => "loss average", "token or response";
    KlEstimator => "KL estimator", "k3 or low_var_kl";
    Advantages => "advantages", "all or kept";
    LearnerWeights => "learner_weights", "gguf or f32";
}
