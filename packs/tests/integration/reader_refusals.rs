//! Every refusal of `Pack::open`, each with a planted bad file made from a good one. The control:
//! the unmodified file (and a header rewritten without changes) opens.

use std::path::{Path, PathBuf};

use packs::random::RandomShape;
use packs::{Pack, PackError, QuantKind};
use serde_json::{json, Value};

struct Fixture {
    _dir: tempfile::TempDir,
    dir: PathBuf,
    good: Vec<u8>,
}

/// A shape whose f32 norms (40 and 10 values) are not multiples of 64 bytes, so its packs hold
/// padding entries. No q4 (K = 40 is not a multiple of 32).
fn odd_shape() -> RandomShape {
    let mut shape = RandomShape::tiny();
    shape.name = "odd";
    let s = &mut shape.semantics;
    (s.hidden_size, s.head_dim, s.intermediate_size, s.vocab_size) = (40, 10, 72, 100);
    s.mrope_section = Some([2, 2, 1]);
    shape
}

fn fixture(quant: QuantKind) -> Fixture {
    fixture_of(&RandomShape::tiny(), quant)
}

fn fixture_of(shape: &RandomShape, quant: QuantKind) -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("good.pack");
    packs::write_random(shape, quant, 3, &path).unwrap();
    let good = std::fs::read(&path).unwrap();
    Fixture {
        dir: dir.path().to_path_buf(),
        _dir: dir,
        good,
    }
}

impl Fixture {
    fn plant(&self, name: &str, bytes: &[u8]) -> PathBuf {
        let p = self.dir.join(name);
        std::fs::write(&p, bytes).unwrap();
        p
    }

    fn header(&self) -> (Value, usize) {
        let n = u64::from_le_bytes(self.good[..8].try_into().unwrap()) as usize;
        (serde_json::from_slice(&self.good[8..8 + n]).unwrap(), n)
    }

    /// The good file with its header replaced by `header` (data section unchanged). The header is
    /// padded back to a 64-byte data start, so only what the edit changed can be wrong.
    fn with_header(&self, header: &Value) -> Vec<u8> {
        let (_, n) = self.header();
        let json = serde_json::to_vec(header).unwrap();
        let data_start = (8 + json.len()).next_multiple_of(64);
        let mut out = ((data_start - 8) as u64).to_le_bytes().to_vec();
        out.extend_from_slice(&json);
        out.resize(data_start, b' ');
        out.extend_from_slice(&self.good[8 + n..]);
        out
    }

    fn edited(&self, edit: impl FnOnce(&mut Value)) -> Vec<u8> {
        let (mut h, _) = self.header();
        edit(&mut h);
        self.with_header(&h)
    }

    /// Opens a planted file; the error must name the file and contain every needle.
    fn refuse(&self, name: &str, bytes: &[u8], needles: &[&str]) -> PackError {
        let path = self.plant(name, bytes);
        let err = Pack::open(&path).expect_err(name);
        let msg = err.to_string();
        assert!(
            msg.contains(&path.display().to_string()),
            "{name}: {msg:?} does not name the file"
        );
        for n in needles {
            assert!(msg.contains(n), "{name}: {msg:?} lacks {n:?}");
        }
        err
    }
}

const EMBED: &str = "model.language_model.embed_tokens.weight";
const K_PROJ: &str = "model.language_model.layers.0.self_attn.k_proj.weight";
const V_PROJ: &str = "model.language_model.layers.0.self_attn.v_proj.weight";
const FINAL_NORM: &str = "model.language_model.norm.weight";
const INPUT_NORM: &str = "model.language_model.layers.0.input_layernorm.weight";

