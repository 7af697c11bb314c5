//! Stored `/v1/responses` results, for `previous_response_id`, `GET` and
//! `DELETE`: by default a bounded in-memory map that forgets the oldest
//! response once full (`--responses-store`); with `--state-store redis://...`
//! the same bounded store in Redis, shared by every replica that names it,
//! so a conversation continues whichever replica a balancer picks. A
//! response chained to an evicted one is a 404 naming
//! `previous_response_id`, never a silently shorter conversation; a store
//! that cannot be reached is a 503, never a 404.

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

/// Redis keys: one string per response, and a list of ids, oldest first.
const KEY_PREFIX: &str = "tern:response:";
const ORDER_KEY: &str = "tern:responses";

enum Backend {
    Memory(Mutex<(HashMap<String, Stored>, VecDeque<String>)>),
    Redis {
        client: redis::Client,
        /// One connection, reopened after an error.
        conn: Mutex<Option<redis::Connection>>,
    },
}

/// The bounded store.
pub struct ResponseStore {
    cap: usize,
    backend: Backend,
}

impl ResponseStore {
    /// An in-memory store holding at most `cap` responses (0 stores nothing).
    pub fn new(cap: usize) -> Self {
        Self {
            cap,
            backend: Backend::Memory(Mutex::new((HashMap::new(), VecDeque::new()))),
        }
    }

    /// A store in the Redis server at `url` (`redis://host:port[/db]`),
    /// holding at most `cap` responses across every replica that uses it.
    /// Connects once, so a wrong address fails at startup.
    pub fn redis(url: &str, cap: usize) -> Result<Self, StoreError> {
        let client = redis::Client::open(url)?;
        let mut conn = client.get_connection()?;
        let _: String = redis::cmd("PING").query(&mut conn)?;
        Ok(Self {
            cap,
            backend: Backend::Redis {
                client,
                conn: Mutex::new(Some(conn)),
            },
        })
    }

    /// Runs `f` on the Redis connection, reconnecting once if it failed.
    fn with_redis<T>(
        client: &redis::Client,
        conn: &Mutex<Option<redis::Connection>>,
        f: impl Fn(&mut redis::Connection) -> redis::RedisResult<T>,
    ) -> Result<T, StoreError> {
        let mut g = conn.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(c) = g.as_mut() {
            match f(c) {
                Ok(v) => return Ok(v),
                Err(e) if !(e.is_io_error() || e.is_connection_dropped()) => return Err(e.into()),
                Err(_) => *g = None,
            }
        }
        let mut c = client.get_connection()?;
        let v = f(&mut c)?;
        *g = Some(c);
        Ok(v)
    }

    /// Keeps `stored` under `id`, evicting the oldest beyond the cap.
    pub fn insert(&self, id: String, stored: Stored) -> Result<(), StoreError> {
        if self.cap == 0 {
            return Ok(());
        }
        match &self.backend {
            Backend::Memory(inner) => {
                let mut g = inner.lock().unwrap_or_else(|e| e.into_inner());
                let (map, order) = &mut *g;
                if map.insert(id.clone(), stored).is_none() {
                    order.push_back(id);
                }
                while map.len() > self.cap {
                    match order.pop_front() {
                        Some(old) => {
                            map.remove(&old);
                        }
                        None => break,
                    }
                }
                Ok(())
            }
            Backend::Redis { client, conn } => {
                let value =
                    serde_json::to_string(&stored).map_err(|e| StoreError(e.to_string()))?;
                let cap = self.cap;
                Self::with_redis(client, conn, |c| {
                    let key = format!("{KEY_PREFIX}{id}");
                    let fresh: bool = redis::cmd("SET")
                        .arg(&key)
                        .arg(&value)
                        .arg("GET")
                        .query::<Option<String>>(c)?
                        .is_none();
                    if fresh {
                        redis::cmd("RPUSH").arg(ORDER_KEY).arg(&id).query::<()>(c)?;
                    }
                    // Evict the oldest beyond the cap (another replica may
                    // evict the same one: deleting twice is harmless).
                    while redis::cmd("LLEN").arg(ORDER_KEY).query::<usize>(c)? > cap {
                        let old: Option<String> = redis::cmd("LPOP").arg(ORDER_KEY).query(c)?;
                        match old {
                            Some(old) => redis::cmd("DEL")
                                .arg(format!("{KEY_PREFIX}{old}"))
                                .query::<()>(c)?,
                            None => break,
                        }
                    }
                    Ok(())
                })
            }
        }
    }

    /// The response stored under `id`.
    pub fn get(&self, id: &str) -> Result<Option<Stored>, StoreError> {
        match &self.backend {
            Backend::Memory(inner) => {
                let g = inner.lock().unwrap_or_else(|e| e.into_inner());
                Ok(g.0.get(id).cloned())
            }
            Backend::Redis { client, conn } => {
                let raw: Option<String> = Self::with_redis(client, conn, |c| {
                    redis::cmd("GET").arg(format!("{KEY_PREFIX}{id}")).query(c)
                })?;
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
                let (map, order) = &mut *g;
                let had = map.remove(id).is_some();
                if had {
                    order.retain(|k| k != id);
                }
                Ok(had)
            }
            Backend::Redis { client, conn } => Self::with_redis(client, conn, |c| {
                let n: usize = redis::cmd("DEL")
                    .arg(format!("{KEY_PREFIX}{id}"))
                    .query(c)?;
                redis::cmd("LREM")
                    .arg(ORDER_KEY)
                    .arg(0)
                    .arg(id)
                    .query::<()>(c)?;
                Ok(n > 0)
            }),
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
