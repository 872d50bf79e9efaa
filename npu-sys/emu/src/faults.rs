//! Fault injection, read from the environment when a device is opened. Each variable holds
//! 1-based run numbers, counted per device, e.g. `NPU_EMU_FAIL_RUN=3` or `NPU_EMU_FAIL_RUN=2,5`:
//! - `NPU_EMU_FAIL_RUN`: the run ends in state ERROR, with C overwritten by the byte 0xA5 (a
//!   failed device run may leave anything behind);
//! - `NPU_EMU_ABORT_RUN`: the run ends in state ABORT, C untouched;
//! - `NPU_EMU_TIMEOUT_RUN`: the run never finishes: every wait returns TIMEOUT after its timeout.
//!
//! The device stays usable: the next run computes normally.

use crate::abi::EmuError;

pub const FAIL_RUN_ENV: &str = "NPU_EMU_FAIL_RUN";
pub const ABORT_RUN_ENV: &str = "NPU_EMU_ABORT_RUN";
pub const TIMEOUT_RUN_ENV: &str = "NPU_EMU_TIMEOUT_RUN";
/// Worker threads per run (default: the machine's parallelism).
pub const THREADS_ENV: &str = "NPU_EMU_THREADS";

/// What happens to one run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    Fail,
    Abort,
    Hang,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Faults {
    fail: Vec<u64>,
    abort: Vec<u64>,
    hang: Vec<u64>,
}

impl Faults {
    /// From the environment; a malformed value is refused by name.
    pub fn from_env() -> Result<Faults, EmuError> {
        let read = |name: &str| match std::env::var(name) {
            Ok(value) => parse_runs(name, &value),
            Err(std::env::VarError::NotPresent) => Ok(Vec::new()),
            Err(std::env::VarError::NotUnicode(_)) => {
                Err(EmuError::invalid(format!("{name} is not valid UTF-8")))
            }
        };
        Ok(Faults {
            fail: read(FAIL_RUN_ENV)?,
            abort: read(ABORT_RUN_ENV)?,
            hang: read(TIMEOUT_RUN_ENV)?,
        })
    }

    /// The fault planted for the `run`-th run (1-based), if any.
    pub fn for_run(&self, run: u64) -> Option<Fault> {
        if self.fail.contains(&run) {
            Some(Fault::Fail)
        } else if self.abort.contains(&run) {
            Some(Fault::Abort)
        } else if self.hang.contains(&run) {
            Some(Fault::Hang)
        } else {
            None
        }
    }
}

pub fn parse_runs(name: &str, value: &str) -> Result<Vec<u64>, EmuError> {
    let value = value.trim();
    if value.is_empty() {
        return Ok(Vec::new());
    }
    value
        .split(',')
        .map(|part| match part.trim().parse::<u64>() {
            Ok(run) if run >= 1 => Ok(run),
            _ => Err(EmuError::invalid(format!(
                "{name}={value:?}: expected 1-based run numbers such as 3 or 2,5"
            ))),
        })
        .collect()
}

/// Worker threads per run, from `NPU_EMU_THREADS` or the machine.
pub fn threads_from_env() -> Result<usize, EmuError> {
    match std::env::var(THREADS_ENV) {
        Ok(value) => match value.trim().parse::<usize>() {
            Ok(threads) if threads >= 1 => Ok(threads),
            _ => Err(EmuError::invalid(format!(
                "{THREADS_ENV}={value:?}: expected a positive count"
            ))),
        },
        Err(_) => Ok(std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_lists_and_refuses_garbage() {
        assert_eq!(parse_runs("X", "3").unwrap(), vec![3]);
        assert_eq!(parse_runs("X", " 2, 5 ").unwrap(), vec![2, 5]);
        assert_eq!(parse_runs("X", "").unwrap(), Vec::<u64>::new());
        let err = parse_runs("NPU_EMU_FAIL_RUN", "0").unwrap_err();
        assert!(err.message.contains("NPU_EMU_FAIL_RUN"));
        assert!(parse_runs("X", "two").is_err());
    }

    #[test]
    fn a_fail_takes_precedence_and_other_runs_are_clean() {
        let faults = Faults {
            fail: vec![2],
            abort: vec![2, 3],
            hang: vec![4],
        };
        assert_eq!(faults.for_run(1), None);
        assert_eq!(faults.for_run(2), Some(Fault::Fail));
        assert_eq!(faults.for_run(3), Some(Fault::Abort));
        assert_eq!(faults.for_run(4), Some(Fault::Hang));
        assert_eq!(faults.for_run(5), None);
    }
}
