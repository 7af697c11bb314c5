//! Speculative decoding by prompt lookup (n-gram drafting): a completion
//! whose last tokens already occurred earlier in its prompt or output
//! proposes the tokens that followed them there, and ONE forward of the
//! target model scores its last token and the whole draft together.
//!
//! Verification is plain decoding run over the draft's positions: at each
//! position the completion's own step (sampler, penalties, grammar, stops,
//! limits, logprobs) picks the token plain decoding would pick from that
//! position's logits, and the draft is accepted while that token equals the
//! draft's. For a point-mass draft this is exactly the standard rejection
//! scheme: the draft token `d` is kept with probability `p(d)`, and on a
//! rejection the token comes from `p` with `d` removed and renormalised (a
//! draw from `p` conditioned on not being `d`). Greedy output is therefore
//! identical to plain decoding, and sampled output is too, token for token
//! under the same seed, since each position's logits are the same numbers
//! and the sampler's rng is drawn once per emitted token, in the same order.
//! The numbers are the same because a step that verifies a draft runs its
//! decode rows through [`Backend::forward_alone`]: llama.cpp's kernels (and
//! Tern's, bit for bit) sum in another order from 2, 4 or 8 activation rows
//! on (F16, Q4_K repacked, the other K-quants), and a near-tie between two
//! tokens can turn on that last bit; in the one-row order it cannot. The
//! draft's rows attend one by one too, each over the entries up to its own
//! on the kernel plain decoding takes for that many (the vectorized decode
//! from 512 cached entries on).
//!
//! The cache then holds the rejected draft tokens too; the backend rewinds
//! them ([`Backend::rewind`]). Under a compressing KV policy plain decoding
//! scores every token's attention and may evict between two tokens, so a
//! draft's row is verified only where plain decoding would not have evicted
//! before it: the draft stops at the policy's next compression
//! ([`Backend::verify_rows`]; h2o's every-step eviction leaves no room, and
//! the steps it held back are counted; a streaming window, which slides by
//! position alone, bounds nothing: each row skips what the window slid past
//! before it, `KvStore::draft_gap`), and the
//! cache holds the rows' scoring back ([`Backend::begin_verify`]) until the
//! rewind, which applies it for the accepted rows only and compresses where
//! plain decoding would have. The cache, the eviction figures and the output
//! are then plain decoding's. Speculation stays off for a context that
//! overflows (its cache is re-numbered), for thinking budgets, whose probes
//! fork at exact token counts, for eviction records, and for backends or
//! caches that cannot rewind (sliding-window layers), with the reason in
//! its statistics.
//!
//! A second source of drafts is a small model of the same vocabulary (see
//! `draft`): it proposes its greedy continuation, a point-mass draft too, so
//! the same verification keeps the output plain decoding's whichever model
//! drafted; only how many drafts are accepted (and so the speed) depends on
//! it.

use std::str::FromStr;
use std::time::Instant;

use super::apply::{emit_done, emit_token};
use super::draft::DraftSeq;
use super::running::Running;
use super::{Shared, SubmitRequest};
use crate::backend::{Backend, SeqId};
use crate::error::RuntimeError;
use crate::model::LoadedModel;

/// Longest draft a request may ask for: the draft rides in one row of the
/// batched forward, which must stay below the row count from which
/// attention switches kernel (and rounds differently).
pub const MAX_DRAFT: usize = 16;

/// The draft length used when a request asks for `ngram` or `draft` without one.
pub const DEFAULT_MAX_DRAFT: usize = 8;

/// The longest and shortest n-grams looked up, longest first: a longer
/// match predicts better, a 2-gram still finds a copy that has just begun.
const NGRAM_MAX: usize = 4;
const NGRAM_MIN: usize = 2;

/// The draft length a completion starts with, before its acceptance is known.
const START_DRAFT: usize = 4;

/// Most decode steps a completion goes without drafting after drafts that
/// were rejected outright: a verifying row costs more than a plain one, so
/// text that does not repeat (chat) must not pay it every step.
const MAX_PAUSE: usize = 32;

