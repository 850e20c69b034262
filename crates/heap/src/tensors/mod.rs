//! The safetensors loader: a checkpoint (one file, or the shards of a
//! sharded one) laid out tensor by tensor into heap buffers, every tensor
//! whole in one buffer at the alignment its dtype needs, and returned as
//! one map.
//!
//! ```text
//!   model.safetensors.index.json ─► index: shard files, tensor → shard
//!        │
//!   shard files ─► header (checked) ─► plan ─► fill (engines, N shards at once)
//!   file:    [n u64][header JSON, n bytes][t0 | t1 | t2 | ...... big t3 ...... | t4 ]
//!                                          \________ run ______/                 \run/
//!   buffers: #0 [t0 t1 t2 ]   #1 [..... t3 .....]   #0' (next buffer) [t4]
//! ```
//!
//! - [`header`]: the header read and validated;
//! - [`plan`]: which buffer and offset each tensor gets, and the reads;
//! - [`map`]: the tensors the page cache holds, as views of the file
//!   ([`crate::LoadOptions::map_cached`]);
//! - [`index`]: which files make the checkpoint (a file, a directory, an
//!   `*.index.json`);
//! - [`shard`]: one file opened, planned, filled, and checked unchanged;
//! - [`shards`]: every shard of a checkpoint loaded into one map, or none.

mod header;
mod index;
mod map;
mod plan;
mod shard;
mod shards;

use std::collections::BTreeMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

pub use safetensors::Dtype;

pub use header::MAX_HEADER;
#[doc(hidden)]
pub use index::fuzz_checkpoint_index;
#[doc(hidden)]
pub use plan::fuzz_safetensors;
pub use shards::{load_checkpoint, DEFAULT_SHARDS_AT_ONCE};

use crate::{Buffer, Error, Heap, LoadOptions, LoadStats, Progress, Result};

/// Where one tensor landed.
#[derive(Debug, Clone)]
pub struct Tensor {
    /// The buffer that holds it (a handle to one of [`Tensors::buffers`]):
    /// a heap buffer, or for a tensor mapped from the page cache
    /// ([`crate::LoadOptions::map_cached`]) its file's own
    /// [`crate::HeapKind::File`] buffer.
    pub buffer: Buffer,
    /// Index of that buffer in [`Tensors::buffers`].
    pub buffer_index: usize,
    /// Offset of its first byte in the buffer (a multiple of
    /// [`dtype_align`]; in a file's buffer, its offset in the file).
    pub offset: usize,
    /// Length in bytes.
    pub len: usize,
    /// Element type.
    pub dtype: Dtype,
    /// Shape (row-major).
    pub shape: Vec<usize>,
    /// Index of the shard file that holds it in [`Tensors::shards`].
    pub shard: usize,
    /// Offset of its first byte in that file.
    pub file_offset: u64,
}

/// One file of a loaded checkpoint.
#[derive(Debug, Clone)]
pub struct Shard {
    /// The file.
    pub path: PathBuf,
    /// Tensors it held.
    pub tensors: usize,
    /// What loading it took (`elapsed` from the start of the whole load
    /// to this shard's last byte).
    pub stats: LoadStats,
}

/// A loaded safetensors checkpoint: one file or every shard of one.
#[derive(Debug)]
pub struct Tensors {
    /// Tensor name → where it is.
    pub tensors: BTreeMap<String, Tensor>,
    /// The buffers of every shard, shard after shard.
    pub buffers: Vec<Buffer>,
    /// The index's `metadata` (values that are not strings as JSON text),
    /// then every shard's `__metadata__` entries the map does not hold
    /// yet, shard by shard.
    pub metadata: BTreeMap<String, String>,
    /// The files, in the order of their names.
    pub shards: Vec<Shard>,
    /// Statistics of the whole load (bytes counts tensor bytes read;
    /// `method` and `probe` are the first shard's).
    pub stats: LoadStats,
}

/// The alignment a tensor of `dtype` needs in memory: its element size in
/// bytes (1 for sub-byte and byte types).
pub fn dtype_align(dtype: Dtype) -> usize {
    (dtype.bitsize() / 8).max(1)
}

/// Loads a safetensors checkpoint into buffers from `heap`, shards
/// [`DEFAULT_SHARDS_AT_ONCE`] at a time: see [`load_checkpoint`].
///
/// `path` is a safetensors file, a directory (its
/// `*.safetensors.index.json` if it has one, else every `*.safetensors`
/// file in it), or a `*.index.json` (`weight_map`: tensor name → shard file
/// beside it). In each file, every tensor is whole in one buffer at its
/// dtype's alignment (when its offset in the file allows one read for a
/// run of tensors; otherwise it is still aligned, with a read of its own),
/// buffers of at most `opts.buffer_size` bytes except for a tensor larger
/// than that, which gets its own. The buffers are filled with
/// `opts.method`'s engine, allocation overlapped with the reads.
///
/// # Errors
/// [`Error::Safetensors`] for a malformed or hostile header (huge length,
/// bad JSON, unknown dtype, overlapping or out-of-file offsets, sizes that
/// disagree with the shape), [`Error::Checkpoint`] for an index or a set
/// of shards that disagree (a missing shard, a tensor in two shards),
/// [`Error::Changed`] for a file that changed while it was loaded, the
/// file errors of [`crate::load`], [`Error::BadSize`] for a buffer size
/// that is not a page multiple, [`Error::OutOfMemory`] /
/// [`Error::TooManyBuffers`] when the plan cannot fit, and any allocation
/// or transfer error. An error in one shard of several comes as
/// [`Error::Shard`], naming it; nothing is returned half-loaded.
pub fn load_safetensors(
    path: &Path,
    heap: &dyn Heap,
    opts: &LoadOptions,
    progress: &mut dyn FnMut(&Progress),
) -> Result<Tensors> {
    load_checkpoint(path, heap, opts, DEFAULT_SHARDS_AT_ONCE, progress)
}

impl Tensors {
    /// Compares every tensor with its bytes in its shard file, read again
    /// with plain reads.
    ///
    /// # Errors
    /// [`Error::TensorMismatch`] naming the first differing byte;
    /// [`Error::Open`] or [`Error::FileIo`] if a file cannot be read
    /// again.
    pub fn verify(&self) -> Result<()> {
        let mut files: Vec<Option<File>> = (0..self.shards.len()).map(|_| None).collect();
        for (name, x) in &self.tensors {
            let path = &self.shards[x.shard].path;
            let f = match &mut files[x.shard] {
                Some(f) => f,
                slot => slot.insert(File::open(path).map_err(|source| Error::Open {
                    path: path.clone(),
                    source,
                })?),
            };
            let mut want = vec![0u8; x.len];
            f.read_exact_at(&mut want, x.file_offset)
                .map_err(|source| Error::FileIo {
                    op: "verify read",
                    path: path.clone(),
                    offset: x.file_offset,
                    len: x.len,
                    source,
                })?;
            let mut got = vec![0u8; x.len];
            x.buffer.read_at(x.offset, &mut got)?;
            if let Some(k) = want.iter().zip(&got).position(|(a, b)| a != b) {
                return Err(Error::TensorMismatch {
                    tensor: name.clone(),
                    index: k,
                    file_offset: x.file_offset + k as u64,
                    buffer: x.buffer_index,
                    file_byte: want[k],
                    buffer_byte: got[k],
                });
            }
        }
        Ok(())
    }
}
