//! `xdna-vl-vision`: `--pixels` (a reference's inputs) gives transformers' rows in the output file;
//! bad input exits 2 with a message naming it.

use crate::common;

use std::process::Command;

use common::{build_pack, max_abs, max_abs_diff, Case, Reference};
use packs::stfile::StFile;
use packs::QuantKind;

fn cli() -> Command {
    Command::new(env!("CARGO_BIN_EXE_xdna-vl-vision"))
}

#[test]
fn pixels_in_rows_out_equal_transformers() {
    let dir = tempfile::tempdir().unwrap();
    let pack = build_pack(Case::Wide, QuantKind::F32, dir.path());
    let out = dir.path().join("rows.safetensors");
    let run = cli()
        .arg(pack.path())
        .arg("--pixels")
        .arg(Case::Wide.reference())
        .arg("-o")
        .arg(&out)
        .args(["--threads", "2"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(
        run.status.success(),
        "{}{}",
        stdout,
        String::from_utf8_lossy(&run.stderr)
    );
    println!("{stdout}");
    assert!(
        stdout.contains("grid (t, h, w) = (1, 8, 4), 8 tokens"),
        "{stdout}"
    );
    let r = Reference::open(Case::Wide, QuantKind::F32);
    let f = StFile::open(&out).unwrap();
    let (embeds, shape) = f.f32("image_embeds", 2).unwrap();
    assert_eq!(shape, vec![r.tokens, r.out_hidden]);
    assert!(max_abs_diff(&embeds, &r.image_embeds) <= 1e-4 * max_abs(&r.image_embeds).max(1.0));
    let (deep, dshape) = f.f32("deepstack", 3).unwrap();
    assert_eq!(dshape, vec![r.sets, r.tokens, r.out_hidden]);
    assert!(max_abs_diff(&deep, &r.deepstack) <= 1e-4 * max_abs(&r.deepstack).max(1.0));
    let (grid, _) = f.i64("image_grid_thw", 2).unwrap();
    assert_eq!(grid, vec![1, 4, 6, 1, 8, 4, 1, 2, 2]);
    let (pixels, _) = f.f32("pixel_values", 2).unwrap();
    let reference = StFile::open(Case::Wide.reference()).unwrap();
    assert_eq!(pixels, reference.f32("pixel_values", 2).unwrap().0);
}

fn refused(args: &[&std::ffi::OsStr], needle: &str) {
    let run = cli().args(args).output().unwrap();
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert_eq!(run.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains(needle), "expected {needle:?} in: {stderr}");
}

#[test]
fn bad_input_exits_2_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let pack = build_pack(Case::Chat, QuantKind::F32, dir.path());
    let out = dir.path().join("rows.safetensors");
    let missing = dir.path().join("missing.pack");
    let os = |s: &str| std::ffi::OsString::from(s);
    let (p, o) = (
        pack.path().as_os_str().to_owned(),
        out.as_os_str().to_owned(),
    );
    refused(
        &[missing.as_os_str(), &os("x.png"), &os("-o"), &o],
        "missing.pack",
    );
    refused(&[&p, &os("-o"), &o], "no images");
    let no_image = dir.path().join("no-such-picture.png");
    refused(
        &[&p, no_image.as_os_str(), &os("-o"), &o],
        "no-such-picture.png",
    );
    // The wide reference's pixel rows against the chat pack: same row width, so they run; a file
    // without image_grid_thw is refused by tensor name.
    let bad = dir.path().join("bad.safetensors");
    std::fs::write(&bad, b"not safetensors").unwrap();
    refused(
        &[&p, &os("--pixels"), bad.as_os_str(), &os("-o"), &o],
        "bad.safetensors",
    );
    refused(
        &[
            &p,
            &os("--pixels"),
            &os(Case::Chat.reference().to_str().unwrap()),
            &os("-o"),
            &o,
            &os("--gemm"),
            &os("device"),
        ],
        "--designs",
    );
}
