//! Stored `/v1/responses` results, for `previous_response_id`, `GET` and
//! `DELETE`: by default a bounded in-memory map that forgets the oldest
//! response once full (`--responses-store`); with `--state-store redis://...`
//! the same bounded store in Redis, shared by every replica that names it,
//! so a conversation continues whichever replica a balancer picks. A
//! response chained to an evicted one is a 404 naming
//! `previous_response_id`, never a silently shorter conversation; a store
//! that cannot be reached is a 503, never a 404. Redis I/O is bounded by
//! timeouts and kept off the async threads ([`redis_store`]).
//!
//! The in-memory store is bounded in bytes as well as in count
//! (`--responses-store-bytes`): each response is kept as its JSON text, so
//! what it costs is its length, not the several times more a parsed `Value`
//! would take, and the oldest go until the total fits. A response larger
//! than the whole budget is not kept. In Redis the count bounds the store
//! and the per-response limit applies; Redis's own `maxmemory` bounds its
//! total.

mod redis_store;

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// One stored response.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Stored {
    /// The response object as it was returned.
    pub response: Value,
    /// The conversation so far in chat-message form (input turns and this
    /// response's output), without `instructions` (they do not carry over).
    pub conversation: Value,
}

/// The shared store could not be reached or answered nonsense.
#[derive(Debug, thiserror::Error)]
#[error("the response store (--state-store) failed: {0}")]
pub struct StoreError(String);

impl From<redis::RedisError> for StoreError {
    fn from(e: redis::RedisError) -> Self {
        Self(e.to_string())
    }
}

/// Bookkeeping bytes charged per in-memory entry beside its id and text:
/// the map's and the queue's slots and the allocations' headers.
const ENTRY_OVERHEAD: usize = 128;

/// The in-memory store: JSON text by id, ids oldest first, and the bytes
/// the entries are charged ([`entry_bytes`]) in all.
#[derive(Default)]
struct Memory {
    map: HashMap<String, Box<str>>,
    order: VecDeque<String>,
    bytes: usize,
}

impl Memory {
    /// Forgets `id`; whether it was there.
    fn remove(&mut self, id: &str) -> bool {
        match self.map.remove(id) {
            Some(text) => {
                self.bytes -= entry_bytes(id, &text);
                self.order.retain(|k| k != id);
                true
            }
            None => false,
        }
    }

    /// Drops the oldest until at most `cap` entries of `max_bytes` in all remain.
    fn evict(&mut self, cap: usize, max_bytes: usize) {
        while self.map.len() > cap || self.bytes > max_bytes {
            let Some(old) = self.order.pop_front() else {
                break;
            };
            if let Some(text) = self.map.remove(&old) {
                self.bytes -= entry_bytes(&old, &text);
            }
        }
    }
}

/// What one stored response is charged against the byte budget: its id
/// (held twice), its JSON text and [`ENTRY_OVERHEAD`].
fn entry_bytes(id: &str, text: &str) -> usize {
    2 * id.len() + text.len() + ENTRY_OVERHEAD
}

enum Backend {
    Memory(Mutex<Memory>),
    Redis(redis_store::RedisStore),
}

/// The bounded store.
pub struct ResponseStore {
    cap: usize,
    /// Most bytes the entries may be charged in all (in memory), and the
    /// most one response may take (both backends).
    max_bytes: usize,
    backend: Backend,
}

impl ResponseStore {
    /// An in-memory store holding at most `cap` responses (0 stores nothing)
    /// of [`crate::DEFAULT_RESPONSES_STORE_BYTES`] in all.
    pub fn new(cap: usize) -> Self {
        Self {
            cap,
            max_bytes: crate::DEFAULT_RESPONSES_STORE_BYTES,
            backend: Backend::Memory(Mutex::new(Memory::default())),
        }
    }

    /// The same store bounded to `max_bytes` (`--responses-store-bytes`):
    /// in memory the total of its entries, in Redis each response.
    pub fn with_max_bytes(mut self, max_bytes: usize) -> Self {
        self.max_bytes = max_bytes;
        self
    }

    /// The byte budget (`--responses-store-bytes`).
    pub fn max_bytes(&self) -> usize {
        self.max_bytes
    }

    /// Whether a response whose JSON text takes `bytes` could be kept at
    /// all, so a request that cannot be stored is refused before it runs.
    pub fn fits(&self, bytes: usize) -> bool {
        self.cap > 0 && bytes.saturating_add(ENTRY_OVERHEAD) <= self.max_bytes
    }

    /// Responses held and the bytes they are charged, for `/metrics`
    /// (`None` for Redis, whose totals belong to the Redis server).
    pub fn usage(&self) -> Option<(usize, usize)> {
        match &self.backend {
            Backend::Memory(inner) => {
                let g = inner.lock().unwrap_or_else(|e| e.into_inner());
                Some((g.map.len(), g.bytes))
            }
            Backend::Redis { .. } => None,
        }
    }

    /// A store in the Redis server at `url` (`redis://host:port[/db]`),
    /// holding at most `cap` responses across every replica that uses it.
    /// Connects once, so a wrong address fails at startup.
    pub fn redis(url: &str, cap: usize) -> Result<Self, StoreError> {
        Ok(Self {
            cap,
            max_bytes: crate::DEFAULT_RESPONSES_STORE_BYTES,
            backend: Backend::Redis(redis_store::RedisStore::open(url)?),
        })
    }