/// How a request speculates: a user's choice, per request or server-wide.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Speculative {
    /// Plain decoding, one token per forward.
    #[default]
    Off,
    /// Prompt lookup: drafts of up to `max_draft` tokens copied from where
    /// the completion's latest n-gram occurred before.
    Ngram {
        /// Most draft tokens verified in one forward (1..=[`MAX_DRAFT`]).
        max_draft: usize,
    },
    /// Draft-model speculation: up to `max_draft` tokens proposed greedily by
    /// the engine's draft model (`--draft-model`), a smaller model of the
    /// same vocabulary.
    Draft {
        /// Most draft tokens verified in one forward (1..=[`MAX_DRAFT`]).
        max_draft: usize,
    },
}

/// A `speculative` value that names no mode or gives a bad draft length.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("unknown speculative `{given}`: expected `off`, `ngram`, `draft`, `ngram:max_draft=N` or `draft:max_draft=N` with N in 1..={MAX_DRAFT}")]
pub struct UnknownSpeculative {
    /// What was given.
    pub given: String,
}

impl Speculative {
    /// Prompt lookup with a draft length, checked against [`MAX_DRAFT`].
    pub fn ngram(max_draft: usize) -> Result<Self, UnknownSpeculative> {
        if (1..=MAX_DRAFT).contains(&max_draft) {
            Ok(Speculative::Ngram { max_draft })
        } else {
            Err(UnknownSpeculative {
                given: format!("ngram:max_draft={max_draft}"),
            })
        }
    }

    /// Draft-model speculation with a draft length, checked against [`MAX_DRAFT`].
    pub fn draft(max_draft: usize) -> Result<Self, UnknownSpeculative> {
        match Self::ngram(max_draft) {
            Ok(_) => Ok(Speculative::Draft { max_draft }),
            Err(_) => Err(UnknownSpeculative {
                given: format!("draft:max_draft={max_draft}"),
            }),
        }
    }

    /// Whether this asks for any speculation.
    pub fn is_on(&self) -> bool {
        !matches!(self, Speculative::Off)
    }

    /// The longest draft it verifies at once (0 when off).
    pub fn max_draft(&self) -> usize {
        match *self {
            Speculative::Off => 0,
            Speculative::Ngram { max_draft } | Speculative::Draft { max_draft } => max_draft,
        }
    }
}

impl FromStr for Speculative {
    type Err = UnknownSpeculative;

    /// `off`, `ngram`, `draft`, or `ngram:max_draft=N` / `draft:max_draft=N`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || UnknownSpeculative { given: s.into() };
        let n = |rest: &str| rest.parse::<usize>().ok().ok_or_else(bad);
        match s.trim() {
            "off" | "none" => Ok(Speculative::Off),
            "ngram" => Ok(Speculative::Ngram {
                max_draft: DEFAULT_MAX_DRAFT,
            }),
            "draft" => Ok(Speculative::Draft {
                max_draft: DEFAULT_MAX_DRAFT,
            }),
            other => {
                if let Some(rest) = other.strip_prefix("ngram:max_draft=") {
                    Speculative::ngram(n(rest)?).map_err(|_| bad())
                } else if let Some(rest) = other.strip_prefix("draft:max_draft=") {
                    Speculative::draft(n(rest)?).map_err(|_| bad())
                } else {
                    Err(bad())
                }
            }
        }
    }
}

impl std::fmt::Display for Speculative {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Speculative::Off => f.write_str("off"),
            Speculative::Ngram { max_draft } => write!(f, "ngram:max_draft={max_draft}"),
            Speculative::Draft { max_draft } => write!(f, "draft:max_draft={max_draft}"),
        }
    }
}

/// What speculation did for one completion: reported so a user can see
/// whether it paid (the acceptance rate) or why it did not run.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct SpecStats {
    /// Draft tokens proposed and verified.
    pub drafted: usize,
    /// Draft tokens the target model agreed with (emitted without a forward
    /// of their own).
    pub accepted: usize,
    /// Forwards that carried a draft.
    pub verify_steps: usize,
    /// Decode steps that carried no draft because the KV policy scores and
    /// evicts at the very next token (h2o's every-step eviction): a draft's
    /// rows must not straddle an eviction decided by attention, so such a
    /// policy verifies nothing beyond the one token.
    #[serde(skip_serializing_if = "is_zero")]
    pub held_by_policy: usize,
    /// Why speculation was off for this completion although asked for.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub off: Option<String>,
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

