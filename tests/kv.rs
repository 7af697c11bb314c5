//! KV policies end to end: the cache holds its budget during generation, the
//! per-head masks stay correct after eviction, and bad specs are clear errors.

use tern_kveval::generate::{generate, GenerateRequest};
use tern_models::{KvStore, LogitsWanted, SeqBatch};
use tern_runtime::backend::TernBackend;
use tern_runtime::kv::policy::KvPolicy;
use tern_runtime::kv::SeqCache;
use tern_runtime::sampler::SamplingParams;
use tern_runtime::LoadedModel;

use crate::support::{assert_clean_error, last_json, real_model, tern};

use crate::support::tiny::load_tiny as tiny;

fn run(
    model: &LoadedModel,
    policy: &str,
    prompt_len: usize,
    n: usize,
) -> tern_kveval::generate::GenerateOutput {
    let req = GenerateRequest {
        prompt: (0..prompt_len).map(|i| (i * 13 % 250 + 3) as u32).collect(),
        sampling: SamplingParams::greedy(),
        max_tokens: n,
        ignore_eos: true,
        stop: Vec::new(),
        prefill_chunk: 16,
        kv_policy: policy.parse().unwrap(),
        kv_dtype: Default::default(),
    };
    generate(&mut TernBackend::new(model), model, &req, |_| {}).unwrap()
}

#[test]
fn every_policy_holds_its_budget_while_generating() {
    let (_d, model) = tiny();
    let per_entry =
        2 * model.config().n_kv_head * model.config().head_dim * 4 * model.config().n_layer;
    let full = run(&model, "full", 40, 120);
    assert_eq!(full.kv_bytes, full.kv_bytes_full);
    for spec in [
        "streaming:budget=32,sink=4",
        "h2o:budget=32,recent=8",
        "snapkv:budget=32,window=4,every=8",
        "pyramidkv:budget=32,window=4,every=8",
        "rkv:budget=32,window=4,every=8",
        "expected:budget=32,window=4,every=8",
    ] {
        let out = run(&model, spec, 40, 120);
        assert_eq!(out.token_ids.len(), 120, "{spec}");
        assert_eq!(out.kv_bytes_full, full.kv_bytes_full, "{spec}");
        // Peak: the budget (pyramid's first layer up to 1.5x) plus one
        // compression period, far below the 160 entries a full cache holds.
        assert!(
            out.kv_bytes <= 60 * per_entry,
            "{spec}: {} bytes",
            out.kv_bytes
        );
        assert!(out.kv_bytes < full.kv_bytes / 2, "{spec}");
    }
}

#[test]
fn compression_never_changes_a_sequence_shorter_than_its_budget() {
    let (_d, model) = tiny();
    let full = run(&model, "full", 30, 40);
    for spec in [
        "streaming:budget=256",
        "h2o:budget=256",
        "snapkv:budget=256,every=1",
        "pyramidkv:budget=256,every=1",
        "rkv:budget=256,every=1",
        "expected:budget=256,every=1",
    ] {
        let out = run(&model, spec, 30, 40);
        assert_eq!(out.token_ids, full.token_ids, "{spec}");
        let a: Vec<f32> = out.logprobs.iter().map(|l| l.logprob).collect();
        let b: Vec<f32> = full.logprobs.iter().map(|l| l.logprob).collect();
        assert_eq!(a, b, "{spec}: logprobs must be bit-identical");
        assert_eq!(out.kv_bytes, full.kv_bytes, "{spec}");
    }
}

#[test]
fn streaming_keeps_sinks_and_recent_positions() {
    let (_d, model) = tiny();
    let policy: KvPolicy = "streaming:budget=16,sink=2".parse().unwrap();
    let mut cache = SeqCache::with_policy(model.config(), policy);
    let tokens: Vec<u32> = (0..40).map(|i| (i * 7 % 250 + 3) as u32).collect();
    for (pos, t) in tokens.iter().enumerate() {
        let mut b = [SeqBatch {
            tokens: std::slice::from_ref(t),
            start_pos: pos,
            cache: &mut cache,
            logits: LogitsWanted::Last,
        }];
        model.arch.forward(&mut b).unwrap();
    }
    let kept: Vec<u32> = cache.positions(0, 0).to_vec();
    let want: Vec<u32> = [0, 1].into_iter().chain(26..40).collect();
    assert_eq!(kept, want);
    assert_eq!(cache.len(), 16);
}

