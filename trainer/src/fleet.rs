//! Rollouts on a fleet of OpenAI-compatible servers (`--rollout-endpoints`):
//! the learner stays in the trainer process, each step's adapter reaches the
//! workers by path (`POST /v1/load_lora_adapter`, vLLM's shape), and every
//! group is one `/v1/completions` request (`n = G`, token-id prompt, the
//! sampled tokens' log-probabilities as ids) sent to the least-loaded live
//! worker. A worker that refuses a connection, fails or times out is taken out
//! and its requests go to another; it comes back when it next accepts an
//! adapter. What went where is in the step's metrics.
//!
//! Workers on the network run with a key (`tern serve --api-key-file`, which
//! it requires off loopback): the key from `--rollout-api-key-file` goes as
//! `Authorization: Bearer KEY` on every request, and `https://` endpoints are
//! reached over TLS (rustls, checked against the webpki roots), so a peer on
//! the path can neither read the key nor swap the policy's adapter.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::{json, Value};

use crate::error::{Result, TrainError};

/// What to do with a rollout sampled under an older adapter than the one the
/// learner holds (a worker that answered from a version it still had).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum StaleRollouts {
    /// Keep it: its recorded log-probabilities are the behaviour policy, so
    /// the importance ratio against pi_old corrects it like any sampler
    /// mismatch.
    #[default]
    Correct,
    /// Drop it from its group (advantages over the rest).
    Drop,
}

impl std::str::FromStr for StaleRollouts {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "correct" => Ok(Self::Correct),
            "drop" => Ok(Self::Drop),
            _ => Err(format!(
                "unknown stale-rollout handling `{s}` (valid: correct, drop)"
            )),
        }
    }
}

/// One group's request: a prompt and how to sample it.
#[derive(Clone, Debug)]
pub struct Job {
    /// Chat-templated prompt ids.
    pub prompt: Vec<u32>,
    /// Completions (`G`).
    pub n: usize,
    /// Sampler seed of completion 0 (completion `j` uses `seed + j`).
    pub seed: u64,
    /// Sampling temperature.
    pub temperature: f32,
    /// Most new tokens per completion.
    pub max_tokens: usize,
    /// KV policy spec (`full` for a dense rollout).
    pub kv_policy: String,
}

/// One completion as a worker returned it.
#[derive(Clone, Debug)]
pub struct Sampled {
    /// Its text.
    pub text: String,
    /// Its token ids.
    pub tokens: Vec<u32>,
    /// The sampler's log-probability of each token.
    pub logprobs: Vec<f64>,
    /// Most KV bytes it held (0 when the worker does not say).
    pub kv_peak_bytes: usize,
    /// Bytes a full cache would have held (0 when the worker does not say).
    pub kv_full_bytes: usize,
}

/// A job's answer.
#[derive(Clone, Debug)]
pub struct Answered {
    /// The `n` completions in index order.
    pub completions: Vec<Sampled>,
    /// The adapter version the worker sampled under.
    pub version: Option<u64>,
    /// Which worker answered (index into the fleet).
    pub worker: usize,
}

/// One worker's share of a step.
#[derive(Clone, Debug, Default, Serialize, serde::Deserialize, PartialEq)]
pub struct WorkerStats {
    /// Its URL.
    pub url: String,
    /// Requests it answered.
    pub requests: usize,
    /// Requests it failed (connection, status or timeout).
    pub failures: usize,
    /// Whether it was taken out during the step.
    pub lost: bool,
}

/// What the fleet did in one step.
#[derive(Clone, Debug, Default, Serialize, serde::Deserialize, PartialEq)]
pub struct FleetStats {
    /// Per worker, in the order given.
    pub workers: Vec<WorkerStats>,
    /// Requests sent again after a worker failed them.
    pub retried: usize,
    /// Rollouts sampled under an older adapter than the learner's.
    pub stale: usize,
    /// Of those, how many were dropped.
    pub stale_dropped: usize,
}

struct Worker {
    url: String,
    /// Whether it is a `tern serve` (KV policies and per-choice KV figures).
    tern: bool,
    alive: bool,
    in_flight: usize,
}

