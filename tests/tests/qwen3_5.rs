//! Qwen3.5 beyond the shared reference checks (`decoder_reference.rs` runs every case, these
//! included): the controls the family's own mistakes must trip, a prompt prefilled whole, in
//! slices and row by row, and a verified window's rollback of the recurrent state.

use decoder::{decode_step, Ablation, Decoder, DecoderOptions, Logits};
use packs::QuantKind;
use testkit::compare::max_abs_diff;
use xdna_vl_tests::{ablated, cases, forward, options, Case};

const EXACT: f32 = 1e-3;

fn qwen3_5_cases() -> Vec<Case> {
    let out: Vec<Case> = cases()
        .iter()
        .map(|n| Case::new(n))
        .filter(|c| {
            let cfg = std::fs::read_to_string(c.checkpoint().join("config.json")).unwrap();
            cfg.contains("\"qwen3_5\"")
        })
        .collect();
    assert!(out.len() >= 2, "the Qwen3.5 fixtures are missing");
    out
}

fn argmax(x: &[f32]) -> usize {
    let mut best = 0;
    for (i, &v) in x.iter().enumerate() {
        if v > x[best] {
            best = i;
        }
    }
    best
}

#[test]
fn controls_each_family_mistake_is_caught() {
    let mistakes: [(&str, Ablation); 5] = [
        (
            "norm without its +1",
            Ablation {
                norm_without_one: true,
                ..Ablation::default()
            },
        ),
        (
            "attention output gate skipped",
            Ablation {
                skip_attention_gate: true,
                ..Ablation::default()
            },
        ),
        (
            "conv state one row behind",
            Ablation {
                conv_state_lags_one_row: true,
                ..Ablation::default()
            },
        ),
        (
            "decay without softplus",
            Ablation {
                decay_without_softplus: true,
                ..Ablation::default()
            },
        ),
        (
            "rotary over every dim",
            Ablation {
                rotary_all_dims: true,
                ..Ablation::default()
            },
        ),
    ];
    for case in qwen3_5_cases() {
        // Without a mistake the same harness is within the tolerance.
        let clean = ablated(&case, Ablation::default());
        assert!(clean <= EXACT, "{}: clean run {clean}", case.name);
        for (what, ablation) in mistakes {
            let worst = ablated(&case, ablation);
            println!("{}: {what}: max |Δ| {worst:.3e}", case.name);
            assert!(
                worst > 10.0 * EXACT,
                "{}: {what} went unnoticed ({worst})",
                case.name
            );
        }
    }
}

/// The prompt's last-row logits and the greedy decode after it (teacher-forced on the
/// reference ids), prefilled in slices of `slice` rows.
fn prefill_then_decode(f: &mut Decoder, case: &Case, slice: usize) -> Vec<Vec<f32>> {
    let inputs = case.inputs();
    let reference = case.reference(QuantKind::F32);
    let rows = inputs.rows();
    let hidden = f.semantics().hidden_size;
    let embeds = inputs.embeds(f);
    let hybrid = inputs.hybrid();
    f.reset();
    let mut out = Vec::new();
    let mut first = 0;
    while first < rows {
        let n = slice.min(rows - first);
        let part = hybrid.slice_rows(first, n, rows, hidden);
        let logits = f
            .step_batch_embeds(
                &embeds[first * hidden..(first + n) * hidden],
                &part,
                first,
                Logits::LastRow,
            )
            .unwrap();
        if first + n == rows {
            out.push(logits.to_vec());
        }
        first += n;
    }
    let mut pos = inputs.next_rotary_pos();
    for &id in &reference.greedy_ids[..reference.greedy_ids.len() - 1] {
        out.push(decode_step(f, id as u32, &mut pos).unwrap().to_vec());
    }
    out
}

