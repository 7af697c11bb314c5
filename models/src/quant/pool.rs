//! A persistent pool of worker threads for the quantized kernels, built for many
//! short jobs: a decode step runs ~210 matrix products of a few microseconds each,
//! where waking sleeping threads (tens of microseconds on a VM) would cost more than
//! the work.
//!
//! Workers spin on a job counter for a while after each job, then yield, then park.
//! A job is a closure every participant runs; it must pull its own work items from a
//! shared counter, so it completes with any number of participants. That makes the
//! protocol forgiving: the caller always takes part, and when it has drained the work
//! it *closes* the job and waits only for workers that actually joined, never for a
//! worker that is still waking up. A worker that wakes late finds the job closed (or
//! joins a newer job, which is equally fine).
//!
//! The thread count is `RAYON_NUM_THREADS` (which the Tern binary sets from
//! `--threads`) or else the machine's available parallelism; the caller counts as one.

use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, TryLockError};
use std::thread::Thread;
use std::time::{Duration, Instant};

/// A job as the workers see it: a pointer to the caller's `&dyn Fn()`.
type JobRef<'a> = &'a (dyn Fn() + Sync + 'a);

/// How long an idle worker busy-waits before it starts yielding its core.
const SPIN: Duration = Duration::from_micros(50);
/// How long an idle worker keeps yielding before it parks.
const YIELD: Duration = Duration::from_millis(2);

struct Shared {
    /// Bumped once per job; idle workers watch it.
    epoch: AtomicUsize,
    /// Bit 0: the current job is open to join; bits 1..: workers inside it, times 2.
    state: AtomicUsize,
    /// The current job (a `*const JobRef`), valid while the job is open or joined.
    job: AtomicPtr<()>,
    /// Per worker: parked (or about to park) and needs an unpark.
    sleeping: Box<[AtomicBool]>,
    /// A worker's job panicked; the caller re-raises.
    panicked: AtomicBool,
}

/// The pool: `threads() - 1` workers plus whichever thread calls [`Pool::run`].
pub struct Pool {
    shared: Arc<Shared>,
    handles: Vec<Thread>,
    /// One job at a time; a second concurrent caller runs its job alone.
    call: Mutex<()>,
}

impl Pool {
    /// The process-wide pool, started on first use.
    pub fn global() -> &'static Pool {
        static POOL: OnceLock<Pool> = OnceLock::new();
        POOL.get_or_init(|| Pool::new(configured_threads()))
    }

    /// A pool whose jobs run on `threads` threads, the caller included. Private:
    /// workers never exit, so the one global pool is the only one.
    fn new(threads: usize) -> Self {
        let workers = threads.max(1) - 1;
        let shared = Arc::new(Shared {
            epoch: AtomicUsize::new(0),
            state: AtomicUsize::new(0),
            job: AtomicPtr::new(std::ptr::null_mut()),
            sleeping: (0..workers).map(|_| AtomicBool::new(false)).collect(),
            panicked: AtomicBool::new(false),
        });
        let mut handles = Vec::with_capacity(workers);
        for i in 0..workers {
            let sh = shared.clone();
            let spawned = std::thread::Builder::new()
                .name(format!("tern-quant-{i}"))
                .spawn(move || worker(&sh, i));
            // A pool that could not start a thread simply has fewer workers.
            match spawned {
                Ok(h) => handles.push(h.thread().clone()),
                Err(_) => break,
            }
        }
        Self {
            shared,
            handles,
            call: Mutex::new(()),
        }
    }

    /// Threads a job can run on, the caller included.
    pub fn threads(&self) -> usize {
        self.handles.len() + 1
    }

    /// Fills `out` chunk by chunk on the pool: `fill(start, chunk)` writes
    /// elements `start .. start + chunk.len()`, every chunk `chunk` long but
    /// the last. Each element's value cannot depend on which thread wrote it,
    /// so results equal a serial fill's; below two chunks it runs on the caller.
    pub fn fill_chunks<T: Send>(
        &self,
        out: &mut [T],
        chunk: usize,
        fill: &(dyn Fn(usize, &mut [T]) + Sync),
    ) {
        let chunk = chunk.max(1);
        let n_chunks = out.len().div_ceil(chunk);
        if n_chunks < 2 || self.threads() == 1 {
            return fill(0, out);
        }
        /// The output, written at disjoint chunks by several threads.
        struct Out<T>(*mut T, usize);
        // SAFETY: each chunk index is claimed once (the counter below), so no
        // two threads touch the same elements; `out` outlives the job.
        unsafe impl<T: Send> Sync for Out<T> {}
        let dst = &Out(out.as_mut_ptr(), out.len());
        let next = AtomicUsize::new(0);
        self.run(&|| loop {
            let i = next.fetch_add(1, Ordering::Relaxed);
            if i >= n_chunks {
                break;
            }
            let start = i * chunk;
            let len = chunk.min(dst.1 - start);
            // SAFETY: `start + len <= out.len()`, and chunk `i` is this
            // thread's alone.
            let part = unsafe { std::slice::from_raw_parts_mut(dst.0.add(start), len) };
            fill(start, part);
        });
    }

    /// Runs `job` on the caller and on every worker that joins in time, returning once
    /// all of them are out of it. `job` must take its work items from a shared
    /// counter so that any number of runs completes the work exactly once.
    pub fn run(&self, job: &(dyn Fn() + Sync)) {
        if self.handles.is_empty() {
            return job();
        }
        let _guard = match self.call.try_lock() {
            Ok(g) => g,
            Err(TryLockError::Poisoned(p)) => p.into_inner(),
            // Another thread's job is running: do this one alone.
            Err(TryLockError::WouldBlock) => return job(),
        };
        let sh = &*self.shared;
        let job_ref: JobRef<'_> = job;
        sh.job
            .store(&job_ref as *const JobRef<'_> as *mut (), Ordering::Relaxed);
        // Open the job (no worker is inside: the previous call drained them), then
        // announce it. SeqCst pairs with the workers' sleep protocol.
        sh.state.store(1, Ordering::Release);
        sh.epoch.fetch_add(1, Ordering::SeqCst);
        for (flag, h) in sh.sleeping.iter().zip(&self.handles) {
            if flag.load(Ordering::SeqCst) && flag.swap(false, Ordering::SeqCst) {
                h.unpark();
            }
        }
        let mine = std::panic::catch_unwind(std::panic::AssertUnwindSafe(job));
        // Close the job and wait for the workers inside it; `job_ref` must outlive them.
        sh.state.fetch_and(!1, Ordering::AcqRel);
        let mut spins = 0u32;
        while sh.state.load(Ordering::Acquire) != 0 {
            spins += 1;
            if spins < 1 << 14 {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
        let theirs = sh.panicked.swap(false, Ordering::Relaxed);
        if let Err(payload) = mine {
            std::panic::resume_unwind(payload);
        }
        if theirs {
            panic!("a tern-quant worker panicked");
        }
    }
}

/// `RAYON_NUM_THREADS` if set to a positive number, else the available parallelism.
fn configured_threads() -> usize {
    std::env::var("RAYON_NUM_THREADS")
        .ok()
        .and_then(|s| s.trim().parse::<usize>().ok())
        .filter(|&n| n > 0)
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

fn worker(sh: &Shared, index: usize) {
    let mut seen = 0usize;
    loop {
        seen = wait_for_job(sh, index, seen);
        // Join the open job, if it still is.
        let mut s = sh.state.load(Ordering::Acquire);
        let joined = loop {
            if s & 1 == 0 {
                break false;
            }
            match sh
                .state
                .compare_exchange_weak(s, s + 2, Ordering::Acquire, Ordering::Acquire)
            {
                Ok(_) => break true,
                Err(now) => s = now,
            }
        };
        if !joined {
            continue;
        }
        let ptr = sh.job.load(Ordering::Acquire) as *const JobRef<'static>;
        // SAFETY: the caller published `ptr` (a pointer to a `JobRef` on its stack)
        // before opening the job, which our successful join acquired, and it does not
        // return (ending the borrow) until every joined worker has left below. The
        // `'static` is a lie confined to this scope.
        let job = unsafe { *ptr };
        if std::panic::catch_unwind(std::panic::AssertUnwindSafe(job)).is_err() {
            sh.panicked.store(true, Ordering::Relaxed);
        }
        sh.state.fetch_sub(2, Ordering::Release);
    }
}

/// Waits until the epoch moves past `seen`; returns the new epoch.
fn wait_for_job(sh: &Shared, index: usize, seen: usize) -> usize {
    let start = Instant::now();
    let mut n = 0u32;
    let mut waited = Duration::ZERO;
    loop {
        let e = sh.epoch.load(Ordering::Acquire);
        if e != seen {
            return e;
        }
        n = n.wrapping_add(1);
        // Reading the clock costs ~20 ns: do it every 64 rounds.
        if n.is_multiple_of(64) {
            waited = start.elapsed();
        }
        if waited < SPIN {
            std::hint::spin_loop();
            continue;
        }
        if waited < SPIN + YIELD {
            std::thread::yield_now();
            continue;
        }
        // Park. The store/load pair below and the caller's epoch bump/flag load are
        // SeqCst, so either we see the new epoch or the caller sees our flag.
        sh.sleeping[index].store(true, Ordering::SeqCst);
        loop {
            let e = sh.epoch.load(Ordering::SeqCst);
            if e != seen {
                sh.sleeping[index].store(false, Ordering::Relaxed);
                return e;
            }
            std::thread::park();
        }
    }
}
