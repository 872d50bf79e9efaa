//! Every refusal of `testkit::PromptInputs::open` (hybrid-inputs/1), each from a planted bad file
//! made from the chat fixture's inputs: the message names the file, the tensor or metadata key,
//! what was found and what was expected. Control: the unmodified tensors, written again, open.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use safetensors::tensor::TensorView;
use safetensors::{Dtype, SafeTensors};
use testkit::PromptInputs;

#[derive(Clone)]
struct Inputs {
    meta: HashMap<String, String>,
    tensors: BTreeMap<String, (Dtype, Vec<usize>, Vec<u8>)>,
}

fn fixture() -> Inputs {
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/chat/inputs.safetensors");
    let bytes = std::fs::read(path).unwrap();
    let (_, meta) = SafeTensors::read_metadata(&bytes).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let tensors = st
        .tensors()
        .into_iter()
        .map(|(n, v)| (n, (v.dtype(), v.shape().to_vec(), v.data().to_vec())))
        .collect();
    Inputs {
        meta: meta.metadata().clone().unwrap(),
        tensors,
    }
}

impl Inputs {
    fn write(&self, dir: &Path, name: &str) -> PathBuf {
        let views: Vec<(String, TensorView)> = self
            .tensors
            .iter()
            .map(|(n, (d, s, b))| (n.clone(), TensorView::new(*d, s.clone(), b).unwrap()))
            .collect();
        let bytes = safetensors::serialize(views, Some(self.meta.clone())).unwrap();
        let p = dir.join(name);
        std::fs::write(&p, bytes).unwrap();
        p
    }

    fn i64s(&mut self, name: &str) -> Vec<i64> {
        self.tensors[name]
            .2
            .chunks_exact(8)
            .map(|b| i64::from_le_bytes(b.try_into().unwrap()))
            .collect()
    }

    fn set_i64s(&mut self, name: &str, v: &[i64]) {
        let t = self.tensors.get_mut(name).unwrap();
        t.2 = v.iter().flat_map(|x| x.to_le_bytes()).collect();
    }

    fn set_f32(&mut self, name: &str, at: usize, v: f32) {
        let t = self.tensors.get_mut(name).unwrap();
        t.2[at * 4..at * 4 + 4].copy_from_slice(&v.to_le_bytes());
    }
}

/// Opens `inputs` written as `name` and checks the refusal names the file and every needle.
fn refuse(dir: &Path, name: &str, inputs: &Inputs, needles: &[&str]) {
    let path = inputs.write(dir, name);
    let err = PromptInputs::open(&path).expect_err(name).to_string();
    assert!(
        err.starts_with(&path.display().to_string()),
        "{err:?} does not name the file"
    );
    for n in needles {
        assert!(err.contains(n), "{name}: {err:?} lacks {n:?}");
    }
}

