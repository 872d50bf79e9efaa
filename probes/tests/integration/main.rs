//! The probes crate's integration tests as one test binary: one link and one set of shared
//! instantiations instead of one per file (the clean CI build's time is mostly linking and
//! code generation). Each file is a module; `cargo test -p probes --test integration <module>::`
//! runs one.

mod common;

mod bench_cli;
mod bench_vision_cli;
mod chat_cli;
mod hybrid_prompt_cli;
mod mrope_planes_cli;
