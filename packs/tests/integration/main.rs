//! The packs crate's integration tests as one test binary: one link and one set of shared
//! instantiations instead of one per file (the clean CI build's time is mostly linking and
//! code generation). Each file is a module; `cargo test -p packs --test integration <module>::`
//! runs one.

mod common;

mod build_hf;
mod fixtures;
mod moe_pack;
mod quant_roundtrip;
mod qwen3_5_config;
mod random_pack;
mod reader_refusals;
mod t5_checkpoint;
mod vision_pack;