/// One completion's drafting state: the adaptive draft length, the tokens
/// the next forward feeds, and its statistics.
pub(super) struct Drafter {
    max_draft: usize,
    /// The draft length to try next: grows while drafts are accepted whole,
    /// shrinks to what was accepted after a rejection.
    len: usize,
    /// The completion's uncached tokens followed by the draft (the row's tokens).
    feed: Vec<u32>,
    /// Draft tokens at the end of `feed`.
    drafted: usize,
    /// Steps to decode plainly before drafting again.
    pause: usize,
    /// Drafts in a row rejected at their first token (the pause doubles with each).
    misses: u32,
    /// Draft tokens the draft model is to propose this step (0: none).
    want: usize,
    /// The draft model's cache of this completion, when a model drafts
    /// (`None`: prompt lookup).
    pub(super) model: Option<DraftSeq>,
    pub(super) stats: SpecStats,
}

impl Drafter {
    fn new(max_draft: usize) -> Self {
        Self {
            max_draft,
            len: START_DRAFT.min(max_draft),
            feed: Vec::new(),
            drafted: 0,
            pause: 0,
            misses: 0,
            want: 0,
            model: None,
            stats: SpecStats::default(),
        }
    }

    /// How many tokens the draft model is to propose for this step.
    pub(super) fn wanted(&self) -> usize {
        self.want
    }

    /// Takes the draft model's proposal for this step: the row feeds the
    /// completion's `uncached` tokens, then `draft`.
    pub(super) fn propose(&mut self, uncached: &[u32], draft: &[u32]) {
        self.want = 0;
        self.feed.clear();
        self.drafted = draft.len();
        if !draft.is_empty() {
            self.feed.extend_from_slice(uncached);
            self.feed.extend_from_slice(draft);
        }
    }

    /// The row's tokens when a draft is pending: the completion's uncached
    /// tokens and the draft.
    pub(super) fn feed(&self) -> Option<&[u32]> {
        (self.drafted > 0).then_some(self.feed.as_slice())
    }

    /// Records a verification that accepted `accepted` of the draft and
    /// adapts the next draft's length.
    fn verified(&mut self, accepted: usize) {
        self.stats.drafted += self.drafted;
        self.stats.accepted += accepted;
        self.stats.verify_steps += 1;
        if accepted == 0 {
            self.misses = (self.misses + 1).min(6);
            self.pause = (1usize << self.misses).min(MAX_PAUSE);
        } else {
            self.misses = 0;
        }
        self.len = if accepted == self.drafted {
            (self.len + 2).min(self.max_draft)
        } else {
            (accepted + 1).min(self.max_draft)
        };
        self.drafted = 0;
        self.feed.clear();
    }
}

/// The tokens that followed the latest earlier occurrence of `tokens`' last
/// n-gram (n from [`NGRAM_MAX`] down to [`NGRAM_MIN`], the longest that
/// occurs), at most `max_len` of them; empty when none occurs.
pub fn lookup(tokens: &[u32], max_len: usize) -> &[u32] {
    let len = tokens.len();
    if max_len == 0 {
        return &[];
    }
    for n in (NGRAM_MIN..=NGRAM_MAX.min(len.saturating_sub(1))).rev() {
        let tail = &tokens[len - n..];
        // Latest start `i` with `tokens[i..i + n] == tail` and a token after it.
        let found = (0..len - n).rev().find(|&i| &tokens[i..i + n] == tail);
        if let Some(i) = found {
            let from = i + n;
            return &tokens[from..(from + max_len).min(len)];
        }
    }
    &[]
}

