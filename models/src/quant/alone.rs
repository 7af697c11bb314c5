//! Products whose every activation row gets the bits it would get alone.
//!
//! llama.cpp, and Tern bit for bit with it, picks a product's summation
//! order by its number of activation rows: one row runs the `vec_dot` or
//! `gemv` kernels, several rows the repacked `gemm` (Q4_K from 4 rows),
//! ggml-cpu's tiled K-quant matmul (from 8 rows) or llamafile's tinyBLAS
//! (F16 and BF16 from 2 rows). Each order rounds differently, so a token
//! scored inside a batch can get other logits, in the last bits, than the
//! same token decoded alone. Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0 (not IQ4_NL
//! unrepacked) give every row the same bits at any row count.
//!
//! Speculative decoding scores a draft's tokens as one batch yet promises
//! plain decoding's output, which is one row a step. Inside [`scope`],
//! every product on this thread computes each activation row in the order
//! of a one-row product. The weights are still read once: the kernels walk
//! a block of weight rows against every activation row before moving on.

use std::cell::Cell;

thread_local! {
    static ALONE: Cell<bool> = const { Cell::new(false) };
}

/// Runs `f` with this thread's products giving each activation row its
/// one-row bits (see the module doc); the previous setting is restored
/// after, also if `f` panics.
pub fn scope<R>(f: impl FnOnce() -> R) -> R {
    struct Restore(bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            ALONE.with(|a| a.set(self.0));
        }
    }
    let _restore = Restore(ALONE.with(|a| a.replace(true)));
    f()
}

/// Whether this thread is inside [`scope`]. Read on the thread that calls a
/// product, before its work goes to the pool.
pub fn active() -> bool {
    ALONE.with(Cell::get)
}
