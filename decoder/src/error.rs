//! Why a decoder call was refused.

use compute::BackendError;
use packs::PackError;

#[derive(Debug, thiserror::Error)]
pub enum DecoderError {
    #[error("cache slot {slot} refused: the next free slot is {next} (capacity {capacity}); call reset() or truncate() to rewind")]
    NotNextSlot {
        slot: usize,
        next: usize,
        capacity: usize,
    },
    #[error("{rows} rows from cache slot {start} need {needed} slots, the KV cache holds {capacity} (raise the context capacity)")]
    OverCapacity {
        rows: usize,
        start: usize,
        needed: usize,
        capacity: usize,
    },
    #[error("token id {token} at row {row} is outside the vocabulary (0..{vocab})")]
    TokenOutOfVocab {
        token: u32,
        row: usize,
        vocab: usize,
    },
    #[error("sequence {index}: {source}")]
    InSequence {
        index: usize,
        source: Box<DecoderError>,
    },
    #[error("invalid hybrid inputs: {0}")]
    Hybrid(String),
    #[error("{0}")]
    Options(String),
    #[error(transparent)]
    Pack(#[from] PackError),
    #[error(transparent)]
    Backend(#[from] BackendError),
}
