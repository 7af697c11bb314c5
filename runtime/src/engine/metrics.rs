//! Live engine counters: lock-free where the engine writes every step, so
//! `/metrics` scrapes never slow the forward loop.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// Bucket upper bounds (seconds) for time to first token.
const TTFT_BUCKETS: &[f64] = &[
    0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0,
];
/// Bucket upper bounds (seconds) for the time between two tokens of a stream.
const ITL_BUCKETS: &[f64] = &[
    0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12,
];

/// A Prometheus-style histogram: cumulative buckets, sum and count.
pub struct Histogram {
    bounds: &'static [f64],
    counts: Vec<AtomicU64>,
    sum_micros: AtomicU64,
    count: AtomicU64,
}

/// A histogram read at one moment.
#[derive(Clone, Debug, PartialEq)]
pub struct HistogramSnapshot {
    /// `(upper bound in seconds, observations <= bound)`, cumulative, ascending.
    pub buckets: Vec<(f64, u64)>,
    /// Sum of all observations in seconds.
    pub sum: f64,
    /// Number of observations (the `+Inf` bucket).
    pub count: u64,
}

impl Histogram {
    fn new(bounds: &'static [f64]) -> Self {
        Self {
            bounds,
            counts: bounds.iter().map(|_| AtomicU64::new(0)).collect(),
            sum_micros: AtomicU64::new(0),
            count: AtomicU64::new(0),
        }
    }

    /// Records one observation of `secs` seconds.
    pub fn observe(&self, secs: f64) {
        if let Some(i) = self.bounds.iter().position(|&b| secs <= b) {
            self.counts[i].fetch_add(1, Ordering::Relaxed);
        }
        self.sum_micros
            .fetch_add((secs.max(0.0) * 1e6) as u64, Ordering::Relaxed);
        self.count.fetch_add(1, Ordering::Relaxed);
    }

    /// The current cumulative buckets, sum and count.
    pub fn snapshot(&self) -> HistogramSnapshot {
        let mut acc = 0;
        let buckets = self
            .bounds
            .iter()
            .zip(&self.counts)
            .map(|(&b, c)| {
                acc += c.load(Ordering::Relaxed);
                (b, acc)
            })
            .collect();
        HistogramSnapshot {
            buckets,
            sum: self.sum_micros.load(Ordering::Relaxed) as f64 / 1e6,
            count: self.count.load(Ordering::Relaxed),
        }
    }
}

/// A KV series' labels: the policy's name and the storage type's
/// (`("snapkv", "f16")`).
pub type KvKey = (String, String);

/// KV bytes held by the running sequences of one policy.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PolicyKv {
    /// Sequences running under the policy.
    pub sequences: usize,
    /// Bytes of keys and values they hold.
    pub bytes_in_use: usize,
    /// Bytes a full cache would hold for the same tokens, minus `bytes_in_use`.
    pub bytes_saved: usize,
}

/// Everything `/metrics` reports, updated by the engine thread.
pub struct EngineMetrics {
    kv_memory: u64,
    running: AtomicU64,
    waiting: AtomicU64,
    sequences: AtomicU64,
    kv_reserved: AtomicU64,
    prompt_tokens: AtomicU64,
    prompt_tokens_cached: AtomicU64,
    generated_tokens: AtomicU64,
    spec_drafted: AtomicU64,
    spec_accepted: AtomicU64,
    finished: AtomicU64,
    cancelled: AtomicU64,
    failed: AtomicU64,
    steps: AtomicU64,
    by_policy: Mutex<BTreeMap<KvKey, PolicyKv>>,
    /// Seconds from submission to a request's first token.
    pub ttft: Histogram,
    /// Seconds between consecutive tokens of one completion.
    pub itl: Histogram,
}

/// The counters read at one moment.
#[derive(Clone, Debug, PartialEq)]
pub struct MetricsSnapshot {
    /// The engine's KV memory (bytes).
    pub kv_memory: u64,
    /// Requests admitted and not finished.
    pub running: u64,
    /// Requests waiting for admission.
    pub waiting: u64,
    /// Sequences (completions) running.
    pub sequences: u64,
    /// KV bytes reserved by running requests.
    pub kv_reserved: u64,
    /// Prompt tokens prefilled since start.
    pub prompt_tokens: u64,
    /// Prompt tokens taken from the prompt-prefix cache instead of prefilled.
    pub prompt_tokens_cached: u64,
    /// Tokens generated since start.
    pub generated_tokens: u64,
    /// Draft tokens speculative decoding proposed and verified.
    pub spec_drafted: u64,
    /// Draft tokens the model agreed with (each saved a forward).
    pub spec_accepted: u64,
    /// Requests that ran to completion.
    pub finished: u64,
    /// Requests cancelled because their client went away.
    pub cancelled: u64,
    /// Requests that failed inside the engine.
    pub failed: u64,
    /// Forward steps run.
    pub steps: u64,
    /// KV bytes in use and saved, by policy name and storage type.
    pub by_policy: BTreeMap<KvKey, PolicyKv>,
    /// Time to first token.
    pub ttft: HistogramSnapshot,
    /// Inter-token latency.
    pub itl: HistogramSnapshot,
}

