//! The parameters of one design as the IRON generator (`designs/gemm_design.py`) reads them: the
//! geometry, the tiling chosen by [`crate::tiling`], the host buffer layout of the C ABI, and the
//! kernel to compile. Rust computes every number; the Python only checks and uses them, so the
//! two never disagree.

use serde::{Deserialize, Serialize};

use crate::dma_plan::{dma_plan, DmaPlan};
use crate::geometry::{ArgGroup, DesignKind, Geometry, Q4_GROUP};
use crate::tiling::{
    tiling_for, NpuTarget, Tiling, TilingError, CORE_BUDGET, FIFO_DEPTH, MEM_TILE_BUDGET,
};

pub const PARAMS_FORMAT: &str = "xdna-vl-design-params";
pub const PARAMS_VERSION: u32 = 1;
/// The kernel name mlir-aie gives a design's xclbin kernel.
pub const KERNEL_NAME: &str = "MLIR_AIE";

/// The host buffers (groups 3, 4, 5) as `include/xdna_vl_runtime.h` lays them out, in bytes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostLayout {
    /// A: int8 [M][K].
    pub a_bytes: usize,
    pub a_row_bytes: usize,
    /// B: int8 [N][K], or q4 codes [N][K/2] followed by bf16 scales [N][K/32].
    pub b_bytes: usize,
    pub b_row_bytes: usize,
    /// q4 only: where the scales start, and one row of scales.
    pub b_scales_offset: Option<usize>,
    pub b_scales_row_bytes: Option<usize>,
    /// C: int32 or f32 [M][N].
    pub c_bytes: usize,
    pub c_row_bytes: usize,
    /// `i32` or `f32`.
    pub c_dtype: String,
}

/// The AIE kernel of a design: its source (under `designs/`), object and entry points.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KernelParams {
    pub source: String,
    pub object: String,
    pub zero: String,
    pub matmul: String,
    /// Peano (llvm-aie) target triple.
    pub triple: String,
    /// `-D` definitions: the core tile and, for q4, the group.
    pub defines: Vec<(String, usize)>,
}

/// Everything the generator needs for one design.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DesignParams {
    pub format: String,
    pub version: u32,
    pub name: String,
    /// `npu1` or `npu2`.
    pub device: String,
    pub kind: DesignKind,
    pub m_tile: usize,
    pub k: usize,
    pub n: usize,
    pub columns: usize,
    pub rows: usize,
    /// Per-core tile.
    pub m: usize,
    pub k_tile: usize,
    pub n_tile: usize,
    /// The matmul intrinsic (r, s, t).
    pub mmul: [usize; 3],
    pub q4_group: usize,
    pub fifo_depth: usize,
    pub a_shim_columns: Vec<usize>,
    pub a_rows_per_shim: usize,
    pub scale_shim_columns: Vec<usize>,
    pub tiles_per_core: usize,
    pub k_tiles: usize,
    pub core_bytes: usize,
    pub core_budget: usize,
    pub mem_tile_bytes: usize,
    pub mem_tile_budget: usize,
    pub host: HostLayout,
    pub kernel: KernelParams,
    /// Every host transfer and memory tile reordering.
    pub dma: DmaPlan,
    pub kernel_name: String,
    pub xclbin: String,
    pub insts: String,
}

/// The host layout of `geometry`, from the geometry's own buffer sizes.
pub fn host_layout(geometry: Geometry) -> HostLayout {
    let Geometry {
        kind,
        m_tile: _,
        k,
        n,
    } = geometry;
    let (b_row_bytes, b_scales_offset, b_scales_row_bytes, c_dtype) = match kind {
        DesignKind::I8 => (k, None, None, "i32"),
        DesignKind::Q4 => (
            k / 2,
            Some(geometry.q4_scales_offset()),
            Some(k / Q4_GROUP * 2),
            "f32",
        ),
    };
    HostLayout {
        a_bytes: geometry.buffer_len(ArgGroup::A),
        a_row_bytes: k,
        b_bytes: geometry.buffer_len(ArgGroup::B),
        b_row_bytes,
        b_scales_offset,
        b_scales_row_bytes,
        c_bytes: geometry.buffer_len(ArgGroup::C),
        c_row_bytes: n * 4,
        c_dtype: c_dtype.into(),
    }
}

