//! Status codes (the `XVL_*` defines of `xdna_vl.h`) and the error every entry point returns.

use decoder::DecoderError;
use engine::EngineError;

/// What every entry point returns: `XVL_OK` or one of the `XVL_ERR_*` codes.
pub type XvlStatus = i32;

pub const XVL_OK: XvlStatus = 0;
/// A required pointer argument was NULL (the handle, a buffer, an out parameter, a path).
pub const XVL_ERR_NULL: XvlStatus = 1;
/// An output buffer is shorter than the call needs.
pub const XVL_ERR_BUFFER: XvlStatus = 2;
/// An argument value is invalid (unknown enum value, options size, misaligned pointer, ...).
pub const XVL_ERR_ARGUMENT: XvlStatus = 3;
/// The pack could not be opened or read.
pub const XVL_ERR_PACK: XvlStatus = 4;
/// The cache slot is not the next free one.
pub const XVL_ERR_SLOT: XvlStatus = 5;
/// The rows do not fit in the KV cache.
pub const XVL_ERR_CAPACITY: XvlStatus = 6;
/// A token id is outside the vocabulary.
pub const XVL_ERR_TOKEN: XvlStatus = 7;
/// The hybrid inputs (planes, image rows, DeepStack sets, row embeddings) were refused.
pub const XVL_ERR_INPUTS: XvlStatus = 8;
/// The GEMM backend failed.
pub const XVL_ERR_BACKEND: XvlStatus = 9;
/// A panic was caught inside the library; the handle is unusable (close it).
pub const XVL_ERR_PANIC: XvlStatus = 10;
/// A picture of a chat message cannot be read, decoded or encoded.
pub const XVL_ERR_IMAGE: XvlStatus = 11;
/// The pack has no tokenizer or chat template, or the chat cannot be rendered into a prompt.
pub const XVL_ERR_CHAT: XvlStatus = 12;

/// `XVL_GEMM_*`: which GEMM backend `xvl_open` builds.
pub const XVL_GEMM_HOST: u32 = 0;
pub const XVL_GEMM_DEVICE: u32 = 1;
pub const XVL_GEMM_AB: u32 = 2;

/// `XVL_KV_*`: the KV cache's storage type.
pub const XVL_KV_F32: u32 = 0;
pub const XVL_KV_BF16: u32 = 1;

/// `XVL_LOGITS_*`: which rows' logits a step copies out.
pub const XVL_LOGITS_LAST_ROW: u32 = 0;
pub const XVL_LOGITS_ALL_ROWS: u32 = 1;

/// `XVL_ROLE_*`: who speaks in an `xvl_message`.
pub const XVL_ROLE_SYSTEM: u32 = 0;
pub const XVL_ROLE_USER: u32 = 1;
pub const XVL_ROLE_ASSISTANT: u32 = 2;

/// Every `#define` of the header with its value, so a test can compare the two.
pub const HEADER_DEFINES: &[(&str, i64)] = &[
    ("XVL_OK", XVL_OK as i64),
    ("XVL_ERR_NULL", XVL_ERR_NULL as i64),
    ("XVL_ERR_BUFFER", XVL_ERR_BUFFER as i64),
    ("XVL_ERR_ARGUMENT", XVL_ERR_ARGUMENT as i64),
    ("XVL_ERR_PACK", XVL_ERR_PACK as i64),
    ("XVL_ERR_SLOT", XVL_ERR_SLOT as i64),
    ("XVL_ERR_CAPACITY", XVL_ERR_CAPACITY as i64),
    ("XVL_ERR_TOKEN", XVL_ERR_TOKEN as i64),
    ("XVL_ERR_INPUTS", XVL_ERR_INPUTS as i64),
    ("XVL_ERR_BACKEND", XVL_ERR_BACKEND as i64),
    ("XVL_ERR_PANIC", XVL_ERR_PANIC as i64),
    ("XVL_ERR_IMAGE", XVL_ERR_IMAGE as i64),
    ("XVL_ERR_CHAT", XVL_ERR_CHAT as i64),
    ("XVL_GEMM_HOST", XVL_GEMM_HOST as i64),
    ("XVL_GEMM_DEVICE", XVL_GEMM_DEVICE as i64),
    ("XVL_GEMM_AB", XVL_GEMM_AB as i64),
    ("XVL_KV_F32", XVL_KV_F32 as i64),
    ("XVL_KV_BF16", XVL_KV_BF16 as i64),
    ("XVL_LOGITS_LAST_ROW", XVL_LOGITS_LAST_ROW as i64),
    ("XVL_LOGITS_ALL_ROWS", XVL_LOGITS_ALL_ROWS as i64),
    ("XVL_ROLE_SYSTEM", XVL_ROLE_SYSTEM as i64),
    ("XVL_ROLE_USER", XVL_ROLE_USER as i64),
    ("XVL_ROLE_ASSISTANT", XVL_ROLE_ASSISTANT as i64),
];

