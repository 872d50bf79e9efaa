//! The host buffers of every design, as its parameters give them to the IRON generator, against
//! the layouts `include/xdna_vl_runtime.h` states. The header's formulas are read from its text
//! (so a change there fails here until this is revisited) and evaluated independently of
//! `Geometry::buffer_len`.

use npu_sys::design_params::{design_params, DesignParams};
use npu_sys::plan::{design_n, M_TILES};
use npu_sys::tiling::{shapes, NpuTarget};
use npu_sys::{ArgGroup, DesignKind, Geometry};

const HEADER: &str = include_str!("../include/xdna_vl_runtime.h");

/// A statement of the header and the value it gives for a design (None: not applicable).
type Formula = (
    &'static str,
    fn(&Geometry) -> Option<usize>,
    fn(&DesignParams) -> Option<usize>,
);

fn formulas() -> Vec<Formula> {
    fn q4(g: &Geometry) -> bool {
        g.kind == DesignKind::Q4
    }
    vec![
        ("int8 [M][K] row-major, M*K bytes", |g| Some(g.m_tile * g.k), |p| Some(p.host.a_bytes)),
        (
            "int8 [N][K] row-major (a linear weight [out][in], i.e. B column-major),\n *                N*K bytes",
            |g| (!q4(g)).then_some(g.n * g.k),
            |p| (p.kind == DesignKind::I8).then_some(p.host.b_bytes),
        ),
        (
            "N*K/2 + N*(K/32)*2 bytes in all",
            |g| q4(g).then_some(g.n * g.k / 2 + g.n * (g.k / 32) * 2),
            |p| (p.kind == DesignKind::Q4).then_some(p.host.b_bytes),
        ),
        (
            "the scales start at byte offset N*K/2",
            |g| q4(g).then_some(g.n * g.k / 2),
            |p| p.host.b_scales_offset,
        ),
        (
            // The first scale transfer of the design starts where the header puts the scales.
            "scales [N][K/32] bf16",
            |g| q4(g).then_some(g.n * g.k / 2),
            |p| p.dma.transfers.iter().find(|t| t.fifo == "S0").map(|t| t.tap.offset),
        ),
        (
            "int32 [M][N] row-major, M*N*4 bytes",
            |g| (!q4(g)).then_some(g.m_tile * g.n * 4),
            |p| (p.kind == DesignKind::I8).then_some(p.host.c_bytes),
        ),
        (
            "f32 [M][N] row-major, M*N*4 bytes",
            |g| q4(g).then_some(g.m_tile * g.n * 4),
            |p| (p.kind == DesignKind::Q4).then_some(p.host.c_bytes),
        ),
        ("codes  [N][K/2] bytes", |g| q4(g).then_some(g.k / 2), |p| {
            (p.kind == DesignKind::Q4).then_some(p.host.b_row_bytes)
        }),
    ]
}

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

/// Checks every design against the header text `header`.
fn check_against(header: &str, all: &[DesignParams]) -> Result<usize, String> {
    let mut compared = 0;
    for (statement, from_header, from_params) in formulas() {
        if !header.contains(statement) {
            return Err(format!("the header no longer says {statement:?}"));
        }
        for p in all {
            let g = p.geometry();
            let (want, got) = (from_header(&g), from_params(p));
            if want != got {
                return Err(format!(
                    "{}: {statement:?} gives {want:?}, the parameters {got:?}",
                    p.name
                ));
            }
            compared += usize::from(want.is_some());
        }
    }
    Ok(compared)
}

#[test]
fn every_design_lays_out_its_buffers_as_the_header_says() {
    let all = every_params();
    let compared = check_against(HEADER, &all).unwrap();
    // Each design is compared on A, B, C, and for q4 its scale offset, first scale transfer and
    // code rows: i8 3 values, q4 6.
    let (i8s, q4s) = (
        all.iter().filter(|p| p.kind == DesignKind::I8).count(),
        all.iter().filter(|p| p.kind == DesignKind::Q4).count(),
    );
    assert_eq!(compared, 3 * i8s + 6 * q4s);
    // The buffer sizes the runtime checks are the same numbers.
    for p in &all {
        let g = p.geometry();
        assert_eq!(p.host.a_bytes, g.buffer_len(ArgGroup::A), "{}", p.name);
        assert_eq!(p.host.b_bytes, g.buffer_len(ArgGroup::B), "{}", p.name);
        assert_eq!(p.host.c_bytes, g.buffer_len(ArgGroup::C), "{}", p.name);
    }
}

#[test]
fn the_group_constants_and_kinds_match_the_header() {
    for (define, value) in [
        ("XDNA_VL_GROUP_A", ArgGroup::A.abi_value()),
        ("XDNA_VL_GROUP_B", ArgGroup::B.abi_value()),
        ("XDNA_VL_GROUP_C", ArgGroup::C.abi_value()),
        ("XDNA_VL_KIND_I8", DesignKind::I8.abi_value()),
        ("XDNA_VL_KIND_Q4", DesignKind::Q4.abi_value()),
    ] {
        let line = format!("#define {define} {value}u");
        assert!(HEADER.contains(&line), "header lacks {line:?}");
    }
    // The q4 statements the kernel implements.
    for statement in [
        "element 2i in the low\n *                       nibble and element 2i+1 in the high nibble",
        "one per group of 32",
        "for each group g = 0, 1, ... in\n *                ascending order",
    ] {
        assert!(HEADER.contains(statement), "header lacks {statement:?}");
    }
}

#[test]
fn a_planted_layout_difference_is_caught() {
    let all = every_params();
    // Control: a header whose scales start elsewhere, and parameters whose A is padded.
    let moved = HEADER.replace(
        "the scales start at byte offset N*K/2",
        "the scales start at byte offset N*K/4",
    );
    assert_ne!(moved, HEADER);
    let err = check_against(&moved, &all).unwrap_err();
    assert!(err.contains("no longer says"), "{err}");
    let mut padded = all.clone();
    padded[3].host.a_bytes += 64;
    let err = check_against(HEADER, &padded).unwrap_err();
    assert!(err.contains(&padded[3].name), "{err}");
}
