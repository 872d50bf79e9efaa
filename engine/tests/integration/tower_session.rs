//! The session with the pack's own vision tower (the Rust tower, on the forward's backend and
//! pool), fed transformers' pixel rows of the two pictures (tests/fixtures/engine/images.safetensors):
//! the two-picture answer and the chat's second turn equal transformers' greedy ids.

use crate::common;

use common::*;
use engine::{Event, Message, SamplingParams};

fn greedy() -> SamplingParams {
    SamplingParams {
        max_tokens: cases()["max_new_tokens"].as_u64().unwrap() as usize,
        ..SamplingParams::default()
    }
}

#[test]
fn the_rust_tower_gives_transformers_two_picture_answer() {
    let mut s = tower_session();
    let mut text = String::new();
    let g = s
        .generate(
            &messages(&cases()["cases"]["two_images"]),
            &greedy(),
            &mut |e| {
                if let Event::Text(t) = e {
                    text.push_str(t);
                }
                true
            },
        )
        .unwrap();
    assert_eq!(g.ids, ids(&cases()["runs"]["two_images"]["greedy_ids"]));
    assert_eq!(text, "anksson\u{FFFD}ud");
    assert_eq!(g.image_tokens, 10);
    assert!(g.timings.tower > std::time::Duration::ZERO);
}

#[test]
fn the_rust_tower_gives_transformers_second_chat_turn() {
    let runs = &cases()["runs"];
    let mut s = tower_session();
    let turn1 = messages(&runs["chat_turn1"]).remove(0);
    let g1 = s.chat(turn1, &greedy(), &mut |_| true).unwrap();
    assert_eq!(g1.ids, ids(&runs["chat_turn1"]["greedy_ids"]));
    let g2 = s
        .chat(
            Message::user(vec![], "And the colours?"),
            &greedy(),
            &mut |_| true,
        )
        .unwrap();
    assert_eq!(g2.ids, ids(&runs["chat"]["greedy_ids"]));
    assert!(g2.reused_tokens > 0);
    // The picture was in the reused prefix: the tower did not run for the second turn.
    assert_eq!(g2.timings.tower, std::time::Duration::ZERO);
}

#[test]
fn pictures_read_from_their_files_give_transformers_pixel_rows_and_answer() {
    let mut s = tower_session();
    let dir = fixtures().join("chat");
    let images: Vec<engine::Image> = ["picture-1.png", "picture-2.png"]
        .iter()
        .map(|n| s.load_image(&dir.join(n)).unwrap())
        .collect();
    // The Rust preprocessing gives transformers' pixel rows bit for bit for these two pictures,
    // so their identities (hashes of the rows) are the fixture rows' too.
    for (img, name) in images.iter().zip(["picture-1.png", "picture-2.png"]) {
        assert_eq!(img.patches.grid, picture(name).patches.grid, "{name}");
        assert_eq!(img.identity, image(name).identity, "{name}");
    }
    let g = s
        .generate(
            &[Message::user(images, "Describe these pictures.")],
            &greedy(),
            &mut |_| true,
        )
        .unwrap();
    assert_eq!(g.ids, ids(&cases()["runs"]["two_images"]["greedy_ids"]));
}
