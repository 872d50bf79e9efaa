//! The calling thread's last error message, errno-style: each failing call replaces it, successful
//! calls leave it alone. Thread-local so a handle never has to be locked (or even valid) to report
//! why a call on it failed.

use std::cell::RefCell;
use std::ffi::{c_char, CString};

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

/// Replaces this thread's message (a NUL inside the text becomes `?` so C sees all of it).
pub fn set(message: &str) {
    let text = CString::new(message.replace('\0', "?")).unwrap_or_default();
    // `try_with` fails only while the thread is being torn down; there is nobody to tell then.
    let _ = LAST_ERROR.try_with(|cell| {
        if let Ok(mut slot) = cell.try_borrow_mut() {
            *slot = text;
        }
    });
}

/// This thread's message as a NUL-terminated string ("" when no call has failed on it). The
/// pointer stays valid until the next failing call on this thread replaces the message.
pub fn as_ptr() -> *const c_char {
    LAST_ERROR
        .try_with(|cell| {
            cell.try_borrow()
                .map_or(c"".as_ptr(), |message| message.as_ptr())
        })
        .unwrap_or(c"".as_ptr())
}

/// This thread's message as Rust text (for tests).
pub fn get() -> String {
    LAST_ERROR
        .try_with(|cell| {
            cell.try_borrow()
                .map(|m| m.to_string_lossy().into_owned())
                .unwrap_or_default()
        })
        .unwrap_or_default()
}
