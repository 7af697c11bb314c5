//! The queue limit's bookkeeping: which submitted requests are really
//! waiting, as opposed to about to run.
//!
//! `max_queue` bounds requests that must wait for room (KV memory or decode
//! rows). A request submitted while the engine is mid-step is not admitted
//! until that step ends, but if room is free for it (and for everything
//! submitted before it) it is about to run, not waiting, so a burst into an
//! idle engine is never refused. The handles update this under one lock on
//! submit and the engine on admission and retirement, so the count a
//! submitter checks never sees half an update.

use std::sync::Mutex;

use super::EngineConfig;

/// Room the engine has promised and the requests sitting ahead of a new one.
#[derive(Debug, Default)]
pub(super) struct Admission {
    inner: Mutex<Counts>,
}

#[derive(Debug, Default)]
struct Counts {
    /// Submitted, not admitted, and room was free for them when submitted.
    ready: usize,
    /// Submitted, not admitted, and they had to wait: what `max_queue` bounds.
    queued: usize,
    /// Rows and KV bytes of all submitted, not admitted requests.
    pending_rows: usize,
    pending_bytes: usize,
    /// Rows and KV bytes of admitted requests still running.
    running_rows: usize,
    running_bytes: usize,
}

/// A request refused because `queued` requests already wait.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Full {
    /// Requests waiting for room now.
    pub queued: usize,
}

impl Admission {
    fn counts(&self) -> std::sync::MutexGuard<'_, Counts> {
        // The counts stay consistent even if a holder panicked mid-update:
        // every update is a few additions.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Takes a place for a request of `rows` sequences reserving `bytes`:
    /// always when room is free for it and everything ahead, otherwise only
    /// while fewer than `max_queue` wait. Returns whether it was ready.
    pub fn enter(&self, rows: usize, bytes: usize, config: &EngineConfig) -> Result<bool, Full> {
        let mut c = self.counts();
        let rows_ahead = c.running_rows + c.pending_rows;
        let fits_rows = rows_ahead + rows <= config.max_running || rows_ahead == 0;
        let fits_kv = c.running_bytes + c.pending_bytes + bytes <= config.kv_memory;
        let ready = fits_rows && fits_kv && c.queued == 0;
        if !ready && c.queued >= config.max_queue {
            return Err(Full { queued: c.queued });
        }
        if ready {
            c.ready += 1;
        } else {
            c.queued += 1;
        }
        c.pending_rows += rows;
        c.pending_bytes += bytes;
        Ok(ready)
    }

    /// A request leaves the queue without running (cancelled, not sent).
    pub fn leave(&self, rows: usize, bytes: usize) {
        let mut c = self.counts();
        take_one(&mut c);
        c.pending_rows = c.pending_rows.saturating_sub(rows);
        c.pending_bytes = c.pending_bytes.saturating_sub(bytes);
    }

    /// The engine admitted a request: its room moves from pending to running.
    pub fn admitted(&self, rows: usize, bytes: usize) {
        let mut c = self.counts();
        take_one(&mut c);
        c.pending_rows = c.pending_rows.saturating_sub(rows);
        c.pending_bytes = c.pending_bytes.saturating_sub(bytes);
        c.running_rows += rows;
        c.running_bytes += bytes;
    }

    /// A running request ended and gave its room back.
    pub fn retired(&self, rows: usize, bytes: usize) {
        let mut c = self.counts();
        c.running_rows = c.running_rows.saturating_sub(rows);
        c.running_bytes = c.running_bytes.saturating_sub(bytes);
    }

    /// Whether any request is submitted and not finished (waiting or
    /// running): read under the one lock, so a request between admission
    /// and its first step still counts.
    pub fn in_flight(&self) -> bool {
        let c = self.counts();
        c.ready + c.queued > 0 || c.pending_rows > 0 || c.running_rows > 0
    }

    /// Requests submitted and not admitted yet (ready or waiting).
    pub fn pending(&self) -> usize {
        let c = self.counts();
        c.ready + c.queued
    }
}

/// Admission is in arrival order, so the oldest pending request (a ready
/// one, while any are) is the one that leaves.
fn take_one(c: &mut Counts) {
    if c.ready > 0 {
        c.ready -= 1;
    } else {
        c.queued = c.queued.saturating_sub(1);
    }
}

#[cfg(test)]
#[path = "admission_tests.rs"]
mod tests;
