//! The tiling of a design on the AIE array: how a geometry's C [m_tile x n] is split over the
//! compute cores (rows split M, columns split N), which per-core tile (m, k, n) each runs, and
//! which shim and memory tiles carry A, B (and the q4 scales), so that every buffer fits its
//! memory and every tile's DMA channels suffice. The design sources (`designs/gemm_design.py`)
//! take these numbers from [`crate::design_params`]; they never choose a tiling themselves.
//!
//! Budgets, as mlir-aie's AIE2 target model states them (`AIETargetModel.h`: AIE2
//! `getLocalMemorySize` 0x10000, `getMemTileSize` 0x80000; npu1 and npu2 are both AIE2-family):
//! - a compute core has 64 KiB of data memory; we keep 4 KiB for its stack and locals;
//! - a memory tile has 512 KiB;
//! - every buffer is double-buffered (object FIFO depth 2), as mlir-aie's whole-array example does.
//!
//! Data movement (the whole-array example's, with one change for the q4 scales):
//! - A enters through the shims of the even columns (0, 2, 4, 6: at most one per row of cores),
//!   each carrying `rows / a_shims` rows of cores' A blocks, split in its memory tile and
//!   broadcast along each row of cores;
//! - B (int8, or the q4 codes) enters through every column's own shim and is broadcast down
//!   that column;
//! - the q4 scales of columns 2j and 2j+1 enter through the shim of column 2j+1 and are split
//!   in its memory tile (a shim has only two MM2S channels, and the even ones carry A and B);
//! - C of a column's cores is joined in its memory tile and leaves through its shim.

use crate::geometry::{DesignKind, Geometry, Q4_GROUP};

/// Data memory of one compute core (AIE2: 0x10000 bytes).
pub const CORE_MEMORY: usize = 64 * 1024;
/// Kept free in each core for the stack and locals.
pub const CORE_RESERVED: usize = 4 * 1024;
/// What the object FIFO buffers of one core may use.
pub const CORE_BUDGET: usize = CORE_MEMORY - CORE_RESERVED;
/// Memory of one memory tile (AIE2: 0x80000 bytes).
pub const MEM_TILE_BUDGET: usize = 512 * 1024;
/// Buffers per object FIFO (ping-pong).
pub const FIFO_DEPTH: usize = 2;
/// Compute rows per column.
pub const CORE_ROWS: usize = 4;
/// DMA channels per direction: a shim tile has 2 MM2S and 2 S2MM, a memory tile 6 and 6.
pub const SHIM_CHANNELS: usize = 2;
pub const MEM_TILE_CHANNELS: usize = 6;
/// The q4 K step: two groups, so that a row's slice of bf16 scales is whole 32-bit DMA words
/// (AIE2 DMAs address memory in 4-byte units).
pub const Q4_K_STEP: usize = 2 * Q4_GROUP;
/// Largest per-core tile sides considered.
const MAX_CORE_M: usize = 64;
const MAX_CORE_K: usize = 256;
const MAX_CORE_N: usize = 128;

/// The NPU generation a design is built for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum NpuTarget {
    /// XDNA (Phoenix, Hawk Point): 4 columns.
    Npu1,
    /// XDNA2 (Strix, Krackan): 8 columns.
    Npu2,
}

impl NpuTarget {
    pub const ALL: [NpuTarget; 2] = [NpuTarget::Npu1, NpuTarget::Npu2];

    pub fn columns(self) -> usize {
        match self {
            NpuTarget::Npu1 => 4,
            NpuTarget::Npu2 => 8,
        }
    }

    /// The name mlir-aie's device and our `--device` use.
    pub fn as_str(self) -> &'static str {
        match self {
            NpuTarget::Npu1 => "npu1",
            NpuTarget::Npu2 => "npu2",
        }
    }

    pub fn parse(name: &str) -> Option<NpuTarget> {
        match name {
            "npu1" => Some(NpuTarget::Npu1),
            "npu2" => Some(NpuTarget::Npu2),
            _ => None,
        }
    }

    /// The int8 x int8 matmul intrinsic's shape (r, s, t) the kernels use: mlir-aie's
    /// whole-array example uses 4x8x8 on AIE2 (npu1) and 8x8x8 on AIE2P (npu2).
    pub fn mmul(self) -> (usize, usize, usize) {
        match self {
            NpuTarget::Npu1 => (4, 8, 8),
            NpuTarget::Npu2 => (8, 8, 8),
        }
    }

    /// The Peano (llvm-aie) target triple of the kernels.
    pub fn kernel_triple(self) -> &'static str {
        match self {
            NpuTarget::Npu1 => "aie2-none-unknown-elf",
            NpuTarget::Npu2 => "aie2p-none-unknown-elf",
        }
    }
}

