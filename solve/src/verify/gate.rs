//! One process-wide limit on sandboxes alive at once, shared by every caller
//! of the judge (all of a server's requests, a trainer's reward workers):
//! without it, N concurrent code requests would start N times a request's
//! tests at once. Work over the limit waits its turn (it is queued, never
//! refused) and gives up its place when its run is cancelled.

use std::num::NonZeroUsize;
use std::sync::{Condvar, Mutex, PoisonError};
use std::time::Duration;

use super::sandbox::Cancel;

/// How often a waiter looks at its cancel switch.
const CANCEL_POLL: Duration = Duration::from_millis(50);

/// Sandboxes alive and the most allowed.
#[derive(Debug)]
struct State {
    alive: usize,
    max: usize,
    peak: usize,
}

static STATE: Mutex<State> = Mutex::new(State {
    alive: 0,
    max: 0,
    peak: 0,
});
static FREED: Condvar = Condvar::new();

/// The default limit: two sandboxes (a test and its candidate) per core.
pub fn default_max_sandboxes() -> usize {
    2 * std::thread::available_parallelism().map_or(1, NonZeroUsize::get)
}

/// Sets the most sandboxes alive at once in this process (at least 2: one
/// test is two sandboxes, the candidate's and the test's).
pub fn set_max_sandboxes(max: usize) {
    let mut state = STATE.lock().unwrap_or_else(PoisonError::into_inner);
    state.max = max.max(2);
    FREED.notify_all();
}

/// The limit in force.
pub fn max_sandboxes() -> usize {
    let state = STATE.lock().unwrap_or_else(PoisonError::into_inner);
    effective(&state)
}

/// Sandboxes alive now, and the most that were alive at once since start.
pub fn sandboxes_alive() -> (usize, usize) {
    let state = STATE.lock().unwrap_or_else(PoisonError::into_inner);
    (state.alive, state.peak)
}

fn effective(state: &State) -> usize {
    if state.max == 0 {
        default_max_sandboxes()
    } else {
        state.max
    }
}

/// Places held for running sandboxes; given back on drop.
#[derive(Debug)]
pub(super) struct Permit(usize);

impl Drop for Permit {
    fn drop(&mut self) {
        let mut state = STATE.lock().unwrap_or_else(PoisonError::into_inner);
        state.alive -= self.0;
        FREED.notify_all();
    }
}

/// Waits until `count` sandboxes may start together, or `None` once
/// `cancel` is set.
pub(super) fn acquire(count: usize, cancel: &Cancel) -> Option<Permit> {
    let mut state = STATE.lock().unwrap_or_else(PoisonError::into_inner);
    loop {
        if cancel.is_cancelled() {
            return None;
        }
        let max = effective(&state);
        if state.alive + count <= max || state.alive == 0 {
            state.alive += count;
            state.peak = state.peak.max(state.alive);
            return Some(Permit(count));
        }
        state = FREED
            .wait_timeout(state, CANCEL_POLL)
            .unwrap_or_else(PoisonError::into_inner)
            .0;
    }
}
