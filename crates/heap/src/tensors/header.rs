//! The safetensors header: read, parsed and validated by the `safetensors`
//! crate (offsets contiguous from 0, sizes consistent with dtype and shape,
//! known dtypes), and on top of that refused when its length is larger
//! than the file or than 100 MB, or when the tensor data does not end
//! exactly at the end of the file.

use std::collections::BTreeMap;
use std::os::unix::fs::FileExt;
use std::path::Path;

use super::dtype_align;
use crate::{Error, Result};

/// Largest header accepted, as the `safetensors` crate's own limit.
pub const MAX_HEADER: u64 = 100_000_000;

/// The parsed, validated header: where the data starts and the tensors in
/// file order.
#[derive(Debug)]
pub(super) struct Header {
    /// File offset of the first tensor byte.
    pub data_start: u64,
    /// Name and place of every tensor, in file order.
    pub tensors: Vec<(String, safetensors::tensor::TensorInfo)>,
    /// The `__metadata__` map.
    pub metadata: BTreeMap<String, String>,
}

fn bad(path: &Path, reason: impl Into<String>) -> Error {
    Error::Safetensors {
        path: path.to_path_buf(),
        reason: reason.into(),
    }
}

/// Reads and validates the header of `file` (`size` bytes).
pub(super) fn read_header(file: &std::fs::File, path: &Path, size: u64) -> Result<Header> {
    parse_header(|buf, off| file.read_exact_at(buf, off), path, size)
}

/// Validates the header of a `size`-byte file at `path` whose bytes
/// `read(buf, offset)` fills `buf` with.
pub(super) fn parse_header(
    mut read: impl FnMut(&mut [u8], u64) -> std::io::Result<()>,
    path: &Path,
    size: u64,
) -> Result<Header> {
    let io = |op, offset, len, source| Error::FileIo {
        op,
        path: path.to_path_buf(),
        offset,
        len,
        source,
    };
    if size < 8 {
        return Err(bad(
            path,
            format!("{size} bytes is too short for the 8-byte header length"),
        ));
    }
    let mut n = [0u8; 8];
    read(&mut n, 0).map_err(|e| io("pread", 0, 8, e))?;
    let n = u64::from_le_bytes(n);
    if n > MAX_HEADER {
        return Err(bad(
            path,
            format!("header length {n} is over the limit of {MAX_HEADER} bytes"),
        ));
    }
    if n > size - 8 {
        return Err(bad(
            path,
            format!("header length {n} runs past the end of the file ({size} bytes)"),
        ));
    }
    let mut json = vec![0u8; n as usize];
    read(&mut json, 8).map_err(|e| io("pread", 8, n as usize, e))?;
    let meta: safetensors::tensor::Metadata = serde_json::from_slice(&json).map_err(|e| {
        // A name given twice keeps only its last entry, whose offsets then
        // leave a hole: say which name, not "invalid offset".
        match crate::header_keys::duplicate_name(&json) {
            Some(name) => bad(
                path,
                format!("tensor name {name:?} appears twice in the header"),
            ),
            None => bad(path, format!("header refused: {e}")),
        }
    })?;
    let data_start = 8 + n;
    let data_len = meta.data_len() as u64;
    if data_start + data_len != size {
        return Err(bad(
            path,
            format!(
                "the tensors' data ends at byte {} but the file has {size} bytes",
                data_start + data_len
            ),
        ));
    }
    let infos = meta.tensors();
    let mut tensors: Vec<_> = meta
        .offset_keys()
        .into_iter()
        .filter_map(|name| infos.get(&name).map(|i| (name.clone(), (*i).clone())))
        .collect();
    tensors.sort_by_key(|(_, i)| i.data_offsets);
    let metadata = meta
        .metadata()
        .clone()
        .unwrap_or_default()
        .into_iter()
        .collect();
    Ok(Header {
        data_start,
        tensors,
        metadata,
    })
}

impl Header {
    /// Each tensor's (file offset, length, alignment), in file order.
    pub(super) fn spans(&self) -> Vec<(u64, usize, usize)> {
        self.tensors
            .iter()
            .map(|(_, i)| {
                let (s, e) = i.data_offsets;
                (self.data_start + s as u64, e - s, dtype_align(i.dtype))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_duplicate_tensor_name_is_named() {
        let json = br#"{"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},"a":{"dtype":"U8","shape":[4],"data_offsets":[4,8]}}"#;
        let mut file = (json.len() as u64).to_le_bytes().to_vec();
        file.extend_from_slice(json);
        file.extend_from_slice(&[7; 8]);
        let r = parse_header(
            |buf, off| {
                buf.copy_from_slice(&file[off as usize..off as usize + buf.len()]);
                Ok(())
            },
            Path::new("dup.safetensors"),
            file.len() as u64,
        );
        let Err(Error::Safetensors { reason, .. }) = r else {
            panic!("{r:?}")
        };
        assert_eq!(reason, r#"tensor name "a" appears twice in the header"#);
    }
}
