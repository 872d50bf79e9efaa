//! Draft tokens for verified draft windows: a decode step may feed the sampled token and k
//! guesses of what follows in one forward (k + 1 rows, every row's logits); the session then
//! walks the rows with the normal sampler and keeps a row only while the sampled token equals
//! the guess fed after it, so drafts change the work, never the answer (greedy: the ids; sampling
//! at temperature > 0: the distribution, by the speculative acceptance rule,
//! `Sampler::sample_after_draft`).

/// Proposes up to `k` tokens to follow `ids` (the prompt's and answer's ids so far, the token
/// about to be fed last). Fewer (or none) is fine.
pub trait Drafter: Send {
    fn propose(&mut self, ids: &[u32], k: usize) -> Vec<u32>;
}

/// Prompt lookup (n-gram copy): the longest suffix of `ids` of at most `max_ngram` tokens (3,
/// then 2, then 1) that occurred earlier in `ids`; its most recent earlier occurrence wins, and
/// the up to k tokens that followed it are proposed. No earlier occurrence of even the last token:
/// no drafts.
#[derive(Clone, Copy, Debug)]
pub struct PromptLookup {
    pub max_ngram: usize,
}

impl Default for PromptLookup {
    fn default() -> Self {
        PromptLookup { max_ngram: 3 }
    }
}

impl Drafter for PromptLookup {
    fn propose(&mut self, ids: &[u32], k: usize) -> Vec<u32> {
        prompt_lookup(ids, self.max_ngram, k)
    }
}

/// See [`PromptLookup`].
pub fn prompt_lookup(ids: &[u32], max_ngram: usize, k: usize) -> Vec<u32> {
    let len = ids.len();
    if k == 0 {
        return Vec::new();
    }
    for n in (1..=max_ngram.min(len.saturating_sub(1))).rev() {
        let suffix = &ids[len - n..];
        // Earlier occurrences start at 0..len - n (not the suffix itself), latest first.
        for start in (0..len - n).rev() {
            if &ids[start..start + n] == suffix {
                let from = start + n;
                return ids[from..(from + k).min(len)].to_vec();
            }
        }
    }
    Vec::new()
}

/// Where a session's drafts come from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum DraftSource {
    /// Prompt lookup ([`PromptLookup`]), or the drafter set with `Session::set_drafter`.
    #[default]
    PromptLookup,
    /// Qwen3.5's MTP head (`crate::mtp_drafts`); a pack without one is refused by name.
    Mtp,
}

/// The most draft tokens a step may carry (`--drafts 0..=16`).
pub const MAX_DRAFTS: usize = 16;

/// The token ids MTP drafts choose among by default (`--draft-vocab`): the first 65,536, about a
/// quarter of Qwen3.5's 248,320 (EAGLE-3's draft vocabulary keeps a quarter of Llama 3's too).
/// The LM head read per draft is most of its cost: at the 0.8B shape a 4-row window with 3 MTP
/// drafts took 40.5-41.1 ms, 15.8-16.4 of them in the head's steps (PERF.md).
pub const MTP_VOCAB: usize = 65536;

/// `--draft-vocab N|all`: the token ids MTP drafts choose among (`None`: all of them).
pub fn parse_draft_vocab(s: &str) -> Result<Option<usize>, String> {
    match s {
        "all" => Ok(None),
        _ => match s.parse::<usize>() {
            Ok(n) if n > 0 => Ok(Some(n)),
            _ => Err(format!(
                "--draft-vocab {s}: must be a positive number of token ids (like {MTP_VOCAB}) or all"
            )),
        },
    }
}

/// Deliberate mistakes, for controls (no flag reaches them).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DraftAblation {
    /// After a window's first mismatch, keep one cache row more than the accepted ones (a stale
    /// row of a rejected draft).
    pub keep_one_row_too_many: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_longest_suffix_with_an_earlier_occurrence_proposes_what_followed() {
        // "1 2 3 4 5 ... 1 2 3" -> 4 5 (3-gram), the latest occurrence.
        let ids = [1, 2, 3, 4, 5, 9, 1, 2, 3];
        assert_eq!(prompt_lookup(&ids, 3, 2), vec![4, 5]);
        assert_eq!(prompt_lookup(&ids, 3, 10), vec![4, 5, 9, 1, 2, 3]);
        // Only a 1-gram matches: 7 ... 7 -> 8.
        assert_eq!(prompt_lookup(&[7, 8, 1, 2, 7], 3, 3), vec![8, 1, 2]);
        // The latest occurrence wins over an earlier one.
        assert_eq!(prompt_lookup(&[5, 1, 5, 2, 5], 3, 1), vec![2]);
        // Control: no earlier occurrence, no drafts; k = 0, no drafts.
        assert!(prompt_lookup(&[1, 2, 3], 3, 4).is_empty());
        assert!(prompt_lookup(&ids, 3, 0).is_empty());
        assert!(prompt_lookup(&[], 3, 4).is_empty());
    }
}
