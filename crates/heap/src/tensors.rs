//! The safetensors loader: a model file laid out tensor by tensor into heap
//! buffers, every tensor whole in one buffer at the alignment its dtype
//! needs.
//!
//! ```text
//!   file:    [n u64][header JSON, n bytes][t0 | t1 | t2 | ...... big t3 ...... | t4 ]
//!                                          \________ run ______/                 \run/
//!   buffers: #0 [t0 t1 t2 ]   #1 [..... t3 .....]   #0' (next buffer) [t4]
//! ```
//!
//! The header is parsed and validated by the `safetensors` crate (offsets
//! contiguous from 0, sizes consistent with dtype and shape, known dtypes);
//! on top of that the loader refuses a header length larger than the file
//! or than 100 MB, and tensor data that does not end exactly at the end of
//! the file. Consecutive tensors go into one buffer as one contiguous *run*
//! at the same offsets modulo a page as in the file, so a whole run is one
//! read through the engines (direct I/O, io_uring fixed buffers) and every
//! tensor whose file offset is aligned for its dtype is aligned in memory
//! too; a tensor that is not aligned in the file gets an aligned place and a
//! read of its own; a tensor larger than the buffer size gets a buffer of its
//! own.

use std::collections::BTreeMap;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::time::Instant;

pub use safetensors::Dtype;

use crate::file::IoFile;
use crate::loader::{fill, Planned};
use crate::{Buffer, Error, Heap, LoadOptions, LoadStats, Progress, Result};

/// Largest header accepted, as the `safetensors` crate's own limit.
pub const MAX_HEADER: u64 = 100_000_000;

/// Where one tensor landed.
#[derive(Debug, Clone)]
pub struct Tensor {
    /// The buffer that holds it (a handle to one of [`Tensors::buffers`]).
    pub buffer: Buffer,
    /// Index of that buffer in [`Tensors::buffers`].
    pub buffer_index: usize,
    /// Offset of its first byte in the buffer (a multiple of
    /// [`dtype_align`]).
    pub offset: usize,
    /// Length in bytes.
    pub len: usize,
    /// Element type.
    pub dtype: Dtype,
    /// Shape (row-major).
    pub shape: Vec<usize>,
    /// Offset of its first byte in the file.
    pub file_offset: u64,
}

/// A loaded safetensors file.
#[derive(Debug)]
pub struct Tensors {
    /// Tensor name → where it is.
    pub tensors: BTreeMap<String, Tensor>,
    /// The buffers, in the order they were planned.
    pub buffers: Vec<Buffer>,
    /// The header's `__metadata__` map, if any.
    pub metadata: BTreeMap<String, String>,
    /// Statistics (bytes counts tensor bytes read).
    pub stats: LoadStats,
}

/// The alignment a tensor of `dtype` needs in memory: its element size in
/// bytes (1 for sub-byte and byte types).
pub fn dtype_align(dtype: Dtype) -> usize {
    (dtype.bitsize() / 8).max(1)
}

/// The parsed, validated header: where the data starts and the tensors in
/// file order.
#[derive(Debug)]
struct Header {
    data_start: u64,
    tensors: Vec<(String, safetensors::tensor::TensorInfo)>,
    metadata: BTreeMap<String, String>,
}

fn bad(path: &Path, reason: impl Into<String>) -> Error {
    Error::Safetensors {
        path: path.to_path_buf(),
        reason: reason.into(),
    }
}

/// Reads and validates the header of `file` (`size` bytes).
fn read_header(file: &std::fs::File, path: &Path, size: u64) -> Result<Header> {
    parse_header(|buf, off| file.read_exact_at(buf, off), path, size)
}

/// Validates the header of a `size`-byte file at `path` whose bytes
/// `read(buf, offset)` fills `buf` with.
fn parse_header(
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
    fn spans(&self) -> Vec<(u64, usize, usize)> {
        self.tensors
            .iter()
            .map(|(_, i)| {
                let (s, e) = i.data_offsets;
                (self.data_start + s as u64, e - s, dtype_align(i.dtype))
            })
            .collect()
    }
}

/// The plan: buffer sizes, the reads, and each tensor's place.
#[derive(Debug, Default)]
struct Plan {
    sizes: Vec<usize>,
    reads: Vec<Planned>,
    /// (buffer, offset) per tensor, in header order.
    places: Vec<(usize, usize)>,
}