/// How the trainer reaches its workers and what it asks of them.
#[derive(Clone, Debug)]
pub struct FleetConfig {
    /// Most time a worker may take to answer one request before it is taken
    /// out and its request goes to another.
    pub timeout: Duration,
    /// The rollouts' KV policy spec (`full`: dense).
    pub kv_policy: String,
    /// Where each version's adapter is written (inside the workers'
    /// `--lora-dir`).
    pub adapters: PathBuf,
    /// What to do with a rollout sampled under an older adapter.
    pub stale: StaleRollouts,
    /// The workers' API key, sent as a bearer token on every request
    /// (`--rollout-api-key-file`); `None` sends none.
    pub api_key: Option<String>,
}

/// The workers and the adapters published to them.
pub struct Fleet {
    workers: Mutex<Vec<Worker>>,
    agent: ureq::Agent,
    /// `Authorization` header value on every request, when a key is set.
    auth: Option<String>,
    adapters: PathBuf,
    /// The adapter name the workers serve now, and its version.
    current: Mutex<Option<(String, u64)>>,
    stale: StaleRollouts,
}

/// The name a version's adapter is served under.
fn adapter_name(version: u64) -> String {
    format!("tern-v{version}")
}

/// The workers' API key from `path`: its first line, trimmed. A file that
/// cannot be read or holds no key is a one-line config error naming the flag.
pub fn read_api_key(path: &Path) -> Result<String> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        TrainError::Config(format!(
            "--rollout-api-key-file {}: cannot read it: {e}",
            path.display()
        ))
    })?;
    let key = text.lines().next().unwrap_or("").trim();
    if key.is_empty() {
        return Err(TrainError::Config(format!(
            "--rollout-api-key-file {}: the file holds no key (its first line is empty)",
            path.display()
        )));
    }
    Ok(key.to_string())
}

/// The version in a served adapter's name.
fn name_version(name: &str) -> Option<u64> {
    name.strip_prefix("tern-v")?.parse().ok()
}

impl Fleet {
    /// Connects to every URL (`http://host:port` or `https://host:port`,
    /// with or without `/v1`), asking each what it serves; a URL that does
    /// not answer is an error (a 401 says whether a key was sent), as is a
    /// sparse `kv_policy` with a worker that is not `tern serve` (other
    /// servers would ignore the field and roll out dense).
    pub fn connect(urls: &[String], config: &FleetConfig) -> Result<Fleet> {
        let agent = ureq::AgentBuilder::new()
            .timeout_connect(Duration::from_secs(10))
            .timeout_read(config.timeout)
            .timeout_write(Duration::from_secs(60))
            .build();
        let fleet = Fleet {
            workers: Mutex::new(Vec::with_capacity(urls.len())),
            agent,
            auth: config.api_key.as_ref().map(|k| format!("Bearer {k}")),
            adapters: config.adapters.clone(),
            current: Mutex::new(None),
            stale: config.stale,
        };
        for raw in urls {
            let url = base_url(raw)?;
            let models: Value = fleet
                .get(&format!("{url}/v1/models"))
                .call()
                .map_err(|e| fleet.connect_err(&url, e))?
                .into_json()
                .map_err(|e| TrainError::Rollout(format!("{url}: /v1/models: {e}")))?;
            let tern = models["data"]
                .as_array()
                .is_some_and(|d| d.iter().any(|m| m["owned_by"] == "tern"));
            let kv_policy = &config.kv_policy;
            if !tern && kv_policy != "full" {
                return Err(TrainError::Config(format!(
                    "rollout endpoint {url} is not tern serve, so it cannot roll out under the KV policy `{kv_policy}`; use tern serve workers or a dense (`full`) policy"
                )));
            }
            fleet.lock().push(Worker {
                url,
                tern,
                alive: true,
                in_flight: 0,
            });
        }
        if fleet.lock().is_empty() {
            return Err(TrainError::Config(
                "--rollout-endpoints names no URL".into(),
            ));
        }
        std::fs::create_dir_all(&fleet.adapters).map_err(|e| {
            TrainError::Rollout(format!("creating {}: {e}", fleet.adapters.display()))
        })?;
        Ok(fleet)
    }

    /// A GET to a worker, carrying the key when there is one.
    fn get(&self, url: &str) -> ureq::Request {
        self.authorized(self.agent.get(url))
    }

