//! The README's C example compiles with warnings as errors, links, and decodes on a tiny pack; its
//! ids equal the Rust API's greedy ids for the same prompt.

use crate::common;

use common::Link;
use compute::ops::sampling::argmax;
use compute::Runtime;
use decoder::{Decoder, DecoderOptions, Logits};
use packs::random::{write_random, RandomShape};
use packs::{Pack, QuantKind};
use std::sync::Arc;

/// The first ```c block of README.md.
fn readme_c_example() -> String {
    let readme = std::fs::read_to_string(common::crate_dir().join("README.md")).unwrap();
    let start = readme.find("```c\n").expect("README.md has a ```c block") + "```c\n".len();
    let len = readme[start..].find("```").expect("the ```c block ends");
    readme[start..start + len].to_string()
}

#[test]
fn the_readme_example_builds_and_decodes_like_the_rust_api() {
    let dir = tempfile::tempdir().unwrap();
    let pack_path = dir.path().join("tiny.pack");
    write_random(&RandomShape::tiny(), QuantKind::F32, 2, &pack_path).unwrap();
    let source = dir.path().join("readme_example.c");
    std::fs::write(&source, readme_c_example()).unwrap();
    let exe = common::compile_path(&source, dir.path(), Link::Dynamic);
    let out = common::run(&exe, &[pack_path.as_os_str()]);
    let c_ids = String::from_utf8(out.stdout).unwrap();

    // The same prompt and greedy loop through the Rust API.
    let pack = Arc::new(Pack::open(&pack_path).unwrap());
    let options = DecoderOptions {
        capacity: 64,
        ..DecoderOptions::default()
    };
    let mut f = Decoder::new(
        &pack,
        &Runtime::host(compute::default_threads()).unwrap(),
        options,
    )
    .unwrap();
    let prompt = [3u32, 17, 99, 4];
    let n = prompt.len();
    let mut next = argmax(f.step_batch(&prompt, 0, 0, Logits::LastRow).unwrap());
    let mut ids = Vec::new();
    for i in 0..8 {
        ids.push(next.to_string());
        next = argmax(f.step(next, (n + i) as i64, n + i).unwrap());
    }
    assert_eq!(c_ids.trim(), ids.join(" "));
    // Control: a program that failed to open the pack exits 2 with the error on stderr.
    let bad = std::process::Command::new(&exe)
        .arg(dir.path().join("missing.pack"))
        .output()
        .unwrap();
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("missing.pack"));
}
