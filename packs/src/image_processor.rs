//! The image processor's settings of a checkpoint: where they are and what they say.
//!
//! transformers 5's `processor.save_pretrained` writes `processor_config.json` with the image
//! processor nested under `image_processor` (and no `preprocessor_config.json`); hub checkpoints
//! and transformers 4 have `preprocessor_config.json`, the image processor at its top level.
//! `find` looks where transformers 5's `AutoProcessor.from_pretrained` (and
//! `AutoImageProcessor.from_pretrained`) looks, in its order; `parse` reads the object with
//! transformers 5's `Qwen2VLImageProcessor` defaults and its rule for the resize limits.

use std::path::{Path, PathBuf};

use serde_json::{Map, Value};

use crate::hf::{read_json, HfError};
use crate::semantics::{self, ImagePreprocess};

/// The image processor at the top level (the hub's, transformers 4's).
pub const PREPROCESSOR: &str = "preprocessor_config.json";
/// The whole processor (transformers 5's `processor.save_pretrained`): the image processor is
/// its `image_processor` object.
pub const PROCESSOR: &str = "processor_config.json";
/// The key of `processor_config.json` holding the image processor.
pub const NESTED_KEY: &str = "image_processor";

/// transformers' `Qwen2VLImageProcessor.size` when the config has none: 56·56 and 28·28·1280.
pub const DEFAULT_MIN_PIXELS: u64 = 56 * 56;
pub const DEFAULT_MAX_PIXELS: u64 = 28 * 28 * 1280;

/// One image-processor object, as found in a checkpoint directory.
#[derive(Clone, Debug)]
pub struct Found {
    /// The file it was read from.
    pub path: PathBuf,
    /// `Some("image_processor")` when it is nested in `processor_config.json`.
    pub key: Option<&'static str>,
    /// The image processor's settings (an object).
    pub config: Value,
}

impl Found {
    /// Where the settings are, for messages: `DIR/processor_config.json (image_processor)`.
    pub fn describe(&self) -> String {
        match self.key {
            Some(k) => format!("{} ({k})", self.path.display()),
            None => self.path.display().to_string(),
        }
    }

    /// The settings, parsed (errors name the file and the key, nested keys as
    /// `image_processor.size.shortest_edge`).
    pub fn parse(&self) -> Result<ImagePreprocess, HfError> {
        let prefix = self.key.map(|k| format!("{k}.")).unwrap_or_default();
        parse(&self.path, &prefix, &self.config)
    }
}

/// The checkpoint's image-processor settings where transformers 5 takes them from: the
/// `image_processor` object of `processor_config.json` when that file has one, else
/// `preprocessor_config.json`. `None` when neither is there.
///
/// transformers 5 reads `processor_config.json` first and takes its `image_processor` whenever it
/// is present (`ImageProcessingMixin.get_image_processor_dict`, and `AutoProcessor` hands that
/// object to the image processor directly), so when both files hold one, `processor_config.json`
/// wins; a `processor_config.json` without it (older processors wrote one holding only
/// `processor_class`) defers to `preprocessor_config.json`, and with no
/// `preprocessor_config.json` either transformers cannot build the image processor: refused,
/// with the ways out.
pub fn find(dir: &Path) -> Result<Option<Found>, HfError> {
    let processor = dir.join(PROCESSOR);
    let preprocessor = dir.join(PREPROCESSOR);
    if processor.exists() {
        let config = read_json(&processor)?;
        let Value::Object(mut top) = config else {
            return Err(HfError::Key {
                path: processor,
                key: "(top level)".into(),
                what: "expected a JSON object".into(),
            });
        };
        match top.remove(NESTED_KEY) {
            Some(v @ Value::Object(_)) => {
                return Ok(Some(Found {
                    path: processor,
                    key: Some(NESTED_KEY),
                    config: v,
                }))
            }
            // transformers takes null as absent.
            None | Some(Value::Null) => {
                if !preprocessor.exists() {
                    return Err(HfError::Key {
                        path: processor,
                        key: NESTED_KEY.into(),
                        what: format!(
                            "missing, and there is no {PREPROCESSOR} beside it, so transformers \
                             cannot build the image processor: save the processor with \
                             transformers 5's `processor.save_pretrained(DIR)` (it writes the \
                             image processor here), or copy the base model's {PREPROCESSOR} into \
                             the checkpoint; --no-vision builds a text-only pack"
                        ),
                    });
                }
            }
            Some(v) => {
                return Err(HfError::Key {
                    path: processor,
                    key: NESTED_KEY.into(),
                    what: format!(
                        "expected an object (the image processor's settings, as transformers 5's \
                         `processor.save_pretrained` writes them), got {}",
                        short(&v)
                    ),
                })
            }
        }
    }
    if preprocessor.exists() {
        let config = read_json(&preprocessor)?;
        return Ok(Some(Found {
            path: preprocessor,
            key: None,
            config,
        }));
    }
    Ok(None)
}

