//! The xdna-vl crate's integration tests as one test binary: one link and one set of shared
//! instantiations instead of one per file (the clean CI build's time is mostly linking and
//! code generation). Each file is a module; `cargo test -p xdna-vl --test integration <module>::`
//! runs one.

mod common;

mod cli;
mod serve;
mod structured;
mod t5;
