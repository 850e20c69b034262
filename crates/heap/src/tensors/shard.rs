//! One safetensors file of a checkpoint: opened and its header checked,
//! planned into buffers (the tensors the page cache holds mapped instead,
//! with [`LoadOptions::map_cached`]), filled through the engines, and
//! checked unchanged afterwards.

use std::path::{Path, PathBuf};
use std::sync::{mpsc, Arc};

use super::header::{read_header, Header};
use super::map::{cached_spans, map_file, populate_spans};
use super::plan::{plan, round_up, Plan};
use crate::engine::{new_engine_sharing, SharedChoice};
use crate::file::IoFile;
use crate::loader::{fill_from, Allocated};
use crate::{Buffer, Error, Heap, LoadOptions, LoadStats, Progress, Result};

/// What identifies a file's contents cheaply: if any of it moved between
/// the open and the end of the load, the file was written, truncated or
/// replaced in between.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Stamp {
    dev: u64,
    ino: u64,
    size: i64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

impl Stamp {
    fn of(st: &rustix::fs::Stat) -> Self {
        Stamp {
            dev: st.st_dev,
            ino: st.st_ino,
            size: st.st_size,
            mtime: (st.st_mtime, st.st_mtime_nsec as i64),
            ctime: (st.st_ctime, st.st_ctime_nsec as i64),
        }
    }
}

/// What a shard whose every tensor is mapped (or empty) reads: nothing.
fn nothing_read(method: crate::Method) -> LoadStats {
    LoadStats {
        bytes: 0,
        buffers: 0,
        buffer_size: 0,
        alloc_time: std::time::Duration::ZERO,
        read_time: std::time::Duration::ZERO,
        elapsed: std::time::Duration::ZERO,
        method,
        fallbacks: 0,
        from_cache: 0,
        probe: None,
        mapped: 0,
        populate: None,
    }
}

/// A shard opened, its header read and checked, its load planned.
/// The file's buffer `map` makes, or `None` when the kernel refuses to
/// map the file (`ENODEV`: a file system without `mmap`): then nothing in
/// `mapped` is, and those tensors are read like the others.
///
/// # Errors
/// Any other failure of `map`.
fn map_or_read(
    mapped: &mut [bool],
    map: impl FnOnce() -> Result<Buffer>,
    path: &Path,
) -> Result<Option<Buffer>> {
    match map() {
        Ok(b) => Ok(Some(b)),
        Err(Error::Sys { op: "mmap", source }) if source.raw_os_error() == Some(libc::ENODEV) => {
            tracing::info!(
                "{}: the file system does not map files ({source}); its tensors are read",
                crate::error::shown(path)
            );
            mapped.fill(false);
            Ok(None)
        }
        Err(e) => Err(e),
    }
}

#[derive(Debug)]
pub(super) struct OpenShard {
    pub path: PathBuf,
    pub file: IoFile,
    pub header: Header,
    /// Each tensor's (file offset, length, alignment), in file order.
    pub spans: Vec<(u64, usize, usize)>,
    /// Per tensor (file order): whether it is a view of the file rather
    /// than planned (all false without [`LoadOptions::map_cached`]).
    pub mapped: Vec<bool>,
    /// The plan of the tensors not mapped, in file order.
    pub plan: Plan,
    /// Buffer size cap the plan was made with.
    pub cap: usize,
    /// The file mapped, when a tensor is a view of it.
    file_buf: Option<Buffer>,
    stamp: Stamp,
}

impl OpenShard {
    /// Opens `path`, reads and checks its header, and plans it into buffers
    /// of at most `opts.buffer_size` bytes from `heap`.
    ///
    /// # Errors
    /// [`Error::Open`]/[`Error::NotAFile`], [`Error::Safetensors`] for a
    /// refused header, [`Error::Sys`] if the file cannot be inspected.
    pub fn open(path: &Path, heap: &dyn Heap, opts: &LoadOptions, page: usize) -> Result<Self> {
        let file = IoFile::open(path)?;
        let st = rustix::fs::fstat(file.fd()).map_err(|e| Error::sys("fstat", e))?;
        let stamp = Stamp::of(&st);
        let size = file.size()?;
        let header = {
            // A description of its own (the same inode, through /proc) with
            // readahead off: the header's pages alone enter the page cache,
            // not the tensors after them (read_ahead_kb can be megabytes),
            // which would then count as cached.
            let f = std::fs::File::open(format!(
                "/proc/self/fd/{}",
                std::os::fd::AsRawFd::as_raw_fd(&file.fd())
            ))
            .map_err(|source| Error::Open {
                path: path.to_path_buf(),
                source,
            })?;
            let _ = rustix::fs::fadvise(&f, 0, None, rustix::fs::Advice::Random);
            read_header(&f, path, size)?
        };
        let granule = heap.granule().max(page);
        let cap = round_up(opts.buffer_size, granule);
        let spans = header.spans();
        let mut mapped = if opts.map_cached {
            cached_spans(&file, &spans)?
        } else {
            vec![false; spans.len()]
        };
        // Mapped now, so a file the kernel will not map is read instead.
        let file_buf = if mapped.contains(&true) {
            map_or_read(&mut mapped, || map_file(&file, size), path)?
        } else {
            None
        };
        let rest: Vec<_> = spans
            .iter()
            .zip(&mapped)
            .filter(|(_, &m)| !m)
            .map(|(&s, _)| s)
            .collect();
        let plan = plan(&rest, cap, page, granule);
        Ok(OpenShard {
            path: path.to_path_buf(),
            file,
            header,
            spans,
            mapped,
            plan,
            cap,
            file_buf,
            stamp,
        })
    }