#[test]
fn controls_open() {
    let odd = [QuantKind::F32, QuantKind::Bf16, QuantKind::I8].map(|q| fixture_of(&odd_shape(), q));
    for f in QuantKind::ALL.map(fixture).iter().chain(&odd) {
        let pack = Pack::open(f.plant("good.pack", &f.good)).unwrap();
        let (h, _) = f.header();
        Pack::open(f.plant("rewritten.pack", &f.with_header(&h))).unwrap();
        // Any safetensors reader lists it, padding entries included.
        let st = safetensors::SafeTensors::deserialize(&f.good).unwrap();
        let pads = st
            .names()
            .iter()
            .filter(|n| n.starts_with("__pad__."))
            .count();
        assert_eq!(st.names().len() - pads, pack.tensors().len());
        if pack.semantics().hidden_size == 40 {
            assert!(pads > 0, "the odd shape exercises padding");
        }
    }
}

#[test]
fn truncated_and_bad_lengths() {
    let f = fixture(QuantKind::Q4);
    let err = f.refuse("empty.pack", &[], &["too short"]);
    assert!(matches!(err, PackError::Header { .. }));
    f.refuse("four.pack", &f.good[..4], &["too short"]);
    // Cut inside the header, and inside the last tensor.
    f.refuse("cut-header.pack", &f.good[..100], &["header length"]);
    f.refuse(
        "cut-data.pack",
        &f.good[..f.good.len() - 1],
        &["lm_head.weight.scales", "outside"],
    );
    // A header length larger than the file, and an absurd one.
    let mut big = f.good.clone();
    big[..8].copy_from_slice(&(f.good.len() as u64).to_le_bytes());
    f.refuse("len-past-end.pack", &big, &["header length"]);
    big[..8].copy_from_slice(&u64::MAX.to_le_bytes());
    f.refuse("len-max.pack", &big, &["header length"]);
}

#[test]
fn corrupt_json() {
    let f = fixture(QuantKind::I8);
    let mut bad = f.good.clone();
    bad[8] = b'x';
    f.refuse("not-json.pack", &bad, &["not valid JSON"]);
    f.refuse(
        "array.pack",
        &f.with_header(&json!([1, 2])),
        &["not a JSON object"],
    );
    f.refuse(
        "entry.pack",
        &f.edited(|h| h[FINAL_NORM] = json!(5)),
        &[FINAL_NORM, "not a JSON object"],
    );
    f.refuse(
        "shape-type.pack",
        &f.edited(|h| h[FINAL_NORM]["shape"] = json!([-64])),
        &[FINAL_NORM, "shape"],
    );
    f.refuse(
        "dtype.pack",
        &f.edited(|h| h[FINAL_NORM]["dtype"] = json!("F4")),
        &[FINAL_NORM, "F4"],
    );
    f.refuse(
        "metadata.pack",
        &f.edited(|h| h["__metadata__"]["x"] = json!(1)),
        &["__metadata__"],
    );
}

#[test]
fn offsets_outside_overlapping_or_disagreeing_with_sizes() {
    let f = fixture(QuantKind::F32);
    f.refuse(
        "outside.pack",
        &f.edited(|h| h[FINAL_NORM]["data_offsets"] = json!([1u64 << 40, (1u64 << 40) + 256])),
        &[FINAL_NORM, "outside"],
    );
    f.refuse(
        "reversed.pack",
        &f.edited(|h| h[FINAL_NORM]["data_offsets"] = json!([256, 0])),
        &[FINAL_NORM, "outside"],
    );
    // k_proj and v_proj have the same size: v_proj pointed at k_proj's bytes overlaps it.
    f.refuse(
        "overlap.pack",
        &f.edited(|h| h[V_PROJ]["data_offsets"] = h[K_PROJ]["data_offsets"].clone()),
        &["overlap", "k_proj", "v_proj"],
    );
    f.refuse(
        "size.pack",
        &f.edited(|h| h[FINAL_NORM]["shape"] = json!([65])),
        &[FINAL_NORM, "needs 260 bytes", "256"],
    );
    f.refuse(
        "dtype-size.pack",
        &f.edited(|h| h[FINAL_NORM]["dtype"] = json!("BF16")),
        &[FINAL_NORM, "needs 128 bytes"],
    );
}

