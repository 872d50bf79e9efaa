//! Bad input refused by name, nothing computed: a pack without a tower, pixel rows of the wrong
//! width, a grid that does not match the rows or the merge size, a non-finite pixel, no images.
//! And the backend ids: every GEMM names an id the tower registered, after the runtime's earlier
//! registrations (a decoder's).

use crate::common;

use std::sync::Arc;

use common::{build_pack, Case, Reference};
use std::sync::Mutex;

use compute::{BackendError, GemmBackend, HostGemm, PackLinear, WeightRef};
use packs::{BuildOptions, Pack, QuantKind};
use vision::tower::{Tower, VisionError};

fn refusal(pack: &Arc<Pack>, images: &[&vision::preprocess::PixelPatches]) -> String {
    let runtime = common::runtime(|pool| Box::new(HostGemm::new(pool)));
    let mut tower = Tower::new(pack, &runtime).unwrap();
    match tower.encode(images) {
        Err(e) => e.to_string(),
        Ok(_) => panic!("encode accepted bad input"),
    }
}

#[test]
fn a_pack_without_a_tower_is_refused_by_path() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("text-only.pack");
    let opts = BuildOptions {
        vision: false,
        ..BuildOptions::new(QuantKind::F32)
    };
    packs::build_from_hf(&Case::Chat.checkpoint(), &out, &opts).unwrap();
    let pack = Arc::new(Pack::open(&out).unwrap());
    let runtime = common::runtime(|pool| Box::new(HostGemm::new(pool)));
    let e = Tower::new(&pack, &runtime)
        .err()
        .expect("a pack without a tower was accepted");
    assert!(matches!(e, VisionError::NoTower { .. }), "{e}");
    assert!(e.to_string().contains("text-only.pack"), "{e}");
}

#[test]
fn bad_pixel_rows_are_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let pack = build_pack(Case::Chat, QuantKind::F32, dir.path());
    let r = Reference::open(Case::Chat, QuantKind::F32);
    let good = &r.images[0];

    let mut narrow = good.clone();
    narrow.row_len = 768;
    let e = refusal(&pack, &[good, &narrow]);
    assert!(
        e.contains("image 1") && e.contains("768") && e.contains("1536"),
        "{e}"
    );

    let mut wrong_grid = good.clone();
    wrong_grid.grid = [1, 4, 6];
    let e = refusal(&pack, &[&wrong_grid]);
    assert!(e.contains("image 0") && e.contains("24 rows"), "{e}");

    let mut odd = good.clone();
    odd.grid = [1, 16, 1];
    let e = refusal(&pack, &[&odd]);
    assert!(e.contains("merge size 2"), "{e}");

    let mut nan = good.clone();
    nan.values[3 * 1536 + 7] = f32::NAN;
    let e = refusal(&pack, &[&nan]);
    assert!(e.contains("[3, 7]") && e.contains("NaN"), "{e}");

    let e = refusal(&pack, &[]);
    assert!(e.contains("no images"), "{e}");
}

/// What the recorder saw: every id prepared and used.
#[derive(Default)]
struct Record {
    prepared: Vec<(usize, String)>,
    used: Vec<(usize, String)>,
}

/// Records every id the tower prepares and uses, and runs the host GEMMs.
struct Recorder {
    host: HostGemm,
    record: Arc<Mutex<Record>>,
}

impl GemmBackend for Recorder {
    fn name(&self) -> &'static str {
        "recorder"
    }
    fn prepare(&mut self, weights: &[WeightRef<'_>]) -> Result<(), BackendError> {
        self.record
            .lock()
            .unwrap()
            .prepared
            .extend(weights.iter().map(|w| (w.id, w.linear.name.to_string())));
        self.host.prepare(weights)
    }
    fn gemm(
        &mut self,
        w: &WeightRef<'_>,
        x: &[f32],
        rows: usize,
        y: &mut [f32],
    ) -> Result<(), BackendError> {
        let name = w.linear.name.to_string();
        self.record.lock().unwrap().used.push((w.id, name));
        self.host.gemm(w, x, rows, y)
    }
}

#[test]
fn every_gemm_uses_an_id_prepared_from_first_id_on() {
    let dir = tempfile::tempdir().unwrap();
    let pack = build_pack(Case::Wide, QuantKind::F32, dir.path());
    let r = Reference::open(Case::Wide, QuantKind::F32);
    let record = Arc::new(Mutex::new(Record::default()));
    let runtime = common::runtime(|pool| {
        Box::new(Recorder {
            host: HostGemm::new(pool),
            record: record.clone(),
        })
    });
    // 77 weights registered first (as a decoder's would be): the tower's ids start after them.
    runtime.register(&pack, &[PackLinear::Head; 77]).unwrap();
    record.lock().unwrap().prepared.clear();
    let mut tower = Tower::new(&pack, &runtime).unwrap();
    let n = tower.linear_count();
    let rec = record.lock().unwrap();
    // 1 patch embedding + 4 per block + 2 per merger (final + 2 DeepStack).
    assert_eq!(n, 1 + 4 * 4 + 2 * 3);
    let ids: Vec<usize> = rec.prepared.iter().map(|p| p.0).collect();
    assert_eq!(ids, (77..77 + n).collect::<Vec<_>>());
    drop(rec);
    tower.encode(&r.image_refs()).unwrap();
    let rec = record.lock().unwrap();
    // 3 patch embeddings (one per image) + 4 per block + 2 per merger.
    assert_eq!(rec.used.len(), 3 + 4 * 4 + 2 * 3);
    for (id, name) in &rec.used {
        let prepared = &rec.prepared[id - 77];
        assert_eq!(&prepared.1, name, "id {id}");
    }
    let mut used: Vec<usize> = rec.used.iter().map(|u| u.0).collect();
    used.sort();
    used.dedup();
    assert_eq!(used.len(), n, "every prepared weight is used");
}