/// The name of a status code, as `xvl_status_name` returns it (NUL-terminated).
pub fn status_name(status: XvlStatus) -> &'static str {
    match status {
        XVL_OK => "XVL_OK\0",
        XVL_ERR_NULL => "XVL_ERR_NULL\0",
        XVL_ERR_BUFFER => "XVL_ERR_BUFFER\0",
        XVL_ERR_ARGUMENT => "XVL_ERR_ARGUMENT\0",
        XVL_ERR_PACK => "XVL_ERR_PACK\0",
        XVL_ERR_SLOT => "XVL_ERR_SLOT\0",
        XVL_ERR_CAPACITY => "XVL_ERR_CAPACITY\0",
        XVL_ERR_TOKEN => "XVL_ERR_TOKEN\0",
        XVL_ERR_INPUTS => "XVL_ERR_INPUTS\0",
        XVL_ERR_BACKEND => "XVL_ERR_BACKEND\0",
        XVL_ERR_PANIC => "XVL_ERR_PANIC\0",
        XVL_ERR_IMAGE => "XVL_ERR_IMAGE\0",
        XVL_ERR_CHAT => "XVL_ERR_CHAT\0",
        _ => "XVL_UNKNOWN_STATUS\0",
    }
}

/// A refused or failed call: its status code and the message `xvl_last_error` returns.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct CallError {
    pub status: XvlStatus,
    pub message: String,
}

impl CallError {
    pub fn new(status: XvlStatus, message: impl Into<String>) -> CallError {
        CallError {
            status,
            message: message.into(),
        }
    }

    pub fn null(function: &str, argument: &str) -> CallError {
        CallError::new(XVL_ERR_NULL, format!("{function}: `{argument}` is NULL"))
    }

    pub fn argument(function: &str, message: impl std::fmt::Display) -> CallError {
        CallError::new(XVL_ERR_ARGUMENT, format!("{function}: {message}"))
    }

    /// A forward error, its message prefixed by the entry point that hit it.
    pub fn forward(function: &str, e: DecoderError) -> CallError {
        CallError::new(decoder_status(&e), format!("{function}: {e}"))
    }

    /// An engine error (a chat run), its message prefixed by the entry point that hit it.
    pub fn engine(function: &str, e: EngineError) -> CallError {
        let status = match e {
            EngineError::Decoder(e) => return CallError::forward(function, e),
            EngineError::Pack(_) | EngineError::Read { .. } => XVL_ERR_PACK,
            EngineError::MissingAsset { .. }
            | EngineError::Asset { .. }
            | EngineError::Tokenizer(_)
            | EngineError::Template(_)
            | EngineError::Prompt(_) => XVL_ERR_CHAT,
            EngineError::OverContext { .. } => XVL_ERR_CAPACITY,
            EngineError::Sampling(_) | EngineError::Grammar(_) => XVL_ERR_ARGUMENT,
            EngineError::Image { .. } | EngineError::Preprocess(_) | EngineError::Vision(_) => {
                XVL_ERR_IMAGE
            }
            EngineError::NonFiniteLogits { .. } | EngineError::Runtime(_) => XVL_ERR_BACKEND,
        };
        CallError::new(status, format!("{function}: {e}"))
    }
}

/// The status of a decoder refusal (a batched refusal keeps its sequence's inner status).
fn decoder_status(e: &DecoderError) -> XvlStatus {
    match e {
        DecoderError::NotNextSlot { .. } => XVL_ERR_SLOT,
        DecoderError::OverCapacity { .. } => XVL_ERR_CAPACITY,
        DecoderError::TokenOutOfVocab { .. } => XVL_ERR_TOKEN,
        DecoderError::Hybrid(_) => XVL_ERR_INPUTS,
        DecoderError::Options(_) => XVL_ERR_ARGUMENT,
        DecoderError::Pack(_) => XVL_ERR_PACK,
        DecoderError::Backend(_) => XVL_ERR_BACKEND,
        DecoderError::InSequence { source, .. } => decoder_status(source),
    }
}
