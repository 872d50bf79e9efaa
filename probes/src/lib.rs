//! Shared plumbing of the probes: reading references, comparing logits, replaying a prompt, the
//! command-line pieces both probes use.

pub mod bundled;
pub mod cli;
pub mod compare;
pub mod device;
pub mod peak;
pub mod reference;
pub mod replay;
pub mod text;

pub use reference::Reference;
pub use replay::{replay, Replay};
