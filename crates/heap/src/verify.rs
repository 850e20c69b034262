//! Verification of a load: the buffers compared byte for byte with the
//! file, read again independently of the engine that filled them (a
//! safetensors load's own is `Tensors::verify`).

use std::fs::File;
use std::io::Read;
use std::path::Path;

use crate::{Error, Loaded, Result};

/// Opens `path` again for a comparison.
fn reopen(path: &Path) -> Result<File> {
    File::open(path).map_err(|source| Error::Open {
        path: path.to_owned(),
        source,
    })
}

/// A failed re-read of `len` bytes at `offset`.
fn read_error(path: &Path, offset: u64, len: usize) -> impl FnOnce(std::io::Error) -> Error + '_ {
    move |source| Error::FileIo {
        op: "verify read",
        path: path.to_owned(),
        offset,
        len,
        source,
    }
}

/// Index of the first byte where `a` and `b` differ.
fn first_difference(a: &[u8], b: &[u8]) -> Option<usize> {
    a.iter().zip(b).position(|(x, y)| x != y)
}

impl Loaded {
    /// Compares the buffers with `path` (the file they were loaded from),
    /// read again with plain reads.
    ///
    /// # Errors
    /// [`Error::Mismatch`] naming the first differing byte;
    /// [`Error::Open`] or [`Error::FileIo`] if the file cannot be read
    /// again (a file now shorter included).
    pub fn verify(&self, path: &Path) -> Result<()> {
        let mut f = reopen(path)?;
        let mut off = 0u64;
        for (i, (buf, &len)) in self.buffers.iter().zip(&self.lens).enumerate() {
            let mut want = vec![0u8; len];
            f.read_exact(&mut want)
                .map_err(read_error(path, off, len))?;
            let mut got = vec![0u8; len];
            buf.read_at(0, &mut got)?;
            if let Some(k) = first_difference(&want, &got) {
                return Err(Error::Mismatch {
                    path: path.to_owned(),
                    file_offset: off + k as u64,
                    buffer: i,
                    buffer_offset: k,
                    file_byte: want[k],
                    buffer_byte: got[k],
                });
            }
            off += len as u64;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use crate::{load, HugePages, LoadOptions, MemfdHeap};

    #[test]
    fn verify_names_the_first_differing_byte() {
        let dir = tempfile::tempdir_in("/var/tmp").unwrap();
        let a = dir.path().join("a");
        let b = dir.path().join("b");
        let data: Vec<u8> = (0..100_000u32).map(|i| (i * 7) as u8).collect();
        std::fs::write(&a, &data).unwrap();
        let mut other = data.clone();
        other[70_000] ^= 0xff;
        std::fs::write(&b, &other).unwrap();
        let opts = LoadOptions {
            buffer_size: 64 << 10,
            ..LoadOptions::default()
        };
        let heap = MemfdHeap::new(HugePages::None);
        let loaded = load(&a, &heap, &opts, &mut |_| {}).unwrap();
        loaded.verify(&a).unwrap();
        let err = loaded.verify(&b).unwrap_err().to_string();
        assert!(
            err.starts_with("verify failed: byte 70000 of ")
                && err.contains("(buffer 1, offset 4464"),
            "{err}"
        );
    }
}
