//! The software NPU's GEMM designs through the public API: byte-identical to the pack's scalar
//! oracle, broken by a planted layout error, and strict about geometry, buffers and syncs.

mod common;

use std::time::Duration;

use common::g;
use npu_sys::designs::{DesignEntry, MANIFEST_FILE};
use npu_sys::verify::{verify_design, GemmCase, PlantedLayoutError};
use npu_sys::{ArgGroup, DesignKind, Designs, Device, GemmDesign, RunError};

const TIMEOUT: Duration = Duration::from_secs(30);

fn device() -> Device {
    Device::open(&common::open_emu()).unwrap()
}

#[test]
fn gemm_through_the_software_npu_equals_the_oracle_byte_for_byte() {
    let dir = tempfile::tempdir().unwrap();
    // (kind, M tile, K, N of the design, live rows, live N): full tiles, and padded rows and columns.
    let cases = [
        (DesignKind::I8, 16, 48, 24, 16, 24),
        (DesignKind::I8, 16, 48, 24, 3, 17),
        (DesignKind::Q4, 16, 64, 40, 16, 40),
        (DesignKind::Q4, 16, 64, 40, 1, 33),
        (DesignKind::Q4, 128, 96, 8, 100, 8),
    ];
    let mut geometries: Vec<_> = cases
        .iter()
        .map(|&(kind, m, k, n, _, _)| g(kind, m, k, n))
        .collect();
    geometries.dedup();
    let designs = common::emu_designs(dir.path(), &geometries);
    let device = device();
    for (seed, &(kind, m, k, n, rows, n_live)) in cases.iter().enumerate() {
        let entry = designs.find(kind, k, n, m).unwrap();
        let case = GemmCase::random(kind, rows, k, n_live, seed as u64 + 1);
        let report = verify_design(&device, entry, &case, None).unwrap();
        assert!(
            report.byte_identical(),
            "{kind} M{m} K{k} N{n} rows {rows} n_live {n_live}: {report:?}"
        );
        assert_eq!(report.elements, rows * n_live);
        // The comparison has teeth: the oracle's outputs are not all zero.
        assert!(case.expected(kind).iter().any(|v| *v != 0.0));
    }
}

#[test]
fn a_planted_layout_error_breaks_the_equality() {
    let dir = tempfile::tempdir().unwrap();
    let designs = common::emu_designs(
        dir.path(),
        &[
            g(DesignKind::I8, 16, 48, 24),
            g(DesignKind::I8, 16, 32, 32),
            g(DesignKind::Q4, 16, 64, 40),
        ],
    );
    let device = device();
    for (kind, k, n, planted) in [
        (DesignKind::I8, 48, 24, PlantedLayoutError::TransposedB),
        (DesignKind::I8, 32, 32, PlantedLayoutError::TransposedB),
        (DesignKind::Q4, 64, 40, PlantedLayoutError::SwappedNibbles),
    ] {
        let entry = designs.find(kind, k, n, 16).unwrap();
        let case = GemmCase::random(kind, 16, k, n, 7);
        let clean = verify_design(&device, entry, &case, None).unwrap();
        assert!(clean.byte_identical(), "control: {clean:?}");
        let broken = verify_design(&device, entry, &case, Some(planted)).unwrap();
        assert!(
            broken.identical * 4 < broken.elements,
            "{planted:?} on {kind} K{k} N{n} should break most outputs: {broken:?}"
        );
    }
}

#[test]
fn geometry_is_honoured_and_buffer_sizes_are_checked() {
    let dir = tempfile::tempdir().unwrap();
    let designs = common::emu_designs(
        dir.path(),
        &[g(DesignKind::Q4, 16, 64, 8), g(DesignKind::I8, 16, 64, 8)],
    );
    let device = device();
    let design = device
        .load_design(designs.find(DesignKind::Q4, 64, 8, 16).unwrap())
        .unwrap();
    // Control: the geometry's sizes are accepted.
    for group in ArgGroup::ALL {
        design.alloc(group).unwrap();
    }
    let b_len = design.geometry().buffer_len(ArgGroup::B);
    assert_eq!(b_len, 8 * 32 + 8 * 2 * 2, "q4 B = codes then bf16 scales");
    for (group, wrong) in [
        (ArgGroup::A, 16 * 64 + 1),
        (ArgGroup::B, 8 * 64),
        (ArgGroup::C, 16 * 8 * 2),
    ] {
        let err = design.alloc_sized(group, wrong).unwrap_err().to_string();
        let right = design.geometry().buffer_len(group);
        assert!(
            err.contains(&format!("must be {right} bytes, not {wrong}")),
            "{err}"
        );
        assert!(err.contains("q4_m16_k64_n8"), "names the design: {err}");
    }
}

