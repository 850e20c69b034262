//! The back end under test: a real `iopath blk serve` process on a
//! temporary image, built on demand.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;

/// The `iopath` binary (built on demand; cargo only builds a package's own
/// binaries for its tests).
pub fn iopath_bin() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        if let Some(p) = std::env::var_os("IOPATH_BIN") {
            return PathBuf::from(p);
        }
        let exe = std::env::current_exe().expect("test executable path");
        // target/<profile>/deps/<test> -> target/<profile>/iopath
        let profile_dir = exe.parent().and_then(Path::parent).expect("target dir");
        let target_dir = profile_dir.parent().expect("target root");
        let mut cmd = Command::new(env!("CARGO"));
        cmd.args(["build", "--quiet", "-p", "iopath", "--bin", "iopath"])
            .arg("--target-dir")
            .arg(target_dir);
        if profile_dir.file_name().is_some_and(|n| n == "release") {
            cmd.arg("--release");
        }
        let status = cmd.status().expect("run cargo build");
        assert!(status.success(), "cargo build -p iopath failed");
        profile_dir.join("iopath")
    })
    .clone()
}

/// A running `iopath blk serve` on a temporary image.
pub struct Server {
    pub child: Child,
    pub dir: tempfile::TempDir,
    pub image: PathBuf,
    pub socket: PathBuf,
}

impl Server {
    /// Creates a sparse image of `size` bytes and serves it.
    pub fn start(size: u64, extra: &[&str]) -> Server {
        Self::start_in(&std::env::temp_dir(), size, extra)
    }

    /// [`Server::start`] with the image in a directory made in `base`.
    fn start_in(base: &Path, size: u64, extra: &[&str]) -> Server {
        let dir = tempfile::Builder::new()
            .prefix("iopath-blk-")
            .tempdir_in(base)
            .unwrap();
        let image = dir.path().join("disk.img");
        std::fs::File::create(&image)
            .unwrap()
            .set_len(size)
            .unwrap();
        Self::start_on(dir, image, extra)
    }

    /// [`Server::start`] with the image in RAM (a tmpfs `/dev/shm`, where
    /// the back end copies small requests inline rather than through
    /// io_uring's workers), or `None` (reported as skipped) without one.
    pub fn start_in_ram(size: u64, extra: &[&str]) -> Option<Server> {
        let base = Path::new("/dev/shm");
        let tmpfs = rustix::fs::statfs(base).is_ok_and(|s| s.f_type == libc::TMPFS_MAGIC);
        if !tmpfs {
            iopath_testkit::skip(
                iopath_testkit::Feature::ShmTmpfs,
                "/dev/shm is not a tmpfs here",
            );
            return None;
        }
        Some(Self::start_in(base, size, extra))
    }

    pub fn start_on(dir: tempfile::TempDir, image: PathBuf, extra: &[&str]) -> Server {
        let socket = dir.path().join("blk.sock");
        let child = Self::spawn(&image, &socket, extra);
        Server {
            child,
            dir,
            image,
            socket,
        }
    }

    /// Starts `iopath blk serve` on `image` and `socket` and waits for its
    /// banner (it listens then).
    fn spawn(image: &Path, socket: &Path, extra: &[&str]) -> Child {
        let mut child = Command::new(iopath_bin())
            .args(["blk", "serve", "--image"])
            .arg(image)
            .arg("--socket")
            .arg(socket)
            .args(extra)
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert!(line.starts_with("serving "), "unexpected banner: {line:?}");
        child
    }

    /// SIGKILL the server and reap it (its socket file stays behind).
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Starts the server again on the same image and socket.
    pub fn restart(&mut self, extra: &[&str]) {
        self.kill();
        self.child = Self::spawn(&self.image, &self.socket, extra);
    }

    pub fn image_bytes(&self, offset: u64, len: usize) -> Vec<u8> {
        let data = std::fs::read(&self.image).unwrap();
        data[offset as usize..offset as usize + len].to_vec()
    }

    /// True while the server process runs.
    pub fn alive(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
