//! The C ABI of `include/xdna_vl_runtime.h` as npu-sys calls it: the shared constants and types
//! (crate `xdna-vl-runtime-abi`) and the function table resolved from a runtime library.

use std::ffi::{c_char, c_int, c_void};

pub use xdna_vl_runtime_abi::*;

pub const XRT_RUNTIME_NAME: &str = "libxdna_vl_xrt.so";

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
