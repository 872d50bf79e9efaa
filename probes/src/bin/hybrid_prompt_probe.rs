//! hybrid_prompt_probe: runs a prompt with image rows through the decoder, greedy-decodes, and
//! compares against a transformers reference.

use clap::Parser;
use compute::cli::RuntimeArgs;
use compute::ops::sampling::{argmax, top_k};
use decoder::{Decoder, Logits};
use packs::QuantKind;
use probes::cli::{self, EXIT_FAIL, EXIT_PASS};
use probes::text::{AnswerTokenizer, TextStream};
use serde_json::json;
use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;
use testkit::PromptInputs;
use testkit::Reference;

/// Runs a `hybrid-inputs/1` prompt (text rows, image rows, position planes, DeepStack sets) through
/// the pack's decoder: prefill, then greedy tokens, each at cache slot `rows + i` and rotary position
/// `max(position) + 1 + i`.
///
/// With --reference, decode steps are fed the reference's greedy ids (teacher forcing) and every
/// prompt row and step is compared; exit status 0 only when the comparison passes (1: it failed,
/// 2: bad input). With no arguments it runs the bundled tiny model, prompt and reference.
///
/// With --tokenizer (the checkpoint's tokenizer.json) the answer is printed as text as it is
/// produced, and generation stops at the end-of-turn token <|im_end|> unless --decode is given.
#[derive(Parser)]
#[command(version)]
struct Args {
    /// The pack (default: the bundled tiny model, built on first use).
    pack: Option<PathBuf>,
    /// The prompt, a hybrid-inputs/1 file (default: the bundled prompt).
    inputs: Option<PathBuf>,
    /// Greedy tokens to generate, exactly (default: 8; with --tokenizer: until <|im_end|>, at most
    /// 512 or what --context leaves; with --reference: at most the reference's count).
    #[arg(long, value_name = "N")]
    decode: Option<usize>,
    /// The checkpoint's tokenizer.json: print the answer as text and stop at <|im_end|>.
    #[arg(long, value_name = "FILE")]
    tokenizer: Option<PathBuf>,
    /// Print the K largest logits after the prompt and after each step.
    #[arg(long, value_name = "K")]
    top_k: Option<usize>,
    /// A reference*.safetensors to compare against (default with no pack: the bundled one).
    #[arg(long, value_name = "REF")]
    reference: Option<PathBuf>,
    /// Largest max |Δlogit| that passes (default: 1e-3 for f32/bf16 packs, 0.15 for i8/q4:
    /// `testkit::compare::QUANTIZED_MAX_ABS_LOGIT_DIFF`, derived there).
    #[arg(long)]
    max_diff: Option<f32>,
    /// Smallest top-1 agreement that passes (default: 1.0 for f32/bf16 packs, 0.97 for i8/q4).
    #[arg(long)]
    min_top1: Option<f64>,
    /// KV cache slots (default: the prompt rows plus the decode steps).
    #[arg(long, value_name = "SLOTS")]
    context: Option<usize>,
    #[command(flatten)]
    gemm: RuntimeArgs,
    /// With --gemm ab: the largest host/device difference that passes (0: byte-identical).
    #[arg(long, default_value_t = 0.0)]
    ab_tolerance: f32,
    /// Print where each step's time went (rows, launches, quantize+launch, wait, readback, host).
    #[arg(long)]
    profile: bool,
    /// Print one JSON object instead of the table.
    #[arg(long)]
    json: bool,
}

/// Greedy tokens when --decode is not given and nothing stops the answer.
const DEFAULT_DECODE: usize = 8;
/// The most tokens an answer that stops at <|im_end|> may take (without --context).
const MAX_ANSWER: usize = 512;