/// When `processor_config.json`'s image processor was taken and a `preprocessor_config.json`
/// beside it says otherwise (or cannot be read), a note that the latter is ignored, as
/// transformers 5 ignores it.
pub(crate) fn ignored_beside(
    dir: &Path,
    taken: &Found,
    preprocess: &ImagePreprocess,
) -> Option<String> {
    let path = dir.join(PREPROCESSOR);
    if taken.key.is_none() || !path.exists() {
        return None;
    }
    let other = read_json(&path).and_then(|v| parse(&path, "", &v));
    let why = match other {
        Ok(p) if &p == preprocess => return None,
        Ok(p) => format!(
            "it differs (min/max pixels {}/{} there, {}/{} taken; mean {:?} / {:?}, std {:?} / {:?})",
            p.min_pixels,
            p.max_pixels,
            preprocess.min_pixels,
            preprocess.max_pixels,
            p.image_mean,
            preprocess.image_mean,
            p.image_std,
            preprocess.image_std
        ),
        Err(e) => format!("it cannot be read ({e})"),
    };
    Some(format!(
        "{}: ignored, as transformers 5 ignores it: the image processor of {} is taken first; {why}",
        path.display(),
        taken.describe()
    ))
}

/// A JSON value for a message, cut to a readable length.
fn short(v: &Value) -> String {
    let s = v.to_string();
    match s.char_indices().nth(80) {
        Some((i, _)) => format!("{}...", &s[..i]),
        None => s,
    }
}

/// What preprocessing needs from an image-processor object whose keys are named `{prefix}{key}`
/// in messages, with transformers 5's `Qwen2VLImageProcessor` defaults for the keys it leaves out.
pub fn parse(path: &Path, prefix: &str, config: &Value) -> Result<ImagePreprocess, HfError> {
    let key_err = |key: &str, what: String| HfError::Key {
        path: path.to_path_buf(),
        key: format!("{prefix}{key}"),
        what,
    };
    if !config.is_object() {
        let key = if prefix.is_empty() {
            "(top level)".to_string()
        } else {
            prefix.trim_end_matches('.').to_string()
        };
        return Err(HfError::Key {
            path: path.to_path_buf(),
            key,
            what: "expected a JSON object".into(),
        });
    }
    let uint = |obj: &Value, key: &str, full: &str, default: u64| -> Result<u64, HfError> {
        match obj.get(key) {
            None | Some(Value::Null) => Ok(default),
            Some(v) => v
                .as_u64()
                .ok_or_else(|| key_err(full, format!("expected a non-negative integer, got {v}"))),
        }
    };
    let flag = |key: &str| -> Result<bool, HfError> {
        match config.get(key) {
            None | Some(Value::Null) => Ok(true),
            Some(v) => v
                .as_bool()
                .ok_or_else(|| key_err(key, format!("expected a boolean, got {v}"))),
        }
    };
    let triple = |key: &str, default: [f64; 3]| -> Result<[f64; 3], HfError> {
        match config.get(key) {
            None | Some(Value::Null) => Ok(default),
            Some(Value::Number(n)) => {
                let x = n.as_f64().unwrap_or(f64::NAN);
                Ok([x; 3])
            }
            Some(v) => v
                .as_array()
                .filter(|a| a.len() == 3)
                .and_then(|a| {
                    let xs: Option<Vec<f64>> = a.iter().map(Value::as_f64).collect();
                    xs.map(|xs| [xs[0], xs[1], xs[2]])
                })
                .ok_or_else(|| key_err(key, format!("expected three numbers, got {v}"))),
        }
    };
    let (min_pixels, max_pixels) = resize_limits(config, &key_err)?;
    const CLIP_MEAN: [f64; 3] = [0.48145466, 0.4578275, 0.40821073];
    const CLIP_STD: [f64; 3] = [0.26862954, 0.26130258, 0.27577711];
    let rescale_factor = match config.get("rescale_factor") {
        None | Some(Value::Null) => 1.0 / 255.0,
        Some(v) => v
            .as_f64()
            .ok_or_else(|| key_err("rescale_factor", format!("expected a number, got {v}")))?,
    };
    let usize_key = |key: &str, default: u64| -> Result<usize, HfError> {
        Ok(uint(config, key, key, default)? as usize)
    };
    Ok(ImagePreprocess {
        patch_size: usize_key("patch_size", 14)?,
        merge_size: usize_key("merge_size", 2)?,
        temporal_patch_size: usize_key("temporal_patch_size", 2)?,
        min_pixels,
        max_pixels,
        image_mean: triple("image_mean", CLIP_MEAN)?,
        image_std: triple("image_std", CLIP_STD)?,
        rescale_factor,
        do_resize: flag("do_resize")?,
        do_rescale: flag("do_rescale")?,
        do_normalize: flag("do_normalize")?,
        do_convert_rgb: flag("do_convert_rgb")?,
        resample: {
            let r = uint(
                config,
                "resample",
                "resample",
                semantics::RESAMPLE_BICUBIC as u64,
            )?;
            // Not `as u32`: 2^32 + 3 must not pass for bicubic (3).
            u32::try_from(r)
                .map_err(|_| key_err("resample", format!("{r} is not a PIL filter code")))?
        },
    })
}

