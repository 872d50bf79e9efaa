//! The fuzz crate's integration tests as one test binary: one link and one set of shared
//! instantiations instead of one per file (the clean CI build's time is mostly linking and
//! code generation). Each file is a module; `cargo test -p fuzz --test integration <module>::`
//! runs one.

mod atomic_build;
mod bounds;
mod checkpoint_refusals;
mod corpus;
mod inputs_refusals;