#[test]
fn multi_token_steps_after_eviction_use_per_head_positions() {
    let (_d, model) = tiny();
    // H2O evicts head-wise; then a 5-token chunk must attend causally to the
    // surviving entries of each head without error and give finite logits.
    let policy: KvPolicy = "h2o:budget=12,recent=4".parse().unwrap();
    let mut cache = SeqCache::with_policy(model.config(), policy);
    for pos in 0..30usize {
        let t = [(pos * 11 % 250 + 3) as u32];
        let mut b = [SeqBatch {
            tokens: &t,
            start_pos: pos,
            cache: &mut cache,
            logits: LogitsWanted::Last,
        }];
        model.arch.forward(&mut b).unwrap();
    }
    assert!(cache.len() <= 13);
    let chunk = [5u32, 6, 7, 8, 9];
    let mut b = [SeqBatch {
        tokens: &chunk,
        start_pos: 30,
        cache: &mut cache,
        logits: LogitsWanted::All,
    }];
    let logits = model.arch.forward(&mut b).unwrap().pop().flatten().unwrap();
    let v: Vec<Vec<f32>> = logits.to_vec2().unwrap();
    assert_eq!(v.len(), 5);
    assert!(v.iter().flatten().all(|x| x.is_finite()));
}

#[test]
fn bad_policy_specs_are_one_line_errors() {
    let (_d, model) = tiny();
    let path = model.path.to_str().unwrap().to_string();
    let out = tern(
        &[
            "generate",
            "-m",
            &path,
            "-p",
            "hi",
            "--kv-policy",
            "h2o:budget=64,foo=1",
        ],
        None,
    );
    assert_clean_error(&out, "unknown key `foo`");
    let out = tern(
        &[
            "generate",
            "-m",
            &path,
            "-p",
            "hi",
            "--kv-policy",
            "lru:budget=3",
        ],
        None,
    );
    assert_clean_error(&out, "unknown policy `lru`");
    let out = tern(
        &[
            "generate",
            "-m",
            &path,
            "-p",
            "hi",
            "--kv-policy",
            "streaming:budget=abc",
        ],
        None,
    );
    assert_clean_error(&out, "budget");
}

