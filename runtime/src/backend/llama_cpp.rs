//! llama.cpp as a backend (feature `llama-cpp`): the reference Tern is checked
//! against and the peer it is measured beside, driven by the same engine.
//!
//! One llama.cpp context holds every sequence in its unified KV cache; a Tern
//! sequence is a llama.cpp sequence id. Prefill and decode rows go into one
//! `llama_batch`; logits come back for Tern's own sampler. Two KV policies run
//! here: `full`, and `streaming`, which keeps the sinks and the newest tokens by
//! removing the oldest cache range and shifting later positions down through
//! llama.cpp's sequence API (its own "context shift"). Forks share cells
//! (`llama_memory_seq_cp`).

use std::collections::HashMap;
use std::mem::ManuallyDrop;
use std::num::NonZeroU32;
use std::path::Path;
use std::sync::OnceLock;

use llama_cpp_2::context::params::{KvCacheType, LlamaContextParams};
use llama_cpp_2::context::LlamaContext;
use llama_cpp_2::llama_backend::LlamaBackend;
use llama_cpp_2::llama_batch::LlamaBatch;
use llama_cpp_2::model::params::LlamaModelParams;
use llama_cpp_2::model::LlamaModel;
use llama_cpp_2::token::LlamaToken;
use tern_models::{KvDtype, ModelConfig};

use super::{Backend, LogitsWanted, Row, SeqId, SeqKv};
use crate::error::{Result, RuntimeError, Setting};
use crate::kv::policy::KvPolicy;

/// KV policies this backend runs.
pub const SUPPORTED: &[&str] = &["full", "streaming"];

/// llama.cpp may be initialised once per process.
static LLAMA: OnceLock<std::result::Result<LlamaBackend, String>> = OnceLock::new();

fn llama() -> Result<&'static LlamaBackend> {
    LLAMA
        .get_or_init(|| {
            let mut b = LlamaBackend::init().map_err(|e| e.to_string())?;
            b.void_logs();
            Ok(b)
        })
        .as_ref()
        .map_err(|e| RuntimeError::Backend(format!("llama.cpp init: {e}")))
}

fn err(what: &str, e: impl std::fmt::Display) -> RuntimeError {
    RuntimeError::Backend(format!("llama.cpp {what}: {e}"))
}

/// How to size the llama.cpp context.
#[derive(Clone, Debug)]
pub struct LlamaCppOptions {
    /// KV cells shared by all sequences (tokens held at once, all sequences).
    pub n_ctx: u32,
    /// Sequences held at once (forks included).
    pub n_seq_max: u32,
    /// CPU threads.
    pub n_threads: i32,
    /// How the context's cache stores keys and values (llama.cpp's
    /// `-ctk`/`-ctv`, one type for every sequence).
    pub kv_dtype: KvDtype,
}

struct LSeq {
    slot: i32,
    /// Streaming's `(sink, budget)`; `None` keeps everything.
    window: Option<(usize, usize)>,
    held: usize,
    peak: usize,
    seen: usize,
    /// Positions removed so far: llama.cpp position = Tern position - shift.
    shift: usize,
}

/// A llama.cpp model and context serving Tern's engine.
pub struct LlamaCppBackend {
    // Field order matters: the context borrows the model and must drop first
    // (see `Drop`).
    ctx: ManuallyDrop<LlamaContext<'static>>,
    model: ManuallyDrop<Box<LlamaModel>>,
    seqs: HashMap<SeqId, LSeq>,
    free_slots: Vec<i32>,
    next: SeqId,
    n_batch: usize,
    bytes_per_token: usize,
    kv_dtype: KvDtype,
}

// SAFETY: the context is only ever used by the thread that owns the backend
// (the engine thread); llama.cpp contexts may move between threads, they just
// must not be used from two at once, which `&mut self` guarantees.
unsafe impl Send for LlamaCppBackend {}

impl LlamaCppBackend {
    /// llama.cpp's own tokenization of `text` (its vocabulary code, not
    /// Tern's): the reference Tern's tokenizer is checked against.
    /// `add_special` adds BOS/EOS as the GGUF asks; `parse_special` turns
    /// control-token text into control tokens.
    pub fn tokenize(&self, text: &str, add_special: bool, parse_special: bool) -> Vec<u32> {
        self.model
            .vocab()
            .tokenize(text.as_bytes(), add_special, parse_special)
            .into_iter()
            .map(|t| t.0 as u32)
            .collect()
    }

    /// llama.cpp's own detokenization of `ids` (`llama_detokenize`): with
    /// `remove_special` a BOS/EOS the model adds is dropped, control tokens
    /// are shown with `unparse_special`, and a space prefix added by encoding
    /// is taken off again.
    pub fn detokenize(&self, ids: &[u32], remove_special: bool, unparse_special: bool) -> Vec<u8> {
        let tokens: Vec<LlamaToken> = ids.iter().map(|&i| LlamaToken(i as i32)).collect();
        self.model
            .vocab()
            .detokenize(&tokens, remove_special, unparse_special)
    }

