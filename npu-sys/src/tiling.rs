//! The tiling of a design on the AIE array: how a geometry's C [m_tile x n] is split over the
//! compute cores (rows split M, columns split N) and which per-core tile (m, k, n) each runs,
//! so that the core's and the memory tile's buffers (double-buffered, as mlir-aie's
//! whole-array matrix-multiplication example does) fit their memories.

use crate::geometry::{DesignKind, Geometry, Q4_GROUP};

/// Data memory of one AIE-ML / AIE2P compute core, less 4 KiB kept for stack and locals.
pub const CORE_BUDGET: usize = 64 * 1024 - 4 * 1024;
/// Memory of one memory tile (512 KiB on both generations).
pub const MEM_TILE_BUDGET: usize = 512 * 1024;
/// Compute rows per column.
pub const CORE_ROWS: usize = 4;
/// The int8 matmul intrinsic's granularity (r, s, t): m, k and n of a core tile are multiples.
const MMUL_R: usize = 4;
const MMUL_S: usize = 8;
const MMUL_T: usize = 8;

/// The NPU generation a design is built for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum NpuTarget {
    /// XDNA (Phoenix, Hawk Point): 4 columns.
    Npu1,
    /// XDNA2 (Strix, Krackan): 8 columns.
    Npu2,
}

impl NpuTarget {
    pub fn columns(self) -> usize {
        match self {
            NpuTarget::Npu1 => 4,
            NpuTarget::Npu2 => 8,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            NpuTarget::Npu1 => "npu1",
            NpuTarget::Npu2 => "npu2",
        }
    }
}

/// The split of one geometry over the array.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tiling {
    pub columns: usize,
    pub rows: usize,
    /// Per-core tile.
    pub m: usize,
    pub k: usize,
    pub n: usize,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TilingError {
    #[error("{geometry:?}: no per-core tile divides M {m}, K {k}, N {n} within the core budget of {CORE_BUDGET} bytes and the memory tile budget of {MEM_TILE_BUDGET} bytes", m = geometry.m_tile, k = geometry.k, n = geometry.n)]
    NoFit { geometry: Geometry },
}

/// Bytes of B for a k x n core tile: int8 codes, or q4 nibbles plus one bf16 scale per group.
pub fn b_tile_bytes(kind: DesignKind, k: usize, n: usize) -> usize {
    match kind {
        DesignKind::I8 => k * n,
        DesignKind::Q4 => k * n / 2 + (k / Q4_GROUP) * n * 2,
    }
}

impl Tiling {
    /// Core memory: A, B and C double-buffered (C is 4-byte: int32 or f32).
    pub fn core_bytes(&self, kind: DesignKind) -> usize {
        2 * (self.m * self.k + b_tile_bytes(kind, self.k, self.n) + self.m * self.n * 4)
    }

    /// One column's memory tile: A for its rows, its B and its C, double-buffered.
    pub fn mem_tile_bytes(&self, kind: DesignKind) -> usize {
        2 * (self.rows * self.m * self.k
            + b_tile_bytes(kind, self.k, self.n)
            + self.rows * self.m * self.n * 4)
    }
}

fn divisors_desc(value: usize, step: usize, cap: usize) -> impl Iterator<Item = usize> {
    (1..=cap.min(value) / step)
        .rev()
        .map(move |i| i * step)
        .filter(move |d| value.is_multiple_of(*d))
}