#[test]
fn real_model_reports_policy_and_bytes() {
    let model = real_model();
    let m = model.to_str().unwrap();
    let out = tern(
        &[
            "generate",
            "-m",
            m,
            "-p",
            "Tell me a story.",
            "--chat",
            "-n",
            "80",
            "--ignore-eos",
            "--temperature",
            "0",
            "--kv-policy",
            "snapkv:budget=32,window=8",
            "--json",
        ],
        None,
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let j = last_json(&out);
    assert!(j["kv_policy"]
        .as_str()
        .unwrap()
        .starts_with("snapkv:budget=32,window=8"));
    let (kept, full) = (
        j["kv_bytes"].as_u64().unwrap(),
        j["kv_bytes_full"].as_u64().unwrap(),
    );
    assert!(kept < full, "kept {kept} of {full}");
    assert_eq!(j["completion_tokens"], 80);
    assert!(!j["text"].as_str().unwrap().trim().is_empty());
}

#[test]
fn kv_eval_prints_its_tables() {
    let (d, model) = tiny();
    let path = model.path.to_str().unwrap().to_string();
    let text = d.path().join("text.txt");
    std::fs::write(
        &text,
        "the quick brown fox jumps over the lazy dog. ".repeat(20),
    )
    .unwrap();
    let out = tern(
        &[
            "kv-eval",
            "-m",
            &path,
            "--tasks",
            "ppl,passkey,memory",
            "--policies",
            "streaming,snapkv",
            "-f",
            text.to_str().unwrap(),
            "--ctx",
            "64",
            "--budgets",
            "16,32",
            "--passkey-budgets",
            "32",
            "--contexts",
            "100",
            "--depths",
            "50",
            "--memory-contexts",
            "200",
            "--memory-budget",
            "32",
            "--json",
        ],
        None,
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("| streaming | "), "{stdout}");
    assert!(stdout.contains("| snapkv | 32 |"), "{stdout}");
    let j = last_json(&out);
    assert_eq!(j["ppl"]["rows"].as_array().unwrap().len(), 4);
    assert_eq!(j["passkey"]["rows"].as_array().unwrap().len(), 3);
    let mem = &j["memory"]["rows"][0];
    assert!(mem["kv_bytes"].as_u64().unwrap() < mem["kv_bytes_full"].as_u64().unwrap());
}

/// A teacher-forced store for one whole sequence, masked by a replayed
/// eviction record.
struct Replayed {
    positions: Vec<u32>,
    visibility: Option<tern_models::Visibility>,
}

impl KvStore for Replayed {
    fn append(
        &mut self,
        _layer: usize,
        k: &candle_core::Tensor,
        v: &candle_core::Tensor,
        positions: &[u32],
    ) -> tern_models::Result<(candle_core::Tensor, candle_core::Tensor)> {
        self.positions = positions.to_vec();
        Ok((k.clone(), v.clone()))
    }
    fn positions(&self, _layer: usize, _head: usize) -> &[u32] {
        &self.positions
    }
    fn visibility(&self) -> Option<&tern_models::Visibility> {
        self.visibility.as_ref()
    }
}

/// What the trainer's `sparse-replay` learner relies on: one teacher-forced
/// pass masked by a sequence's eviction record computes the logits that
/// token-by-token decoding under the policy computed, and without the mask
/// they differ.
#[test]
fn a_replayed_eviction_record_reproduces_sparse_decoding_in_one_pass() {
    let (_d, model) = tiny();
    let tokens: Vec<u32> = (0..60).map(|i| (i * 29 % 250 + 3) as u32).collect();
    let prompt = 20;
    for spec in [
        "snapkv:budget=12,window=4,every=6",
        "h2o:budget=12,recent=4",
        "rkv:budget=16,window=4,every=5",
        "streaming:budget=10,sink=2",
        "expected:budget=12,window=4,sink=2,every=5",
    ] {
        let policy: KvPolicy = spec.parse().unwrap();
        let mut cache = SeqCache::with_policy(model.config(), policy);
        cache.record_evictions();
        // Last-row logits of one forward of `span` at `start`.
        let step = |cache: &mut SeqCache, span: &[u32], start: usize| -> Vec<f32> {
            let mut b = [SeqBatch {
                tokens: span,
                start_pos: start,
                cache,
                logits: LogitsWanted::Last,
            }];
            let l = model.arch.forward(&mut b).unwrap().pop().flatten().unwrap();
            l.flatten_all().unwrap().to_vec1().unwrap()
        };
        let mut decoded = vec![step(&mut cache, &tokens[..prompt], 0)];
        cache.finish_prefill().unwrap();
        for pos in prompt..tokens.len() - 1 {
            decoded.push(step(&mut cache, &tokens[pos..pos + 1], pos));
        }
        let log = cache.evictions().unwrap().clone();
        assert!(
            log.len() > 100,
            "{spec}: the budget binds ({} evictions)",
            log.len()
        );
        let teacher = |visibility| {
            let mut store = Replayed {
                positions: Vec::new(),
                visibility,
            };
            let mut b = [SeqBatch {
                tokens: &tokens[..tokens.len() - 1],
                start_pos: 0,
                cache: &mut store,
                logits: LogitsWanted::All,
            }];
            let l = model.arch.forward(&mut b).unwrap().pop().flatten().unwrap();
            let rows: Vec<Vec<f32>> = l.to_vec2().unwrap();
            rows[prompt - 1..].to_vec()
        };
        let max_diff = |rows: &[Vec<f32>]| {
            rows.iter()
                .zip(&decoded)
                .flat_map(|(a, b)| a.iter().zip(b).map(|(x, y)| (x - y).abs()))
                .fold(0f32, f32::max)
        };
        let replayed = max_diff(&teacher(Some(log.visibility(tokens.len()))));
        let dense = max_diff(&teacher(None));
        assert!(
            replayed < 2e-3,
            "{spec}: replayed pass differs by {replayed}"
        );
        assert!(
            dense > 50.0 * replayed.max(1e-4),
            "{spec}: mask made no difference ({dense} vs {replayed})"
        );
    }
}

/// A cache that keeps every entry of every layer: the reference a sliding
/// layer's trimmed cache must agree with.
#[derive(Default)]
struct KeepAll {
    /// Per layer: keys and values so far, and their positions.
    layers: Vec<(Option<KeysValues>, Vec<u32>)>,
}

type KeysValues = (candle_core::Tensor, candle_core::Tensor);

impl KvStore for KeepAll {
    fn append(
        &mut self,
        layer: usize,
        k: &candle_core::Tensor,
        v: &candle_core::Tensor,
        positions: &[u32],
    ) -> tern_models::Result<(candle_core::Tensor, candle_core::Tensor)> {
        if self.layers.len() <= layer {
            self.layers.resize_with(layer + 1, Default::default);
        }
        let (kv, pos) = &mut self.layers[layer];
        let joined = match kv.take() {
            Some((ok, ov)) => (
                candle_core::Tensor::cat(&[&ok, k], 1)?,
                candle_core::Tensor::cat(&[&ov, v], 1)?,
            ),
            None => (k.contiguous()?, v.contiguous()?),
        };
        *kv = Some(joined.clone());
        pos.extend_from_slice(positions);
        Ok(joined)
    }
    fn positions(&self, layer: usize, _head: usize) -> &[u32] {
        &self.layers[layer].1
    }
}

/// Sliding-window layers (the tiny Gemma 3: window 16, five sliding layers
/// and one global): under every policy each sliding layer holds exactly the
/// newest `window - 1` positions between steps while the policy's budget
/// governs the global layer only; and under `full`, decoding far past the
/// window gives bit for bit the logits of a cache that drops nothing (the
/// window mask alone hides the old entries).
#[test]
fn sliding_layers_keep_their_window_under_every_policy() {
    use crate::support::tiny::{load_tiny_spec, TinySpec};
    let spec = TinySpec::gemma3();
    let (_d, model) = load_tiny_spec(&spec);
    let c = model.config().clone();
    let window = spec.sliding_window.unwrap();
    let (sliding, global): (Vec<usize>, Vec<usize>) =
        (0..c.n_layer).partition(|&l| c.sliding_window(l).is_some());
    assert_eq!((sliding.len(), global.len()), (5, 1));
    let tokens: Vec<u32> = (0..160).map(|i| (i * 29 % 250 + 3) as u32).collect();
    let prompt = 40;
    let step = |cache: &mut dyn KvStore, span: &[u32], start: usize| -> Vec<f32> {
        let mut b = [SeqBatch {
            tokens: span,
            start_pos: start,
            cache,
            logits: LogitsWanted::Last,
        }];
        let l = model.arch.forward(&mut b).unwrap().pop().flatten().unwrap();
        l.flatten_all().unwrap().to_vec1().unwrap()
    };
    for spec in [
        "full",
        "streaming:budget=32,sink=4",
        "h2o:budget=32,recent=8",
        "snapkv:budget=32,window=4,every=8",
        "pyramidkv:budget=32,window=4,every=8",
        "rkv:budget=32,window=4,every=8",
        "expected:budget=32,window=4,every=8",
    ] {
        let full = spec == "full";
        let mut cache = SeqCache::with_policy(&c, spec.parse().unwrap());
        let mut reference = KeepAll::default();
        for (i, chunk) in tokens[..prompt].chunks(16).enumerate() {
            let a = step(&mut cache, chunk, i * 16);
            if full {
                assert_eq!(a, step(&mut reference, chunk, i * 16), "prefill {i}");
            }
        }
        cache.finish_prefill().unwrap();
        for pos in prompt..tokens.len() {
            let a = step(&mut cache, &tokens[pos..pos + 1], pos);
            if full {
                let b = step(&mut reference, &tokens[pos..pos + 1], pos);
                assert_eq!(a, b, "{spec}: logits at {pos}");
            }
            let newest: Vec<u32> = (pos + 2 - window..=pos).map(|p| p as u32).collect();
            for &l in &sliding {
                for h in 0..c.n_kv_head {
                    assert_eq!(cache.positions(l, h), newest, "{spec}: layer {l} at {pos}");
                }
            }
            for &l in &global {
                let held = cache.positions(l, 0).len();
                if full {
                    assert_eq!(held, pos + 1, "{spec}: global layer {l}");
                } else {
                    assert!(held <= 60, "{spec}: global layer {l} holds {held}");
                }
            }
        }
        if !full {
            // The budget bound the global layer: it holds far fewer than 160.
            assert!(cache.positions(global[0], 0).len() < 100, "{spec}");
        }
    }
}

/// Wraps an Expected Attention cache to check the queries the model hands
/// it: per decode step, `softmax(q . k)` over the keys `append` returned must
/// be the attention the model then reports, so the queries carry the model's
/// own logit scale (`1/sqrt(hd)`, or Gemma's query scale) and RoPE.
struct WatchQueries {
    inner: SeqCache,
    /// Per layer: this step's queries `[H, n, hd]`, and the keys attended.
    queries: Vec<Option<candle_core::Tensor>>,
    keys: Vec<Option<candle_core::Tensor>>,
    /// Steps checked, largest difference seen, and the largest difference a
    /// logit scale off by 2x would have given.
    checked: usize,
    worst: f32,
    worst_misscaled: f32,
}

impl KvStore for WatchQueries {
    fn append(
        &mut self,
        layer: usize,
        k: &candle_core::Tensor,
        v: &candle_core::Tensor,
        positions: &[u32],
    ) -> tern_models::Result<(candle_core::Tensor, candle_core::Tensor)> {
        let (kc, vc) = self.inner.append(layer, k, v, positions)?;
        self.keys[layer] = Some(kc.clone());
        Ok((kc, vc))
    }
    fn positions(&self, layer: usize, head: usize) -> &[u32] {
        self.inner.positions(layer, head)
    }
    fn wants_attention(&self, layer: usize) -> bool {
        self.inner.wants_queries(layer)
    }
    fn observe_attention(
        &mut self,
        layer: usize,
        weights: &candle_core::Tensor,
        _column_means: Option<&[f32]>,
    ) -> tern_models::Result<()> {
        let (Some(q), Some(k)) = (self.queries[layer].take(), self.keys[layer].take()) else {
            return Ok(());
        };
        let (n_head, n, hd) = q.dims3()?;
        if n != 1 {
            return Ok(());
        }
        let (n_kv, c, _) = k.dims3()?;
        let q: Vec<f32> = q.flatten_all()?.to_vec1()?;
        let k: Vec<f32> = k.contiguous()?.flatten_all()?.to_vec1()?;
        let w: Vec<f32> = weights.flatten_all()?.to_vec1()?; // [KV, G, 1, C]
        let g = n_head / n_kv;
        for j in 0..n_head {
            let kv = j / g;
            let logits: Vec<f32> = (0..c)
                .map(|i| {
                    let key = &k[(kv * c + i) * hd..(kv * c + i + 1) * hd];
                    q[j * hd..(j + 1) * hd]
                        .iter()
                        .zip(key)
                        .map(|(a, b)| a * b)
                        .sum()
                })
                .collect();
            let softmax = |scale: f32| -> Vec<f32> {
                let max = logits
                    .iter()
                    .fold(f32::NEG_INFINITY, |m, &l| m.max(l * scale));
                let e: Vec<f32> = logits.iter().map(|&l| (l * scale - max).exp()).collect();
                let sum: f32 = e.iter().sum();
                e.iter().map(|x| x / sum).collect()
            };
            let row = &w[j * c..(j + 1) * c];
            let diff = |p: Vec<f32>| {
                p.iter()
                    .zip(row)
                    .map(|(a, b)| (a - b).abs())
                    .fold(0f32, f32::max)
            };
            self.worst = self.worst.max(diff(softmax(1.0)));
            self.worst_misscaled = self.worst_misscaled.max(diff(softmax(2.0)));
        }
        self.checked += 1;
        Ok(())
    }
    fn wants_queries(&self, layer: usize) -> bool {
        self.inner.wants_queries(layer)
    }
    fn observe_queries(
        &mut self,
        layer: usize,
        q: &candle_core::Tensor,
        positions: &[u32],
        rope: &tern_models::Rotary,
    ) -> tern_models::Result<()> {
        self.queries[layer] = Some(q.contiguous()?);
        self.inner.observe_queries(layer, q, positions, rope)
    }
    fn after_attention(&mut self, layer: usize) -> tern_models::Result<()> {
        self.inner.after_attention(layer)
    }
}

#[test]
fn expected_attention_sees_the_queries_the_model_attends_with() {
    use crate::support::tiny::{load_tiny_spec, TinySpec};
    // Llama's scaled scores and Gemma 3's scaled queries (its global layer;
    // sliding layers are not scored and hand over nothing).
    for spec in [TinySpec::default(), TinySpec::gemma3()] {
        let (_d, model) = load_tiny_spec(&spec);
        let c = model.config().clone();
        let policy: KvPolicy = "expected:budget=24,window=4,every=4".parse().unwrap();
        let mut cache = WatchQueries {
            inner: SeqCache::with_policy(&c, policy),
            queries: vec![None; c.n_layer],
            keys: vec![None; c.n_layer],
            checked: 0,
            worst: 0.0,
            worst_misscaled: 0.0,
        };
        let tokens: Vec<u32> = (0..60).map(|i| (i * 31 % 250 + 3) as u32).collect();
        for (pos, t) in tokens.iter().enumerate() {
            let mut b = [SeqBatch {
                tokens: std::slice::from_ref(t),
                start_pos: pos,
                cache: &mut cache,
                logits: LogitsWanted::Last,
            }];
            model.arch.forward(&mut b).unwrap();
        }
        let scored = (0..c.n_layer)
            .filter(|&l| c.sliding_window(l).is_none())
            .count();
        assert_eq!(cache.checked, 60 * scored, "{}", spec.architecture);
        assert!(
            cache.worst < 1e-3 && cache.worst_misscaled > 10.0 * cache.worst,
            "{}: softmax(q.k) off by {} (misscaled: {})",
            spec.architecture,
            cache.worst,
            cache.worst_misscaled
        );
        // And the policy held its budget on the scored layers.
        for l in (0..c.n_layer).filter(|&l| c.sliding_window(l).is_none()) {
            assert!(cache.inner.positions(l, 0).len() <= 28, "layer {l}");
        }
    }
}

/// Generation on SmolLM2 under Expected Attention: a prompt four times the
/// budget is read in chunks and compressed, decoding compresses every
/// `every` tokens, and the cache never holds more than the budget plus one
/// chunk, far below the full cache.
#[test]
fn expected_attention_generates_within_budget_on_smollm2() {
    let model = LoadedModel::load(&real_model()).unwrap();
    let text = "The lighthouse keeper counted the ships that passed each night \
                and wrote their names in a ledger bound in green leather. "
        .repeat(24);
    let prompt = model.tokenizer.encode(&text, true, false).unwrap();
    assert!(prompt.len() > 400, "{} prompt tokens", prompt.len());
    let (budget, chunk, n) = (96, 64, 48);
    let req = GenerateRequest {
        prompt: prompt.clone(),
        sampling: SamplingParams::greedy(),
        max_tokens: n,
        ignore_eos: true,
        stop: Vec::new(),
        prefill_chunk: chunk,
        kv_policy: format!("expected:budget={budget},window=8,every=16")
            .parse()
            .unwrap(),
        kv_dtype: Default::default(),
    };
    let out = generate(&mut TernBackend::new(&model), &model, &req, |_| {}).unwrap();
    assert_eq!(out.token_ids.len(), n);
    // The full cache holds every position but the last token's (never fed back).
    let per_entry = out.kv_bytes_full / (prompt.len() + n - 1);
    assert!(
        out.kv_bytes <= (budget + chunk) * per_entry,
        "peak {} bytes, {} per entry",
        out.kv_bytes,
        per_entry
    );
    assert!(out.kv_bytes * 3 < out.kv_bytes_full);
    assert!(!out.text.trim().is_empty());
}

/// A view of a [`SeqCache`] whose padding slots hold huge keys and values:
/// if any attention path let a query see a padding slot, the logits through
/// it would differ from those through the cache itself.
struct Garbled<'a>(&'a mut SeqCache);