    /// Loads `path` into llama.cpp with a context sized by `opts`; `config` is
    /// Tern's reading of the same file (for KV byte accounting).
    pub fn load(path: &Path, config: &ModelConfig, opts: &LlamaCppOptions) -> Result<Self> {
        let backend = llama()?;
        let model = LlamaModel::load_from_file(backend, path, &LlamaModelParams::default())
            .map_err(|e| err("model load", e))?;
        let model = Box::new(model);
        // SAFETY: the model lives in a Box whose address never changes and which
        // is dropped only after the context (see `Drop`), so extending the
        // borrow to 'static never lets the context outlive the model.
        let model_ref: &'static LlamaModel = unsafe { &*(model.as_ref() as *const LlamaModel) };
        let n_batch = 4096u32;
        let params = LlamaContextParams::default()
            .with_n_ctx(NonZeroU32::new(opts.n_ctx.max(64)))
            .with_n_batch(n_batch)
            .with_n_ubatch(512)
            .with_n_seq_max(opts.n_seq_max.max(1))
            // One cache shared by every sequence (llama.cpp otherwise splits
            // n_ctx evenly into per-sequence streams).
            .with_kv_unified(true)
            .with_n_threads(opts.n_threads)
            .with_n_threads_batch(opts.n_threads)
            .with_type_k(cache_type(opts.kv_dtype))
            .with_type_v(cache_type(opts.kv_dtype));
        let ctx = model_ref
            .new_context(backend, params)
            .map_err(|e| err("context", e))?;
        let bytes_per_token =
            2 * config.n_layer * config.n_kv_head * opts.kv_dtype.row_bytes(config.head_dim);
        Ok(Self {
            ctx: ManuallyDrop::new(ctx),
            model: ManuallyDrop::new(model),
            seqs: HashMap::new(),
            free_slots: (0..opts.n_seq_max.max(1) as i32).rev().collect(),
            next: 1,
            n_batch: n_batch as usize,
            bytes_per_token,
            kv_dtype: opts.kv_dtype,
        })
    }

    fn seq(&self, seq: SeqId) -> Result<&LSeq> {
        self.seqs.get(&seq).ok_or_else(|| unknown(seq))
    }

    fn alloc(&mut self, window: Option<(usize, usize)>) -> Result<SeqId> {
        let slot = self.free_slots.pop().ok_or_else(|| {
            RuntimeError::Backend("llama.cpp: every sequence slot is in use".into())
        })?;
        let id = self.next;
        self.next += 1;
        self.seqs.insert(
            id,
            LSeq {
                slot,
                window,
                held: 0,
                peak: 0,
                seen: 0,
                shift: 0,
            },
        );
        Ok(id)
    }

    /// Streaming: drop the oldest non-sink tokens down to the budget and slide
    /// the newer ones' positions down to close the gap.
    fn trim(&mut self, seq: SeqId) -> Result<()> {
        let s = self.seqs.get_mut(&seq).ok_or_else(|| unknown(seq))?;
        let Some((sink, budget)) = s.window else {
            return Ok(());
        };
        if s.held <= budget {
            return Ok(());
        }
        let excess = s.held - budget;
        let (p0, p1) = (sink as u32, (sink + excess) as u32);
        self.ctx
            .kv_cache_seq_rm(s.slot, Some(p0), Some(p1))
            .map_err(|e| err("cache remove", e))?;
        self.ctx
            .kv_cache_seq_add(s.slot, Some(p1), None, -(excess as i32))
            .map_err(|e| err("cache shift", e))?;
        s.held -= excess;
        s.shift += excess;
        Ok(())
    }
}

fn unknown(seq: SeqId) -> RuntimeError {
    RuntimeError::Backend(format!("llama.cpp: no sequence {seq}"))
}

impl Drop for LlamaCppBackend {
    fn drop(&mut self) {
        // SAFETY: dropped exactly once, context before the model it borrows.
        unsafe {
            ManuallyDrop::drop(&mut self.ctx);
            ManuallyDrop::drop(&mut self.model);
        }
    }
}

