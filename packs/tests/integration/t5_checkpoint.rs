//! A checkpoint as transformers 5 saves a fine-tune (tests/fixtures/t5-checkpoint, made by
//! tools/t5_checkpoint.py): `processor_config.json` with the image processor nested under
//! `image_processor`, no `preprocessor_config.json`. The pack carries its tower with the
//! preprocessing transformers built from those files; without `processor_config.json` it is a
//! text pack that says why; planted mistakes in the nested settings are refused by key.

use std::path::{Path, PathBuf};

use packs::{build_from_hf, BuildOptions, BuildReport, Pack, QuantKind};
use serde_json::{json, Value};

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/t5-checkpoint")
}

fn checkpoint() -> PathBuf {
    fixture().join("Qwen3-VL-t5")
}

fn case() -> Value {
    serde_json::from_slice(&std::fs::read(fixture().join("case.json")).unwrap()).unwrap()
}

/// A copy of the checkpoint at `to`, for editing.
fn copy_checkpoint(to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(checkpoint()).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), to.join(entry.file_name())).unwrap();
    }
}

fn edit_json(path: &Path, edit: impl FnOnce(&mut Value)) {
    let mut v: Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
    edit(&mut v);
    std::fs::write(path, serde_json::to_vec_pretty(&v).unwrap()).unwrap();
}

fn build(dir: &Path, opts: &BuildOptions) -> Result<(Pack, BuildReport), String> {
    let out = dir.with_extension("pack");
    let report = build_from_hf(dir, &out, opts).map_err(|e| e.to_string())?;
    Ok((Pack::open(&out).unwrap(), report))
}

/// The preprocessing a pack carries, against the image processor transformers built from the
/// checkpoint's files (case.json's `image_processor`, read from the loaded object).
fn assert_transformers_preprocessing(pack: &Pack, want: &Value) {
    let p = pack.semantics().preprocess.as_ref().expect("preprocessing");
    let u = |k: &str| want[k].as_u64().unwrap_or_else(|| panic!("{k}"));
    let f3 = |k: &str| -> [f64; 3] {
        let a: Vec<f64> = want[k]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_f64().unwrap())
            .collect();
        [a[0], a[1], a[2]]
    };
    let b = |k: &str| want[k].as_bool().unwrap();
    assert_eq!(
        (p.min_pixels, p.max_pixels),
        (u("min_pixels"), u("max_pixels"))
    );
    assert_eq!(
        (p.patch_size, p.merge_size, p.temporal_patch_size),
        (
            u("patch_size") as usize,
            u("merge_size") as usize,
            u("temporal_patch_size") as usize
        )
    );
    assert_eq!(
        (p.image_mean, p.image_std),
        (f3("image_mean"), f3("image_std"))
    );
    assert_eq!(p.rescale_factor, want["rescale_factor"].as_f64().unwrap());
    assert_eq!(
        (p.do_resize, p.do_rescale, p.do_normalize, p.do_convert_rgb),
        (
            b("do_resize"),
            b("do_rescale"),
            b("do_normalize"),
            b("do_convert_rgb")
        )
    );
    assert_eq!(p.resample as u64, u("resample"));
}

#[test]
fn the_tower_is_carried_with_the_preprocessing_transformers_built() {
    let case = case();
    // The fixture is what transformers 5 writes: the processor nested, no preprocessor_config.json.
    let files: Vec<&str> = case["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f.as_str().unwrap())
        .collect();
    assert!(files.contains(&"processor_config.json"), "{files:?}");
    assert!(!files.contains(&"preprocessor_config.json"), "{files:?}");
    assert!(!checkpoint().join("preprocessor_config.json").exists());

    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("ck");
    copy_checkpoint(&dir);
    let (pack, report) = build(&dir, &BuildOptions::new(QuantKind::F32)).unwrap();
    assert!(report.warnings.is_empty(), "{:?}", report.warnings);
    let sem = pack.semantics();
    let v = sem.vision.as_ref().expect("the tower");
    let spec = &case["spec"]["vision"];
    assert_eq!(
        (v.depth, v.hidden_size, v.num_heads, v.intermediate_size),
        (
            spec["depth"].as_u64().unwrap() as usize,
            spec["hidden_size"].as_u64().unwrap() as usize,
            spec["num_heads"].as_u64().unwrap() as usize,
            spec["intermediate_size"].as_u64().unwrap() as usize
        )
    );
    assert!(pack.tensor(packs::names::visual::PATCH_EMBED).is_some());
    assert_transformers_preprocessing(&pack, &case["image_processor"]);
    // Not transformers' class defaults: the nested settings were read.
    let p = sem.preprocess.as_ref().unwrap();
    assert_ne!(
        (p.min_pixels, p.max_pixels),
        (
            packs::image_processor::DEFAULT_MIN_PIXELS,
            packs::image_processor::DEFAULT_MAX_PIXELS
        )
    );

    // The chat files and the processor config are carried as the checkpoint has them.
    for file in [
        "tokenizer.json",
        "tokenizer_config.json",
        "chat_template.jinja",
        "processor_config.json",
    ] {
        let want = std::fs::read(checkpoint().join(file)).unwrap();
        assert_eq!(pack.asset(file), Some(&want[..]), "{file}");
    }
    assert_eq!(pack.asset("preprocessor_config.json"), None);
}

#[test]
fn without_processor_config_the_pack_is_text_only_and_says_why() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("ck");
    copy_checkpoint(&dir);
    std::fs::remove_file(dir.join("processor_config.json")).unwrap();
    let (pack, report) = build(&dir, &BuildOptions::new(QuantKind::F32)).unwrap();
    assert!(pack.semantics().vision.is_none() && pack.semantics().preprocess.is_none());
    assert!(
        report
            .warnings
            .iter()
            .any(|w| w.contains("no preprocessor_config.json")
                && w.contains("no processor_config.json")
                && w.contains("vision tower is left out")),
        "{:?}",
        report.warnings
    );
}

