//! fio, the limit beside iopath's figures: `fio --output-format=json`, and
//! the figures read out of it.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::{Error, Result};

pub(crate) const PROGRAM: &str = "fio";

/// One fio job: an O_DIRECT io_uring sequential pass (a read, or with
/// `write` a write) over the first `bytes` of a file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Job {
    pub write: bool,
    pub path: PathBuf,
    pub bytes: u64,
    pub bs: u64,
    pub iodepth: u32,
}

impl Job {
    pub(crate) fn new(write: bool, path: &Path, bytes: u64, bs: u64, iodepth: u32) -> Job {
        let path = path.to_path_buf();
        Job {
            write,
            path,
            bytes,
            bs,
            iodepth,
        }
    }

    /// The command line, for reports.
    pub(crate) fn cmdline(&self) -> Vec<String> {
        let mut v = vec!["fio".into(), "--name=limit".into()];
        v.push(format!("--filename={}", self.path.display()));
        match self.write {
            false => v.extend(["--readonly".into(), "--rw=read".into()]),
            true => v.extend(["--rw=write".into(), "--end_fsync=0".into()]),
        }
        v.extend([
            format!("--bs={}", self.bs),
            format!("--iodepth={}", self.iodepth),
            "--ioengine=io_uring".into(),
            "--direct=1".into(),
            format!("--size={}", self.bytes),
            "--output-format=json".into(),
        ]);
        v
    }

    /// `bs=1M qd=16`, for tables.
    pub(crate) fn config(&self) -> String {
        let bs = iopath_sys::format_size(self.bs);
        format!("bs={bs} qd={}", self.iodepth)
    }

    /// Runs the job with fio pinned to `cpu` (`None`: anywhere): GiB/s.
    pub(crate) fn run(&self, cpu: Option<usize>) -> Result<f64> {
        let cmd = self.cmdline();
        let dir = if self.write { "write" } else { "read" };
        gib_per_s(&run(Command::new(&cmd[0]).args(&cmd[1..]), cpu)?, dir)
    }
}

/// The first job's bandwidth in direction `dir` from fio's JSON, GiB/s.
fn gib_per_s(v: &serde_json::Value, dir: &str) -> Result<f64> {
    let bw = v["jobs"][0][dir]["bw_bytes"].as_f64();
    bw.map(|b| b / f64::from(1u32 << 30))
        .ok_or_else(|| failed(format!("its JSON has no jobs[0].{dir}.bw_bytes")))
}

/// Runs the fio command `cmd` pinned to `cpu` and returns its JSON (fio
/// may print notes before the object).
pub(crate) fn run(cmd: &mut Command, cpu: Option<usize>) -> Result<serde_json::Value> {
    let out = crate::place::output(PROGRAM, cmd, cpu)?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        let first = err.lines().next().unwrap_or("");
        return Err(failed(format!("{}: {first}", out.status)));
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let start = text
        .find('{')
        .ok_or_else(|| failed("no JSON in its output".into()))?;
    serde_json::from_str(&text[start..])
        .map_err(|e| failed(format!("its JSON does not parse: {e}")))
}

/// The sweep of a limit: every block size of `bss` (once each) at queue
/// depths 4, 16 and 64, the rest as in `base`.
pub(crate) fn sweep(base: &Job, bss: &[u64]) -> Vec<Job> {
    let mut jobs: Vec<Job> = Vec::new();
    for (i, &bs) in bss.iter().enumerate() {
        if !bss[..i].contains(&bs) {
            jobs.extend([4, 16, 64].map(|iodepth| Job {
                bs,
                iodepth,
                ..base.clone()
            }));
        }
    }
    jobs
}

pub(crate) fn failed(reason: String) -> Error {
    Error::Peer {
        program: PROGRAM.into(),
        reason,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sweep_covers_sizes_and_depths_once() {
        let base = Job::new(false, std::path::Path::new("/f"), 1 << 30, 1 << 20, 16);
        let jobs = sweep(&base, &[1 << 20, 8 << 20, 1 << 20]);
        let got: Vec<String> = jobs.iter().map(Job::config).collect();
        let want = [
            "bs=1M qd=4",
            "bs=1M qd=16",
            "bs=1M qd=64",
            "bs=8M qd=4",
            "bs=8M qd=16",
            "bs=8M qd=64",
        ];
        assert_eq!(got, want);
        let cmd = jobs[4].cmdline().join(" ");
        assert!(
            cmd.contains("--readonly --rw=read --bs=8388608 --iodepth=16"),
            "{cmd}"
        );
    }

    #[test]
    fn parses_fio_json() {
        let v = serde_json::json!({"fio version": "fio-3.33", "jobs": [{"jobname": "limit",
            "read": {"io_bytes": 1073741824u64, "bw_bytes": 1113868341u64, "runtime": 964}}]});
        assert!((gib_per_s(&v, "read").unwrap() - 1.0374).abs() < 1e-3);
        let no_jobs = gib_per_s(&serde_json::json!({"jobs": []}), "read");
        assert!(matches!(no_jobs, Err(Error::Peer { .. })));
        assert!(gib_per_s(&v, "write").is_err());
    }
}
