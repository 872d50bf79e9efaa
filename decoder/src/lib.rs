//! The Qwen3-VL text decoder.
//!
//! One pass per step reads like the model card — norm, q/k/v, q/k norm, rotate, attend, o, residual,
//! norm, gate/up/down, residual, DeepStack — with the mechanics (kernels, cache, backends) one call away.
//! Cache slot and rotary position are separate numbers everywhere.

pub mod attention;
pub mod hybrid;
pub mod inputs;
pub mod kv;
pub mod mathf;
pub mod model;
pub mod moe;
pub mod norm;
pub mod rope;
pub mod sampling;
pub mod stfile;

// The GEMM seam lives in the `gemm` crate (shared with the vision tower); its modules keep their
// old paths here (`decoder::host::HostGemm`, `decoder::kernels::Isa`).
pub use compute::{backend, device, host, kernels};
pub use compute::{AbReport, BackendError, DeviceConfig, GemmBackend, GemmStats, WeightRef};
pub use hybrid::HybridInputs;
pub use inputs::PromptInputs;
pub use kv::KvDtype;
pub use model::{Ablation, BackendChoice, Forward, ForwardError, ForwardOptions, Logits};
pub use rope::{RopeLayout, Rotary};
