//! The compute layer both models run on: the [`Runtime`] (one thread pool and one GEMM backend,
//! chosen once: host, device or ab), the GEMM backends and host kernels, and the ops the decoder
//! and the vision tower share (norms, rotary, activations, row helpers).
//!
//! `y[rows x n] = x[rows x k] · Wᵀ` with W a pack's linear weight ([n x k], row-major). Only this
//! crate depends on `npu-sys`; the decoder and the tower depend on this one.

pub mod ab;
pub mod attention;
pub mod backend;
#[cfg(feature = "cli")]
pub mod cli;
pub mod device;
pub mod host;
pub mod kernels;
pub mod ops;
pub mod pool;
pub mod runtime;
pub mod timing;

pub use ab::AbGemm;
pub use backend::{AbReport, BackendError, GemmBackend, GemmStats, WeightRef};
pub use device::{DeviceConfig, DeviceGemm, PlantedLayout};
pub use host::HostGemm;
pub use kernels::{Products, PRODUCTS_ENV};
pub use pool::{new_pool, PoolError};
pub use runtime::{
    default_threads, GemmChoice, LinearHandle, PackLinear, Runtime, RuntimeError, RuntimeOptions,
};
