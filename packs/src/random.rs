//! Random-weight packs with a named model shape ([`RandomShape`], defined in `crate::shapes` and
//! re-exported here), for benchmarks and tests. Values come from a counter-based hash of (seed,
//! weight, element), so a pack is reproducible whatever the block size or thread count; a tied
//! head gets exactly the embedding's values.

use std::path::Path;

use rayon::prelude::*;

use crate::build::{self, BuildReport};
use crate::error::BuildError;
use crate::layout::{WeightPlan, WeightRole};
use crate::names::EMBED;
use crate::quant::QuantKind;
pub use crate::shapes::RandomShape;

/// Writes a random-weight pack of `shape` in `quant` to `out` (atomically).
pub fn write_random(
    shape: &RandomShape,
    quant: QuantKind,
    seed: u64,
    out: &Path,
) -> Result<BuildReport, BuildError> {
    write_random_with_progress(shape, quant, seed, out, false)
}

pub fn write_random_with_progress(
    shape: &RandomShape,
    quant: QuantKind,
    seed: u64,
    out: &Path,
    progress: bool,
) -> Result<BuildReport, BuildError> {
    let sem = shape.semantics_for(quant, seed);
    sem.validate()?;
    build::write_pack(
        out,
        &sem,
        &[],
        build::Progress {
            show: progress,
            source: &|_| None,
        },
        |weight, first_row, values| {
            fill_random(seed, weight, first_row, values);
            Ok(())
        },
    )
}

/// The random values of rows `first_row..` of `weight`.
pub fn fill_random(seed: u64, weight: &WeightPlan, first_row: usize, values: &mut [f32]) {
    // An expert's linear is keyed by its own name (its source is the layer's fused tensor).
    let keyed = if weight.slice.is_some() {
        &weight.name
    } else {
        &weight.source
    };
    let key = splitmix64(seed ^ fnv1a(keyed.as_bytes()));
    let cols = weight.cols;
    // Uniform amplitudes: linears keep activations O(1) (std 1/sqrt(k)); norms near 1.
    // A tied head (source = the embedding) takes the embedding's values.
    let role = if weight.source == EMBED {
        WeightRole::Embedding
    } else {
        weight.role
    };
    let (center, amplitude) = match role {
        WeightRole::Embedding => (0.0, 0.1),
        // A zero-centred norm is stored as 1 + w: draw w near 0.
        WeightRole::Norm if weight.stored_plus_one => (0.0, 0.1),
        WeightRole::Norm => (1.0, 0.1),
        WeightRole::Linear => (0.0, (3.0 / cols as f32).sqrt()),
        // The tower's LayerNorm weights near 1, its biases and position table small.
        WeightRole::Param if weight.name.contains("norm") && weight.name.ends_with(".weight") => {
            (1.0, 0.1)
        }
        WeightRole::Param => (0.0, 0.02),
    };
    let first = (first_row * cols) as u64;
    values
        .par_chunks_mut(1 << 14)
        .enumerate()
        .for_each(|(chunk, vals)| {
            let base = first + (chunk as u64) * (1 << 14);
            for (i, v) in vals.iter_mut().enumerate() {
                let bits = splitmix64(key.wrapping_add(base + i as u64));
                // 24 random bits -> uniform in [-1, 1).
                let unit = (bits >> 40) as f32 * (1.0 / (1u64 << 23) as f32) - 1.0;
                *v = center + amplitude * unit;
            }
        });
}

fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xCBF2_9CE4_8422_2325, |h, &b| {
        (h ^ b as u64).wrapping_mul(0x0100_0000_01B3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pack::Pack;

    /// A q4 tiny-vl pack stores the tower's linears in q4 and its LayerNorms and biases in f32.
    #[test]
    fn a_tiny_vl_pack_carries_its_tower() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tiny-vl.pack");
        write_random(&RandomShape::tiny_vl(), QuantKind::Q4, 3, &path).unwrap();
        let pack = Pack::open(&path).unwrap();
        let v = pack.semantics().vision.clone().unwrap();
        assert_eq!(v.quant, QuantKind::Q4);
        let qkv = pack
            .linear(&crate::names::visual::block(1, "attn.qkv.weight"))
            .unwrap();
        assert!(matches!(qkv.data, crate::LinearData::Q4 { .. }));
        let norm = pack
            .f32_tensor(&crate::names::visual::block(1, "norm1.weight"))
            .unwrap();
        assert_eq!(norm.len(), 32);
        assert!(norm.iter().all(|w| (0.9..=1.1).contains(w)));
    }
}
