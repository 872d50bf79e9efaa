//! Ops the decoder and the vision tower share, each computed as transformers computes it.

pub mod mathf;
pub mod norm;
pub mod rope;
pub mod rows;
pub mod sampling;
