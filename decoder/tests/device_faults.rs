//! Device faults on the software NPU (injected by environment, so this file holds one test and runs
//! in a process of its own): a failed, aborted or timed-out run refuses the step by name, nothing is
//! half-written into the KV cache, and the forward stays usable.

mod common;

use common::{emu_config, tiny_pack};
use compute::GemmChoice;
use decoder::{Decoder, DecoderOptions, Logits};
use packs::QuantKind;
use std::time::Duration;

#[test]
fn a_failed_aborted_or_hung_run_refuses_the_step_and_the_forward_recovers() {
    let dir = tempfile::tempdir().unwrap();
    let pack = tiny_pack(dir.path(), QuantKind::Q4);
    let mut config = emu_config(&pack, &dir.path().join("designs"));
    config.run_timeout = Some(Duration::from_millis(300));
    let options = DecoderOptions {
        capacity: 32,
        ..DecoderOptions::default()
    };
    let mut host = Decoder::new(&pack, &common::host(), options.clone()).unwrap();
    let prompt = [3u32, 9, 27, 81];
    host.step_batch(&prompt, 0, 0, Logits::LastRow).unwrap();
    let expected = host.step(5, 4, 4).unwrap().to_vec();

    // Runs 1..=15 are the prompt's 15 GEMMs (2 layers x 7 + head); run 16 is the first decode GEMM.
    for (var, state) in [
        ("NPU_EMU_FAIL_RUN", "ERROR"),
        ("NPU_EMU_ABORT_RUN", "ABORT"),
        ("NPU_EMU_TIMEOUT_RUN", "TIMEOUT"),
    ] {
        std::env::set_var(var, "16");
        let mut device = Decoder::new(
            &pack,
            &common::runtime(GemmChoice::Device, &config),
            options.clone(),
        )
        .unwrap();
        std::env::remove_var(var);
        device.step_batch(&prompt, 0, 0, Logits::LastRow).unwrap();
        let e = device.step(5, 4, 4).unwrap_err().to_string();
        println!("{var}: {e}");
        assert!(e.contains(state), "{var}: {e}");
        assert!(
            e.contains("q_proj") && e.contains("q4"),
            "{var}: names the weight and design: {e}"
        );
        assert_eq!(device.next_slot(), 4, "nothing half-written");
        let again = device.step(5, 4, 4).unwrap();
        assert_eq!(
            again,
            &expected[..],
            "{var}: the retried step equals the host's"
        );
    }
}
