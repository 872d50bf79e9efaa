//! The GEMM seam: every linear of the text decoder and of the vision tower goes through a
//! [`GemmBackend`] — the host kernels on a persistent pool, the NPU runtime, or both compared.
//!
//! `y[rows x n] = x[rows x k] · Wᵀ` with W a pack's linear weight ([n x k], row-major). Only this crate
//! depends on `npu-sys`; the decoder (`forward`) and the tower (`vision`) depend on this one.

pub mod backend;
pub mod device;
pub mod host;
pub mod kernels;
pub mod pool;

pub use backend::{BackendError, GemmBackend, GemmStats, WeightRef};
pub use device::{AbGemm, AbReport, DeviceConfig, DeviceGemm, PlantedLayout};
pub use host::HostGemm;
pub use pool::{new_pool, PoolError};
