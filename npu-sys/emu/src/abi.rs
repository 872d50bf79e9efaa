//! The C ABI of `npu-sys/include/xdna_vl_runtime.h`, as this runtime implements it.

use std::ffi::{c_char, c_int};

pub const ABI_VERSION: u32 = 1;

pub const OK: c_int = 0;
pub const ERR_INVALID: c_int = 1;
pub const ERR_NOT_FOUND: c_int = 2;
pub const ERR_IO: c_int = 3;
pub const ERR_DEVICE: c_int = 4;

pub const RUNTIME_SOFTWARE: u32 = 1;

pub const STATE_RUNNING: u32 = 3;
pub const STATE_COMPLETED: u32 = 4;
pub const STATE_ERROR: u32 = 5;
pub const STATE_ABORT: u32 = 6;
pub const STATE_TIMEOUT: u32 = 8;

pub const KIND_I8: u32 = 1;
pub const KIND_Q4: u32 = 2;

pub const GROUP_A: u32 = 3;
pub const GROUP_B: u32 = 4;
pub const GROUP_C: u32 = 5;

pub const SYNC_TO_DEVICE: u32 = 0;
pub const SYNC_FROM_DEVICE: u32 = 1;

/// Opaque handle types. This runtime's handles are registry ids, never addresses.
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
pub struct DeviceInfo {
    pub name: [c_char; 64],
    pub firmware: [c_char; 64],
    pub columns: u32,
    pub software: u32,
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

/// A failure: the ABI code and the text `xdna_vl_last_error` returns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EmuError {
    pub code: c_int,
    pub message: String,
}

impl EmuError {
    pub fn invalid(message: impl Into<String>) -> EmuError {
        EmuError {
            code: ERR_INVALID,
            message: message.into(),
        }
    }
    pub fn not_found(message: impl Into<String>) -> EmuError {
        EmuError {
            code: ERR_NOT_FOUND,
            message: message.into(),
        }
    }
    pub fn io(message: impl Into<String>) -> EmuError {
        EmuError {
            code: ERR_IO,
            message: message.into(),
        }
    }
    pub fn device(message: impl Into<String>) -> EmuError {
        EmuError {
            code: ERR_DEVICE,
            message: message.into(),
        }
    }
}
