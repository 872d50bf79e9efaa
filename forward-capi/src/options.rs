//! `xvl_open_options`: how a pack is opened (context capacity, threads, KV type, GEMM backend and the
//! device's runtime and designs), and its translation into the decoder's and the runtime's options.

use crate::ffi_args;
use crate::status::*;
use compute::{DeviceConfig, GemmChoice, Runtime, RuntimeOptions};
use decoder::{DecoderOptions, KvDtype};
use std::ffi::c_char;

/// The C struct `xvl_open_options` (same field order and types as the header).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct XvlOpenOptions {
    /// `sizeof(xvl_open_options)` as the caller compiled it: a header/library mismatch is refused
    /// instead of read past the caller's struct.
    pub struct_size: u32,
    /// `XVL_GEMM_HOST`, `XVL_GEMM_DEVICE` or `XVL_GEMM_AB`.
    pub gemm: u32,
    /// KV cache slots (the longest prompt plus generation).
    pub capacity: usize,
    /// Threads of the forward's pool; 0 = one per available core.
    pub threads: u32,
    /// `XVL_KV_F32` or `XVL_KV_BF16`.
    pub kv_dtype: u32,
    /// Device backends: the NPU runtime library; NULL = `XDNA_VL_RUNTIME`, then the installed shim.
    pub runtime_path: *const c_char,
    /// Device backends: the designs directory (with its manifest.json); required by them.
    pub designs_dir: *const c_char,
}

impl XvlOpenOptions {
    pub const SIZE: u32 = std::mem::size_of::<XvlOpenOptions>() as u32;

    /// What `xvl_open_options_init` writes.
    pub fn defaults() -> XvlOpenOptions {
        XvlOpenOptions {
            struct_size: XvlOpenOptions::SIZE,
            gemm: XVL_GEMM_HOST,
            capacity: DecoderOptions::default().capacity,
            threads: 0,
            kv_dtype: XVL_KV_F32,
            runtime_path: std::ptr::null(),
            designs_dir: std::ptr::null(),
        }
    }
}

/// The options the caller's struct asks for.
pub struct OpenRequest {
    pub decoder: DecoderOptions,
    pub runtime: RuntimeOptions,
}

/// Reads and checks the caller's options.
///
/// # Safety
/// `options` must be NULL or point to at least 4 readable bytes (its `struct_size`), and to a whole
/// `xvl_open_options` when `struct_size` says so; its paths must be NULL or NUL-terminated.
pub unsafe fn read(
    function: &str,
    options: *const XvlOpenOptions,
) -> Result<OpenRequest, CallError> {
    if options.is_null() {
        return Err(CallError::null(function, "options"));
    }
    if !options.is_aligned() {
        return Err(CallError::argument(function, "`options` is not aligned"));
    }
    // Read the size alone first: a struct from an older or newer header may be shorter than ours.
    // SAFETY: non-NULL and aligned (checked); the caller guarantees the first field is readable.
    let struct_size = unsafe { std::ptr::addr_of!((*options).struct_size).read() };
    if struct_size != XvlOpenOptions::SIZE {
        return Err(CallError::argument(
            function,
            format!(
                "options.struct_size = {struct_size}, this library's xvl_open_options is {} bytes \
                 (call xvl_open_options_init, and build against the header that ships with the library)",
                XvlOpenOptions::SIZE
            ),
        ));
    }
    // SAFETY: the caller's struct is as large as ours (its struct_size says so) and aligned.
    let o = unsafe { options.read() };
    let kv_dtype = match o.kv_dtype {
        XVL_KV_F32 => KvDtype::F32,
        XVL_KV_BF16 => KvDtype::Bf16,
        other => {
            return Err(CallError::argument(
                function,
                format!("options.kv_dtype = {other}, expected XVL_KV_F32 (0) or XVL_KV_BF16 (1)"),
            ))
        }
    };
    let threads = match o.threads {
        0 => compute::default_threads(),
        n => n as usize,
    };
    // SAFETY: NULL or NUL-terminated by the caller's contract.
    let runtime_path =
        unsafe { ffi_args::optional_path(function, "options.runtime_path", o.runtime_path) }?;
    // SAFETY: as above.
    let designs_dir =
        unsafe { ffi_args::optional_path(function, "options.designs_dir", o.designs_dir) }?;
    let (gemm, name) = match o.gemm {
        XVL_GEMM_HOST => (GemmChoice::Host, "XVL_GEMM_HOST"),
        XVL_GEMM_DEVICE => (GemmChoice::Device, "XVL_GEMM_DEVICE"),
        XVL_GEMM_AB => (GemmChoice::Ab, "XVL_GEMM_AB"),
        other => {
            return Err(CallError::argument(
                function,
                format!(
                    "options.gemm = {other}, expected XVL_GEMM_HOST (0), XVL_GEMM_DEVICE (1) or XVL_GEMM_AB (2)"
                ),
            ))
        }
    };
    // The device backends need a designs directory; the runtime defaults to `XDNA_VL_RUNTIME`,
    // then the installed XRT shim.
    if gemm != GemmChoice::Host && designs_dir.is_none() {
        return Err(CallError::new(
            XVL_ERR_NULL,
            format!(
                "{function}: `options.designs_dir` is NULL; {name} needs a designs directory with its \
                 manifest.json (`npu-designs emu PACK -o DIR` writes one for the software NPU)"
            ),
        ));
    }
    Ok(OpenRequest {
        decoder: DecoderOptions {
            capacity: o.capacity,
            kv_dtype,
            ..DecoderOptions::default()
        },
        runtime: RuntimeOptions {
            threads,
            gemm,
            device: DeviceConfig {
                runtime: runtime_path,
                designs: designs_dir,
                program: DEVICE_PROGRAM.into(),
                ..DeviceConfig::default()
            },
        },
    })
}

/// Who holds the device, as other processes waiting for the device-hold ticket see it.
pub const DEVICE_PROGRAM: &str = "libxdna_vl";

/// The runtime a request asks for (the device opened here); its refusals are `XVL_ERR_BACKEND`.
pub fn runtime(function: &str, options: &RuntimeOptions) -> Result<Runtime, CallError> {
    Runtime::new(options).map_err(|e| CallError::new(XVL_ERR_BACKEND, format!("{function}: {e}")))
}