    /// Keeps `stored` under `id`, evicting the oldest beyond the cap and
    /// (in memory) the byte budget. A response larger than the budget on
    /// its own is not kept (logged): it would evict everything else.
    pub fn insert(&self, id: String, stored: Stored) -> Result<(), StoreError> {
        if self.cap == 0 {
            return Ok(());
        }
        let value = serde_json::to_string(&stored).map_err(|e| StoreError(e.to_string()))?;
        let size = entry_bytes(&id, &value);
        if size > self.max_bytes {
            eprintln!(
                "warning: response {id} not stored: it takes {size} bytes, over \
                 --responses-store-bytes ({})",
                self.max_bytes
            );
            // An older version under the same id must not outlive this one.
            self.remove(&id)?;
            return Ok(());
        }
        match &self.backend {
            Backend::Memory(inner) => {
                let mut g = inner.lock().unwrap_or_else(|e| e.into_inner());
                g.remove(&id);
                g.map.insert(id.clone(), value.into_boxed_str());
                g.order.push_back(id);
                g.bytes += size;
                g.evict(self.cap, self.max_bytes);
                Ok(())
            }
            Backend::Redis(db) => db.insert(&id, &value, self.cap),
        }
    }

    /// The response stored under `id`.
    pub fn get(&self, id: &str) -> Result<Option<Stored>, StoreError> {
        match &self.backend {
            Backend::Memory(inner) => {
                let text = {
                    let g = inner.lock().unwrap_or_else(|e| e.into_inner());
                    g.map.get(id).cloned()
                };
                // Parsed outside the lock: other requests need not wait on it.
                text.map(|t| serde_json::from_str(&t).map_err(|e| StoreError(e.to_string())))
                    .transpose()
            }
            Backend::Redis(db) => {
                let raw = db.get(id)?;
                raw.map(|r| serde_json::from_str(&r).map_err(|e| StoreError(e.to_string())))
                    .transpose()
            }
        }
    }

    /// Forgets `id`; whether it was there.
    pub fn remove(&self, id: &str) -> Result<bool, StoreError> {
        match &self.backend {
            Backend::Memory(inner) => {
                let mut g = inner.lock().unwrap_or_else(|e| e.into_inner());
                Ok(g.remove(id))
            }
            Backend::Redis(db) => db.remove(id),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn item(i: u64) -> Stored {
        Stored {
            response: json!({"id": i}),
            conversation: json!([]),
        }
    }

    #[test]
    fn the_oldest_goes_first_and_deleted_ids_are_gone() {
        let s = ResponseStore::new(2);
        for (id, i) in [("a", 1), ("b", 2), ("c", 3)] {
            s.insert(id.into(), item(i)).unwrap();
        }
        assert!(s.get("a").unwrap().is_none());
        assert_eq!(s.get("c").unwrap().unwrap().response["id"], 3);
        assert!(s.remove("b").unwrap());
        assert!(!s.remove("b").unwrap());
        s.insert("d".into(), item(4)).unwrap();
        assert!(s.get("c").unwrap().is_some() && s.get("d").unwrap().is_some());
        let none = ResponseStore::new(0);
        none.insert("x".into(), item(5)).unwrap();
        assert!(none.get("x").unwrap().is_none());
    }

    /// A response whose text is about `len` bytes.
    fn sized(len: usize) -> Stored {
        Stored {
            response: json!({"pad": "x".repeat(len)}),
            conversation: json!([]),
        }
    }

    #[test]
    fn bytes_bound_the_store_oldest_first() {
        let one = entry_bytes("r0", &serde_json::to_string(&sized(1000)).unwrap());
        // Room for three entries, however many the count allows.
        let s = ResponseStore::new(100).with_max_bytes(3 * one + one / 2);
        for i in 0..10 {
            s.insert(format!("r{i}"), sized(1000)).unwrap();
            let (n, bytes) = s.usage().unwrap();
            assert!(bytes <= 3 * one + one / 2, "{bytes} after {i}");
            assert_eq!(n, (i + 1).min(3));
        }
        assert!(s.get("r6").unwrap().is_none());
        for i in 7..10 {
            assert_eq!(
                s.get(&format!("r{i}")).unwrap().unwrap().response["pad"]
                    .as_str()
                    .map(str::len),
                Some(1000)
            );
        }
        // Replacing an entry charges only its new size; removing frees it.
        s.insert("r9".into(), sized(10)).unwrap();
        assert!(s.get("r7").unwrap().is_some());
        assert!(s.remove("r8").unwrap());
        let (n, bytes) = s.usage().unwrap();
        let small = entry_bytes("r9", &serde_json::to_string(&sized(10)).unwrap());
        assert_eq!((n, bytes), (2, one + small));
    }

    #[test]
    fn a_response_over_the_whole_budget_is_not_kept() {
        let s = ResponseStore::new(100).with_max_bytes(4096);
        s.insert("small".into(), sized(100)).unwrap();
        assert!(s.fits(4096 - ENTRY_OVERHEAD) && !s.fits(4096));
        s.insert("big".into(), sized(5000)).unwrap();
        assert!(s.get("big").unwrap().is_none());
        // It evicted nothing on its way out.
        assert!(s.get("small").unwrap().is_some());
        // A later, too large version of a stored id removes the old one.
        s.insert("small".into(), sized(5000)).unwrap();
        assert!(s.get("small").unwrap().is_none());
        assert_eq!(s.usage(), Some((0, 0)));
        assert!(!ResponseStore::new(0).fits(1));
    }

    #[test]
    fn an_unreachable_redis_is_an_error_at_startup() {
        // A port nothing listens on (bound, then closed).
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let e = ResponseStore::redis(&format!("redis://127.0.0.1:{port}"), 10)
            .err()
            .expect("nothing listens there");
        assert!(e.to_string().contains("--state-store"), "{e}");
        assert!(ResponseStore::redis("not a url", 10).is_err());
    }
}
