//! Turning C arguments (pointer + element count, C strings) into Rust slices and paths, with every
//! check the C side cannot be trusted to have made: NULL, alignment, a byte length that fits in
//! `isize`. What no check can see (a pointer into freed memory, a count larger than the buffer) stays
//! the caller's contract, stated in the header.

use crate::status::CallError;
use std::ffi::{c_char, CStr};
use std::path::PathBuf;

/// Checks what can be checked of a `(ptr, len)` pair of `T`s: NULL only when `len == 0`, aligned,
/// and `len * size_of::<T>()` no more than `isize::MAX` (what `slice::from_raw_parts` requires).
fn check<T>(function: &str, what: &str, ptr: *const T, len: usize) -> Result<(), CallError> {
    if ptr.is_null() {
        return Err(CallError::null(function, what));
    }
    if !ptr.is_aligned() {
        return Err(CallError::argument(
            function,
            format!(
                "`{what}` ({ptr:p}) is not aligned to {} bytes",
                std::mem::align_of::<T>()
            ),
        ));
    }
    let fits = len
        .checked_mul(std::mem::size_of::<T>())
        .is_some_and(|bytes| bytes <= isize::MAX as usize);
    if !fits {
        return Err(CallError::argument(
            function,
            format!("`{what}` length {len} is too large"),
        ));
    }
    Ok(())
}

/// A C input array of `len` `T`s. `len == 0` gives an empty slice whatever `ptr` is (NULL allowed).
///
/// # Safety
/// When `len > 0` and `ptr` is not NULL, `ptr` must point to `len` initialized `T`s that stay valid
/// and unmodified for `'a`.
pub unsafe fn input<'a, T>(
    function: &str,
    what: &str,
    ptr: *const T,
    len: usize,
) -> Result<&'a [T], CallError> {
    if len == 0 {
        return Ok(&[]);
    }
    check(function, what, ptr, len)?;
    // SAFETY: `ptr` is non-NULL, aligned, and `len * size_of::<T>()` fits in isize (checked above);
    // the caller guarantees it points to `len` valid `T`s for `'a`.
    Ok(unsafe { std::slice::from_raw_parts(ptr, len) })
}

/// Checks a C output buffer of `len` `T`s against the `needed` count before any work is done, so a
/// short buffer is refused before the KV cache moves.
pub fn check_output<T>(
    function: &str,
    what: &str,
    ptr: *mut T,
    len: usize,
    needed: usize,
) -> Result<(), CallError> {
    check(function, what, ptr.cast_const(), len)?;
    if len < needed {
        return Err(CallError::new(
            crate::status::XVL_ERR_BUFFER,
            format!("{function}: `{what}` holds {len} values, the call writes {needed}"),
        ));
    }
    Ok(())
}

/// The C output buffer checked by `check_output`, as a slice of its first `needed` elements.
///
/// # Safety
/// `check_output(.., ptr, len, needed)` must have passed, `ptr` must be valid for writes of `len`
/// `T`s, and no other reference to that memory may be live while the slice is.
pub unsafe fn output<'a, T>(ptr: *mut T, needed: usize) -> &'a mut [T] {
    // SAFETY: non-NULL, aligned and at least `needed` long (check_output); exclusive by the caller's
    // contract.
    unsafe { std::slice::from_raw_parts_mut(ptr, needed) }
}

/// A NUL-terminated C path.
///
/// # Safety
/// `ptr`, when not NULL, must point to a NUL-terminated string valid for the duration of the call.
pub unsafe fn path(function: &str, what: &str, ptr: *const c_char) -> Result<PathBuf, CallError> {
    if ptr.is_null() {
        return Err(CallError::null(function, what));
    }
    // SAFETY: non-NULL and NUL-terminated by the caller's contract.
    let bytes = unsafe { CStr::from_ptr(ptr) }.to_bytes();
    if bytes.is_empty() {
        return Err(CallError::argument(
            function,
            format!("`{what}` is an empty path"),
        ));
    }
    path_from_bytes(function, what, bytes)
}

/// An optional C path: NULL means "not given".
///
/// # Safety
/// As for [`path`].
pub unsafe fn optional_path(
    function: &str,
    what: &str,
    ptr: *const c_char,
) -> Result<Option<PathBuf>, CallError> {
    if ptr.is_null() {
        return Ok(None);
    }
    // SAFETY: forwarded contract.
    unsafe { path(function, what, ptr) }.map(Some)
}

#[cfg(unix)]
fn path_from_bytes(_function: &str, _what: &str, bytes: &[u8]) -> Result<PathBuf, CallError> {
    use std::os::unix::ffi::OsStrExt;
    Ok(std::ffi::OsStr::from_bytes(bytes).into())
}

#[cfg(not(unix))]
fn path_from_bytes(function: &str, what: &str, bytes: &[u8]) -> Result<PathBuf, CallError> {
    std::str::from_utf8(bytes)
        .map(PathBuf::from)
        .map_err(|e| CallError::argument(function, format!("`{what}` is not UTF-8: {e}")))
}

/// Writes one value through a C out pointer.
///
/// # Safety
/// `ptr`, when not NULL, must be valid for a write of one `T`.
pub unsafe fn write_out<T>(
    function: &str,
    what: &str,
    ptr: *mut T,
    value: T,
) -> Result<(), CallError> {
    check(function, what, ptr.cast_const(), 1)?;
    // SAFETY: non-NULL and aligned (checked), valid for one write by the caller's contract.
    unsafe { ptr.write(value) };
    Ok(())
}
