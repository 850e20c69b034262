//! fio, the limit beside iopath's figures: runs `fio --output-format=json`
//! and reads the bandwidth out of it.

use std::path::PathBuf;
use std::process::{Command, Stdio};

use crate::{Error, Result};

/// One fio job's result.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FioResult {
    /// Bytes moved.
    pub bytes: u64,
    /// Bandwidth, bytes per second.
    pub bytes_per_s: f64,
    /// Job run time, milliseconds.
    pub runtime_ms: f64,
}

impl FioResult {
    /// Bandwidth in GiB/s.
    pub fn gib_per_s(&self) -> f64 {
        self.bytes_per_s / (1u64 << 30) as f64
    }
}

/// The program name.
pub const PROGRAM: &str = "fio";
/// Direction of a fio job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dir {
    /// Sequential read (`--rw=read --readonly`).
    Read,
    /// Sequential write (`--rw=write --end_fsync=0`).
    Write,
}

/// One fio job: an O_DIRECT io_uring sequential pass over the first
/// `bytes` of a file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Job {
    /// Read or write.
    pub dir: Dir,
    /// The file.
    pub path: PathBuf,
    /// Bytes moved.
    pub bytes: u64,
    /// Block size.
    pub bs: u64,
    /// Requests in flight.
    pub iodepth: u32,
}

impl Job {
    /// The command line, for reports.
    pub fn cmdline(&self) -> Vec<String> {
        let mut v = vec!["fio".into(), "--name=limit".into()];
        v.push(format!("--filename={}", self.path.display()));
        match self.dir {
            Dir::Read => v.extend(["--readonly".into(), "--rw=read".into()]),
            Dir::Write => v.extend(["--rw=write".into(), "--end_fsync=0".into()]),
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
    pub fn config(&self) -> String {
        format!(
            "bs={} qd={}",
            iopath_sys::format_size(self.bs),
            self.iodepth
        )
    }

    /// Runs the job with fio pinned to `cpu` (`None`: anywhere).
    ///
    /// # Errors
    /// As [`run`]; [`Error::Peer`] when its JSON has no such job.
    pub fn run(&self, cpu: Option<usize>) -> Result<FioResult> {
        let cmd = self.cmdline();
        let dir = match self.dir {
            Dir::Read => "read",
            Dir::Write => "write",
        };
        parse(&run(Command::new(&cmd[0]).args(&cmd[1..]), cpu)?, dir)
    }
}

/// Runs the fio command `cmd` pinned to `cpu` and returns its JSON (fio
/// may print notes before the object).
///
/// # Errors
/// [`Error::Spawn`] when fio cannot start, [`Error::Peer`] when it fails
/// or prints no JSON.
pub(crate) fn run(cmd: &mut Command, cpu: Option<usize>) -> Result<serde_json::Value> {
    let cmd = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let out = crate::place::spawn_on(cpu, cmd)?
        .wait_with_output()
        .map_err(Error::spawn(PROGRAM))?;
    let err = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() {
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

/// The sweep of a limit: every block size of `bss` (deduplicated) at
/// queue depths 4, 16 and 64, the rest as in `base`.
pub fn sweep(base: &Job, bss: &[u64]) -> Vec<Job> {
    let mut sizes: Vec<u64> = Vec::new();
    for &b in bss {
        if !sizes.contains(&b) {
            sizes.push(b);
        }
    }
    let mut jobs = Vec::new();
    for &bs in &sizes {
        for iodepth in SWEEP_DEPTHS {
            jobs.push(Job {
                bs,
                iodepth,
                ..base.clone()
            });
        }
    }
    jobs
}

/// Queue depths of [`sweep`].
pub const SWEEP_DEPTHS: [u32; 3] = [4, 16, 64];

fn failed(reason: String) -> Error {
    Error::Peer {
        program: PROGRAM.into(),
        reason,
    }
}

/// Reads the first job's bandwidth in direction `dir` (`read` or `write`)
/// from the JSON of `fio --output-format=json`.
///
/// # Errors
/// [`Error::Peer`] when it has no such job.
pub fn parse(v: &serde_json::Value, dir: &str) -> Result<FioResult> {
    let job = &v["jobs"][0][dir];
    let no = |k: &str| failed(format!("its JSON has no jobs[0].{dir}.{k}"));
    Ok(FioResult {
        bytes: job["io_bytes"].as_u64().ok_or_else(|| no("io_bytes"))?,
        bytes_per_s: job["bw_bytes"].as_f64().ok_or_else(|| no("bw_bytes"))?,
        runtime_ms: job["runtime"].as_f64().unwrap_or(0.0),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sweep_covers_sizes_and_depths_once() {
        let base = Job {
            dir: Dir::Read,
            path: "/f".into(),
            bytes: 1 << 30,
            bs: 1 << 20,
            iodepth: 16,
        };
        let jobs = sweep(&base, &[1 << 20, 8 << 20, 1 << 20]);
        let got: Vec<String> = jobs.iter().map(Job::config).collect();
        assert_eq!(
            got,
            [
                "bs=1M qd=4",
                "bs=1M qd=16",
                "bs=1M qd=64",
                "bs=8M qd=4",
                "bs=8M qd=16",
                "bs=8M qd=64"
            ]
        );
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
        let r = parse(&v, "read").unwrap();
        assert_eq!(r.bytes, 1 << 30);
        assert_eq!(r.runtime_ms, 964.0);
        assert!((r.gib_per_s() - 1.0374).abs() < 1e-3);
        assert!(matches!(
            parse(&serde_json::json!({"jobs": []}), "read"),
            Err(Error::Peer { .. })
        ));
        assert!(parse(&v, "write").is_err());
    }
}
