//! The session every front end calls: messages in, streamed text out.
//!
//! - [`ChatAssets`] / [`ChatFormat`]: the checkpoint's tokenizer, chat template and generation config;
//! - [`Message`] / [`Image`]: a conversation; [`PromptBuilder`] turns it into ids with each image's
//!   pads expanded and the three position planes ([`rope_index`]);
//! - [`Session`]: the decoder, its KV cache, the next slot and rotary position, the history, and
//!   the one generate loop ([`Session::generate`], [`Session::chat`]);
//! - [`sampling`]: greedy, temperature, top-k, top-p, min-p, repetition penalty, seeded;
//! - [`stream`]: UTF-8-safe incremental text and stop strings;
//! - [`constraint`]: constrained decoding (JSON, a schema, a grammar) with llguidance;
//! - [`tool_calls`]: Qwen's tool-call format: the grammar that makes a call, the parser.

pub mod assets;
pub mod constraint;
pub mod decoding;
pub mod drafts;
pub mod error;
pub mod format;
pub mod generation_config;
pub mod image_rows;
pub mod images;
pub mod message;
pub mod mtp_drafts;
pub mod prompt;
pub mod rope_index;
pub mod sampling;
pub mod scheduler;
pub mod session;
pub mod stream;
pub mod template;
pub mod tokenizer;
pub mod tool_calls;

pub use assets::ChatAssets;
pub use constraint::{Constraint, Grammar, TokenSpace};
pub use drafts::{
    parse_draft_vocab, DraftAblation, DraftSource, Drafter, PromptLookup, MAX_DRAFTS, MTP_VOCAB,
};
pub use error::{EngineError, Result};
pub use format::ChatFormat;
pub use generation_config::GenerationConfig;
pub use images::{ImageEncoder, ImageSettings, TowerEncoder};
pub use message::{Content, Image, Message, Role, ToolCall};
pub use prompt::{Prompt, PromptAblation, PromptBuilder, PromptImage};
pub use sampling::{Sampler, SamplingParams};
pub use scheduler::{Scheduler, SchedulerAblation, SchedulerHandle, SchedulerOptions};
pub use session::{Event, FinishReason, Generation, Session, SessionOptions, Timings};
pub use stream::{StopFilter, TextStream};
pub use template::{ChatTemplate, TemplateInputs};
pub use tokenizer::{SpecialIds, Tokenizer};
pub use tool_calls::{CallForm, CallSplitter, FunctionTool, Parsed, ParsedCall};