#[test]
fn buffers_must_match_their_design_and_group() {
    let dir = tempfile::tempdir().unwrap();
    let designs = common::emu_designs(
        dir.path(),
        &[g(DesignKind::I8, 16, 32, 8), g(DesignKind::I8, 16, 32, 16)],
    );
    let device = device();
    let first = device
        .load_design(designs.find(DesignKind::I8, 32, 8, 16).unwrap())
        .unwrap();
    let second = device
        .load_design(designs.find(DesignKind::I8, 32, 16, 16).unwrap())
        .unwrap();
    let a = first.alloc(ArgGroup::A).unwrap();
    let b = first.alloc(ArgGroup::B).unwrap();
    let mut c = first.alloc(ArgGroup::C).unwrap();
    let foreign_b = second.alloc(ArgGroup::B).unwrap();
    let err = first.run(&a, &foreign_b, &mut c, TIMEOUT).unwrap_err();
    assert!(matches!(err, RunError::Refused { .. }), "{err}");
    assert!(
        err.to_string().contains("belongs to design i8_m16_k32_n16"),
        "{err}"
    );
    let err = first.run(&b, &a, &mut c, TIMEOUT).unwrap_err().to_string();
    assert!(err.contains("buffer of group B passed as A"), "{err}");
    first.run(&a, &b, &mut c, TIMEOUT).unwrap();
}

#[test]
fn the_software_npu_keeps_host_and_device_copies_so_a_missing_sync_shows() {
    let dir = tempfile::tempdir().unwrap();
    let designs = common::emu_designs(dir.path(), &[g(DesignKind::I8, 16, 32, 4)]);
    let device = device();
    let design = device.load_design(&designs.entries()[0]).unwrap();
    let mut a = design.alloc(ArgGroup::A).unwrap();
    let mut b = design.alloc(ArgGroup::B).unwrap();
    let mut c = design.alloc(ArgGroup::C).unwrap();
    a.as_mut_slice().fill(1);
    b.as_mut_slice().fill(2);
    b.sync_to_device().unwrap();
    // A written on the host but not synced: the device still sees zeros.
    design.run(&a, &b, &mut c, TIMEOUT).unwrap();
    assert!(c.as_slice().iter().all(|&byte| byte == 0));
    a.sync_to_device().unwrap();
    design.run(&a, &b, &mut c, TIMEOUT).unwrap();
    let first = i32::from_le_bytes(c.as_slice()[..4].try_into().unwrap());
    assert_eq!(first, 32 * 2, "sum over K of 1 x 2");
}

#[test]
fn a_missing_design_file_is_refused_by_the_runtime() {
    let dir = tempfile::tempdir().unwrap();
    let designs = common::emu_designs(dir.path(), &[g(DesignKind::I8, 16, 32, 4)]);
    let device = device();
    let good = designs.entries()[0].clone();
    device.load_design(&good).unwrap();
    for missing in ["xclbin", "insts"] {
        let mut entry: DesignEntry = good.clone();
        let gone = dir.path().join("gone.bin");
        match missing {
            "xclbin" => entry.xclbin = gone.clone(),
            _ => entry.insts = gone.clone(),
        }
        let err = device.load_design(&entry).unwrap_err().to_string();
        assert!(
            err.contains("gone.bin") && err.contains("does not exist"),
            "{err}"
        );
        assert!(err.contains(&good.name), "names the design: {err}");
    }
}

#[test]
fn a_manifest_geometry_that_does_not_match_the_design_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    common::emu_designs(dir.path(), &[g(DesignKind::I8, 16, 48, 24)]);
    let device = device();
    // Control: as written, it loads.
    device
        .load_design(&Designs::load(dir.path()).unwrap().entries()[0])
        .unwrap();
    // The manifest now claims N = 32 for a design built for N = 24.
    let manifest = dir.path().join(MANIFEST_FILE);
    let text = std::fs::read_to_string(&manifest).unwrap();
    std::fs::write(&manifest, text.replace("\"n\": 24", "\"n\": 32")).unwrap();
    let designs = Designs::load(dir.path()).unwrap();
    let err = device
        .load_design(&designs.entries()[0])
        .unwrap_err()
        .to_string();
    assert!(err.contains("built for i8 M16 K48 N24"), "{err}");
    assert!(err.contains("loaded as i8 M16 K48 N32"), "{err}");
}

