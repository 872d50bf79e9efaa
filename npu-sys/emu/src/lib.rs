//! npu-emu: the software NPU. A runtime implementing the C ABI of
//! `npu-sys/include/xdna_vl_runtime.h` on the CPU, loaded by `npu-sys` exactly like the XRT shim
//! (as `libnpu_emu.so`). Its designs compute what the device designs are specified to compute,
//! with the pack's scalar arithmetic (`packs::quant`), so host and device results can be compared
//! byte for byte. It needs no device node, honours the geometry a design was loaded with, refuses
//! mismatched buffers, keeps separate host and device copies of every buffer (a missing sync
//! shows), and injects faults on request (see [`faults`]).

mod abi;
mod compute;
mod design;
pub mod faults;
mod ffi;
mod memory;
mod state;

pub use ffi::*;
