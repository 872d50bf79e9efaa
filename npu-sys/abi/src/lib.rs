//! The constants and `repr(C)` types of `npu-sys/include/xdna_vl_runtime.h`, once, for both sides of
//! the ABI: npu-sys (which loads a runtime) and the software NPU (which is one).

use std::ffi::{c_char, c_int};

pub const ABI_VERSION: u32 = 2;

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
