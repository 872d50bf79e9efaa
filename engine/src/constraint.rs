//! Constrained decoding: what an answer must be (any JSON object, JSON fitting a schema, or a Lark
//! grammar — llguidance's dialect, where `%json{...}` embeds a schema) compiled by `llguidance`
//! into a parser over the tokenizer's vocabulary. Before each draw the tokens that cannot continue
//! a valid answer get `-inf` logits; the drawn token advances the parser. The answer's end-of-turn
//! ids are allowed only where the grammar can end, so an answer that ends by itself always parses
//! (one cut by max_tokens or the context does not: that is finish "length").
//!
//! The token trie (each id's bytes, from `tokenizer.json`'s byte-level vocabulary) and the parser
//! factory are built once per [`crate::Tokenizer`], at the first constrained answer, and shared by
//! every answer after it. On a synthetic vocabulary of Qwen3's 151,936 ids (the ignored probe
//! `cost_on_a_qwen_sized_vocabulary`, 2 cores) that takes 0.85 s once, and a mask 0.6–0.85 ms per
//! token (4.4 ms at the first): a few percent of a 2B model's decode step, computed before the
//! draw, not overlapped with the forward.

use std::sync::Arc;

use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{ApproximateTokEnv, SimpleVob, TokEnv, TokRxInfo, TokTrie};
use llguidance::{Matcher, ParserFactory};
use serde_json::{json, Value};

use crate::error::{EngineError, Result};

/// What an answer must be.
#[derive(Clone, Debug, PartialEq)]
pub enum Grammar {
    /// Any JSON object (OpenAI's `response_format: {"type": "json_object"}`).
    JsonObject,
    /// JSON fitting this JSON schema.
    JsonSchema(Value),
    /// A grammar in llguidance's Lark dialect.
    Lark(String),
}

/// How JSON is written under a constraint: Python's `json.dumps` separators (", " and ": ", what
/// Qwen writes in its tool calls), no other whitespace. Flexible whitespace would let a model
/// (a random one certainly) write blanks until max_tokens instead of closing the object.
pub fn json_options() -> Value {
    json!({"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": "})
}

impl Grammar {
    fn top_level(&self) -> TopLevelGrammar {
        match self {
            Grammar::JsonObject => {
                TopLevelGrammar::from_json_schema(with_options(json!({"type": "object"})))
            }
            Grammar::JsonSchema(schema) => {
                TopLevelGrammar::from_json_schema(with_options(schema.clone()))
            }
            Grammar::Lark(lark) => TopLevelGrammar::from_lark(lark.clone()),
        }
    }
}

/// The schema with [`json_options`] unless it sets its own (`x-guidance`).
fn with_options(mut schema: Value) -> Value {
    if let Value::Object(o) = &mut schema {
        o.entry("x-guidance").or_insert_with(json_options);
    }
    schema
}

/// The vocabulary as llguidance sees it, built once per tokenizer.
pub struct TokenSpace {
    factory: ParserFactory,
}

impl TokenSpace {
    /// From `tokenizer.json` (as the tokenizers library serializes it): every id's bytes; special
    /// tokens marked so that grammars never spell them by accident. `eos` is the trie's end id.
    pub fn new(tokenizer_json: &Value, eos: u32) -> Result<TokenSpace> {
        let bytes = llguidance::token_bytes_from_tokenizer_json(tokenizer_json).map_err(|e| {
            EngineError::Tokenizer(format!(
                "the vocabulary cannot be read for constrained decoding: {e}"
            ))
        })?;
        if eos as usize >= bytes.len() {
            return Err(EngineError::Tokenizer(format!(
                "end-of-turn id {eos} is outside the vocabulary of {} ids",
                bytes.len()
            )));
        }
        let info = TokRxInfo::new(bytes.len() as u32, eos);
        let trie = TokTrie::from(&info, &bytes);
        let env: TokEnv = Arc::new(ApproximateTokEnv::new(trie));
        let mut factory = ParserFactory::new_simple(&env).map_err(|e| {
            EngineError::Tokenizer(format!("constrained decoding cannot start: {e}"))
        })?;
        factory.quiet();
        Ok(TokenSpace { factory })
    }

    pub fn vocab_size(&self) -> usize {
        self.factory.tok_env().tok_trie().vocab_size()
    }
}

/// One answer's constraint: the parser and the ids that end the answer.
pub struct Constraint {
    matcher: Matcher,
    /// The trie's end id: the mask allows it where the grammar can end.
    trie_eos: u32,
    eos_ids: Vec<u32>,
    vocab: usize,
}

impl Constraint {
    /// Compiles `grammar`; a grammar llguidance refuses (an unsupported schema keyword, a Lark
    /// syntax error) is refused by name.
    pub fn new(grammar: &Grammar, space: &TokenSpace, eos_ids: &[u32]) -> Result<Constraint> {
        let parser = space
            .factory
            .create_parser(grammar.top_level())
            .map_err(|e| EngineError::Grammar(e.to_string()))?;
        let matcher = Matcher::new(Ok(parser));
        if let Some(e) = matcher.get_error() {
            return Err(EngineError::Grammar(e));
        }
        Ok(Constraint {
            matcher,
            trie_eos: space.factory.tok_env().tok_trie().eos_token(),
            eos_ids: eos_ids.to_vec(),
            vocab: space.vocab_size(),
        })
    }

    /// Sets the logits of the tokens that cannot come next to `-inf`: ids past the tokenizer's
    /// vocabulary (a head padded wider), ids the grammar does not allow, and the end ids unless
    /// the grammar can end here.
    pub fn mask(&mut self, logits: &mut [f32]) -> Result<()> {
        let allowed = self.allowed()?;
        let can_end = allowed.is_allowed(self.trie_eos);
        for (id, l) in logits.iter_mut().enumerate() {
            let ok = if self.eos_ids.contains(&(id as u32)) {
                can_end
            } else {
                id < self.vocab && id as u32 != self.trie_eos && allowed.is_allowed(id as u32)
            };
            if !ok {
                *l = f32::NEG_INFINITY;
            }
        }
        Ok(())
    }

    fn allowed(&mut self) -> Result<SimpleVob> {
        let failed = |m: &Matcher, e: String| {
            EngineError::Grammar(format!(
                "the constraint failed: {}",
                m.get_error().unwrap_or(e)
            ))
        };
        if self.matcher.is_stopped() {
            // The grammar is complete: only the end.
            let mut only_end = SimpleVob::alloc(self.vocab);
            only_end.allow_token(self.trie_eos);
            return Ok(only_end);
        }
        self.matcher
            .compute_mask()
            .map_err(|e| failed(&self.matcher, e.to_string()))
    }

    /// The drawn `token` is in the answer (end ids are not fed: the answer is over).
    pub fn advance(&mut self, token: u32) -> Result<()> {
        if self.eos_ids.contains(&token) {
            return Ok(());
        }
        self.matcher.consume_token(token).map_err(|e| {
            EngineError::Grammar(format!("token {token} does not fit the constraint: {e}"))
        })
    }
}
