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
    let after = peak_rss_kib();
    assert!(
        before > 0 && after > 0,
        "VmHWM unreadable: {before} / {after} KiB"
    );
    let grew_mib = after.saturating_sub(before) / 1024;
    eprintln!("grew {grew_mib} MiB: {err}");
    assert!(
        err.contains("num_layers") && err.contains("16777216"),
        "{err}"
    );
    assert!(grew_mib < 64, "refusing cost {grew_mib} MiB");
}

/// The pack reader's refusals that said what was expected but not what was found now say both.
#[test]
fn pack_refusals_say_what_was_found() {
    let tmp = tempfile::tempdir().unwrap();
    // Norms of 40 f32 (160 bytes): the pack holds padding entries.
    let mut shape = packs::RandomShape::tiny();
    let s = &mut shape.semantics;
    (s.hidden_size, s.head_dim, s.intermediate_size, s.vocab_size) = (40, 10, 72, 100);
    s.mrope_section = Some([2, 2, 1]);
    let path = tmp.path().join("odd.pack");
    packs::write_random(&shape, QuantKind::F32, 1, &path).unwrap();
    let good = std::fs::read(&path).unwrap();
    let n = u64::from_le_bytes(good[..8].try_into().unwrap()) as usize;
    let header: Value = serde_json::from_slice(&good[8..8 + n]).unwrap();
    let rewrite = |edit: &dyn Fn(&mut Value)| {
        let mut h = header.clone();
        edit(&mut h);
        let mut json = serde_json::to_vec(&h).unwrap();
        assert!(json.len() <= n);
        json.resize(n, b' ');
        let mut out = good.clone();
        out[8..8 + n].copy_from_slice(&json);
        let p = tmp.path().join("edited.pack");
        std::fs::write(&p, out).unwrap();
        Pack::open(&p).unwrap_err().to_string()
    };
    let names: Vec<String> = header.as_object().unwrap().keys().cloned().collect();
    let tensors: Vec<&String> = names.iter().filter(|k| !k.starts_with("__")).collect();
    // Control: rewritten unchanged, it opens.
    let p = tmp.path().join("same.pack");
    std::fs::write(&p, &good).unwrap();
    Pack::open(&p).unwrap();

    let (a, b) = (tensors[0].clone(), tensors[1].clone());
    // b moved onto a's start, keeping its own length (so only the overlap is wrong).
    let err = rewrite(&|h| {
        let start = h[&a]["data_offsets"][0].as_u64().unwrap();
        let off = &h[&b]["data_offsets"];
        let len = off[1].as_u64().unwrap() - off[0].as_u64().unwrap();
        h[&b]["data_offsets"] = serde_json::json!([start, start + len]);
    });
    assert!(
        err.contains("overlap") && err.contains("data_offsets ["),
        "{err}"
    );
    let err = rewrite(&|h| h["__metadata__"]["format"] = serde_json::json!(3));
    assert!(
        err.contains("__metadata__ must be an object of string values, found format: 3"),
        "{err}"
    );
    let pad = names
        .iter()
        .find(|k| k.starts_with("__pad__"))
        .expect("padding entries");
    {
        let err =
            rewrite(&|h| h[pad]["shape"] = serde_json::json!([1, h[pad]["shape"][0].clone()]));
        assert!(
            err.contains(pad.as_str())
                && err.contains("U8 [1, ")
                && err.contains("expected a 1-D U8"),
            "{err}"
        );
    }
}
