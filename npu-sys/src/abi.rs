//! The C ABI of `include/xdna_vl_runtime.h`, mirrored for Rust. Only this crate's wrappers (and the
//! software NPU, which implements it) use these raw types.

use std::ffi::{c_char, c_int, c_void};

pub const ABI_VERSION: u32 = 1;
pub const XRT_RUNTIME_NAME: &str = "libxdna_vl_xrt.so";

pub const OK: c_int = 0;
pub const ERR_INVALID: c_int = 1;
pub const ERR_NOT_FOUND: c_int = 2;
pub const ERR_IO: c_int = 3;
pub const ERR_DEVICE: c_int = 4;

/// The `XDNA_VL_ERR_*` name of a return code.
pub fn code_name(code: c_int) -> &'static str {
    match code {
        OK => "OK",
        ERR_INVALID => "INVALID",
        ERR_NOT_FOUND => "NOT_FOUND",
        ERR_IO => "IO",
        ERR_DEVICE => "DEVICE",
        _ => "unknown code",
    }
}

pub const RUNTIME_SOFTWARE: u32 = 1;

pub const STATE_NEW: u32 = 1;
pub const STATE_QUEUED: u32 = 2;
pub const STATE_RUNNING: u32 = 3;
pub const STATE_COMPLETED: u32 = 4;
pub const STATE_ERROR: u32 = 5;
pub const STATE_ABORT: u32 = 6;
pub const STATE_SUBMITTED: u32 = 7;
pub const STATE_TIMEOUT: u32 = 8;
pub const STATE_NORESPONSE: u32 = 9;

pub const KIND_I8: u32 = 1;
pub const KIND_Q4: u32 = 2;

pub const GROUP_A: u32 = 3;
pub const GROUP_B: u32 = 4;
pub const GROUP_C: u32 = 5;

pub const SYNC_TO_DEVICE: u32 = 0;
pub const SYNC_FROM_DEVICE: u32 = 1;

/// Opaque handle types: never dereferenced on this side.
#[repr(C)]
pub struct DeviceHandle {
    _opaque: [u8; 0],
}
#[repr(C)]
pub struct DesignHandle {
    _opaque: [u8; 0],
}
#[repr(C)]
pub struct BufferHandle {
    _opaque: [u8; 0],
}
#[repr(C)]
pub struct RunHandle {
    _opaque: [u8; 0],
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct DeviceInfo {
    pub name: [c_char; 64],
    pub firmware: [c_char; 64],
    pub columns: u32,
    pub software: u32,
}

impl DeviceInfo {
    pub fn zeroed() -> DeviceInfo {
        DeviceInfo {
            name: [0; 64],
            firmware: [0; 64],
            columns: 0,
            software: 0,
        }
    }
}

#[repr(C)]
pub struct DesignDesc {
    pub xclbin_path: *const c_char,
    pub insts_path: *const c_char,
    pub kernel_name: *const c_char,
    pub kind: u32,
    pub m_tile: u32,
    pub k: u32,
    pub n: u32,
}

pub type AbiVersionFn = unsafe extern "C" fn() -> u32;
pub type RuntimeFlagsFn = unsafe extern "C" fn() -> u32;
pub type LastErrorFn = unsafe extern "C" fn() -> *const c_char;
pub type DeviceOpenFn = unsafe extern "C" fn(u32, *mut *mut DeviceHandle, *mut DeviceInfo) -> c_int;
pub type DeviceCloseFn = unsafe extern "C" fn(*mut DeviceHandle);
pub type DesignLoadFn =
    unsafe extern "C" fn(*mut DeviceHandle, *const DesignDesc, *mut *mut DesignHandle) -> c_int;
pub type DesignUnloadFn = unsafe extern "C" fn(*mut DesignHandle);
pub type BufferAllocFn =
    unsafe extern "C" fn(*mut DesignHandle, u32, u64, *mut *mut BufferHandle) -> c_int;
pub type BufferMapFn = unsafe extern "C" fn(*mut BufferHandle, *mut *mut c_void, *mut u64) -> c_int;
pub type BufferSyncFn = unsafe extern "C" fn(*mut BufferHandle, u32) -> c_int;
pub type BufferFreeFn = unsafe extern "C" fn(*mut BufferHandle);
pub type RunStartFn = unsafe extern "C" fn(
    *mut DesignHandle,
    *mut BufferHandle,
    *mut BufferHandle,
    *mut BufferHandle,
    *mut *mut RunHandle,
) -> c_int;
pub type RunWaitFn = unsafe extern "C" fn(*mut RunHandle, u32, *mut u32) -> c_int;
pub type RunFreeFn = unsafe extern "C" fn(*mut RunHandle);

/// Every symbol of the ABI (`xdna_vl_abi_version` is resolved and checked first).
pub const SYMBOLS: [&str; 14] = [
    "xdna_vl_abi_version",
    "xdna_vl_runtime_flags",
    "xdna_vl_last_error",
    "xdna_vl_device_open",
    "xdna_vl_device_close",
    "xdna_vl_design_load",
    "xdna_vl_design_unload",
    "xdna_vl_buffer_alloc",
    "xdna_vl_buffer_map",
    "xdna_vl_buffer_sync",
    "xdna_vl_buffer_free",
    "xdna_vl_run_start",
    "xdna_vl_run_wait",
    "xdna_vl_run_free",
];

/// The resolved function table. Valid while the library it came from stays loaded.
#[derive(Clone, Copy)]
pub struct Functions {
    pub runtime_flags: RuntimeFlagsFn,
    pub last_error: LastErrorFn,
    pub device_open: DeviceOpenFn,
    pub device_close: DeviceCloseFn,
    pub design_load: DesignLoadFn,
    pub design_unload: DesignUnloadFn,
    pub buffer_alloc: BufferAllocFn,
    pub buffer_map: BufferMapFn,
    pub buffer_sync: BufferSyncFn,
    pub buffer_free: BufferFreeFn,
    pub run_start: RunStartFn,
    pub run_wait: RunWaitFn,
    pub run_free: RunFreeFn,
}