impl Backend for LlamaCppBackend {
    fn name(&self) -> &'static str {
        "llama-cpp"
    }

    fn supported_policies(&self) -> Option<&'static [&'static str]> {
        Some(SUPPORTED)
    }

    fn supported_kv_dtypes(&self) -> Option<Vec<KvDtype>> {
        Some(vec![self.kv_dtype])
    }

    fn new_seq(
        &mut self,
        policy: &KvPolicy,
        dtype: KvDtype,
        _expected_len: usize,
    ) -> Result<SeqId> {
        if dtype != self.kv_dtype {
            return Err(RuntimeError::setup(
                Setting::KvDtype,
                RuntimeError::InvalidParam {
                    param: "kv_dtype".into(),
                    reason: format!(
                        "the llama-cpp backend's cache holds {} (set when it loads); \
                         it cannot store one sequence as {}",
                        self.kv_dtype, dtype
                    ),
                },
            ));
        }
        let window = match policy {
            KvPolicy::Full => None,
            KvPolicy::Streaming(p) => Some((p.sink, p.budget)),
            other => {
                return Err(RuntimeError::InvalidParam {
                    param: "kv_policy".into(),
                    reason: format!(
                        "the llama-cpp backend supports only full and streaming, not `{}`",
                        other.name()
                    ),
                })
            }
        };
        self.alloc(window)
    }

    fn forward(&mut self, rows: &[Row<'_>]) -> Result<Vec<Option<Vec<f32>>>> {
        let total: usize = rows.iter().map(|r| r.tokens.len()).sum();
        if total > self.n_batch {
            return Err(RuntimeError::Backend(format!(
                "llama.cpp: a step of {total} tokens exceeds the batch size {}",
                self.n_batch
            )));
        }
        let mut batch = LlamaBatch::new(total.max(1), 1);
        // Per row, the batch indices whose logits it wants.
        let mut logit_rows: Vec<std::ops::Range<i32>> = Vec::with_capacity(rows.len());
        let mut at = 0i32;
        for r in rows {
            let s = self.seq(r.seq)?;
            let base = r.start_pos - s.shift;
            let n = r.tokens.len() as i32;
            let wanted = match r.logits {
                LogitsWanted::None => at..at,
                LogitsWanted::Last => (at + n - 1).max(at)..at + n,
                LogitsWanted::All => at..at + n,
            };
            for (i, &t) in r.tokens.iter().enumerate() {
                let want = wanted.contains(&(at + i as i32));
                batch
                    .add(LlamaToken(t as i32), (base + i) as i32, &[s.slot], want)
                    .map_err(|e| err("batch", e))?;
            }
            at += n;
            logit_rows.push(wanted);
        }
        self.ctx.decode(&mut batch).map_err(|e| err("decode", e))?;
        let mut out = Vec::with_capacity(rows.len());
        for (r, wanted) in rows.iter().zip(logit_rows) {
            out.push((!wanted.is_empty()).then(|| {
                wanted
                    .flat_map(|i| self.ctx.get_logits_ith(i).iter().copied())
                    .collect()
            }));
            let s = self.seqs.get_mut(&r.seq).ok_or_else(|| unknown(r.seq))?;
            s.held += r.tokens.len();
            s.seen = s.seen.max(r.start_pos + r.tokens.len());
            s.peak = s.peak.max(s.held);
            self.trim(r.seq)?;
        }
        Ok(out)
    }

    fn finish_prefill(&mut self, _seq: SeqId) -> Result<()> {
        Ok(())
    }

    fn fork(&mut self, seq: SeqId) -> Result<SeqId> {
        let (src, window, held, seen, shift) = {
            let s = self.seq(seq)?;
            (s.slot, s.window, s.held, s.seen, s.shift)
        };
        let id = self.alloc(window)?;
        let dst = self.seqs[&id].slot;
        self.ctx
            .copy_kv_cache_seq(src, dst, None, None)
            .map_err(|e| err("cache copy", e))?;
        let s = self.seqs.get_mut(&id).expect("just inserted");
        s.held = held;
        s.peak = held;
        s.seen = seen;
        s.shift = shift;
        Ok(id)
    }

    fn free(&mut self, seq: SeqId) {
        if let Some(s) = self.seqs.remove(&seq) {
            let _ = self.ctx.clear_kv_cache_seq(Some(s.slot as u32), None, None);
            self.free_slots.push(s.slot);
        }
    }

    fn kv(&self, seq: SeqId) -> SeqKv {
        self.seqs
            .get(&seq)
            .map(|s| SeqKv {
                bytes: s.held * self.bytes_per_token,
                peak: s.peak * self.bytes_per_token,
                full: s.seen * self.bytes_per_token,
                // llama.cpp's cells belong to its context, not to a sequence:
                // what the sequence holds is what it takes.
                allocated: s.held * self.bytes_per_token,
                shifts: 0,
                held: s.held,
            })
            .unwrap_or_default()
    }
}

/// llama.cpp's name for a Tern KV storage type.
fn cache_type(dtype: KvDtype) -> KvCacheType {
    match dtype {
        KvDtype::F32 => KvCacheType::F32,
        KvDtype::F16 => KvCacheType::F16,
        KvDtype::Q8_0 => KvCacheType::Q8_0,
        KvDtype::Q4_0 => KvCacheType::Q4_0,
    }
}
