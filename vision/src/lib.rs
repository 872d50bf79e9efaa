//! Images in Rust: the Qwen3-VL image preprocessing (`preprocess`) and vision tower (`tower`),
//! equal to transformers, with the tower's GEMMs on the shared `compute` runtime.

pub mod preprocess;
pub mod tower;