#[test]
fn a_prompt_prefilled_whole_in_slices_or_row_by_row_decodes_the_same() {
    for case in qwen3_5_cases() {
        let (_dir, pack) = case.pack(QuantKind::F32);
        let mut f = forward(&pack, options());
        let whole = prefill_then_decode(&mut f, &case, usize::MAX);
        let rows = case.inputs().rows();
        // 17-row slices end mid-image and cross row 64 (transformers' chunk) on q35-odd.
        for slice in [17, 1] {
            let sliced = prefill_then_decode(&mut f, &case, slice);
            for (i, (a, b)) in whole.iter().zip(&sliced).enumerate() {
                let d = max_abs_diff(a, b);
                assert!(
                    d <= 1e-5,
                    "{}: {slice}-row slices of {rows}: row {i} max |Δ| {d}",
                    case.name
                );
                assert_eq!(argmax(a), argmax(b), "{}: row {i}", case.name);
            }
        }
    }
}

/// Prefills the prompt; returns the decoder and the rotary position of the next row.
fn prefilled(case: &Case, f: &mut Decoder) -> i64 {
    let inputs = case.inputs();
    let embeds = inputs.embeds(f);
    f.reset();
    f.step_batch_embeds(&embeds, &inputs.hybrid(), 0, Logits::LastRow)
        .unwrap();
    inputs.next_rotary_pos()
}

/// A window of the three reference ids and two wrong drafts; `keep` rows are kept, then the
/// reference decode goes on. Returns the worst |Δ| against the reference decode logits.
fn window_then_decode(case: &Case, f: &mut Decoder, keep: usize) -> f32 {
    let reference = case.reference(QuantKind::F32);
    let vocab = reference.vocab;
    let ids: Vec<u32> = reference.greedy_ids.iter().map(|&t| t as u32).collect();
    let mut pos = prefilled(case, f);
    let slot = f.next_slot();
    let wrong = |t: u32| (t + 1) % vocab as u32;
    let window = [ids[0], ids[1], ids[2], wrong(ids[3]), wrong(ids[4])];
    let logits = f
        .step_batch(&window, pos, slot, Logits::AllRows)
        .unwrap()
        .to_vec();
    let mut worst = 0f32;
    for r in 0..3 {
        let expected = &reference.decode_logits[r * vocab..(r + 1) * vocab];
        worst = worst.max(max_abs_diff(&logits[r * vocab..(r + 1) * vocab], expected));
    }
    assert_eq!(f.truncate(slot + keep), slot + keep, "{}", case.name);
    pos += 3; // the kept ids' positions, as the engine rolls back
    for (i, &id) in ids.iter().enumerate().take(ids.len() - 1).skip(3) {
        let got = decode_step(f, id, &mut pos).unwrap();
        let expected = &reference.decode_logits[i * vocab..(i + 1) * vocab];
        worst = worst.max(max_abs_diff(got, expected));
    }
    worst
}

#[test]
fn a_window_rolled_back_to_its_kept_rows_decodes_as_without_drafts() {
    for case in qwen3_5_cases() {
        let (_dir, pack) = case.pack(QuantKind::F32);
        let mut f = forward(&pack, options());
        let worst = window_then_decode(&case, &mut f, 3);
        println!(
            "{}: window kept 3 of 5 rows: max |Δ| {worst:.3e}",
            case.name
        );
        assert!(worst <= EXACT, "{}: {worst}", case.name);
        // Control: a window rolled back one row short (the state after 2 rows) is caught.
        let short = window_then_decode_short(&case, &mut f);
        println!("{}: one row short: max |Δ| {short:.3e}", case.name);
        assert!(short > 10.0 * EXACT, "{}: {short}", case.name);
    }
}

