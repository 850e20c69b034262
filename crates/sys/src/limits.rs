//! The open-file limit (`RLIMIT_NOFILE`), raised where one process holds an
//! fd per buffer, endpoint or connection (see getrlimit(2)), and the
//! machine's memory as `/proc/meminfo` tells it.

use rustix::process::{getrlimit, setrlimit, Resource};

/// Raises this process's soft open-file limit to at least `want` (never
/// past the hard limit; `None`: up to the hard limit), and returns the soft
/// limit now (`u64::MAX` for unlimited). A limit already high enough is
/// left as it is; a refused raise leaves it as it was.
pub fn raise_fd_limit(want: Option<u64>) -> u64 {
    let mut r = getrlimit(Resource::Nofile);
    let cur = r.current.unwrap_or(u64::MAX);
    let goal = match (want, r.maximum) {
        (Some(w), Some(max)) => w.min(max),
        (Some(w), None) => w,
        (None, max) => max.unwrap_or(u64::MAX),
    };
    if cur >= goal {
        return cur;
    }
    r.current = if goal == u64::MAX { None } else { Some(goal) };
    let _ = setrlimit(Resource::Nofile, r);
    getrlimit(Resource::Nofile).current.unwrap_or(u64::MAX)
}

/// The soft open-file limit now (`u64::MAX` for unlimited).
pub fn fd_limit() -> u64 {
    getrlimit(Resource::Nofile).current.unwrap_or(u64::MAX)
}

/// The files this process has open now (its entries in `/proc/self/fd`).
pub fn open_fds() -> u64 {
    std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count() as u64)
}

/// One `Key: N kB` field of `/proc/meminfo`, in bytes (or the bare count for
/// fields without a unit, such as `HugePages_Free`).
pub fn meminfo(key: &str) -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    text.lines().find_map(|l| {
        let rest = l.strip_prefix(key)?.strip_prefix(':')?.trim();
        let mut it = rest.split_whitespace();
        let n: u64 = it.next()?.parse().ok()?;
        Some(match it.next() {
            Some("kB") => n.saturating_mul(1024),
            _ => n,
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raises_to_what_is_asked_and_no_further() {
        // Runs in a child so the test process keeps its limit.
        if std::env::var_os("IOPATH_SYS_LIMITS_CHILD").is_none() {
            let out = std::process::Command::new(std::env::current_exe().unwrap())
                .args([
                    "--exact",
                    "limits::tests::raises_to_what_is_asked_and_no_further",
                ])
                .args(["--nocapture", "--test-threads=1"])
                .env("IOPATH_SYS_LIMITS_CHILD", "1")
                .output()
                .unwrap();
            assert!(out.status.success(), "{out:?}");
            let s = String::from_utf8_lossy(&out.stdout);
            assert!(s.contains("1 passed"), "{s}");
            return;
        }
        let hard = getrlimit(Resource::Nofile).maximum.unwrap_or(u64::MAX);
        let low = 256.min(hard);
        setrlimit(
            Resource::Nofile,
            rustix::process::Rlimit {
                current: Some(low),
                maximum: Some(hard),
            },
        )
        .unwrap();
        assert_eq!(fd_limit(), low);
        // Already enough: unchanged.
        assert_eq!(raise_fd_limit(Some(100)), low);
        let want = 300.min(hard);
        assert_eq!(raise_fd_limit(Some(want)), want);
        assert_eq!(fd_limit(), want);
        assert_eq!(raise_fd_limit(None), hard);
        assert!(open_fds() >= 3);
    }

    #[test]
    fn meminfo_reads_bytes_and_bare_counts() {
        let total = meminfo("MemTotal").unwrap();
        assert!(total >= 1 << 20 && total % 1024 == 0, "{total}");
        // A field without a unit is a count, not KiB.
        assert!(meminfo("HugePages_Total").unwrap() < total / 1024);
        assert_eq!(meminfo("MemTot"), None);
    }
}
