//! Skipping a test the machine cannot run: the features a test may need
//! and which of them this machine type has.

use std::fmt;
use std::panic::Location;

use crate::peers_required;
use crate::report::report;

/// Where `shmem_enabled` says whether memfd (shmem) memory gets
/// transparent huge pages.
const SHMEM_ENABLED: &str = "/sys/kernel/mm/transparent_hugepage/shmem_enabled";

/// Something a test needs from the kernel, the file systems or its
/// privileges, which a machine may lack.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Feature {
    /// io_uring: `io_uring_setup` allowed by the kernel and the sandbox.
    IoUring,
    /// `O_DIRECT` on the scratch file system, with a disk file system's
    /// alignment rules (it refuses unaligned requests).
    DirectIo,
    /// A scratch directory on a disk (not tmpfs) file system: cargo's
    /// target temporary directory or `/var/tmp`.
    DiskDir,
    /// `/dev/shm` on tmpfs.
    ShmTmpfs,
    /// Transparent huge pages for memfd memory.
    ShmemHugePages,
    /// `/dev/udmabuf`.
    Udmabuf,
    /// A dma-buf heap under `/dev/dma_heap`.
    DmaHeap,
    /// `cachestat(2)`: Linux 6.5 and later.
    Cachestat,
    /// Running as root: to mount a file system, or to act as another user.
    Root,
    /// A program or file that a Debian package brings (the package's name);
    /// `scripts/install-deps` installs it.
    Package(&'static str),
}

impl Feature {
    /// Whether the machine type the suite runs on under CI has this
    /// feature, so that its absence there is a broken set-up: io_uring,
    /// `O_DIRECT` on an ext4 scratch directory, tmpfs `/dev/shm`, root, the
    /// packages `scripts/install-deps` installs, and memfd huge pages where
    /// `shmem_enabled` allows them. It has no udmabuf and no dma-heap.
    pub fn expected_under_ci(self) -> bool {
        match self {
            Feature::IoUring
            | Feature::DirectIo
            | Feature::DiskDir
            | Feature::ShmTmpfs
            | Feature::Root
            | Feature::Package(_) => true,
            Feature::ShmemHugePages => {
                std::fs::read_to_string(SHMEM_ENABLED).is_ok_and(|s| shmem_allows_huge_pages(&s))
            }
            Feature::Udmabuf | Feature::DmaHeap => false,
            // The CI machine runs the kernel of this one: where that is 6.5
            // or later, it has the call.
            Feature::Cachestat => std::fs::read_to_string("/proc/sys/kernel/osrelease")
                .ok()
                .and_then(|r| kernel_version(r.trim()))
                .is_some_and(|v| v >= (6, 5)),
        }
    }
}

impl fmt::Display for Feature {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Feature::IoUring => f.write_str("io_uring"),
            Feature::DirectIo => f.write_str("O_DIRECT on the scratch file system"),
            Feature::DiskDir => f.write_str("a scratch directory on a disk file system"),
            Feature::ShmTmpfs => f.write_str("/dev/shm on tmpfs"),
            Feature::ShmemHugePages => f.write_str("memfd huge pages"),
            Feature::Udmabuf => f.write_str("/dev/udmabuf"),
            Feature::DmaHeap => f.write_str("a dma-buf heap"),
            Feature::Cachestat => f.write_str("cachestat(2) (Linux 6.5+)"),
            Feature::Root => f.write_str("root"),
            Feature::Package(p) => write!(f, "Debian package {p} (scripts/install-deps)"),
        }
    }
}

/// `(major, minor)` of a kernel release string such as `6.18.4-foo`.
fn kernel_version(release: &str) -> Option<(u32, u32)> {
    let mut parts = release.split(['.', '-']);
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    Some((major, minor))
}

/// Whether the `shmem_enabled` setting (the bracketed word of the file:
/// `always within_size advise [never] deny force`) gives memfd memory huge
/// pages, at least on `MADV_HUGEPAGE`.
fn shmem_allows_huge_pages(setting: &str) -> bool {
    setting
        .split_whitespace()
        .find_map(|w| w.strip_prefix('[')?.strip_suffix(']'))
        .is_some_and(|w| matches!(w, "always" | "within_size" | "advise" | "force"))
}