/// The control: the state kept after two rows of the window while the positions and the decode
/// go on as if three were kept.
fn window_then_decode_short(case: &Case, f: &mut Decoder) -> f32 {
    let reference = case.reference(QuantKind::F32);
    let vocab = reference.vocab;
    let ids: Vec<u32> = reference.greedy_ids.iter().map(|&t| t as u32).collect();
    let mut pos = prefilled(case, f);
    let slot = f.next_slot();
    let window = [ids[0], ids[1], ids[2], ids[3], ids[4]];
    f.step_batch(&window, pos, slot, Logits::AllRows).unwrap();
    assert_eq!(f.truncate(slot + 2), slot + 2);
    pos += 3;
    let mut worst = 0f32;
    for (i, &id) in ids.iter().enumerate().take(ids.len() - 1).skip(3) {
        let got = decode_step(f, id, &mut pos).unwrap();
        worst = worst.max(max_abs_diff(
            got,
            &reference.decode_logits[i * vocab..(i + 1) * vocab],
        ));
    }
    worst
}

#[test]
fn a_cut_the_recurrent_state_cannot_make_forgets_everything() {
    let case = &qwen3_5_cases()[0];
    let (_dir, pack) = case.pack(QuantKind::F32);
    let mut f = forward(&pack, options());
    let pos = prefilled(case, &mut f);
    let slot = f.next_slot();
    f.step_batch(&[1, 2, 3], pos, slot, Logits::LastRow)
        .unwrap();
    // Inside the last step: kept.
    assert_eq!(f.truncate(slot + 2), slot + 2);
    // Before it (inside the prompt): the state is gone, and the cache says so.
    assert_eq!(f.truncate(slot - 5), 0);
    assert_eq!(f.next_slot(), 0);
    // Control: a Qwen3-VL cache cuts anywhere.
    let vl = Case::new("hd128");
    let (_d, vl_pack) = vl.pack(QuantKind::F32);
    let mut g = forward(&vl_pack, DecoderOptions { ..options() });
    prefilled(&vl, &mut g);
    assert_eq!(g.truncate(5), 5);
}

/// The MTP head's teacher-forced inputs for the prompt and the fed greedy ids: every row's final
/// hidden state (prefilled whole, then the greedy ids as one step), the embedding fed after each
/// row, and the rows' planes.
fn mtp_inputs(case: &Case, f: &mut Decoder) -> (Vec<f32>, Vec<f32>, decoder::HybridInputs) {
    let inputs = case.inputs();
    let reference = case.reference(QuantKind::F32);
    let ids: Vec<u32> = reference.greedy_ids.iter().map(|&t| t as u32).collect();
    let h = f.semantics().hidden_size;
    let rows = inputs.rows();
    let prompt = inputs.embeds(f);
    f.keep_last_hidden(true);
    f.reset();
    f.step_batch_embeds(&prompt, &inputs.hybrid(), 0, Logits::LastRow)
        .unwrap();
    let mut hidden = f.last_hidden().to_vec();
    let pos = inputs.next_rotary_pos();
    f.step_batch(&ids[..ids.len() - 1], pos, rows, Logits::LastRow)
        .unwrap();
    hidden.extend_from_slice(f.last_hidden());
    // Row j reads the embedding fed at row j + 1 (image rows: their image embedding).
    let mut embeds = prompt[h..].to_vec();
    let mut row = vec![0.0; h];
    for &id in &ids {
        f.embed_row(id, &mut row);
        embeds.extend_from_slice(&row);
    }
    let n = rows + ids.len() - 1;
    let planes_in = inputs.hybrid();
    let mut planes = vec![0i64; 3 * n];
    for r in 0..n {
        let p = if r < rows {
            planes_in.position(r, rows)
        } else {
            [pos + (r - rows) as i64; 3]
        };
        for (k, v) in p.iter().enumerate() {
            planes[k * n + r] = *v;
        }
    }
    let mut hybrid = decoder::HybridInputs::text(0);
    hybrid.planes = Some(planes);
    (hidden, embeds, hybrid)
}

