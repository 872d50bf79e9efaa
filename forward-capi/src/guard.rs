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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::handle::XvlForward;
    use crate::status::{XVL_ERR_PANIC, XVL_ERR_SLOT};
    use compute::Runtime;
    use decoder::{Decoder, DecoderOptions};
    use packs::random::{write_random, RandomShape};
    use packs::{Pack, QuantKind};
    use std::sync::Arc;

    #[test]
    fn a_panic_becomes_a_status_and_poisons_the_handle() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tiny.pack");
        write_random(&RandomShape::tiny(), QuantKind::F32, 3, &path).unwrap();
        let pack = Arc::new(Pack::open(&path).unwrap());
        let options = DecoderOptions {
            capacity: 4,
            ..DecoderOptions::default()
        };
        let forward = Decoder::new(&pack, &Runtime::host(1).unwrap(), options).unwrap();
        let handle = Box::into_raw(Box::new(XvlForward::new(forward)));
        let mut logits = vec![0.0f32; 256];
        let step = |slot: usize, logits: &mut [f32]| {
            // SAFETY: `handle` is live until closed below; `logits` holds 256 floats.
            unsafe { crate::xvl_step(handle, 3, 0, slot, logits.as_mut_ptr(), logits.len()) }
        };
        // Control: a refusal before the panic is an ordinary status.
        assert_eq!(step(1, &mut logits), XVL_ERR_SLOT);

        // SAFETY: live handle.
        let h = unsafe { &*handle };
        let status = guard("planted", || {
            let _held = h.lock("planted")?;
            panic!("a planted panic");
        });
        assert_eq!(status, XVL_ERR_PANIC);
        let message = crate::last_error::get();
        assert!(
            message.contains("planted: internal panic (a planted panic)"),
            "{message}"
        );
        assert_eq!(step(0, &mut logits), XVL_ERR_PANIC);
        let message = crate::last_error::get();
        assert!(
            message.contains("xvl_step: the handle is unusable"),
            "{message}"
        );
        // SAFETY: from Box::into_raw above, closed once.
        unsafe { crate::xvl_close(handle) };
    }

    #[test]
    fn a_panic_without_a_handle_is_a_status_too() {
        let status = guard("planted", || panic!("{}", String::from("owned payload")));
        assert_eq!(status, XVL_ERR_PANIC);
        assert!(crate::last_error::get().contains("owned payload"));
        // Control: a clean body is XVL_OK and leaves the message alone.
        assert_eq!(guard("clean", || Ok(())), crate::status::XVL_OK);
        assert!(crate::last_error::get().contains("owned payload"));
    }
}
