//! The exported C functions: argument checks, handle conversion, the thread's last error, and a
//! panic barrier (a panic must never cross into the caller).

use std::cell::RefCell;
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::path::PathBuf;
use std::time::Duration;

use crate::abi::{self, EmuError};
use crate::design::Geometry;
use crate::state;

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

fn set_last_error(message: &str) {
    let text = CString::new(message.replace('\0', "?")).unwrap_or_default();
    LAST_ERROR.with(|last| *last.borrow_mut() = text);
}

/// Runs `body`, turning an error or a panic into a code and the thread's last error.
fn guard(call: &str, body: impl FnOnce() -> Result<(), EmuError>) -> c_int {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(body)) {
        Ok(Ok(())) => abi::OK,
        Ok(Err(error)) => {
            set_last_error(&error.message);
            error.code
        }
        Err(_) => {
            set_last_error(&format!(
                "{call}: internal error in the software NPU (a panic)"
            ));
            abi::ERR_DEVICE
        }
    }
}

fn id_of<T>(handle: *mut T, what: &str) -> Result<u64, EmuError> {
    if handle.is_null() {
        return Err(EmuError::invalid(format!("{what} handle is NULL")));
    }
    Ok(handle as usize as u64)
}

fn handle_of<T>(id: u64) -> *mut T {
    id as usize as *mut T
}

fn out_ptr<T>(out: *mut T, what: &str) -> Result<*mut T, EmuError> {
    if out.is_null() {
        Err(EmuError::invalid(format!("the {what} out-pointer is NULL")))
    } else {
        Ok(out)
    }
}

/// # Safety
/// `text` must be NULL or point to a NUL-terminated string.
unsafe fn path_arg(text: *const c_char, what: &str) -> Result<PathBuf, EmuError> {
    if text.is_null() {
        return Err(EmuError::invalid(format!("the {what} path is NULL")));
    }
    // SAFETY: non-NULL and NUL-terminated by the caller's contract.
    let bytes = unsafe { CStr::from_ptr(text) }.to_bytes();
    #[cfg(unix)]
    {
        use std::os::unix::ffi::OsStrExt;
        Ok(PathBuf::from(std::ffi::OsStr::from_bytes(bytes)))
    }
    #[cfg(not(unix))]
    Ok(PathBuf::from(String::from_utf8_lossy(bytes).into_owned()))
}

fn fill_text(dst: &mut [c_char; 64], text: &str) {
    dst.fill(0);
    for (d, &b) in dst.iter_mut().zip(text.as_bytes().iter().take(63)) {
        *d = b as c_char;
    }
}

#[no_mangle]
pub extern "C" fn xdna_vl_abi_version() -> u32 {
    abi::ABI_VERSION
}

#[no_mangle]
pub extern "C" fn xdna_vl_runtime_flags() -> u32 {
    abi::RUNTIME_SOFTWARE
}

#[no_mangle]
pub extern "C" fn xdna_vl_last_error() -> *const c_char {
    // The CString lives in this thread's slot until the next failure on this thread replaces it.
    LAST_ERROR.with(|last| last.borrow().as_ptr())
}

/// # Safety
/// `out` and `info` must be NULL or valid for writes of their types.
#[no_mangle]
pub unsafe extern "C" fn xdna_vl_device_open(
    index: u32,
    out: *mut *mut abi::DeviceHandle,
    info: *mut abi::DeviceInfo,
) -> c_int {
    guard("xdna_vl_device_open", || {
        let out = out_ptr(out, "device")?;
        let info = out_ptr(info, "device info")?;
        let id = state::open_device(index)?;
        let mut filled = abi::DeviceInfo {
            name: [0; 64],
            firmware: [0; 64],
            columns: 4,
            software: 1,
        };
        fill_text(&mut filled.name, "npu-emu");
        fill_text(
            &mut filled.firmware,
            concat!("software NPU ", env!("CARGO_PKG_VERSION")),
        );
        // SAFETY: both checked non-NULL; valid for writes by the caller's contract.
        unsafe {
            info.write(filled);
            out.write(handle_of(id));
        }
        Ok(())
    })
}

/// # Safety
/// `device` must be NULL or a handle from xdna_vl_device_open (a stale one is ignored).
#[no_mangle]
pub unsafe extern "C" fn xdna_vl_device_close(device: *mut abi::DeviceHandle) {
    guard("xdna_vl_device_close", || {
        state::close_device(id_of(device, "device")?);
        Ok(())
    });
}

