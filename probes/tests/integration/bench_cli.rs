//! `bench` run as a process on the tiny random shape: the JSON object the host-GEMM issue names
//! (every key, per kind), the split of a decode step, the bf16 KV cache beside the f32 one, and a
//! refused bad argument.

use serde_json::Value;

use crate::common;
use common::bench;

fn number(v: &Value, path: &str) -> f64 {
    let mut at = v;
    for key in path.split('.') {
        at = at
            .get(key)
            .unwrap_or_else(|| panic!("no {path:?} (missing {key:?}) in {v}"));
    }
    at.as_f64()
        .unwrap_or_else(|| panic!("{path:?} is not a number: {at}"))
}

#[test]
fn json_has_every_figure_per_kind_and_splits_the_step() {
    let dir = tempfile::tempdir().unwrap();
    let pack_dir = dir.path().to_str().unwrap();
    let args = [
        "--shape",
        "tiny",
        "--kinds",
        "q4,i8",
        "--json",
        "--pack-dir",
        pack_dir,
    ];
    let (code, out, err) = bench(&args);
    assert_eq!(code, 0, "{err}");
    let v: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    assert!(number(&v, "read_gb_s") > 0.0);
    // The peaks the prefills are set against, measured in the same run.
    for key in ["int8_gmac_s", "f32_fma_gmac_s"] {
        assert!(number(&v, &format!("peaks_gmac_s.{key}")) > 0.0, "{key}");
        assert!(
            number(&v, &format!("peaks_gmac_s_end.{key}")) > 0.0,
            "{key} at the end"
        );
    }
    for kind in ["q4", "i8"] {
        for key in [
            "decode_tok_s",
            "decode_tok_s_ctx512",
            "prefill_tok_s.16",
            "prefill_tok_s.128",
            "prefill_tok_s.512",
            "prefill_tok_s.2048",
            "prefill_reps",
            "roofline_pct",
            "peak_rss_mb",
            "kv_bytes_per_token",
        ] {
            assert!(
                number(&v, &format!("kinds.{kind}.{key}")) > 0.0,
                "{kind} {key}"
            );
        }
        // Each prefill case: its GEMMs and attention are parts of it, and its share of the peak
        // is its GEMMs' share or less; 512 and 2048 rows are image prompts, 128 plain text.
        for rows in ["128", "512", "2048"] {
            let ms = 1e3 * rows.parse::<f64>().unwrap()
                / number(&v, &format!("kinds.{kind}.prefill_tok_s.{rows}"));
            let gemm = number(&v, &format!("kinds.{kind}.prefill_gemm_ms.{rows}"));
            let attention = number(&v, &format!("kinds.{kind}.prefill_attention_ms.{rows}"));
            assert!(
                gemm > 0.0 && attention > 0.0 && gemm + attention <= ms + 0.01,
                "{kind} {rows}: GEMMs {gemm} ms + attention {attention} ms > prefill {ms} ms"
            );
            assert!(number(&v, &format!("kinds.{kind}.prefill_gemm_gmac_s.{rows}")) > 0.0);
            let gemm_pct = number(&v, &format!("kinds.{kind}.prefill_gemm_peak_pct.{rows}"));
            let whole_pct = number(&v, &format!("kinds.{kind}.prefill_peak_pct.{rows}"));
            assert!(
                whole_pct > 0.0 && whole_pct <= gemm_pct + 0.01,
                "{kind} {rows}: whole {whole_pct}% vs GEMMs {gemm_pct}%"
            );
            let prompt = v["kinds"][kind]["prefill_prompt"][rows]
                .as_str()
                .unwrap_or("");
            let image = rows != "128";
            assert_eq!(
                prompt.starts_with("image "),
                image,
                "{kind} {rows}: {prompt}"
            );
        }
        assert!(number(&v, &format!("kinds.{kind}.macs_per_row")) > 0.0);
        // Attention is part of the work outside the GEMMs, never more than it.
        for ctx in ["ctx0", "ctx512", "ctx512_kv_bf16"] {
            let non_gemm = number(&v, &format!("kinds.{kind}.non_gemm_ms_{ctx}"));
            let attention = number(&v, &format!("kinds.{kind}.attention_ms_{ctx}"));
            assert!(
                attention > 0.0 && attention <= non_gemm,
                "{kind} {ctx}: attention {attention} ms, non-GEMM {non_gemm} ms"
            );
        }
        let kv = number(&v, &format!("kinds.{kind}.kv_bytes_per_token"));
        let kv_bf16 = number(&v, &format!("kinds.{kind}.kv_bf16_bytes_per_token"));
        assert_eq!(
            kv,
            2.0 * kv_bf16,
            "{kind}: the bf16 cache holds half the bytes"
        );
        // The bf16 cache decodes the f32 cache's prompt and tokens: its rounding alone tells them
        // apart (on the tiny shape the logits move by a few hundredths).
        let same_argmax = number(&v, &format!("kinds.{kind}.kv_bf16_same_argmax"));
        let max_diff = number(&v, &format!("kinds.{kind}.kv_bf16_max_abs_logit_diff"));
        assert!(
            same_argmax >= 0.9 && max_diff < 0.25,
            "{kind}: bf16 vs f32 cache: same argmax {same_argmax}, max |dlogit| {max_diff}"
        );
    }
    // Control: a kind the bench does not know is refused by name, with no JSON.
    let (code, out, err) = bench(&["--shape", "tiny", "--kinds", "q3", "--json"]);
    assert_ne!(code, 0);
    assert!(out.is_empty(), "{out}");
    assert!(err.contains("q3"), "{err}");
}

