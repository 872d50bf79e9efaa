//! The C ABI of `npu-sys/include/xdna_vl_runtime.h`, as this runtime implements it: the shared
//! constants and types, and this runtime's error.

use std::ffi::c_int;

pub use xdna_vl_runtime_abi::*;

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
