//! How many threads Mesa's CPU adapter (llvmpipe / lavapipe) runs a dispatch on.
//!
//! llvmpipe spreads a dispatch's workgroups over `LP_NUM_THREADS` threads, one per core by default,
//! and waits for all of them before the next dispatch. A decode step's matmuls have only 3-6
//! workgroups (576 output columns are 2.25 workgroups of 256), so with one thread per core a core
//! idles at the end of most dispatches. With two threads per core the operating system shares the
//! cores among the leftover workgroups instead: on 2 cores batch-8 steps took about 6% less wall time
//! on average and batch-16 steps 15% less (docs/performance.md, "Two llvmpipe threads per core"). Other adapters ignore the variable.

/// The environment variable llvmpipe reads when the adapter is enumerated.
pub const LLVMPIPE_THREADS_VAR: &str = "LP_NUM_THREADS";

/// Threads per core this runtime asks of llvmpipe.
pub const THREADS_PER_CORE: usize = 2;

/// llvmpipe's own cap on its thread count (LP_MAX_THREADS in Mesa 22-24).
const LLVMPIPE_MAX_THREADS: usize = 16;

/// The thread count to ask for on a machine of `cores` cores.
pub fn llvmpipe_threads_for(cores: usize) -> usize {
    (cores.max(1) * THREADS_PER_CORE).min(LLVMPIPE_MAX_THREADS)
}

/// Sets `LP_NUM_THREADS` to two threads per core unless the user has set it; returns the value in
/// effect afterwards (None where it could not be read). Call at the very start of `main`, before any
/// thread starts (setting the environment is not thread-safe) and before the first `Gpu::new`.
pub fn oversubscribe_cpu_adapter() -> Option<String> {
    // The browser build has no process environment (and no llvmpipe of its own to tune).
    if cfg!(target_arch = "wasm32") {
        return None;
    }
    if let Some(v) = std::env::var_os(LLVMPIPE_THREADS_VAR) {
        return v.into_string().ok();
    }
    let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    let threads = llvmpipe_threads_for(cores).to_string();
    std::env::set_var(LLVMPIPE_THREADS_VAR, &threads);
    Some(threads)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_threads_per_core_within_llvmpipes_cap() {
        assert_eq!(llvmpipe_threads_for(0), 2);
        assert_eq!(llvmpipe_threads_for(1), 2);
        assert_eq!(llvmpipe_threads_for(2), 4);
        assert_eq!(llvmpipe_threads_for(6), 12);
        assert_eq!(llvmpipe_threads_for(64), 16);
    }
}