fn main() {
    let args = Args::parse();
    let (pack_path, inputs_path, reference_path) = match (&args.pack, &args.inputs) {
        (Some(p), Some(i)) => (p.clone(), i.clone(), args.reference.clone()),
        (None, None) => {
            let b = probes::bundled::bundled(probes::bundled::DEFAULT_CASE, QuantKind::F32)
                .unwrap_or_else(|e| cli::refuse(e));
            (
                b.pack,
                b.inputs,
                Some(args.reference.clone().unwrap_or(b.reference)),
            )
        }
        _ => cli::refuse("give both PACK and INPUTS, or neither (the bundled default)"),
    };
    let pack = cli::open_pack(&pack_path);
    let sem = pack.semantics().clone();
    let inputs = PromptInputs::open(&inputs_path).unwrap_or_else(|e| cli::refuse(e));
    inputs
        .check_against(&sem)
        .unwrap_or_else(|e| cli::refuse(e));
    let reference = reference_path
        .as_ref()
        .map(|p| Reference::open(p).unwrap_or_else(|e| cli::refuse(e)));
    let tokenizer = args.tokenizer.as_ref().map(|p| {
        let t = AnswerTokenizer::open(p).unwrap_or_else(|e| cli::refuse(e));
        t.check_vocabulary(sem.vocab_size)
            .unwrap_or_else(|e| cli::refuse(e));
        t
    });
    // The answer stops at <|im_end|> when there is a tokenizer to name it and no explicit count.
    let stop_at = match (&tokenizer, args.decode) {
        (Some(t), None) => Some(t.end_of_turn()),
        _ => None,
    };
    let rows = inputs.rows();
    let steps = match (&reference, stop_at) {
        (Some(r), Some(end)) => r
            .greedy_ids
            .iter()
            .position(|&t| t == i64::from(end))
            .map_or(r.greedy_ids.len(), |k| k + 1),
        (Some(r), None) => r
            .greedy_ids
            .len()
            .min(args.decode.unwrap_or(DEFAULT_DECODE).max(1)),
        (None, Some(_)) => args
            .context
            .map_or(MAX_ANSWER, |c| c.saturating_sub(rows))
            .max(1),
        (None, None) => args.decode.unwrap_or(DEFAULT_DECODE),
    };
    let text_rows = reference.as_ref().map_or(0, |r| r.text_ids.len());
    let needed = (rows + steps).max(text_rows);
    let context = args.context.unwrap_or(needed);
    if needed > context {
        cli::refuse(format!(
            "{}: {rows} prompt rows + {steps} steps need {needed} cache slots, the context holds {context} (raise --context)",
            inputs_path.display()
        ));
    }
    let mut fwd = cli::forward(&pack, &args.gemm, context);
    let exact = matches!(sem.quant, QuantKind::F32 | QuantKind::Bf16);
    let max_diff = args.max_diff.unwrap_or(if exact {
        1e-3
    } else {
        testkit::compare::QUANTIZED_MAX_ABS_LOGIT_DIFF
    });
    let min_top1 = args.min_top1.unwrap_or(if exact { 1.0 } else { 0.97 });

    let answer = Answer {
        tokenizer: tokenizer.as_ref(),
        stop_at,
        live: !args.json && !args.profile && args.top_k.is_none(),
    };
    if let Some(reference) = reference {
        let mut reference = reference;
        reference.greedy_ids.truncate(steps);
        reference
            .decode_logits
            .truncate((steps - 1) * reference.vocab);
        compare(
            &args,
            &mut fwd,
            &inputs,
            &reference,
            (max_diff, min_top1),
            &pack_path,
            &answer,
        );
    } else {
        generate(&args, &mut fwd, &inputs, steps, &pack_path, &answer);
    }
}

/// The answer's text side: the tokenizer (if any), the stop id, and whether text is printed as the
/// tokens come (not with --json, and not when --profile or --top-k lines interleave).
struct Answer<'t> {
    tokenizer: Option<&'t AnswerTokenizer>,
    stop_at: Option<u32>,
    live: bool,
}