/// The split of one geometry over the array.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tiling {
    pub target: NpuTarget,
    pub kind: DesignKind,
    pub columns: usize,
    pub rows: usize,
    /// Shims (and memory tiles) carrying A: the even columns 0, 2, ...
    pub a_shims: usize,
    /// Per-core tile.
    pub m: usize,
    pub k: usize,
    pub n: usize,
}

/// DMA channels one column's shim and memory tile use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ColumnChannels {
    pub shim_mm2s: usize,
    pub shim_s2mm: usize,
    pub mem_mm2s: usize,
    pub mem_s2mm: usize,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TilingError {
    #[error("{geometry} on {target}: no per-core tile divides M {m}, K {k}, N {n} within the core budget of {CORE_BUDGET} bytes, the memory tile budget of {MEM_TILE_BUDGET} bytes and the DMA channels (K must be a multiple of {k_step}, N of {n_step})", m = geometry.m_tile, k = geometry.k, n = geometry.n, target = target.as_str())]
    NoFit {
        geometry: Geometry,
        target: NpuTarget,
        k_step: usize,
        n_step: usize,
    },
}

/// Bytes of B for a k x n core tile: int8 codes, or q4 nibbles plus one bf16 scale per group.
pub fn b_tile_bytes(kind: DesignKind, k: usize, n: usize) -> usize {
    b_codes_tile_bytes(kind, k, n) + b_scales_tile_bytes(kind, k, n)
}

/// The int8 B or the q4 codes of a k x n tile.
pub fn b_codes_tile_bytes(kind: DesignKind, k: usize, n: usize) -> usize {
    match kind {
        DesignKind::I8 => k * n,
        DesignKind::Q4 => k * n / 2,
    }
}

/// The q4 scales of a k x n tile (none for int8).
pub fn b_scales_tile_bytes(kind: DesignKind, k: usize, n: usize) -> usize {
    match kind {
        DesignKind::I8 => 0,
        DesignKind::Q4 => (k / Q4_GROUP) * n * 2,
    }
}

impl Tiling {
    /// Core memory: A, B (and scales) and C (4-byte: int32 or f32), each double-buffered.
    pub fn core_bytes(&self) -> usize {
        FIFO_DEPTH
            * (self.m * self.k + b_tile_bytes(self.kind, self.k, self.n) + self.m * self.n * 4)
    }

    /// Rows of cores whose A one A shim carries.
    pub fn a_rows_per_shim(&self) -> usize {
        self.rows / self.a_shims
    }

    /// The columns whose shim and memory tile carry A.
    pub fn a_shim_columns(&self) -> Vec<usize> {
        (0..self.a_shims).map(|i| 2 * i).collect()
    }

    /// The columns whose shim and memory tile carry the q4 scales (of columns c - 1 and c).
    pub fn scale_shim_columns(&self) -> Vec<usize> {
        match self.kind {
            DesignKind::I8 => Vec::new(),
            DesignKind::Q4 => (0..self.columns / 2).map(|j| 2 * j + 1).collect(),
        }
    }

    /// Output tiles each core computes per launch.
    pub fn tiles_per_core(&self, geometry: Geometry) -> usize {
        (geometry.m_tile / (self.rows * self.m)) * (geometry.n / (self.columns * self.n))
    }

    fn carries_a(&self, column: usize) -> bool {
        self.a_shim_columns().contains(&column)
    }

    fn carries_scales(&self, column: usize) -> bool {
        self.scale_shim_columns().contains(&column)
    }

    /// The memory tile of `column`: what it buffers (double-buffered).
    pub fn mem_tile_bytes_of(&self, column: usize) -> usize {
        let (m, k, n) = (self.m, self.k, self.n);
        let mut bytes = b_codes_tile_bytes(self.kind, k, n) + self.rows * m * n * 4;
        if self.carries_a(column) {
            bytes += self.a_rows_per_shim() * m * k;
        }
        if self.carries_scales(column) {
            bytes += 2 * b_scales_tile_bytes(self.kind, k, n);
        }
        FIFO_DEPTH * bytes
    }

    /// The fullest memory tile.
    pub fn mem_tile_bytes(&self) -> usize {
        (0..self.columns)
            .map(|c| self.mem_tile_bytes_of(c))
            .max()
            .unwrap_or(0)
    }

