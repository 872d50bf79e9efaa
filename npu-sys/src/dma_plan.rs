//! The data movement of a design: every host transfer of its runtime sequence (shim DMA access
//! patterns over the A, B and C buffers of the C ABI) and the memory tiles' reorderings into the
//! blocks the kernels read. Computed here so that it can be simulated against the buffer layouts
//! in tests (this machine has no NPU); `designs/gemm_design.py` emits exactly these patterns.
//!
//! The runtime sequence runs, for each block of `rows * m` rows of C (`mb`) and each of a column's
//! `n`-wide output tiles (`ni`; column c owns tiles `ni * columns + c`, interleaved as in
//! mlir-aie's whole-array example), one task group: every transfer below with its offset moved by
//! `mb * mb_stride + ni * ni_stride`. A core consumes, per output tile, the K tiles in ascending
//! order, which is what keeps the q4 groups summed in ascending order.

use serde::{Deserialize, Serialize};

use crate::geometry::{DesignKind, Geometry, Q4_GROUP};
use crate::tiling::Tiling;

/// Which host buffer a transfer reads or writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum HostTensor {
    A,
    B,
    C,
}

/// A DMA access pattern: `sizes`/`strides` outermost first, in elements of the tensor
/// (bytes for A and B, 4-byte words for C), as mlir-aie's `TensorAccessPattern` takes them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tap {
    pub offset: usize,
    pub sizes: [usize; 4],
    pub strides: [usize; 4],
}

impl Tap {
    pub fn len(&self) -> usize {
        self.sizes.iter().product()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The element indices this pattern visits, in order.
    pub fn indices(&self) -> Vec<usize> {
        let [s3, s2, s1, s0] = self.sizes;
        let [t3, t2, t1, t0] = self.strides;
        let mut out = Vec::with_capacity(self.len());
        for i3 in 0..s3 {
            for i2 in 0..s2 {
                for i1 in 0..s1 {
                    for i0 in 0..s0 {
                        out.push(self.offset + i3 * t3 + i2 * t2 + i1 * t1 + i0 * t0);
                    }
                }
            }
        }
        out
    }
}

/// One host transfer of each task group.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostTransfer {
    /// The object FIFO it fills or drains: `A<i>`, `B<c>`, `S<j>` (q4 scales), `C<c>`.
    pub fifo: String,
    pub tensor: HostTensor,
    /// The shim tile (column) that moves it.
    pub shim_column: usize,
    pub tap: Tap,
    pub mb_stride: usize,
    pub ni_stride: usize,
}

impl HostTransfer {
    /// The pattern for block `mb` and output tile `ni`.
    pub fn tap_at(&self, mb: usize, ni: usize) -> Tap {
        Tap {
            offset: self.tap.offset + mb * self.mb_stride + ni * self.ni_stride,
            ..self.tap
        }
    }
}

/// A memory tile's reordering of an object on its way out: (size, stride) pairs outermost first,
/// in elements of the object (mlir-aie's `dims_to_stream`).
pub type Dims = Vec<(usize, usize)>;

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DmaPlan {
    /// Blocks of `rows * m` rows per launch.
    pub m_blocks: usize,
    /// Output tiles per column per block.
    pub n_tiles: usize,
    pub transfers: Vec<HostTransfer>,
    /// A (m x k, row-major) into r x s blocks.
    pub a_to_core: Dims,
    /// B (n x k of int8, or n x k/2 bytes of q4 codes, row-major by n) into t x s blocks.
    pub b_to_core: Dims,
    /// C (m x n in r x t blocks, one per row of cores, back to back) into row-major rows.
    pub c_to_host: Dims,
    /// Bytes of the A, B, scales and C objects in the memory tiles.
    pub a_object: usize,
    pub b_object: usize,
    pub s_object: usize,
    pub c_object: usize,
}

/// Bytes per element of a host tensor.
pub fn element_bytes(tensor: HostTensor) -> usize {
    match tensor {
        HostTensor::A | HostTensor::B => 1,
        HostTensor::C => 4,
    }
}

