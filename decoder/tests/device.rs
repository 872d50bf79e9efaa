//! The device backend on the software NPU: byte-identical to the host for i8 and q4, planted layout
//! errors caught, unquantized packs and missing designs refused by name.

mod common;

use common::{emu_config, tiny_pack};
use compute::{GemmChoice, PlantedLayout};
use decoder::{Decoder, DecoderOptions, Logits};
use packs::QuantKind;

const PROMPT: usize = 20; // > 16: the prefill tile; then single-row decode steps on the 16 tile

fn options() -> DecoderOptions {
    DecoderOptions {
        capacity: 160,
        ..DecoderOptions::default()
    }
}

fn tokens(n: usize) -> Vec<u32> {
    (0..n as u32).map(|i| (i * 37 + 5) % 240).collect()
}

/// Prefill and 3 decode steps; all logits.
fn run(f: &mut Decoder, prompt: usize) -> Vec<f32> {
    let t = tokens(prompt);
    let mut out = f.step_batch(&t, 0, 0, Logits::AllRows).unwrap().to_vec();
    for i in 0..3 {
        out.extend_from_slice(
            f.step(7 + i as u32, (prompt + i) as i64, prompt + i)
                .unwrap(),
        );
    }
    out
}

/// The pack's decoder on the host and on the software NPU (designs for it written under `dir`),
/// and the device's configuration.
fn host_and_device(
    pack: &std::sync::Arc<packs::Pack>,
    dir: &std::path::Path,
) -> (Decoder, Decoder, compute::DeviceConfig) {
    let config = emu_config(pack, &dir.join("designs"));
    let host = Decoder::new(pack, &common::host(), options()).unwrap();
    let device = Decoder::new(
        pack,
        &common::runtime(GemmChoice::Device, &config),
        options(),
    )
    .unwrap();
    (host, device, config)
}

#[test]
fn device_logits_are_byte_identical_to_the_host_for_i8_and_q4() {
    for kind in [QuantKind::I8, QuantKind::Q4] {
        let dir = tempfile::tempdir().unwrap();
        let pack = tiny_pack(dir.path(), kind);
        let (mut host, mut device, config) = host_and_device(&pack, dir.path());
        // 20 rows fit the 128 tile; 140 rows loop over two 128-row tiles.
        for prompt in [PROMPT, 140] {
            host.reset();
            device.reset();
            let h = run(&mut host, prompt);
            let d = run(&mut device, prompt);
            let differing = h
                .iter()
                .zip(&d)
                .filter(|(a, b)| a.to_bits() != b.to_bits())
                .count();
            assert_eq!(
                differing, 0,
                "{kind}, {prompt} rows: {differing} logits differ"
            );
        }
        let stats = device.runtime().take_stats();
        assert!(stats.launches > 0);

        let mut ab =
            Decoder::new(&pack, &common::runtime(GemmChoice::Ab, &config), options()).unwrap();
        run(&mut ab, PROMPT);
        let report = ab.runtime().ab_report().unwrap();
        assert!(report.gemms > 0);
        assert_eq!(report.differing_values, 0, "{kind}: {report:?}");
    }
}

#[test]
fn planted_layout_errors_break_the_comparison() {
    for (kind, plant) in [
        (QuantKind::I8, PlantedLayout::TransposedB),
        (QuantKind::Q4, PlantedLayout::TransposedB),
        (QuantKind::Q4, PlantedLayout::SwappedNibbles),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let pack = tiny_pack(dir.path(), kind);
        let mut config = emu_config(&pack, &dir.path().join("designs"));
        config.plant = plant;
        let mut ab =
            Decoder::new(&pack, &common::runtime(GemmChoice::Ab, &config), options()).unwrap();
        run(&mut ab, PROMPT);
        let report = ab.runtime().ab_report().unwrap();
        println!("{kind} {plant:?}: {report:?}");
        assert_eq!(
            report.differing_gemms, report.gemms,
            "{kind} {plant:?}: every GEMM must differ"
        );
        assert!(report.max_abs_diff > 1e-3);
    }
}

#[test]
fn unquantized_packs_and_missing_designs_are_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let q4 = tiny_pack(dir.path(), QuantKind::Q4);
    let config = emu_config(&q4, &dir.path().join("designs"));
    let f32_pack = tiny_pack(dir.path(), QuantKind::F32);
    let e = Decoder::new(
        &f32_pack,
        &common::runtime(GemmChoice::Device, &config),
        options(),
    )
    .err()
    .unwrap()
    .to_string();
    assert!(
        e.contains("q_proj") && e.contains("i8 and q4 packs only"),
        "{e}"
    );
    // q4 designs for an i8 pack: the missing geometry is named.
    let i8_pack = tiny_pack(dir.path(), QuantKind::I8);
    let e = Decoder::new(
        &i8_pack,
        &common::runtime(GemmChoice::Device, &config),
        options(),
    )
    .err()
    .unwrap()
    .to_string();
    assert!(e.contains("i8"), "{e}");
    println!("{e}");
}

/// Qwen3.5 (tests/fixtures/chat-qwen3_5: DeltaNet and gated-attention layers, the MTP head) on
/// the software NPU: the plan covers every linear of the pack (it used to ask for Qwen3-VL's
/// projections in every layer and refused the pack), and the device's logits, and the MTP
/// head's over the first ids, equal the host's byte for byte.
#[test]
fn a_qwen3_5_pack_plans_and_runs_on_the_device_as_on_the_host() {
    let checkpoint = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures/chat-qwen3_5/Qwen3.5-tiny");
    for kind in [QuantKind::I8, QuantKind::Q4] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(format!("q35-{kind}.pack"));
        let opts = packs::build::BuildOptions::new(kind);
        packs::build::build_from_hf(&checkpoint, &path, &opts).unwrap();
        let pack = std::sync::Arc::new(packs::Pack::open(&path).unwrap());
        assert!(pack.semantics().delta_net.is_some());
        let (mut host, mut device, _) = host_and_device(&pack, dir.path());
        for f in [&mut host, &mut device] {
            assert_eq!(f.set_mtp_vocab(64).unwrap(), 64);
        }
        let (h, d) = (run(&mut host, PROMPT), run(&mut device, PROMPT));
        assert_eq!(h.len(), d.len());
        let differing = h.iter().zip(&d).filter(|(a, b)| a.to_bits() != b.to_bits());
        assert_eq!(differing.count(), 0, "{kind}: logits differ");
        let hidden = vec![0.25f32; host.semantics().hidden_size];
        let mtp = |f: &mut Decoder| {
            let mut cache = f.new_mtp_cache(8, decoder::KvDtype::F32);
            let planes = decoder::HybridInputs::text(0);
            f.mtp_step(&mut cache, &hidden, &hidden, &planes, Logits::LastRow)
                .unwrap()
                .to_vec()
        };
        let (hm, dm) = (mtp(&mut host), mtp(&mut device));
        assert_eq!(hm.len(), 64);
        assert_eq!(
            hm.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            dm.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            "{kind}: the MTP head's logits differ"
        );
        assert!(device.runtime().take_stats().launches > 0);
    }
}