/// A run of consecutive tensors being gathered into one read.
#[derive(Debug, Clone, Copy)]
struct Run {
    buf: usize,
    buf_off: usize,
    file_off: u64,
    len: usize,
}

impl Plan {
    fn close(&mut self, run: &mut Option<Run>) {
        if let Some(r) = run.take() {
            if r.len > 0 {
                self.reads.push(Planned {
                    buf: r.buf,
                    buf_off: r.buf_off,
                    file_off: r.file_off,
                    len: r.len,
                });
            }
        }
    }
}

fn round_up(x: usize, to: usize) -> usize {
    x.div_ceil(to) * to
}

/// Plans `tensors` (file order; `(file offset, len, align)`) into buffers of
/// at most `cap` bytes (a multiple of `page`), sizes rounded up to
/// `granule`.
fn plan(tensors: &[(u64, usize, usize)], cap: usize, page: usize, granule: usize) -> Plan {
    let mut p = Plan::default();
    // The buffer being filled: its index and bytes used.
    let mut cur: Option<(usize, usize)> = None;
    let mut run: Option<Run> = None;
    let new_buffer = |p: &mut Plan| {
        p.sizes.push(0);
        p.sizes.len() - 1
    };
    for &(f, len, align) in tensors {
        let in_page = (f % page as u64) as usize;
        if len + in_page > cap {
            // A buffer of its own, at the file's offset within a page so the
            // read stays congruent for direct I/O (and aligned if the file
            // offset is).
            p.close(&mut run);
            let off = if (f as usize) % align == 0 {
                in_page
            } else {
                0
            };
            let b = new_buffer(&mut p);
            p.sizes[b] = off + len;
            p.reads.push(Planned {
                buf: b,
                buf_off: off,
                file_off: f,
                len,
            });
            p.places.push((b, off));
            continue;
        }
        let aligned = f % align as u64 == 0;
        // Extend the run when this tensor follows it in the file and fits.
        if let (true, Some(r), Some((b, used))) = (aligned, run.as_mut(), cur.as_mut()) {
            if r.file_off + r.len as u64 == f && r.buf_off + r.len + len <= cap {
                let off = r.buf_off + r.len;
                r.len += len;
                *used = (*used).max(off + len);
                p.sizes[*b] = p.sizes[*b].max(off + len);
                p.places.push((*b, off));
                continue;
            }
        }
        p.close(&mut run);
        // A new place in the current buffer, or a new buffer.
        let want = |used: usize| {
            if aligned {
                round_up(used, page) + in_page
            } else {
                round_up(used, align)
            }
        };
        let (b, off) = match cur {
            Some((b, used)) if want(used) + len <= cap => (b, want(used)),
            _ => {
                let b = new_buffer(&mut p);
                (b, want(0))
            }
        };
        cur = Some((b, off + len));
        if aligned {
            run = Some(Run {
                buf: b,
                buf_off: off,
                file_off: f,
                len,
            });
        } else if len > 0 {
            p.reads.push(Planned {
                buf: b,
                buf_off: off,
                file_off: f,
                len,
            });
        }
        p.places.push((b, off));
        if let Some((b, used)) = cur {
            p.sizes[b] = p.sizes[b].max(used);
        }
    }
    p.close(&mut run);
    if let Some((b, used)) = cur {
        p.sizes[b] = p.sizes[b].max(used);
    }
    for s in &mut p.sizes {
        *s = round_up((*s).max(1), granule);
    }
    // Reads in buffer order, so the loader can start on each buffer as soon
    // as it is allocated.
    p.reads.sort_by_key(|r| (r.buf, r.buf_off));
    p
}