pub fn dma_plan(geometry: Geometry, tiling: &Tiling) -> DmaPlan {
    let Geometry { kind, m_tile, k, n } = geometry;
    let (rows, columns, m, kt, nt) = (tiling.rows, tiling.columns, tiling.m, tiling.k, tiling.n);
    let (r, s, t) = tiling.target.mmul();
    let rps = tiling.a_rows_per_shim();
    // Bytes per row of B (codes) in the host buffer and per row of a core's B tile.
    let (b_row, b_tile_row) = match kind {
        DesignKind::I8 => (k, kt),
        DesignKind::Q4 => (k / 2, kt / 2),
    };
    let mut transfers = Vec::new();
    for (i, &col) in tiling.a_shim_columns().iter().enumerate() {
        transfers.push(HostTransfer {
            fifo: format!("A{i}"),
            tensor: HostTensor::A,
            shim_column: col,
            tap: Tap {
                offset: i * rps * m * k,
                sizes: [1, k / kt, rps * m, kt],
                strides: [0, kt, k, 1],
            },
            mb_stride: rows * m * k,
            ni_stride: 0,
        });
    }
    for c in 0..columns {
        transfers.push(HostTransfer {
            fifo: format!("B{c}"),
            tensor: HostTensor::B,
            shim_column: c,
            tap: Tap {
                offset: c * nt * b_row,
                sizes: [1, k / kt, nt, b_tile_row],
                strides: [0, b_tile_row, b_row, 1],
            },
            mb_stride: 0,
            ni_stride: columns * nt * b_row,
        });
    }
    let s_row = k / Q4_GROUP * 2;
    let s_tile_row = kt / Q4_GROUP * 2;
    for (j, &col) in tiling.scale_shim_columns().iter().enumerate() {
        transfers.push(HostTransfer {
            fifo: format!("S{j}"),
            tensor: HostTensor::B,
            shim_column: col,
            tap: Tap {
                offset: geometry.q4_scales_offset() + 2 * j * nt * s_row,
                sizes: [1, k / kt, 2 * nt, s_tile_row],
                strides: [0, s_tile_row, s_row, 1],
            },
            mb_stride: 0,
            ni_stride: columns * nt * s_row,
        });
    }
    for c in 0..columns {
        transfers.push(HostTransfer {
            fifo: format!("C{c}"),
            tensor: HostTensor::C,
            shim_column: c,
            tap: Tap {
                offset: c * nt,
                sizes: [1, 1, rows * m, nt],
                strides: [0, 0, n, 1],
            },
            mb_stride: rows * m * n,
            ni_stride: columns * nt,
        });
    }
    let (b_block_row, b_s) = match kind {
        DesignKind::I8 => (kt, s),
        DesignKind::Q4 => (kt / 2, s / 2),
    };
    DmaPlan {
        m_blocks: m_tile / (rows * m),
        n_tiles: n / (columns * nt),
        transfers,
        a_to_core: vec![(m / r, r * kt), (kt / s, s), (r, kt), (s, 1)],
        b_to_core: vec![
            (nt / t, t * b_block_row),
            (kt / s, b_s),
            (t, b_block_row),
            (b_s, 1),
        ],
        c_to_host: vec![(m / r, r * nt), (r, t), (nt / t, r * t), (t, 1)],
        a_object: rps * m * kt,
        b_object: nt * b_tile_row,
        s_object: match kind {
            DesignKind::I8 => 0,
            DesignKind::Q4 => 2 * nt * s_tile_row,
        },
        c_object: rows * m * nt * 4,
    }
}

/// The order in which a memory tile's `dims` read an object of `len` elements. As on the AIE2
/// DMA, the outermost dimension keeps stepping past its size until the object is done.
pub fn dims_order(dims: &Dims, len: usize) -> Vec<usize> {
    let inner: usize = dims[1..].iter().map(|(size, _)| size).product();
    let mut sizes: Vec<usize> = dims.iter().map(|(size, _)| *size).collect();
    sizes[0] = len / inner.max(1);
    let mut out = Vec::with_capacity(len);
    let mut index = vec![0usize; dims.len()];
    for _ in 0..len {
        out.push(index.iter().zip(dims).map(|(i, (_, st))| i * st).sum());
        for d in (0..dims.len()).rev() {
            index[d] += 1;
            if index[d] < sizes[d] {
                break;
            }
            index[d] = 0;
        }
    }
    out
}