/// # Safety
/// `desc` must be NULL or point to a valid descriptor whose strings are NULL or NUL-terminated;
/// `out` must be NULL or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn xdna_vl_design_load(
    device: *mut abi::DeviceHandle,
    desc: *const abi::DesignDesc,
    out: *mut *mut abi::DesignHandle,
) -> c_int {
    guard("xdna_vl_design_load", || {
        let device = id_of(device, "device")?;
        let out = out_ptr(out, "design")?;
        if desc.is_null() {
            return Err(EmuError::invalid("the design descriptor is NULL"));
        }
        // SAFETY: non-NULL and valid by the caller's contract.
        let desc = unsafe { &*desc };
        // SAFETY: the descriptor's strings are NULL or NUL-terminated by the caller's contract.
        let (xclbin, insts, kernel) = unsafe {
            (
                path_arg(desc.xclbin_path, "xclbin")?,
                path_arg(desc.insts_path, "instruction file")?,
                path_arg(desc.kernel_name, "kernel name")?,
            )
        };
        let geometry = Geometry::from_desc(desc.kind, desc.m_tile, desc.k, desc.n)?;
        let id = state::load_design(device, geometry, &xclbin, &insts, &kernel.to_string_lossy())?;
        // SAFETY: checked non-NULL; valid for a write by the caller's contract.
        unsafe { out.write(handle_of(id)) };
        Ok(())
    })
}

/// # Safety
/// `design` must be NULL or a design handle.
#[no_mangle]
pub unsafe extern "C" fn xdna_vl_design_unload(design: *mut abi::DesignHandle) {
    guard("xdna_vl_design_unload", || {
        state::unload_design(id_of(design, "design")?);
        Ok(())
    });
}

/// # Safety
/// `out` must be NULL or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn xdna_vl_buffer_alloc(
    design: *mut abi::DesignHandle,
    group: u32,
    size: u64,
    out: *mut *mut abi::BufferHandle,
) -> c_int {
    guard("xdna_vl_buffer_alloc", || {
        let design = id_of(design, "design")?;
        let out = out_ptr(out, "buffer")?;
        let id = state::alloc_buffer(design, group, size)?;
        // SAFETY: checked non-NULL; valid for a write by the caller's contract.
        unsafe { out.write(handle_of(id)) };
        Ok(())
    })
}

/// # Safety
/// `data` and `size` must be NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn xdna_vl_buffer_map(
    buffer: *mut abi::BufferHandle,
    data: *mut *mut c_void,
    size: *mut u64,
) -> c_int {
    guard("xdna_vl_buffer_map", || {
        let buffer = id_of(buffer, "buffer")?;
        let data = out_ptr(data, "data")?;
        let size = out_ptr(size, "size")?;
        let (ptr, len) = state::map_buffer(buffer)?;
        // SAFETY: both checked non-NULL; valid for writes by the caller's contract.
        unsafe {
            data.write(ptr.cast());
            size.write(len);
        }
        Ok(())
    })
}

/// # Safety
/// No other call may use `buffer`'s mapping during this call (the ABI's contract).
#[no_mangle]
pub unsafe extern "C" fn xdna_vl_buffer_sync(
    buffer: *mut abi::BufferHandle,
    direction: u32,
) -> c_int {
    guard("xdna_vl_buffer_sync", || {
        state::sync_buffer(id_of(buffer, "buffer")?, direction)
    })
}

/// # Safety
/// `buffer` must be NULL or a buffer handle; its mapping must not be used afterwards.
#[no_mangle]
pub unsafe extern "C" fn xdna_vl_buffer_free(buffer: *mut abi::BufferHandle) {
    guard("xdna_vl_buffer_free", || {
        state::free_buffer(id_of(buffer, "buffer")?);
        Ok(())
    });
}

/// # Safety
/// `out` must be NULL or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn xdna_vl_run_start(
    design: *mut abi::DesignHandle,
    a: *mut abi::BufferHandle,
    b: *mut abi::BufferHandle,
    c: *mut abi::BufferHandle,
    out: *mut *mut abi::RunHandle,
) -> c_int {
    guard("xdna_vl_run_start", || {
        let out = out_ptr(out, "run")?;
        let id = state::start_run(
            id_of(design, "design")?,
            id_of(a, "A buffer")?,
            id_of(b, "B buffer")?,
            id_of(c, "C buffer")?,
        )?;
        // SAFETY: checked non-NULL; valid for a write by the caller's contract.
        unsafe { out.write(handle_of(id)) };
        Ok(())
    })
}

/// # Safety
/// `state_out` must be NULL or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn xdna_vl_run_wait(
    run: *mut abi::RunHandle,
    timeout_ms: u32,
    state_out: *mut u32,
) -> c_int {
    guard("xdna_vl_run_wait", || {
        let state_out = out_ptr(state_out, "state")?;
        let final_state =
            state::wait_run(id_of(run, "run")?, Duration::from_millis(timeout_ms.into()))?;
        // SAFETY: checked non-NULL; valid for a write by the caller's contract.
        unsafe { state_out.write(final_state) };
        Ok(())
    })
}

/// # Safety
/// `run` must be NULL or a run handle.
#[no_mangle]
pub unsafe extern "C" fn xdna_vl_run_free(run: *mut abi::RunHandle) {
    guard("xdna_vl_run_free", || {
        state::free_run(id_of(run, "run")?);
        Ok(())
    });
}