/// What is wrong with plan `p` of `list` (cap `cap`, page `page`), if
/// anything: every tensor whole in its buffer at its alignment, no buffer
/// over the cap unless one tensor alone needs more, exactly one read
/// bringing each tensor to its place, no two reads overlapping.
fn plan_violation(
    list: &[(u64, usize, usize)],
    cap: usize,
    page: usize,
    p: &Plan,
) -> std::result::Result<(), String> {
    if p.places.len() != list.len() {
        return Err(format!(
            "{} places for {} tensors",
            p.places.len(),
            list.len()
        ));
    }
    for (i, (&(f, len, align), &(b, off))) in list.iter().zip(&p.places).enumerate() {
        let Some(&size) = p.sizes.get(b) else {
            return Err(format!("tensor {i} in buffer {b} of {}", p.sizes.len()));
        };
        if off % align != 0 {
            return Err(format!(
                "tensor {i} misaligned: offset {off}, align {align}"
            ));
        }
        if off + len > size {
            return Err(format!("tensor {i} outside its buffer"));
        }
        if len + (f as usize % page) <= cap && size > cap {
            return Err(format!("buffer {b} over the cap"));
        }
        // Exactly one read covers the tensor, at the matching place.
        if len > 0 {
            let covering: Vec<_> = p
                .reads
                .iter()
                .filter(|r| r.file_off <= f && f + len as u64 <= r.file_off + r.len as u64)
                .collect();
            let [r] = covering[..] else {
                return Err(format!("tensor {i}: reads {covering:?}"));
            };
            if r.buf != b || r.buf_off + (f - r.file_off) as usize != off {
                return Err(format!("tensor {i} at ({b}, {off}) but read by {r:?}"));
            }
        }
    }
    // No two reads overlap in a buffer, nor run past it.
    for (i, a) in p.reads.iter().enumerate() {
        if p.sizes.get(a.buf).is_none_or(|&s| a.buf_off + a.len > s) {
            return Err(format!("{a:?} outside its buffer"));
        }
        for c in &p.reads[i + 1..] {
            if a.buf == c.buf && a.buf_off + a.len > c.buf_off && c.buf_off + c.len > a.buf_off {
                return Err(format!("{a:?} overlaps {c:?}"));
            }
        }
    }
    Ok(())
}

/// For the `safetensors_header` fuzz target (`crates/heap/fuzz`): takes
/// `file` as a whole safetensors file, validates its header as the loader
/// does and plans it into buffers of `cap_pages` 4 KiB pages (at least
/// one); returns the tensor count, or the header's refusal. Panics if an
/// accepted header yields a tensor outside the data, tensors sharing
/// bytes, or a plan that breaks its invariants.
#[doc(hidden)]
pub fn fuzz_safetensors(file: &[u8], cap_pages: usize) -> Result<usize> {
    const PAGE: usize = 4096;
    let size = file.len() as u64;
    let header = parse_header(
        |buf, off| {
            let at = usize::try_from(off).unwrap_or(usize::MAX);
            let src = at
                .checked_add(buf.len())
                .and_then(|end| file.get(at..end))
                .ok_or(std::io::ErrorKind::UnexpectedEof)?;
            buf.copy_from_slice(src);
            Ok(())
        },
        Path::new("fuzz-input.safetensors"),
        size,
    )?;
    let list = header.spans();
    let mut end = header.data_start;
    for (i, &(f, len, _)) in list.iter().enumerate() {
        assert!(
            f >= end,
            "tensor {i} overlaps the one before it or the header"
        );
        end = f + len as u64;
        assert!(end <= size, "tensor {i} runs past the file");
    }
    let cap = cap_pages.max(1) * PAGE;
    let p = plan(&list, cap, PAGE, PAGE);
    if let Err(e) = plan_violation(&list, cap, PAGE, &p) {
        panic!("plan of an accepted header: {e}");
    }
    Ok(list.len())
}

