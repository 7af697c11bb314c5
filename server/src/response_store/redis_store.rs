//! The Responses store's Redis side (`--state-store redis://...`): a few
//! pooled blocking connections, each with connect, read and write timeouts of
//! [`REDIS_TIMEOUT`], used off the async worker threads.
//!
//! Every call is bounded: the TCP connect has the timeout, and no byte is read
//! before the socket's own read and write timeouts are set (redis-rs's
//! connection setup would read its handshake replies without one, so this
//! module sends `AUTH` and `SELECT` itself, and the crate's `CLIENT SETINFO`
//! is off). A Redis that is down or stops answering costs a request at most
//! a few timeouts and then a [`StoreError`] (the routes answer 503), never a
//! hung request. No lock is held during I/O: a call takes an idle connection
//! or opens one, so one slow call does not queue every other behind it.
//! On tokio's multi-threaded runtime a call runs under `block_in_place`, so
//! the worker thread's other tasks (`/health`, streams) move to another
//! thread while it waits. What is stored, and the cap, is the caller's.

use std::sync::Mutex;
use std::time::Duration;

use super::StoreError;

/// How long connecting, sending one command or reading its reply may take.
pub const REDIS_TIMEOUT: Duration = Duration::from_secs(2);

/// Idle connections kept for reuse; more are opened under load and closed
/// after use.
const MAX_IDLE: usize = 8;

/// Redis keys: one string per response, and a list of ids, oldest first.
const KEY_PREFIX: &str = "tern:response:";
const ORDER_KEY: &str = "tern:responses";

/// A Redis server holding the store.
pub(super) struct RedisStore {
    /// The server's address only: no password or database, so opening a
    /// connection does no I/O beyond the TCP connect.
    client: redis::Client,
    /// `AUTH` arguments (username, password) from the URL.
    auth: Option<(Option<String>, String)>,
    /// `SELECT` database from the URL (0: the default).
    db: i64,
    /// Connections between calls.
    idle: Mutex<Vec<redis::Connection>>,
}

impl RedisStore {
    /// Parses `url` (`redis://[user:password@]host:port[/db]`) and connects
    /// once (with a `PING`), so a wrong address fails at startup.
    pub(super) fn open(url: &str) -> Result<Self, StoreError> {
        let mut info = redis::IntoConnectionInfo::into_connection_info(url)?;
        let auth = info
            .redis
            .password
            .take()
            .map(|p| (info.redis.username.take(), p));
        let db = std::mem::take(&mut info.redis.db);
        info.redis.username = None;
        info.redis.protocol = redis::ProtocolVersion::RESP2;
        let store = Self {
            client: redis::Client::open(info)?,
            auth,
            db,
            idle: Mutex::new(Vec::new()),
        };
        store.run(|c| redis::cmd("PING").query::<String>(c))?;
        Ok(store)
    }

    /// A new connection with its timeouts set before the first byte is read.
    fn connect(&self) -> redis::RedisResult<redis::Connection> {
        let mut c = self.client.get_connection_with_timeout(REDIS_TIMEOUT)?;
        c.set_read_timeout(Some(REDIS_TIMEOUT))?;
        c.set_write_timeout(Some(REDIS_TIMEOUT))?;
        if let Some((user, password)) = &self.auth {
            let mut auth = redis::cmd("AUTH");
            if let Some(user) = user {
                auth.arg(user);
            }
            auth.arg(password).query::<()>(&mut c)?;
        }
        if self.db != 0 {
            redis::cmd("SELECT").arg(self.db).query::<()>(&mut c)?;
        }
        Ok(c)
    }

    /// Runs `f` on a connection, off the async threads: an idle one, or a
    /// fresh one if there is none or the idle one had been closed by the
    /// server. A connection that failed is dropped (its state is unknown).
    fn run<T>(
        &self,
        f: impl Fn(&mut redis::Connection) -> redis::RedisResult<T>,
    ) -> Result<T, StoreError> {
        off_async_threads(|| {
            let idle = self.idle.lock().unwrap_or_else(|e| e.into_inner()).pop();
            if let Some(mut c) = idle {
                match f(&mut c) {
                    Ok(v) => {
                        self.keep(c);
                        return Ok(v);
                    }
                    // Closed under us (Redis restarted, or timed the idle
                    // connection out): one try on a fresh connection.
                    Err(e) if e.is_connection_dropped() || e.is_connection_refusal() => {}
                    Err(e) => return Err(failure(e)),
                }
            }
            let mut c = self.connect().map_err(failure)?;
            let v = f(&mut c).map_err(failure)?;
            self.keep(c);
            Ok(v)
        })
    }

    /// Returns a healthy connection to the idle list.
    fn keep(&self, c: redis::Connection) {
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        if idle.len() < MAX_IDLE {
            idle.push(c);
        }
    }