#[test]
fn misaligned_tensors() {
    let f = fixture_of(&odd_shape(), QuantKind::Bf16);
    // Four more header bytes move every tensor 4 bytes off its 64-byte boundary.
    let (h, n) = f.header();
    let json = serde_json::to_vec(&h).unwrap();
    let mut bad = ((n + 4) as u64).to_le_bytes().to_vec();
    bad.extend_from_slice(&json);
    bad.resize(8 + n + 4, b' ');
    bad.extend_from_slice(&f.good[8 + n..]);
    f.refuse("shifted.pack", &bad, &[EMBED, "not 64-byte aligned"]);
    // One tensor moved by 4 bytes inside a padding gap (the gap shrinks to keep sizes consistent).
    let (h, _) = f.header();
    let norm = h[INPUT_NORM]["data_offsets"].clone();
    let (s, e) = (norm[0].as_u64().unwrap(), norm[1].as_u64().unwrap());
    let bad = f.edited(|h| {
        h[INPUT_NORM]["data_offsets"] = json!([s + 4, e + 4]);
        let pad = h
            .as_object()
            .unwrap()
            .iter()
            .find(|(k, v)| k.starts_with("__pad__.") && v["data_offsets"][0] == json!(e))
            .map(|(k, _)| k.clone())
            .expect("the norm is followed by a padding entry");
        let pad_end = h[&pad]["data_offsets"][1].as_u64().unwrap();
        assert!(
            pad_end >= e + 4,
            "the plant needs 4 bytes of slack after the norm"
        );
        h[&pad]["data_offsets"] = json!([e + 4, pad_end]);
        h[&pad]["shape"] = json!([pad_end - e - 4]);
    });
    f.refuse("moved.pack", &bad, &[INPUT_NORM, "not 64-byte aligned"]);
}

#[test]
fn missing_or_wrongly_shaped_required_tensors() {
    let f = fixture(QuantKind::Q4);
    f.refuse(
        "missing.pack",
        &f.edited(|h| {
            let v = h.as_object_mut().unwrap().remove(FINAL_NORM).unwrap();
            h["renamed"] = v;
        }),
        &[FINAL_NORM, "missing"],
    );
    let scales = format!("{K_PROJ}.scales");
    f.refuse(
        "missing-scales.pack",
        &f.edited(|h| {
            h.as_object_mut().unwrap().remove(&scales);
        }),
        &[&scales, "missing"],
    );
    // Same byte size, other shape / dtype.
    f.refuse(
        "shape.pack",
        &f.edited(|h| h[EMBED]["shape"] = json!([128, 128])),
        &[EMBED, "[128, 128]", "expected BF16 [256, 64]"],
    );
    f.refuse(
        "codes-dtype.pack",
        &f.edited(|h| h[K_PROJ]["dtype"] = json!("I8")),
        &[K_PROJ, "is I8", "expected U8"],
    );
    f.refuse(
        "scales-dtype.pack",
        &f.edited(|h| h[scales.as_str()]["dtype"] = json!("F16")),
        &[&scales, "expected BF16"],
    );
    let f = fixture_of(&odd_shape(), QuantKind::I8);
    f.refuse(
        "padding.pack",
        &f.edited(|h| {
            let pad = h
                .as_object()
                .unwrap()
                .keys()
                .find(|k| k.starts_with("__pad__."))
                .unwrap()
                .clone();
            let len = h[&pad]["shape"][0].as_u64().unwrap();
            h[&pad]["dtype"] = json!("I8");
            h[&pad]["shape"] = json!([len]);
        }),
        &["__pad__.", "1-D U8"],
    );
}

