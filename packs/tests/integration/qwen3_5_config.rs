//! Qwen3.5 config keys the pack could otherwise read past: a config without the attention's
//! output gate is refused by name; an MTP head with embeddings of its own (which packs do not
//! carry) is left out with a warning. Control: the fixture as it is builds with its head.

use packs::build::{build_from_hf, BuildOptions};
use packs::QuantKind;

use crate::moe_pack::{copy_checkpoint, edit_config};

fn build(dir: &std::path::Path) -> Result<(packs::BuildReport, packs::Pack), String> {
    let out = tempfile::tempdir().unwrap();
    let path = out.path().join("q35.pack");
    let report =
        build_from_hf(dir, &path, &BuildOptions::new(QuantKind::F32)).map_err(|e| e.to_string())?;
    Ok((report, packs::Pack::open(&path).unwrap()))
}

fn carries_mtp(pack: &packs::Pack) -> bool {
    pack.semantics().delta_net.as_ref().is_some_and(|d| d.mtp)
}

#[test]
fn attn_output_gate_false_is_refused_and_dedicated_mtp_embeddings_leave_the_head_out() {
    let dir = copy_checkpoint("q35-odd");
    let (_, pack) = build(dir.path()).unwrap();
    assert!(carries_mtp(&pack), "control: the fixture's head is carried");

    edit_config(dir.path(), |v| {
        v["text_config"]["attn_output_gate"] = false.into()
    });
    let Err(e) = build(dir.path()) else {
        panic!("a config without the gate built");
    };
    assert!(e.contains("text_config.attn_output_gate: false"), "{e}");

    let dir = copy_checkpoint("q35-odd");
    edit_config(dir.path(), |v| {
        v["text_config"]["mtp_use_dedicated_embeddings"] = true.into()
    });
    let (report, pack) = build(dir.path()).unwrap();
    assert!(!carries_mtp(&pack));
    assert!(
        report
            .warnings
            .iter()
            .any(|w| w.contains("mtp_use_dedicated_embeddings")),
        "{:?}",
        report.warnings
    );
}