/// `(min_pixels, max_pixels)` by transformers 5's rule (`Qwen2VLImageProcessor.__init__`, the PIL
/// and torchvision backends alike): `size` as given, or `{shortest_edge: 3136, longest_edge:
/// 1003520}` when absent; a top-level `min_pixels` / `max_pixels` (not null) then replaces
/// `size.shortest_edge` / `size.longest_edge` and drops a `size.min_pixels` / `size.max_pixels`.
/// What is left must be exactly `shortest_edge` (min pixels) and `longest_edge` (max pixels):
/// transformers' resize raises on anything else, so such a config is refused here, by key.
fn resize_limits(
    config: &Value,
    key_err: &dyn Fn(&str, String) -> HfError,
) -> Result<(u64, u64), HfError> {
    let top = |key: &str| -> Result<Option<u64>, HfError> {
        match config.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => v
                .as_u64()
                .map(Some)
                .ok_or_else(|| key_err(key, format!("expected a non-negative integer, got {v}"))),
        }
    };
    let (top_min, top_max) = (top("min_pixels")?, top("max_pixels")?);
    let mut size: Map<String, Value> = match config.get("size") {
        None | Some(Value::Null) => Map::from_iter([
            ("shortest_edge".to_string(), DEFAULT_MIN_PIXELS.into()),
            ("longest_edge".to_string(), DEFAULT_MAX_PIXELS.into()),
        ]),
        Some(Value::Object(m)) => m.clone(),
        Some(v) => {
            return Err(key_err(
                "size",
                format!(
                    "expected an object {{\"shortest_edge\": min pixels, \"longest_edge\": max \
                     pixels}}, got {}",
                    short(v)
                ),
            ))
        }
    };
    if let Some(v) = top_min {
        size.insert("shortest_edge".into(), v.into());
        size.remove("min_pixels");
    }
    if let Some(v) = top_max {
        size.insert("longest_edge".into(), v.into());
        size.remove("max_pixels");
    }
    // The first wrong key by name, whatever order the map keeps (serde_json's preserve_order).
    let mut keys: Vec<&String> = size.keys().collect();
    keys.sort();
    for key in keys {
        let what = match key.as_str() {
            "shortest_edge" | "longest_edge" => continue,
            "min_pixels" | "max_pixels" => {
                let edge = if key == "min_pixels" {
                    "shortest_edge (min pixels)"
                } else {
                    "longest_edge (max pixels)"
                };
                format!(
                    "transformers 5's image processor does not resize by this spelling (it raises \
                     on it unless top-level min_pixels and max_pixels replace it); write it as \
                     size.{edge}"
                )
            }
            _ => "not a resize limit: transformers' Qwen2-VL image processor resizes by \
                  size.shortest_edge (min pixels) and size.longest_edge (max pixels) only, and \
                  raises on other size keys"
                .to_string(),
        };
        return Err(key_err(&format!("size.{key}"), what));
    }
    let edge = |key: &str| -> Result<u64, HfError> {
        let full = format!("size.{key}");
        match size.get(key) {
            None | Some(Value::Null) => Err(key_err(
                &full,
                "missing: transformers 5 needs both size.shortest_edge (min pixels) and \
                 size.longest_edge (max pixels) once size is given (it does not fill one in \
                 from its defaults); state both"
                    .into(),
            )),
            Some(v) => v
                .as_u64()
                .ok_or_else(|| key_err(&full, format!("expected a non-negative integer, got {v}"))),
        }
    };
    Ok((edge("shortest_edge")?, edge("longest_edge")?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn limits(config: Value) -> Result<(u64, u64), String> {
        parse(Path::new("pre.json"), "", &config)
            .map(|p| (p.min_pixels, p.max_pixels))
            .map_err(|e| e.to_string())
    }

    #[test]
    fn both_size_spellings_give_the_limits_transformers_5_gives() {
        // Values checked against transformers 5.25's Qwen2VLImageProcessor(Pil).from_dict(...).size.
        assert_eq!(
            limits(json!({"size": {"shortest_edge": 1024, "longest_edge": 8192}})),
            Ok((1024, 8192))
        );
        assert_eq!(
            limits(json!({"min_pixels": 1024, "max_pixels": 8192})),
            Ok((1024, 8192))
        );
        // Top-level keys replace size's, one by one.
        assert_eq!(
            limits(
                json!({"size": {"shortest_edge": 1024, "longest_edge": 4194304},
                          "min_pixels": 2048, "max_pixels": 4096})
            ),
            Ok((2048, 4096))
        );
        assert_eq!(limits(json!({"min_pixels": 1024})), Ok((1024, 1_003_520)));
        // transformers 4.4x saved size {min_pixels, max_pixels} beside the same top-level keys:
        // the top-level ones replace it.
        assert_eq!(
            limits(json!({"size": {"min_pixels": 1, "max_pixels": 2},
                          "min_pixels": 3136, "max_pixels": 12845056})),
            Ok((3136, 12_845_056))
        );
        // No size, or null: the class default; a null top-level key is no override.
        assert_eq!(limits(json!({})), Ok((3136, 1_003_520)));
        assert_eq!(limits(json!({"size": null})), Ok((3136, 1_003_520)));
        assert_eq!(
            limits(
                json!({"size": {"shortest_edge": 1024, "longest_edge": 8192},
                          "min_pixels": null})
            ),
            Ok((1024, 8192))
        );
    }

    #[test]
    fn sizes_transformers_5_cannot_resize_by_are_refused_by_key() {
        for (config, needles) in [
            (
                json!({"size": {"min_pixels": 1024, "max_pixels": 8192}}),
                &["size.max_pixels", "write it as size.longest_edge"][..],
            ),
            (
                json!({"size": {"min_pixels": 1024, "max_pixels": 8192}, "max_pixels": 4096}),
                &["size.min_pixels", "size.shortest_edge (min pixels)"][..],
            ),
            (
                json!({"size": {"shortest_edge": 1024}}),
                &["size.longest_edge", "missing", "state both"][..],
            ),
            (
                json!({"size": {"longest_edge": 1024}}),
                &["size.shortest_edge", "missing"][..],
            ),
            (
                json!({"size": {"shortest_edge": null, "longest_edge": 1024}}),
                &["size.shortest_edge", "missing"][..],
            ),
            (
                json!({"size": {"height": 224, "width": 224}}),
                &["size.height", "not a resize limit"][..],
            ),
            (
                json!({"size": 1024}),
                &["size", "expected an object", "got 1024"][..],
            ),
            (
                json!({"size": {"shortest_edge": "1024", "longest_edge": 8192}}),
                &["size.shortest_edge", "non-negative integer", "\"1024\""][..],
            ),
            (
                json!({"size": {"shortest_edge": 1024, "longest_edge": 8192}, "max_pixels": -1}),
                &["max_pixels", "non-negative integer", "-1"][..],
            ),
        ] {
            let err = limits(config.clone()).expect_err(&config.to_string());
            assert!(err.starts_with("pre.json: "), "{err}");
            for n in needles {
                assert!(err.contains(n), "{config}: {err:?} lacks {n:?}");
            }
        }
    }

    #[test]
    fn nested_keys_are_named_with_their_parent() {
        let found = Found {
            path: PathBuf::from("ck/processor_config.json"),
            key: Some(NESTED_KEY),
            config: json!({"size": {"shortest_edge": 1024, "longest_edge": true}}),
        };
        let err = found.parse().unwrap_err().to_string();
        assert!(
            err.starts_with("ck/processor_config.json: image_processor.size.longest_edge: "),
            "{err}"
        );
        let found = Found {
            config: json!({"image_std": "0.5"}),
            ..found
        };
        let err = found.parse().unwrap_err().to_string();
        assert!(
            err.contains("image_processor.image_std: expected three numbers"),
            "{err}"
        );
        assert_eq!(
            found.describe(),
            "ck/processor_config.json (image_processor)"
        );
    }

    fn write(dir: &Path, file: &str, v: Value) {
        std::fs::write(dir.join(file), serde_json::to_vec(&v).unwrap()).unwrap();
    }

    #[test]
    fn processor_config_wins_as_in_transformers_5_and_its_mistakes_are_named() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        assert!(find(dir).unwrap().is_none());
        let pre = json!({"size": {"shortest_edge": 1, "longest_edge": 2}});
        write(dir, PREPROCESSOR, pre.clone());
        let f = find(dir).unwrap().unwrap();
        assert_eq!((f.key, f.config.clone()), (None, pre.clone()));
        assert!(f.path.ends_with(PREPROCESSOR));

        // Both: processor_config.json's image_processor is the one.
        let nested = json!({"size": {"shortest_edge": 3, "longest_edge": 4}});
        write(
            dir,
            PROCESSOR,
            json!({"image_processor": nested, "processor_class": "Qwen3VLProcessor"}),
        );
        let f = find(dir).unwrap().unwrap();
        assert_eq!((f.key, f.config.clone()), (Some(NESTED_KEY), nested));
        assert!(f.path.ends_with(PROCESSOR));

        // A processor_config.json without one (or null) defers to preprocessor_config.json ...
        for top in [
            json!({"processor_class": "Qwen3VLProcessor"}),
            json!({"image_processor": null}),
        ] {
            write(dir, PROCESSOR, top);
            let f = find(dir).unwrap().unwrap();
            assert_eq!((f.key, f.config.clone()), (None, pre.clone()));
        }
        // ... and without that file too is refused, naming both and the ways out.
        std::fs::remove_file(dir.join(PREPROCESSOR)).unwrap();
        let err = find(dir).unwrap_err().to_string();
        for n in [
            "processor_config.json: image_processor: missing",
            "no preprocessor_config.json beside it",
            "processor.save_pretrained",
            "--no-vision",
        ] {
            assert!(err.contains(n), "{err:?} lacks {n:?}");
        }
        write(
            dir,
            PROCESSOR,
            json!({"image_processor": "Qwen2VLImageProcessor"}),
        );
        let err = find(dir).unwrap_err().to_string();
        assert!(
            err.contains("image_processor: expected an object")
                && err.contains("\"Qwen2VLImageProcessor\""),
            "{err}"
        );
        write(dir, PROCESSOR, json!([1, 2]));
        let err = find(dir).unwrap_err().to_string();
        assert!(err.contains("(top level): expected a JSON object"), "{err}");
        std::fs::write(dir.join(PROCESSOR), b"{not json").unwrap();
        let err = find(dir).unwrap_err().to_string();
        assert!(
            err.contains("processor_config.json: not valid JSON"),
            "{err}"
        );
    }
}