    /// Keeps `value` (a stored response's JSON) under `id` and evicts the
    /// oldest beyond `cap` responses.
    pub(super) fn insert(&self, id: &str, value: &str, cap: usize) -> Result<(), StoreError> {
        self.run(|c| {
            let key = format!("{KEY_PREFIX}{id}");
            let fresh: bool = redis::cmd("SET")
                .arg(&key)
                .arg(value)
                .arg("GET")
                .query::<Option<String>>(c)?
                .is_none();
            if fresh {
                redis::cmd("RPUSH").arg(ORDER_KEY).arg(id).query::<()>(c)?;
            }
            // Evict the oldest beyond the cap (another replica may evict the
            // same one: deleting twice is harmless).
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

    /// The JSON stored under `id`.
    pub(super) fn get(&self, id: &str) -> Result<Option<String>, StoreError> {
        self.run(|c| redis::cmd("GET").arg(format!("{KEY_PREFIX}{id}")).query(c))
    }

    /// Forgets `id`; whether it was there.
    pub(super) fn remove(&self, id: &str) -> Result<bool, StoreError> {
        self.run(|c| {
            let n: usize = redis::cmd("DEL")
                .arg(format!("{KEY_PREFIX}{id}"))
                .query(c)?;
            redis::cmd("LREM")
                .arg(ORDER_KEY)
                .arg(0)
                .arg(id)
                .query::<()>(c)?;
            Ok(n > 0)
        })
    }
}

/// A Redis error as the store reports it; a timeout says how long it waited.
fn failure(e: redis::RedisError) -> StoreError {
    if e.is_timeout() {
        StoreError(format!(
            "Redis did not answer within {} s ({e})",
            REDIS_TIMEOUT.as_secs()
        ))
    } else {
        e.into()
    }
}

/// Runs blocking `f` so that it does not stall tokio's worker threads: under
/// `block_in_place` on the multi-threaded runtime (`tern serve`'s), directly
/// elsewhere (a current-thread runtime, which cannot hand its tasks over, or
/// no runtime at all); either way `f` is bounded by [`REDIS_TIMEOUT`]s.
fn off_async_threads<T>(f: impl FnOnce() -> T) -> T {
    match tokio::runtime::Handle::try_current() {
        Ok(h) if h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
            tokio::task::block_in_place(f)
        }
        _ => f(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::net::TcpListener;
    use std::time::Instant;

    /// A server that accepts connections and never answers (a hung Redis).
    fn silent_server() -> u16 {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        std::thread::spawn(move || {
            let mut held = Vec::new();
            for s in listener.incoming().flatten() {
                held.push(s);
            }
        });
        port
    }

    #[test]
    fn a_redis_that_never_answers_is_an_error_within_the_timeout() {
        let port = silent_server();
        // Password and database too: AUTH and SELECT are under the timeout.
        for url in [
            format!("redis://127.0.0.1:{port}"),
            format!("redis://user:pw@127.0.0.1:{port}/3"),
        ] {
            let started = Instant::now();
            let e = RedisStore::open(&url).err().expect("no answer");
            // One timeout (the PING or the AUTH), never a hang.
            assert!(
                started.elapsed() < REDIS_TIMEOUT * 3,
                "{url}: {:?}",
                started.elapsed()
            );
            assert!(e.to_string().contains("did not answer within 2 s"), "{e}");
        }
    }

    #[test]
    fn auth_and_select_are_sent_on_connect() {
        // A stand-in Redis that answers +OK / +PONG and records what it got.
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let seen = std::sync::Arc::new(Mutex::new(Vec::<u8>::new()));
        let log = seen.clone();
        std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            let mut buf = [0u8; 4096];
            let mut replies = ["+OK\r\n", "+OK\r\n", "+PONG\r\n"].into_iter();
            while let Ok(n) = s.read(&mut buf) {
                if n == 0 {
                    break;
                }
                log.lock().unwrap().extend_from_slice(&buf[..n]);
                // One reply per command read (`*` starts each one).
                for _ in buf[..n].iter().filter(|&&b| b == b'*') {
                    if let Some(r) = replies.next() {
                        let _ = s.write_all(r.as_bytes());
                    }
                }
            }
        });
        RedisStore::open(&format!("redis://alice:pw@127.0.0.1:{port}/3")).unwrap();
        let sent = String::from_utf8_lossy(&seen.lock().unwrap()).into_owned();
        let words: Vec<&str> = sent
            .split("\r\n")
            .filter(|w| !w.starts_with(['*', '$']))
            .collect();
        assert_eq!(
            words.join(" ").trim(),
            "AUTH alice pw SELECT 3 PING",
            "{sent:?}"
        );
    }
}
