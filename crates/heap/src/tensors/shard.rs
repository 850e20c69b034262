//! One safetensors file of a checkpoint: opened and its header checked,
//! planned into buffers, filled through the engines, and checked
//! unchanged afterwards.

use std::path::{Path, PathBuf};

use super::header::{read_header, Header};
use super::plan::{plan, round_up, Plan};
use crate::file::IoFile;
use crate::loader::fill;
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

/// A shard opened, its header read and checked, its load planned.
#[derive(Debug)]
pub(super) struct OpenShard {
    pub path: PathBuf,
    pub file: IoFile,
    pub header: Header,
    /// Each tensor's (file offset, length, alignment), in file order.
    pub spans: Vec<(u64, usize, usize)>,
    pub plan: Plan,
    /// Buffer size cap the plan was made with.
    pub cap: usize,
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
            let f = std::fs::File::from(
                file.fd()
                    .try_clone_to_owned()
                    .map_err(|e| Error::sys("dup", e))?,
            );
            read_header(&f, path, size)?
        };
        let granule = heap.granule().max(page);
        let cap = round_up(opts.buffer_size, granule);
        let spans = header.spans();
        let plan = plan(&spans, cap, page, granule);
        Ok(OpenShard {
            path: path.to_path_buf(),
            file,
            header,
            spans,
            plan,
            cap,
            stamp,
        })
    }

    /// Bytes of buffers the plan allocates.
    pub fn needed(&self) -> u64 {
        self.plan.sizes.iter().map(|&s| s as u64).sum()
    }

    /// Allocates the planned buffers from `heap` and runs the planned
    /// reads into them; `progress` after each read.
    ///
    /// # Errors
    /// Any allocation or transfer error.
    pub fn fill(
        &self,
        heap: &dyn Heap,
        opts: &LoadOptions,
        progress: &mut dyn FnMut(&Progress),
    ) -> Result<(Vec<Buffer>, LoadStats)> {
        // A shard of many small tensors is read buffered under `auto`.
        let bytes = self.plan.reads.iter().map(|r| r.len as u64).sum();
        let opts = crate::choose::for_reads(opts, self.plan.reads.len(), bytes);
        let (buffers, mut stats) = fill(
            &self.file,
            heap,
            &self.plan.sizes,
            &self.plan.reads,
            &opts,
            progress,
        )?;
        stats.buffer_size = self.cap;
        Ok((buffers, stats))
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
