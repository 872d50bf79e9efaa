//! An input is a base (a set of valid files, held in memory) plus patches to some of its files.
//! A worker keeps one pristine copy of every base on disk, applies an input's patches in place,
//! runs the parser, and restores exactly the bytes it changed: a multi-megabyte checkpoint shard
//! with a mutated header costs a few kilobytes of writes, not a copy of the shard.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

/// A set of valid files the mutations start from.
#[derive(Clone, Debug)]
pub struct Base {
    pub name: String,
    pub files: Vec<(String, Vec<u8>)>,
}

impl Base {
    pub fn file(&self, name: &str) -> Option<&[u8]> {
        self.files
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, b)| b.as_slice())
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Patch {
    /// Overwrite (or extend) bytes at an offset.
    Write {
        offset: u64,
        bytes: Vec<u8>,
    },
    /// Truncate (or extend with zeros).
    SetLen(u64),
    /// The whole file.
    Replace(Vec<u8>),
    Delete,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FilePatch {
    pub file: String,
    pub patch: Patch,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Input {
    /// Index into the target's bases.
    pub base: usize,
    pub patches: Vec<FilePatch>,
    /// Target-specific options drawn with the input (quantization kind, flags).
    pub knobs: u64,
}

/// Writes every file of `base` into `dir` (created).
pub fn write_base(dir: &Path, base: &Base) -> io::Result<()> {
    std::fs::create_dir_all(dir)?;
    for (name, bytes) in &base.files {
        std::fs::write(dir.join(name), bytes)?;
    }
    Ok(())
}

fn open_rw(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
}

/// Applies the patches of `input` to the copy of its base in `dir`.
pub fn apply(dir: &Path, input: &Input) -> io::Result<()> {
    for p in &input.patches {
        let path = dir.join(&p.file);
        match &p.patch {
            Patch::Write { offset, bytes } => open_rw(&path)?.write_all_at(bytes, *offset)?,
            Patch::SetLen(n) => open_rw(&path)?.set_len(*n)?,
            Patch::Replace(bytes) => std::fs::write(&path, bytes)?,
            Patch::Delete => match std::fs::remove_file(&path) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
                _ => {}
            },
        }
    }
    Ok(())
}

/// Undoes `apply`: writes back from `base` exactly the ranges the patches touched.
pub fn restore(dir: &Path, base: &Base, input: &Input) -> io::Result<()> {
    for p in &input.patches {
        let path = dir.join(&p.file);
        let Some(orig) = base.file(&p.file) else {
            // A file the base does not have: the input added it.
            match std::fs::remove_file(&path) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
                _ => {}
            }
            continue;
        };
        let len = orig.len() as u64;
        match &p.patch {
            Patch::Write { offset, bytes } => {
                let f = open_rw(&path)?;
                let start = (*offset).min(len) as usize;
                let end = (offset.saturating_add(bytes.len() as u64)).min(len) as usize;
                f.write_all_at(&orig[start..end], start as u64)?;
                f.set_len(len)?;
            }
            Patch::SetLen(n) => {
                let f = open_rw(&path)?;
                let start = (*n).min(len) as usize;
                f.write_all_at(&orig[start..], start as u64)?;
                f.set_len(len)?;
            }
            Patch::Replace(_) | Patch::Delete => std::fs::write(&path, orig)?,
        }
    }
    Ok(())
}

/// Writes the input, as the parser saw it, into a fresh directory (for a panic or hang report).
pub fn materialize(dir: &Path, base: &Base, input: &Input) -> io::Result<PathBuf> {
    write_base(dir, base)?;
    apply(dir, input)?;
    let mut note = format!("base {}\nknobs {:#x}\npatches:\n", base.name, input.knobs);
    for p in &input.patches {
        let what = match &p.patch {
            Patch::Write { offset, bytes } => format!("write {} bytes at {offset}", bytes.len()),
            Patch::SetLen(n) => format!("set length {n}"),
            Patch::Replace(b) => format!("replace ({} bytes)", b.len()),
            Patch::Delete => "delete".into(),
        };
        note.push_str(&format!("  {}: {what}\n", p.file));
    }
    std::fs::write(dir.join("FUZZ-INPUT.txt"), note)?;
    Ok(dir.to_path_buf())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn restore_undoes_every_patch() {
        let tmp = tempfile::tempdir().unwrap();
        let base = Base {
            name: "b".into(),
            files: vec![
                ("a".into(), (0..200u8).collect()),
                ("c".into(), vec![9; 10]),
            ],
        };
        write_base(tmp.path(), &base).unwrap();
        let input = Input {
            base: 0,
            knobs: 0,
            patches: vec![
                FilePatch {
                    file: "a".into(),
                    patch: Patch::Write {
                        offset: 190,
                        bytes: vec![0; 30],
                    },
                },
                FilePatch {
                    file: "a".into(),
                    patch: Patch::SetLen(5),
                },
                FilePatch {
                    file: "c".into(),
                    patch: Patch::Delete,
                },
                FilePatch {
                    file: "new".into(),
                    patch: Patch::Replace(vec![1]),
                },
            ],
        };
        apply(tmp.path(), &input).unwrap();
        // Control: the patches did change the files.
        assert_eq!(std::fs::read(tmp.path().join("a")).unwrap().len(), 5);
        assert!(!tmp.path().join("c").exists());
        restore(tmp.path(), &base, &input).unwrap();
        assert_eq!(
            std::fs::read(tmp.path().join("a")).unwrap(),
            base.files[0].1
        );
        assert_eq!(
            std::fs::read(tmp.path().join("c")).unwrap(),
            base.files[1].1
        );
        assert!(!tmp.path().join("new").exists());
    }
}