impl KvStore for Garbled<'_> {
    fn append(
        &mut self,
        layer: usize,
        k: &candle_core::Tensor,
        v: &candle_core::Tensor,
        positions: &[u32],
    ) -> tern_models::Result<(candle_core::Tensor, candle_core::Tensor)> {
        let (k, v) = self.0.append(layer, k, v, positions)?;
        let cache = &*self.0;
        let garble = |t: &candle_core::Tensor| -> tern_models::Result<candle_core::Tensor> {
            let (kvh, c, hd) = t.dims3()?;
            let mut x: Vec<f32> = t.flatten_all()?.to_vec1()?;
            for h in 0..kvh {
                for (i, &p) in cache.positions(layer, h).iter().enumerate() {
                    if p == tern_models::HIDDEN_POSITION {
                        x[(h * c + i) * hd..(h * c + i + 1) * hd].fill(30.0);
                    }
                }
            }
            Ok(candle_core::Tensor::from_vec(
                x,
                (kvh, c, hd),
                &candle_core::Device::Cpu,
            )?)
        };
        Ok((garble(&k)?, garble(&v)?))
    }
    fn positions(&self, layer: usize, head: usize) -> &[u32] {
        self.0.positions(layer, head)
    }
    fn hides_entries(&self, layer: usize) -> bool {
        self.0.hides_entries(layer)
    }
    fn wants_attention(&self, layer: usize) -> bool {
        self.0.wants_attention(layer)
    }
    fn attention_rows(&self, layer: usize) -> tern_models::WeightsWanted {
        self.0.attention_rows(layer)
    }
    fn observe_attention(
        &mut self,
        layer: usize,
        weights: &candle_core::Tensor,
        column_means: Option<&[f32]>,
    ) -> tern_models::Result<()> {
        self.0.observe_attention(layer, weights, column_means)
    }
    fn after_attention(&mut self, layer: usize) -> tern_models::Result<()> {
        self.0.after_attention(layer)
    }
}

