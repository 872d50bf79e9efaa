//! The random-weight packs the benchmarks run on: made once per shape, kind and seed, kept in
//! `--pack-dir`.

use crate::{refuse, Common};
use packs::random::{write_random, RandomShape};
use packs::{Pack, PackError, QuantKind, TensorKind};
use std::sync::Arc;
use std::time::Instant;

/// Opens the cached random pack of `kind`, making it first if absent or of an older pack format.
pub fn pack_for(c: &Common, shape: &RandomShape, kind: QuantKind) -> Arc<Pack> {
    let path = c
        .pack_dir
        .join(format!("{}-{}-seed{}.pack", shape.name, kind, c.seed));
    if let Err(PackError::Format { found, .. }) = Pack::open(&path) {
        eprintln!(
            "{} has pack format {found:?}, not {:?}: making it again",
            path.display(),
            packs::FORMAT
        );
        if let Err(e) = std::fs::remove_file(&path) {
            refuse(format!("cannot remove {}: {e}", path.display()));
        }
    }
    if !path.exists() {
        eprintln!("making {} (once; kept for later runs)", path.display());
        let t = Instant::now();
        if let Err(e) = write_random(shape, kind, c.seed, &path) {
            refuse(format!("cannot write {}: {e}", path.display()));
        }
        eprintln!("  made in {:.1} s", t.elapsed().as_secs_f64());
    }
    match Pack::open(&path) {
        Ok(p) => Arc::new(p),
        Err(e) => refuse(format!("{e} (delete {} to remake it)", path.display())),
    }
}

/// The vision tower's tensors (`packs::names::visual`): a decode step reads none of them.
const VISION_PREFIX: &str = "model.visual.";
/// Qwen3.5's multi-token-prediction head (`packs::names::mtp`): read only when it drafts.
const MTP_PREFIX: &str = "mtp.";
/// A routed expert's tensors (`packs::moe::expert`): a token reads `top_k` of each layer's.
const EXPERT_INFIX: &str = ".mlp.experts.";

/// Bytes a decode step reads from the pack: every decoder linear weight (values or codes, and
/// scales) and norm; of a MoE pack's routed experts, the `top_k / num_experts` share a token
/// reads (the expected bytes: which experts it takes varies). The embedding contributes one row,
/// which is negligible.
pub fn pack_bytes_per_token(pack: &Pack) -> u64 {
    let routed = pack
        .semantics()
        .moe
        .as_ref()
        .map_or(1.0, |m| m.top_k as f64 / m.num_experts as f64);
    pack.tensors()
        .iter()
        .filter(|t| {
            matches!(
                t.kind,
                TensorKind::Linear | TensorKind::Scales | TensorKind::Norm
            ) && !t.name.starts_with(VISION_PREFIX)
                && !t.name.starts_with(MTP_PREFIX)
        })
        .map(|t| {
            if t.name.contains(EXPERT_INFIX) {
                (t.len as f64 * routed).round() as u64
            } else {
                t.len
            }
        })
        .sum()
}
