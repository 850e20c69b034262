//! The limit that needs no peer, measured in place of fio when fio is
//! missing: plain O_DIRECT `pread`/`pwrite` of the same file, fio's job's
//! `iodepth` requests in flight (one thread each).

use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::time::Instant;

use crate::error::invalid;
use crate::fio::Job;
use crate::{Error, Result};

/// Alignment of the buffers (O_DIRECT needs the logical block size; a
/// page is enough everywhere).
const ALIGN: usize = 4096;

/// What fio's `job` does, as plain O_DIRECT I/O, for the limit row's
/// note.
pub(crate) fn describe(job: &Job) -> String {
    format!(
        "plain O_DIRECT {} of {}, bs={} with {} in flight (one thread each), no peer",
        if job.write { "pwrite" } else { "pread" },
        job.path.display(),
        iopath_sys::format_size(job.bs),
        job.iodepth
    )
}

/// One pass of fio's `job` as plain O_DIRECT I/O: `bytes` from offset 0
/// read, or written (zeros), in requests of `bs` bytes (a multiple of
/// 512), `iodepth` in flight; GiB/s over its wall time.
pub(crate) fn run(job: &Job) -> Result<f64> {
    if job.bs == 0 || job.bs % 512 != 0 {
        invalid!("--bs", "{} is not a positive multiple of 512", job.bs);
    }
    if job.iodepth == 0 {
        invalid!("--queue-depth", "give at least 1");
    }
    let file = open(&job.path, job.write).map_err(Error::io(&job.path))?;
    let blocks = job.bytes.div_ceil(job.bs);
    let t = Instant::now();
    std::thread::scope(|s| -> Result<()> {
        let file = &file;
        let workers: Vec<_> = (0..u64::from(job.iodepth))
            .map(|k| s.spawn(move || worker(job, file, k, blocks)))
            .collect();
        let panicked = |_| Error::Check("a direct-I/O thread panicked".into());
        workers
            .into_iter()
            .try_for_each(|w| w.join().map_err(panicked)?)
    })?;
    let secs = t.elapsed().as_secs_f64().max(1e-9);
    Ok(job.bytes as f64 / secs / f64::from(1u32 << 30))
}

/// Blocks `k`, `k + iodepth`, ... of the pass.
fn worker(job: &Job, file: &File, k: u64, blocks: u64) -> Result<()> {
    let mut aligned = iopath_heap::AlignedBuf::new(job.bs as usize, ALIGN)
        .map_err(Error::layer("direct-I/O buffer"))?;
    let buf = aligned.as_mut_slice();
    for b in (k..blocks).step_by(job.iodepth as usize) {
        let off = b * job.bs;
        let len = (job.bytes - off).min(job.bs) as usize;
        // O_DIRECT needs whole blocks: a short tail is rounded up.
        let len = len.next_multiple_of(512).min(buf.len());
        let r = if job.write {
            file.write_all_at(&buf[..len], off)
        } else {
            file.read_exact_at(&mut buf[..len], off)
        };
        r.map_err(Error::io(&job.path))?;
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
        let mut job = Job::new(true, &p, 1 << 20, 64 << 10, 3);
        assert!(run(&job).unwrap() > 0.0);
        // Every block was written (zeros over the sevens).
        assert!(std::fs::read(&p).unwrap().iter().all(|&b| b == 0));
        job.write = false;
        assert!(run(&job).unwrap() > 0.0);
        job.bs = 1000;
        let refused = run(&job);
        assert!(
            matches!(refused, Err(Error::Invalid { option: "--bs", .. })),
            "{refused:?}"
        );
    }
}