impl EngineMetrics {
    pub(crate) fn new(kv_memory: usize) -> Self {
        Self {
            kv_memory: kv_memory as u64,
            running: AtomicU64::new(0),
            waiting: AtomicU64::new(0),
            sequences: AtomicU64::new(0),
            kv_reserved: AtomicU64::new(0),
            prompt_tokens: AtomicU64::new(0),
            prompt_tokens_cached: AtomicU64::new(0),
            generated_tokens: AtomicU64::new(0),
            spec_drafted: AtomicU64::new(0),
            spec_accepted: AtomicU64::new(0),
            finished: AtomicU64::new(0),
            cancelled: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            steps: AtomicU64::new(0),
            by_policy: Mutex::new(BTreeMap::new()),
            ttft: Histogram::new(TTFT_BUCKETS),
            itl: Histogram::new(ITL_BUCKETS),
        }
    }

    /// Reads every counter.
    pub fn snapshot(&self) -> MetricsSnapshot {
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        MetricsSnapshot {
            kv_memory: self.kv_memory,
            running: get(&self.running),
            waiting: get(&self.waiting),
            sequences: get(&self.sequences),
            kv_reserved: get(&self.kv_reserved),
            prompt_tokens: get(&self.prompt_tokens),
            prompt_tokens_cached: get(&self.prompt_tokens_cached),
            generated_tokens: get(&self.generated_tokens),
            spec_drafted: get(&self.spec_drafted),
            spec_accepted: get(&self.spec_accepted),
            finished: get(&self.finished),
            cancelled: get(&self.cancelled),
            failed: get(&self.failed),
            steps: get(&self.steps),
            by_policy: self.by_policy.lock().map(|m| m.clone()).unwrap_or_default(),
            ttft: self.ttft.snapshot(),
            itl: self.itl.snapshot(),
        }
    }

    pub(crate) fn set_load(
        &self,
        running: usize,
        waiting: usize,
        sequences: usize,
        reserved: usize,
    ) {
        self.running.store(running as u64, Ordering::Relaxed);
        self.waiting.store(waiting as u64, Ordering::Relaxed);
        self.sequences.store(sequences as u64, Ordering::Relaxed);
        self.kv_reserved.store(reserved as u64, Ordering::Relaxed);
    }

    pub(crate) fn set_policy_kv(&self, by_policy: BTreeMap<KvKey, PolicyKv>) {
        if let Ok(mut m) = self.by_policy.lock() {
            // Keep policies seen before at zero, so their series do not vanish.
            for v in m.values_mut() {
                *v = PolicyKv::default();
            }
            m.extend(by_policy);
        }
    }

    pub(crate) fn add_prompt_tokens(&self, n: usize) {
        self.prompt_tokens.fetch_add(n as u64, Ordering::Relaxed);
    }

    pub(crate) fn add_cached_prompt_tokens(&self, n: usize) {
        self.prompt_tokens_cached
            .fetch_add(n as u64, Ordering::Relaxed);
    }

    pub(crate) fn add_generated(&self, n: usize) {
        self.generated_tokens.fetch_add(n as u64, Ordering::Relaxed);
    }

    pub(crate) fn add_speculation(&self, drafted: usize, accepted: usize) {
        self.spec_drafted
            .fetch_add(drafted as u64, Ordering::Relaxed);
        self.spec_accepted
            .fetch_add(accepted as u64, Ordering::Relaxed);
    }

    pub(crate) fn step(&self) {
        self.steps.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn finished(&self) {
        self.finished.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn cancelled(&self) {
        self.cancelled.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn failed(&self, n: usize) {
        self.failed.fetch_add(n as u64, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_buckets_are_cumulative() {
        let h = Histogram::new(&[0.1, 1.0]);
        h.observe(0.05);
        h.observe(0.5);
        h.observe(3.0);
        let s = h.snapshot();
        assert_eq!(s.buckets, vec![(0.1, 1), (1.0, 2)]);
        assert_eq!(s.count, 3);
        assert!((s.sum - 3.55).abs() < 1e-6);
    }
}
