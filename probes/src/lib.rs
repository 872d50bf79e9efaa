//! Shared plumbing of the probes: the command-line pieces they share, the bundled default, the
//! answer's text, the A/B report and the machine's peaks (the reference readers and the replay are
//! `testkit`'s).

pub mod bundled;
pub mod cli;
pub mod device;
pub mod peak;
pub mod text;