/// Why `req` may not speculate on `seq`, if it may not.
pub(super) fn refusal(req: &SubmitRequest, backend: &dyn Backend, seq: SeqId) -> Option<String> {
    if let Some(overflow) = &req.overflow {
        return Some(format!(
            "context_overflow {} re-numbers the cache once the context fills: a draft \
             verified across it would see other positions than plain decoding",
            overflow.name()
        ));
    }
    if req.think.is_some() {
        return Some("thinking budgets probe at exact token counts".into());
    }
    if req.record_evictions {
        return Some("eviction records are kept token by token".into());
    }
    if !backend.can_rewind(seq) {
        return Some(format!(
            "the {} backend cannot rewind this sequence's cache (sliding-window layers or a foreign cache)",
            backend.name()
        ));
    }
    None
}

/// Gives each of `r`'s new completions its drafter, or the reason it has none.
pub(super) fn arm(r: &mut Running, backend: &dyn Backend) {
    let (max_draft, by_model) = match r.req.speculative.unwrap_or_default() {
        Speculative::Off => return,
        Speculative::Ngram { max_draft } => (max_draft, false),
        Speculative::Draft { max_draft } => (max_draft, true),
    };
    for c in &mut r.completions {
        match refusal(&r.req, backend, c.seq) {
            None => {
                let mut d = Drafter::new(max_draft);
                d.model = by_model.then(DraftSeq::default);
                c.spec = Some(d);
            }
            Some(reason) => c.spec_off = Some(reason),
        }
    }
}

/// Before planning a step: drafts for every completion that speculates by
/// prompt lookup, and the length each completion that drafts with a model
/// wants (the draft model fills those next), so that the plan's rows can
/// borrow the drafts. A draft never runs past the completion's token limit
/// or the context.
pub(super) fn draft_all(running: &mut [Running], context_length: usize, backend: &dyn Backend) {
    for r in running {
        let max_tokens = r.req.max_tokens;
        for c in &mut r.completions {
            let Some(d) = c.spec.as_mut() else { continue };
            d.feed.clear();
            d.drafted = 0;
            d.want = 0;
            if d.pause > 0 {
                d.pause -= 1;
                continue;
            }
            // A draft rides behind exactly one uncached token: several would
            // be a chunk, which plain decoding reads with batched kernels.
            if c.history.len() != c.cached + 1 {
                continue;
            }
            let limit = max_tokens.min(c.limit.unwrap_or(usize::MAX));
            // Verification emits up to draft + 1 tokens; under a compressing
            // KV policy the row stops where plain decoding would next evict.
            let room = limit
                .saturating_sub(c.generated + 1)
                .min(context_length.saturating_sub(c.history.len() + 1));
            let policy_room = backend.verify_rows(c.seq).saturating_sub(1);
            if policy_room == 0 && room > 0 {
                d.stats.held_by_policy += 1;
            }
            let room = room.min(policy_room);
            if d.model.is_some() {
                d.want = d.len.min(room);
                continue;
            }
            let draft = lookup(&c.history, d.len.min(room));
            d.drafted = draft.len();
            if d.drafted > 0 {
                d.feed.extend_from_slice(&c.history[c.cached..]);
                d.feed.extend_from_slice(draft);
            }
        }
    }
}

/// After the forward, for completion `ci` of `r` whose row carried a draft
/// (`row`: the logits of every fed token): emits, position by position, the
/// token plain decoding emits there, until one disagrees with the draft or
/// the completion ends, then rewinds the rejected draft tokens out of the
/// cache.
pub(super) fn verify(
    r: &mut Running,
    ci: usize,
    backend: &mut dyn Backend,
    model: &LoadedModel,
    row: &[f32],
    now: Instant,
    shared: &Shared,
) -> crate::error::Result<()> {
    let c = &r.completions[ci];
    let Some(d) = c.spec.as_ref().filter(|d| d.drafted > 0) else {
        return Ok(());
    };
    let fed = d.feed.len();
    if row.is_empty() || !row.len().is_multiple_of(fed) {
        return Err(RuntimeError::Backend(format!(
            "a draft's row of {fed} tokens came back with {} logits",
            row.len()
        )));
    }
    let vocab = row.len() / fed;
    let draft: Vec<u32> = d.feed[fed - d.drafted..].to_vec();
    // Row of the completion's last uncached token: its logits give the
    // token at the draft's first position.
    let first = fed - draft.len() - 1;
    // The cache now holds the history and the whole draft.
    let held = c.history.len() + draft.len();
    let mut finish = None;
    let (accepted, _) = walk(&draft, |j| {
        let at = (first + j) * vocab;
        let (token, f) = emit_token(r, ci, model, &row[at..at + vocab], now, shared);
        finish = f;
        (token, f.is_some())
    });
    shared.metrics.add_speculation(draft.len(), accepted);
    let c = &mut r.completions[ci];
    if let Some(d) = c.spec.as_mut() {
        d.verified(accepted);
    }
    // The last emitted token is fed next; the cache keeps what precedes it.
    // Always rewound, a draft kept whole too: a compressing cache settles
    // its policy's work for the kept rows there (`Backend::begin_verify`).
    if !backend.rewind(c.seq, c.cached.min(held))? {
        return Err(RuntimeError::Backend(
            "the backend could not rewind a rejected draft".into(),
        ));
    }
    if let Some(reason) = finish {
        emit_done(r, ci, reason, backend, shared);
    }
    Ok(())
}