/// Loads the safetensors file at `path` into buffers from `heap`: every
/// tensor whole in one buffer at its dtype's alignment (when its offset in
/// the file allows one read for a run of tensors; otherwise it is still
/// aligned, with a read of its own), buffers of at most `opts.buffer_size`
/// bytes except for a tensor larger than that, which gets its own. The
/// buffers are filled with `opts.method`'s engine, allocation overlapped
/// with the reads.
///
/// # Errors
/// [`Error::Safetensors`] for a malformed or hostile header (huge length,
/// bad JSON, unknown dtype, overlapping or out-of-file offsets, sizes that
/// disagree with the shape), the file errors of [`crate::load`],
/// [`Error::BadSize`] for a buffer size that is not a page multiple,
/// [`Error::OutOfMemory`] / [`Error::TooManyBuffers`] when the plan cannot
/// fit, and any allocation or transfer error.
pub fn load_safetensors(
    path: &Path,
    heap: &dyn Heap,
    opts: &LoadOptions,
    progress: &mut dyn FnMut(&Progress),
) -> Result<Tensors> {
    let start = Instant::now();
    let page = opts.checked_page()?;
    let file = IoFile::open(path)?;
    let size = file.size()?;
    let header = {
        let f = std::fs::File::from(
            file.fd()
                .try_clone_to_owned()
                .map_err(|e| Error::sys("dup", e))?,
        );
        read_header(&f, path, size)?
    };
    let granule = heap.granule().max(page);
    let cap = round_up(opts.buffer_size, granule);
    let list = header.spans();
    let p = plan(&list, cap, page, granule);
    let needed: u64 = p.sizes.iter().map(|&s| s as u64).sum();
    if let Some((available, what)) = heap.available() {
        if needed > available {
            return Err(Error::OutOfMemory {
                needed,
                available,
                what,
            });
        }
    }
    let room = crate::limits::buffer_room(p.sizes.len());
    if p.sizes.len() as u64 > room.buffers {
        let per = needed.div_ceil(room.buffers.max(1));
        return Err(Error::TooManyBuffers {
            buffers: p.sizes.len() as u64,
            buffer_size: cap,
            room: room.buffers,
            what: room.what,
            min_buffer_size: (per.div_ceil(granule as u64)) * granule as u64,
        });
    }
    let (buffers, mut stats) = fill(&file, heap, &p.sizes, &p.reads, opts, progress)?;
    stats.buffer_size = cap;
    stats.elapsed = start.elapsed();
    let tensors = header
        .tensors
        .into_iter()
        .zip(&p.places)
        .zip(&list)
        .map(|(((name, info), &(b, off)), &(f, len, _))| {
            let t = Tensor {
                buffer: buffers[b].clone(),
                buffer_index: b,
                offset: off,
                len,
                dtype: info.dtype,
                shape: info.shape,
                file_offset: f,
            };
            (name, t)
        })
        .collect();
    Ok(Tensors {
        tensors,
        buffers,
        metadata: header.metadata,
        stats,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn check(list: &[(u64, usize, usize)], cap: usize, p: &Plan) {
        if let Err(e) = plan_violation(list, cap, 4096, p) {
            panic!("{e}");
        }
    }

    proptest! {
        #[test]
        fn every_tensor_whole_aligned_and_read_once(
            tensors in proptest::collection::vec((0usize..300_000, 0u32..4), 0..40),
            start in 8u64..10_000,
            cap_pages in 1usize..64,
        ) {
            let cap = cap_pages * 4096;
            let mut f = start;
            let list: Vec<_> = tensors
                .iter()
                .map(|&(len, a)| {
                    let align = 1usize << a;
                    let len = len / align * align;
                    let t = (f, len, align);
                    f += len as u64;
                    t
                })
                .collect();
            let p = plan(&list, cap, 4096, 4096);
            check(&list, cap, &p);
        }
    }

    #[test]
    fn the_fuzz_seeds_are_what_their_names_say() {
        // crates/heap/fuzz/seeds.py writes them: one byte of buffer pages,
        // then a whole file, as the fuzz target reads them.
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus/safetensors_header");
        let verdict = |name: &str| {
            let b = std::fs::read(dir.join(name)).unwrap();
            fuzz_safetensors(&b[1..], usize::from(b[0] % 64) + 1)
        };
        for (name, tensors) in [
            ("mixed", 4),
            ("aligned-header", 2),
            ("big-over-cap", 3),
            ("empty", 0),
            ("zero-size", 2),
        ] {
            assert_eq!(verdict(name).unwrap(), tensors, "{name}");
        }
        for name in [
            "overlap",
            "past-end",
            "huge-length",
            "shape-mismatch",
            "unknown-dtype",
            "short",
        ] {
            let r = verdict(name);
            assert!(matches!(r, Err(Error::Safetensors { .. })), "{name}: {r:?}");
        }
    }

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

    #[test]
    fn contiguous_aligned_tensors_are_one_read_per_buffer() {
        // Three F32 tensors of 1000 elements from an 8-aligned data start.
        let list = [(80u64, 4000, 4), (4080, 4000, 4), (8080, 4000, 4)];
        let p = plan(&list, 1 << 20, 4096, 4096);
        check(&list, 1 << 20, &p);
        assert_eq!(p.sizes, vec![12288]);
        assert_eq!(
            p.reads,
            vec![Planned {
                buf: 0,
                buf_off: 80,
                file_off: 80,
                len: 12000
            }]
        );
        // A tensor over the cap gets a buffer of its own.
        let list = [(80u64, 100, 1), (180, 9000, 4), (9180, 4, 4)];
        let p = plan(&list, 8192, 4096, 4096);
        check(&list, 8192, &p);
        assert_eq!(p.sizes.len(), 2);
        assert_eq!(p.places[1].0, 1);
        assert_eq!(p.places[2].0, 0);
    }
}
