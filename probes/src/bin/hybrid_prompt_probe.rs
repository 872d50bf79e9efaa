//! hybrid_prompt_probe: runs a prompt with image rows through the decoder, greedy-decodes, and
//! compares against a transformers reference.

use clap::Parser;
use forward::sampling::{argmax, top_k};
use forward::{Forward, Logits, PromptInputs};
use packs::QuantKind;
use probes::cli::{self, GemmArgs, EXIT_FAIL, EXIT_PASS};
use probes::Reference;
use serde_json::json;
use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;

/// Runs a `hybrid-inputs/1` prompt (text rows, image rows, position planes, DeepStack sets) through
/// the pack's decoder: prefill, then greedy tokens, each at cache slot `rows + i` and rotary position
/// `max(position) + 1 + i`.
///
/// With --reference, decode steps are fed the reference's greedy ids (teacher forcing) and every
/// prompt row and step is compared; exit status 0 only when the comparison passes (1: it failed,
/// 2: bad input). With no arguments it runs the bundled tiny model, prompt and reference.
#[derive(Parser)]
#[command(version)]
struct Args {
    /// The pack (default: the bundled tiny model, built on first use).
    pack: Option<PathBuf>,
    /// The prompt, a hybrid-inputs/1 file (default: the bundled prompt).
    inputs: Option<PathBuf>,
    /// Greedy tokens to generate (with --reference: at most the reference's count).
    #[arg(long, default_value_t = 8)]
    decode: usize,
    /// Print the K largest logits after the prompt and after each step.
    #[arg(long, value_name = "K")]
    top_k: Option<usize>,
    /// A reference*.safetensors to compare against (default with no pack: the bundled one).
    #[arg(long, value_name = "REF")]
    reference: Option<PathBuf>,
    /// Largest max |Δlogit| that passes (default: 1e-3 for f32/bf16 packs, 0.1 for i8/q4).
    #[arg(long)]
    max_diff: Option<f32>,
    /// Smallest top-1 agreement that passes (default: 1.0 for f32/bf16 packs, 0.97 for i8/q4).
    #[arg(long)]
    min_top1: Option<f64>,
    /// KV cache slots (default: the prompt rows plus the decode steps).
    #[arg(long, value_name = "SLOTS")]
    context: Option<usize>,
    #[command(flatten)]
    gemm: GemmArgs,
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
    let rows = inputs.rows();
    let steps = match &reference {
        Some(r) => r.greedy_ids.len().min(args.decode.max(1)),
        None => args.decode,
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
    let max_diff = args.max_diff.unwrap_or(if exact { 1e-3 } else { 0.1 });
    let min_top1 = args.min_top1.unwrap_or(if exact { 1.0 } else { 0.97 });

    if let Some(reference) = reference {
        let mut reference = reference;
        reference.greedy_ids.truncate(steps);
        reference
            .decode_logits
            .truncate((steps - 1) * reference.vocab);
        compare(
            &args, &mut fwd, &inputs, &reference, max_diff, min_top1, &pack_path,
        );
    } else {
        generate(&args, &mut fwd, &inputs, steps, &pack_path);
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

fn profile_line(args: &Args, fwd: &mut Forward, label: &str, rows: usize, t: Instant) {
    if args.profile && !args.json {
        let s = fwd.backend_mut().take_stats();
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
    fwd: &mut Forward,
    inputs: &PromptInputs,
    steps: usize,
    pack: &std::path::Path,
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
    if !args.json {
        print!("generated: {}", ids[0]);
        let _ = std::io::stdout().flush();
    }
    let next_pos = inputs.next_rotary_pos();
    for i in 0..steps.saturating_sub(1) {
        let t = Instant::now();
        let logits = fwd
            .step(ids[i], next_pos + i as i64, rows + i)
            .unwrap_or_else(|e| cli::refuse(e))
            .to_vec();
        let id = argmax(&logits);
        ids.push(id);
        if !args.json {
            print!(" {id}");
            let _ = std::io::stdout().flush();
        }
        profile_line(args, fwd, &format!("step {}", i + 1), 1, t);
        print_top_k(args, &format!("after step {}", i + 1), &logits);
    }
    let pass = ab_pass(args, fwd);
    if args.json {
        let mut v = json!({"pack": pack.display().to_string(), "greedy_ids": ids, "pass": pass});
        merge(&mut v, probes::device::ab_json(fwd));
        println!("{v}");
    } else {
        println!();
        print_ab(fwd);
    }
    std::process::exit(if pass { EXIT_PASS } else { EXIT_FAIL });
}

fn compare(
    args: &Args,
    fwd: &mut Forward,
    inputs: &PromptInputs,
    reference: &Reference,
    max_diff: f32,
    min_top1: f64,
    pack: &std::path::Path,
) {
    if !args.json {
        println!(
            "hybrid_prompt_probe  {}  {}  ({} rows, {} image rows)  vs  {}",
            pack.display(),
            inputs.path.display(),
            inputs.rows(),
            inputs.image_rows().len(),
            reference.path.display()
        );
    }
    let mut t = Instant::now();
    let rows = inputs.rows();
    let r = probes::replay(fwd, inputs, reference, |step, _id, logits, fwd| {
        let (label, step_rows) = match step {
            0 => ("prefill".to_string(), rows),
            s => (format!("step {s}"), 1),
        };
        profile_line(args, fwd, &label, step_rows, t);
        print_top_k(args, &format!("after {label}"), logits);
        t = Instant::now();
    })
    .unwrap_or_else(|e| cli::refuse(e));
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
            "gemm": args.gemm.gemm,
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

fn print_ab(fwd: &Forward) {
    if let Some(r) = fwd.backend().ab_report() {
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
fn ab_pass(args: &Args, fwd: &Forward) -> bool {
    fwd.backend().ab_report().is_none_or(|r| {
        if args.ab_tolerance == 0.0 {
            r.differing_values == 0
        } else {
            r.max_abs_diff <= args.ab_tolerance
        }
    })
}
