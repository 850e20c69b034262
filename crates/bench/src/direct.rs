//! The limit that needs no peer, measured in place of fio when fio is
//! missing: plain O_DIRECT `pread`/`pwrite` of the same file, `depth`
//! requests in flight (one thread each).

use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::PathBuf;
use std::time::Instant;

use crate::error::invalid;
use crate::{Error, Result};

/// Alignment of the buffers (O_DIRECT needs the logical block size; a
/// page is enough everywhere).
const ALIGN: usize = 4096;

/// One pass of the peer-free limit: `bytes` from offset 0 read, or
/// written (zeros), in requests of `bs` bytes (a multiple of 512), `depth`
/// in flight.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DirectJob {
    pub write: bool,
    pub path: PathBuf,
    pub bytes: u64,
    pub bs: u64,
    pub depth: u32,
}

impl DirectJob {
    /// What it does, for the limit row's note.
    pub(crate) fn describe(&self) -> String {
        format!(
            "plain O_DIRECT {} of {}, bs={} with {} in flight (one thread each), no peer",
            if self.write { "pwrite" } else { "pread" },
            self.path.display(),
            iopath_sys::format_size(self.bs),
            self.depth
        )
    }

    /// Runs one pass; returns GiB/s over its wall time.
    pub(crate) fn run(&self) -> Result<f64> {
        if self.bs == 0 || self.bs % 512 != 0 {
            invalid!("--bs", "{} is not a positive multiple of 512", self.bs);
        }
        if self.depth == 0 {
            invalid!("--queue-depth", "give at least 1");
        }
        let file = open(&self.path, self.write).map_err(Error::io(&self.path))?;
        let blocks = self.bytes.div_ceil(self.bs);
        let t = Instant::now();
        std::thread::scope(|s| -> Result<()> {
            let file = &file;
            let workers: Vec<_> = (0..u64::from(self.depth))
                .map(|k| s.spawn(move || self.worker(file, k, blocks)))
                .collect();
            let panicked = |_| Error::Check("a direct-I/O thread panicked".into());
            workers
                .into_iter()
                .try_for_each(|w| w.join().map_err(panicked)?)
        })?;
        let secs = t.elapsed().as_secs_f64().max(1e-9);
        Ok(self.bytes as f64 / secs / f64::from(1u32 << 30))
    }

    /// Blocks `k`, `k + depth`, ... of the pass.
    fn worker(&self, file: &File, k: u64, blocks: u64) -> Result<()> {
        let mut aligned = iopath_heap::AlignedBuf::new(self.bs as usize, ALIGN)
            .map_err(Error::layer("direct-I/O buffer"))?;
        let buf = aligned.as_mut_slice();
        let mut b = k;
        while b < blocks {
            let off = b * self.bs;
            let len = (self.bytes - off).min(self.bs) as usize;
            // O_DIRECT needs whole blocks: a short tail is rounded up.
            let len = len.next_multiple_of(512).min(buf.len());
            let r = if self.write {
                file.write_all_at(&buf[..len], off)
            } else {
                read_full(file, &mut buf[..len], off)
            };
            r.map_err(Error::io(&self.path))?;
            b += u64::from(self.depth);
        }
        Ok(())
    }
}

/// Reads `buf.len()` bytes at `off` (fewer at the end of the file).
fn read_full(file: &File, buf: &mut [u8], off: u64) -> std::io::Result<()> {
    let mut done = 0;
    while done < buf.len() {
        match file.read_at(&mut buf[done..], off + done as u64)? {
            0 => break,
            n => done += n,
        }
    }
    Ok(())
}

/// `path` opened with O_DIRECT, for reading and (`write`) writing.
fn open(path: &std::path::Path, write: bool) -> std::io::Result<File> {
    let direct = rustix::fs::OFlags::DIRECT.bits() as i32;
    OpenOptions::new()
        .read(true)
        .write(write)
        .custom_flags(direct)
        .open(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_and_writes_the_whole_range() {
        let dir = tempfile::tempdir_in("/var/tmp").unwrap();
        let p = dir.path().join("f");
        std::fs::write(&p, vec![7u8; 1 << 20]).unwrap();
        if open(&p, false).is_err() {
            let why = "/var/tmp refuses O_DIRECT";
            return iopath_testkit::skip(iopath_testkit::Feature::DirectIo, why);
        }
        let mut job = DirectJob {
            write: true,
            path: p.clone(),
            bytes: 1 << 20,
            bs: 64 << 10,
            depth: 3,
        };
        assert!(job.run().unwrap() > 0.0);
        // Every block was written (zeros over the sevens).
        assert!(std::fs::read(&p).unwrap().iter().all(|&b| b == 0));
        job.write = false;
        assert!(job.run().unwrap() > 0.0);
        job.bs = 1000;
        let refused = job.run();
        assert!(
            matches!(refused, Err(Error::Invalid { option: "--bs", .. })),
            "{refused:?}"
        );
    }
}
