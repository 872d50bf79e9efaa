//! Shared probe plumbing.