    /// DMA channels used in `column`.
    pub fn channels_of(&self, column: usize) -> ColumnChannels {
        let a = usize::from(self.carries_a(column));
        let scales = usize::from(self.carries_scales(column));
        ColumnChannels {
            // B (or codes), A, scales in; C out.
            shim_mm2s: 1 + a + scales,
            shim_s2mm: 1,
            // B forward, A split into its rows, scales split into two columns, C out.
            mem_mm2s: 1 + a * self.a_rows_per_shim() + scales * 2 + 1,
            // B, A, scales in; C joined from the column's rows.
            mem_s2mm: 1 + a + scales + self.rows,
        }
    }

    /// True when no shim or memory tile needs more DMA channels than it has.
    pub fn channels_fit(&self) -> bool {
        (0..self.columns).all(|c| {
            let ch = self.channels_of(c);
            ch.shim_mm2s <= SHIM_CHANNELS
                && ch.shim_s2mm <= SHIM_CHANNELS
                && ch.mem_mm2s <= MEM_TILE_CHANNELS
                && ch.mem_s2mm <= MEM_TILE_CHANNELS
        })
    }

    /// True when the tile fits every budget and divides the geometry as the design needs.
    pub fn fits(&self, geometry: Geometry) -> bool {
        let (r, s, t) = self.target.mmul();
        let k_step = k_step(self.kind, s);
        self.columns <= self.target.columns()
            && (self.kind == DesignKind::I8 || self.columns >= 2)
            && self.rows <= CORE_ROWS
            && self.a_shims >= 1
            && 2 * (self.a_shims - 1) < self.columns
            && self.columns.is_power_of_two()
            && self.rows.is_multiple_of(self.a_shims)
            && self.m.is_multiple_of(r)
            && self.k.is_multiple_of(k_step)
            && self.n.is_multiple_of(t)
            && geometry.m_tile.is_multiple_of(self.rows * self.m)
            && geometry.k.is_multiple_of(self.k)
            && geometry.n.is_multiple_of(self.columns * self.n)
            && self.core_bytes() <= CORE_BUDGET
            && self.mem_tile_bytes() <= MEM_TILE_BUDGET
            && self.channels_fit()
    }
}

fn k_step(kind: DesignKind, s: usize) -> usize {
    match kind {
        DesignKind::I8 => s,
        DesignKind::Q4 => Q4_K_STEP.max(s),
    }
}

fn divisors_desc(value: usize, step: usize, cap: usize) -> impl Iterator<Item = usize> {
    (1..=cap.min(value) / step)
        .rev()
        .map(move |i| i * step)
        .filter(move |d| value.is_multiple_of(*d))
}

/// A shims: one per two columns (the even ones), at most one per row of cores.
fn a_shims_for(columns: usize, rows: usize) -> usize {
    (columns / 2).clamp(1, rows)
}

/// The tiling of `geometry` on `target`: the most columns (a power of two; at least two for q4,
/// whose scales need a second shim) that split N evenly, the most rows that split M evenly,
/// then the largest core tile (by MACs per tile) that fits the budgets and channels.
pub fn tiling_for(geometry: Geometry, target: NpuTarget) -> Result<Tiling, TilingError> {
    let Geometry { kind, m_tile, k, n } = geometry;
    let (r, s, t) = target.mmul();
    let k_step = k_step(kind, s);
    let min_columns = if kind == DesignKind::Q4 { 2 } else { 1 };
    let no_fit = TilingError::NoFit {
        geometry,
        target,
        k_step,
        n_step: min_columns * t,
    };
    if m_tile == 0 || k == 0 || n == 0 || !k.is_multiple_of(k_step) {
        return Err(no_fit);
    }
    let columns = [8, 4, 2, 1]
        .into_iter()
        .filter(|&c| c <= target.columns() && c >= min_columns)
        .find(|c| n.is_multiple_of(c * t))
        .ok_or(no_fit.clone())?;
    let rows = [4, 2, 1]
        .into_iter()
        .filter(|&rw| rw <= CORE_ROWS)
        .find(|rw| m_tile.is_multiple_of(rw * r))
        .ok_or(no_fit.clone())?;
    let a_shims = a_shims_for(columns, rows);
    let (m_core, n_col) = (m_tile / rows, n / columns);
    let mut best: Option<Tiling> = None;
    for m in divisors_desc(m_core, r, MAX_CORE_M) {
        for kt in divisors_desc(k, k_step, MAX_CORE_K) {
            for nt in divisors_desc(n_col, t, MAX_CORE_N) {
                let tiling = Tiling {
                    target,
                    kind,
                    columns,
                    rows,
                    a_shims,
                    m,
                    k: kt,
                    n: nt,
                };
                if !tiling.fits(geometry) {
                    continue;
                }
                if best.is_none_or(|b| m * kt * nt > b.m * b.k * b.n) {
                    best = Some(tiling);
                }
            }
        }
    }
    best.ok_or(no_fit)
}

