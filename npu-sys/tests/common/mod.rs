//! Shared by the integration tests: finding the software NPU and making designs for it.
//!
//! The software NPU (`libnpu_emu.so`) is a dev-dependency of npu-sys, so `cargo test -p npu-sys`
//! builds it next to the test binaries (`target/<profile>/deps/libnpu_emu.so`); a plain
//! `cargo build -p npu-emu` puts it in `target/<profile>/`. `NPU_EMU_LIB` overrides both.

#![allow(dead_code)]

use std::path::{Path, PathBuf};

use npu_sys::designs::{write_emu_designs, Designs};
use npu_sys::{DesignKind, Geometry, Runtime, RuntimeSource};

pub fn emu_library() -> PathBuf {
    npu_sys::emu_library().unwrap_or_else(|e| panic!("{e}"))
}

/// The software NPU, opened through the same libloading path as any runtime.
pub fn open_emu() -> Runtime {
    Runtime::open_path(&emu_library(), RuntimeSource::Explicit).expect("open the software NPU")
}

pub fn emu_designs(dir: &Path, geometries: &[Geometry]) -> Designs {
    write_emu_designs(dir, geometries).expect("write software NPU designs")
}

pub fn g(kind: DesignKind, m_tile: usize, k: usize, n: usize) -> Geometry {
    Geometry::new(kind, m_tile, k, n)
}
