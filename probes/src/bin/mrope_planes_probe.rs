//! mrope_planes_probe: checks, on a pack's own model, that the three position planes and the
//! DeepStack sets are used, on the right axes.

use clap::Parser;
use compute::cli::RuntimeArgs;
use compute::ops::rope::{inv_freq, RopeLayout, PLANE_NAMES};
use decoder::{Decoder, HybridInputs, Logits};
use probes::cli::{self, EXIT_FAIL, EXIT_PASS};
use serde_json::json;
use std::path::PathBuf;
use testkit::compare::{count_differing, mean_abs_diff};

/// Checks the equal-plane identity, that image-style planes and DeepStack sets move the logits,
/// the axis assignment of every rotary frequency against transformers' rule, and the refusals.
///
/// One row per arm; exit status 0 only when every arm passes (1: an arm failed, 2: bad input).
#[derive(Parser)]
#[command(version)]
struct Args {
    /// The pack (default: the bundled tiny model, built on first use).
    pack: Option<PathBuf>,
    #[command(flatten)]
    gemm: RuntimeArgs,
    /// Print one JSON object instead of the table.
    #[arg(long)]
    json: bool,
}

/// Rows of the synthetic prompt.
const ROWS: usize = 16;
/// The image-style span inside it.
const SPAN: std::ops::Range<usize> = 4..12;

struct Arm {
    name: &'static str,
    status: &'static str, // "pass" | "fail" | "n/a"
    detail: String,
    data: serde_json::Value,
}

fn arm(name: &'static str, ok: bool, detail: String, data: serde_json::Value) -> Arm {
    Arm {
        name,
        status: if ok { "pass" } else { "fail" },
        detail,
        data,
    }
}

fn not_applicable(name: &'static str, why: &str) -> Arm {
    Arm {
        name,
        status: "n/a",
        detail: why.to_string(),
        data: json!(null),
    }
}

/// Deterministic ordinary token ids (no special ids).
fn synthetic_tokens(fwd: &Decoder) -> Vec<u32> {
    let sem = fwd.semantics();
    let special = [
        sem.image_token_id,
        sem.video_token_id,
        sem.vision_start_token_id,
        sem.vision_end_token_id,
    ];
    let vocab = sem.vocab_size as u64;
    let mut out = Vec::with_capacity(ROWS);
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    while out.len() < ROWS {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let t = ((state >> 33) % vocab) as u32;
        if !special.contains(&Some(t)) {
            out.push(t);
        }
    }
    out
}

fn embeds_of(fwd: &Decoder, tokens: &[u32]) -> Vec<f32> {
    let h = fwd.semantics().hidden_size;
    let mut out = vec![0.0; tokens.len() * h];
    for (row, &t) in out.chunks_exact_mut(h).zip(tokens) {
        fwd.embed_row(t, row);
    }
    out
}

fn run_embeds(fwd: &mut Decoder, embeds: &[f32], h: &HybridInputs) -> Result<Vec<f32>, String> {
    fwd.reset();
    fwd.step_batch_embeds(embeds, h, 0, Logits::AllRows)
        .map(|l| l.to_vec())
        .map_err(|e| e.to_string())
}

/// transformers' rule, written independently of the forward: start from the t angles and overwrite
/// h at `slice(1, 3*s[1], 3)` and w at `slice(2, 3*s[2], 3)` (interleaved, `apply_interleaved_mrope`),
/// or concatenate the per-plane splits of sizes s (contiguous, Qwen2-VL).
fn reference_angles(layout: RopeLayout, inv: &[f32], pos: [i64; 3]) -> Vec<f32> {
    let plane = |p: usize| -> Vec<f32> { inv.iter().map(|&f| pos[p] as f32 * f).collect() };
    let mut freqs = plane(0);
    match layout {
        RopeLayout::Plain => {}
        RopeLayout::Interleaved(s) => {
            for (dim, offset) in [(1usize, 1usize), (2, 2)] {
                let other = plane(dim);
                let end = (s[dim] * 3).min(freqs.len());
                for idx in (offset..end).step_by(3) {
                    freqs[idx] = other[idx];
                }
            }
        }
        RopeLayout::Contiguous(s) => {
            let mut start = 0;
            for (i, len) in s.iter().enumerate() {
                let other = plane(i % 3);
                let end = (start + len).min(freqs.len());
                freqs[start..end].copy_from_slice(&other[start..end]);
                start = end;
            }
        }
    }
    freqs
}

