//! `xdna-vl`: the product binary (run, chat, serve) over the engine.

fn main() {
    eprintln!("xdna-vl: not built yet (see issues 15 and 16)");
    std::process::exit(2);
}