#[test]
fn the_mtp_head_matches_its_reference_whole_and_row_by_row() {
    let mut checked = 0;
    // Every case with a head: the dense Qwen3.5 ones and the MoE one (qwen3_5_moe).
    for case in cases().iter().map(|n| Case::new(n)) {
        let path = case.dir.join("reference-mtp.safetensors");
        if !path.exists() {
            continue;
        }
        let st = packs::stfile::StFile::open(&path).unwrap();
        let (expected, shape) = st.f32("mtp_logits", 2).unwrap();
        let (_dir, pack) = case.pack(QuantKind::F32);
        let mut f = forward(&pack, options());
        assert!(f.has_mtp(), "{}: the pack left the MTP head out", case.name);
        let (hidden, embeds, hybrid) = mtp_inputs(&case, &mut f);
        let h = f.semantics().hidden_size;
        let n = embeds.len() / h;
        assert_eq!(shape, [n, f.semantics().vocab_size]);
        let mut cache = f.new_mtp_cache(256, decoder::KvDtype::F32);
        let whole = f
            .mtp_step(&mut cache, &hidden, &embeds, &hybrid, Logits::AllRows)
            .unwrap()
            .to_vec();
        let d = max_abs_diff(&whole, &expected);
        println!("{}: MTP logits of {n} rows max |Δ| {d:.3e}", case.name);
        assert!(d <= EXACT, "{}: {d}", case.name);
        // Row by row (as drafting feeds it) gives the same rows.
        let mut cache = f.new_mtp_cache(256, decoder::KvDtype::F32);
        let vocab = f.semantics().vocab_size;
        for r in 0..n {
            let one = hybrid.slice_rows(r, 1, n, h);
            let got = f
                .mtp_step(
                    &mut cache,
                    &hidden[r * h..(r + 1) * h],
                    &embeds[r * h..(r + 1) * h],
                    &one,
                    Logits::LastRow,
                )
                .unwrap();
            let d = max_abs_diff(got, &expected[r * vocab..(r + 1) * vocab]);
            assert!(d <= EXACT, "{}: row {r}: {d}", case.name);
        }
        // Control: each row reading the next row's hidden state is caught.
        let mut cache = f.new_mtp_cache(256, decoder::KvDtype::F32);
        let mut shifted = hidden[h..].to_vec();
        shifted.extend_from_slice(&hidden[(n - 1) * h..]);
        let wrong = f
            .mtp_step(&mut cache, &shifted, &embeds, &hybrid, Logits::AllRows)
            .unwrap();
        assert!(max_abs_diff(wrong, &expected) > 10.0 * EXACT);
        checked += 1;
    }
    // q35-odd and q35-hd256 (dense), q35-moe-mtp (the head's MLP routed).
    assert!(checked >= 3, "an MTP fixture is missing");
}

/// `--draft-vocab`: the MTP head's logits over the first ids only are those ids' logits of the
/// whole head, bit for bit, on a q4 pack (whose prefix must be whole 16-row panels) and an f32
/// one; a count between panels rounds up. Control: the same count of rows taken one panel later
/// differs.
#[test]
fn the_mtp_head_over_the_first_ids_gives_their_logits_of_the_whole_head() {
    let case = Case::new("q35-odd");
    for kind in [QuantKind::Q4, QuantKind::F32] {
        let (_dir, pack) = case.pack(kind);
        let mut f = forward(&pack, options());
        let (hidden, embeds, hybrid) = mtp_inputs(&case, &mut f);
        let vocab = f.semantics().vocab_size;
        let n = embeds.len() / f.semantics().hidden_size;
        let whole = mtp_logits(&mut f, &hidden, &embeds, &hybrid);
        assert!(
            vocab > 48,
            "{}: a vocabulary of {vocab} has no prefix to test",
            case.name
        );
        assert_eq!(
            f.set_mtp_vocab(40).unwrap(),
            48,
            "40 ids round up to 3 panels"
        );
        let first = mtp_logits(&mut f, &hidden, &embeds, &hybrid);
        assert_eq!(first.len(), n * 48);
        let rows_of = |from: usize| -> Vec<f32> {
            (0..n)
                .flat_map(|r| {
                    whole[r * vocab + from..r * vocab + from + 48]
                        .iter()
                        .copied()
                })
                .collect()
        };
        assert_eq!(first, rows_of(0), "{kind}: the first 48 ids' logits");
        assert_ne!(first, rows_of(16), "{kind}: control, one panel later");
        // Back to all of them (more than the vocabulary is all of it).
        assert_eq!(f.set_mtp_vocab(usize::MAX).unwrap(), vocab);
        assert_eq!(mtp_logits(&mut f, &hidden, &embeds, &hybrid), whole);
    }
}