/// (K, N) of every quantized linear of the models the designs are built for (the tests' and
/// the `model_design_params` example's geometries).
pub mod shapes {
    /// Qwen3-VL-2B's decoder: q/o, k/v, gate/up, down, the head's N chunk.
    pub const DECODER_2B: [(usize, usize); 5] = [
        (2048, 2048),
        (2048, 1024),
        (2048, 6144),
        (6144, 2048),
        (2048, 151936),
    ];
    /// Qwen3-VL-2B's vision tower: qkv, proj, fc1, fc2, the patch merger's two linears.
    pub const VISION_2B: [(usize, usize); 6] = [
        (1024, 3072),
        (1024, 1024),
        (1024, 4096),
        (4096, 1024),
        (1536, 1024),
        (4096, 2048),
    ];
    /// Qwen3-VL-30B-A3B's decoder: q, o, k/v, the experts' gate/up and down, the head.
    pub const DECODER_30B_A3B: [(usize, usize); 6] = [
        (2048, 4096),
        (4096, 2048),
        (2048, 512),
        (2048, 768),
        (768, 2048),
        (2048, 151936),
    ];
    pub const ALL: [&[(usize, usize)]; 3] = [&DECODER_2B, &VISION_2B, &DECODER_30B_A3B];
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::{design_n, M_TILES};

    fn check_all(shapes: &[(usize, usize)]) {
        let mut checked = 0;
        for target in NpuTarget::ALL {
            for kind in [DesignKind::I8, DesignKind::Q4] {
                for &(k, n) in shapes {
                    for m_tile in M_TILES {
                        let g = Geometry::new(kind, m_tile, k, design_n(n));
                        let t = tiling_for(g, target).unwrap_or_else(|e| panic!("{e}"));
                        let (r, s, tt) = target.mmul();
                        assert_eq!(t.columns, target.columns(), "{g} {t:?}");
                        assert_eq!(g.m_tile % (t.rows * t.m), 0, "{g} {t:?}");
                        assert_eq!(g.k % t.k, 0, "{g} {t:?}");
                        assert_eq!(g.n % (t.columns * t.n), 0, "{g} {t:?}");
                        assert_eq!((t.m % r, t.k % s, t.n % tt), (0, 0, 0), "{g} {t:?}");
                        // The budgets as literals: a changed constant is caught here too.
                        assert!(t.core_bytes() <= 60 * 1024, "{g} {t:?}");
                        assert!(t.mem_tile_bytes() <= 512 * 1024, "{g} {t:?}");
                        // The core bytes recomputed from the buffers the design declares.
                        let b = match kind {
                            DesignKind::I8 => t.k * t.n,
                            DesignKind::Q4 => t.k * t.n / 2 + t.k / 32 * t.n * 2,
                        };
                        assert_eq!(t.core_bytes(), 2 * (t.m * t.k + b + t.m * t.n * 4));
                        for c in 0..t.columns {
                            let ch = t.channels_of(c);
                            assert!(ch.shim_mm2s <= 2 && ch.shim_s2mm <= 2, "{g} col {c} {ch:?}");
                            assert!(ch.mem_mm2s <= 6 && ch.mem_s2mm <= 6, "{g} col {c} {ch:?}");
                        }
                        if kind == DesignKind::Q4 {
                            assert_eq!(t.k % 64, 0, "{g} {t:?}");
                            // Every column's scales come through exactly one scale shim.
                            let served: Vec<usize> = t
                                .scale_shim_columns()
                                .iter()
                                .flat_map(|&c| [c - 1, c])
                                .collect();
                            assert_eq!(served, (0..t.columns).collect::<Vec<_>>(), "{g}");
                        }
                        // Every row of cores gets its A from exactly one A shim.
                        assert_eq!(t.a_shims * t.a_rows_per_shim(), t.rows, "{g} {t:?}");
                        checked += 1;
                    }
                }
            }
        }
        assert_eq!(checked, 2 * 2 * shapes.len() * M_TILES.len());
    }

    #[test]
    fn every_2b_decoder_geometry_tiles_on_both_generations() {
        check_all(&shapes::DECODER_2B);
    }

    #[test]
    fn every_2b_vision_geometry_tiles_on_both_generations() {
        check_all(&shapes::VISION_2B);
    }

