//! A thinking model's answer split into its reasoning and its answer, for both APIs, whole or
//! streamed: Qwen3.5's chat template ends the generation prompt with `<think>\n` (unless
//! `enable_thinking` is false), so its answer is `reasoning</think>\n\nanswer`; Qwen3's answer
//! opens the block itself (`<think>reasoning</think>\n\nanswer`). What comes before `</think>` is
//! the reasoning (OpenAI's `reasoning_content`, as llama-server names it; Ollama's `thinking`),
//! its surrounding whitespace stripped as llama-server strips it; the rest, without the
//! whitespace that leads it, is the content. An answer that ends before `</think>` is all
//! reasoning. Text that could still become a tag (`</thi` at a chunk's end) is held back until
//! the next text says what it is, so no piece of a tag is ever sent as text.

/// What opens and closes the think block.
pub const OPEN: &str = "<think>";
pub const CLOSE: &str = "</think>";

/// Whether the reasoning is separated from the content.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Reasoning {
    /// In its own field: OpenAI's `reasoning_format` "auto" (the default) or "deepseek",
    /// Ollama's `think` true or absent.
    #[default]
    Separate,
    /// Inline in the content, as the model wrote it (`reasoning_format` "none", Ollama's
    /// `think` false).
    Inline,
}

impl Reasoning {
    /// The values of OpenAI's `reasoning_format` this server takes.
    pub const FORMATS: [&'static str; 3] = ["auto", "deepseek", "none"];

    /// `reasoning_format`'s value, or None when it is not one of [`Reasoning::FORMATS`].
    pub fn of_format(format: &str) -> Option<Reasoning> {
        match format {
            "auto" | "deepseek" => Some(Reasoning::Separate),
            "none" => Some(Reasoning::Inline),
            _ => None,
        }
    }
}

/// A piece of the answer, in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Piece {
    Reasoning(String),
    Content(String),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// The answer may open a think block: what is held is a prefix of `<think>`.
    Opening,
    /// Inside the think block.
    Thinking,
    /// Just after `</think>`: whitespace before the content is dropped.
    Closed,
    /// The content, as it comes.
    Content,
}

/// Splits an answer given piece by piece (whole text or streamed chunks cut anywhere) into
/// [`Piece`]s; the same text gives the same reasoning and content however it is cut.
#[derive(Clone, Debug)]
pub struct ThinkSplitter {
    state: State,
    /// Text not yet given out: a possible tag's start, or reasoning's trailing whitespace.
    held: String,
    /// Some reasoning was given out (its leading whitespace is dropped before).
    reasoning_started: bool,
}

impl ThinkSplitter {
    /// `prompt_opens_think`: the prompt ends inside an open think block (the engine's
    /// `Event::Started`), so the answer starts with reasoning. Otherwise the answer is reasoning
    /// only when it opens a think block itself, first thing.
    pub fn new(reasoning: Reasoning, prompt_opens_think: bool) -> ThinkSplitter {
        let state = match (reasoning, prompt_opens_think) {
            (Reasoning::Inline, _) => State::Content,
            (Reasoning::Separate, true) => State::Thinking,
            (Reasoning::Separate, false) => State::Opening,
        };
        ThinkSplitter {
            state,
            held: String::new(),
            reasoning_started: false,
        }
    }

    /// The pieces `text` completes (none while all of it is held).
    pub fn push(&mut self, text: &str) -> Vec<Piece> {
        self.held.push_str(text);
        let mut out = Vec::new();
        loop {
            match self.state {
                State::Content => {
                    if !self.held.is_empty() {
                        out.push(Piece::Content(std::mem::take(&mut self.held)));
                    }
                    return out;
                }
                State::Opening => {
                    if self.held.starts_with(OPEN) {
                        self.held.drain(..OPEN.len());
                        self.state = State::Thinking;
                    } else if OPEN.starts_with(self.held.as_str()) {
                        return out;
                    } else {
                        self.state = State::Content;
                    }
                }
                State::Thinking => {
                    if !self.reasoning_started {
                        let lead = self.held.len() - self.held.trim_start().len();
                        self.held.drain(..lead);
                    }
                    let close = self.held.find(CLOSE);
                    // Up to the tag, or up to what could still become it.
                    let end = close.unwrap_or_else(|| tag_prefix_start(&self.held));
                    let given = self.held[..end].trim_end().len();
                    if given > 0 {
                        out.push(Piece::Reasoning(self.held[..given].to_string()));
                        self.reasoning_started = true;
                    }
                    match close {
                        Some(at) => {
                            self.held.drain(..at + CLOSE.len());
                            self.state = State::Closed;
                        }
                        None => {
                            self.held.drain(..given);
                            return out;
                        }
                    }
                }
                State::Closed => {
                    let lead = self.held.len() - self.held.trim_start().len();
                    self.held.drain(..lead);
                    if self.held.is_empty() {
                        return out;
                    }
                    self.state = State::Content;
                }
            }
        }
    }