/// Ada-KV on SmolLM2: heads of a layer keep different counts, the layer stays
/// within its total budget while decoding, no attention path (the tiled
/// prefill kernel, the per-key kernel, the long-cache decode) lets a query
/// see a padding slot, and generation under a small budget runs.
#[test]
fn adakv_on_smollm2_keeps_head_wise_budgets_and_hides_padding() {
    let model = LoadedModel::load(&real_model()).unwrap();
    let c = model.config().clone();
    let (budget, every) = (400usize, 8usize);
    let spec = format!("adakv:inner=snapkv,budget={budget},window=8,every={every},floor=0.2");
    let policy: KvPolicy = spec.parse().unwrap();
    let step = |cache: &mut dyn KvStore, span: &[u32], start: usize| -> Vec<f32> {
        let mut b = [SeqBatch {
            tokens: span,
            start_pos: start,
            cache,
            logits: LogitsWanted::Last,
        }];
        let l = model.arch.forward(&mut b).unwrap().pop().flatten().unwrap();
        l.flatten_all().unwrap().to_vec1().unwrap()
    };
    let text = "The committee met on Tuesday to review the harbour budget, the new \
                ferry timetable and a proposal to rename the old lighthouse. ";
    let mut tokens = model
        .tokenizer
        .encode(&text.repeat(100), true, false)
        .unwrap();
    tokens.truncate(1300);
    assert_eq!(tokens.len(), 1300);
    let mut cache = SeqCache::with_policy(&c, policy.clone());
    // Two 650-token chunks: each is compressed at its end, so the second is
    // appended after the padding the first compression left.
    for (i, chunk) in tokens.chunks(650).enumerate() {
        step(&mut cache, chunk, i * 650);
    }
    cache.finish_prefill().unwrap();
    let real = |cache: &SeqCache, l: usize, h: usize| {
        cache
            .positions(l, h)
            .iter()
            .filter(|&&p| p != tern_models::HIDDEN_POSITION)
            .count()
    };
    let capacity = policy.head_capacity(0, c.n_layer, c.n_kv_head).unwrap();
    let (mut uneven, mut long) = (0, 0);
    for l in 0..c.n_layer {
        let counts: Vec<usize> = (0..c.n_kv_head).map(|h| real(&cache, l, h)).collect();
        assert_eq!(
            counts.iter().sum::<usize>(),
            budget * c.n_kv_head,
            "layer {l}: {counts:?}"
        );
        assert!(cache.positions(l, 0).len() <= capacity, "layer {l}");
        uneven += usize::from(counts.iter().any(|&n| n != counts[0]));
        long += usize::from(cache.positions(l, 0).len() >= 512);
    }
    assert!(
        uneven > c.n_layer / 2,
        "only {uneven} layers allocate head-wise"
    );
    assert!(
        long > 0,
        "no layer is long enough for the long-cache decode path"
    );
    // Decode: the cache and a garbled view of an identical fork agree bit for
    // bit, and the layer totals stay within budget plus one period.
    let mut twin = cache.fork().unwrap();
    for (t, &tok) in tokens.iter().take(2 * every + 3).enumerate() {
        let pos = tokens.len() + t;
        let a = step(&mut cache, &[tok], pos);
        let b = step(&mut Garbled(&mut twin), &[tok], pos);
        assert_eq!(a, b, "padding was seen at step {t}");
        assert!(a.iter().all(|x| x.is_finite()));
        for l in 0..c.n_layer {
            let total: usize = (0..c.n_kv_head).map(|h| real(&cache, l, h)).sum();
            assert!(
                total <= (budget + every) * c.n_kv_head,
                "layer {l}: {total}"
            );
            assert!(cache.positions(l, 0).len() <= capacity + every, "layer {l}");
        }
    }
    // Generation end to end under a small budget.
    let small: KvPolicy = "adakv:budget=32,window=4,every=8".parse().unwrap();
    let out = run(&model, &small.to_string(), 200, 40);
    assert_eq!(out.token_ids.len(), 40);
    // Peak: every layer at most its padded capacity plus one 16-token chunk,
    // against 240 entries per layer for a full cache.
    let per_entry =
        2 * c.n_kv_head * tern_runtime::kv::KvDtype::F16.row_bytes(c.head_dim) * c.n_layer;
    let cap = small.head_capacity(0, c.n_layer, c.n_kv_head).unwrap() + 16;
    assert!(cap < 240);
    assert!(
        out.kv_bytes <= cap * per_entry,
        "{} > {cap} entries",
        out.kv_bytes
    );
    // The last sampled token is never fed back, so a full cache holds 239.
    assert_eq!(out.kv_bytes_full, 239 * per_entry);
}

