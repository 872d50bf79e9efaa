//! Streaming with the tiny checkpoint's byte-level tokenizer: multi-byte characters split over
//! several ids are never shown half, and the pieces add up to transformers-style `decode` of all ids.

use crate::common;

use engine::{ChatFormat, TextStream};

#[test]
fn pieces_are_whole_characters_and_add_up_to_the_decoded_text() {
    let f = ChatFormat::new(&common::assets()).unwrap();
    let t = &f.tokenizer;
    let text = "héllo 世界 🎉 naïve — ok";
    let ids = t.encode(text).unwrap();
    // The tiny BPE has no merges for these characters: they arrive one byte per id.
    assert!(ids.len() > text.chars().count(), "{ids:?}");
    let mut s = TextStream::new();
    let mut pieces = Vec::new();
    for &id in &ids {
        let p = s.push(t, id).unwrap();
        assert!(!p.contains('\u{FFFD}'), "half a character shown: {p:?}");
        pieces.push(p);
    }
    pieces.push(s.finish(t).unwrap());
    assert_eq!(pieces.concat(), text);
    assert_eq!(pieces.concat(), t.decode(&ids).unwrap());
    // Control: decoding id by id shows replacement characters.
    let naive: String = ids.iter().map(|&id| t.decode(&[id]).unwrap()).collect();
    assert!(naive.contains('\u{FFFD}'));
}

#[test]
fn a_dangling_byte_at_the_end_is_shown_as_transformers_shows_it() {
    let f = ChatFormat::new(&common::assets()).unwrap();
    let t = &f.tokenizer;
    let mut s = TextStream::new();
    // 252 alone is a lone UTF-8 byte (the fixture answer's third token).
    assert_eq!(s.push(t, 252).unwrap(), "");
    assert_eq!(s.finish(t).unwrap(), "\u{FFFD}");
}
