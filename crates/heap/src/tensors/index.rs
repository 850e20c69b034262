//! Which files make a checkpoint.
//!
//! - a safetensors file: itself;
//! - an `*.index.json` (as `model.safetensors.index.json`): the shard files
//!   its `weight_map` names (tensor name → file name beside the index),
//!   and which tensor each must hold;
//! - a directory: its one `*.safetensors.index.json`, or, without one,
//!   every `*.safetensors` file in it.

use std::collections::BTreeMap;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use crate::error::escaped;
use crate::file::why_not_regular;
use crate::{Error, Result};

/// Largest index file read (real ones are well under 1 MB).
const MAX_INDEX: u64 = 100_000_000;

/// The files of a checkpoint.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Checkpoint {
    /// Shard files, ordered by name.
    pub shards: Vec<PathBuf>,
    /// From an index: tensor name → the shard (index in `shards`) that must
    /// hold it. `None` when the shards were found without an index.
    pub weight_map: Option<BTreeMap<String, usize>>,
    /// The index's `metadata`, values that are not strings as JSON text.
    pub metadata: BTreeMap<String, String>,
    /// Whether the path was one safetensors file.
    pub single: bool,
}

fn bad(path: &Path, reason: impl Into<String>) -> Error {
    Error::Checkpoint {
        path: path.to_path_buf(),
        reason: reason.into(),
    }
}

fn open_err(path: &Path) -> impl FnOnce(std::io::Error) -> Error + '_ {
    |source| Error::Open {
        path: path.to_path_buf(),
        source,
    }
}

/// What files `path` stands for.
///
/// # Errors
/// [`Error::Open`] for a path that cannot be read, [`Error::Checkpoint`]
/// for a directory with no shard or several indexes, or an index that is
/// malformed, names a shard outside its directory or a shard that does
/// not exist.
pub(super) fn resolve(path: &Path) -> Result<Checkpoint> {
    let meta = std::fs::metadata(path).map_err(open_err(path))?;
    if meta.is_dir() {
        return resolve_dir(path);
    }
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
    if meta.is_file() && name.ends_with(".json") {
        return resolve_index(path);
    }
    Ok(Checkpoint {
        shards: vec![path.to_path_buf()],
        weight_map: None,
        metadata: BTreeMap::new(),
        single: true,
    })
}

fn resolve_dir(dir: &Path) -> Result<Checkpoint> {
    let mut indexes = Vec::new();
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(open_err(dir))? {
        let entry = entry.map_err(open_err(dir))?;
        let name = entry.file_name();
        let is_index = name.as_bytes().ends_with(b".safetensors.index.json");
        if !is_index && !name.as_bytes().ends_with(b".safetensors") {
            continue;
        }
        // Every such entry is part of the checkpoint: one that cannot be
        // loaded fails the load, never drops out of it.
        let path = entry.path();
        if let Some(why) = why_not_regular(&path) {
            return Err(bad(
                dir,
                format!(
                    "{} {why}, and every *.safetensors file of a directory is loaded (all or \
                     nothing): remove it, or name the shards in an index",
                    escaped(&name.to_string_lossy())
                ),
            ));
        }
        if is_index {
            indexes.push(path);
        } else {
            files.push(path);
        }
    }
    indexes.sort();
    files.sort();
    match &indexes[..] {
        [index] => resolve_index(index),
        [] if files.is_empty() => Err(bad(
            dir,
            "the directory holds no *.safetensors file and no *.safetensors.index.json",
        )),
        [] => Ok(Checkpoint {
            shards: files,
            weight_map: None,
            metadata: BTreeMap::new(),
            single: false,
        }),
        several => Err(bad(
            dir,
            format!(
                "the directory holds {} indexes ({}): name the one to load",
                several.len(),
                names(several)
            ),
        )),
    }
}

fn names(paths: &[PathBuf]) -> String {
    paths
        .iter()
        .map(|p| escaped(&p.file_name().unwrap_or_default().to_string_lossy()))
        .collect::<Vec<_>>()
        .join(", ")
}