/// The kernel of a tiling: one object per (kind, target, core tile).
pub fn kernel_params(tiling: &Tiling) -> KernelParams {
    let kind = tiling.kind.as_str();
    let target = tiling.target.as_str();
    let (m, k, n) = (tiling.m, tiling.k, tiling.n);
    let mut defines = vec![
        ("DIM_M".to_string(), m),
        ("DIM_K".to_string(), k),
        ("DIM_N".to_string(), n),
    ];
    let (r, s, t) = tiling.target.mmul();
    defines.extend([
        ("MMUL_R".to_string(), r),
        ("MMUL_S".to_string(), s),
        ("MMUL_T".to_string(), t),
    ]);
    let zero = match tiling.kind {
        DesignKind::I8 => "xdna_vl_zero_i32",
        DesignKind::Q4 => {
            defines.push(("Q4_GROUP".to_string(), Q4_GROUP));
            "xdna_vl_zero_f32"
        }
    };
    KernelParams {
        source: format!("kernels/gemm_{kind}.cc"),
        object: format!("gemm_{kind}_{target}_{m}x{k}x{n}.o"),
        zero: zero.to_string(),
        matmul: format!("xdna_vl_matmul_{kind}"),
        triple: tiling.target.kernel_triple().to_string(),
        defines,
    }
}

/// The parameters of `geometry` built for `target`.
pub fn design_params(geometry: Geometry, target: NpuTarget) -> Result<DesignParams, TilingError> {
    let tiling = tiling_for(geometry, target)?;
    let stem = geometry.file_stem();
    let (r, s, t) = target.mmul();
    Ok(DesignParams {
        format: PARAMS_FORMAT.to_string(),
        version: PARAMS_VERSION,
        name: stem.clone(),
        device: target.as_str().to_string(),
        kind: geometry.kind,
        m_tile: geometry.m_tile,
        k: geometry.k,
        n: geometry.n,
        columns: tiling.columns,
        rows: tiling.rows,
        m: tiling.m,
        k_tile: tiling.k,
        n_tile: tiling.n,
        mmul: [r, s, t],
        q4_group: Q4_GROUP,
        fifo_depth: FIFO_DEPTH,
        a_shim_columns: tiling.a_shim_columns(),
        a_rows_per_shim: tiling.a_rows_per_shim(),
        scale_shim_columns: tiling.scale_shim_columns(),
        tiles_per_core: tiling.tiles_per_core(geometry),
        k_tiles: geometry.k / tiling.k,
        core_bytes: tiling.core_bytes(),
        core_budget: CORE_BUDGET,
        mem_tile_bytes: tiling.mem_tile_bytes(),
        mem_tile_budget: MEM_TILE_BUDGET,
        host: host_layout(geometry),
        kernel: kernel_params(&tiling),
        dma: dma_plan(geometry, &tiling),
        kernel_name: KERNEL_NAME.to_string(),
        xclbin: format!("{stem}.xclbin"),
        insts: format!("{stem}.insts.bin"),
    })
}

