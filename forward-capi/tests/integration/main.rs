//! The forward-capi crate's integration tests as one test binary: one link and one set of shared
//! instantiations instead of one per file (the clean CI build's time is mostly linking and
//! code generation). Each file is a module; `cargo test -p forward-capi --test integration <module>::`
//! runs one.

mod common;

mod c_bad_args;
mod c_chat;
mod c_prompt;
mod header;
mod readme;
