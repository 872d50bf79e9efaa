//! `bench vision` run as a process on the tiny shape (its tower variant tiny-vl): the JSON object's
//! contract (every figure per kind and image, the peaks it is set against, the grids preprocessing
//! gives) and refused arguments (an unknown image size, an unknown kind) named, exit 2. No timed
//! assertion: only that each figure is there and consistent.

use serde_json::Value;

use crate::common;
use common::bench;

fn get<'a>(v: &'a Value, path: &str) -> &'a Value {
    let mut at = v;
    for key in path.split('/') {
        at = at
            .get(key)
            .unwrap_or_else(|| panic!("no {path:?} (missing {key:?}) in {v}"));
    }
    at
}

fn number(v: &Value, path: &str) -> f64 {
    let at = get(v, path);
    at.as_f64()
        .unwrap_or_else(|| panic!("{path:?} is not a number: {at}"))
}

const IMAGES: [&str; 3] = ["448x448", "1280x720", "1920x1080"];

#[test]
fn json_has_every_figure_per_kind_and_image() {
    let dir = tempfile::tempdir().unwrap();
    let pack_dir = dir.path().to_str().unwrap();
    let (code, out, err) = bench(&[
        "vision",
        "--shape",
        "tiny",
        "--json",
        "--pack-dir",
        pack_dir,
    ]);
    assert_eq!(code, 0, "{err}");
    let v: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    assert_eq!(get(&v, "shape"), "tiny-vl", "tiny runs its tower variant");
    assert!(number(&v, "peaks_gmac_s/f32_fma_ymm") > 0.0);
    // tiny-vl's budget is 32² to 128² pixels, factor 32: transformers' smart_resize (run in
    // Python) gives 448x448 -> 128x128, 1280x720 and 1920x1080 -> 160x96 (grids in 16-pixel
    // patches).
    for (image, grid, tokens) in [
        ("448x448", [1, 8, 8], 16),
        ("1280x720", [1, 6, 10], 15),
        ("1920x1080", [1, 6, 10], 15),
    ] {
        let g: Vec<u64> = get(&v, &format!("images/{image}/grid"))
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap())
            .collect();
        assert_eq!(g, grid, "{image}");
        assert_eq!(number(&v, &format!("images/{image}/tokens")), tokens as f64);
        // Either measured or marked not measured (null) while preprocessing is not built.
        let p = get(&v, &format!("images/{image}/preprocess_ms"));
        assert!(p.is_null() || p.as_f64().unwrap() > 0.0, "{image}: {p}");
    }
    for kind in ["f32", "bf16", "i8", "q4"] {
        let peak = get(&v, &format!("kinds/{kind}/peak")).as_str().unwrap();
        assert_eq!(
            number(&v, &format!("kinds/{kind}/peak_gmac_s")),
            number(&v, &format!("peaks_gmac_s/{peak}")),
            "{kind}: the peak it is set against is one of the measured ones"
        );
        if matches!(kind, "f32" | "bf16") {
            assert_eq!(peak, "f32_fma_ymm");
        } else {
            assert!(peak.starts_with("i8_"), "{kind}: {peak}");
        }
        for image in IMAGES {
            let at = |key: &str| number(&v, &format!("kinds/{kind}/images/{image}/{key}"));
            for key in [
                "tower_ms",
                "gemm_ms",
                "gemm_gmac",
                "gemm_gmac_s",
                "gemm_peak_pct",
                "attention_ms",
                "prefill_ms",
                "ttft_ms",
            ] {
                assert!(at(key) > 0.0, "{kind} {image} {key}");
            }
            // The parts are within the whole; TTFT is tower + prefill.
            assert!(at("gemm_ms") + at("attention_ms") <= at("tower_ms") * 1.001 + 0.002);
            assert!((at("ttft_ms") - at("tower_ms") - at("prefill_ms")).abs() < 0.01);
            // Prefill rows: the image's tokens, vision start and end, 16 text rows.
            let tokens = number(&v, &format!("images/{image}/tokens"));
            assert_eq!(at("prefill_rows"), tokens + 18.0, "{kind} {image}");
        }
    }
}

#[test]
fn the_gemm_count_is_every_linear_of_the_tower() {
    // 448x448 on tiny-vl: 64 patches, 16 tokens; hidden 32, inter 64, out 64, patch row 1536,
    // merged 128, depth 2, three mergers. Patch 64·32·1536 = 3 145 728; blocks
    // 2·64·(3·32·32 + 32·32 + 2·64·32) = 1 048 576; mergers 3·16·(128·128 + 64·128) = 1 179 648.
    let dir = tempfile::tempdir().unwrap();
    let (code, out, err) = bench(&[
        "vision",
        "--shape",
        "tiny",
        "--kinds",
        "f32",
        "--images",
        "448x448",
        "--json",
        "--pack-dir",
        dir.path().to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{err}");
    let v: Value = serde_json::from_str(&out).unwrap();
    let gmac = number(&v, "kinds/f32/images/448x448/gemm_gmac");
    assert_eq!(
        gmac,
        ((3_145_728.0f64 + 1_048_576.0 + 1_179_648.0) / 1e9 * 100.0).round() / 100.0
    );
    assert!(
        get(&v, "kinds").get("q4").is_none(),
        "--kinds f32 runs f32 only"
    );
}

#[test]
fn bad_image_sizes_and_kinds_are_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let pack_dir = dir.path().to_str().unwrap();
    for (args, named) in [
        (vec!["--images", "1280x"], "\"1280x\""),
        (vec!["--images", "448x448,wide"], "\"wide\""),
        (vec!["--images", "0x720"], "\"0x720\""),
        (vec!["--kinds", "f16"], "f16"),
    ] {
        let mut all = vec!["vision", "--shape", "tiny", "--pack-dir", pack_dir];
        all.extend(args.iter().copied());
        let (code, _, err) = bench(&all);
        assert_eq!(code, 2, "{args:?}: {err}");
        assert!(err.contains(named), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{err}");
    }
    // Control: the same command with a good size and kind runs.
    let (code, _, err) = bench(&[
        "vision",
        "--shape",
        "tiny",
        "--pack-dir",
        pack_dir,
        "--images",
        "64x64",
        "--kinds",
        "q4",
    ]);
    assert_eq!(code, 0, "{err}");
}
