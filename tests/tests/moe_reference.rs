//! The Qwen3-VL-MoE decoder beyond what `decoder_reference` checks on every case (f32 within 1e-3,
//! i8/q4 against their references, the dense controls): the MoE controls that must fail, routing
//! ties as torch.topk breaks them, and a batch equal to its rows fed one at a time.

use decoder::qwen3_vl::moe::torch_topk;
use decoder::{Ablation, DecoderOptions, HybridInputs, Logits};
use packs::stfile::StFile;
use packs::QuantKind;
use testkit::compare::max_abs_diff;
use xdna_vl_tests::{ablated, cases, fixtures, forward, options, Case};

const EXACT: f32 = 1e-3;

/// The committed MoE cases (`tests/fixtures/moe-*` with a checkpoint).
fn moe_cases() -> Vec<Case> {
    let out: Vec<Case> = cases()
        .iter()
        .filter(|n| n.starts_with("moe-"))
        .map(|n| Case::new(n))
        .collect();
    assert!(out.len() >= 2, "the MoE fixtures are missing");
    out
}

/// Replays `case` (a MoE f32 pack) with `ablation`; the worst |Δlogit| against transformers.
fn replayed(case: &Case, ablation: Ablation) -> f32 {
    let (_dir, pack) = case.pack(QuantKind::F32);
    assert!(
        pack.semantics().moe.is_some(),
        "{}: not a MoE pack",
        case.name
    );
    ablated(case, ablation)
}

#[test]
fn moe_controls_fail_and_the_right_path_passes() {
    for case in moe_cases() {
        let right = replayed(&case, Ablation::default());
        let controls = [
            (
                "top-k weights not renormalized",
                Ablation {
                    moe_skip_renormalize: true,
                    ..Ablation::default()
                },
            ),
            (
                "DeepStack skipped after sparse layers",
                Ablation {
                    deepstack_skip_sparse_layers: true,
                    ..Ablation::default()
                },
            ),
            (
                "experts' gate and up swapped",
                Ablation {
                    moe_swap_gate_up: true,
                    ..Ablation::default()
                },
            ),
        ];
        println!("{}: right path max |Δ| {right:.3e}", case.name);
        assert!(right <= EXACT, "{}: {right}", case.name);
        for (what, ablation) in controls {
            let worst = replayed(&case, ablation);
            println!("{}: {what}: max |Δ| {worst:.3e}", case.name);
            assert!(
                worst > 10.0 * EXACT,
                "{}: {what} went unnoticed ({worst})",
                case.name
            );
        }
    }
}

#[test]
fn routing_ties_follow_torch_topk() {
    // The case whose router has two zero rows: their experts tie in every row, and in some rows
    // the tie decides which of them is in the top k.
    let case = Case::new("moe-top4");
    let right = replayed(&case, Ablation::default());
    let lower = replayed(
        &case,
        Ablation {
            moe_ties_lower_index: true,
            ..Ablation::default()
        },
    );
    println!("moe-top4: torch.topk ties max |Δ| {right:.3e}, lower index first {lower:.3e}");
    assert!(right <= EXACT);
    assert!(
        lower > 10.0 * EXACT,
        "breaking ties by the lower index went unnoticed ({lower})"
    );

    // torch.topk itself on tie-heavy rows of many shapes.
    let st = StFile::open(fixtures().join("moe-topk/ties.safetensors")).unwrap();
    let mut shapes = 0;
    let mut rows_with_ties = 0;
    for n in 1..=128usize {
        for k in 1..=n {
            let name = format!("values_{n}_{k}");
            if !st.has(&name) {
                continue;
            }
            shapes += 1;
            let (values, dims) = st.f32(&name, 2).unwrap();
            let (want, _) = st.i64(&format!("indices_{n}_{k}"), 2).unwrap();
            let mut q = Vec::new();
            let mut got = vec![0usize; k];
            for (row, v) in values.chunks_exact(n).enumerate() {
                torch_topk(v, k, &mut q, &mut got);
                let want: Vec<usize> = want[row * k..(row + 1) * k]
                    .iter()
                    .map(|&i| i as usize)
                    .collect();
                assert_eq!(got, want, "n {n} k {k} row {row}: {v:?}");
                let mut sorted = v.to_vec();
                sorted.sort_by(f32::total_cmp);
                rows_with_ties += usize::from(sorted.windows(2).any(|w| w[0] == w[1]));
            }
            assert_eq!(dims, [values.len() / n, n]);
        }
    }
    println!("torch.topk: {shapes} shapes, {rows_with_ties} rows with ties, all equal");
    assert!(shapes >= 10 && rows_with_ties > 500);
}

