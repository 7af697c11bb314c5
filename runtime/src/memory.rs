//! Process memory readings (Linux `/proc`), for reports and memory caps.

/// Hands freed heap memory back to the OS. glibc keeps what a thread freed
/// in that thread's arena, where another thread cannot use it: the rollout
/// engine's KV cache, freed when its sequences finish, would otherwise still
/// be resident while the trainer's learner allocates its activations, and a
/// memory cap planned for one phase at a time would count both.
pub fn release_free_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only returns unused pages of the allocator's own
    // arenas; it touches no live allocation.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// The highest `VmHWM` seen before the last [`start_phase`] reset it.
static EARLIER_PEAK: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Peak resident set size of this process in bytes over its whole life
/// (`VmHWM`, and what it was before any [`start_phase`]), if readable.
pub fn peak_rss_bytes() -> Option<u64> {
    let earlier = EARLIER_PEAK.load(std::sync::atomic::Ordering::Relaxed);
    phase_peak_rss_bytes().map(|p| p.max(earlier))
}

/// Peak resident set size since the last [`start_phase`] (the process's
/// start if none), if readable.
pub fn phase_peak_rss_bytes() -> Option<u64> {
    status_kb("VmHWM:").map(|kb| kb * 1024)
}

/// Starts measuring a phase's own peak: folds the peak so far into the
/// lifetime figure and resets the kernel's `VmHWM` to the current resident
/// size (`/proc/self/clear_refs`), so that [`phase_peak_rss_bytes`] then
/// reports what this phase alone reached. Returns whether the reset took
/// (kernels before 4.0, or a read-only /proc, keep the lifetime peak).
pub fn start_phase() -> bool {
    if let Some(p) = phase_peak_rss_bytes() {
        EARLIER_PEAK.fetch_max(p, std::sync::atomic::Ordering::Relaxed);
    }
    std::fs::write("/proc/self/clear_refs", "5").is_ok()
}

/// Current resident set size of this process in bytes (`VmRSS`), if readable.
pub fn rss_bytes() -> Option<u64> {
    status_kb("VmRSS:").map(|kb| kb * 1024)
}

fn status_kb(key: &str) -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with(key))?;
    line[key.len()..]
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()
}

/// Main-memory read bandwidth in bytes per second: `threads` threads each sum
/// their share of a `bytes`-sized buffer (large enough to defeat the caches),
/// best of several passes. Decode of a small model streams every weight once
/// per token, so this over the weight bytes is its speed ceiling.
pub fn read_bandwidth(threads: usize, bytes: usize) -> f64 {
    let threads = threads.max(1);
    let words = (bytes / 8).max(threads * 1024);
    // Written first, so the pages are really backed (a zeroed buffer could
    // read the kernel's shared zero page and flatter the figure).
    let buf: Vec<u64> = (0..words as u64).map(|i| i.wrapping_mul(0x9E37)).collect();
    let chunk = words.div_ceil(threads);
    let mut best = 0f64;
    for _ in 0..5 {
        let t = std::time::Instant::now();
        let total: u64 = std::thread::scope(|s| {
            let handles: Vec<_> = buf
                .chunks(chunk)
                .map(|part| s.spawn(move || sum_words(part)))
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap_or(0))
                .fold(0u64, u64::wrapping_add)
        });
        std::hint::black_box(total);
        let secs = t.elapsed().as_secs_f64().max(1e-9);
        best = best.max((words * 8) as f64 / secs);
    }
    best
}

/// Wrapping sum with four independent accumulators (so the loop is bound by
/// memory, not by one add chain).
fn sum_words(part: &[u64]) -> u64 {
    /// How far ahead of the reads the prefetches run (bytes): decode kernels
    /// prefetch their next weight rows, and a probe that did not would
    /// measure less than they read.
    const AHEAD: usize = 1024;
    let mut acc = [0u64; 4];
    let mut quads = part.chunks_exact(4);
    for (i, q) in (&mut quads).enumerate() {
        #[cfg(target_arch = "x86_64")]
        if i % 2 == 0 {
            // SAFETY: prefetch is a hint; it never faults, even past the end.
            unsafe {
                let p = q.as_ptr().cast::<i8>().wrapping_add(AHEAD);
                std::arch::x86_64::_mm_prefetch(p, std::arch::x86_64::_MM_HINT_T0);
            }
        }
        for (a, &x) in acc.iter_mut().zip(q) {
            *a = a.wrapping_add(x);
        }
    }
    let tail = quads
        .remainder()
        .iter()
        .fold(0u64, |a, &x| a.wrapping_add(x));
    acc.iter().fold(tail, |a, &x| a.wrapping_add(x))
}

#[cfg(test)]
mod tests {
    #[test]
    fn bandwidth_is_a_plausible_positive_rate() {
        // 64 MiB at any real machine's speed: between 100 MB/s and 10 TB/s.
        let bw = super::read_bandwidth(2, 64 << 20);
        assert!(bw > 1e8 && bw < 1e13, "{bw}");
    }

    #[test]
    fn a_phase_peak_forgets_earlier_phases_but_the_lifetime_peak_does_not() {
        // 256 MiB touched and freed, then a new phase: the phase's peak is
        // back near the current size, the lifetime peak still holds it.
        let big: Vec<u8> = vec![1; 256 << 20];
        std::hint::black_box(&big);
        let before = super::peak_rss_bytes().unwrap();
        drop(big);
        super::release_free_memory();
        if !super::start_phase() {
            return; // a kernel without clear_refs: nothing to check here
        }
        let phase = super::phase_peak_rss_bytes().unwrap();
        assert!(
            phase + (128 << 20) < before,
            "phase {phase} lifetime {before}"
        );
        // The kernel's counters lag by a few pages per thread.
        assert!(super::peak_rss_bytes().unwrap() + (4 << 20) >= before);
    }
}