/// A chained MTP draft reads the head's output row of its last step (`Decoder::mtp_hidden`): after
/// a step of many rows (a prompt's catch-up), a one-row step's output is that one row, the row a
/// decoder that never ran the larger step gives. Before, the buffer kept its largest size and a
/// chained draft read a stale row of an earlier step (found by comparing a conversation's drafts
/// beside others and alone in `serve`).
#[test]
fn the_mtp_heads_output_is_its_last_steps_rows() {
    let case = Case::new("q35-odd");
    let (_dir, pack) = case.pack(QuantKind::F32);
    let mut f = forward(&pack, options());
    let (hidden, embeds, hybrid) = mtp_inputs(&case, &mut f);
    let h = f.semantics().hidden_size;
    let n = embeds.len() / h;
    assert!(n > 1);
    let mut fresh = forward(&pack, options());
    let one = hybrid.slice_rows(0, 1, n, h);
    let last_row = |f: &mut Decoder| {
        let mut cache = f.new_mtp_cache(16, decoder::KvDtype::F32);
        f.mtp_step(
            &mut cache,
            &hidden[..h],
            &embeds[..h],
            &one,
            Logits::LastRow,
        )
        .unwrap();
        f.mtp_hidden().to_vec()
    };
    mtp_logits(&mut f, &hidden, &embeds, &hybrid);
    assert_eq!(f.mtp_hidden().len(), n * h, "the many-row step's rows");
    let after = last_row(&mut f);
    assert_eq!(after.len(), h, "one row after a step of {n}");
    assert_eq!(after, last_row(&mut fresh));
}

