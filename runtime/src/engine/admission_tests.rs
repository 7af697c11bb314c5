//! The queue limit's bookkeeping as a submitter sees it: which requests are
//! ready and which wait, the rows and KV bytes pending and running requests
//! hold, arrival order, and the room a request gives back when it leaves,
//! is admitted or retires.

use super::*;

fn config(max_queue: usize, max_running: usize, kv_memory: usize) -> EngineConfig {
    EngineConfig {
        max_queue,
        max_running,
        kv_memory,
        ..EngineConfig::default()
    }
}

#[test]
fn a_request_is_in_flight_from_submission_to_retirement() {
    let a = Admission::default();
    let cfg = config(4, 4, 1000);
    assert!(!a.in_flight());
    a.enter(1, 10, &cfg).unwrap();
    assert!(a.in_flight());
    a.admitted(1, 10);
    assert!(a.in_flight(), "admitted and running");
    a.retired(1, 10);
    assert!(!a.in_flight());
    a.enter(2, 10, &cfg).unwrap();
    a.leave(2, 10);
    assert!(!a.in_flight(), "left without running");
}

#[test]
fn a_burst_into_free_rows_is_not_queued() {
    let a = Admission::default();
    let cfg = config(1, 4, 1000);
    for _ in 0..4 {
        assert_eq!(a.enter(1, 10, &cfg), Ok(true));
    }
    // No row is free for a fifth: it waits, and a sixth finds the queue full.
    assert_eq!(a.enter(1, 10, &cfg), Ok(false));
    assert_eq!(a.enter(1, 10, &cfg), Err(Full { queued: 1 }));
    // Admission does not free room; a retirement does.
    (0..4).for_each(|_| a.admitted(1, 10));
    assert_eq!(a.enter(1, 10, &cfg), Err(Full { queued: 1 }));
    a.retired(1, 10);
    a.admitted(1, 10);
    assert_eq!(a.pending(), 0);
    assert_eq!(a.enter(1, 10, &cfg), Ok(false));
}

#[test]
fn kv_memory_bounds_what_is_ready() {
    let a = Admission::default();
    let cfg = config(1, 64, 100);
    assert_eq!(a.enter(1, 60, &cfg), Ok(true));
    assert_eq!(a.enter(1, 60, &cfg), Ok(false));
    assert!(a.enter(1, 10, &cfg).is_err());
    a.leave(1, 60);
    assert_eq!(a.pending(), 1);
}

#[test]
fn a_request_behind_a_waiting_one_waits_even_with_room_free() {
    // Two rows: a third request waits for one.
    let a = Admission::default();
    let cfg = config(4, 2, 1000);
    assert_eq!(a.enter(1, 10, &cfg), Ok(true));
    assert_eq!(a.enter(1, 10, &cfg), Ok(true));
    assert_eq!(a.enter(1, 10, &cfg), Ok(false));
    // Both ready ones run and finish: room for two again, one waiting.
    (0..2).for_each(|_| a.admitted(1, 10));
    (0..2).for_each(|_| a.retired(1, 10));
    // A newcomer fits beside the waiting one, but arrival order holds: it
    // counts as waiting, not about to run.
    assert_eq!(a.enter(1, 10, &cfg), Ok(false));
    assert_eq!(a.pending(), 2);
}

#[test]
fn a_request_wider_than_the_decode_rows_runs_alone() {
    // n = 8 completions on an engine decoding 4 rows at most: admitted when
    // nothing is ahead of it, never refused for its width.
    let a = Admission::default();
    let cfg = config(0, 4, 1000);
    assert_eq!(a.enter(8, 10, &cfg), Ok(true));
    // Anything after it waits (and with no queue, is refused).
    assert_eq!(a.enter(1, 10, &cfg), Err(Full { queued: 0 }));
    a.admitted(8, 10);
    a.retired(8, 10);
    assert_eq!(a.enter(4, 10, &cfg), Ok(true));
}

#[test]
fn pending_and_running_kv_bytes_both_count_against_kv_memory() {
    // No queue: what does not fit now is refused.
    let a = Admission::default();
    let cfg = config(0, 64, 100);
    assert_eq!(a.enter(1, 40, &cfg), Ok(true));
    a.admitted(1, 40);
    // 40 running + 40 pending + 20 = the whole budget: still ready.
    assert_eq!(a.enter(1, 40, &cfg), Ok(true));
    assert_eq!(a.enter(1, 20, &cfg), Ok(true));
    // One byte over.
    assert_eq!(a.enter(1, 1, &cfg), Err(Full { queued: 0 }));
    // The running request's retirement gives its 40 bytes back.
    a.retired(1, 40);
    assert_eq!(a.enter(1, 40, &cfg), Ok(true));
}

#[test]
fn a_request_that_leaves_gives_back_its_place_and_its_bytes() {
    // No queue: a request that does not fit is refused outright.
    let a = Admission::default();
    let cfg = config(0, 64, 100);
    assert_eq!(a.enter(1, 60, &cfg), Ok(true));
    assert_eq!(a.enter(1, 60, &cfg), Err(Full { queued: 0 }));
    // The first is cancelled before it ran: nothing is pending any more,
    // and its 60 bytes are free for the next.
    a.leave(1, 60);
    assert_eq!(a.pending(), 0);
    assert!(!a.in_flight());
    assert_eq!(a.enter(1, 60, &cfg), Ok(true));
}

#[test]
fn admission_takes_the_oldest_pending_request_first() {
    // One row, one queue place: the first request is ready, the second waits.
    let a = Admission::default();
    let cfg = config(1, 1, 1000);
    assert_eq!(a.enter(1, 10, &cfg), Ok(true));
    assert_eq!(a.enter(1, 10, &cfg), Ok(false));
    // The engine admits the first: the second still holds the queue place.
    a.admitted(1, 10);
    assert_eq!(a.pending(), 1);
    assert_eq!(a.enter(1, 10, &cfg), Err(Full { queued: 1 }));
    // It runs in turn; the queue is empty.
    a.retired(1, 10);
    a.admitted(1, 10);
    assert_eq!(a.enter(1, 10, &cfg), Ok(false));
}

#[test]
fn giving_back_more_than_was_taken_leaves_the_counts_at_zero() {
    // A stray leave or retirement (a request cancelled twice, say) must
    // not wrap the counts around and block every later request.
    let a = Admission::default();
    let cfg = config(0, 2, 100);
    a.leave(3, 500);
    a.retired(3, 500);
    a.admitted(0, 0);
    assert!(!a.in_flight());
    assert_eq!(a.pending(), 0);
    assert_eq!(a.enter(2, 100, &cfg), Ok(true));
}
