//! The C ABI of the xdna-vl decoder: `libxdna_vl.so` / `libxdna_vl.a` with `include/xdna_vl.h`.
//!
//! C engines open a pack, step prompts (token ids or row embeddings with MRoPE planes, image rows and
//! DeepStack sets) and read logits into their own buffers, exactly as the Rust `forward` API does.
//! Opaque handles, status codes, a thread-local last-error message; no Rust type and no panic crosses
//! the boundary. `unsafe` lives only where C pointers become Rust references (`ffi_args`, `handle`,
//! `options`, `api`).

mod api;
mod chat;
mod ffi_args;
mod guard;
mod handle;
pub mod last_error;
mod options;
pub mod status;

pub use api::*;
pub use chat::{XvlChat, XvlMessage, XvlSampling, XvlTextCallback};
pub use handle::XvlForward;
pub use options::XvlOpenOptions;
pub use status::*;
