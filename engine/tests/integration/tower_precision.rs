//! The two-picture answer and the chat's two turns with the tower stored at every precision beside
//! an f32 decoder: the greedy ids against transformers' (the numbers behind `packs build`'s default
//! tower, README). f32, bf16 (either arithmetic) and i8 towers give transformers' ids; a q4 tower
//! does not (measured: chat turn 1 agrees for 6 of 12 ids, turn 2 for 1 of 4), which is also the
//! control that the comparison can fail.

use crate::common;

use common::*;
use engine::{Message, SamplingParams};
use packs::QuantKind;

fn session(kind: QuantKind, bf16_products: bool, dir: &std::path::Path) -> engine::Session {
    let out = dir.join(format!("chat-{kind}-{bf16_products}.pack"));
    let opts = packs::build::BuildOptions {
        vision_quant: Some(kind),
        vision_bf16_products: bf16_products,
        ..packs::build::BuildOptions::new(QuantKind::F32)
    };
    packs::build::build_from_hf(&checkpoint(), &out, &opts).unwrap();
    let pack = std::sync::Arc::new(packs::Pack::open(&out).unwrap());
    let options = engine::SessionOptions {
        context: 256,
        runtime: compute::RuntimeOptions::host(2),
        ..engine::SessionOptions::default()
    };
    engine::Session::new(&pack, &assets(), &options).unwrap()
}

/// How many leading ids agree.
fn agreeing(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

#[test]
fn every_tower_precision_gives_transformers_greedy_ids() {
    let dir = tempfile::tempdir().unwrap();
    let greedy = SamplingParams {
        max_tokens: cases()["max_new_tokens"].as_u64().unwrap() as usize,
        ..SamplingParams::default()
    };
    let runs = &cases()["runs"];
    for (kind, bf16_products) in [
        (QuantKind::F32, false),
        (QuantKind::Bf16, false),
        (QuantKind::Bf16, true),
        (QuantKind::I8, false),
        (QuantKind::Q4, false),
    ] {
        let mut s = session(kind, bf16_products, dir.path());
        let two = s
            .generate(
                &messages(&cases()["cases"]["two_images"]),
                &greedy,
                &mut |_| true,
            )
            .unwrap();
        let want_two = ids(&runs["two_images"]["greedy_ids"]);
        let turn1 = s
            .chat(
                messages(&runs["chat_turn1"]).remove(0),
                &greedy,
                &mut |_| true,
            )
            .unwrap();
        let turn2 = s
            .chat(
                Message::user(vec![], "And the colours?"),
                &greedy,
                &mut |_| true,
            )
            .unwrap();
        let (want1, want2) = (
            ids(&runs["chat_turn1"]["greedy_ids"]),
            ids(&runs["chat"]["greedy_ids"]),
        );
        println!(
            "tower {kind} (bf16 products {bf16_products}): two pictures {}/{} ids, chat turn 1 \
             {}/{}, turn 2 {}/{}",
            agreeing(&two.ids, &want_two),
            want_two.len(),
            agreeing(&turn1.ids, &want1),
            want1.len(),
            agreeing(&turn2.ids, &want2),
            want2.len()
        );
        let same = two.ids == want_two && turn1.ids == want1 && turn2.ids == want2;
        if kind == QuantKind::Q4 {
            assert!(!same, "control: the q4 tower gave transformers' ids");
        } else {
            assert!(
                same,
                "the {kind} tower (bf16 products {bf16_products}) changed the ids"
            );
        }
    }
}