/// Why a pattern cannot run on an AIE2 DMA.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DmaLimitError {
    #[error("{fifo}: {what} is {value} bytes, not whole 32-bit words")]
    Granularity {
        fifo: String,
        what: &'static str,
        value: usize,
    },
    #[error("{fifo}: dimension {dim} has size {size}, above the shim DMA's {limit}")]
    Size {
        fifo: String,
        dim: usize,
        size: usize,
        limit: usize,
    },
    #[error("{fifo}: dimension {dim} has stride {stride} words, above the shim DMA's {limit}")]
    Stride {
        fifo: String,
        dim: usize,
        stride: usize,
        limit: usize,
    },
}

/// Shim DMA limits (AIE2 buffer descriptors): wraps of the three inner dimensions up to 1023
/// words or elements, up to 64 repeats of the outer one, strides below 2^20 words.
pub const SHIM_MAX_WRAP: usize = 1023;
pub const SHIM_MAX_REPEAT: usize = 64;
pub const SHIM_MAX_STRIDE_WORDS: usize = 1 << 20;

impl DmaPlan {
    /// Checks every host transfer (at every block and tile) and memory tile reordering
    /// against the DMAs' 4-byte addressing and the shim's size and stride limits.
    pub fn check_limits(&self) -> Result<(), DmaLimitError> {
        for tr in &self.transfers {
            let eb = element_bytes(tr.tensor);
            let fifo = || tr.fifo.clone();
            let words = |what: &'static str, bytes: usize| {
                if bytes.is_multiple_of(4) {
                    Ok(())
                } else {
                    Err(DmaLimitError::Granularity {
                        fifo: fifo(),
                        what,
                        value: bytes,
                    })
                }
            };
            words("the offset", tr.tap.offset * eb)?;
            words("the block stride", tr.mb_stride * eb)?;
            words("the tile stride", tr.ni_stride * eb)?;
            words("the innermost size", tr.tap.sizes[3] * eb)?;
            for d in 0..3 {
                if tr.tap.sizes[d] > 1 {
                    words("a stride", tr.tap.strides[d] * eb)?;
                }
            }
            if tr.tap.strides[3] != 1 {
                return Err(DmaLimitError::Stride {
                    fifo: fifo(),
                    dim: 3,
                    stride: tr.tap.strides[3],
                    limit: 1,
                });
            }
            let inner_words = tr.tap.sizes[3] * eb / 4;
            for (dim, size, limit) in [
                (0, tr.tap.sizes[0], SHIM_MAX_REPEAT),
                (1, tr.tap.sizes[1], SHIM_MAX_WRAP),
                (2, tr.tap.sizes[2], SHIM_MAX_WRAP),
                (3, inner_words, SHIM_MAX_WRAP),
            ] {
                if size > limit {
                    return Err(DmaLimitError::Size {
                        fifo: fifo(),
                        dim,
                        size,
                        limit,
                    });
                }
            }
            for d in 0..3 {
                let stride_words = tr.tap.strides[d] * eb / 4;
                if tr.tap.sizes[d] > 1 && stride_words >= SHIM_MAX_STRIDE_WORDS {
                    return Err(DmaLimitError::Stride {
                        fifo: fifo(),
                        dim: d,
                        stride: stride_words,
                        limit: SHIM_MAX_STRIDE_WORDS,
                    });
                }
            }
        }
        for (fifo, dims, eb) in [
            ("A to cores", &self.a_to_core, 1),
            ("B to cores", &self.b_to_core, 1),
            ("C to host", &self.c_to_host, 4),
        ] {
            let (inner, stride) = dims[dims.len() - 1];
            let granular = stride == 1
                && (inner * eb).is_multiple_of(4)
                && dims[..dims.len() - 1]
                    .iter()
                    .all(|(_, st)| (st * eb).is_multiple_of(4));
            if !granular {
                return Err(DmaLimitError::Granularity {
                    fifo: fifo.to_string(),
                    what: "a memory tile dimension",
                    value: inner * eb,
                });
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::geometry::ArgGroup;
    use crate::plan::{design_n, M_TILES};
    use crate::tiling::{shapes, tiling_for, NpuTarget};

    /// The elements of a rows_ x cols_ matrix `at(i, j)` in br x bc blocks (blocks row-major,
    /// each block row-major): the layout the kernels read and write.
    fn blocked<T>(
        rows_: usize,
        cols_: usize,
        br: usize,
        bc: usize,
        at: impl Fn(usize, usize) -> T,
    ) -> Vec<T> {
        let mut out = Vec::with_capacity(rows_ * cols_);
        for bi in 0..rows_ / br {
            for bj in 0..cols_ / bc {
                for i in 0..br {
                    for j in 0..bc {
                        out.push(at(bi * br + i, bj * bc + j));
                    }
                }
            }
        }
        out
    }

    fn byte_at(i: usize) -> u8 {
        let x = (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        (x >> 56) as u8
    }

    /// Moves distinct host data through `plan` as the shims, memory tiles and cores would, and
    /// compares what each core receives (and what lands in C) with the C ABI's layouts.
    fn simulate(g: Geometry, tiling: &Tiling, plan: &DmaPlan) -> Result<(), String> {
        let (r, s, t) = tiling.target.mmul();
        let (rows, cols, m, kt, nt) = (tiling.rows, tiling.columns, tiling.m, tiling.k, tiling.n);
        let (k, n) = (g.k, g.n);
        let rps = tiling.a_rows_per_shim();
        let a: Vec<u8> = (0..g.buffer_len(ArgGroup::A)).map(byte_at).collect();
        let b: Vec<u8> = (0..g.buffer_len(ArgGroup::B))
            .map(|i| byte_at(i + 17))
            .collect();
        let c_len = g.m_tile * n;
        let mut c_host = vec![u32::MAX; c_len];
        let mut c_writes = vec![0u32; c_len];
        let mut consumed = std::collections::BTreeMap::<String, usize>::new();
        for mb in 0..plan.m_blocks {
            for ni in 0..plan.n_tiles {
                for tr in &plan.transfers {
                    let tap = tr.tap_at(mb, ni);
                    let index: usize = tr.fifo[1..].parse().unwrap();
                    let idx = tap.indices();
                    let fail = |what: &str| format!("{} mb {mb} ni {ni}: {what}", tr.fifo);
                    let buffer_len = match tr.tensor {
                        HostTensor::A => a.len(),
                        HostTensor::B => b.len(),
                        HostTensor::C => c_len,
                    };
                    if let Some(&beyond) = idx.iter().find(|&&x| x >= buffer_len) {
                        return Err(fail(&format!(
                            "reads element {beyond} of a {buffer_len}-element buffer"
                        )));
                    }
                    match &tr.fifo[..1] {
                        "A" => {
                            let stream: Vec<u8> = idx.iter().map(|&x| a[x]).collect();
                            for (kti, obj) in stream.chunks(plan.a_object).enumerate() {
                                for j in 0..rps {
                                    let row = index * rps + j;
                                    let sub = &obj[j * m * kt..(j + 1) * m * kt];
                                    let l1: Vec<u8> = dims_order(&plan.a_to_core, m * kt)
                                        .iter()
                                        .map(|&x| sub[x])
                                        .collect();
                                    let (row0, k0) = (mb * rows * m + row * m, kti * kt);
                                    let want =
                                        blocked(m, kt, r, s, |i, kk| a[(row0 + i) * k + k0 + kk]);
                                    if l1 != want {
                                        return Err(fail(&format!(
                                            "A of core row {row}, K tile {kti}"
                                        )));
                                    }
                                    *consumed.entry(format!("A row {row}")).or_default() += 1;
                                }
                            }
                        }
                        "B" => {
                            let nb = ni * cols + index;
                            let stream: Vec<u8> = idx.iter().map(|&x| b[x]).collect();
                            for (kti, obj) in stream.chunks(plan.b_object).enumerate() {
                                let l1: Vec<u8> = dims_order(&plan.b_to_core, plan.b_object)
                                    .iter()
                                    .map(|&x| obj[x])
                                    .collect();
                                let want = match g.kind {
                                    DesignKind::I8 => blocked(nt, kt, t, s, |i, kk| {
                                        b[(nb * nt + i) * k + kti * kt + kk]
                                    }),
                                    DesignKind::Q4 => blocked(nt, kt / 2, t, s / 2, |i, byte| {
                                        b[(nb * nt + i) * (k / 2) + kti * kt / 2 + byte]
                                    }),
                                };
                                if l1 != want {
                                    return Err(fail(&format!(
                                        "B of column {index}, K tile {kti}"
                                    )));
                                }
                                *consumed.entry(format!("B col {index}")).or_default() += 1;
                            }
                        }
                        "S" => {
                            let stream: Vec<u8> = idx.iter().map(|&x| b[x]).collect();
                            let (s_row, s_tile_row) = (k / Q4_GROUP * 2, kt / Q4_GROUP * 2);
                            for (kti, obj) in stream.chunks(plan.s_object).enumerate() {
                                for (h, half) in obj.chunks(plan.s_object / 2).enumerate() {
                                    let column = 2 * index + h;
                                    let nb = ni * cols + column;
                                    let mut want = Vec::new();
                                    for i in 0..nt {
                                        let row_start =
                                            g.q4_scales_offset() + (nb * nt + i) * s_row;
                                        let from = row_start + kti * s_tile_row;
                                        want.extend_from_slice(&b[from..from + s_tile_row]);
                                    }
                                    if half != want.as_slice() {
                                        return Err(fail(&format!(
                                            "scales of column {column}, K tile {kti}"
                                        )));
                                    }
                                    *consumed.entry(format!("S col {column}")).or_default() += 1;
                                }
                            }
                        }
                        "C" => {
                            // What the column's cores computed: C[i][j] = i * N + j, in r x t blocks.
                            let nb = ni * cols + index;
                            let mut l2 = Vec::with_capacity(rows * m * nt);
                            for row in 0..rows {
                                let row0 = mb * rows * m + row * m;
                                l2.extend(blocked(m, nt, r, t, |i, j| {
                                    ((row0 + i) * n + nb * nt + j) as u32
                                }));
                            }
                            let stream: Vec<u32> = dims_order(&plan.c_to_host, l2.len())
                                .iter()
                                .map(|&x| l2[x])
                                .collect();
                            if stream.len() != idx.len() {
                                return Err(fail("C stream and pattern lengths differ"));
                            }
                            for (value, &at) in stream.iter().zip(&idx) {
                                c_host[at] = *value;
                                c_writes[at] += 1;
                            }
                        }
                        other => return Err(format!("unknown fifo {other}")),
                    }
                }
            }
        }
        if let Some(at) = (0..c_len).find(|&i| c_writes[i] != 1 || c_host[i] != i as u32) {
            return Err(format!(
                "C[{at}] written {} times, holds {}",
                c_writes[at], c_host[at]
            ));
        }
        // Every core gets one A, B (and scales) object per K tile of each of its output tiles.
        let per_core = tiling.tiles_per_core(g) * (k / kt);
        for (fifo, count) in &consumed {
            if *count != per_core {
                return Err(format!("{fifo}: {count} objects, expected {per_core}"));
            }
        }
        let expected_fifos = rows + cols + if g.kind == DesignKind::Q4 { cols } else { 0 };
        if consumed.len() != expected_fifos {
            return Err(format!(
                "{} core inputs fed, expected {expected_fifos}",
                consumed.len()
            ));
        }
        Ok(())
    }

    fn simulate_geometry(g: Geometry, target: NpuTarget) {
        let tiling = tiling_for(g, target).unwrap();
        let plan = dma_plan(g, &tiling);
        plan.check_limits().unwrap_or_else(|e| panic!("{g}: {e}"));
        simulate(g, &tiling, &plan).unwrap_or_else(|e| panic!("{g} on {}: {e}", target.as_str()));
    }

    #[test]
    fn small_designs_move_data_as_the_abi_lays_it_out() {
        for target in NpuTarget::ALL {
            for kind in [DesignKind::I8, DesignKind::Q4] {
                for m_tile in M_TILES {
                    for (k, n) in [(128, 64), (256, 128), (64, 512)] {
                        simulate_geometry(Geometry::new(kind, m_tile, k, n), target);
                    }
                }
            }
        }
    }

    #[test]
    fn model_sized_designs_move_data_as_the_abi_lays_it_out() {
        simulate_geometry(
            Geometry::new(DesignKind::Q4, 16, 2048, 6144),
            NpuTarget::Npu2,
        );
        simulate_geometry(
            Geometry::new(DesignKind::Q4, 128, 2048, 2048),
            NpuTarget::Npu1,
        );
        simulate_geometry(
            Geometry::new(DesignKind::I8, 128, 768, 2048),
            NpuTarget::Npu1,
        );
        simulate_geometry(
            Geometry::new(DesignKind::I8, 16, 6144, 2048),
            NpuTarget::Npu2,
        );
    }

    #[test]
    fn every_model_geometry_is_within_the_dma_limits() {
        for target in NpuTarget::ALL {
            for kind in [DesignKind::I8, DesignKind::Q4] {
                for shape_set in shapes::ALL {
                    for &(k, n) in shape_set {
                        for m_tile in M_TILES {
                            let g = Geometry::new(kind, m_tile, k, design_n(n));
                            let tiling = tiling_for(g, target).unwrap();
                            let plan = dma_plan(g, &tiling);
                            plan.check_limits().unwrap_or_else(|e| panic!("{g}: {e}"));
                            assert_eq!(plan.m_blocks * plan.n_tiles, tiling.tiles_per_core(g));
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn planted_layout_mistakes_are_caught() {
        let g = Geometry::new(DesignKind::Q4, 16, 256, 128);
        let tiling = tiling_for(g, NpuTarget::Npu1).unwrap();
        let plan = dma_plan(g, &tiling);
        simulate(g, &tiling, &plan).unwrap();
        let with = |edit: &dyn Fn(&mut DmaPlan)| {
            let mut planted = plan.clone();
            edit(&mut planted);
            simulate(g, &tiling, &planted).unwrap_err()
        };
        // q4 codes rows stepped as int8 rows (K bytes instead of K/2).
        let err = with(&|p| {
            let tr = p.transfers.iter_mut().find(|t| t.fifo == "B0").unwrap();
            tr.tap.strides[2] = g.k;
        });
        assert!(err.contains("B0"), "{err}");
        // B's t x s blocks read as s x t.
        let err = with(&|p| p.b_to_core.swap(2, 3));
        assert!(err.contains("B of column 0"), "{err}");
        // Scales read from the codes' end minus one row (an off-by-one in the offset).
        let err = with(&|p| {
            let tr = p.transfers.iter_mut().find(|t| t.fifo == "S0").unwrap();
            tr.tap.offset -= 16;
        });
        assert!(err.contains("scales of column 0"), "{err}");
        // The second pair's scales read one tile of rows late (column 3's rows for column 2).
        let err = with(&|p| {
            let tr = p.transfers.iter_mut().find(|t| t.fifo == "S1").unwrap();
            tr.tap.offset += tiling.n * (g.k / 16);
        });
        assert!(err.starts_with("S1 mb 0 ni 0"), "{err}");
        // A's blocks r x s read as s x r.
        let err = with(&|p| p.a_to_core.swap(2, 3));
        assert!(err.contains("A of core row 0"), "{err}");
        // C written with the wrong row stride.
        let err = with(&|p| {
            for tr in p.transfers.iter_mut().filter(|t| t.fifo.starts_with('C')) {
                tr.tap.strides[2] += 8;
            }
        });
        assert!(err.contains("C") || err.contains("written"), "{err}");
        // Control of the limits check: a 2-byte inner scale slice (one group per K tile).
        let mut narrow = plan.clone();
        narrow
            .transfers
            .iter_mut()
            .find(|t| t.fifo == "S0")
            .unwrap()
            .tap
            .sizes[3] = 2;
        assert!(matches!(
            narrow.check_limits(),
            Err(DmaLimitError::Granularity { .. })
        ));
    }
}
