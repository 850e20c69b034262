//! What the machine lets the loader allocate: memory (`MemAvailable`, the
//! memory cgroup's `memory.max`, the hugetlb pool) and how many buffers may
//! exist at once (each is an open file and a mapping).

use std::path::{Path, PathBuf};

use iopath_sys::limits::meminfo;

/// Memory that may be allocated now, and where the figure comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Available {
    /// Bytes.
    pub bytes: u64,
    /// What limits it (for the error message).
    pub what: &'static str,
}

/// Room left under this process's memory cgroup (v2) and its ancestors:
/// the least `memory.max - memory.current` on the way to the root.
fn cgroup_room() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let rel = text.lines().find_map(|l| l.strip_prefix("0::"))?;
    let mut dir = PathBuf::from("/sys/fs/cgroup").join(rel.trim_start_matches('/'));
    let root = Path::new("/sys/fs/cgroup");
    let mut room: Option<u64> = None;
    loop {
        let read = |f: &str| std::fs::read_to_string(dir.join(f)).ok();
        if let (Some(max), Some(cur)) = (read("memory.max"), read("memory.current")) {
            if let (Ok(max), Ok(cur)) = (max.trim().parse::<u64>(), cur.trim().parse::<u64>()) {
                let r = max.saturating_sub(cur);
                room = Some(room.map_or(r, |x| x.min(r)));
            }
        }
        if dir == root || !dir.pop() || !dir.starts_with(root) {
            break;
        }
    }
    room
}

/// Ordinary memory that can be allocated now: the smaller of
/// `MemAvailable` and the memory cgroup's room. `None` when neither can be
/// read (then nothing is refused up front).
pub(crate) fn available_memory() -> Option<Available> {
    let sys = meminfo("MemAvailable").map(|bytes| Available {
        bytes,
        what: "MemAvailable in /proc/meminfo",
    });
    let cg = cgroup_room().map(|bytes| Available {
        bytes,
        what: "room under the memory cgroup's memory.max",
    });
    match (sys, cg) {
        (Some(a), Some(b)) => Some(if b.bytes < a.bytes { b } else { a }),
        (a, b) => a.or(b),
    }
}

/// Free pages of the hugetlb pool, in bytes.
pub(crate) fn available_hugetlb() -> Option<Available> {
    let free = meminfo("HugePages_Free")?;
    let size = meminfo("Hugepagesize")?;
    Some(Available {
        bytes: free.saturating_mul(size),
        what: "free pages of the hugetlb pool (HugePages_Free)",
    })
}

/// How many more buffers may exist at once: each holds an open file
/// (`RLIMIT_NOFILE`) and a mapping (`vm.max_map_count`). Raises the soft
/// open-file limit to the hard one first ([`iopath_sys::raise_fd_limit`])
/// when `want` would not fit under it. Keeps a margin for the files and
/// mappings everything else needs.
pub(crate) fn buffer_room(want: usize) -> Room {
    const MARGIN: u64 = 64;
    let open = iopath_sys::limits::open_fds();
    let need = open + want as u64 + MARGIN;
    let mut limit = iopath_sys::limits::fd_limit();
    if limit < need {
        let raised = iopath_sys::raise_fd_limit(None);
        if raised != limit {
            tracing::debug!("raised the open-file limit to {raised}");
        }
        limit = raised;
    }
    let files = match limit {
        u64::MAX => u64::MAX,
        cur => cur.saturating_sub(open + MARGIN),
    };
    let max_maps = std::fs::read_to_string("/proc/sys/vm/max_map_count")
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok());
    let maps = max_maps.map_or(u64::MAX, |max| {
        let now = std::fs::read_to_string("/proc/self/maps").map_or(0, |m| m.lines().count());
        max.saturating_sub(now as u64 + MARGIN)
    });
    if files <= maps {
        Room {
            buffers: files,
            what: "open files (RLIMIT_NOFILE, ulimit -n)",
            fix: "raise the open-file limit (ulimit -n; past the hard limit as root: \
                  ulimit -Hn, LimitNOFILE= of a systemd unit, nofile in \
                  /etc/security/limits.conf)",
        }
    } else {
        Room {
            buffers: maps,
            what: "mappings (vm.max_map_count)",
            fix: "raise the mapping limit (sysctl -w vm.max_map_count=N, as root)",
        }
    }
}

/// How many buffers may be made, and what limits it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Room {
    /// Buffers.
    pub buffers: u64,
    /// The limit.
    pub what: &'static str,
    /// How to raise it.
    pub fix: &'static str,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_machine_reports_memory_and_room() {
        let a = available_memory().expect("/proc/meminfo is readable here");
        assert!(a.bytes > 0, "{a:?}");
        let r = buffer_room(10);
        assert!(r.buffers >= 10, "{r:?}");
    }
}
