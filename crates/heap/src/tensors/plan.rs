//! The plan of a safetensors load: which buffer and offset each tensor
//! gets, and the reads that bring it there.
//!
//! Consecutive tensors go into one buffer as one contiguous *run* at the
//! same offsets modulo a page as in the file, so a whole run is one read
//! through the engines (direct I/O, io_uring fixed buffers) and every
//! tensor whose file offset is aligned for its dtype is aligned in memory
//! too; a tensor that is not aligned in the file gets an aligned place and
//! a read of its own; a tensor larger than the buffer size gets a buffer of
//! its own.

use std::path::Path;

use super::header::parse_header;
use crate::loader::Planned;
use crate::Result;

/// The plan: buffer sizes, the reads, and each tensor's place.
#[derive(Debug, Default)]
pub(super) struct Plan {
    /// Buffer sizes.
    pub sizes: Vec<usize>,
    /// The reads, in buffer order.
    pub reads: Vec<Planned>,
    /// (buffer, offset) per tensor, in header order.
    pub places: Vec<(usize, usize)>,
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

pub(super) fn round_up(x: usize, to: usize) -> usize {
    x.div_ceil(to) * to
}

/// Plans `tensors` (file order; `(file offset, len, align)`) into buffers of
/// at most `cap` bytes (a multiple of `page`), sizes rounded up to
/// `granule`.
pub(super) fn plan(
    tensors: &[(u64, usize, usize)],
    cap: usize,
    page: usize,
    granule: usize,
) -> Plan {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Error;
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
