//! The Linux lab (`scripts/linux-lab`) from a test: the User-Mode Linux
//! kernel, built once per machine and cached; C programs built on the host
//! for the guest (the guest runs the host's files through hostfs); and a
//! boot that runs a script inside the guest.
//!
//! ```text
//!   Lab::get ── linux-lab path ──► cached kernel dir (built on first use)
//!   cc(src) ── host gcc ──► program in the test's directory
//!   Lab::run ── linux-lab run --device SOCK:ID -- SCRIPT ARGS ──► Guest { status, out }
//! ```

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use iopath_testkit::{skip, Feature};

/// The C sources and guest scripts of the lab tests.
pub fn src_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/linux")
}

/// The workspace root (`scripts/` lives there).
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// A built lab kernel.
#[derive(Debug)]
pub struct Lab {
    script: PathBuf,
    kdir: PathBuf,
    /// The kernel patches it was built with (`linux-lab --patches`).
    patches: Option<PathBuf>,
}

/// What a boot printed and how it ended.
#[derive(Debug)]
pub struct Guest {
    /// The script's exit status; 124 on timeout, 125 if the guest died,
    /// 126 if every boot hung before the script started.
    pub status: Option<i32>,
    /// The script's output (console line ends normalised to `\n`).
    pub out: String,
    /// linux-lab's own messages.
    pub err: String,
    /// Boots that hung before the script started and were retried
    /// (`scripts/linux-lab --help`, BOOT HANG): each still connected to
    /// the devices, so a back end counts them among its drivers.
    pub hung_boots: u32,
}

/// linux-lab's status for a boot that hung before the script started.
const BOOT_HUNG: i32 = 126;

/// Boots tried in all when they hang before the script starts.
const BOOT_TRIES: u32 = 3;

impl Guest {
    /// Panics with everything the guest printed unless the script
    /// exited 0.
    #[track_caller]
    pub fn assert_ok(&self) {
        assert_eq!(
            self.status,
            Some(0),
            "guest script failed\n--- output\n{}\n--- linux-lab\n{}",
            self.out,
            self.err
        );
    }

    /// Whether a line of the output is exactly `line`.
    pub fn has_line(&self, line: &str) -> bool {
        self.out.lines().any(|l| l == line)
    }
}

impl Lab {
    /// The lab kernel, built first if this machine has none (minutes, once;
    /// concurrent callers wait for the one build). `None` after reporting
    /// the skip when the lab cannot be built here; under CI that fails the
    /// test instead.
    #[track_caller]
    pub fn get() -> Option<&'static Lab> {
        static LAB: OnceLock<Result<Lab, String>> = OnceLock::new();
        Self::cached(&LAB, None)
    }

    /// The lab kernel with the patches in the directory `$var` names (a
    /// build of its own); panics naming `$var` when it is not set: only
    /// opt-in tests ask for one.
    #[track_caller]
    pub fn patched(var: &str) -> Option<&'static Lab> {
        static LAB: OnceLock<Result<Lab, String>> = OnceLock::new();
        let dir = std::env::var_os(var).unwrap_or_else(|| {
            panic!("{var} is not set: it names the directory of the kernel patches to apply")
        });
        Self::cached(&LAB, Some(PathBuf::from(dir)))
    }

    #[track_caller]
    fn cached(
        lab: &'static OnceLock<Result<Lab, String>>,
        patches: Option<PathBuf>,
    ) -> Option<&'static Lab> {
        match lab.get_or_init(|| build(patches)) {
            Ok(lab) => Some(lab),
            Err(why) => {
                skip(Feature::Package("linux-source-6.12"), why);
                None
            }
        }
    }

    /// The UML kernel itself.
    pub fn kernel(&self) -> PathBuf {
        self.kdir.join("linux")
    }

    /// A module built with the kernel (`rpmsg_client_sample.ko`).
    pub fn module(&self, name: &str) -> PathBuf {
        self.kdir.join("modules").join(name)
    }

    /// The kernel's user-space headers (`headers_install`), if the lab
    /// installed them.
    pub fn include(&self) -> Option<PathBuf> {
        let inc = self.kdir.join("include");
        inc.join("linux/rpmsg.h").is_file().then_some(inc)
    }

    /// Boots the kernel with `devices` (`SOCK:ID`) and runs `script ARGS`
    /// inside it, killing the guest after `timeout_s`. A boot that hangs
    /// before the script starts, a Linux deadlock that an rpmsg
    /// announcement can trigger (`scripts/linux-lab --help`, BOOT HANG),
    /// is reported and tried again, up to [`BOOT_TRIES`] boots in all.
    /// `IOPATH_LAB_VERBOSE=1` shows the kernel's log in the output.
    pub fn run(&self, devices: &[String], timeout_s: u32, script: &Path, args: &[&str]) -> Guest {
        let mut hung_boots = 0;
        loop {
            let mut cmd = Command::new(&self.script);
            cmd.arg("run").args(["--timeout", &timeout_s.to_string()]);
            if std::env::var_os("IOPATH_LAB_VERBOSE").is_some() {
                cmd.arg("--verbose");
            }
            if let Some(p) = &self.patches {
                cmd.arg("--patches").arg(p);
            }
            for d in devices {
                cmd.args(["--device", d]);
            }
            let o = cmd.arg("--").arg(script).args(args).output().unwrap();
            let g = Guest {
                status: o.status.code(),
                out: String::from_utf8_lossy(&o.stdout).replace("\r\n", "\n"),
                err: String::from_utf8_lossy(&o.stderr).into_owned(),
                hung_boots,
            };
            if g.status != Some(BOOT_HUNG) || hung_boots + 1 >= BOOT_TRIES {
                return g;
            }
            hung_boots += 1;
            eprintln!(
                "lab: boot {hung_boots} of {} hung before the script started; booting again:\n{}",
                script.display(),
                g.err.trim_end()
            );
        }
    }
}

fn build(patches: Option<PathBuf>) -> Result<Lab, String> {
    let script = repo_root().join("scripts/linux-lab");
    if !script.is_file() {
        return Err(format!("{} is missing", script.display()));
    }
    // `path` builds the kernel when the cache has none, then prints its
    // directory.
    let mut cmd = Command::new(&script);
    cmd.arg("path");
    if let Some(p) = &patches {
        cmd.arg("--patches").arg(p);
    }
    let o = cmd
        .output()
        .map_err(|e| format!("{}: {e}", script.display()))?;
    if !o.status.success() {
        return Err(format!(
            "scripts/linux-lab path failed: {}",
            String::from_utf8_lossy(&o.stderr).trim()
        ));
    }
    let kdir = PathBuf::from(String::from_utf8_lossy(&o.stdout).trim());
    if !kdir.join("linux").is_file() {
        return Err(format!("no kernel at {}/linux", kdir.display()));
    }
    Ok(Lab {
        script,
        kdir,
        patches,
    })
}

/// Compiles `tests/linux/NAME` (a `.c` file) with the host's `cc` into
/// `dir/OUT`, with `args` after the source (`-I`, `-shared`, ...).
#[track_caller]
pub fn cc(dir: &Path, name: &str, out: &str, args: &[&str]) -> PathBuf {
    let src = src_dir().join(name);
    let out = dir.join(out);
    let o = Command::new("cc")
        .args(["-O2", "-Wall", "-o"])
        .arg(&out)
        .arg(&src)
        .args(args)
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "cc {}: {}",
        src.display(),
        String::from_utf8_lossy(&o.stderr)
    );
    out
}
