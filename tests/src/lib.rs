//! Fixture helpers for the end-to-end tests.
