//! Stored `/v1/responses` results, for `previous_response_id`, `GET` and
//! `DELETE`: a bounded in-memory map that forgets the oldest response once
//! full (`--responses-store`). A response chained to an evicted one is a
//! 404 naming `previous_response_id`, never a silently shorter conversation.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

use serde_json::Value;

/// One stored response.
#[derive(Clone, Debug)]
pub struct Stored {
    /// The response object as it was returned.
    pub response: Value,
    /// The conversation so far in chat-message form (input turns and this
    /// response's output), without `instructions` (they do not carry over).
    pub conversation: Value,
}

/// The bounded store.
pub struct ResponseStore {
    cap: usize,
    inner: Mutex<(HashMap<String, Stored>, VecDeque<String>)>,
}

impl ResponseStore {
    /// A store holding at most `cap` responses (0 stores nothing).
    pub fn new(cap: usize) -> Self {
        Self {
            cap,
            inner: Mutex::new((HashMap::new(), VecDeque::new())),
        }
    }

    /// Keeps `stored` under `id`, evicting the oldest beyond the cap.
    pub fn insert(&self, id: String, stored: Stored) {
        if self.cap == 0 {
            return;
        }
        let mut g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
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
    }

    /// The response stored under `id`.
    pub fn get(&self, id: &str) -> Option<Stored> {
        let g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        g.0.get(id).cloned()
    }

    /// Forgets `id`; whether it was there.
    pub fn remove(&self, id: &str) -> bool {
        let mut g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let (map, order) = &mut *g;
        let had = map.remove(id).is_some();
        if had {
            order.retain(|k| k != id);
        }
        had
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
        s.insert("a".into(), item(1));
        s.insert("b".into(), item(2));
        s.insert("c".into(), item(3));
        assert!(s.get("a").is_none());
        assert_eq!(s.get("c").unwrap().response["id"], 3);
        assert!(s.remove("b"));
        assert!(!s.remove("b"));
        s.insert("d".into(), item(4));
        assert!(s.get("c").is_some() && s.get("d").is_some());
        let none = ResponseStore::new(0);
        none.insert("x".into(), item(5));
        assert!(none.get("x").is_none());
    }
}
