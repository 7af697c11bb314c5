//! The task loop every evaluation runs: `parallel` scoped threads take the
//! next item from a shared counter until the items run out or one fails,
//! so tasks in flight share the engine's batches. One loop for the
//! question/code evaluation ([`super::run`]), the spreadsheet family
//! ([`super::spreadsheet`]) and `tern synth-data`, so all stop alike on the
//! first error.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

/// Calls `work(position, item)` on every item of `items`, `parallel`
/// (at least 1) at once, in no set order; after the first error no further
/// item starts, and that error is returned once the items in flight end.
pub fn for_each<T, E, F>(items: &[T], parallel: usize, work: F) -> Result<(), E>
where
    T: Sync,
    E: Send,
    F: Fn(usize, &T) -> Result<(), E> + Sync,
{
    let next = AtomicUsize::new(0);
    let failed: Mutex<Option<E>> = Mutex::new(None);
    std::thread::scope(|scope| {
        for _ in 0..parallel.max(1) {
            scope.spawn(|| loop {
                if failed.lock().expect("error slot").is_some() {
                    return;
                }
                let pos = next.fetch_add(1, Ordering::SeqCst);
                let Some(item) = items.get(pos) else {
                    return;
                };
                if let Err(e) = work(pos, item) {
                    failed.lock().expect("error slot").get_or_insert(e);
                    return;
                }
            });
        }
    });
    match failed.into_inner().expect("error slot") {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_item_runs_once_and_an_error_stops_the_rest() {
        let seen = Mutex::new(Vec::new());
        let ok: Result<(), ()> = for_each(&[10, 20, 30, 40, 50], 3, |pos, &x| {
            seen.lock().unwrap().push((pos, x));
            Ok(())
        });
        assert!(ok.is_ok());
        let mut seen = seen.into_inner().unwrap();
        seen.sort();
        assert_eq!(seen, vec![(0, 10), (1, 20), (2, 30), (3, 40), (4, 50)]);

        // One worker: items after the failing one never start.
        let started = AtomicUsize::new(0);
        let err = for_each(&[1, 2, 3, 4], 1, |_, &x| {
            started.fetch_add(1, Ordering::SeqCst);
            if x == 2 {
                Err(format!("item {x}"))
            } else {
                Ok(())
            }
        });
        assert_eq!(err, Err("item 2".to_string()));
        assert_eq!(started.load(Ordering::SeqCst), 2);
    }
}
