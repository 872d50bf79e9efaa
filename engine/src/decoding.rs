//! One answer's decoding, step by step: sample from the logits, show the text (whole characters,
//! never part of a stop string), and decide whether the answer goes on. The session's loop and
//! the scheduler's sequences both answer through this — one generate loop.

use crate::constraint::Constraint;
use crate::error::Result;
use crate::sampling::{Sampler, SamplingParams};
use crate::session::FinishReason;
use crate::stream::{StopFilter, TextStream};
use crate::tokenizer::Tokenizer;

/// What the answer does after a sampled token.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Next {
    /// Feed this token (it is in the answer) and decode on.
    Feed(u32),
    /// The answer is over.
    Done(FinishReason),
}

pub struct Decoding {
    sampler: Sampler,
    /// Prompt and answer ids (the repetition penalty's view).
    history: Vec<u32>,
    /// The answer's ids, the end-of-sequence id included.
    ids: Vec<u32>,
    stream: TextStream,
    stops: StopFilter,
    /// What the answer must be, when the request constrains it.
    constraint: Option<Constraint>,
}

impl Decoding {
    /// An answer to a prompt of `prompt_ids`; `params` carry the eos ids and the grammar, compiled
    /// here against `tokenizer`'s vocabulary (a grammar it refuses is refused by name).
    pub fn new(
        params: SamplingParams,
        prompt_ids: &[u32],
        tokenizer: &Tokenizer,
    ) -> Result<Decoding> {
        let stops = StopFilter::new(&params.stop);
        let constraint = match &params.grammar {
            Some(g) => Some(Constraint::new(
                g,
                tokenizer.token_space()?.as_ref(),
                &params.eos_ids,
            )?),
            None => None,
        };
        Ok(Decoding {
            constraint,
            sampler: Sampler::new(params)?,
            history: prompt_ids.to_vec(),
            ids: Vec::new(),
            stream: TextStream::new(),
            stops,
        })
    }

    /// Whether a constraint shapes the answer (the session then feeds no drafts).
    pub fn is_constrained(&self) -> bool {
        self.constraint.is_some()
    }

    /// Tokens sampled so far.
    pub fn ids(&self) -> &[u32] {
        &self.ids
    }

    /// Samples the next token from `logits` (modified: penalties) and shows its text through
    /// `on_text` (returning false cancels). `cache_full`: no slot is left for another row.
    /// `draft`: the token fed after this row in a verified window (sampling then follows the
    /// speculative acceptance rule: `Sampler::sample_after_draft`).
    pub fn next(
        &mut self,
        logits: &mut [f32],
        tokenizer: &Tokenizer,
        cache_full: bool,
        draft: Option<u32>,
        on_text: &mut dyn FnMut(&str) -> bool,
    ) -> Result<Next> {
        let step = self.ids.len();
        // A constrained answer has no drafts (the session and the scheduler turn them off).
        let token = match (draft, self.constraint.as_mut()) {
            (Some(d), None) => {
                self.sampler
                    .sample_after_draft(logits, &self.history, &self.ids, step, d)?
            }
            (_, constraint) => self.sampler.sample_constrained(
                logits,
                &self.history,
                &self.ids,
                step,
                constraint,
            )?,
        };
        if let Some(c) = &mut self.constraint {
            c.advance(token)?;
        }
        self.ids.push(token);
        self.history.push(token);
        if self.sampler.params.eos_ids.contains(&token) {
            return Ok(Next::Done(FinishReason::Eos(token)));
        }
        let (shown, stop) = self.stops.push(&self.stream.push(tokenizer, token)?);
        if !shown.is_empty() && !on_text(&shown) {
            return Ok(Next::Done(FinishReason::Cancelled));
        }
        if let Some(s) = stop {
            return Ok(Next::Done(FinishReason::Stop(s)));
        }
        if self.ids.len() >= self.sampler.params.max_tokens {
            return Ok(Next::Done(FinishReason::MaxTokens));
        }
        if cache_full {
            return Ok(Next::Done(FinishReason::ContextFull));
        }
        Ok(Next::Feed(token))
    }

    /// Ends the answer: text held back (an unfinished character, a possible stop string's start)
    /// is shown unless a stop string or a cancel ended it. Returns the answer's text and ids.
    pub fn finish(
        mut self,
        finish: &FinishReason,
        tokenizer: &Tokenizer,
        on_text: &mut dyn FnMut(&str) -> bool,
    ) -> Result<(String, Vec<u32>)> {
        if !matches!(finish, FinishReason::Stop(_) | FinishReason::Cancelled) {
            let (shown, _) = self.stops.push(&self.stream.finish(tokenizer)?);
            let rest = shown + &self.stops.finish();
            if !rest.is_empty() {
                on_text(&rest);
            }
        }
        Ok((self.stops.shown().to_string(), self.ids))
    }
}
