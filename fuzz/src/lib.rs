//! Structured fuzzing of every parser xdna-vl reads untrusted input with, on stable Rust: a seeded
//! PRNG draws each input (a valid base file set plus mutations: flipped bits, truncation, header
//! length fields, dtypes, shapes, offsets past the end, overlapping tensors, huge dimensions, JSON
//! field type swaps), the runner runs it under catch_unwind and a watchdog and counts refusals by
//! reason. `cargo test -p fuzz` runs a short deterministic corpus per target; the `fuzz` binary
//! runs long ones (see README.md).

pub mod bytes;
pub mod category;
pub mod input;
pub mod json;
pub mod rng;
pub mod runner;
pub mod safetensors;
pub mod targets;