/// An index's contents: tensor name → shard file name, and metadata.
#[derive(Debug)]
struct Parsed {
    by_tensor: BTreeMap<String, String>,
    metadata: BTreeMap<String, String>,
}

/// Parses the text of the index at `index` (named in errors only).
fn parse_index(index: &Path, text: &[u8]) -> Result<Parsed> {
    let json: serde_json::Value = serde_json::from_slice(text)
        .map_err(|e| bad(index, format!("the index is not JSON: {e}")))?;
    let map = json
        .get("weight_map")
        .and_then(|m| m.as_object())
        .ok_or_else(|| bad(index, "the index has no \"weight_map\" object"))?;
    if map.is_empty() {
        return Err(bad(index, "the index's weight_map names no tensor"));
    }
    let mut by_tensor = BTreeMap::new();
    for (tensor, file) in map {
        let Some(file) = file.as_str() else {
            return Err(bad(
                index,
                format!("the index maps tensor {tensor:?} to {file}, not a file name"),
            ));
        };
        if file.is_empty() || file == "." || file == ".." || file.contains('/') {
            return Err(bad(
                index,
                format!(
                    "the index maps tensor {tensor:?} to {file:?}: a shard must be a file \
                     beside the index"
                ),
            ));
        }
        by_tensor.insert(tensor.clone(), file.to_string());
    }
    let metadata = json
        .get("metadata")
        .and_then(|m| m.as_object())
        .map(|m| {
            m.iter()
                .map(|(k, v)| {
                    let v = v.as_str().map_or_else(|| v.to_string(), str::to_string);
                    (k.clone(), v)
                })
                .collect()
        })
        .unwrap_or_default();
    Ok(Parsed {
        by_tensor,
        metadata,
    })
}

/// For the `checkpoint_index` fuzz target (`crates/heap/fuzz`): parses
/// `json` as a `model.safetensors.index.json`; returns how many tensors it
/// maps, or its refusal. Panics if an accepted index maps a tensor to a
/// name that could reach outside the index's directory.
#[doc(hidden)]
pub fn fuzz_checkpoint_index(json: &[u8]) -> Result<usize> {
    let p = parse_index(Path::new("fuzz-input.index.json"), json)?;
    for (tensor, file) in &p.by_tensor {
        let name = Path::new(file);
        assert!(
            name.components().count() == 1
                && matches!(
                    name.components().next(),
                    Some(std::path::Component::Normal(_))
                ),
            "tensor {tensor:?} mapped to {file:?}, not a plain file name"
        );
    }
    Ok(p.by_tensor.len())
}

