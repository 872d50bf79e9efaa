//! Shared by the device-path tests: random tiny packs, the software NPU and designs for it.

#![allow(dead_code)]

use compute::{DeviceConfig, GemmChoice, Runtime, RuntimeOptions};
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
    npu_sys::emu_library().unwrap_or_else(|e| panic!("{e}"))
}

/// Software-NPU designs for every geometry the pack needs, in `dir`.
pub fn emu_config(pack: &Pack, dir: &Path) -> DeviceConfig {
    let plan = plan_pack(pack).unwrap();
    write_emu_designs(dir, &plan.geometries()).unwrap();
    DeviceConfig {
        runtime: Some(emu_library()),
        designs: Some(dir.to_path_buf()),
        program: "forward-tests".into(),
        ..DeviceConfig::default()
    }
}

/// The host backend on 2 threads.
pub fn host() -> Runtime {
    Runtime::host(2).unwrap()
}

/// `gemm` on 2 threads with the software NPU of `config`.
pub fn runtime(gemm: GemmChoice, config: &DeviceConfig) -> Runtime {
    Runtime::new(&RuntimeOptions {
        threads: 2,
        gemm,
        device: config.clone(),
    })
    .unwrap()
}