#[test]
fn wrong_format_or_semantics() {
    let f = fixture(QuantKind::F32);
    f.refuse(
        "format.pack",
        &f.edited(|h| h["__metadata__"]["format"] = json!("xdna-vl-pack/1")),
        &["xdna-vl-pack/1", "expected \"xdna-vl-pack/5\""],
    );
    // A pack from before the tower and the assets: build it again.
    f.refuse(
        "format2.pack",
        &f.edited(|h| h["__metadata__"]["format"] = json!("xdna-vl-pack/2")),
        &["xdna-vl-pack/2", "build it again"],
    );
    // A pack whose q4 codes were two's complement: refused with the command that makes it again.
    let q4 = fixture(QuantKind::Q4);
    let path = q4.dir.join("format3.pack");
    q4.refuse(
        "format3.pack",
        &q4.edited(|h| h["__metadata__"]["format"] = json!("xdna-vl-pack/3")),
        &[
            "xdna-vl-pack/3",
            "two's complement",
            "build it again",
            &format!(
                "`packs random --shape tiny --quant q4 --seed 3 -o {}`",
                path.display()
            ),
        ],
    );
    // A pack of 8-row group-pair q4 panels: refused by name with the rebuild command.
    q4.refuse(
        "format4.pack",
        &q4.edited(|h| h["__metadata__"]["format"] = json!("xdna-vl-pack/4")),
        &[
            "xdna-vl-pack/4",
            "8-row panels",
            "build it again",
            "packs random --shape tiny",
        ],
    );
    // From a checkpoint: `packs build` with its directory, quant and the tower's quant.
    q4.refuse(
        "format3-built.pack",
        &q4.edited(|h| {
            let mut sem: Value =
                serde_json::from_str(h["__metadata__"]["semantics"].as_str().unwrap()).unwrap();
            sem["source"] = json!("/models/Qwen3-VL-2B-Instruct");
            h["__metadata__"]["semantics"] = json!(sem.to_string());
            h["__metadata__"]["format"] = json!("xdna-vl-pack/3");
        }),
        &[
            "two's complement",
            "`packs build /models/Qwen3-VL-2B-Instruct -o ",
            "format3-built.pack --quant q4 --no-vision`",
        ],
    );
    // Control: the same pack with this version's format opens.
    let current = q4.plant("format5.pack", &q4.edited(|_| {}));
    Pack::open(&current).expect("an unedited q4 pack opens");
    f.refuse(
        "plain-safetensors.pack",
        &f.edited(|h| {
            h.as_object_mut().unwrap().remove("__metadata__");
        }),
        &["format is None"],
    );
    f.refuse(
        "semantics-json.pack",
        &f.edited(|h| h["__metadata__"]["semantics"] = json!("{")),
        &["__metadata__.semantics"],
    );
    let (h, _) = f.header();
    let mut sem: Value =
        serde_json::from_str(h["__metadata__"]["semantics"].as_str().unwrap()).unwrap();
    sem["mrope_section"] = json!([24, 20, 20]);
    f.refuse(
        "semantics-invalid.pack",
        &f.edited(|h| h["__metadata__"]["semantics"] = json!(sem.to_string())),
        &["mrope_section", "rotated dims / 2 = 8"],
    );
    // Semantics that disagree with the tensors: a bigger vocabulary.
    sem["mrope_section"] = json!([3, 3, 2]);
    sem["vocab_size"] = json!(512);
    f.refuse(
        "semantics-vocab.pack",
        &f.edited(|h| h["__metadata__"]["semantics"] = json!(sem.to_string())),
        &[EMBED, "expected F32 [512, 64]"],
    );
}

#[test]
fn not_a_file() {
    let f = fixture(QuantKind::F32);
    let err = Pack::open(Path::new(&f.dir)).expect_err("a directory is not a pack");
    assert!(
        err.to_string().contains(&f.dir.display().to_string()),
        "{err}"
    );
    let missing = f.dir.join("nope.pack");
    let err = Pack::open(&missing).expect_err("missing file");
    assert!(
        matches!(err, PackError::Io { .. }) && err.to_string().contains("nope.pack"),
        "{err}"
    );
}

#[test]
fn accessors_refuse_wrong_roles() {
    let f = fixture(QuantKind::I8);
    let pack = Pack::open(f.plant("good.pack", &f.good)).unwrap();
    assert!(pack
        .linear(FINAL_NORM)
        .unwrap_err()
        .to_string()
        .contains("not a linear weight"));
    assert!(pack
        .norm(K_PROJ)
        .unwrap_err()
        .to_string()
        .contains("not a norm weight"));
    assert!(pack
        .linear("nope")
        .unwrap_err()
        .to_string()
        .contains("no tensor named nope"));
    assert!(pack.linear(&format!("{K_PROJ}.scales")).is_err());
}