#[test]
fn processor_config_wins_over_a_preprocessor_config_beside_it() {
    let want = &case()["image_processor"];
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("ck");
    copy_checkpoint(&dir);
    // A preprocessor_config.json with other limits (the tiny chat checkpoint's: 1024..4194304).
    let other = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures/chat/Qwen3-VL-tiny/preprocessor_config.json");
    std::fs::copy(&other, dir.join("preprocessor_config.json")).unwrap();
    let (pack, report) = build(&dir, &BuildOptions::new(QuantKind::F32)).unwrap();
    assert_transformers_preprocessing(&pack, want);
    assert!(
        report.warnings.iter().any(|w| w
            .contains("preprocessor_config.json: ignored, as transformers 5 ignores it")
            && w.contains("processor_config.json (image_processor)")
            && w.contains("1024/4194304 there")),
        "{:?}",
        report.warnings
    );
    // Control: a processor_config.json without the image processor (as older processors wrote)
    // defers to preprocessor_config.json, as transformers does.
    edit_json(&dir.join("processor_config.json"), |c| {
        c.as_object_mut().unwrap().remove("image_processor");
    });
    let (pack, report) = build(&dir, &BuildOptions::new(QuantKind::F32)).unwrap();
    let p = pack.semantics().preprocess.as_ref().unwrap();
    assert_eq!((p.min_pixels, p.max_pixels), (1024, 4_194_304));
    assert!(report.warnings.is_empty(), "{:?}", report.warnings);
}

type Plant = Box<dyn Fn(&mut Value)>;

#[test]
fn planted_mistakes_in_the_nested_settings_are_refused_by_key() {
    let cases: Vec<(&str, Plant, Vec<&str>)> = vec![
        (
            "size spelled min_pixels / max_pixels",
            Box::new(|c: &mut Value| {
                c["image_processor"]["size"] = json!({"min_pixels": 16384, "max_pixels": 65536})
            }),
            vec![
                "processor_config.json: image_processor.size.m",
                "does not resize by this spelling",
                "write it as size.",
            ],
        ),
        (
            "only one edge",
            Box::new(|c: &mut Value| {
                c["image_processor"]["size"] = json!({"shortest_edge": 16384})
            }),
            vec![
                "processor_config.json: image_processor.size.longest_edge: missing",
                "state both",
            ],
        ),
        (
            "no image processor and no preprocessor_config.json",
            Box::new(|c: &mut Value| {
                c.as_object_mut().unwrap().remove("image_processor");
            }),
            vec![
                "processor_config.json: image_processor: missing",
                "no preprocessor_config.json beside it",
                "processor.save_pretrained",
                "--no-vision",
            ],
        ),
        (
            "an image processor that is not an object",
            Box::new(|c: &mut Value| c["image_processor"] = json!("Qwen2VLImageProcessor")),
            vec!["image_processor: expected an object"],
        ),
        (
            "a mean of the wrong type",
            Box::new(|c: &mut Value| c["image_processor"]["image_mean"] = json!("0.5")),
            vec![
                "processor_config.json: image_processor.image_mean: expected three numbers",
            ],
        ),
        (
            "a limit of the wrong type",
            Box::new(|c: &mut Value| c["image_processor"]["max_pixels"] = json!(65536.5)),
            vec![
                "processor_config.json: image_processor.max_pixels: expected a non-negative integer",
            ],
        ),
        (
            "a patch size against the tower's",
            Box::new(|c: &mut Value| c["image_processor"]["patch_size"] = json!(14)),
            vec!["processor_config.json: image_processor: patch_size = 14 differs from the tower's 16"],
        ),
        (
            "min pixels above max",
            Box::new(|c: &mut Value| c["image_processor"]["min_pixels"] = json!(100000)),
            vec![
                "processor_config.json: image_processor: size.shortest_edge (min pixels) 100000",
                "65536",
            ],
        ),
    ];
    for (what, plant, needles) in cases {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("ck");
        copy_checkpoint(&dir);
        edit_json(&dir.join("processor_config.json"), |c| plant(c));
        let out = dir.with_extension("pack");
        let err = build_from_hf(&dir, &out, &BuildOptions::new(QuantKind::F32))
            .map(|_| ())
            .expect_err(what)
            .to_string();
        for n in needles {
            assert!(err.contains(n), "{what}: {err:?} lacks {n:?}");
        }
        assert!(!out.exists(), "{what}: a pack was left behind");
        // Control: --no-vision does not read the processor and builds a text pack.
        let opts = BuildOptions {
            vision: false,
            ..BuildOptions::new(QuantKind::F32)
        };
        build_from_hf(&dir, &out, &opts).unwrap_or_else(|e| panic!("{what}: text pack: {e}"));
    }
}