#[test]
fn every_refusal_names_file_field_found_and_expected() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let good = fixture();
    // Control: the fixture's tensors and metadata, written again, open.
    let opened = PromptInputs::open(good.write(dir, "good.safetensors")).unwrap();
    assert_eq!(
        (
            opened.rows(),
            opened.image_rows().len(),
            opened.deepstack_sets
        ),
        (39, 10, 2)
    );

    let missing = dir.join("absent.safetensors");
    let err = PromptInputs::open(&missing).unwrap_err().to_string();
    assert!(
        err.contains("absent.safetensors") && err.contains("cannot read"),
        "{err}"
    );
    std::fs::write(
        dir.join("garbage.safetensors"),
        b"\x10\0\0\0\0\0\0\0{not json}      ",
    )
    .unwrap();
    let err = PromptInputs::open(dir.join("garbage.safetensors"))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("garbage.safetensors") && err.contains("not a safetensors file"),
        "{err}"
    );

    let mut x = good.clone();
    x.meta.insert("format".into(), "hybrid-inputs/2".into());
    refuse(
        dir,
        "format.st",
        &x,
        &["format", "hybrid-inputs/2", "expected \"hybrid-inputs/1\""],
    );
    let mut x = good.clone();
    x.meta.remove("format");
    refuse(
        dir,
        "noformat.st",
        &x,
        &["`format` is missing", "hybrid-inputs/1"],
    );
    for key in ["image_token_id", "rope_delta"] {
        let mut x = good.clone();
        x.meta.remove(key);
        refuse(
            dir,
            "nokey.st",
            &x,
            &[&format!("metadata `{key}` is missing")],
        );
        let mut x = good.clone();
        x.meta.insert(key.into(), "1e3".into());
        refuse(dir, "badkey.st", &x, &[key, "\"1e3\"", "not an integer"]);
    }

    let mut x = good.clone();
    x.tensors.remove("deepstack");
    refuse(dir, "nodeep.st", &x, &["tensor `deepstack` is missing"]);
    let mut x = good.clone();
    x.tensors.get_mut("input_ids").unwrap().0 = Dtype::F64;
    refuse(dir, "dtype.st", &x, &["`input_ids`", "F64", "expected I64"]);
    let mut x = good.clone();
    x.tensors.get_mut("input_ids").unwrap().1 = vec![1, 39];
    refuse(
        dir,
        "rank.st",
        &x,
        &["`input_ids`", "[1, 39]", "expected 1 dimensions"],
    );
    let mut x = good.clone();
    for t in ["input_ids", "position_ids", "image_embeds", "deepstack"] {
        let e = x.tensors.get_mut(t).unwrap();
        e.1[if t == "position_ids" { 1 } else { 0 }] = 0;
        if t == "deepstack" {
            e.1[1] = 0;
        }
        e.2.clear();
    }
    refuse(dir, "empty.st", &x, &["`input_ids` is empty"]);

    let mut x = good.clone();
    let p = x.i64s("position_ids");
    x.tensors.get_mut("position_ids").unwrap().1 = vec![39, 3];
    x.set_i64s("position_ids", &p);
    refuse(
        dir,
        "planes.st",
        &x,
        &["`position_ids`", "[39, 3]", "expected [3, 39]"],
    );

    // One image token more than image rows.
    let mut x = good.clone();
    let mut ids = x.i64s("input_ids");
    ids[0] = 510;
    x.set_i64s("input_ids", &ids);
    refuse(
        dir,
        "rows.st",
        &x,
        &["`image_embeds` has 10 rows", "11 image tokens (id 510)"],
    );

    let mut x = good.clone();
    let d = &mut x.tensors.get_mut("deepstack").unwrap();
    d.1 = vec![4, 5, 64];
    refuse(
        dir,
        "deep.st",
        &x,
        &["`deepstack`", "[4, 5, 64]", "expected [sets, 10, 64]"],
    );

    let mut x = good.clone();
    x.set_f32("image_embeds", 64 * 3 + 7, f32::NAN);
    refuse(
        dir,
        "nan.st",
        &x,
        &[
            "`image_embeds` holds NaN at [3, 7]",
            "[10, 64]",
            "must be finite",
        ],
    );
    let mut x = good.clone();
    x.set_f32("deepstack", 640 + 64 + 1, f32::NEG_INFINITY);
    refuse(
        dir,
        "inf.st",
        &x,
        &["`deepstack` holds -inf at [1, 1, 1]", "must be finite"],
    );

    let mut x = good.clone();
    x.meta.insert("rope_delta".into(), "-4".into());
    refuse(
        dir,
        "delta.st",
        &x,
        &["rope_delta = -4", "max position 33 + 1 - 39 rows = -5"],
    );

    // i64::MAX as a position: the check's arithmetic must refuse, not wrap into agreement
    // (max + 1 - rows wraps to rope_delta = i64::MIN - 39 + 1 in release builds).
    let mut x = good.clone();
    let mut p = x.i64s("position_ids");
    p[5] = i64::MAX;
    x.set_i64s("position_ids", &p);
    x.meta.insert(
        "rope_delta".into(),
        (i64::MAX.wrapping_add(1).wrapping_sub(39)).to_string(),
    );
    refuse(
        dir,
        "overflow.st",
        &x,
        &["`position_ids` holds 9223372036854775807", "overflow"],
    );
}
