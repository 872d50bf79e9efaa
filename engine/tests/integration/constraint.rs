//! Constrained decoding on the tiny random model: a JSON schema (an enum and a bounded integer)
//! makes even random weights answer JSON that parses and fits, greedy and seeded, alone and
//! through the scheduler; a Lark grammar with an embedded schema (a tool call) likewise. Controls:
//! the same requests without the constraint do not answer valid JSON; a different seed changes
//! the sampled answer; a schema llguidance refuses is a `Grammar` error, not a panic.

use crate::common;

use common::*;
use engine::{
    EngineError, FinishReason, Grammar, Message, SamplingParams, Scheduler, SchedulerOptions,
    Session,
};
use serde_json::{json, Value};

fn schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "color": {"enum": ["red", "green"]},
            "n": {"type": "integer", "minimum": 1, "maximum": 9}
        },
        "required": ["color", "n"],
        "additionalProperties": false
    })
}

/// Whether `text` is a JSON object fitting [`schema`].
fn fits(text: &str) -> bool {
    let Ok(Value::Object(o)) = serde_json::from_str::<Value>(text) else {
        return false;
    };
    o.len() == 2
        && matches!(
            o.get("color").and_then(Value::as_str),
            Some("red" | "green")
        )
        && matches!(o.get("n").and_then(Value::as_i64), Some(1..=9))
}

fn question() -> Vec<Message> {
    vec![Message::user(
        Vec::new(),
        "Give me a color and a number as JSON.",
    )]
}

fn params(temperature: f32, seed: u64, grammar: Option<Grammar>) -> SamplingParams {
    SamplingParams {
        max_tokens: 64,
        temperature,
        top_k: if temperature > 0.0 { 40 } else { 0 },
        seed,
        grammar,
        ..SamplingParams::default()
    }
}

fn answer(s: &mut Session, p: &SamplingParams) -> (String, FinishReason) {
    s.reset();
    let mut streamed = String::new();
    let g = s
        .generate(&question(), p, &mut |e| {
            if let engine::Event::Text(t) = e {
                streamed.push_str(t);
            }
            true
        })
        .unwrap();
    assert_eq!(streamed, g.text, "the streamed text is the answer");
    (g.text, g.finish)
}

#[test]
fn a_schema_makes_random_weights_answer_fitting_json() {
    let mut s = tower_session();
    let grammar = Some(Grammar::JsonSchema(schema()));
    let mut sampled = Vec::new();
    for (temperature, seed) in [(0.0, 0), (0.9, 1), (0.9, 2), (1.0, 3), (1.0, 4)] {
        let (text, finish) = answer(&mut s, &params(temperature, seed, grammar.clone()));
        assert!(fits(&text), "t={temperature} seed={seed}: {text:?}");
        assert!(
            matches!(finish, FinishReason::Eos(_)),
            "t={temperature} seed={seed}: {finish:?} {text:?}"
        );
        // Control: without the constraint the same request is no such JSON.
        let (free, _) = answer(&mut s, &params(temperature, seed, None));
        assert!(!fits(&free), "t={temperature} seed={seed}: {free:?}");
        assert!(serde_json::from_str::<Value>(&free).is_err(), "{free:?}");
        if temperature > 0.0 {
            sampled.push(text);
        }
    }
    // Control: the seeds are not ignored (some sampled answers differ).
    sampled.dedup();
    assert!(sampled.len() > 1, "{sampled:?}");
}

#[test]
fn json_object_and_a_tool_call_grammar_hold_too() {
    let mut s = tower_session();
    // Any object: random weights may write a key until max_tokens (finish "length", a cut
    // object); an answer that ends by itself is an object.
    let mut ended = 0;
    for seed in 0..8 {
        let (text, finish) = answer(&mut s, &params(1.0, seed, Some(Grammar::JsonObject)));
        assert!(text.starts_with('{'), "{text:?}");
        if matches!(finish, FinishReason::Eos(_)) {
            let v: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text:?}"));
            assert!(v.is_object(), "{text:?}");
            ended += 1;
        } else {
            assert_eq!(finish, FinishReason::MaxTokens, "{text:?}");
        }
    }
    eprintln!("json_object: {ended} of 8 answers ended by themselves");
    let call = format!(
        "start: \"<tool_call>\\n\" %json{} \"\\n</tool_call>\"",
        json!({
            "type": "object",
            "properties": {"name": {"const": "get_weather"}, "arguments": schema()},
            "required": ["name", "arguments"],
            "additionalProperties": false,
            "x-guidance": engine::constraint::json_options(),
        })
    );
    for seed in 0..3 {
        // The tiny vocabulary spells the call's fixed text in short pieces: room for them.
        let p = SamplingParams {
            max_tokens: 160,
            ..params(0.8, seed, Some(Grammar::Lark(call.clone())))
        };
        let (text, finish) = answer(&mut s, &p);
        assert!(
            matches!(finish, FinishReason::Eos(_)),
            "{finish:?} {text:?}"
        );
        let inner = text
            .strip_prefix("<tool_call>\n")
            .and_then(|t| t.strip_suffix("\n</tool_call>"))
            .unwrap_or_else(|| panic!("{text:?}"));
        let v: Value = serde_json::from_str(inner).unwrap();
        assert_eq!(v["name"], "get_weather");
        assert!(fits(&v["arguments"].to_string()), "{inner}");
    }
}