    /// A POST to a worker, carrying the key when there is one.
    fn post(&self, url: &str) -> ureq::Request {
        self.authorized(self.agent.post(url))
    }

    fn authorized(&self, request: ureq::Request) -> ureq::Request {
        match &self.auth {
            Some(auth) => request.set("Authorization", auth),
            None => request,
        }
    }

    /// Why a worker did not answer the first request, in one line; a 401
    /// says what to do about the key.
    fn connect_err(&self, url: &str, e: ureq::Error) -> TrainError {
        let hint = match (&e, &self.auth) {
            (ureq::Error::Status(401, _), None) => {
                " (the worker requires an API key: pass it with --rollout-api-key-file)"
            }
            (ureq::Error::Status(401, _), Some(_)) => {
                " (the worker refused the key from --rollout-api-key-file)"
            }
            _ => "",
        };
        TrainError::Rollout(format!(
            "rollout endpoint {url}: {}{hint}",
            describe(e, "asking GET /v1/models")
        ))
    }

    /// The workers' URLs, in order.
    pub fn urls(&self) -> Vec<String> {
        self.lock().iter().map(|w| w.url.clone()).collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Worker>> {
        self.workers.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Publishes the learner's adapters as `version`: written under the
    /// adapter directory, loaded on every worker (a worker taken out earlier
    /// that loads it rejoins; one that fails is taken out), the previous
    /// version unloaded. At least one worker must hold it.
    pub fn publish(&self, version: u64, set: &tern_models::LoraSet) -> Result<()> {
        let name = adapter_name(version);
        let dir = self.adapters.join(&name);
        let path = tern_models::save_adapter(set, &dir)?;
        let path = std::fs::canonicalize(&path).unwrap_or(path);
        // In place: a worker may still hold this name from an earlier run.
        let body = json!({
            "lora_name": name,
            "lora_path": path.display().to_string(),
            "load_inplace": true,
        });
        let urls = self.urls();
        let previous = self.current();
        let mut loaded = 0;
        for (i, url) in urls.iter().enumerate() {
            let res = self
                .post(&format!("{url}/v1/load_lora_adapter"))
                .send_json(body.clone());
            let ok = match res {
                Ok(_) => true,
                Err(e) => {
                    let was_alive = self.lock()[i].alive;
                    if was_alive {
                        eprintln!(
                            "rollout worker {url} taken out: {}",
                            describe(e, "loading the adapter")
                        );
                    }
                    false
                }
            };
            self.lock()[i].alive = ok;
            loaded += ok as usize;
            if let (true, Some((old, _))) = (ok, &previous) {
                // Best effort: a worker that lost the old one is fine.
                let _ = self
                    .post(&format!("{url}/v1/unload_lora_adapter"))
                    .send_json(json!({"lora_name": old}));
            }
        }
        if loaded == 0 {
            return Err(TrainError::Rollout(format!(
                "no rollout worker accepted adapter {name} ({})",
                urls.join(", ")
            )));
        }
        let old = self
            .current
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .replace((name, version));
        if let Some((old, _)) = old {
            let _ = std::fs::remove_dir_all(self.adapters.join(old));
        }
        Ok(())
    }

    /// The adapter the workers serve now and its version.
    fn current(&self) -> Option<(String, u64)> {
        self.current
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Runs every job on the fleet, each on the least-loaded live worker,
    /// retrying a failed request on another; returns the answers in job order
    /// with what each worker did. Fails only when no worker is left.
    pub fn run(&self, jobs: &[Job]) -> Result<(Vec<Answered>, FleetStats)> {
        let (model, current) = self
            .current()
            .ok_or_else(|| TrainError::Rollout("no adapter published to the fleet".into()))?;
        let queue: Mutex<VecDeque<usize>> = Mutex::new((0..jobs.len()).collect());
        let results: Mutex<Vec<Option<Answered>>> = Mutex::new(vec![None; jobs.len()]);
        let stats = Mutex::new(FleetStats {
            workers: self
                .urls()
                .into_iter()
                .map(|url| WorkerStats {
                    url,
                    ..WorkerStats::default()
                })
                .collect(),
            ..FleetStats::default()
        });
        let failure: Mutex<Option<TrainError>> = Mutex::new(None);
        let threads = jobs.len().min(4 * self.lock().len()).max(1);
        std::thread::scope(|s| {
            for _ in 0..threads {
                s.spawn(|| loop {
                    if failure.lock().map(|f| f.is_some()).unwrap_or(true) {
                        return;
                    }
                    let Some(j) = queue.lock().ok().and_then(|mut q| q.pop_front()) else {
                        return;
                    };
                    match self.run_one(&jobs[j], &model, &stats) {
                        Ok(a) => {
                            if let Ok(mut r) = results.lock() {
                                r[j] = Some(a);
                            }
                        }
                        Err(e) => {
                            if let Ok(mut f) = failure.lock() {
                                f.get_or_insert(e);
                            }
                            return;
                        }
                    }
                });
            }
        });
        if let Some(e) = failure.into_inner().unwrap_or(None) {
            return Err(e);
        }
        let answers = results
            .into_inner()
            .unwrap_or_default()
            .into_iter()
            .map(|a| a.ok_or_else(|| TrainError::Rollout("a rollout request got no answer".into())))
            .collect::<Result<Vec<_>>>()?;
        let mut stats = stats.into_inner().unwrap_or_default();
        for a in &answers {
            if a.version.is_some() && a.version != Some(current) {
                stats.stale += a.completions.len();
                if self.stale == StaleRollouts::Drop {
                    stats.stale_dropped += a.completions.len();
                }
            }
        }
        Ok((answers, stats))
    }

    /// Whether a job's answer is to be dropped as stale.
    pub fn drops(&self, answer: &Answered) -> bool {
        self.stale == StaleRollouts::Drop
            && answer.version.is_some()
            && answer.version != self.current().map(|c| c.1)
    }

    /// The least-loaded live worker, marked busy; `None` when none is left.
    fn take_worker(&self) -> Option<(usize, String, bool)> {
        let mut ws = self.lock();
        let (i, w) = ws
            .iter_mut()
            .enumerate()
            .filter(|(_, w)| w.alive)
            .min_by_key(|(i, w)| (w.in_flight, *i))?;
        w.in_flight += 1;
        Some((i, w.url.clone(), w.tern))
    }

    /// One job, retried on other workers until one answers.
    fn run_one(&self, job: &Job, model: &str, stats: &Mutex<FleetStats>) -> Result<Answered> {
        let mut tried = 0usize;
        loop {
            let (i, url, tern) = self.take_worker().ok_or_else(|| {
                TrainError::Rollout(format!(
                    "every rollout worker failed ({})",
                    self.urls().join(", ")
                ))
            })?;
            let started = Instant::now();
            let res = self.request(&url, tern, job, model);
            let mut ws = self.lock();
            ws[i].in_flight -= 1;
            let mut st = stats.lock().unwrap_or_else(|p| p.into_inner());
            match res {
                Ok(mut a) => {
                    st.workers[i].requests += 1;
                    a.worker = i;
                    return Ok(a);
                }
                Err(Failure::Refused(msg)) => {
                    // The request itself is wrong: another worker would
                    // refuse it too.
                    return Err(TrainError::Rollout(format!(
                        "{url} refused a rollout: {msg}"
                    )));
                }
                Err(Failure::Worker(msg)) => {
                    st.workers[i].failures += 1;
                    if ws[i].alive {
                        st.workers[i].lost = true;
                        eprintln!(
                            "rollout worker {url} taken out after {:.1} s: {msg}",
                            started.elapsed().as_secs_f64()
                        );
                    }
                    ws[i].alive = false;
                    st.retried += 1;
                    tried += 1;
                    if tried > ws.len() {
                        return Err(TrainError::Rollout(format!(
                            "a rollout failed on every worker; last: {url}: {msg}"
                        )));
                    }
                }
            }
        }
    }

    /// Sends one job to `url` and reads its answer.
    fn request(
        &self,
        url: &str,
        tern: bool,
        job: &Job,
        model: &str,
    ) -> std::result::Result<Answered, Failure> {
        let mut body = json!({
            "model": model,
            "prompt": job.prompt,
            "n": job.n,
            "seed": job.seed,
            "temperature": job.temperature,
            "max_tokens": job.max_tokens,
            "logprobs": 0,
            "return_tokens_as_token_ids": true,
            "stream": false,
        });
        if tern {
            // The learner scores at the sampling temperature: so must the
            // recorded log-probabilities.
            body["logprobs_mode"] = json!("processed_logprobs");
            body["kv_policy"] = json!(job.kv_policy);
        }
        let v: Value = match self.post(&format!("{url}/v1/completions")).send_json(body) {
            Ok(r) => r
                .into_json()
                .map_err(|e| Failure::Worker(format!("unreadable answer: {e}")))?,
            // A 404 is a worker that lost the adapter (restarted): try
            // another, and it rejoins when it next takes one.
            Err(ureq::Error::Status(code, r))
                if (400..500).contains(&code) && ![404, 408, 429].contains(&code) =>
            {
                let text = r.into_string().unwrap_or_default();
                return Err(Failure::Refused(format!("HTTP {code}: {text}")));
            }
            Err(e) => return Err(Failure::Worker(describe(e, "rolling out"))),
        };
        parse_answer(&v, job.n).map_err(Failure::Worker)
    }
}

/// Why a request failed.
enum Failure {
    /// The worker failed (connection, 5xx, timeout, garbage): try another.
    Worker(String),
    /// The worker refused the request as invalid: no other would take it.
    Refused(String),
}

/// `http://host:port` from a URL given with or without a trailing `/v1`.
fn base_url(raw: &str) -> Result<String> {
    let url = raw.trim().trim_end_matches('/');
    let url = url.strip_suffix("/v1").unwrap_or(url);
    if !(url.starts_with("http://") || url.starts_with("https://")) || url.len() < 10 {
        return Err(TrainError::Config(format!(
            "rollout endpoint `{raw}` is not an http:// or https:// URL"
        )));
    }
    Ok(url.to_string())
}

/// A ureq error in one line, with the server's error message when it sent one.
fn describe(e: ureq::Error, what: &str) -> String {
    match e {
        ureq::Error::Status(code, r) => {
            let body: Value = r.into_json().unwrap_or(Value::Null);
            match body["error"]["message"].as_str() {
                Some(m) => format!("HTTP {code} while {what}: {m}"),
                None => format!("HTTP {code} while {what}"),
            }
        }
        ureq::Error::Transport(t) => format!("{t} while {what}"),
    }
}

/// A `/v1/completions` answer's `n` completions: token ids from
/// `token_id:N` tokens (`return_tokens_as_token_ids`), their log-probabilities,
/// and the per-choice KV figures Tern adds.
fn parse_answer(v: &Value, n: usize) -> std::result::Result<Answered, String> {
    let choices = v["choices"].as_array().ok_or("the answer has no choices")?;
    let mut out: Vec<Option<Sampled>> = vec![None; n];
    let per_choice = v["tern"]["choices"].as_array();
    for c in choices {
        let index = c["index"].as_u64().ok_or("a choice has no index")? as usize;
        if index >= n {
            return Err(format!("choice index {index} of {n}"));
        }
        let lp = &c["logprobs"];
        let tokens = lp["tokens"]
            .as_array()
            .ok_or("a choice has no logprobs.tokens (the server must return log-probabilities)")?
            .iter()
            .map(|t| {
                t.as_str()
                    .and_then(|t| t.strip_prefix("token_id:"))
                    .and_then(|id| id.parse::<u32>().ok())
                    .ok_or_else(|| format!("token {t} is not `token_id:N` (the server must support return_tokens_as_token_ids)"))
            })
            .collect::<std::result::Result<Vec<u32>, String>>()?;
        let logprobs = lp["token_logprobs"]
            .as_array()
            .ok_or("a choice has no logprobs.token_logprobs")?
            .iter()
            // The server's numbers are f32, written shortest-round-trip:
            // back through f32 they are the sampler's bits again.
            .map(|x| {
                x.as_f64()
                    .map(|x| x as f32 as f64)
                    .ok_or("a log-probability is not a number")
            })
            .collect::<std::result::Result<Vec<f64>, &str>>()?;
        if logprobs.len() != tokens.len() {
            return Err("tokens and log-probabilities differ in length".into());
        }
        // This choice's figure, else the request's (n = 1), else 0.
        let kv_of = |field: &str| {
            per_choice
                .and_then(|p| p.get(index))
                .map_or(&v["tern"][field], |k| &k[field])
                .as_u64()
                .unwrap_or(0) as usize
        };
        let (kv, kv_full) = (kv_of("kv_bytes"), kv_of("kv_bytes_full"));
        out[index] = Some(Sampled {
            text: c["text"].as_str().unwrap_or_default().to_string(),
            tokens,
            logprobs,
            kv_peak_bytes: kv,
            kv_full_bytes: kv_full,
        });
    }
    let completions = out
        .into_iter()
        .collect::<Option<Vec<_>>>()
        .ok_or_else(|| format!("the answer holds fewer than {n} choices"))?;
    Ok(Answered {
        completions,
        version: v["model"].as_str().and_then(name_version),
        worker: 0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_parse_into_ids_logprobs_and_kv() {
        let v = json!({
            "model": "tern-v3",
            "choices": [
                {"index": 1, "text": "b", "logprobs": {"tokens": ["token_id:7"], "token_logprobs": [-0.5]}},
                {"index": 0, "text": "a c", "logprobs": {"tokens": ["token_id:1", "token_id:2"], "token_logprobs": [-1.0, -2.0]}}
            ],
            "tern": {"kv_bytes": 99, "kv_bytes_full": 100,
                     "choices": [{"kv_bytes": 10, "kv_bytes_full": 20}, {"kv_bytes": 30, "kv_bytes_full": 40}]}
        });
        let a = parse_answer(&v, 2).unwrap();
        assert_eq!(a.version, Some(3));
        assert_eq!(a.completions[0].tokens, vec![1, 2]);
        assert_eq!(a.completions[0].logprobs, vec![-1.0, -2.0]);
        assert_eq!(a.completions[1].text, "b");
        assert_eq!(
            (
                a.completions[1].kv_peak_bytes,
                a.completions[1].kv_full_bytes
            ),
            (30, 40)
        );
        // Missing a choice, or tokens as text: refused with the reason.
        assert!(parse_answer(&v, 3).unwrap_err().contains("fewer than 3"));
        let mut text = v.clone();
        text["choices"][0]["logprobs"]["tokens"] = json!(["b"]);
        assert!(parse_answer(&text, 2).unwrap_err().contains("token_id"));
    }

    #[test]
    fn an_answer_from_an_older_adapter_is_counted_and_dropped_only_when_asked() {
        let fleet = |stale| Fleet {
            workers: Mutex::new(Vec::new()),
            agent: ureq::agent(),
            auth: None,
            adapters: PathBuf::new(),
            current: Mutex::new(Some((adapter_name(5), 5))),
            stale,
        };
        let answer = |version| Answered {
            completions: Vec::new(),
            version,
            worker: 0,
        };
        let (keep, drop) = (fleet(StaleRollouts::Correct), fleet(StaleRollouts::Drop));
        assert!(!keep.drops(&answer(Some(4))));
        assert!(drop.drops(&answer(Some(4))));
        assert!(!drop.drops(&answer(Some(5))));
        // A server that does not name the adapter it ran cannot be judged stale.
        assert!(!drop.drops(&answer(None)));
    }

    /// A one-shot worker on a free port: answers each connection with
    /// `status` and a `/v1/models` list, and keeps each request's head.
    fn fake_worker(status: &'static str) -> (u16, std::sync::Arc<Mutex<Vec<String>>>) {
        use std::io::{BufRead, BufReader, Write};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let heads = std::sync::Arc::new(Mutex::new(Vec::new()));
        let seen = heads.clone();
        std::thread::spawn(move || {
            for mut stream in listener.incoming().flatten() {
                let mut reader = BufReader::new(stream.try_clone().unwrap());
                let mut head = String::new();
                loop {
                    let mut line = String::new();
                    // A TLS client hello has no line end: stop at what came.
                    let _ = stream.set_read_timeout(Some(Duration::from_millis(500)));
                    if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                        head.push_str(&line);
                        break;
                    }
                    head.push_str(&line);
                }
                seen.lock().unwrap().push(head);
                let body = r#"{"object":"list","data":[{"id":"m","owned_by":"tern"}]}"#;
                let _ = write!(
                    stream,
                    "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
            }
        });
        (port, heads)
    }

    fn config(dir: &Path, api_key: Option<&str>) -> FleetConfig {
        FleetConfig {
            timeout: Duration::from_secs(10),
            kv_policy: "full".into(),
            adapters: dir.to_path_buf(),
            stale: StaleRollouts::Correct,
            api_key: api_key.map(str::to_string),
        }
    }

    #[test]
    fn the_key_goes_as_a_bearer_token_and_a_401_names_the_flag() {
        let dir = tempfile::tempdir().unwrap();
        let (port, heads) = fake_worker("200 OK");
        let url = format!("http://127.0.0.1:{port}");
        let fleet = Fleet::connect(
            std::slice::from_ref(&url),
            &config(dir.path(), Some("s3cret")),
        )
        .unwrap();
        assert_eq!(fleet.urls(), vec![url]);
        let head = heads.lock().unwrap()[0].clone();
        assert!(head.starts_with("GET /v1/models"), "{head}");
        assert!(head.contains("Authorization: Bearer s3cret\r\n"), "{head}");
        // Without a key, no header at all.
        let (port, heads) = fake_worker("200 OK");
        Fleet::connect(
            &[format!("http://127.0.0.1:{port}")],
            &config(dir.path(), None),
        )
        .unwrap();
        assert!(!heads.lock().unwrap()[0]
            .to_ascii_lowercase()
            .contains("authorization"));

        let (port, _) = fake_worker("401 Unauthorized");
        let urls = [format!("http://127.0.0.1:{port}")];
        let e = Fleet::connect(&urls, &config(dir.path(), None))
            .err()
            .unwrap()
            .to_string();
        assert!(
            e.contains("HTTP 401") && e.contains("pass it with --rollout-api-key-file"),
            "{e}"
        );
        let (port, _) = fake_worker("401 Unauthorized");
        let urls = [format!("http://127.0.0.1:{port}")];
        let e = Fleet::connect(&urls, &config(dir.path(), Some("wrong")))
            .err()
            .unwrap()
            .to_string();
        assert!(
            e.contains("HTTP 401") && e.contains("refused the key"),
            "{e}"
        );
    }

    #[test]
    fn an_https_endpoint_is_reached_over_tls() {
        // A plain-HTTP worker that would answer a plain request: over
        // https the client's first bytes are a TLS hello, and its answer
        // fails the handshake.
        let dir = tempfile::tempdir().unwrap();
        let (port, heads) = fake_worker("200 OK");
        let urls = [format!("https://127.0.0.1:{port}/v1")];
        let e = Fleet::connect(&urls, &config(dir.path(), Some("k")))
            .err()
            .expect("no TLS server there")
            .to_string();
        assert!(e.to_ascii_lowercase().contains("tls"), "{e}");
        let head = heads.lock().unwrap()[0].clone();
        assert!(
            !head.contains("GET /v1/models"),
            "sent in the clear: {head}"
        );
        // The key never went out in the clear either.
        assert!(!head.contains("Bearer"), "{head}");
    }

    #[test]
    fn key_files() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("key");
        std::fs::write(&file, "  k3y \nignored\n").unwrap();
        assert_eq!(read_api_key(&file).unwrap(), "k3y");
        std::fs::write(&file, "\n").unwrap();
        let e = read_api_key(&file).unwrap_err().to_string();
        assert!(
            e.contains("--rollout-api-key-file") && e.contains("holds no key"),
            "{e}"
        );
        let e = read_api_key(&dir.path().join("missing"))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("--rollout-api-key-file") && e.contains("cannot read"),
            "{e}"
        );
    }

    #[test]
    fn urls_and_names() {
        assert_eq!(
            base_url("http://127.0.0.1:8080/v1/").unwrap(),
            "http://127.0.0.1:8080"
        );
        assert_eq!(
            base_url("https://rollouts.example:8443/v1").unwrap(),
            "https://rollouts.example:8443"
        );
        assert!(base_url("127.0.0.1:8080").is_err());
        assert_eq!(name_version(&adapter_name(12)), Some(12));
        assert_eq!(name_version("smollm2"), None);
        assert_eq!("drop".parse::<StaleRollouts>(), Ok(StaleRollouts::Drop));
        assert!("keep".parse::<StaleRollouts>().is_err());
    }
}
