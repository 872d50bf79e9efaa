//! The software NPU's fault injection and the driver's handling of it: a run that fails, aborts or
//! times out is an error naming the design, its geometry and the state; nothing is written to the
//! caller's output; the device stays usable.
//!
//! One test function on purpose: the faults are set through the process environment, read when a
//! device opens, and tests in one binary run on parallel threads.

mod common;

use std::time::Duration;

use common::g;
use npu_sys::verify::GemmCase;
use npu_sys::{DesignKind, Device, ErtState, GemmDesign, GemmError, RunError};

const FAULT_VARS: [&str; 3] = [
    "NPU_EMU_FAIL_RUN",
    "NPU_EMU_ABORT_RUN",
    "NPU_EMU_TIMEOUT_RUN",
];

fn clear_faults() {
    for var in FAULT_VARS {
        std::env::remove_var(var);
    }
}

#[test]
fn each_fault_is_named_and_the_device_stays_usable() {
    let dir = tempfile::tempdir().unwrap();
    let designs = common::emu_designs(dir.path(), &[g(DesignKind::Q4, 16, 64, 8)]);
    let entry = &designs.entries()[0];
    let runtime = common::open_emu();
    let case = GemmCase::random(DesignKind::Q4, 5, 64, 8, 11);
    let expected: Vec<u32> = case
        .expected(DesignKind::Q4)
        .iter()
        .map(|v| v.to_bits())
        .collect();

    for (var, state) in [
        ("NPU_EMU_FAIL_RUN", ErtState::Error),
        ("NPU_EMU_ABORT_RUN", ErtState::Abort),
        ("NPU_EMU_TIMEOUT_RUN", ErtState::Timeout),
    ] {
        clear_faults();
        std::env::set_var(var, "2");
        let device = Device::open(&runtime).unwrap();
        let mut gemm =
            GemmDesign::new_q4(&device, entry, &case.w_codes, &case.w_scales_q4, 8).unwrap();
        gemm.set_timeout(Duration::from_millis(100));
        let mut out = vec![0f32; 5 * 8];
        let run = |gemm: &mut GemmDesign, out: &mut Vec<f32>| {
            out.fill(f32::NAN);
            gemm.run_scaled(&case.a, &case.a_scales, 5, out, 8)
        };
        let bits = |out: &[f32]| out.iter().map(|v| v.to_bits()).collect::<Vec<_>>();

        run(&mut gemm, &mut out).unwrap();
        assert_eq!(bits(&out), expected, "{var}: run 1 is clean");

        let err = run(&mut gemm, &mut out).unwrap_err();
        let GemmError::Run(run_error) = &err else {
            panic!("{var}: expected a run error, got {err}");
        };
        assert!(matches!(run_error, RunError::Failed { .. }), "{err}");
        assert_eq!(run_error.state(), Some(state), "{var}: {err}");
        let text = err.to_string();
        assert!(text.contains("q4_m16_k64_n8"), "names the design: {text}");
        assert!(text.contains("q4 M16 K64 N8"), "names the geometry: {text}");
        assert!(text.contains(&state.to_string()), "names the state: {text}");
        assert!(
            out.iter().all(|v| v.is_nan()),
            "{var}: nothing written to the output"
        );

        // The same design and device go on working, with the right results.
        for _ in 0..2 {
            run(&mut gemm, &mut out).unwrap();
            assert_eq!(
                bits(&out),
                expected,
                "{var}: runs after the fault are clean"
            );
        }
    }

    // A malformed fault variable is refused by name when the device opens.
    clear_faults();
    std::env::set_var("NPU_EMU_FAIL_RUN", "second");
    let err = Device::open(&runtime).unwrap_err().to_string();
    assert!(err.contains("NPU_EMU_FAIL_RUN"), "{err}");
    clear_faults();
    Device::open(&runtime).unwrap();
}
