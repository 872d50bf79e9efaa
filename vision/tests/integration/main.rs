//! The vision crate's integration tests as one test binary: one link and one set of shared
//! instantiations instead of one per file (the clean CI build's time is mostly linking and
//! code generation). Each file is a module; `cargo test -p vision --test integration <module>::`
//! runs one.

mod common;

mod jpeg_reference;
mod preprocess_reference;
mod tower;
mod tower_cli;
mod tower_device;
mod tower_precision;
mod tower_quant;
mod tower_refusals;