#[test]
fn a_batch_equals_its_rows_fed_one_at_a_time() {
    for case in moe_cases() {
        let (_dir, pack) = case.pack(QuantKind::F32);
        let inputs = case.inputs();
        let mut fwd = forward(
            &pack,
            DecoderOptions {
                trace_layers: true,
                ..options()
            },
        );
        let h = fwd.semantics().hidden_size;
        let embeds = inputs.embeds(&fwd);
        let hybrid = inputs.hybrid();
        let rows = inputs.rows();
        let batched = fwd
            .step_batch_embeds(&embeds, &hybrid, 0, Logits::AllRows)
            .unwrap()
            .to_vec();
        let batch_routes = fwd.routes_trace().to_vec();
        let moe = fwd.semantics().moe.clone().unwrap();
        let top_k = moe.top_k;
        // The batch runs each chosen expert once (its weights read once), not once per row.
        let stats = fwd.take_moe_stats();
        let layers = moe.sparse_layers.len() as u64;
        assert_eq!(stats.routed_rows, rows as u64 * top_k as u64 * layers);
        assert!(stats.expert_runs <= layers * moe.num_experts as u64);
        assert!(stats.expert_runs < stats.routed_rows / 4, "{stats:?}");
        // Rows share experts: some expert serves several rows of the batch in every sparse layer.
        for routes in &batch_routes {
            let mut count = vec![0usize; 64];
            for &e in routes {
                count[e] += 1;
            }
            assert!(count.iter().any(|&c| c > 1));
        }
        fwd.reset();
        let vocab = fwd.semantics().vocab_size;
        let sets = hybrid.deepstack_sets;
        let n_img = hybrid.image_rows.len();
        let mut worst = 0.0f32;
        for r in 0..rows {
            let pos = hybrid.position(r, rows);
            let mut one = HybridInputs {
                planes: Some(pos.to_vec()),
                ..HybridInputs::default()
            };
            if let Some(i) = hybrid.image_rows.iter().position(|&x| x == r) {
                one.image_rows = vec![0];
                one.deepstack_sets = sets;
                for s in 0..sets {
                    let at = (s * n_img + i) * h;
                    one.deepstack
                        .extend_from_slice(&hybrid.deepstack[at..at + h]);
                }
            }
            let logits = fwd
                .step_batch_embeds(&embeds[r * h..(r + 1) * h], &one, r, Logits::LastRow)
                .unwrap();
            worst = worst.max(max_abs_diff(logits, &batched[r * vocab..(r + 1) * vocab]));
            // One row reads only its routed experts: top-k runs per sparse layer.
            assert_eq!(fwd.take_moe_stats().expert_runs, layers * top_k as u64);
            for (layer, routes) in fwd.routes_trace().iter().enumerate() {
                assert_eq!(
                    routes[..],
                    batch_routes[layer][r * top_k..(r + 1) * top_k],
                    "{}: row {r}, sparse layer #{layer}: routed differently alone",
                    case.name
                );
            }
        }
        println!(
            "{}: {rows} rows batched vs one at a time: same experts, max |Δlogit| {worst:.3e}",
            case.name
        );
        assert!(worst <= 1e-5, "{}: {worst}", case.name);
    }
}