    #[test]
    fn every_30b_a3b_geometry_tiles_on_both_generations() {
        check_all(&shapes::DECODER_30B_A3B);
    }

    #[test]
    fn the_budgets_bound_the_tile() {
        let g = Geometry::new(DesignKind::I8, 128, 2048, 2048);
        let t = tiling_for(g, NpuTarget::Npu1).unwrap();
        assert_eq!((t.columns, t.rows, t.a_shims), (4, 4, 2));
        // Control: doubling any side of the chosen tile breaks a budget or divisibility.
        for doubled in [
            Tiling { m: t.m * 2, ..t },
            Tiling { k: t.k * 2, ..t },
            Tiling { n: t.n * 2, ..t },
        ] {
            assert!(!doubled.fits(g), "{doubled:?} should not fit");
        }
        // Control: the largest tile considered overflows the core on its own.
        let huge = Tiling {
            m: 64,
            k: 256,
            n: 128,
            ..t
        };
        assert!(huge.core_bytes() > CORE_BUDGET && !huge.fits(g));
    }

    #[test]
    fn npu2_decode_uses_two_rows_of_8x8x8() {
        // M 16 with the 8-row intrinsic: two rows of cores, one A shim per row.
        let g = Geometry::new(DesignKind::Q4, 16, 2048, 6144);
        let t = tiling_for(g, NpuTarget::Npu2).unwrap();
        assert_eq!((t.columns, t.rows, t.m, t.a_shims), (8, 2, 8, 2));
        assert_eq!(t.a_shim_columns(), vec![0, 2]);
        assert_eq!(t.scale_shim_columns(), vec![1, 3, 5, 7]);
        // npu1's 4-row intrinsic uses all four rows.
        let t1 = tiling_for(g, NpuTarget::Npu1).unwrap();
        assert_eq!((t1.columns, t1.rows, t1.m, t1.a_shims), (4, 4, 4, 2));
    }

    #[test]
    fn a_k_off_the_q4_step_is_refused() {
        // Control: 96 is whole q4 groups and a multiple of the intrinsic's 8, but its scale
        // slices would not be whole DMA words in 64-element steps.
        let g = Geometry::new(DesignKind::Q4, 16, 96, 64);
        assert!(tiling_for(Geometry::new(DesignKind::I8, 16, 96, 64), NpuTarget::Npu1).is_ok());
        let err = tiling_for(g, NpuTarget::Npu1).unwrap_err();
        assert!(err.to_string().contains("multiple of 64"), "{err}");
    }

    #[test]
    fn an_n_too_narrow_for_all_columns_uses_fewer() {
        let g = Geometry::new(DesignKind::I8, 16, 64, 24);
        assert_eq!(tiling_for(g, NpuTarget::Npu2).unwrap().columns, 1);
        let g = Geometry::new(DesignKind::I8, 16, 64, 32);
        assert_eq!(tiling_for(g, NpuTarget::Npu2).unwrap().columns, 4);
        // q4 needs two columns (the scales' shim): N 8 cannot be split in two.
        let q4 = Geometry::new(DesignKind::Q4, 16, 64, 8);
        assert!(tiling_for(q4, NpuTarget::Npu2).is_err());
    }

    #[test]
    fn channels_and_memory_tiles_follow_the_plan() {
        let g = Geometry::new(DesignKind::Q4, 128, 2048, 2048);
        let t = tiling_for(g, NpuTarget::Npu1).unwrap();
        // Even columns: A and B in; odd: B and the scales of two columns.
        let shims: Vec<usize> = (0..4).map(|c| t.channels_of(c).shim_mm2s).collect();
        assert_eq!(shims, vec![2, 2, 2, 2]);
        // Memory tiles: A only in the even ones, the scales of two columns in the odd ones.
        let (a_block, scales) = (t.a_rows_per_shim() * t.m * t.k, t.k / 32 * t.n * 2);
        let difference = t.mem_tile_bytes_of(0) as i64 - t.mem_tile_bytes_of(1) as i64;
        assert_eq!(difference, 2 * a_block as i64 - 2 * 2 * scales as i64);
        // Control: A through four shims does not exist on four columns (columns 4 and 6).
        let every_column_a = Tiling { a_shims: 4, ..t };
        assert_eq!(every_column_a.a_shim_columns(), vec![0, 2, 4, 6]);
        assert!(!every_column_a.fits(g));
        // Control: one column fewer leaves column 3 without a scale shim partner: refused.
        let three = Tiling { columns: 3, ..t };
        assert!(!three.fits(g));
    }
}