    /// Bytes of buffers the plan allocates.
    pub fn needed(&self) -> u64 {
        self.plan.sizes.iter().map(|&s| s as u64).sum()
    }

    /// Runs the planned reads into the planned buffers as they arrive on
    /// `rx` (allocated by the checkpoint's allocator threads), `progress`
    /// after each read; meanwhile, on a thread of its own, maps the file
    /// and makes the mapped tensors' pages resident. Under `auto` the
    /// engine measures once with the other shards' (`choice`). The file's
    /// buffer, when any tensor is mapped, comes last.
    ///
    /// # Errors
    /// Any allocation, transfer or mapping error.
    pub fn fill_from(
        &self,
        opts: &LoadOptions,
        choice: &Arc<SharedChoice>,
        rx: &mpsc::Receiver<Allocated>,
        progress: &mut dyn FnMut(&Progress),
    ) -> Result<(Vec<Buffer>, LoadStats)> {
        // A shard of many small tensors is read buffered under `auto`.
        let bytes = self.plan.reads.iter().map(|r| r.len as u64).sum();
        let opts = crate::choose::for_reads(opts, self.plan.reads.len(), bytes);
        let mapped: u64 = self
            .spans
            .iter()
            .zip(&self.mapped)
            .filter(|(_, &m)| m)
            .map(|(s, _)| s.1 as u64)
            .sum();
        let (filled, file_buf) = std::thread::scope(|s| {
            let mapper = self.file_buf.as_ref().map(|b| {
                s.spawn(|| populate_spans(b, &self.spans, &self.mapped).map(|()| b.clone()))
            });
            let filled = if self.plan.reads.is_empty() && self.plan.sizes.is_empty() {
                Ok((Vec::new(), nothing_read(opts.method)))
            } else {
                new_engine_sharing(opts.method, opts.engine, Some(choice.clone())).and_then(
                    |engine| {
                        fill_from(
                            &self.file,
                            engine.as_ref(),
                            self.plan.sizes.len(),
                            &self.plan.reads,
                            rx,
                            progress,
                        )
                    },
                )
            };
            let file_buf = mapper.map(|m| {
                m.join()
                    .unwrap_or_else(|_| Err(Error::Loader("the mapping thread panicked".into())))
            });
            (filled, file_buf)
        });
        let (mut buffers, mut stats) = filled?;
        if let Some(b) = file_buf {
            let b = b?;
            stats.populate = Some(b.populate_read_how());
            stats.mapped = mapped;
            buffers.push(b);
        }
        stats.buffer_size = self.cap;
        Ok((buffers, stats))
    }

    /// Index of the file's own buffer among those [`OpenShard::fill_from`]
    /// returns, when a tensor is mapped.
    pub fn file_buffer(&self) -> Option<usize> {
        self.mapped.contains(&true).then_some(self.plan.sizes.len())
    }

    /// Fails unless the file at the shard's path is still the one opened,
    /// with the same size, modification and change times.
    ///
    /// # Errors
    /// [`Error::Changed`] otherwise (the file gone included).
    pub fn check_unchanged(&self) -> Result<()> {
        let now = rustix::fs::stat(&self.path).map(|st| Stamp::of(&st));
        match now {
            Ok(s) if s == self.stamp => Ok(()),
            _ => Err(Error::Changed {
                path: self.path.clone(),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_the_kernel_will_not_map_is_read_instead() {
        let path = Path::new("model.safetensors");
        let refused = |errno: i32| {
            move || -> Result<Buffer> {
                Err(Error::sys("mmap", std::io::Error::from_raw_os_error(errno)))
            }
        };
        let mut mapped = vec![true, false, true];
        assert!(map_or_read(&mut mapped, refused(libc::ENODEV), path)
            .unwrap()
            .is_none());
        assert_eq!(mapped, [false, false, false]);
        // Any other failure is the load's.
        let mut mapped = vec![true];
        let e = map_or_read(&mut mapped, refused(libc::ENOMEM), path).unwrap_err();
        assert!(matches!(e, Error::Sys { op: "mmap", .. }), "{e:?}");
        assert_eq!(mapped, [true]);
    }
}
