//! Random packs in every kind: written, reopened, values checked against the generator, and
//! listed by the `safetensors` crate.

use half::bf16;
use packs::layout;
use packs::names::{self, Norm, Proj, EMBED, LM_HEAD};
use packs::quant::{self, QuantKind};
use packs::random::{fill_random, RandomShape};
use packs::{Embedding, LinearData, Pack};

fn values_of(seed: u64, sem: &packs::Semantics, name: &str) -> Vec<f32> {
    let w = layout::weights(sem)
        .into_iter()
        .find(|w| w.name == name)
        .unwrap();
    let mut v = vec![0f32; w.rows * w.cols];
    fill_random(seed, &w, 0, &mut v);
    v
}

#[test]
fn every_kind_round_trips_through_a_file() {
    let dir = tempfile::tempdir().unwrap();
    let shape = RandomShape::tiny();
    for quant in QuantKind::ALL {
        let path = dir.path().join(format!("tiny-{quant}.pack"));
        let report = packs::write_random(&shape, quant, 7, &path).unwrap();
        let pack = Pack::open(&path).unwrap();
        let sem = pack.semantics();
        assert_eq!(sem, &shape.semantics_for(quant, 7));
        assert_eq!(report.file_len, pack.file_len());
        assert!(pack
            .tensors()
            .iter()
            .all(|t| t.offset % 64 == 0 && !names::is_padding(&t.name)));

        let embed = values_of(7, sem, EMBED);
        match (quant, pack.embedding()) {
            (QuantKind::F32, Embedding::F32(e)) => assert!(e == &embed[..]),
            (_, Embedding::Bf16(e)) if quant != QuantKind::F32 => {
                assert!(e.iter().zip(&embed).all(|(a, b)| *a == bf16::from_f32(*b)))
            }
            (q, _) => panic!("{q}: wrong embedding type"),
        }
        let norm = pack.norm(&names::norm(1, Norm::KNorm)).unwrap();
        assert_eq!(norm, &values_of(7, sem, &names::norm(1, Norm::KNorm))[..]);

        let name = names::proj(1, Proj::Down);
        let w = values_of(7, sem, &name);
        let lin = pack.linear(&name).unwrap();
        assert_eq!((lin.n, lin.k), (sem.hidden_size, sem.intermediate_size));
        check_linear(&lin.data, &w, lin.n, lin.k);

        // A tied head: the embedding itself in f32/bf16, quantized from the f32 values otherwise.
        let head = pack.head();
        assert_eq!((head.n, head.k), (sem.vocab_size, sem.hidden_size));
        assert_eq!(head.name, if quant.is_integer() { LM_HEAD } else { EMBED });
        check_linear(&head.data, &embed, head.n, head.k);

        // Any safetensors reader lists the pack (padding entries included).
        let bytes = std::fs::read(&path).unwrap();
        let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
        assert_eq!(
            st.names().iter().filter(|n| !names::is_padding(n)).count(),
            pack.tensors().len()
        );
        let (_, meta) = safetensors::SafeTensors::read_metadata(&bytes).unwrap();
        assert_eq!(meta.metadata().as_ref().unwrap()["format"], packs::FORMAT);
    }
}

fn check_linear(data: &LinearData, w: &[f32], n: usize, k: usize) {
    match data {
        LinearData::F32(d) => assert!(*d == w, "f32 values differ"),
        LinearData::Bf16(d) => assert!(d.iter().zip(w).all(|(a, b)| *a == bf16::from_f32(*b))),
        LinearData::I8 { codes, scales } => {
            let (c, s) = quant::quantize_i8_rows(w, n, k);
            assert!(
                *codes == &c[..] && *scales == &s[..],
                "quantized bytes differ from the oracle"
            );
        }
        LinearData::Q4 { codes, scales } => {
            let (c, s) = quant::quantize_q4(w, n, k).unwrap();
            let c = quant::q4_to_panels(&c, n, k);
            assert!(
                *codes == &c[..] && *scales == &s[..],
                "quantized bytes differ from the oracle"
            );
        }
    }
}

#[test]
fn random_packs_are_reproducible_and_seeded() {
    let dir = tempfile::tempdir().unwrap();
    let shape = RandomShape::tiny();
    let write = |name: &str, seed| {
        let p = dir.path().join(name);
        packs::write_random(&shape, QuantKind::Q4, seed, &p).unwrap();
        std::fs::read(p).unwrap()
    };
    let (a, b, c) = (write("a.pack", 1), write("b.pack", 1), write("c.pack", 2));
    assert_eq!(a, b);
    // Control: another seed gives other bytes (same length).
    assert_eq!(a.len(), c.len());
    assert_ne!(a, c);
}
