//! The engine crate's integration tests as one test binary: one link and one set of shared
//! instantiations instead of one per file (the clean CI build's time is mostly linking and
//! code generation). Each file is a module; `cargo test -p engine --test integration <module>::`
//! runs one.

mod common;
mod constraint;

mod drafts;
mod hub_templates;
mod prompt_fixtures;
mod qwen3_5_session;
mod scheduler;
mod session_fixtures;
mod stream_utf8;
mod tools;
mod tower_precision;
mod tower_session;
