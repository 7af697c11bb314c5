//! Response ids, timestamps and random seeds, without a random-number crate:
//! std's per-instance `RandomState` keys are random, which is all an id or a
//! default seed needs (seeded sampling itself lives in the runtime).

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// A fresh random 64-bit value (for seeds when a request names none).
pub fn random_u64() -> u64 {
    // A counter makes consecutive calls differ even if keys were ever reused.
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut h = RandomState::new().build_hasher();
    h.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
    h.finish()
}

/// A response id such as `chatcmpl-3f2a...` (prefix, dash, 24 hex digits).
pub fn response_id(prefix: &str) -> String {
    format!("{prefix}-{:016x}{:08x}", random_u64(), random_u64() as u32)
}

/// Seconds since the Unix epoch (`created` fields).
pub fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_prefixed_and_distinct() {
        let a = response_id("chatcmpl");
        let b = response_id("chatcmpl");
        assert!(a.starts_with("chatcmpl-"));
        assert_eq!(a.len(), "chatcmpl-".len() + 24);
        assert_ne!(a, b);
    }
}