#[test]
fn max_tokens_before_the_json_closes_is_length_and_bad_schemas_are_refused() {
    let mut s = tower_session();
    let mut p = params(0.0, 0, Some(Grammar::JsonSchema(schema())));
    p.max_tokens = 3;
    let (text, finish) = answer(&mut s, &p);
    assert_eq!(finish, FinishReason::MaxTokens, "{text:?}");
    assert!(serde_json::from_str::<Value>(&text).is_err(), "{text:?}");
    for bad in [
        Grammar::JsonSchema(json!({"type": "object", "properties": {"a": {"type": "nonsense"}}})),
        Grammar::Lark("start: \"unclosed".into()),
    ] {
        s.reset();
        let e = s
            .generate(&question(), &params(0.0, 0, Some(bad.clone())), &mut |_| {
                true
            })
            .unwrap_err();
        assert!(matches!(e, EngineError::Grammar(_)), "{bad:?}: {e}");
    }
    // Schemas a client may send that are odd or heavy: each is answered or refused by name,
    // never a panic. A remote $ref (no fetching) and an unsatisfiable schema are refused.
    for (odd, refused) in [
        (
            json!({"oneOf": [{"type": "integer"}, {"type": "string"}]}),
            false,
        ),
        (
            json!({"$defs": {"t": {"type": "object", "properties": {"k": {"$ref": "#/$defs/t"}}}},
                   "$ref": "#/$defs/t"}),
            false,
        ),
        (json!({"type": "string", "pattern": "^(a+)+$"}), false),
        (
            json!({"type": "object", "properties": {"e": {"enum": (0..2000).collect::<Vec<_>>()}}}),
            false,
        ),
        (json!(true), false),
        (json!({"$ref": "https://example.com/schema.json"}), true),
        (
            json!({"type": "array", "items": {"type": "number"}, "minItems": 3, "maxItems": 2}),
            true,
        ),
    ] {
        s.reset();
        let p = params(0.0, 0, Some(Grammar::JsonSchema(odd.clone())));
        match s.generate(&question(), &p, &mut |_| true) {
            Ok(g) => assert!(!refused, "{odd}: answered {:?}", g.text),
            Err(EngineError::Grammar(m)) => assert!(refused, "{odd}: refused: {m}"),
            Err(e) => panic!("{odd}: {e}"),
        }
    }
}

#[test]
fn the_scheduler_answers_constrained_requests_as_the_session_does() {
    let grammar = Some(Grammar::JsonSchema(schema()));
    let requests = [params(0.0, 0, grammar.clone()), params(0.9, 5, grammar)];
    let mut s = tower_session();
    let alone: Vec<String> = requests.iter().map(|p| answer(&mut s, p).0).collect();
    let options = SchedulerOptions {
        parallel: 2,
        prefill_chunk: 4,
        drafts: 0,
    };
    let (handle, _thread) = Scheduler::start(tower_session(), options).unwrap();
    let threads: Vec<_> = requests
        .iter()
        .cloned()
        .map(|p| {
            let h = handle.clone();
            std::thread::spawn(move || h.generate(&question(), &p, &mut |_| true).unwrap().text)
        })
        .collect();
    for (t, a) in threads.into_iter().zip(&alone) {
        let text = t.join().unwrap();
        assert!(fits(&text), "{text:?}");
        assert_eq!(&text, a);
    }
}

/// What the constraint costs on a vocabulary of Qwen3's size: the tiny tokenizer with synthetic
/// byte-level tokens (printable ASCII strings of 2 to 4 bytes, JSON's punctuation among them) up
/// to 151,936 ids. Prints the time to build the token space and the mean and worst mask per token
/// of a schema answer. Not a gate: `cargo test -p engine --release --test integration -- --ignored
/// cost_on --nocapture`.
#[test]
#[ignore]
fn cost_on_a_qwen_sized_vocabulary() {
    use std::time::Instant;
    let path = checkpoint().join("tokenizer.json");
    let mut json: Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
    let vocab = json["model"]["vocab"].as_object_mut().unwrap();
    let mut next = 512u64;
    let mut i = 95u64;
    while next < 151_936 {
        let (mut n, mut word) = (i, String::new());
        while n > 0 {
            // Printable ASCII in the byte-level alphabet (the space is 'Ġ').
            let b = (n % 95) as u8 + 0x20;
            word.push(if b == b' ' { 'Ġ' } else { b as char });
            n /= 95;
        }
        i += 1;
        if !vocab.contains_key(&word) {
            vocab.insert(word, json!(next));
            next += 1;
        }
    }
    let im_end = json["added_tokens"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["content"] == "<|im_end|>")
        .unwrap()["id"]
        .as_u64()
        .unwrap() as u32;
    let tokenizer =
        engine::Tokenizer::from_bytes(json.to_string().as_bytes(), "synthetic").unwrap();
    assert_eq!(tokenizer.vocab_size(), 151_936);
    let start = Instant::now();
    let space = tokenizer.token_space().unwrap();
    let built = start.elapsed();
    let mut c = engine::Constraint::new(&Grammar::JsonSchema(schema()), &space, &[im_end]).unwrap();
    let mut logits = vec![0.0f32; 151_936];
    let (mut total, mut worst, mut steps) =
        (std::time::Duration::ZERO, std::time::Duration::ZERO, 0);
    loop {
        logits.iter_mut().for_each(|l| *l = 0.0);
        let t = Instant::now();
        c.mask(&mut logits).unwrap();
        let d = t.elapsed();
        total += d;
        worst = worst.max(d);
        steps += 1;
        // The last allowed id (the longest pieces come last): a varied walk to the end.
        let token = (0..logits.len()).rev().find(|&i| logits[i] == 0.0).unwrap() as u32;
        if token == im_end || steps == 64 {
            break;
        }
        c.advance(token).unwrap();
    }
    eprintln!(
        "151,936 ids: token space built in {:.0} ms; mask {:.0} us mean, {:.0} us worst over {steps} steps",
        built.as_secs_f64() * 1e3,
        total.as_secs_f64() * 1e6 / f64::from(steps),
        worst.as_secs_f64() * 1e6
    );
}
