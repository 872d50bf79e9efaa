//! The persistent thread pool every GEMM and attention call forks on: made once per model, shared by
//! the decoder and the tower, never a thread spawned per call.

use std::sync::Arc;

#[derive(Debug, thiserror::Error)]
pub enum PoolError {
    #[error("threads must be at least 1")]
    NoThreads,
    #[error("cannot start the thread pool: {0}")]
    Start(String),
}

/// A pool of `threads` named `xdna-vl-<i>`.
pub fn new_pool(threads: usize) -> Result<Arc<rayon::ThreadPool>, PoolError> {
    if threads == 0 {
        return Err(PoolError::NoThreads);
    }
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .thread_name(|i| format!("xdna-vl-{i}"))
        .build()
        .map(Arc::new)
        .map_err(|e| PoolError::Start(e.to_string()))
}
