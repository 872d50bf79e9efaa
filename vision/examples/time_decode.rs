fn main() {
    for p in std::env::args().skip(1) {
        let bytes = std::fs::read(&p).unwrap();
        let t = std::time::Instant::now();
        let n = vision::preprocess::jpeg::decode(&bytes, 1 << 28).unwrap();
        let ours = t.elapsed();
        let t = std::time::Instant::now();
        let z = image::load_from_memory(&bytes).unwrap();
        let zune = t.elapsed();
        println!(
            "{p}: ours {:.1} ms, image crate {:.1} ms ({}x{}, {})",
            ours.as_secs_f64() * 1e3,
            zune.as_secs_f64() * 1e3,
            n.width,
            n.height,
            z.width()
        );
    }
}
