//! Fixture helpers for the end-to-end tests: the committed transformers cases, packs built from
//! them in temporary directories, and a forward over each.

use compute::Runtime;
use decoder::{Ablation, Decoder, DecoderOptions};
use packs::{Pack, QuantKind};
use std::path::PathBuf;
use std::sync::Arc;
use testkit::PromptInputs;
use testkit::Reference;

/// tests/fixtures.
pub fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fixtures")
}

/// Every committed case (a directory with a checkpoint and inputs).
pub fn cases() -> Vec<String> {
    let mut out: Vec<String> = std::fs::read_dir(fixtures())
        .expect("tests/fixtures")
        .filter_map(|e| e.ok())
        .filter(|e| e.path().join("checkpoint/config.json").exists())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    out.sort();
    assert!(
        !out.is_empty(),
        "no fixture cases under {}",
        fixtures().display()
    );
    out
}

pub struct Case {
    pub name: String,
    pub dir: PathBuf,
}

impl Case {
    pub fn new(name: &str) -> Case {
        Case {
            name: name.to_string(),
            dir: fixtures().join(name),
        }
    }

    pub fn checkpoint(&self) -> PathBuf {
        self.dir.join("checkpoint")
    }

    pub fn inputs(&self) -> PromptInputs {
        PromptInputs::open(self.dir.join("inputs.safetensors")).expect("inputs")
    }

    /// The transformers reference for a pack kind (f32 and bf16 share the exact one).
    pub fn reference(&self, kind: QuantKind) -> Reference {
        Reference::open(self.dir.join(testkit::reference::file_name(kind))).expect("reference")
    }

    /// Whether the checkpoint itself is stored in bf16.
    pub fn is_bf16_checkpoint(&self) -> bool {
        let cfg = std::fs::read_to_string(self.checkpoint().join("config.json")).unwrap();
        let v: serde_json::Value = serde_json::from_str(&cfg).unwrap();
        let dtype = v
            .get("torch_dtype")
            .or_else(|| v.get("dtype"))
            .or_else(|| v.pointer("/text_config/dtype"))
            .or_else(|| v.pointer("/text_config/torch_dtype"));
        dtype.and_then(|d| d.as_str()) == Some("bfloat16")
    }

    /// Builds the pack of this case in `kind` inside a temporary directory.
    pub fn pack(&self, kind: QuantKind) -> (tempfile::TempDir, Arc<Pack>) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(format!("{}-{kind}.pack", self.name));
        let opts = packs::build::BuildOptions {
            mrope_section: None,
            ..packs::build::BuildOptions::new(kind)
        };
        packs::build::build_from_hf(&self.checkpoint(), &path, &opts)
            .unwrap_or_else(|e| panic!("{}: build {kind}: {e}", self.name));
        let pack = Arc::new(Pack::open(&path).unwrap());
        (dir, pack)
    }
}

/// A host forward over `pack` with room for the prompt, the decode steps and the text control.
pub fn forward(pack: &Arc<Pack>, options: DecoderOptions) -> Decoder {
    let runtime = Runtime::host(2).expect("runtime");
    Decoder::new(pack, &runtime, options).expect("forward")
}

pub fn options() -> DecoderOptions {
    DecoderOptions {
        capacity: 256,
        ..DecoderOptions::default()
    }
}

/// Replays `case`'s f32 pack with a deliberate mistake (`ablation`; none with the default) and
/// returns the worst |Δlogit| against transformers.
pub fn ablated(case: &Case, ablation: Ablation) -> f32 {
    let (_dir, pack) = case.pack(QuantKind::F32);
    let mut fwd = forward(
        &pack,
        DecoderOptions {
            ablation,
            ..options()
        },
    );
    let r = testkit::replay(
        &mut fwd,
        &case.inputs(),
        &case.reference(QuantKind::F32),
        |_, _, _, _| {},
    )
    .unwrap();
    r.max_abs_logit_diff()
}
