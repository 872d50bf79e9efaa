//! The forward's API contract on a random tiny pack: slots, refusals, batching.

use decoder::{Decoder, DecoderOptions, HybridInputs, KvDtype, Logits};
use packs::random::{write_random, RandomShape};
use packs::{Pack, QuantKind};
use std::sync::Arc;

fn tiny_pack(quant: QuantKind, mrope: bool) -> (tempfile::TempDir, Arc<Pack>) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tiny.pack");
    let mut shape = RandomShape::tiny();
    if !mrope {
        shape.semantics.architecture = "qwen3".into();
        shape.semantics.mrope = false;
        shape.semantics.mrope_section = None;
        shape.semantics.mrope_interleaved = false;
        shape.semantics.deepstack_sets = 0;
    }
    write_random(&shape, quant, 7, &path).unwrap();
    (dir, Arc::new(Pack::open(&path).unwrap()))
}

fn fwd(pack: &Arc<Pack>, capacity: usize) -> Decoder {
    let options = DecoderOptions {
        capacity,
        ..DecoderOptions::default()
    };
    Decoder::new(pack, &compute::Runtime::host(2).unwrap(), options).unwrap()
}

const TOKENS: [u32; 6] = [3, 17, 99, 4, 200, 45];

#[test]
fn batched_prefill_equals_token_by_token_for_every_kind() {
    for kind in [
        QuantKind::F32,
        QuantKind::Bf16,
        QuantKind::I8,
        QuantKind::Q4,
    ] {
        let (_d, pack) = tiny_pack(kind, true);
        let mut f = fwd(&pack, 16);
        let batch = f
            .step_batch(&TOKENS, 0, 0, Logits::AllRows)
            .unwrap()
            .to_vec();
        let vocab = f.semantics().vocab_size;
        f.reset();
        for (i, &t) in TOKENS.iter().enumerate() {
            let one = f.step(t, i as i64, i).unwrap();
            assert_eq!(one, &batch[i * vocab..(i + 1) * vocab], "{kind} row {i}");
        }
        assert_eq!(f.next_slot(), TOKENS.len());
    }
}

#[test]
fn a_slot_that_is_not_the_next_or_past_capacity_is_refused_and_nothing_moves() {
    let (_d, pack) = tiny_pack(QuantKind::F32, true);
    let mut f = fwd(&pack, 4);
    f.step_batch(&TOKENS[..3], 0, 0, Logits::LastRow).unwrap();
    let e = f.step(5, 3, 5).unwrap_err().to_string();
    assert!(
        e.contains("cache slot 5") && e.contains("next free slot is 3"),
        "{e}"
    );
    let e = f.step(5, 3, 2).unwrap_err().to_string();
    assert!(e.contains("cache slot 2"), "{e}");
    assert_eq!(f.next_slot(), 3);
    let e = f
        .step_batch(&TOKENS[..2], 3, 3, Logits::LastRow)
        .unwrap_err()
        .to_string();
    assert!(e.contains("holds 4"), "{e}");
    assert_eq!(f.next_slot(), 3);
    // Control: the next slot is accepted.
    f.step(5, 3, 3).unwrap();
    assert_eq!(f.next_slot(), 4);
    let e = f.step(5, 4, 4).unwrap_err().to_string();
    assert!(e.contains("holds 4"), "{e}");
}

#[test]
fn rotary_position_and_cache_slot_are_separate_numbers() {
    let (_d, pack) = tiny_pack(QuantKind::F32, true);
    let mut f = fwd(&pack, 16);
    f.step_batch(&TOKENS, 0, 0, Logits::LastRow).unwrap();
    let a = f.step(9, 6, 6).unwrap().to_vec();
    assert_eq!(f.truncate(6), 6);
    let b = f.step(9, 2, 6).unwrap().to_vec();
    assert_ne!(a, b, "the rotary position must matter");
    assert_eq!(f.truncate(6), 6);
    let c = f.step(9, 6, 6).unwrap().to_vec();
    assert_eq!(a, c, "same slot and position, same logits");
}

#[test]
fn token_outside_the_vocabulary_is_refused() {
    let (_d, pack) = tiny_pack(QuantKind::F32, true);
    let mut f = fwd(&pack, 8);
    let e = f.step(256, 0, 0).unwrap_err().to_string();
    assert!(e.contains("token id 256") && e.contains("0..256"), "{e}");
    assert_eq!(f.next_slot(), 0);
}

fn embeds(f: &Decoder, tokens: &[u32]) -> Vec<f32> {
    let h = f.semantics().hidden_size;
    let mut out = vec![0.0; tokens.len() * h];
    for (row, &t) in out.chunks_exact_mut(h).zip(tokens) {
        f.embed_row(t, row);
    }
    out
}