/// The tiling of `geometry` on `target`: the most columns that split N evenly, the most rows
/// that split M evenly, then the largest core tile (by MACs per tile) that fits both budgets.
pub fn tiling_for(geometry: Geometry, target: NpuTarget) -> Result<Tiling, TilingError> {
    let Geometry { kind, m_tile, k, n } = geometry;
    let k_step = match kind {
        DesignKind::I8 => MMUL_S,
        DesignKind::Q4 => Q4_GROUP,
    };
    let no_fit = TilingError::NoFit { geometry };
    if m_tile == 0 || k == 0 || n == 0 || !k.is_multiple_of(k_step) {
        return Err(no_fit);
    }
    let columns = (1..=target.columns())
        .rev()
        .find(|c| n.is_multiple_of(c * MMUL_T))
        .ok_or(no_fit.clone())?;
    let rows = (1..=CORE_ROWS)
        .rev()
        .find(|r| m_tile.is_multiple_of(r * MMUL_R))
        .ok_or(no_fit.clone())?;
    let (m_core, n_col) = (m_tile / rows, n / columns);
    let mut best: Option<Tiling> = None;
    for m in divisors_desc(m_core, MMUL_R, 64) {
        for kt in divisors_desc(k, k_step, 256) {
            for nt in divisors_desc(n_col, MMUL_T, 128) {
                let t = Tiling {
                    columns,
                    rows,
                    m,
                    k: kt,
                    n: nt,
                };
                if t.core_bytes(kind) > CORE_BUDGET || t.mem_tile_bytes(kind) > MEM_TILE_BUDGET {
                    continue;
                }
                let better = best.is_none_or(|b| m * kt * nt > b.m * b.k * b.n);
                if better {
                    best = Some(t);
                }
            }
        }
    }
    best.ok_or(no_fit)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::{design_n, M_TILES};

    /// (K, N) of every linear: the 2B decoder, the 2B vision tower, 30B-A3B's decoder.
    const SHAPES_2B: [(usize, usize); 5] = [
        (2048, 2048),
        (2048, 1024),
        (2048, 6144),
        (6144, 2048),
        (2048, 151936),
    ];
    const SHAPES_VISION_2B: [(usize, usize); 6] = [
        (1024, 3072),
        (1024, 1024),
        (1024, 4096),
        (4096, 1024),
        (1536, 1024),
        (4096, 2048),
    ];
    const SHAPES_30B: [(usize, usize); 6] = [
        (2048, 4096),
        (4096, 2048),
        (2048, 512),
        (2048, 768),
        (768, 2048),
        (2048, 151936),
    ];

    fn check_all(shapes: &[(usize, usize)]) {
        for target in [NpuTarget::Npu1, NpuTarget::Npu2] {
            for kind in [DesignKind::I8, DesignKind::Q4] {
                for &(k, n) in shapes {
                    for m_tile in M_TILES {
                        let g = Geometry::new(kind, m_tile, k, design_n(n));
                        let t = tiling_for(g, target).unwrap_or_else(|e| panic!("{e}"));
                        assert_eq!(t.columns, target.columns(), "{g:?}");
                        assert_eq!(g.m_tile % (t.rows * t.m), 0, "{g:?}");
                        assert_eq!(g.k % t.k, 0, "{g:?}");
                        assert_eq!(g.n % (t.columns * t.n), 0, "{g:?}");
                        assert!(t.core_bytes(kind) <= CORE_BUDGET, "{g:?} {t:?}");
                        assert!(t.mem_tile_bytes(kind) <= MEM_TILE_BUDGET, "{g:?} {t:?}");
                        if kind == DesignKind::Q4 {
                            assert_eq!(t.k % Q4_GROUP, 0, "{g:?}");
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn every_2b_decoder_geometry_tiles_on_both_generations() {
        check_all(&SHAPES_2B);
    }

    #[test]
    fn every_2b_vision_geometry_tiles_on_both_generations() {
        check_all(&SHAPES_VISION_2B);
    }

    #[test]
    fn every_30b_a3b_geometry_tiles_on_both_generations() {
        check_all(&SHAPES_30B);
    }

    #[test]
    fn the_budgets_bound_the_tile() {
        let g = Geometry::new(DesignKind::I8, 128, 2048, 2048);
        let t = tiling_for(g, NpuTarget::Npu1).unwrap();
        // Control: doubling any side of the chosen tile breaks the core budget or divisibility.
        let doubled = Tiling { k: t.k * 2, ..t };
        assert!(doubled.core_bytes(g.kind) > CORE_BUDGET || !g.k.is_multiple_of(doubled.k));
        assert_eq!((t.columns, t.rows), (4, 4));
    }

    #[test]
    fn a_k_off_the_q4_group_is_refused() {
        // Control: 48 is a multiple of the intrinsic's 8 but not of the q4 group of 32.
        let g = Geometry::new(DesignKind::Q4, 16, 48, 64);
        assert!(tiling_for(Geometry::new(DesignKind::I8, 16, 48, 64), NpuTarget::Npu1).is_ok());
        assert_eq!(
            tiling_for(g, NpuTarget::Npu1),
            Err(TilingError::NoFit { geometry: g })
        );
    }

    #[test]
    fn an_n_too_narrow_for_all_columns_uses_fewer() {
        let g = Geometry::new(DesignKind::I8, 16, 64, 24);
        assert_eq!(tiling_for(g, NpuTarget::Npu2).unwrap().columns, 3);
    }
}
