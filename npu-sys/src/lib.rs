//! npu-sys: the Ryzen AI NPU as this project uses it.
//!
//! - [`runtime`]: the runtime library (the XRT shim or the software NPU), opened at run time
//!   through the C ABI of `include/xdna_vl_runtime.h`;
//! - [`device`]: safe owners of its device, design, buffer and run handles;
//! - [`detect`]: finding an `amdxdna` device node before opening anything;
//! - [`designs`]: the designs directory and its manifest; [`plan`]: which designs a pack needs;
//! - [`tiling`]: how a geometry is split over the AIE array; [`design_params`]: what the IRON
//!   generator is given; [`toolchain`] and [`design_build`]: `npu-designs build` with mlir-aie;
//! - [`gemm`]: a design with resident weights, as the forward's device backend uses it;
//!   [`verify`]: a design checked against the pack's scalar oracle;
//! - [`hold`]: the device-hold ticket, a FIFO cross-process lease on the NPU;
//! - [`session`]: runtime, lease and device opened in the right order.

mod abi;
pub mod design_build;
pub mod design_params;
pub mod designs;
pub mod detect;
pub mod device;
pub mod dma_plan;
mod emu_library;
pub mod gemm;
pub mod geometry;
pub mod hold;
pub mod plan;
pub mod runtime;
pub mod session;
pub mod tiling;
pub mod toolchain;
pub mod verify;

pub use designs::{DesignEntry, Designs, DesignsError};
pub use detect::{AccelNode, DetectError};
pub use device::{Buffer, Design, Device, DeviceError, DeviceInfo, ErtState, Run, RunError};
pub use emu_library::{emu_library, EMU_LIBRARY};
pub use gemm::{GemmDesign, GemmError, PendingGemm};
pub use geometry::{ArgGroup, DesignKind, Geometry, GeometryError};
pub use hold::{Hold, HoldError, HoldOptions, HoldStatus, HolderRecord};
pub use runtime::{CallError, Runtime, RuntimeError, RuntimeSource};
pub use session::NpuSession;

/// The ABI version this build needs (`XDNA_VL_ABI_VERSION` of the header).
pub const ABI_VERSION: u32 = abi::ABI_VERSION;
/// The installed name of the XRT shim runtime.
pub const XRT_RUNTIME_NAME: &str = abi::XRT_RUNTIME_NAME;
/// Every symbol a runtime must export.
pub const ABI_SYMBOLS: [&str; 14] = abi::SYMBOLS;

/// Any failure of this crate, for callers that hold one error type.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
    #[error(transparent)]
    Device(#[from] DeviceError),
    #[error(transparent)]
    Run(#[from] RunError),
    #[error(transparent)]
    Designs(#[from] DesignsError),
    #[error(transparent)]
    Gemm(#[from] GemmError),
    #[error(transparent)]
    Hold(#[from] HoldError),
}