#[test]
fn gemm_refuses_bad_shapes_and_overlaps_runs() {
    let dir = tempfile::tempdir().unwrap();
    let designs = common::emu_designs(
        dir.path(),
        &[g(DesignKind::Q4, 16, 64, 8), g(DesignKind::I8, 16, 64, 8)],
    );
    let device = device();
    let q4 = designs.find(DesignKind::Q4, 64, 8, 16).unwrap();
    let i8e = designs.find(DesignKind::I8, 64, 8, 16).unwrap();
    let case_q4 = GemmCase::random(DesignKind::Q4, 4, 64, 8, 3);
    let case_i8 = GemmCase::random(DesignKind::I8, 4, 64, 8, 4);
    // Weights of the wrong length or kind are refused by name.
    let err = GemmDesign::new_q4(&device, q4, &case_q4.w_codes[1..], &case_q4.w_scales_q4, 8)
        .err()
        .unwrap();
    assert!(err.to_string().contains("code bytes"), "{err}");
    assert!(GemmDesign::new_i8(&device, q4, &[0; 8 * 64], &[1.0; 8], 8).is_err());
    let mut gemm_q4 =
        GemmDesign::new_q4(&device, q4, &case_q4.w_codes, &case_q4.w_scales_q4, 8).unwrap();
    let codes: Vec<i8> = case_i8.w_codes.iter().map(|&b| b as i8).collect();
    let mut gemm_i8 = GemmDesign::new_i8(&device, i8e, &codes, &case_i8.w_scales_i8, 8).unwrap();
    let mut out = vec![0f32; 4 * 8];
    let err = gemm_q4
        .run_scaled(
            &vec![0; 17 * 64],
            &[1.0; 17],
            17,
            &mut vec![0f32; 17 * 8],
            8,
        )
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("17 rows of A, the tile holds 1..=16"),
        "{err}"
    );
    let err = gemm_q4
        .run_scaled(&case_q4.a[..100], &case_q4.a_scales, 4, &mut out, 8)
        .unwrap_err();
    assert!(err.to_string().contains("A has 100 values"), "{err}");
    let err = gemm_q4
        .run_scaled(&case_q4.a, &case_q4.a_scales, 4, &mut out[..20], 8)
        .unwrap_err();
    assert!(err.to_string().contains("cannot hold 4 rows of 8"), "{err}");

    // Two designs in flight at once, finished in either order.
    let mut out_i8 = vec![0f32; 4 * 8];
    let pending_q4 = gemm_q4.submit(&case_q4.a, 4).unwrap();
    let pending_i8 = gemm_i8.submit(&case_i8.a, 4).unwrap();
    pending_i8
        .wait_scaled(&case_i8.a_scales, &mut out_i8, 8)
        .unwrap();
    pending_q4
        .wait_scaled(&case_q4.a_scales, &mut out, 8)
        .unwrap();
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&out), bits(&case_q4.expected(DesignKind::Q4)));
    assert_eq!(bits(&out_i8), bits(&case_i8.expected(DesignKind::I8)));

    // Raw outputs: int32 accumulators of the i8 design, the unscaled group sums of the q4 one.
    let mut acc = vec![0i32; 4 * 8];
    gemm_i8.run_i32(&case_i8.a, 4, &mut acc, 8).unwrap();
    assert_eq!(acc[0], packs::quant::dot_i8(&case_i8.a[..64], &codes[..64]));
    let mut sums = vec![0f32; 4 * 8];
    gemm_q4.run_f32(&case_q4.a, 4, &mut sums, 8).unwrap();
    let expected = packs::quant::q4_row_scaled_sum(
        &case_q4.a[..64],
        &case_q4.w_codes[..32],
        &case_q4.w_scales_q4[..2],
    );
    assert_eq!(sums[0].to_bits(), expected.to_bits());
    assert!(
        gemm_q4.run_i32(&case_q4.a, 4, &mut acc, 8).is_err(),
        "int32 output of a q4 design"
    );
}