/// `serve --drafts mtp` runs every conversation's MTP step in one (`Decoder::mtp_step_sequences`):
/// each sequence's logits and output rows are bit for bit its own step's alone, on a q4 pack (its
/// GEMMs over several rows) and an f32 one, over a catch-up of many rows and a chained row after
/// it. Control: the chained rows run against each other's head caches differ.
#[test]
fn the_mtp_head_over_several_sequences_is_each_alone() {
    use decoder::{KvCache, MtpSequenceStep};
    let case = Case::new("q35-odd");
    for kind in [QuantKind::Q4, QuantKind::F32] {
        let (_dir, pack) = case.pack(kind);
        let mut f = forward(&pack, options());
        let (hidden, embeds, hybrid) = mtp_inputs(&case, &mut f);
        let h = f.semantics().hidden_size;
        let n = embeds.len() / h;
        assert!(n > 3);
        // Sequence a: every row; b: the first n - 2. Then one chained row each, at its next
        // position, reading the other's first row (inputs differ between the two).
        let rows_of = |m: usize| {
            (
                &hidden[..m * h],
                &embeds[..m * h],
                hybrid.slice_rows(0, m, n, h),
            )
        };
        let (a, b) = (rows_of(n), rows_of(n - 2));
        let chained = |m: usize| decoder::HybridInputs {
            planes: Some(vec![m as i64 + 5; 3]),
            ..decoder::HybridInputs::default()
        };
        let (ca, cb) = (chained(n), chained(n - 2));
        let next = [
            (&hidden[h..2 * h], &embeds[..h]),
            (&hidden[..h], &embeds[h..2 * h]),
        ];
        let new_cache = |f: &Decoder| f.new_mtp_cache(n + 1, decoder::KvDtype::F32);
        // Alone: (catch-up logits of every row, output rows; chained row's logits, output row).
        let mut alone = Vec::new();
        for (i, (hs, es, hy)) in [&a, &b].into_iter().enumerate() {
            let mut cache = new_cache(&f);
            let l1 = f
                .mtp_step(&mut cache, hs, es, hy, Logits::AllRows)
                .unwrap()
                .to_vec();
            let o1 = f.mtp_hidden().to_vec();
            let hy2 = [&ca, &cb][i];
            let l2 = f
                .mtp_step(&mut cache, next[i].0, next[i].1, hy2, Logits::LastRow)
                .unwrap()
                .to_vec();
            alone.push((l1, o1, l2, f.mtp_hidden().to_vec()));
        }
        let together = |f: &mut Decoder, swapped: bool| {
            let (mut c0, mut c1): (KvCache, KvCache) = (new_cache(f), new_cache(f));
            let mut steps = [
                MtpSequenceStep {
                    cache: &mut c0,
                    hidden: a.0,
                    embeds: a.1,
                    hybrid: &a.2,
                    logits: Logits::AllRows,
                },
                MtpSequenceStep {
                    cache: &mut c1,
                    hidden: b.0,
                    embeds: b.1,
                    hybrid: &b.2,
                    logits: Logits::AllRows,
                },
            ];
            let out = f.mtp_step_sequences(&mut steps).unwrap();
            let l1 = [out.of(0).to_vec(), out.of(1).to_vec()];
            let o1 = f.mtp_hidden().to_vec();
            let (first, second) = if swapped {
                (&mut c1, &mut c0)
            } else {
                (&mut c0, &mut c1)
            };
            let mut steps = [
                MtpSequenceStep {
                    cache: first,
                    hidden: next[0].0,
                    embeds: next[0].1,
                    hybrid: &ca,
                    logits: Logits::LastRow,
                },
                MtpSequenceStep {
                    cache: second,
                    hidden: next[1].0,
                    embeds: next[1].1,
                    hybrid: &cb,
                    logits: Logits::LastRow,
                },
            ];
            let out = f.mtp_step_sequences(&mut steps).unwrap();
            let l2 = [out.of(0).to_vec(), out.of(1).to_vec()];
            (l1, o1, l2, f.mtp_hidden().to_vec())
        };
        let (l1, o1, l2, o2) = together(&mut f, false);
        for i in 0..2 {
            assert_eq!(l1[i], alone[i].0, "{kind}: sequence {i}'s catch-up logits");
            assert_eq!(l2[i], alone[i].2, "{kind}: sequence {i}'s chained logits");
        }
        assert_eq!(
            o1,
            [&alone[0].1[..], &alone[1].1[..]].concat(),
            "{kind}: catch-up rows"
        );
        assert_eq!(
            o2,
            [&alone[0].3[..], &alone[1].3[..]].concat(),
            "{kind}: chained rows"
        );
        let (_, _, wrong, _) = together(&mut f, true);
        assert_ne!(
            wrong[0], alone[0].2,
            "{kind}: control, a's row against b's cache"
        );
        assert_ne!(
            wrong[1], alone[1].2,
            "{kind}: control, b's row against a's cache"
        );
    }
}

/// The head's logits over `hidden` / `embeds` (all rows, a fresh head cache).
fn mtp_logits(
    f: &mut Decoder,
    hidden: &[f32],
    embeds: &[f32],
    hybrid: &decoder::HybridInputs,
) -> Vec<f32> {
    let mut cache = f.new_mtp_cache(256, decoder::KvDtype::F32);
    f.mtp_step(&mut cache, hidden, embeds, hybrid, Logits::AllRows)
        .unwrap()
        .to_vec()
}

