//! The wrapper around every entry point's body: a panic is caught here and never unwinds into C, and
//! a failure's message goes to the thread's last error.

use crate::last_error;
use crate::status::{CallError, XvlStatus, XVL_ERR_PANIC, XVL_OK};
use std::panic::{catch_unwind, AssertUnwindSafe};

/// Runs `body`; returns `XVL_OK`, the error's status, or `XVL_ERR_PANIC` for a caught panic.
///
/// `AssertUnwindSafe` is sound here because a panic inside a handle's lock poisons that lock, and
/// every later call on the handle refuses with `XVL_ERR_PANIC` instead of seeing half-updated state.
pub fn guard(function: &str, body: impl FnOnce() -> Result<(), CallError>) -> XvlStatus {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => XVL_OK,
        Ok(Err(e)) => {
            last_error::set(&e.message);
            e.status
        }
        Err(payload) => {
            let what = payload
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a non-text panic payload".into());
            last_error::set(&format!(
                "{function}: internal panic ({what}); the handle is unusable, close it"
            ));
            XVL_ERR_PANIC
        }
    }
}
