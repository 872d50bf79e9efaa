//! Text out as the ids come, never half a character: each new id decodes a short window of the
//! recent ids (the way transformers' and TGI's streamers do), and text that ends in an incomplete
//! UTF-8 sequence (decoded as U+FFFD) waits for the next id. Stop strings are matched on the text;
//! text that could be the start of a stop string is held back until it is known not to be one.

use crate::error::Result;
use crate::tokenizer::Tokenizer;

/// Incremental decoding of one answer.
#[derive(Default)]
pub struct TextStream {
    ids: Vec<u32>,
    /// Ids before `prefix` are settled; `prefix..read` were decoded and shown.
    prefix: usize,
    read: usize,
}

impl TextStream {
    pub fn new() -> TextStream {
        TextStream::default()
    }

    /// The text `id` completes ("" while a character is incomplete).
    pub fn push(&mut self, tokenizer: &Tokenizer, id: u32) -> Result<String> {
        self.ids.push(id);
        let shown = tokenizer.decode(&self.ids[self.prefix..self.read])?;
        let now = tokenizer.decode(&self.ids[self.prefix..])?;
        if now.len() > shown.len()
            && !now.ends_with('\u{FFFD}')
            && now.is_char_boundary(shown.len())
        {
            let new = now[shown.len()..].to_string();
            self.prefix = self.read;
            self.read = self.ids.len();
            Ok(new)
        } else {
            Ok(String::new())
        }
    }

    /// What is still held back at the end of the answer (a dangling byte shows as U+FFFD, as
    /// transformers decodes it).
    pub fn finish(&mut self, tokenizer: &Tokenizer) -> Result<String> {
        let shown = tokenizer.decode(&self.ids[self.prefix..self.read])?;
        let now = tokenizer.decode(&self.ids[self.prefix..])?;
        self.prefix = self.ids.len();
        self.read = self.ids.len();
        Ok(match now.get(shown.len()..) {
            Some(rest) if now.starts_with(&shown) => rest.to_string(),
            _ => String::new(),
        })
    }
}

/// Stop strings over streamed text: `push` returns what may be shown now and whether a stop string
/// was met (the text before it is shown, the stop string and anything after it is not).
pub struct StopFilter {
    stops: Vec<String>,
    /// Text received, not shown yet (could begin a stop string).
    pending: String,
    /// All text shown.
    shown: String,
}

impl StopFilter {
    pub fn new(stops: &[String]) -> StopFilter {
        StopFilter {
            stops: stops.to_vec(),
            pending: String::new(),
            shown: String::new(),
        }
    }

    /// (text to show, the stop string met).
    pub fn push(&mut self, piece: &str) -> (String, Option<String>) {
        self.pending.push_str(piece);
        // A stop string may span the shown text's tail and the new piece only through `pending`,
        // since everything that could start one is held in `pending`.
        let first = self
            .stops
            .iter()
            .filter_map(|s| self.pending.find(s.as_str()).map(|at| (at, s)))
            .min_by_key(|(at, _)| *at);
        if let Some((at, stop)) = first {
            let out = self.pending[..at].to_string();
            self.shown.push_str(&out);
            let stop = stop.clone();
            self.pending.clear();
            return (out, Some(stop));
        }
        // Hold back the longest tail of `pending` that is a prefix of some stop string.
        let hold = self
            .stops
            .iter()
            .map(|s| longest_tail_prefix(&self.pending, s))
            .max()
            .unwrap_or(0);
        let cut = self.pending.len() - hold;
        let out = self.pending[..cut].to_string();
        self.pending.drain(..cut);
        self.shown.push_str(&out);
        (out, None)
    }

    /// The held-back text at the end (no stop string came).
    pub fn finish(&mut self) -> String {
        let out = std::mem::take(&mut self.pending);
        self.shown.push_str(&out);
        out
    }

    pub fn shown(&self) -> &str {
        &self.shown
    }
}

/// Bytes of the longest tail of `text` that `stop` starts with (on character boundaries).
fn longest_tail_prefix(text: &str, stop: &str) -> usize {
    let max = text.len().min(stop.len().saturating_sub(1));
    (1..=max)
        .rev()
        .find(|&n| {
            text.is_char_boundary(text.len() - n) && stop.starts_with(&text[text.len() - n..])
        })
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stops(s: &[&str]) -> StopFilter {
        StopFilter::new(&s.iter().map(|x| x.to_string()).collect::<Vec<_>>())
    }

    #[test]
    fn a_stop_string_split_over_pieces_is_never_shown() {
        let mut f = stops(&["STOP"]);
        let mut shown = String::new();
        for piece in ["hello S", "T", "O", "P and more"] {
            let (out, stop) = f.push(piece);
            shown.push_str(&out);
            if stop.is_some() {
                break;
            }
        }
        assert_eq!(shown, "hello ");
        // Control: a near miss is shown in full once it cannot be the stop string.
        let mut f = stops(&["STOP"]);
        let mut shown = String::new();
        for piece in ["hello S", "T", "O", "X"] {
            shown.push_str(&f.push(piece).0);
        }
        shown.push_str(&f.finish());
        assert_eq!(shown, "hello STOX");
    }

    #[test]
    fn the_earliest_stop_string_wins() {
        let mut f = stops(&["b", "a"]);
        let (out, stop) = f.push("xxabyy");
        assert_eq!(out, "xx");
        assert_eq!(stop.as_deref(), Some("a"));
    }
}
