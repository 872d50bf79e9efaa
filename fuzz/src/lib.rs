//! Structured fuzzing of the parsers (issue 18).