/// `bench decode` on the tiny shape into a fresh pack directory: exit code, stdout, stderr, and
/// whether a pack was made.
fn decode(args: &[&str]) -> (i32, String, String, bool) {
    let dir = tempfile::tempdir().unwrap();
    let pack_dir = dir.path().to_str().unwrap();
    let mut all = vec!["decode", "--shape", "tiny", "--kinds", "q4", "--json"];
    all.extend_from_slice(&["--pack-dir", pack_dir]);
    all.extend_from_slice(args);
    let (code, out, err) = bench(&all);
    let made = std::fs::read_dir(dir.path()).unwrap().next().is_some();
    (code, out, err, made)
}

#[test]
fn decode_at_contexts_reports_each_context_against_ctx0() {
    // ctx 0 is not named: it is the baseline and always runs.
    let (code, out, err, _) = decode(&["--ctx", "600,64", "--kv", "bf16,f32", "--steps", "2"]);
    assert_eq!(code, 0, "{err}");
    let v: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    assert_eq!(v["ctx"], serde_json::json!([0, 64, 600]));
    for kv in ["bf16", "f32"] {
        for ctx in ["0", "64", "600"] {
            let at = format!("kinds.q4.kv.{kv}.ctx.{ctx}");
            assert!(number(&v, &format!("{at}.tok_s")) > 0.0, "{at}");
            assert!(number(&v, &format!("{at}.ms_per_token")) > 0.0, "{at}");
        }
        let base = format!("kinds.q4.kv.{kv}.ctx.0");
        assert_eq!(number(&v, &format!("{base}.ratio_to_ctx0")), 1.0);
        assert_eq!(number(&v, &format!("{base}.bandwidth_ratio")), 1.0);
        // The bytes a step reads grow with the context: so does the ratio they predict.
        let at64 = number(&v, &format!("kinds.q4.kv.{kv}.ctx.64.bandwidth_ratio"));
        let at600 = number(&v, &format!("kinds.q4.kv.{kv}.ctx.600.bandwidth_ratio"));
        assert!(1.0 < at64 && at64 < at600, "{kv}: {at64} {at600}");
        assert!(number(&v, &format!("kinds.q4.kv.{kv}.fill_prefill_s")) > 0.0);
    }
    let f32_token = number(&v, "kinds.q4.kv.f32.kv_bytes_per_token");
    assert_eq!(
        f32_token,
        2.0 * number(&v, "kinds.q4.kv.bf16.kv_bytes_per_token")
    );
    assert_eq!(
        number(&v, "kinds.q4.kv.bf16.ctx.600.kv_bytes_per_step"),
        600.0 * f32_token / 2.0
    );
    // Issue 19's target is at 4096 with the bf16 cache: no verdict without that context ...
    assert!(v["long_context_target"]["kinds"]["q4"].is_null(), "{out}");
    // ... and with it, the bf16 ratio at 4096 against 1.15.
    let (code, out, err, _) = decode(&["--ctx", "4096", "--kv", "bf16", "--steps", "1"]);
    assert_eq!(code, 0, "{err}");
    let v: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    let ratio = number(&v, "long_context_target.kinds.q4.ratio");
    assert_eq!(ratio, number(&v, "kinds.q4.kv.bf16.ctx.4096.ratio_to_ctx0"));
    assert_eq!(
        v["long_context_target"]["kinds"]["q4"]["meets"].as_bool(),
        Some(ratio <= 1.15)
    );
}

