//! The memory every loaded model holds, counted against one budget
//! (`tern serve --models-memory`).
//!
//! A model is charged its weights (the GGUF file's size) plus its engine's
//! whole KV budget (`--kv-memory`) from the moment its load starts until it
//! is unloaded: its engine never admits more KV than that, so the sum of the
//! charges bounds what the loaded models can hold together and admission
//! inside each engine stays honest. This file only counts; which model to
//! unload to make room is the registry's decision (`registry/mod.rs`).

use std::sync::Mutex;

/// Bytes promised to loaded (or loading) models, out of a fixed budget.
#[derive(Debug)]
pub struct MemoryBudget {
    total: usize,
    used: Mutex<usize>,
}

/// A charge the budget could not take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NoRoom {
    /// Bytes asked for.
    pub needed: usize,
    /// Bytes free when asked.
    pub free: usize,
    /// The whole budget.
    pub total: usize,
}

impl MemoryBudget {
    /// A budget of `total` bytes, nothing charged.
    pub fn new(total: usize) -> Self {
        Self {
            total,
            used: Mutex::new(0),
        }
    }

    fn used_mut(&self) -> std::sync::MutexGuard<'_, usize> {
        // A counter cannot be left half-updated by a panicking holder.
        self.used.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Charges `bytes` if they fit beside what is charged, all or nothing.
    pub fn try_charge(&self, bytes: usize) -> Result<(), NoRoom> {
        let mut used = self.used_mut();
        let free = self.total.saturating_sub(*used);
        if bytes > free {
            return Err(NoRoom {
                needed: bytes,
                free,
                total: self.total,
            });
        }
        *used += bytes;
        Ok(())
    }

    /// Gives back a charge taken by [`MemoryBudget::try_charge`].
    pub fn release(&self, bytes: usize) {
        let mut used = self.used_mut();
        *used = used.saturating_sub(bytes);
    }

    /// Bytes charged now.
    pub fn used(&self) -> usize {
        *self.used_mut()
    }

    /// The whole budget.
    pub fn total(&self) -> usize {
        self.total
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn charges_fit_the_budget_or_are_refused_whole() {
        let b = MemoryBudget::new(100);
        assert_eq!(b.try_charge(60), Ok(()));
        assert_eq!(
            b.try_charge(50),
            Err(NoRoom {
                needed: 50,
                free: 40,
                total: 100
            })
        );
        assert_eq!(b.used(), 60, "a refused charge takes nothing");
        assert_eq!(b.try_charge(40), Ok(()));
        b.release(60);
        assert_eq!(b.used(), 40);
        assert_eq!(b.try_charge(60), Ok(()));
        assert!(b.try_charge(1).is_err());
    }
}
