//! The image every row reads and writes: in RAM when it fits, fully
//! allocated before the first run.

use std::path::{Path, PathBuf};

use crate::{Error, Result};

/// `/dev/shm` if it is a tmpfs with room for `size` bytes and the machine
/// has that much memory available with 2 GiB to spare.
#[allow(clippy::unnecessary_cast)] // statfs field types differ by target
pub(super) fn ram_dir(size: u64) -> Option<PathBuf> {
    let dir = PathBuf::from("/dev/shm");
    let st = rustix::fs::statfs(&dir).ok()?;
    let free = st.f_bavail as u64 * st.f_bsize as u64;
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    let avail_kib: u64 = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemAvailable:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    let spare = 2u64 << 30;
    (ram_backed(&dir) && free >= size + spare && avail_kib * 1024 >= size + spare).then_some(dir)
}

/// Whether `path` lies on a tmpfs.
#[allow(clippy::unnecessary_cast)] // statfs field types differ by target
pub(super) fn ram_backed(path: &Path) -> bool {
    rustix::fs::statfs(path).is_ok_and(|st| st.f_type as i64 == crate::TMPFS_MAGIC)
}

/// Creates (or reuses) a fully allocated image of `size` bytes.
pub(super) fn make_image(path: &Path, size: u64) -> Result<()> {
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .map_err(Error::io(path))?;
    // Allocate every block up front so no run pays for allocation.
    rustix::fs::fallocate(&f, rustix::fs::FallocateFlags::empty(), 0, size).map_err(|e| {
        Error::Io {
            path: path.to_path_buf(),
            source: e.into(),
        }
    })?;
    Ok(())
}