#[test]
fn decode_refuses_bad_contexts_and_kv_types_before_making_a_pack() {
    for (args, says) in [
        (&["--ctx", "262140"][..], "262144"),
        (&["--ctx", "300000"], "max_position_embeddings"),
        (&["--ctx", ""], "names no context"),
        (&["--ctx", ","], "names no context"),
        (&["--ctx", "2k"], "\"2k\""),
        (&["--ctx=-1"], "\"-1\""),
        (&["--kv", "f16"], "f16"),
        (&["--kv", ""], "names no KV cache type"),
        (&["--steps", "0"], "--steps"),
    ] {
        let (code, out, err, made) = decode(args);
        assert_eq!(code, 2, "{args:?}: {err}");
        assert!(out.is_empty(), "{args:?}: {out}");
        assert!(err.contains(says), "{args:?}: {err}");
        assert!(!made, "{args:?}: a pack was made before the refusal");
    }
    // Control: the same runner with a valid context runs and makes the pack (so the refusals
    // above are the arguments', not the runner's).
    let (code, out, err, made) = decode(&["--ctx", "8", "--kv", "bf16", "--steps", "1"]);
    assert_eq!(code, 0, "{err}");
    assert!(made && out.contains("\"ctx\""), "{out}");
}

/// `bench attention --rows N` times a prefill's attention and sets it against the peaks of the same
/// run; `--rows 0` is refused by name (control: `--rows 4` on the tiny shape runs).
#[test]
fn attention_prefill_rows_are_timed_and_zero_rows_refused() {
    let dir = tempfile::tempdir().unwrap();
    let pack_dir = dir.path().to_str().unwrap();
    let (code, out, err) = bench(&[
        "attention",
        "--shape",
        "tiny",
        "--rows",
        "0",
        "--json",
        "--pack-dir",
        pack_dir,
    ]);
    assert_ne!(code, 0);
    assert!(out.is_empty(), "{out}");
    assert!(err.contains("--rows"), "{err}");
    let (code, out, err) = bench(&[
        "attention",
        "--shape",
        "tiny",
        "--rows",
        "4",
        "--context",
        "3",
        "--json",
        "--pack-dir",
        pack_dir,
    ]);
    assert_eq!(code, 0, "{err}");
    let v: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    assert_eq!(number(&v, "rows"), 4.0);
    assert!(number(&v, "macs") > 0.0);
    for kv in ["f32", "bf16"] {
        for key in ["ms", "gmac_s", "f32_fma_peak_pct", "f32_mul_add_peak_pct"] {
            assert!(
                number(&v, &format!("attention.{kv}.{key}")) > 0.0,
                "{kv} {key}"
            );
        }
    }
}

/// `bench gemm` labels each GEMM with the shape it times, read from the pack: on the tiny shape
/// (hidden 64, 4 x 16 query and 2 x 16 KV dims, intermediate 128, vocab 256) no label may name the
/// 2B model's sizes, which the labels once did whatever `--shape`.
#[test]
fn gemm_labels_name_the_timed_shape() {
    let dir = tempfile::tempdir().unwrap();
    let pack_dir = dir.path().to_str().unwrap();
    let (code, out, err) = bench(&[
        "gemm",
        "--shape",
        "tiny",
        "--kinds",
        "q4",
        "--rows",
        "4",
        "--isa",
        "scalar",
        "--json",
        "--pack-dir",
        pack_dir,
    ]);
    assert_eq!(code, 0, "{err}");
    let v: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    let cases = v["gemm"]["q4"].as_array().expect("a list of q4 cases");
    let mut labels: Vec<&str> = cases.iter().filter_map(|c| c["gemm"].as_str()).collect();
    labels.sort();
    labels.dedup();
    assert_eq!(
        labels,
        [
            "down 64x128",
            "gate/up 128x64",
            "head 256x64",
            "k/v  32x64",
            "q/o  64x64"
        ],
        "{out}"
    );
}

/// `bench drafts` decodes with oracle draft windows to the plain run's ids in fewer forwards;
/// `--k 0` is refused by name (control: `--k 3` on the tiny shape runs).
#[test]
fn drafts_give_the_plain_ids_in_fewer_forwards_and_k_0_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let pack_dir = dir.path().to_str().unwrap();
    let args = |k: &'static str| {
        [
            "drafts",
            "--shape",
            "tiny",
            "--kinds",
            "q4",
            "--k",
            k,
            "--tokens",
            "17",
            "--json",
            "--pack-dir",
            pack_dir,
        ]
    };
    let (code, out, err) = bench(&args("0"));
    assert_eq!(code, 2, "{out}");
    assert!(err.contains("--k 0"), "{err}");
    let (code, out, err) = bench(&args("3"));
    assert_eq!(code, 0, "{err}");
    let v: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    assert_eq!(v["kinds"]["q4"]["ids_identical"], true);
    // 16 decode tokens, 4 a forward (the sampled token and 3 confirmed drafts).
    assert_eq!(number(&v, "kinds.q4.forwards"), 4.0);
    assert!(number(&v, "kinds.q4.drafts_tok_s") > 0.0);
}
