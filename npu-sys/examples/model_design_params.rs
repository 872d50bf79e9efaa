//! Writes the design parameters of every 2B decoder, 2B vision tower and 30B-A3B geometry
//! (both M tiles) for npu1 and npu2 into DIR/<device>/, to run the IRON generator on them by hand
//! (`python3 designs/gemm_design.py --params FILE --dry-run` needs no mlir-aie).
//!
//! cargo run --release -p npu-sys --example model_design_params -- DIR

use std::path::PathBuf;

use npu_sys::design_params::design_params;
use npu_sys::plan::{design_n, M_TILES};
use npu_sys::tiling::{shapes, NpuTarget};
use npu_sys::{DesignKind, Geometry};

fn main() {
    let dir = PathBuf::from(
        std::env::args()
            .nth(1)
            .expect("usage: model_design_params DIR"),
    );
    let mut count = 0;
    for target in NpuTarget::ALL {
        let out = dir.join(target.as_str());
        std::fs::create_dir_all(&out).unwrap();
        for kind in [DesignKind::I8, DesignKind::Q4] {
            for shape_set in shapes::ALL {
                for &(k, n) in shape_set {
                    for m_tile in M_TILES {
                        let g = Geometry::new(kind, m_tile, k, design_n(n));
                        let params = design_params(g, target).unwrap_or_else(|e| panic!("{e}"));
                        std::fs::write(
                            out.join(format!("{}.params.json", params.name)),
                            params.to_json(),
                        )
                        .unwrap();
                        count += 1;
                    }
                }
            }
        }
    }
    println!("wrote {count} parameter files under {}", dir.display());
}
