fn main() {
    for p in std::env::args().skip(1) {
        let bytes = std::fs::read(&p).unwrap();
        let native = vision::preprocess::jpeg::decode(&bytes, 1 << 26);
        match &native {
            Ok(_) => println!("{p} native"),
            Err(e) => println!("{p} fallback {e:?}"),
        }
        match vision::preprocess::decode_rgb(&bytes, &p, true, &Default::default()) {
            Ok(im) => std::fs::write(format!("{p}.rgb"), &im.data).unwrap(),
            Err(e) => println!("{p} refused {e}"),
        }
    }
}
