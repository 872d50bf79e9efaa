//! A C program (tests/c/prompt_run.c) linked against libxdna_vl runs a hybrid prompt — prefill through
//! `xvl_step_batch_embeds`, greedy `xvl_step`s, a text `xvl_step_batch` — and its logits and ids must
//! equal the Rust API's byte for byte, linked dynamically and statically.

use crate::common;

use common::Link;
use compute::ops::sampling::argmax;
use compute::{DeviceConfig, GemmChoice, Runtime, RuntimeOptions};
use decoder::{Decoder, DecoderOptions, KvDtype, Logits};
use packs::random::{write_random, RandomShape};
use packs::stfile::StFile;
use packs::{BuildOptions, Pack, QuantKind};
use std::ffi::{OsStr, OsString};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use testkit::PromptInputs;

const FNV_START: u64 = 0xcbf2_9ce4_8422_2325;

fn fnv1a(mut h: u64, bytes: &[u8]) -> u64 {
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

fn bytes(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// The GEMM backend of a run; the device ones on the software NPU.
#[derive(Clone)]
enum Gemm {
    Host,
    Device(DeviceConfig),
    Ab(DeviceConfig),
}

/// One run's settings, shared by the C program and the Rust reference.
#[derive(Clone)]
struct Run {
    greedy_steps: usize,
    capacity: usize,
    threads: usize,
    kv: KvDtype,
    gemm: Gemm,
}

impl Run {
    fn host(greedy_steps: usize, capacity: usize) -> Run {
        Run {
            greedy_steps,
            capacity,
            threads: 2,
            kv: KvDtype::F32,
            gemm: Gemm::Host,
        }
    }

    /// prompt_run.c's arguments after LOGITS_OUT.
    fn c_args(&self) -> Vec<OsString> {
        let kv = match self.kv {
            KvDtype::F32 => "f32",
            KvDtype::Bf16 => "bf16",
        };
        let mut args: Vec<OsString> = vec![self.threads.to_string().into(), kv.into()];
        let device = |name: &str, c: &DeviceConfig| -> Vec<OsString> {
            let runtime = c.runtime.clone().expect("the software NPU's path");
            let designs = c.designs.clone().expect("the designs directory");
            vec![name.into(), runtime.into(), designs.into()]
        };
        match &self.gemm {
            Gemm::Host => args.push("host".into()),
            Gemm::Device(c) => args.extend(device("device", c)),
            Gemm::Ab(c) => args.extend(device("ab", c)),
        }
        args
    }

    fn runtime(&self) -> Runtime {
        let (gemm, device) = match &self.gemm {
            Gemm::Host => (GemmChoice::Host, DeviceConfig::default()),
            Gemm::Device(c) => (GemmChoice::Device, c.clone()),
            Gemm::Ab(c) => (GemmChoice::Ab, c.clone()),
        };
        Runtime::new(&RuntimeOptions {
            threads: self.threads,
            gemm,
            device,
        })
        .unwrap()
    }
}

/// The prompt file prompt_run.c reads (its layout is documented at the top of the C file).
fn write_prompt_bin(p: &PromptInputs, run: &Run, path: &Path) {
    let rows = p.rows();
    let n_img = p.image_rows().len();
    let mut out = b"XVLPRMT1".to_vec();
    for v in [rows, n_img, p.deepstack_sets, p.hidden] {
        out.extend((v as u64).to_le_bytes());
    }
    out.extend(p.image_token_id.to_le_bytes());
    out.extend((run.greedy_steps as u64).to_le_bytes());
    out.extend((run.capacity as u64).to_le_bytes());
    for v in p.input_ids.iter().chain(&p.position_ids) {
        out.extend(v.to_le_bytes());
    }
    out.extend(bytes(&p.image_embeds));
    out.extend(bytes(&p.deepstack));
    std::fs::write(path, out).unwrap();
}

/// What prompt_run.c does, through the Rust API: its stdout and its logits file, to the byte.
fn rust_run(pack: &Path, p: &PromptInputs, run: &Run) -> (String, Vec<u8>) {
    let pack = Arc::new(Pack::open(pack).unwrap());
    let options = DecoderOptions {
        capacity: run.capacity,
        kv_dtype: run.kv,
        ..DecoderOptions::default()
    };
    let mut f = Decoder::new(&pack, &run.runtime(), options).unwrap();
    let (hidden, vocab, sets) = {
        let s = f.semantics();
        (s.hidden_size, s.vocab_size, s.deepstack_sets)
    };
    let rows = p.rows();
    let mut text = String::new();
    let mut all = Vec::new();
    let embeds = p.embeds(&f);
    let prefill = f
        .step_batch_embeds(&embeds, &p.hybrid(), 0, Logits::AllRows)
        .unwrap()
        .to_vec();
    all.extend(bytes(&prefill));
    let sum = fnv1a(FNV_START, &bytes(&prefill));
    writeln!(text, "prefill rows={rows} fnv1a64={sum:016x}").unwrap();
    let mut greedy = vec![argmax(&prefill[(rows - 1) * vocab..])];
    let next_pos = p.next_rotary_pos();
    let mut steps_sum = FNV_START;
    for i in 0..run.greedy_steps {
        let logits = f.step(greedy[i], next_pos + i as i64, rows + i).unwrap();
        let b = bytes(logits);
        steps_sum = fnv1a(steps_sum, &b);
        all.extend(b);
        greedy.push(argmax(logits));
    }
    writeln!(
        text,
        "steps n={} fnv1a64={steps_sum:016x}",
        run.greedy_steps
    )
    .unwrap();
    let ids: Vec<String> = greedy.iter().map(|g| g.to_string()).collect();
    writeln!(text, "ids {}", ids.join(" ")).unwrap();
    writeln!(
        text,
        "next_slot={} capacity={} kv_bytes={} hidden={hidden} vocab={vocab} deepstack_sets={sets}",
        f.next_slot(),
        f.kv().capacity(),
        f.kv_bytes()
    )
    .unwrap();
    f.reset();
    let batch = f.step_batch(&greedy, 0, 0, Logits::AllRows).unwrap();
    let b = bytes(batch);
    writeln!(
        text,
        "text rows={} fnv1a64={:016x}",
        greedy.len(),
        fnv1a(FNV_START, &b)
    )
    .unwrap();
    all.extend(b);
    if let Gemm::Ab(_) = run.gemm {
        let r = f.runtime().ab_report().expect("an ab backend reports");
        writeln!(
            text,
            "ab gemms={} differing_gemms={} differing_values={} max_abs_diff_bits={:08x}",
            r.gemms,
            r.differing_gemms,
            r.differing_values,
            r.max_abs_diff.to_bits()
        )
        .unwrap();
    }
    writeln!(text, "all fnv1a64={:016x}", fnv1a(FNV_START, &all)).unwrap();
    (text, all)
}

/// A hybrid prompt for the tiny random shape: text, vision start, a 2x2 image (t = 2, h and w over the
/// grid), vision end, text; positions after the image run behind the rows (rope_delta = -2).
fn tiny_prompt(shape: &RandomShape) -> PromptInputs {
    let sem = &shape.semantics;
    let img = i64::from(sem.image_token_id.unwrap());
    let (start, end) = (
        i64::from(sem.vision_start_token_id.unwrap()),
        i64::from(sem.vision_end_token_id.unwrap()),
    );
    let input_ids = vec![3, start, img, img, img, img, end, 17, 99, 4];
    let t = [0, 1, 2, 2, 2, 2, 4, 5, 6, 7];
    let h = [0, 1, 2, 2, 3, 3, 4, 5, 6, 7];
    let w = [0, 1, 2, 3, 2, 3, 4, 5, 6, 7];
    let hidden = sem.hidden_size;
    let wave = |n: usize, phase: f32| -> Vec<f32> {
        (0..n)
            .map(|i| 0.5 * (i as f32 * 0.37 + phase).sin())
            .collect()
    };
    PromptInputs {
        path: PathBuf::from("synthetic:tiny"),
        input_ids,
        position_ids: [t, h, w].concat(),
        image_embeds: wave(4 * hidden, 0.0),
        deepstack: wave(sem.deepstack_sets * 4 * hidden, 1.0),
        deepstack_sets: sem.deepstack_sets,
        hidden,
        image_token_id: img,
        rope_delta: -2,
    }
}

/// Compiles prompt_run.c, runs it, and returns its stdout and logits file.
fn c_run(exe: &Path, dir: &Path, pack: &Path, p: &PromptInputs, run: &Run) -> (String, Vec<u8>) {
    let prompt = dir.join("prompt.bin");
    let logits = dir.join("logits.f32");
    write_prompt_bin(p, run, &prompt);
    let mut args: Vec<OsString> = vec![pack.into(), prompt.into(), logits.clone().into()];
    args.extend(run.c_args());
    let args: Vec<&OsStr> = args.iter().map(OsString::as_os_str).collect();
    let out = common::run(exe, &args);
    (
        String::from_utf8(out.stdout).unwrap(),
        std::fs::read(&logits).unwrap(),
    )
}

fn assert_same(what: &str, c: &(String, Vec<u8>), rust: &(String, Vec<u8>)) {
    assert_eq!(
        c.0, rust.0,
        "{what}: C stdout (left) differs from the Rust API's (right)"
    );
    assert_eq!(c.1.len(), rust.1.len(), "{what}: logits byte count");
    if let Some(i) = c.1.iter().zip(&rust.1).position(|(a, b)| a != b) {
        panic!("{what}: logits differ first at byte {i} (float {})", i / 4);
    }
}

#[test]
fn the_c_program_equals_the_rust_api_byte_for_byte_on_a_tiny_random_pack() {
    let dir = tempfile::tempdir().unwrap();
    let shape = RandomShape::tiny();
    let pack = dir.path().join("tiny.pack");
    write_random(&shape, QuantKind::F32, 11, &pack).unwrap();
    let prompt = tiny_prompt(&shape);
    let dynamic = common::compile("prompt_run.c", dir.path(), Link::Dynamic);
    let stat = common::compile("prompt_run.c", dir.path(), Link::Static);

    let run = Run::host(6, 32);
    let rust = rust_run(&pack, &prompt, &run);
    let c = c_run(&dynamic, dir.path(), &pack, &prompt, &run);
    println!("{}", c.0);
    assert_same("dynamic, f32 KV", &c, &rust);

    // Controls: what a C caller would get wrong must change the output. DeepStack dropped, plain
    // text positions instead of the planes, and the other KV type.
    let mut no_deepstack = prompt.clone();
    no_deepstack.deepstack.iter_mut().for_each(|v| *v = 0.0);
    let mut text_planes = prompt.clone();
    let rows = prompt.rows() as i64;
    text_planes.position_ids = (0..3).flat_map(|_| 0..rows).collect();
    let bf16 = Run {
        kv: KvDtype::Bf16,
        ..run.clone()
    };
    for (what, p, r) in [
        ("DeepStack zeroed", &no_deepstack, &run),
        ("text planes", &text_planes, &run),
        ("bf16 KV", &prompt, &bf16),
    ] {
        let planted = rust_run(&pack, p, r);
        let prefill_or_all = |s: &str| s.lines().last().unwrap_or("").to_string();
        assert_ne!(
            prefill_or_all(&planted.0),
            prefill_or_all(&c.0),
            "control ({what}) left the checksum unchanged"
        );
    }

    // The static library, with a bf16 KV cache and one thread.
    let run = Run { threads: 1, ..bf16 };
    let rust = rust_run(&pack, &prompt, &run);
    let c = c_run(&stat, dir.path(), &pack, &prompt, &run);
    assert_same("static, bf16 KV", &c, &rust);
}

/// The bundled transformers fixture (a Qwen3-VL with head_dim 128, one image of 12 rows, 3 DeepStack
/// sets) built to an f32 pack here: the C run equals the Rust API's, and its greedy ids are
/// transformers' (the reference's 8 ids: the prompt's argmax and 7 steps).
#[test]
fn the_c_program_equals_the_rust_api_on_the_bundled_fixture() {
    fixture_through_c("hd128");
}

/// The same C program on a Qwen3.5 fixture (Gated DeltaNet layers, gated attention, two
/// pictures): the pack says the family, the ABI is unchanged.
#[test]
fn the_c_program_runs_a_qwen3_5_pack_unchanged() {
    fixture_through_c("q35-odd");
}

fn fixture_through_c(name: &str) {
    let case = common::crate_dir().join("../tests/fixtures").join(name);
    let inputs = PromptInputs::open(case.join("inputs.safetensors")).expect("fixture inputs");
    let reference = StFile::open(case.join("reference.safetensors")).expect("fixture reference");
    let (reference_ids, _) = reference.i64("greedy_ids", 1).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let pack = dir.path().join(format!("{name}.pack"));
    packs::build_from_hf(
        &case.join("checkpoint"),
        &pack,
        &BuildOptions::new(QuantKind::F32),
    )
    .expect("fixture pack");
    let run = Run::host(reference_ids.len() - 1, inputs.rows() + 16);
    let exe = common::compile("prompt_run.c", dir.path(), Link::Dynamic);
    let rust = rust_run(&pack, &inputs, &run);
    let c = c_run(&exe, dir.path(), &pack, &inputs, &run);
    println!("{}", c.0);
    assert_same(name, &c, &rust);
    let ids: Vec<String> = reference_ids.iter().map(|i| i.to_string()).collect();
    let expected = format!("ids {}", ids.join(" "));
    assert!(
        c.0.lines().any(|l| l == expected),
        "C greedy ids differ from transformers' ({expected})"
    );
}

/// XVL_GEMM_DEVICE and XVL_GEMM_AB on the software NPU: an i8 pack, the C run equal to the Rust
/// API's with the same backend, and the C side's ab report showing the device ran every GEMM.
#[test]
fn the_c_program_equals_the_rust_api_on_the_device_backends() {
    let dir = tempfile::tempdir().unwrap();
    let shape = RandomShape::tiny();
    let pack_path = dir.path().join("tiny-i8.pack");
    write_random(&shape, QuantKind::I8, 11, &pack_path).unwrap();
    let pack = Pack::open(&pack_path).unwrap();
    let designs = dir.path().join("designs");
    let plan = npu_sys::plan::plan_pack(&pack).unwrap();
    npu_sys::designs::write_emu_designs(&designs, &plan.geometries()).unwrap();
    let config = DeviceConfig {
        runtime: Some(common::lib_dir().join("libnpu_emu.so")),
        designs: Some(designs),
        program: "forward-capi-tests".into(),
        ..DeviceConfig::default()
    };
    let prompt = tiny_prompt(&shape);
    let exe = common::compile("prompt_run.c", dir.path(), Link::Dynamic);
    for gemm in [Gemm::Device(config.clone()), Gemm::Ab(config.clone())] {
        let run = Run {
            gemm,
            ..Run::host(4, 32)
        };
        let rust = rust_run(&pack_path, &prompt, &run);
        let c = c_run(&exe, dir.path(), &pack_path, &prompt, &run);
        println!("{}", c.0);
        assert_same("software NPU", &c, &rust);
        if let Gemm::Ab(_) = run.gemm {
            // 2 layers x 7 projections + the head, per prefill, step and text batch.
            let line = c.0.lines().find(|l| l.starts_with("ab ")).unwrap();
            let gemms: u64 = line["ab gemms=".len()..]
                .split(' ')
                .next()
                .unwrap()
                .parse()
                .unwrap();
            assert_eq!(gemms, 15 * (1 + 4 + 1), "{line}");
            assert!(line.contains("differing_values=0"), "{line}");
        }
    }
}