fn resolve_index(index: &Path) -> Result<Checkpoint> {
    let size = std::fs::metadata(index).map_err(open_err(index))?.len();
    if size > MAX_INDEX {
        return Err(bad(
            index,
            format!("the index is {size} bytes, over the limit of {MAX_INDEX}"),
        ));
    }
    let text = std::fs::read(index).map_err(open_err(index))?;
    let Parsed {
        by_tensor,
        metadata,
    } = parse_index(index, &text)?;
    let dir = index.parent().unwrap_or(Path::new("."));
    let mut files: Vec<&str> = by_tensor.values().map(String::as_str).collect();
    files.sort_unstable();
    files.dedup();
    for f in &files {
        if let Some(why) = why_not_regular(&dir.join(f)) {
            let count = by_tensor.values().filter(|v| v == f).count();
            return Err(bad(
                index,
                format!(
                    "the index names shard {} ({count} tensors), which {why}",
                    escaped(f)
                ),
            ));
        }
    }
    let weight_map = by_tensor
        .iter()
        .map(|(t, f)| (t.clone(), files.binary_search(&f.as_str()).unwrap_or(0)))
        .collect();
    Ok(Checkpoint {
        shards: files.iter().map(|f| dir.join(f)).collect(),
        weight_map: Some(weight_map),
        metadata,
        single: false,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reason(r: Result<Checkpoint>) -> String {
        match r {
            Err(Error::Checkpoint { reason, .. }) => reason,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn an_index_names_its_shards_and_their_tensors() {
        let d = tempfile::tempdir().unwrap();
        for f in ["b.safetensors", "a.safetensors"] {
            std::fs::write(d.path().join(f), b"x").unwrap();
        }
        let index = d.path().join("model.safetensors.index.json");
        std::fs::write(
            &index,
            r#"{"metadata":{"total_size":16,"format":"pt"},
                "weight_map":{"x":"b.safetensors","y":"a.safetensors","z":"b.safetensors"}}"#,
        )
        .unwrap();
        let want = Checkpoint {
            shards: vec![
                d.path().join("a.safetensors"),
                d.path().join("b.safetensors"),
            ],
            weight_map: Some(
                [("x", 1), ("y", 0), ("z", 1)]
                    .into_iter()
                    .map(|(t, s)| (t.to_string(), s))
                    .collect(),
            ),
            metadata: [("total_size", "16"), ("format", "pt")]
                .into_iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            single: false,
        };
        assert_eq!(resolve(&index).unwrap(), want);
        // The directory finds the same index.
        assert_eq!(resolve(d.path()).unwrap(), want);
    }

    #[test]
    fn a_directory_without_an_index_is_its_safetensors_files() {
        let d = tempfile::tempdir().unwrap();
        for f in ["2.safetensors", "1.safetensors", "notes.txt"] {
            std::fs::write(d.path().join(f), b"x").unwrap();
        }
        let c = resolve(d.path()).unwrap();
        assert_eq!(
            c.shards,
            vec![
                d.path().join("1.safetensors"),
                d.path().join("2.safetensors")
            ]
        );
        assert!(c.weight_map.is_none() && !c.single);
        let one = resolve(&d.path().join("1.safetensors")).unwrap();
        assert!(one.single);
        std::fs::create_dir(d.path().join("empty")).unwrap();
        assert_eq!(
            reason(resolve(&d.path().join("empty"))),
            "the directory holds no *.safetensors file and no *.safetensors.index.json"
        );
    }

    fn mkfifo(path: &Path) {
        rustix::fs::mknodat(
            rustix::fs::CWD,
            path,
            rustix::fs::FileType::Fifo,
            rustix::fs::Mode::from_raw_mode(0o600),
            0,
        )
        .unwrap();
    }

    #[test]
    fn shards_an_index_names_that_are_not_regular_files_say_what_they_are() {
        let d = tempfile::tempdir().unwrap();
        let index = d.path().join("m.safetensors.index.json");
        std::fs::write(
            &index,
            r#"{"weight_map":{"x":"fifo.safetensors","y":"zero.safetensors"}}"#,
        )
        .unwrap();
        mkfifo(&d.path().join("fifo.safetensors"));
        std::os::unix::fs::symlink("/dev/zero", d.path().join("zero.safetensors")).unwrap();
        assert_eq!(
            reason(resolve(&index)),
            "the index names shard fifo.safetensors (1 tensors), which is not a regular file \
             (a pipe)"
        );
        std::fs::remove_file(d.path().join("fifo.safetensors")).unwrap();
        std::fs::write(d.path().join("fifo.safetensors"), b"x").unwrap();
        assert_eq!(
            reason(resolve(&index)),
            "the index names shard zero.safetensors (1 tensors), which is not a regular file \
             (a character device)"
        );
        std::fs::remove_file(d.path().join("zero.safetensors")).unwrap();
        std::os::unix::fs::symlink("blobs/gone", d.path().join("zero.safetensors")).unwrap();
        assert_eq!(
            reason(resolve(&index)),
            "the index names shard zero.safetensors (1 tensors), which is a symbolic link to \
             blobs/gone, which does not exist (an interrupted download?)"
        );
    }

    #[test]
    fn a_directory_entry_that_cannot_be_loaded_fails_the_load_naming_it() {
        let tail = ", and every *.safetensors file of a directory is loaded (all or nothing): \
                    remove it, or name the shards in an index";
        /// Makes the entry at a path.
        type Make = fn(&Path);
        let cases: [(&str, Make, &str); 4] = [
            (
                "a.safetensors",
                |p| std::os::unix::fs::symlink("../blobs/x", p).unwrap(),
                "is a symbolic link to ../blobs/x, which does not exist (an interrupted download?)",
            ),
            ("a.safetensors", mkfifo, "is not a regular file (a pipe)"),
            (
                "a.safetensors",
                |p| std::fs::create_dir(p).unwrap(),
                "is not a regular file (a directory)",
            ),
            (
                "m.safetensors.index.json",
                |p| std::os::unix::fs::symlink("nowhere", p).unwrap(),
                "is a symbolic link to nowhere, which does not exist (an interrupted download?)",
            ),
        ];
        for (name, make, why) in cases {
            let d = tempfile::tempdir().unwrap();
            std::fs::write(d.path().join("b.safetensors"), b"x").unwrap();
            make(&d.path().join(name));
            assert_eq!(reason(resolve(d.path())), format!("{name} {why}{tail}"));
        }
    }

    #[test]
    fn shard_names_are_shown_escaped() {
        let d = tempfile::tempdir().unwrap();
        let index = d.path().join("m.safetensors.index.json");
        std::fs::write(
            &index,
            r#"{"weight_map":{"x":"\u001b]0;owned\u0007\u001b[2J.safetensors"}}"#,
        )
        .unwrap();
        let e = resolve(&index).unwrap_err().to_string();
        assert!(!e.contains('\u{1b}') && !e.contains('\u{7}'), "{e:?}");
        assert!(
            e.ends_with(
                r"the index names shard \u{1b}]0;owned\u{7}\u{1b}[2J.safetensors (1 tensors), which does not exist"
            ),
            "{e}"
        );
        // A directory's entries, and the path of the error itself.
        let evil = d.path().join("\u{1b}[2J\u{202e}");
        std::fs::create_dir(&evil).unwrap();
        std::fs::create_dir(evil.join("\u{1b}c.safetensors")).unwrap();
        let e = resolve(&evil).unwrap_err().to_string();
        assert!(!e.contains('\u{1b}') && !e.contains('\u{202e}'), "{e:?}");
        assert!(
            e.contains(
                r"\u{1b}[2J\u{202e} is not a checkpoint iopath accepts: \u{1b}c.safetensors is not"
            ),
            "{e}"
        );
    }

    #[test]
    fn bad_indexes_are_refused_with_the_reason() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("a.safetensors"), b"x").unwrap();
        let index = d.path().join("m.safetensors.index.json");
        let with = |json: &str| {
            std::fs::write(&index, json).unwrap();
            reason(resolve(&index))
        };
        assert_eq!(
            with(r#"{"weight_map":{"x":"a.safetensors","y":"gone.safetensors"}}"#),
            "the index names shard gone.safetensors (1 tensors), which does not exist"
        );
        assert_eq!(
            with(r#"{"weight_map":{"x":"../a.safetensors"}}"#),
            "the index maps tensor \"x\" to \"../a.safetensors\": a shard must be a file beside the index"
        );
        assert_eq!(
            with(r#"{"weight_map":{"x":3}}"#),
            "the index maps tensor \"x\" to 3, not a file name"
        );
        assert_eq!(
            with(r#"{"weight_map":{}}"#),
            "the index's weight_map names no tensor"
        );
        assert_eq!(
            with(r#"{"metadata":{}}"#),
            "the index has no \"weight_map\" object"
        );
        assert!(with("{").starts_with("the index is not JSON: "));
        std::fs::write(d.path().join("n.safetensors.index.json"), "{}").unwrap();
        assert_eq!(
            reason(resolve(d.path())),
            "the directory holds 2 indexes (m.safetensors.index.json, n.safetensors.index.json): \
             name the one to load"
        );
    }

    #[test]
    fn the_fuzz_seeds_are_what_their_names_say() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus/checkpoint_index");
        let verdict = |name: &str| fuzz_checkpoint_index(&std::fs::read(dir.join(name)).unwrap());
        assert_eq!(verdict("two-shards").unwrap(), 2);
        assert_eq!(verdict("twice").unwrap(), 1);
        for name in ["dotdot", "absolute", "empty"] {
            let r = verdict(name);
            assert!(matches!(r, Err(Error::Checkpoint { .. })), "{name}: {r:?}");
        }
    }
}
