//! Opening a runtime: the software NPU through the libloading path; refusals of a missing file,
//! a non-library, a library missing a symbol, and an ABI version mismatch (stub libraries
//! compiled here with `cc`).

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use npu_sys::{Device, Runtime, RuntimeError, RuntimeSource, ABI_SYMBOLS, ABI_VERSION};

/// Compiles a shared library exporting `symbols` (all trivial) with `xdna_vl_abi_version`
/// returning `version` when it is among them.
fn stub_library(dir: &Path, name: &str, symbols: &[&str], version: u32) -> PathBuf {
    let mut source = String::from("#include <stdint.h>\n");
    for symbol in symbols {
        match *symbol {
            "xdna_vl_abi_version" => {
                source += &format!("uint32_t xdna_vl_abi_version(void) {{ return {version}u; }}\n")
            }
            "xdna_vl_runtime_flags" => {
                source += "uint32_t xdna_vl_runtime_flags(void) { return 1u; }\n"
            }
            other => source += &format!("int {other}(void) {{ return 4; }}\n"),
        }
    }
    let c_file = dir.join(format!("{name}.c"));
    let so_file = dir.join(format!("{name}.so"));
    std::fs::write(&c_file, source).unwrap();
    let status = Command::new("cc")
        .args(["-shared", "-fPIC", "-o"])
        .arg(&so_file)
        .arg(&c_file)
        .status()
        .expect("these tests need a C compiler (`cc`) to build stub runtimes");
    assert!(status.success(), "cc failed on {}", c_file.display());
    so_file
}

#[test]
fn the_software_npu_opens_through_the_loader() {
    let runtime = common::open_emu();
    assert!(runtime.is_software());
    assert_eq!(runtime.abi_version(), ABI_VERSION);
    assert_eq!(runtime.source(), &RuntimeSource::Explicit);
    // Software: no device node needed (this machine has none).
    let device = Device::open(&runtime).unwrap();
    assert!(device.info().software);
    assert_eq!(device.info().name, "npu-emu");
    assert!(device.info().columns > 0);
}

#[test]
fn a_stub_with_every_symbol_opens_and_is_a_control_for_the_refusals() {
    let dir = tempfile::tempdir().unwrap();
    let complete = stub_library(dir.path(), "complete", &ABI_SYMBOLS, ABI_VERSION);
    let runtime = Runtime::open(Some(&complete)).unwrap();
    assert_eq!(runtime.path(), complete);
}

#[test]
fn a_missing_symbol_is_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    for missing in [
        "xdna_vl_run_wait",
        "xdna_vl_buffer_sync",
        "xdna_vl_last_error",
    ] {
        let symbols: Vec<&str> = ABI_SYMBOLS
            .iter()
            .copied()
            .filter(|s| *s != missing)
            .collect();
        let library = stub_library(
            dir.path(),
            &format!("without_{missing}"),
            &symbols,
            ABI_VERSION,
        );
        let err = Runtime::open(Some(&library)).unwrap_err();
        match &err {
            RuntimeError::MissingSymbol { symbol, path } => {
                assert_eq!(symbol, missing);
                assert_eq!(path, &library);
            }
            other => panic!("expected a missing symbol, got {other}"),
        }
        assert!(err.to_string().contains(missing), "{err}");
    }
}

#[test]
fn an_abi_version_mismatch_is_refused_with_both_numbers() {
    let dir = tempfile::tempdir().unwrap();
    // Version 1 stored the q4 codes of B as two's complement (now offset binary).
    let library = stub_library(dir.path(), "v1", &ABI_SYMBOLS, 1);
    let err = Runtime::open(Some(&library)).unwrap_err();
    assert!(
        matches!(
            err,
            RuntimeError::AbiMismatch {
                found: 1,
                expected: ABI_VERSION,
                ..
            }
        ),
        "{err}"
    );
    let text = err.to_string();
    assert!(
        text.contains("version 1") && text.contains(&format!("version {ABI_VERSION}")),
        "{text}"
    );
    // The version is checked before the other symbols: a future runtime is named as such.
    let future = ABI_VERSION + 1;
    let only_version = stub_library(dir.path(), "future_only", &["xdna_vl_abi_version"], future);
    let err = Runtime::open(Some(&only_version)).unwrap_err();
    assert!(
        matches!(err, RuntimeError::AbiMismatch { found, .. } if found == future),
        "{err}"
    );
}

#[test]
fn a_missing_or_bogus_runtime_file_is_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let absent = dir.path().join("libnothing.so");
    let err = Runtime::open(Some(&absent)).unwrap_err();
    assert!(matches!(err, RuntimeError::Missing { .. }));
    let text = err.to_string();
    assert!(
        text.contains("libnothing.so") && text.contains("--runtime"),
        "{text}"
    );

    let not_a_library = dir.path().join("libtext.so");
    std::fs::write(&not_a_library, "not an ELF file").unwrap();
    let err = Runtime::open(Some(&not_a_library)).unwrap_err();
    assert!(matches!(err, RuntimeError::Load { .. }), "{err}");
    assert!(err.to_string().contains("libtext.so"));
}

#[test]
fn a_hardware_runtime_without_a_device_is_refused_before_opening() {
    // A stub that claims to be hardware (flags 0): Device::open must look for an amdxdna node
    // first, and this machine has none.
    let dir = tempfile::tempdir().unwrap();
    let mut source = String::from("#include <stdint.h>\n");
    for symbol in ABI_SYMBOLS {
        source += &match symbol {
            "xdna_vl_abi_version" => {
                format!("uint32_t {symbol}(void) {{ return {ABI_VERSION}u; }}\n")
            }
            "xdna_vl_runtime_flags" => format!("uint32_t {symbol}(void) {{ return 0u; }}\n"),
            _ => format!("int {symbol}(void) {{ return 4; }}\n"),
        };
    }
    let c_file = dir.path().join("hw.c");
    let so_file = dir.path().join("hw.so");
    std::fs::write(&c_file, source).unwrap();
    assert!(Command::new("cc")
        .args(["-shared", "-fPIC", "-o"])
        .arg(&so_file)
        .arg(&c_file)
        .status()
        .unwrap()
        .success());
    let runtime = Runtime::open(Some(&so_file)).unwrap();
    assert!(!runtime.is_software());
    if Path::new("/dev/accel").exists() {
        return; // a machine with accelerators: the refusal below is not what it would say
    }
    let err = Device::open(&runtime).unwrap_err().to_string();
    assert!(err.contains("no NPU") && err.contains("amdxdna"), "{err}");
}