/// A copy of `case`'s checkpoint with rows `a` and `b` of its tensor `name` swapped (in whichever
/// safetensors file holds it).
fn checkpoint_with_rows_swapped(case: &Case, name: &str, a: usize, b: usize) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let mut swapped = false;
    for entry in std::fs::read_dir(case.checkpoint()).unwrap() {
        let path = entry.unwrap().path();
        let mut bytes = std::fs::read(&path).unwrap();
        if path.extension().and_then(|e| e.to_str()) == Some("safetensors") {
            let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
            let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
            if let Some(e) = header.get(name) {
                let [start, end] = [0, 1].map(|i| e["data_offsets"][i].as_u64().unwrap() as usize);
                let rows = e["shape"][0].as_u64().unwrap() as usize;
                let row = (end - start) / rows;
                let data = &mut bytes[8 + n + start..8 + n + end];
                for i in 0..row {
                    data.swap(a * row + i, b * row + i);
                }
                swapped = true;
            }
        }
        std::fs::write(dir.path().join(path.file_name().unwrap()), bytes).unwrap();
    }
    assert!(swapped, "{name} is not in {}", case.checkpoint().display());
    dir
}

/// A MoE checkpoint's MTP head (issue 35): its layer's MLP routes like the model's layers (router,
/// top-k experts, the shared expert behind its sigmoid gate), read from the head's fused experts
/// while the model's are per expert. Controls, each on the clean model's inputs so that only the
/// head's layer can differ: the shared expert's gate skipped, the experts' gate and up swapped,
/// the top-k weights not renormalized, and the head's router rows 0 and 1 swapped in the
/// checkpoint (its rows routed to the wrong experts; the model's hidden states unchanged).
#[test]
fn the_moe_mtp_head_routes_its_mlp_and_each_routing_mistake_is_caught() {
    let case = Case::new("q35-moe-mtp");
    let st = packs::stfile::StFile::open(case.dir.join("reference-mtp.safetensors")).unwrap();
    let (expected, _) = st.f32("mtp_logits", 2).unwrap();
    let (_dir, pack) = case.pack(QuantKind::F32);
    assert!(pack.semantics().moe.is_some(), "the case is not a MoE pack");
    let mut f = forward(&pack, options());
    assert!(f.has_mtp(), "the MoE pack left the MTP head out");
    let (hidden, embeds, hybrid) = mtp_inputs(&case, &mut f);
    let clean = max_abs_diff(&mtp_logits(&mut f, &hidden, &embeds, &hybrid), &expected);
    println!("{}: MoE MTP logits max |Δ| {clean:.3e}", case.name);
    assert!(clean <= EXACT, "clean run {clean}");
    let mistakes: [(&str, Ablation); 3] = [
        (
            "shared expert without its gate",
            Ablation {
                moe_skip_shared_gate: true,
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
        (
            "top-k weights not renormalized",
            Ablation {
                moe_skip_renormalize: true,
                ..Ablation::default()
            },
        ),
    ];
    for (what, ablation) in mistakes {
        let mut g = forward(
            &pack,
            DecoderOptions {
                ablation,
                ..options()
            },
        );
        let d = max_abs_diff(&mtp_logits(&mut g, &hidden, &embeds, &hybrid), &expected);
        println!("{}: {what}: max |Δ| {d:.3e}", case.name);
        assert!(d > 10.0 * EXACT, "{what} went unnoticed ({d})");
    }
    let router = packs::moe::router_in(packs::names::mtp::LAYER);
    let dir = checkpoint_with_rows_swapped(&case, &router, 0, 1);
    let out = tempfile::tempdir().unwrap();
    let path = out.path().join("swapped.pack");
    packs::build::build_from_hf(
        dir.path(),
        &path,
        &packs::build::BuildOptions::new(QuantKind::F32),
    )
    .unwrap();
    let swapped = std::sync::Arc::new(packs::Pack::open(&path).unwrap());
    let mut g = forward(&swapped, options());
    let (hidden_g, _, _) = mtp_inputs(&case, &mut g);
    assert_eq!(hidden_g, hidden, "the swap reached the model's layers");
    let d = max_abs_diff(&mtp_logits(&mut g, &hidden, &embeds, &hybrid), &expected);
    println!(
        "{}: head's rows routed to swapped experts: max |Δ| {d:.3e}",
        case.name
    );
    assert!(d > 10.0 * EXACT, "the wrong experts went unnoticed ({d})");
}
