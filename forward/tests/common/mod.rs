//! Shared by the device-path tests: random tiny packs, the software NPU and designs for it.

#![allow(dead_code)]

use forward::DeviceConfig;
use npu_sys::designs::write_emu_designs;
use npu_sys::plan::plan_pack;
use packs::random::{write_random, RandomShape};
use packs::{Pack, QuantKind};
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub fn tiny_pack(dir: &Path, quant: QuantKind) -> Arc<Pack> {
    let path = dir.join(format!("tiny-{quant}.pack"));
    write_random(&RandomShape::tiny(), quant, 11, &path).unwrap();
    Arc::new(Pack::open(&path).unwrap())
}

/// `libnpu_emu.so`, built next to the test binaries by the npu-emu dev-dependency.
pub fn emu_library() -> PathBuf {
    if let Some(path) = std::env::var_os("NPU_EMU_LIB") {
        return PathBuf::from(path);
    }
    let exe = std::env::current_exe().unwrap();
    let deps = exe.parent().unwrap();
    for candidate in [
        deps.join("libnpu_emu.so"),
        deps.parent().unwrap().join("libnpu_emu.so"),
    ] {
        if candidate.is_file() {
            return candidate;
        }
    }
    panic!("libnpu_emu.so is not built next to {}", deps.display());
}

/// Software-NPU designs for every geometry the pack needs, in `dir`.
pub fn emu_config(pack: &Pack, dir: &Path) -> DeviceConfig {
    let plan = plan_pack(pack).unwrap();
    write_emu_designs(dir, &plan.geometries()).unwrap();
    DeviceConfig {
        runtime: Some(emu_library()),
        designs: dir.to_path_buf(),
        program: "forward-tests".into(),
        ..DeviceConfig::default()
    }
}