impl<'t> Answer<'t> {
    fn stream(&self) -> Option<TextStream<'t>> {
        self.tokenizer.map(|t| t.stream())
    }

    /// Feeds one produced id; prints its text at once when live.
    fn push(&self, stream: &mut Option<TextStream<'t>>, id: u32) {
        if let Some(s) = stream {
            let piece = s.push(id).unwrap_or_else(|e| cli::refuse(e));
            if self.live {
                print!("{piece}");
                let _ = std::io::stdout().flush();
            }
        }
    }

    /// Ends the stream: the rest is printed when live; the full text is returned.
    fn finish(&self, stream: &mut Option<TextStream<'t>>) -> Option<String> {
        let s = stream.as_mut()?;
        let rest = s.finish().unwrap_or_else(|e| cli::refuse(e));
        if self.live {
            println!("{rest}");
        }
        let t = self.tokenizer.expect("a stream has a tokenizer");
        Some(t.decode(s.ids()).unwrap_or_else(|e| cli::refuse(e)))
    }

    fn decode(&self, ids: &[i64]) -> Option<String> {
        let ids: Vec<u32> = ids.iter().map(|&t| t as u32).collect();
        self.tokenizer
            .map(|t| t.decode(&ids).unwrap_or_else(|e| cli::refuse(e)))
    }

    /// Why the answer ended: at <|im_end|>, or after the steps it was given.
    fn stop_reason(&self, last: Option<u32>) -> &'static str {
        match (self.stop_at, last) {
            (Some(end), Some(id)) if end == id => "im_end",
            _ => "steps",
        }
    }
}

fn print_top_k(args: &Args, label: &str, logits: &[f32]) {
    if let (Some(k), false) = (args.top_k, args.json) {
        let list: Vec<String> = top_k(logits, k)
            .iter()
            .map(|(id, v)| format!("{id}:{v:.4}"))
            .collect();
        println!("  top-{k} {label}: {}", list.join(" "));
    }
}

fn profile_line(args: &Args, fwd: &mut Decoder, label: &str, rows: usize, t: Instant) {
    if args.profile && !args.json {
        let s = fwd.runtime().take_stats();
        println!(
            "  profile {label}: rows {rows}, gemms {}, launches {}, quantize+launch {:.3} ms, wait {:.3} ms, readback {:.3} ms, host gemm {:.3} ms, step total {:.3} ms",
            s.gemms,
            s.launches,
            s.quantize_launch.as_secs_f64() * 1e3,
            s.wait.as_secs_f64() * 1e3,
            s.readback.as_secs_f64() * 1e3,
            s.host.as_secs_f64() * 1e3,
            t.elapsed().as_secs_f64() * 1e3
        );
    }
}

