//! The tower's linears on the software NPU: `--gemm ab` (host and device compared GEMM by GEMM)
//! shows 0 differing GEMMs for i8 and q4 towers, the device alone gives the host's bits, and a
//! planted weight-layout mistake is caught. Ids start after another weight's (as after a decoder's).

use crate::common;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use common::{build_pack, encode_on, worst, Case, Reference};
use compute::{
    AbGemm, DeviceConfig, DeviceGemm, GemmBackend, HostGemm, PackLinear, PlantedLayout, Runtime,
};
use npu_sys::designs::write_emu_designs;
use npu_sys::plan::plan_pack;
use packs::{Pack, QuantKind};
use vision::tower::{Tower, TowerAblation};

/// `libnpu_emu.so`, built next to the test binaries by the npu-emu dev-dependency.
fn emu_library() -> PathBuf {
    npu_sys::emu_library().unwrap_or_else(|e| panic!("{e}"))
}

/// Software-NPU designs for every geometry of the pack's tower linears.
fn tower_emu_config(pack: &Pack, dir: &Path, plant: PlantedLayout) -> DeviceConfig {
    // The pack's plan (decoder and tower), as `npu-designs emu PACK` writes it.
    let plan = plan_pack(pack).unwrap();
    assert!(plan.host_only.is_empty(), "{:?}", plan.host_only);
    write_emu_designs(dir, &plan.geometries()).unwrap();
    DeviceConfig {
        runtime: Some(emu_library()),
        designs: Some(dir.to_path_buf()),
        program: "vision-tests".into(),
        plant,
        ..DeviceConfig::default()
    }
}

fn encode_with(pack: &Arc<Pack>, runtime: &Runtime, r: &Reference) -> vision::tower::VisionOutput {
    // Another weight first (a decoder's head), so the tower's ids do not start at 0.
    runtime.register(pack, &[PackLinear::Head]).unwrap();
    let mut tower = Tower::new(pack, runtime).unwrap();
    tower.encode(&r.image_refs()).unwrap()
}

fn on(pool: &Arc<rayon::ThreadPool>, backend: impl GemmBackend + 'static) -> Runtime {
    Runtime::with_backend(pool.clone(), Box::new(backend))
}

#[test]
fn tower_on_the_software_npu_matches_the_host_bit_for_bit() {
    for kind in [QuantKind::I8, QuantKind::Q4] {
        let dir = tempfile::tempdir().unwrap();
        let pack = build_pack(Case::Wide, kind, dir.path());
        let config = tower_emu_config(&pack, &dir.path().join("designs"), PlantedLayout::None);
        let r = Reference::open(Case::Wide, kind);
        let pool = common::pool();

        let ab = on(
            &pool,
            AbGemm::new(
                HostGemm::new(pool.clone()),
                DeviceGemm::open(&config).unwrap(),
            ),
        );
        let out = encode_with(&pack, &ab, &r);
        let report = ab.ab_report().unwrap();
        println!("{kind}: {report:?}");
        assert!(report.gemms > 0);
        assert_eq!(report.differing_gemms, 0, "{kind}: {report:?}");
        assert!(worst(&out, &r) <= 1e-4);

        let device = on(&pool, DeviceGemm::open(&config).unwrap());
        let on_device = encode_with(&pack, &device, &r);
        let host = on(&pool, HostGemm::new(pool.clone()));
        let on_host = encode_on(&pack, &host, &r.image_refs(), TowerAblation::default());
        assert!(device.take_stats().launches > 0);
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(
            bits(&on_device.image_embeds),
            bits(&on_host.image_embeds),
            "{kind}"
        );
        assert_eq!(
            bits(&on_device.deepstack),
            bits(&on_host.deepstack),
            "{kind}"
        );
    }
}

/// Control: the comparison catches a weight uploaded in the wrong layout.
#[test]
fn planted_layout_is_caught_by_the_comparison() {
    for (kind, plant) in [
        (QuantKind::I8, PlantedLayout::TransposedB),
        (QuantKind::Q4, PlantedLayout::SwappedNibbles),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let pack = build_pack(Case::Chat, kind, dir.path());
        let config = tower_emu_config(&pack, &dir.path().join("designs"), plant);
        let r = Reference::open(Case::Chat, kind);
        let pool = common::pool();
        let ab = on(
            &pool,
            AbGemm::new(
                HostGemm::new(pool.clone()),
                DeviceGemm::open(&config).unwrap(),
            ),
        );
        encode_with(&pack, &ab, &r);
        let report = ab.ab_report().unwrap();
        println!("{kind} {plant:?}: {report:?}");
        assert!(report.differing_gemms > 0, "{kind} {plant:?}: {report:?}");
    }
}

/// `xdna-vl-vision --gemm ab` on the software NPU: every GEMM compared (23 per image: the CLI
/// encodes image by image), none differing.
#[test]
fn cli_gemm_ab_on_the_software_npu() {
    let dir = tempfile::tempdir().unwrap();
    let pack = build_pack(Case::Wide, QuantKind::Q4, dir.path());
    let designs = dir.path().join("designs");
    let config = tower_emu_config(&pack, &designs, PlantedLayout::None);
    let run = std::process::Command::new(env!("CARGO_BIN_EXE_xdna-vl-vision"))
        .arg(pack.path())
        .arg("--pixels")
        .arg(Case::Wide.reference())
        .arg("-o")
        .arg(dir.path().join("rows.safetensors"))
        .args(["--gemm", "ab", "--threads", "2"])
        .arg("--runtime")
        .arg(config.runtime.unwrap())
        .arg("--designs")
        .arg(&designs)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(
        run.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&run.stderr)
    );
    println!("{stdout}");
    assert!(stdout.contains("ab: 69 GEMMs, 0 differing"), "{stdout}");
}
