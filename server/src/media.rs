//! An `image_url` to the image's bytes: `data:image/...;base64,` URLs (and Ollama's bare base64
//! `images`) always, within the size limit; files (a path or
//! `file://`) only under the directory the operator allows with `--media-dir`; http(s) only with
//! `--allow-remote-media`, with a size and a time limit. Decoding the bytes is the engine's job.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::Duration;

use base64::Engine as _;

use crate::error::ApiError;

#[derive(Clone, Debug)]
pub struct MediaPolicy {
    /// Local files may be read from under this directory (none: no local files).
    pub media_dir: Option<PathBuf>,
    /// http(s) URLs may be fetched.
    pub allow_remote: bool,
    /// The most bytes one image may have.
    pub max_bytes: usize,
    /// The longest a remote fetch may take.
    pub remote_timeout: Duration,
}

impl Default for MediaPolicy {
    fn default() -> Self {
        MediaPolicy {
            media_dir: None,
            allow_remote: false,
            max_bytes: 32 << 20,
            remote_timeout: Duration::from_secs(10),
        }
    }
}

/// The image at `url` (the request's `param`), with a name for messages.
pub fn fetch(url: &str, param: &str, policy: &MediaPolicy) -> Result<(String, Vec<u8>), ApiError> {
    let bad = |what: String| ApiError::bad_request(what, Some(param.to_string()));
    if let Some(rest) = url.strip_prefix("data:") {
        let (head, data) = rest
            .split_once(',')
            .ok_or_else(|| bad(format!("{param}: a data URL needs a comma before its data")))?;
        let Some(mime) = head.strip_suffix(";base64") else {
            return Err(bad(format!(
                "{param}: only base64 data URLs are taken (data:image/png;base64,...)"
            )));
        };
        if !mime.starts_with("image/") {
            return Err(bad(format!("{param}: {mime:?} is not an image type")));
        }
        let bytes = decode_base64(data, param, policy)?;
        return Ok((format!("{param} ({mime})"), bytes));
    }
    if url.starts_with("http://") || url.starts_with("https://") {
        if !policy.allow_remote {
            return Err(bad(format!(
                "{param}: remote images are not fetched by this server (start it with \
                 --allow-remote-media), send the image as a data URL instead"
            )));
        }
        let bytes =
            fetch_remote(url, policy).map_err(|what| bad(format!("{param}: {url}: {what}")))?;
        return Ok((url.to_string(), bytes));
    }
    let path = url.strip_prefix("file://").unwrap_or(url);
    let Some(root) = &policy.media_dir else {
        return Err(bad(format!(
            "{param}: local files are not read by this server (start it with --media-dir DIR), \
             send the image as a data URL instead"
        )));
    };
    let bytes = read_under(root, Path::new(path), policy.max_bytes)
        .map_err(|what| bad(format!("{param}: {path}: {what}")))?;
    Ok((path.to_string(), bytes))
}

/// An image sent as base64 (a data URL's data, or Ollama's `images`), within the size limit.
pub fn decode_base64(data: &str, param: &str, policy: &MediaPolicy) -> Result<Vec<u8>, ApiError> {
    let bad = |what: String| ApiError::bad_request(format!("{param}: {what}"), Some(param.into()));
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(data.trim())
        .map_err(|e| bad(format!("the base64 data does not decode: {e}")))?;
    if bytes.len() > policy.max_bytes {
        return Err(bad(format!(
            "{} bytes, more than the {} an image may have",
            bytes.len(),
            policy.max_bytes
        )));
    }
    Ok(bytes)
}

/// Reads `path` (relative to `root`, or absolute) if it resolves to a file under `root`.
fn read_under(root: &Path, path: &Path, max_bytes: usize) -> Result<Vec<u8>, String> {
    let root = root
        .canonicalize()
        .map_err(|e| format!("the media directory is unusable: {e}"))?;
    let full = root
        .join(path)
        .canonicalize()
        .map_err(|_| "no such file in the media directory".to_string())?;
    if !full.starts_with(&root) {
        return Err("outside the media directory".into());
    }
    let file = std::fs::File::open(&full).map_err(|e| e.to_string())?;
    let len = file.metadata().map_err(|e| e.to_string())?.len();
    if !file.metadata().map_err(|e| e.to_string())?.is_file() {
        return Err("not a file".into());
    }
    if len > max_bytes as u64 {
        return Err(format!(
            "{len} bytes, more than the {max_bytes} an image may have"
        ));
    }
    let mut bytes = Vec::with_capacity(len as usize);
    file.take(max_bytes as u64 + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| e.to_string())?;
    Ok(bytes)
}

fn fetch_remote(url: &str, policy: &MediaPolicy) -> Result<Vec<u8>, String> {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .timeout_global(Some(policy.remote_timeout))
        .build()
        .into();
    let mut response = agent.get(url).call().map_err(|e| e.to_string())?;
    response
        .body_mut()
        .with_config()
        .limit(policy.max_bytes as u64)
        .read_to_vec()
        .map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn data_urls_decode_and_the_wrong_ones_are_named() {
        let policy = MediaPolicy::default();
        let (_, bytes) = fetch("data:image/png;base64,AAEC", "p", &policy).unwrap();
        assert_eq!(bytes, vec![0, 1, 2]);
        // Within --max-image-mib like any image; control: the same data one byte over is refused.
        let small = MediaPolicy {
            max_bytes: 3,
            ..MediaPolicy::default()
        };
        assert_eq!(
            fetch("data:image/png;base64,AAEC", "p", &small).unwrap().1,
            vec![0, 1, 2]
        );
        let e = fetch("data:image/png;base64,AAECAw==", "p", &small).unwrap_err();
        assert!(
            e.message.contains("4 bytes, more than the 3"),
            "{}",
            e.message
        );
        for url in [
            "data:image/png;base64",
            "data:text/plain;base64,AAEC",
            "data:image/png,AAEC",
            "data:image/png;base64,***",
        ] {
            let e = fetch(url, "messages[0].content[1].image_url", &policy).unwrap_err();
            assert_eq!(e.status.as_u16(), 400);
            assert!(
                e.message.contains("messages[0].content[1].image_url"),
                "{}",
                e.message
            );
        }
    }

    #[test]
    fn files_only_under_the_media_dir() {
        let dir = tempfile::tempdir().unwrap();
        let media = dir.path().join("media");
        std::fs::create_dir(&media).unwrap();
        std::fs::write(media.join("a.png"), b"png").unwrap();
        std::fs::write(dir.path().join("secret.png"), b"no").unwrap();
        // No --media-dir: refused.
        let off = MediaPolicy::default();
        assert!(fetch("a.png", "p", &off)
            .unwrap_err()
            .message
            .contains("--media-dir"));
        let on = MediaPolicy {
            media_dir: Some(media.clone()),
            ..MediaPolicy::default()
        };
        assert_eq!(fetch("a.png", "p", &on).unwrap().1, b"png");
        let abs = format!("file://{}", media.join("a.png").display());
        assert_eq!(fetch(&abs, "p", &on).unwrap().1, b"png");
        // Control: escaping the directory is refused.
        for url in [
            "../secret.png",
            &format!("file://{}", dir.path().join("secret.png").display()),
        ] {
            let e = fetch(url, "p", &on).unwrap_err();
            assert!(
                e.message.contains("outside the media directory"),
                "{}",
                e.message
            );
        }
        // Remote URLs are off unless allowed.
        assert!(fetch("http://127.0.0.1:9/x.png", "p", &on)
            .unwrap_err()
            .message
            .contains("--allow-remote-media"));
    }
}