/// No reference: prefill and free-running greedy decoding.
fn generate(
    args: &Args,
    fwd: &mut Decoder,
    inputs: &PromptInputs,
    steps: usize,
    pack: &std::path::Path,
    answer: &Answer,
) {
    let rows = inputs.rows();
    let embeds = inputs.embeds(fwd);
    let t = Instant::now();
    let logits = fwd
        .step_batch_embeds(&embeds, &inputs.hybrid(), 0, Logits::LastRow)
        .unwrap_or_else(|e| cli::refuse(e))
        .to_vec();
    if !args.json {
        println!(
            "hybrid_prompt_probe  {}  {}  ({rows} rows, {} image rows)",
            pack.display(),
            inputs.path.display(),
            inputs.image_rows().len()
        );
    }
    profile_line(args, fwd, "prefill", rows, t);
    print_top_k(args, "after the prompt", &logits);
    let mut ids = vec![argmax(&logits)];
    let mut stream = answer.stream();
    if answer.tokenizer.is_some() {
        if answer.live {
            print!("answer: ");
        }
        answer.push(&mut stream, ids[0]);
    } else if !args.json {
        print!("generated: {}", ids[0]);
        let _ = std::io::stdout().flush();
    }
    let mut rotary_pos = inputs.next_rotary_pos();
    for i in 0..steps.saturating_sub(1) {
        if answer.stop_at == ids.last().copied() {
            break;
        }
        let t = Instant::now();
        let logits = decoder::decode_step(fwd, ids[i], &mut rotary_pos)
            .unwrap_or_else(|e| cli::refuse(e))
            .to_vec();
        let id = argmax(&logits);
        ids.push(id);
        if answer.tokenizer.is_some() {
            answer.push(&mut stream, id);
        } else if !args.json {
            print!(" {id}");
            let _ = std::io::stdout().flush();
        }
        profile_line(args, fwd, &format!("step {}", i + 1), 1, t);
        print_top_k(args, &format!("after step {}", i + 1), &logits);
    }
    let pass = ab_pass(args, fwd);
    let text = answer.finish(&mut stream);
    let stop = answer.stop_reason(ids.last().copied());
    if args.json {
        let mut v = json!({"pack": pack.display().to_string(), "greedy_ids": ids, "pass": pass});
        if let Some(text) = &text {
            // Under "answer" as with --reference, where "text" is the text-only control.
            merge(&mut v, json!({"answer": {"text": text, "stop": stop}}));
        }
        merge(&mut v, probes::device::ab_json(fwd));
        println!("{v}");
    } else {
        if let Some(text) = &text {
            if !answer.live {
                println!("answer: {text}");
            }
            println!("greedy ids: {ids:?}  ({} tokens, stop: {stop})", ids.len());
        } else {
            println!();
        }
        print_ab(fwd);
    }
    std::process::exit(if pass { EXIT_PASS } else { EXIT_FAIL });
}

