//! The session every front end calls: messages in, streamed text out.