/// Reports that the running test skips its work, or part of it, because
/// this machine lacks `feature`: prints `skipped: <test>: <reason>` on
/// stderr, past libtest's capture so it shows for a passing test too, and
/// appends the skip to the file named by [`crate::SKIP_LOG`], if set. The caller
/// then returns (or leaves out the part that needs the feature).
///
/// # Panics
/// Under CI or `IOPATH_REQUIRE_PEERS` ([`peers_required`]) when the
/// machine type has the feature ([`Feature::expected_under_ci`]): there,
/// its absence is a broken set-up, not a pass.
#[track_caller]
pub fn skip(feature: Feature, reason: impl fmt::Display) {
    let reason = reason.to_string();
    if peers_required() && feature.expected_under_ci() {
        panic!(
            "{feature} missing under CI / IOPATH_REQUIRE_PEERS, \
             where this machine type has it: {reason}"
        );
    }
    report(Location::caller(), &reason);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::SKIP_LOG;
    use std::process::Command;

    /// Run in a child by the tests below: skips for want of io_uring,
    /// which this machine type has.
    #[test]
    #[ignore = "run in a child process by skip_of_a_feature_the_machine_has_fails_under_ci"]
    fn child_skips_io_uring() {
        skip(Feature::IoUring, "the probe was refused");
    }

    /// Run in a child by the tests below: skips for want of udmabuf,
    /// which this machine type lacks.
    #[test]
    #[ignore = "run in a child process by skip_of_a_feature_the_machine_lacks_passes_under_ci"]
    fn child_skips_udmabuf() {
        skip(Feature::Udmabuf, "no /dev/udmabuf");
    }

    /// Runs child test `name` (captured output, as `cargo test` runs it)
    /// with `CI=ci` and a skip log; returns whether it passed, its stderr
    /// and the log.
    fn run(name: &str, ci: &str) -> (bool, String, String) {
        let dir = tempfile_dir();
        let log = dir.join("skips");
        let out = Command::new(std::env::current_exe().unwrap())
            .args(["--ignored", "--exact", name])
            .env("CI", ci)
            .env_remove("IOPATH_REQUIRE_PEERS")
            .env(SKIP_LOG, &log)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr).into_owned()
            + &String::from_utf8_lossy(&out.stdout);
        let logged = std::fs::read_to_string(&log).unwrap_or_default();
        std::fs::remove_dir_all(&dir).unwrap();
        (out.status.success(), err, logged)
    }

    /// A fresh directory of this test process (the kit has no
    /// dependencies, so no `tempfile`).
    fn tempfile_dir() -> std::path::PathBuf {
        use std::sync::atomic::{AtomicU32, Ordering};
        static N: AtomicU32 = AtomicU32::new(0);
        let d = std::env::temp_dir().join(format!(
            "iopath-testkit-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn kernel_versions() {
        assert_eq!(kernel_version("6.18.44-fc-v1045"), Some((6, 18)));
        assert_eq!(kernel_version("5.10.0"), Some((5, 10)));
        assert_eq!(kernel_version("6-rc"), None);
    }

    #[test]
    fn skip_of_a_feature_the_machine_has_fails_under_ci() {
        let name = "skip::tests::child_skips_io_uring";
        let (ok, text, log) = run(name, "true");
        assert!(!ok, "a skip for want of io_uring passed under CI: {text}");
        assert!(
            text.contains("io_uring missing under CI / IOPATH_REQUIRE_PEERS"),
            "{text}"
        );
        assert!(text.contains("the probe was refused"), "{text}");
        assert_eq!(log, "", "a failure is no skip");

        let (ok, text, log) = run(name, "false");
        assert!(ok, "a skip failed off CI: {text}");
        // Shown although libtest captured the passing test's output.
        let line = format!("skipped: iopath_testkit::{name}: the probe was refused");
        assert!(text.contains(&line), "{text}");
        assert_eq!(
            log,
            format!("iopath_testkit::{name}\tthe probe was refused\n")
        );
    }

    #[test]
    fn skip_of_a_feature_the_machine_lacks_passes_under_ci() {
        let name = "skip::tests::child_skips_udmabuf";
        let (ok, text, log) = run(name, "true");
        assert!(ok, "an honest skip failed under CI: {text}");
        let line = format!("skipped: iopath_testkit::{name}: no /dev/udmabuf");
        assert!(text.contains(&line), "{text}");
        assert_eq!(log, format!("iopath_testkit::{name}\tno /dev/udmabuf\n"));
    }

    #[test]
    fn shmem_enabled_allows_huge_pages_unless_never_or_deny() {
        for (setting, huge) in [
            ("always within_size advise [never] deny force\n", false),
            ("always within_size advise never [deny] force\n", false),
            ("always within_size [advise] never deny force\n", true),
            ("[always] within_size advise never deny force\n", true),
            ("always [within_size] advise never deny force\n", true),
            ("always within_size advise never deny [force]\n", true),
            ("", false),
        ] {
            assert_eq!(shmem_allows_huge_pages(setting), huge, "{setting:?}");
        }
    }

    #[test]
    fn only_features_of_this_machine_type_are_expected_under_ci() {
        assert!(Feature::IoUring.expected_under_ci());
        assert!(Feature::DirectIo.expected_under_ci());
        assert!(Feature::Package("fio").expected_under_ci());
        assert!(!Feature::Udmabuf.expected_under_ci());
        assert!(!Feature::DmaHeap.expected_under_ci());
    }
}
