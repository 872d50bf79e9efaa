//! `xvl_forward`: the opaque handle C holds — a forward behind a lock, and the model facts the
//! getters read without taking it.

use crate::status::{CallError, XVL_ERR_ARGUMENT, XVL_ERR_PANIC};
use decoder::Decoder;
use std::sync::{Mutex, MutexGuard};

/// Tags a live handle; cleared on close so a stale or foreign pointer is (usually) refused.
const MAGIC: u64 = u64::from_le_bytes(*b"xdnavl:1");

/// `repr(C)` so `magic` is the first 8 bytes: the tag is read before the pointer is trusted as a handle.
#[repr(C)]
pub struct XvlForward {
    magic: u64,
    forward: Mutex<Decoder>,
    pub hidden_size: usize,
    pub vocab_size: usize,
    pub deepstack_sets: usize,
    pub capacity: usize,
    pub kv_bytes: usize,
}

// The header promises a handle may be used from any thread: the compiler must agree.
const _: () = {
    const fn shareable<T: Send + Sync>() {}
    shareable::<XvlForward>();
};

impl XvlForward {
    pub fn new(forward: Decoder) -> XvlForward {
        let sem = forward.semantics();
        XvlForward {
            magic: MAGIC,
            hidden_size: sem.hidden_size,
            vocab_size: sem.vocab_size,
            deepstack_sets: sem.deepstack_sets,
            capacity: forward.kv().capacity(),
            kv_bytes: forward.kv_bytes(),
            forward: Mutex::new(forward),
        }
    }

    /// The forward, for one call. A lock poisoned by a panic refuses every later call.
    pub fn lock(&self, function: &str) -> Result<MutexGuard<'_, Decoder>, CallError> {
        self.forward.lock().map_err(|_| {
            CallError::new(
                XVL_ERR_PANIC,
                format!("{function}: the handle is unusable after an internal panic in an earlier call; close it"),
            )
        })
    }

    /// Marks the handle dead just before it is freed.
    pub fn retire(&mut self) {
        self.magic = 0;
    }
}

/// The handle behind a C pointer.
///
/// # Safety
/// `ptr` must be NULL or a pointer `xvl_open` returned that has not been closed (a closed or foreign
/// pointer is refused only on a best-effort basis, by its tag).
pub unsafe fn from_ptr<'a>(
    function: &str,
    ptr: *const XvlForward,
) -> Result<&'a XvlForward, CallError> {
    if ptr.is_null() {
        return Err(CallError::null(function, "f"));
    }
    if !ptr.is_aligned() {
        return Err(CallError::new(
            XVL_ERR_ARGUMENT,
            format!("{function}: `f` is not a handle (misaligned)"),
        ));
    }
    // SAFETY: non-NULL and aligned; reads only the first 8 bytes, which any handle-sized pointer the
    // caller may pass holds (the caller guarantees it came from xvl_open).
    let magic = unsafe { std::ptr::addr_of!((*ptr).magic).read() };
    if magic != MAGIC {
        return Err(CallError::new(
            XVL_ERR_ARGUMENT,
            format!(
                "{function}: `f` is not an open xvl_forward handle (closed, or not from xvl_open)"
            ),
        ));
    }
    // SAFETY: tagged as a live handle from xvl_open; not closed by the caller's contract.
    Ok(unsafe { &*ptr })
}