    /// The answer ended: what is still held, as what it turned out to be (a think block never
    /// closed is all reasoning; an answer that was only the start of `<think>` is content).
    pub fn finish(&mut self) -> Vec<Piece> {
        let held = std::mem::take(&mut self.held);
        match self.state {
            State::Opening | State::Content if !held.is_empty() => vec![Piece::Content(held)],
            State::Thinking => {
                let held = if self.reasoning_started {
                    held.trim_end()
                } else {
                    held.trim()
                };
                if held.is_empty() {
                    Vec::new()
                } else {
                    self.reasoning_started = true;
                    vec![Piece::Reasoning(held.to_string())]
                }
            }
            _ => Vec::new(),
        }
    }
}

/// Where the longest end of `s` that is a proper prefix of `</think>` starts (`s.len()` when
/// none is): the text from there could still become the tag.
pub fn tag_prefix_start(s: &str) -> usize {
    (1..CLOSE.len().min(s.len() + 1))
        .rev()
        .find(|&k| s.ends_with(&CLOSE[..k]))
        .map_or(s.len(), |k| s.len() - k)
}

/// `pieces` added to a whole answer's `reasoning` and `content`.
pub fn append(pieces: Vec<Piece>, reasoning: &mut String, content: &mut String) {
    for p in pieces {
        match p {
            Piece::Reasoning(t) => reasoning.push_str(&t),
            Piece::Content(t) => content.push_str(&t),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The reasoning and the content of a whole answer given in `chunks`.
    fn split_whole<'a>(
        reasoning: Reasoning,
        prompt_opens_think: bool,
        chunks: impl IntoIterator<Item = &'a str>,
    ) -> (String, String) {
        let mut splitter = ThinkSplitter::new(reasoning, prompt_opens_think);
        let (mut r, mut c) = (String::new(), String::new());
        for chunk in chunks {
            append(splitter.push(chunk), &mut r, &mut c);
        }
        append(splitter.finish(), &mut r, &mut c);
        (r, c)
    }

    const QWEN35: &str = "The user greets.\nSay hi back.\n</think>\n\nHi there!";

    fn whole(text: &str, opens: bool) -> (String, String) {
        split_whole(Reasoning::Separate, opens, [text])
    }

    #[test]
    fn a_whole_answer_splits_at_the_tag() {
        assert_eq!(
            whole(QWEN35, true),
            ("The user greets.\nSay hi back.".into(), "Hi there!".into())
        );
        // Qwen3's answer opens the block itself.
        let qwen3 = format!("<think>\n{QWEN35}");
        assert_eq!(whole(&qwen3, false), whole(QWEN35, true));
        // Control: the same text kept inline is the text as written.
        assert_eq!(
            split_whole(Reasoning::Inline, true, [QWEN35]),
            (String::new(), QWEN35.into())
        );
        // An empty think block gives no reasoning.
        assert_eq!(
            whole("\n</think>\n\nok", true),
            (String::new(), "ok".into())
        );
    }

    /// No piece is empty or holds any part of a tag.
    fn clean(pieces: &[Piece]) -> bool {
        pieces.iter().all(|p| {
            let (Piece::Reasoning(t) | Piece::Content(t)) = p;
            !t.is_empty() && !t.contains('<') && !t.contains('>')
        })
    }

    /// Each chunk's pieces, then the finish's.
    fn pieces(chunks: &[&str]) -> Vec<Piece> {
        let mut s = ThinkSplitter::new(Reasoning::Separate, true);
        let mut out: Vec<Piece> = chunks.iter().flat_map(|c| s.push(c)).collect();
        out.extend(s.finish());
        out
    }

    #[test]
    fn a_tag_cut_at_every_byte_gives_the_same_split_and_no_piece_of_it() {
        let want = whole(QWEN35, true);
        let tag = QWEN35.find(CLOSE).unwrap();
        // Two cuts anywhere around the tag (every byte position of `</think>`, and the
        // whitespace about it).
        let mut cuts = 0;
        for a in tag - 2..=tag + CLOSE.len() + 2 {
            for b in a..=tag + CLOSE.len() + 3 {
                let chunks = [&QWEN35[..a], &QWEN35[a..b], &QWEN35[b..]];
                let got = pieces(&chunks);
                assert!(clean(&got), "{a} {b}: {got:?}");
                assert_eq!(
                    split_whole(Reasoning::Separate, true, chunks),
                    want,
                    "{a} {b}"
                );
                cuts += 1;
            }
        }
        assert_eq!(cuts, 13 * 14 - 13 * 12 / 2);
        // One character per chunk.
        let chars: Vec<String> = QWEN35.chars().map(String::from).collect();
        let chars: Vec<&str> = chars.iter().map(String::as_str).collect();
        assert!(clean(&pieces(&chars)));
        assert_eq!(split_whole(Reasoning::Separate, true, chars), want);
        // Control: a splitter that gives out each chunk's text up to a tag found within the chunk
        // (holding nothing back) leaks `</` when the tag is cut, which `clean` sees.
        let naive = |chunks: &[&str]| -> Vec<Piece> {
            let mut closed = false;
            chunks
                .iter()
                .filter(|c| !c.is_empty())
                .map(|c| match (closed, c.find(CLOSE)) {
                    (false, None) => Piece::Reasoning(c.to_string()),
                    (false, Some(_)) => {
                        closed = true;
                        Piece::Content(c.replace(CLOSE, ""))
                    }
                    (true, _) => Piece::Content(c.to_string()),
                })
                .collect()
        };
        let cut = [&QWEN35[..tag + 2], &QWEN35[tag + 2..]];
        assert!(!clean(&naive(&cut)));
        assert!(clean(&pieces(&cut)));
    }

    #[test]
    fn an_answer_stopped_before_the_tag_is_all_reasoning() {
        for cut in [
            "The user",
            "The user greets.\n",
            "The user greets.\nSay hi back.\n</thi",
        ] {
            let (r, c) = whole(cut, true);
            assert_eq!(r, cut.trim(), "{cut:?}");
            assert_eq!(c, "", "{cut:?}");
        }
        // Control: the same text from a prompt without a think block is content.
        assert_eq!(whole("The user", false), (String::new(), "The user".into()));
    }

    #[test]
    fn an_answer_without_thinking_is_content_as_written() {
        for text in [
            "Hello.",
            "  \n leading space kept",
            "<b>bold</b>",
            "<thin ice",
            "<th",
            "",
            "a</think>b",
        ] {
            assert_eq!(whole(text, false), (String::new(), text.into()), "{text:?}");
            // Streamed a character at a time: the same.
            let chars: Vec<String> = text.chars().map(String::from).collect();
            assert_eq!(
                split_whole(Reasoning::Separate, false, chars.iter().map(String::as_str)),
                (String::new(), text.into())
            );
        }
        // Control: an answer that opens the block is split.
        assert_eq!(whole("<think>x</think>y", false), ("x".into(), "y".into()));
    }

    #[test]
    fn formats_by_name() {
        assert_eq!(Reasoning::of_format("auto"), Some(Reasoning::Separate));
        assert_eq!(Reasoning::of_format("deepseek"), Some(Reasoning::Separate));
        assert_eq!(Reasoning::of_format("none"), Some(Reasoning::Inline));
        assert_eq!(Reasoning::of_format("deepseek-legacy"), None);
    }
}
