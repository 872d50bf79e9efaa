//! Wall time summed over calls until taken: benchmarks split a step or a tower pass into GEMMs
//! (the backend's stats), attention (this) and the rest.

use std::time::{Duration, Instant};

#[derive(Clone, Copy, Debug, Default)]
pub struct TimeSpent(Duration);

impl TimeSpent {
    /// Runs `f`, adding its wall time.
    pub fn time<R>(&mut self, f: impl FnOnce() -> R) -> R {
        let start = Instant::now();
        let r = f();
        self.0 += start.elapsed();
        r
    }

    pub fn add(&mut self, d: Duration) {
        self.0 += d;
    }

    /// The time so far, and restarts the count.
    pub fn take(&mut self) -> Duration {
        std::mem::take(&mut self.0)
    }
}
