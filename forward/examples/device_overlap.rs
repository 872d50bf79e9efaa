//! What launching a group's GEMMs together buys on a device runtime: the same prompt and decode
//! steps with overlapped launches (q/k/v and gate/up in flight together) and with serial ones.
//!
//! `cargo run --release -p forward --example device_overlap -- PACK RUNTIME DESIGNS [ROWS] [STEPS]`

use forward::{BackendChoice, DeviceConfig, Forward, ForwardOptions, Logits};
use std::sync::Arc;
use std::time::Instant;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() < 4 {
        eprintln!("usage: device_overlap PACK RUNTIME DESIGNS [ROWS] [STEPS]");
        std::process::exit(2);
    }
    let pack = Arc::new(packs::Pack::open(&args[1]).unwrap_or_else(|e| {
        eprintln!("error: {e}");
        std::process::exit(2)
    }));
    let rows: usize = args.get(4).map_or(128, |s| s.parse().expect("ROWS"));
    let steps: usize = args.get(5).map_or(16, |s| s.parse().expect("STEPS"));
    let vocab = pack.semantics().vocab_size as u32;
    let tokens: Vec<u32> = (0..rows as u32)
        .map(|i| (i * 7919 + 3) % (vocab - 16))
        .collect();
    let mut results = Vec::new();
    for serial in [false, true, false, true] {
        let config = DeviceConfig {
            runtime: Some(args[2].clone().into()),
            designs: args[3].clone().into(),
            program: "device_overlap".into(),
            serial,
            ..DeviceConfig::default()
        };
        let options = ForwardOptions {
            capacity: rows + steps,
            ..ForwardOptions::default()
        };
        let mut f =
            Forward::new(&pack, BackendChoice::Device(config), options).unwrap_or_else(|e| {
                eprintln!("error: {e}");
                std::process::exit(2)
            });
        let t = Instant::now();
        f.step_batch(&tokens, 0, 0, Logits::LastRow).unwrap();
        let prefill = t.elapsed().as_secs_f64();
        let t = Instant::now();
        for i in 0..steps {
            f.step(5, (rows + i) as i64, rows + i).unwrap();
        }
        let decode = t.elapsed().as_secs_f64();
        results.push((serial, prefill, decode));
    }
    // The second run of each mode (the first warms caches and the page cache).
    let get = |serial| {
        results
            .iter()
            .rev()
            .find(|r| r.0 == serial)
            .copied()
            .unwrap()
    };
    let (_, po, d_o) = get(false);
    let (_, ps, ds) = get(true);
    println!(
        "prefill {rows} rows: overlapped {:.1} ms, serial {:.1} ms, serial/overlapped {:.2}",
        po * 1e3,
        ps * 1e3,
        ps / po
    );
    println!("decode {steps} steps: overlapped {:.1} ms/token, serial {:.1} ms/token, serial/overlapped {:.2}", d_o * 1e3 / steps as f64, ds * 1e3 / steps as f64, ds / d_o);
}