fn compare(
    args: &Args,
    fwd: &mut Decoder,
    inputs: &PromptInputs,
    reference: &Reference,
    (max_diff, min_top1): (f32, f64),
    pack: &std::path::Path,
    answer: &Answer,
) {
    if !args.json {
        println!(
            "hybrid_prompt_probe  {}  {}  ({} rows, {} image rows)  vs  {}  (host kernels {})",
            pack.display(),
            inputs.path.display(),
            inputs.rows(),
            inputs.image_rows().len(),
            reference.path.display(),
            compute::kernels::Isa::best()
        );
    }
    let mut t = Instant::now();
    let rows = inputs.rows();
    let mut stream = answer.stream();
    if answer.live && answer.tokenizer.is_some() {
        print!("  answer (ours, teacher-forced): ");
    }
    let r = testkit::replay(fwd, inputs, reference, |step, id, logits, fwd| {
        let (label, step_rows) = match step {
            0 => ("prefill".to_string(), rows),
            s => (format!("step {s}"), 1),
        };
        profile_line(args, fwd, &label, step_rows, t);
        print_top_k(args, &format!("after {label}"), logits);
        answer.push(&mut stream, id);
        t = Instant::now();
    })
    .unwrap_or_else(|e| cli::refuse(e));
    let text = answer.finish(&mut stream);
    let reference_text = answer.decode(&reference.greedy_ids);
    let stop = answer.stop_reason(reference.greedy_ids.last().map(|&t| t as u32));
    let max = r.max_abs_logit_diff();
    let top1 = r.top1_agreement();
    let first = r.first_divergence(reference);
    let text_max = r.text.max_abs_diff();
    let text_top1 = r.text.agreeing() as f64 / r.text.rows.max(1) as f64;
    let text_first = r.text.first_divergence();
    let pass = max <= max_diff
        && top1 >= min_top1
        && text_max <= max_diff
        && text_top1 >= min_top1
        && ab_pass(args, fwd);
    if args.json {
        let mut v = json!({
            "pack": pack.display().to_string(),
            "inputs": inputs.path.display().to_string(),
            "reference": reference.path.display().to_string(),
            "gemm": args.gemm.gemm.as_str(),
            "kernels": compute::kernels::Isa::best().name(),
            "rows": inputs.rows(),
            "image_rows": inputs.image_rows().len(),
            "greedy_ids": r.greedy_ids,
            "reference_greedy_ids": reference.greedy_ids,
            "max_abs_logit_diff": max,
            "top1_agreement": top1,
            "first_divergence": first,
            "cosine": r.cosine,
            "per_row_max_abs_diff": r.prompt.per_row_max_abs_diff,
            "per_step_max_abs_diff": r.decode.per_row_max_abs_diff,
            "text": {
                "rows": r.text.rows,
                "max_abs_logit_diff": text_max,
                "top1_agreement": text_top1,
                "first_divergence": text_first,
                "cosine": r.text_cosine,
            },
            "thresholds": {"max_abs_logit_diff": max_diff, "top1_agreement": min_top1},
            "pass": pass,
        });
        if let (Some(text), Some(reference_text)) = (&text, &reference_text) {
            merge(
                &mut v,
                json!({"answer": {"text": text, "reference_text": reference_text, "stop": stop}}),
            );
        }
        merge(&mut v, probes::device::ab_json(fwd));
        println!("{}", serde_json::to_string_pretty(&v).expect("json"));
    } else {
        print_ab(fwd);
        println!(
            "  prompt rows: {:>4}  max |Δlogit| {:.3e}  top-1 {}/{}",
            r.prompt.rows,
            r.prompt.max_abs_diff(),
            r.prompt.agreeing(),
            r.prompt.rows
        );
        println!(
            "  decode steps:{:>4}  max |Δlogit| {:.3e}  top-1 {}/{}  (teacher-forced)",
            r.decode.rows,
            r.decode.max_abs_diff(),
            r.decode.agreeing(),
            r.decode.rows
        );
        println!(
            "  text control:{:>4}  max |Δlogit| {:.3e}  top-1 {}/{}",
            r.text.rows,
            text_max,
            r.text.agreeing(),
            r.text.rows
        );
        println!("  greedy ids (ours):      {:?}", r.greedy_ids);
        println!("  greedy ids (reference): {:?}", reference.greedy_ids);
        if let (Some(text), Some(reference_text)) = (&text, &reference_text) {
            if !answer.live {
                println!("  answer (ours):      {text:?}");
            }
            println!("  answer (reference): {reference_text:?}  (stop: {stop})");
        }
        println!(
            "  first divergence: {}   cosine {:.6}",
            first.map_or("none".to_string(), |s| format!("step {s}")),
            r.cosine
        );
        println!(
            "{}  (max |Δlogit| {max:.3e} <= {max_diff:e}, top-1 {top1:.4} >= {min_top1})",
            if pass { "PASS" } else { "FAIL" }
        );
    }
    std::process::exit(if pass { EXIT_PASS } else { EXIT_FAIL });
}

fn merge(v: &mut serde_json::Value, extra: serde_json::Value) {
    if let (Some(o), serde_json::Value::Object(e)) = (v.as_object_mut(), extra) {
        o.extend(e);
    }
}

fn print_ab(fwd: &Decoder) {
    if let Some(r) = fwd.runtime().ab_report() {
        println!(
            "  gemm ab: {} GEMMs, {} differ ({} values), max |Δ| {:.3e}{}",
            r.gemms,
            r.differing_gemms,
            r.differing_values,
            r.max_abs_diff,
            r.first_differing
                .map_or(String::new(), |w| format!(", first: {w}"))
        );
    }
}

/// With --gemm ab: every host/device difference within --ab-tolerance (0: none at all).
fn ab_pass(args: &Args, fwd: &Decoder) -> bool {
    fwd.runtime().ab_report().is_none_or(|r| {
        if args.ab_tolerance == 0.0 {
            r.differing_values == 0
        } else {
            r.max_abs_diff <= args.ab_tolerance
        }
    })
}
