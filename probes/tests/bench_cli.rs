//! `bench` run as a process on the tiny random shape: the JSON object the host-GEMM issue names
//! (every key, per kind), the split of a decode step, and a refused bad argument.

use serde_json::Value;

mod common;
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
    }
    for kind in ["q4", "i8"] {
        for key in [
            "decode_tok_s",
            "decode_tok_s_ctx512",
            "prefill_tok_s.16",
            "prefill_tok_s.128",
            "prefill_tok_s.512",
            "prefill_tok_s.2048",
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
    }
    // Control: a kind the bench does not know is refused by name, with no JSON.
    let (code, out, err) = bench(&["--shape", "tiny", "--kinds", "q3", "--json"]);
    assert_ne!(code, 0);
    assert!(out.is_empty(), "{out}");
    assert!(err.contains("q3"), "{err}");
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
