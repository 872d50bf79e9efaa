//! The answer as text: the checkpoint's `tokenizer.json` (loaded by the `tokenizers` crate, the
//! library transformers' tokenizers run on) turns greedy ids into text, as they come, and names the
//! end-of-turn token that ends a chat answer.

use std::path::{Path, PathBuf};

/// The token that ends an assistant turn in Qwen's chat format.
pub const END_OF_TURN: &str = "<|im_end|>";

#[derive(Debug, thiserror::Error)]
pub enum TextError {
    #[error("{path}: cannot read the tokenizer: {reason}")]
    Read { path: PathBuf, reason: String },
    #[error("{path}: not a tokenizer.json (the `tokenizers` library refuses it: {reason})")]
    Parse { path: PathBuf, reason: String },
    #[error("{path}: has no {END_OF_TURN} token: not a Qwen chat tokenizer")]
    NoEndOfTurn { path: PathBuf },
    #[error("{path}: {END_OF_TURN} is id {id}, outside the pack's vocabulary (0..{vocab}): a tokenizer for another model")]
    OutsideVocabulary {
        path: PathBuf,
        id: u32,
        vocab: usize,
    },
    #[error("{path}: cannot decode ids {ids:?}: {reason}")]
    Decode {
        path: PathBuf,
        ids: Vec<u32>,
        reason: String,
    },
}

/// A chat tokenizer: decoding (special tokens skipped, as transformers'
/// `decode(ids, skip_special_tokens=True)`) and the end-of-turn id.
pub struct AnswerTokenizer {
    path: PathBuf,
    tokenizer: tokenizers::Tokenizer,
    end_of_turn: u32,
}

impl AnswerTokenizer {
    pub fn open(path: impl AsRef<Path>) -> Result<AnswerTokenizer, TextError> {
        AnswerTokenizer::open_path(path.as_ref())
    }

    /// [`AnswerTokenizer::open`] without the generic: its body is compiled once, here, not again in
    /// every crate and test binary that opens one.
    fn open_path(path: &Path) -> Result<AnswerTokenizer, TextError> {
        let path = path.to_path_buf();
        let bytes = std::fs::read(&path).map_err(|e| TextError::Read {
            path: path.clone(),
            reason: e.to_string(),
        })?;
        let tokenizer =
            tokenizers::Tokenizer::from_bytes(&bytes).map_err(|e| TextError::Parse {
                path: path.clone(),
                reason: e.to_string(),
            })?;
        let end_of_turn = tokenizer
            .token_to_id(END_OF_TURN)
            .ok_or_else(|| TextError::NoEndOfTurn { path: path.clone() })?;
        Ok(AnswerTokenizer {
            path,
            tokenizer,
            end_of_turn,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The id of `<|im_end|>` in this tokenizer.
    pub fn end_of_turn(&self) -> u32 {
        self.end_of_turn
    }

    /// Refuses a tokenizer whose end-of-turn id the model cannot produce.
    pub fn check_vocabulary(&self, vocab: usize) -> Result<(), TextError> {
        if self.end_of_turn as usize >= vocab {
            return Err(TextError::OutsideVocabulary {
                path: self.path.clone(),
                id: self.end_of_turn,
                vocab,
            });
        }
        Ok(())
    }

    /// The text of `ids`, special tokens skipped.
    pub fn decode(&self, ids: &[u32]) -> Result<String, TextError> {
        self.tokenizer
            .decode(ids, true)
            .map_err(|e| TextError::Decode {
                path: self.path.clone(),
                ids: ids.to_vec(),
                reason: e.to_string(),
            })
    }

    pub fn stream(&self) -> TextStream<'_> {
        TextStream {
            tokenizer: self,
            ids: Vec::new(),
            shown: String::new(),
        }
    }
}

/// Text as the ids come: each `push` returns what the new id adds to the decoded text. A trailing
/// U+FFFD is held back (a byte-level token may end inside a character the next one completes);
/// `finish` returns the rest, so the pieces add up to `decode(all ids)`.
pub struct TextStream<'t> {
    tokenizer: &'t AnswerTokenizer,
    ids: Vec<u32>,
    shown: String,
}

impl TextStream<'_> {
    pub fn push(&mut self, id: u32) -> Result<String, TextError> {
        self.ids.push(id);
        let text = self.tokenizer.decode(&self.ids)?;
        Ok(self.advance(text.trim_end_matches('\u{FFFD}')))
    }

    /// The text not shown yet (held-back replacement characters).
    pub fn finish(&mut self) -> Result<String, TextError> {
        let text = self.tokenizer.decode(&self.ids)?;
        Ok(self.advance(&text))
    }

    pub fn ids(&self) -> &[u32] {
        &self.ids
    }

    /// What `text` adds to what was shown. Byte-level decoding only ever extends its text; should a
    /// decoder rewrite what was shown, nothing more is shown (the full text is `decode`'s).
    fn advance(&mut self, text: &str) -> String {
        match text.strip_prefix(self.shown.as_str()) {
            Some(new) if !new.is_empty() => {
                let new = new.to_string();
                self.shown.push_str(&new);
                new
            }
            _ => String::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chat_tokenizer() -> PathBuf {
        crate::bundled::fixtures_dir().join("chat/Qwen3-VL-tiny/tokenizer.json")
    }

    #[test]
    fn the_stream_adds_up_to_the_decoded_text() {
        let t = AnswerTokenizer::open(chat_tokenizer()).unwrap();
        // Ids that include a lone byte (U+FFFD when decoded), a special token and plain words.
        let ids = [482u32, 472, 252, 357, 500, 2, 34, 16, 44, 101, 101, 34, 362];
        let mut s = t.stream();
        let mut pieces = String::new();
        for &id in &ids {
            pieces.push_str(&s.push(id).unwrap());
        }
        pieces.push_str(&s.finish().unwrap());
        let full = t.decode(&ids).unwrap();
        assert!(full.contains('\u{FFFD}'), "{full:?}");
        assert_eq!(pieces, full);
        assert!(!full.contains(END_OF_TURN), "special tokens are skipped");
    }

    #[test]
    fn a_held_back_replacement_character_is_shown_at_the_end() {
        let t = AnswerTokenizer::open(chat_tokenizer()).unwrap();
        let mut s = t.stream();
        // 252 alone decodes to U+FFFD: held back until finish.
        assert_eq!(s.push(252).unwrap(), "");
        assert_eq!(s.finish().unwrap(), "\u{FFFD}");
        // Control: a plain token shows at once.
        let mut s = t.stream();
        assert!(!s.push(482).unwrap().is_empty());
    }

    #[test]
    fn the_end_of_turn_id_comes_from_the_tokenizer() {
        let t = AnswerTokenizer::open(chat_tokenizer()).unwrap();
        assert_eq!(t.end_of_turn(), 500);
        assert!(t.check_vocabulary(512).is_ok());
        let e = t.check_vocabulary(500).unwrap_err().to_string();
        assert!(e.contains("outside the pack's vocabulary (0..500)"), "{e}");
    }
}