impl DesignParams {
    pub fn geometry(&self) -> Geometry {
        Geometry::new(self.kind, self.m_tile, self.k, self.n)
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("design parameters always serialise") + "\n"
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::{design_n, M_TILES};
    use crate::tiling::shapes;

    fn every_params() -> Vec<DesignParams> {
        let mut all = Vec::new();
        for target in NpuTarget::ALL {
            for kind in [DesignKind::I8, DesignKind::Q4] {
                for shape_set in shapes::ALL {
                    for &(k, n) in shape_set {
                        for m_tile in M_TILES {
                            let g = Geometry::new(kind, m_tile, k, design_n(n));
                            all.push(design_params(g, target).unwrap());
                        }
                    }
                }
            }
        }
        all
    }

    #[test]
    fn params_of_every_geometry_are_consistent() {
        let all = every_params();
        assert_eq!(all.len(), 2 * 2 * 17 * 2);
        for p in &all {
            let name = &p.name;
            let target = NpuTarget::parse(&p.device).unwrap();
            assert_eq!(p.columns, target.columns(), "{name}");
            assert_eq!(p.mmul, {
                let (r, s, t) = target.mmul();
                [r, s, t]
            });
            // The cores cover C exactly: rows x m x (tiles over M) and columns x n x (over N).
            let m_tiles_per_core = p.m_tile / (p.rows * p.m);
            let n_tiles_per_core = p.n / (p.columns * p.n_tile);
            assert_eq!(m_tiles_per_core * p.rows * p.m, p.m_tile, "{name}");
            assert_eq!(n_tiles_per_core * p.columns * p.n_tile, p.n, "{name}");
            assert_eq!(
                p.tiles_per_core,
                m_tiles_per_core * n_tiles_per_core,
                "{name}"
            );
            assert_eq!(p.k_tiles * p.k_tile, p.k, "{name}");
            assert!(p.core_bytes <= p.core_budget && p.mem_tile_bytes <= p.mem_tile_budget);
            assert_eq!(p.a_shim_columns.len() * p.a_rows_per_shim, p.rows, "{name}");
            assert_eq!(p.xclbin, format!("{name}.xclbin"));
            assert_eq!(p.kernel_name, "MLIR_AIE");
            let defines: Vec<&str> = p.kernel.defines.iter().map(|(d, _)| d.as_str()).collect();
            let dim = |d: &str| p.kernel.defines.iter().find(|(n, _)| n == d).unwrap().1;
            assert_eq!(
                (dim("DIM_M"), dim("DIM_K"), dim("DIM_N")),
                (p.m, p.k_tile, p.n_tile)
            );
            match p.kind {
                DesignKind::I8 => {
                    assert!(p.scale_shim_columns.is_empty(), "{name}");
                    assert!(!defines.contains(&"Q4_GROUP"));
                    assert_eq!(p.kernel.matmul, "xdna_vl_matmul_i8");
                }
                DesignKind::Q4 => {
                    assert_eq!(p.scale_shim_columns.len() * 2, p.columns, "{name}");
                    assert_eq!(dim("Q4_GROUP"), 32);
                    assert_eq!(p.kernel.zero, "xdna_vl_zero_f32");
                }
            }
            // The JSON the generator reads round-trips.
            let back: DesignParams = serde_json::from_str(&p.to_json()).unwrap();
            assert_eq!(&back, p);
        }
    }

    #[test]
    fn head_chunks_and_2b_q4_decode_params() {
        // The LM head runs on 8192-wide chunks: one geometry per M tile.
        let g = Geometry::new(DesignKind::Q4, 16, 2048, design_n(151_936));
        let p = design_params(g, NpuTarget::Npu2).unwrap();
        assert_eq!((p.n, p.columns, p.rows, p.m), (8192, 8, 2, 8));
        assert_eq!(p.kernel.triple, "aie2p-none-unknown-elf");
        assert_eq!(p.host.b_scales_offset, Some(8192 * 1024));
        let p1 = design_params(g, NpuTarget::Npu1).unwrap();
        assert_eq!(p1.kernel.triple, "aie2-none-unknown-elf");
        assert_ne!(
            p1.kernel.object, p.kernel.object,
            "objects differ per target"
        );
    }

    #[test]
    fn an_unknown_field_is_refused() {
        let g = Geometry::new(DesignKind::I8, 16, 64, 64);
        let json = design_params(g, NpuTarget::Npu1).unwrap().to_json();
        let planted = json.replacen("\"rows\"", "\"rowz\"", 1);
        assert_ne!(planted, json);
        assert!(serde_json::from_str::<DesignParams>(&planted).is_err());
    }
}
