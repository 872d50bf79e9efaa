//! Memory bounds: a count read from a file (layers, blocks) is checked against what the file holds
//! before anything is planned or allocated from it. Each case measures the peak RSS the refusal
//! costs; the control is the unmodified file, which opens.

use std::path::Path;

use fuzz::runner::peak_rss_kib;
use packs::{Pack, QuantKind};
use serde_json::Value;

/// A pack's bytes with `edit` applied to its semantics.
fn with_semantics(pack: &[u8], edit: impl FnOnce(&mut Value)) -> Vec<u8> {
    let n = u64::from_le_bytes(pack[..8].try_into().unwrap()) as usize;
    let mut header: Value = serde_json::from_slice(&pack[8..8 + n]).unwrap();
    let sem = header["__metadata__"]["semantics"].as_str().unwrap();
    let mut sem: Value = serde_json::from_str(sem).unwrap();
    edit(&mut sem);
    header["__metadata__"]["semantics"] = Value::String(sem.to_string());
    let mut json = serde_json::to_vec(&header).unwrap();
    assert!(
        json.len() <= n,
        "the edit keeps the header within its length"
    );
    json.resize(n, b' ');
    let mut out = pack.to_vec();
    out[8..8 + n].copy_from_slice(&json);
    out
}

fn random_pack(dir: &Path) -> Vec<u8> {
    let p = dir.join("good.pack");
    packs::write_random(&packs::RandomShape::tiny(), QuantKind::F32, 1, &p).unwrap();
    std::fs::read(&p).unwrap()
}

#[test]
fn a_pack_claiming_millions_of_layers_is_refused_without_planning_them() {
    let tmp = tempfile::tempdir().unwrap();
    let good = random_pack(tmp.path());
    let path = tmp.path().join("layers.pack");
    std::fs::write(&path, &good).unwrap();
    Pack::open(&path).expect("control: the unmodified pack opens");
    // 2^24 layers passes Semantics::validate (its bound); a plan of 11 weights a layer would be
    // ~185 M entries (tens of GB) before the first missing tensor is noticed.
    std::fs::write(
        &path,
        with_semantics(&good, |s| s["num_layers"] = (1u64 << 24).into()),
    )
    .unwrap();
    let before = peak_rss_kib();
    let err = Pack::open(&path).unwrap_err().to_string();
    let grew_mib = (peak_rss_kib() - before) / 1024;
    eprintln!("grew {grew_mib} MiB: {err}");
    assert!(
        err.contains("num_layers") && err.contains("16777216"),
        "{err}"
    );
    assert!(grew_mib < 64, "refusing cost {grew_mib} MiB");
}