#[test]
fn hybrid_inputs_are_refused_by_name() {
    let (_d, pack) = tiny_pack(QuantKind::F32, true);
    let mut f = fwd(&pack, 16);
    let h = f.semantics().hidden_size;
    let sets = f.semantics().deepstack_sets;
    let rows = TOKENS.len();
    let e = embeds(&f, &TOKENS);
    let good = HybridInputs {
        planes: Some(HybridInputs::equal_planes(rows, 0)),
        start_pos: 0,
        image_rows: vec![2, 3],
        deepstack: vec![0.1; sets * 2 * h],
        deepstack_sets: sets,
    };
    let refuse = |f: &mut Decoder, hy: &HybridInputs, needle: &str| {
        let msg = f
            .step_batch_embeds(&e, hy, 0, Logits::LastRow)
            .unwrap_err()
            .to_string();
        assert!(msg.contains(needle), "{msg:?} lacks {needle:?}");
        assert_eq!(f.next_slot(), 0);
    };
    let mut bad = good.clone();
    bad.planes = Some(vec![0; 3 * rows - 1]);
    refuse(&mut f, &bad, "expected 3 planes");
    let mut bad = good.clone();
    bad.deepstack_sets = sets + 1;
    bad.deepstack = vec![0.1; (sets + 1) * 2 * h];
    refuse(&mut f, &bad, "DeepStack sets given, the pack declares");
    let mut bad = good.clone();
    bad.image_rows = vec![2, rows];
    refuse(&mut f, &bad, "outside the prompt");
    let mut bad = good.clone();
    bad.deepstack = vec![0.1; sets * 3 * h];
    refuse(&mut f, &bad, "one row per image row");
    let mut bad = good.clone();
    bad.image_rows = vec![3, 2];
    refuse(&mut f, &bad, "strictly ascending");
    let mut bad = good.clone();
    bad.deepstack[h + 5] = f32::NAN;
    refuse(
        &mut f,
        &bad,
        "DeepStack holds NaN at set 0, image row 1, column 5",
    );
    let mut bad_rows = e.clone();
    bad_rows[2 * h + 7] = f32::INFINITY;
    let msg = f
        .step_batch_embeds(&bad_rows, &good, 0, Logits::LastRow)
        .unwrap_err()
        .to_string();
    assert!(msg.contains("inf at row 2, column 7"), "{msg}");
    assert_eq!(f.next_slot(), 0);
    // Control: the good inputs run.
    f.step_batch_embeds(&e, &good, 0, Logits::LastRow).unwrap();
    assert_eq!(f.next_slot(), rows);

    let (_d2, plain) = tiny_pack(QuantKind::F32, false);
    let mut g = fwd(&plain, 16);
    let e2 = embeds(&g, &TOKENS);
    let hy = HybridInputs {
        planes: Some(HybridInputs::equal_planes(rows, 0)),
        ..HybridInputs::text(0)
    };
    let msg = g
        .step_batch_embeds(&e2, &hy, 0, Logits::LastRow)
        .unwrap_err()
        .to_string();
    assert!(msg.contains("declares no MRoPE"), "{msg}");
    g.step_batch_embeds(&e2, &HybridInputs::text(0), 0, Logits::LastRow)
        .unwrap();
}

#[test]
fn bf16_kv_cache_halves_memory_at_a_small_cost() {
    let (_d, pack) = tiny_pack(QuantKind::F32, true);
    let mut a = fwd(&pack, 32);
    let mut b = Decoder::new(
        &pack,
        &compute::Runtime::host(2).unwrap(),
        DecoderOptions {
            capacity: 32,
            kv_dtype: KvDtype::Bf16,
            ..DecoderOptions::default()
        },
    )
    .unwrap();
    assert_eq!(b.kv_bytes() * 2, a.kv_bytes());
    let la = a
        .step_batch(&TOKENS, 0, 0, Logits::AllRows)
        .unwrap()
        .to_vec();
    let lb = b
        .step_batch(&TOKENS, 0, 0, Logits::AllRows)
        .unwrap()
        .to_vec();
    let worst = la
        .iter()
        .zip(&lb)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max);
    println!("bf16 KV cache vs f32: max |Δlogit| {worst:.3e}");
    assert!(worst > 0.0, "bf16 rounding must show");
    assert!(worst < 0.05, "bf16 KV cost too large: {worst}");
}

#[test]
fn an_empty_batch_is_refused() {
    let (_d, pack) = tiny_pack(QuantKind::F32, true);
    let mut f = fwd(&pack, 8);
    let e = f
        .step_batch(&[], 0, 0, Logits::AllRows)
        .unwrap_err()
        .to_string();
    assert!(e.contains("at least one token"), "{e}");
    let e = f
        .step_batch_embeds(&[], &HybridInputs::text(0), 0, Logits::AllRows)
        .unwrap_err()
        .to_string();
    assert!(e.contains("not a positive multiple"), "{e}");
    assert_eq!(f.next_slot(), 0);
}

#[test]
fn attention_time_is_counted_per_step_beside_the_gemm_time() {
    let (_d, pack) = tiny_pack(QuantKind::Q4, true);
    let mut f = fwd(&pack, 32);
    assert_eq!(f.take_attention_time(), std::time::Duration::ZERO);
    f.runtime().take_stats();
    let t = std::time::Instant::now();
    f.step_batch(&TOKENS, 0, 0, Logits::LastRow).unwrap();
    let wall = t.elapsed();
    let attention = f.take_attention_time();
    let gemm = f.runtime().take_stats().host;
    assert!(attention > std::time::Duration::ZERO, "no attention time");
    assert!(
        attention + gemm <= wall,
        "attention {attention:?} + GEMMs {gemm:?} exceed the step's {wall:?}"
    );
    // Taking it restarts the count.
    assert_eq!(f.take_attention_time(), std::time::Duration::ZERO);
}