/// Two short texts the tiny model can score in one 64-token window each.
fn two_texts(dir: &std::path::Path) -> (std::path::PathBuf, std::path::PathBuf) {
    let a = dir.join("fox.txt");
    let b = dir.join("stitch.txt");
    std::fs::write(
        &a,
        "the quick brown fox jumps over the lazy dog. ".repeat(20),
    )
    .unwrap();
    std::fs::write(
        &b,
        "a stitch in time saves nine, said the tailor to his apprentice; ".repeat(20),
    )
    .unwrap();
    (a, b)
}

#[test]
fn kv_eval_scores_several_texts_at_kept_fractions() {
    let (d, model) = tiny();
    let path = model.path.to_str().unwrap().to_string();
    let (a, b) = two_texts(d.path());
    let files = format!("{},{}", a.display(), b.display());
    let records = d.path().join("out/records.jsonl");
    let out = tern(
        &[
            "kv-eval",
            "-m",
            &path,
            "--tasks",
            "ppl",
            "--policies",
            "streaming,snapkv",
            "--files",
            &files,
            "--ctx",
            "64",
            "--kept",
            "50",
            "--out",
            records.to_str().unwrap(),
        ],
        None,
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("| snapkv | fox | stitch | mean | std | min-max |"),
        "{stdout}"
    );
    assert!(stdout.contains("| kept 50% | "), "{stdout}");
    let lines: Vec<serde_json::Value> = std::fs::read_to_string(&records)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let mut seen: Vec<(String, String)> = lines
        .iter()
        .map(|r| {
            (
                r["text"].as_str().unwrap().to_string(),
                r["name"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    seen.sort();
    let want: Vec<(String, String)> = [
        ("fox", "snapkv"),
        ("fox", "streaming"),
        ("stitch", "snapkv"),
        ("stitch", "streaming"),
    ]
    .iter()
    .map(|(t, p)| (t.to_string(), p.to_string()))
    .collect();
    assert_eq!(seen, want, "one record per text and policy");
    for r in &lines {
        assert_eq!(r["kept"], 50);
        assert_eq!(r["ctx"], 64);
        assert_eq!(r["budget"], 32, "budget = ctx * kept / 100");
        assert_eq!(r["kv_dtype"], "f16");
        assert!(r["policy"].as_str().unwrap().contains("budget=32"), "{r}");
        let (ppl, full, ratio) = (
            r["ppl"].as_f64().unwrap(),
            r["full_ppl"].as_f64().unwrap(),
            r["ratio"].as_f64().unwrap(),
        );
        assert!(full.is_finite() && full > 1.0, "{r}");
        assert!((ratio - ppl / full).abs() < 1e-9, "{r}");
        // Evicting half the cache may cost a lot on a random model, but it
        // cannot make the text several times easier to predict.
        assert!(ratio.is_finite() && ratio >= 0.5, "{r}");
        assert!(
            r["kv_bytes"].as_u64().unwrap() < r["kv_bytes_full"].as_u64().unwrap(),
            "{r}"
        );
    }
    // The two texts differ, so their full-cache perplexities do too.
    assert_ne!(
        lines.iter().find(|r| r["text"] == "fox").unwrap()["full_ppl"],
        lines.iter().find(|r| r["text"] == "stitch").unwrap()["full_ppl"]
    );
}

#[test]
fn kv_eval_texts_bad_input_is_one_line_naming_the_flag() {
    let (d, model) = tiny();
    let path = model.path.to_str().unwrap().to_string();
    let (a, _) = two_texts(d.path());
    let missing = d.path().join("no-such-text.txt");
    let files = format!("{},{}", a.display(), missing.display());
    let run = |extra: &[&str]| {
        let mut args = vec!["kv-eval", "-m", &path, "--tasks", "ppl", "--ctx", "64"];
        args.extend_from_slice(extra);
        tern(&args, None)
    };
    let cases: [(Vec<&str>, &str); 4] = [
        (vec!["--files", &files, "--kept", "50"], "--files"),
        (vec!["--files", &files, "--kept", "0"], "--kept"),
        (vec!["--kept", "25,100"], "--kept"),
        (vec!["--kept", "half"], "--kept"),
    ];
    for (extra, flag) in cases {
        let out = run(&extra);
        assert_clean_error(&out, flag);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(stderr.trim_end().lines().count(), 1, "{extra:?}: {stderr}");
    }
    let out = run(&["--files", &files, "--kept", "50"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("no-such-text.txt"), "{stderr}");
}