/// The acceptance rule over a draft: `decide(j)` emits the token plain
/// decoding emits at draft position `j` (position `draft.len()` is the
/// token after a fully accepted draft) and says whether the completion ended
/// there. Draft token `j` is accepted when the emitted token equals it.
/// Returns the accepted count and whether the completion ended.
pub fn walk(draft: &[u32], mut decide: impl FnMut(usize) -> (u32, bool)) -> (usize, bool) {
    for (j, &want) in draft.iter().enumerate() {
        let (token, ended) = decide(j);
        let accepted = j + usize::from(token == want);
        if ended || token != want {
            return (accepted, ended);
        }
    }
    let (_, ended) = decide(draft.len());
    (draft.len(), ended)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampler::{Sampler, SamplingParams};

    #[test]
    fn lookup_copies_what_followed_the_longest_latest_ngram() {
        // "1 2 3 4 5 | 9 | 1 2 3" -> the 3-gram 1 2 3 was followed by 4 5 9.
        let t = [1, 2, 3, 4, 5, 9, 1, 2, 3];
        assert_eq!(lookup(&t, 8), &[4, 5, 9, 1, 2, 3]);
        assert_eq!(lookup(&t, 2), &[4, 5]);
        assert_eq!(lookup(&t, 0), &[] as &[u32]);
        // The latest occurrence wins: 7 8 was followed by 1, later by 2.
        assert_eq!(lookup(&[7, 8, 1, 7, 8, 2, 7, 8], 1), &[2]);
        // A longer match beats a later shorter one.
        assert_eq!(lookup(&[5, 6, 7, 1, 9, 6, 7, 2, 5, 6, 7], 1), &[1]);
        // Nothing repeats: no draft.
        assert!(lookup(&[1, 2, 3, 4], 4).is_empty());
        // A single repeated token is not enough (n >= 2).
        assert!(lookup(&[4, 1, 2, 4], 4).is_empty());
    }

    #[test]
    fn speculative_values_parse_or_fail_clearly() {
        assert_eq!("off".parse(), Ok(Speculative::Off));
        assert_eq!(
            "ngram".parse(),
            Ok(Speculative::Ngram {
                max_draft: DEFAULT_MAX_DRAFT
            })
        );
        assert_eq!(
            "ngram:max_draft=3".parse(),
            Ok(Speculative::Ngram { max_draft: 3 })
        );
        assert_eq!(
            "draft".parse(),
            Ok(Speculative::Draft {
                max_draft: DEFAULT_MAX_DRAFT
            })
        );
        assert_eq!(
            "draft:max_draft=16".parse(),
            Ok(Speculative::Draft { max_draft: 16 })
        );
        for bad in [
            "draft-model",
            "ngram:max_draft=0",
            "ngram:max_draft=17",
            "draft:max_draft=0",
            "draft:max_draft=17",
            "ngram:x=1",
        ] {
            let e = bad.parse::<Speculative>().unwrap_err();
            assert!(e.to_string().contains(bad), "{e}");
        }
        for s in [
            Speculative::Ngram { max_draft: 5 },
            Speculative::Draft { max_draft: 3 },
        ] {
            assert_eq!(s.to_string().parse(), Ok(s));
        }
    }

    #[test]
    fn adaptive_length_grows_on_full_acceptance_and_shrinks_on_rejection() {
        let mut d = Drafter::new(8);
        assert_eq!(d.len, START_DRAFT);
        d.drafted = 4;
        d.verified(4);
        assert_eq!(d.len, 6);
        d.drafted = 6;
        d.verified(6);
        assert_eq!(d.len, 8, "capped at max_draft");
        d.drafted = 8;
        d.verified(2);
        assert_eq!(d.len, 3);
        assert_eq!((d.stats.drafted, d.stats.accepted), (18, 12));
        assert_eq!(d.pause, 0, "a partly accepted draft does not pause");
        // Drafts rejected outright pause drafting, longer each time.
        d.drafted = 3;
        d.verified(0);
        assert_eq!((d.len, d.pause), (1, 2));
        d.drafted = 1;
        d.verified(0);
        assert_eq!(d.pause, 4);
        d.drafted = 1;
        d.verified(1);
        assert_eq!(
            (d.pause, d.misses),
            (4, 0),
            "an acceptance resets the doubling"
        );
    }

    /// Softmax of `logits`.
    fn probs(logits: &[f32]) -> Vec<f64> {
        let m = logits.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
        let e: Vec<f64> = logits.iter().map(|l| ((l - m) as f64).exp()).collect();
        let s: f64 = e.iter().sum();
        e.iter().map(|x| x / s).collect()
    }

    #[test]
    fn sampled_verification_follows_the_target_distribution() {
        // Two draft positions with fixed logits; the draft's tokens are
        // likely but not certain, so both acceptance and rejection happen.
        let l0 = [2.0f32, 1.0, 0.5, -1.0];
        let l1 = [0.0f32, 1.5, 0.2, 0.7];
        let draft = [0u32, 1];
        let (p0, p1) = (probs(&l0), probs(&l1));
        let trials = 40_000;
        let mut first = [0usize; 4];
        let mut second_after_accept = [0usize; 4];
        let mut accepted_first = 0;
        for seed in 0..trials {
            let mut s = Sampler::new(SamplingParams {
                temperature: 1.0,
                seed: seed as u64,
                ..SamplingParams::default()
            });
            let mut out = Vec::new();
            let (acc, _) = walk(&draft, |j| {
                let logits: &[f32] = if j == 0 { &l0 } else { &l1 };
                let t = s.sample(logits, &[]).token;
                out.push(t);
                (t, false)
            });
            first[out[0] as usize] += 1;
            if acc >= 1 {
                accepted_first += 1;
                second_after_accept[out[1] as usize] += 1;
            }
            // The emitted sequence is the accepted draft plus one token.
            assert_eq!(out.len(), acc + 1);
            assert_eq!(&out[..acc], &draft[..acc]);
        }
        let n = trials as f64;
        // The first token follows p0; the draft's token is kept with p0(d).
        for t in 0..4 {
            let got = first[t] as f64 / n;
            assert!((got - p0[t]).abs() < 0.01, "token {t}: {got} vs {}", p0[t]);
        }
        let rate = accepted_first as f64 / n;
        assert!(
            (rate - p0[0]).abs() < 0.01,
            "acceptance {rate} vs {}",
            p0[0]
        );
        // After an accepted first token, the second follows p1.
        let m = accepted_first as f64;
        for t in 0..4 {
            let got = second_after_accept[t] as f64 / m;
            assert!((got - p1[t]).abs() < 0.015, "token {t}: {got} vs {}", p1[t]);
        }
    }

    #[test]
    fn walk_stops_at_an_end_even_on_an_agreeing_token() {
        let mut calls = 0;
        let (acc, ended) = walk(&[5, 6, 7], |j| {
            calls += 1;
            ([5, 6, 7][j], j == 1)
        });
        assert_eq!((acc, ended, calls), (2, true, 2));
        // Full acceptance emits one more token from the last position.
        let mut calls = 0;
        let (acc, ended) = walk(&[5, 6], |_| {
            calls += 1;
            ([5, 6, 9][calls - 1], false)
        });
        assert_eq!((acc, ended, calls), (2, false, 3));
    }
}