fn main() {
    let args = Args::parse();
    let pack_path = match &args.pack {
        Some(p) => p.clone(),
        None => {
            probes::bundled::bundled(probes::bundled::DEFAULT_CASE, packs::QuantKind::F32)
                .unwrap_or_else(|e| cli::refuse(e))
                .pack
        }
    };
    let pack = cli::open_pack(&pack_path);
    let mut fwd = cli::forward(&pack, &args.gemm, ROWS);
    let sem = fwd.semantics().clone();
    let layout = fwd.rotary().layout;
    let vocab = sem.vocab_size;
    let tokens = synthetic_tokens(&fwd);
    let embeds = embeds_of(&fwd, &tokens);
    let mut arms = Vec::new();
    let fail = |e: String| -> ! { cli::refuse(e) };

    // 1. Equal planes through the embeds path against the token path.
    fwd.reset();
    let token_logits = fwd
        .step_batch(&tokens, 0, 0, Logits::AllRows)
        .unwrap_or_else(|e| fail(e.to_string()))
        .to_vec();
    let equal = HybridInputs {
        planes: layout
            .is_mrope()
            .then(|| HybridInputs::equal_planes(ROWS, 0)),
        ..HybridInputs::text(0)
    };
    let equal_logits = run_embeds(&mut fwd, &embeds, &equal).unwrap_or_else(|e| fail(e));
    let differing = count_differing(&token_logits, &equal_logits);
    arms.push(arm(
        "equal planes vs token path",
        differing == 0,
        format!(
            "{differing} of {} logits differ (byte-identical required)",
            ROWS * vocab
        ),
        json!({"differing": differing, "compared": ROWS * vocab}),
    ));

    if layout.is_mrope() {
        // 2. Image-style planes on a span move the logits.
        let mut planes = HybridInputs::equal_planes(ROWS, 0);
        for r in SPAN {
            planes[ROWS + r] = (r / 2) as i64;
            planes[2 * ROWS + r] = (r % 2) as i64;
        }
        let image_style = HybridInputs {
            planes: Some(planes),
            ..HybridInputs::text(0)
        };
        let moved = run_embeds(&mut fwd, &embeds, &image_style).unwrap_or_else(|e| fail(e));
        let mean = mean_abs_diff(&moved, &equal_logits);
        arms.push(arm(
            "image-style planes move the logits",
            mean > 1e-6,
            format!("mean |Δlogit| = {mean:.6} (t = r, h = r/2, w = r%2 on rows {SPAN:?})"),
            json!({"mean_abs_delta": mean, "span": [SPAN.start, SPAN.end]}),
        ));

        // 3. Axis assignment of every frequency.
        let pos = [1000i64, 37, 5];
        let inv = inv_freq(sem.rope_theta, sem.head_dim);
        let mut ours = vec![0.0f32; sem.head_dim / 2];
        fwd.rotary().angles(pos, &mut ours);
        let expected = reference_angles(layout, &inv, pos);
        let mismatches = ours
            .iter()
            .zip(&expected)
            .filter(|(a, b)| a.to_bits() != b.to_bits())
            .count();
        let mut counts = [0usize; 3];
        for j in 0..sem.head_dim / 2 {
            counts[layout.plane_of(j)] += 1;
        }
        let section = sem.mrope_section.unwrap_or([0; 3]);
        let other = match layout {
            RopeLayout::Interleaved(_) => RopeLayout::Contiguous(section),
            _ => RopeLayout::Interleaved(section),
        };
        let other_reading = (0..sem.head_dim / 2)
            .filter(|&j| other.plane_of(j) != layout.plane_of(j))
            .count();
        // Control: the other reading's angles against the same reference must mismatch.
        let control = reference_angles(other, &inv, pos)
            .iter()
            .zip(&expected)
            .filter(|(a, b)| a.to_bits() != b.to_bits())
            .count();
        let rule = match layout {
            RopeLayout::Interleaved(_) => "interleaved",
            _ => "contiguous",
        };
        let other_name = if rule == "interleaved" {
            "contiguous"
        } else {
            "interleaved"
        };
        arms.push(arm(
            "axis assignment",
            mismatches == 0 && (other_reading == 0 || control > 0),
            format!(
                "{mismatches} of {} angles differ from transformers' {rule} rule at (t,h,w) = {pos:?}; \
                 planes {}={} {}={} {}={}; the {other_name} reading puts {other_reading} frequencies on another plane",
                ours.len(),
                PLANE_NAMES[0], counts[0], PLANE_NAMES[1], counts[1], PLANE_NAMES[2], counts[2],
            ),
            json!({"rule": rule, "mismatches": mismatches, "frequencies": ours.len(),
                   "plane_counts": {"t": counts[0], "h": counts[1], "w": counts[2]},
                   "other_reading": other_name, "other_reading_differs": other_reading,
                   "control_mismatches": control, "positions": pos}),
        ));
    } else {
        arms.push(not_applicable(
            "image-style planes move the logits",
            "the pack declares no MRoPE",
        ));
        arms.push(not_applicable(
            "axis assignment",
            "the pack declares no MRoPE",
        ));
    }

    // 4. MRoPE without sections is refused by name.
    let mut stripped = sem.clone();
    stripped.mrope = true;
    stripped.mrope_section = None;
    let refusal = stripped.validate().err().map(|e| e.to_string());
    let named = refusal
        .as_deref()
        .is_some_and(|m| m.contains("mrope_section"));
    arms.push(arm(
        "MRoPE without sections refused",
        named,
        match &refusal {
            Some(m) => format!("refused: {m}"),
            None => "accepted (a silently different model)".into(),
        },
        json!({"refusal": refusal}),
    ));

    // 5. DeepStack.
    if layout.is_mrope() && sem.deepstack_sets > 0 {
        let image_rows: Vec<usize> = SPAN.collect();
        let n = sem.deepstack_sets * image_rows.len() * sem.hidden_size;
        let mut state = 12345u32;
        let sets: Vec<f32> = (0..n)
            .map(|_| {
                state = state.wrapping_mul(1664525).wrapping_add(1013904223);
                (state >> 8) as f32 / (1u32 << 24) as f32 - 0.5
            })
            .collect();
        let with = HybridInputs {
            planes: Some(HybridInputs::equal_planes(ROWS, 0)),
            image_rows: image_rows.clone(),
            deepstack: sets.clone(),
            deepstack_sets: sem.deepstack_sets,
            start_pos: 0,
        };
        let zero = HybridInputs {
            deepstack: vec![0.0; n],
            ..with.clone()
        };
        let a = run_embeds(&mut fwd, &embeds, &with).unwrap_or_else(|e| fail(e));
        let b = run_embeds(&mut fwd, &embeds, &zero).unwrap_or_else(|e| fail(e));
        let mean = mean_abs_diff(&a, &b);
        let wrong_count = HybridInputs {
            deepstack_sets: sem.deepstack_sets + 1,
            deepstack: [sets.clone(), vec![0.0; n / sem.deepstack_sets]].concat(),
            ..with.clone()
        };
        let outside = HybridInputs {
            image_rows: (ROWS - 2..ROWS + image_rows.len() - 2).collect(),
            ..with.clone()
        };
        let wrong = run_embeds(&mut fwd, &embeds, &wrong_count).err();
        let out = run_embeds(&mut fwd, &embeds, &outside).err();
        let ok = mean > 1e-6
            && wrong.as_deref().is_some_and(|m| m.contains("DeepStack"))
            && out
                .as_deref()
                .is_some_and(|m| m.contains("outside the prompt"));
        arms.push(arm(
            "DeepStack used and checked",
            ok,
            format!(
                "sets vs none: mean |Δlogit| = {mean:.6}; wrong set count: {}; span outside the prompt: {}",
                wrong.as_deref().unwrap_or("ACCEPTED"),
                out.as_deref().unwrap_or("ACCEPTED")
            ),
            json!({"mean_abs_delta": mean, "wrong_set_count_refusal": wrong, "outside_span_refusal": out}),
        ));
    } else {
        arms.push(not_applicable(
            "DeepStack used and checked",
            "the pack declares no MRoPE or no DeepStack sets",
        ));
    }

    let passed = arms.iter().all(|a| a.status != "fail");
    if args.json {
        let v = json!({
            "pack": pack_path.display().to_string(),
            "gemm": args.gemm.gemm.as_str(),
            "rope_layout": format!("{layout:?}"),
            "pass": passed,
            "arms": arms.iter().map(|a| json!({"arm": a.name, "status": a.status, "detail": a.detail, "data": a.data})).collect::<Vec<_>>(),
        });
        println!("{}", serde_json::to_string_pretty(&v).expect("json"));
    } else {
        println!(
            "mrope_planes_probe  {}  ({layout:?}, gemm {:?})",
            pack_path.display(),
            args.gemm.gemm
        );
        for (i, a) in arms.iter().enumerate() {
            println!(
                "{}. {:<36} {:<5} {}",
                i + 1,
                a.name,
                a.status.to_uppercase(),
                a.detail
            );
        }
        println!("{}", if passed { "PASS" } else { "FAIL" });
    }
    std::process::exit(if passed { EXIT_PASS } else { EXIT_FAIL });
}
