//! One export as a user writes it, `image=PATH,socket=PATH[,readonly]
//! [,queues=N][,poll|poll-us=US][,no-access-platform]` (the grammar of
//! `qemu-storage-daemon --export`: comma-separated `key=value` pairs and
//! bare flags), and the checks that a set of exports can be served
//! together.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use iopath_virtio::PollMode;

use super::error::ExportError;
use crate::BlkOptions;

/// The options an export takes, as written; every one at most once.
pub const OPTIONS: &[&str] = &[
    "image",
    "socket",
    "readonly",
    "queues",
    "poll",
    "poll-us",
    "no-access-platform",
];

/// One image served on one socket, with its own settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExportSpec {
    /// The raw image file.
    pub image: PathBuf,
    /// The unix socket its front end connects to.
    pub socket: PathBuf,
    /// Queues, read-only, how queues wait.
    pub options: BlkOptions,
    /// Offer `VIRTIO_F_ACCESS_PLATFORM` (see
    /// [`ServerOptions`](iopath_virtio::device::ServerOptions)).
    pub access_platform: bool,
}

impl ExportSpec {
    /// An export of `image` on `socket` with the default settings.
    pub fn new(image: impl Into<PathBuf>, socket: impl Into<PathBuf>) -> Self {
        Self {
            image: image.into(),
            socket: socket.into(),
            options: BlkOptions::default(),
            access_platform: true,
        }
    }
}

impl FromStr for ExportSpec {
    type Err = ExportError;

    /// Parses `image=PATH,socket=PATH[,readonly][,queues=N][,poll]
    /// [,poll-us=US][,no-access-platform]`.
    fn from_str(s: &str) -> Result<Self, ExportError> {
        let mut given: HashMap<&'static str, Option<&str>> = HashMap::new();
        for item in s.split(',') {
            let (key, value) = match item.split_once('=') {
                Some((k, v)) => (k, Some(v)),
                None => (item, None),
            };
            let Some(&key) = OPTIONS.iter().find(|o| **o == key) else {
                return Err(ExportError::UnknownOption {
                    option: key.into(),
                    accepted: OPTIONS,
                });
            };
            if given.insert(key, value).is_some() {
                return Err(ExportError::RepeatedOption { option: key.into() });
            }
        }
        let path = |key: &'static str| match given.get(key) {
            None => Err(ExportError::MissingOption { option: key }),
            Some(None | Some("")) => Err(ExportError::BadValue {
                option: key,
                value: String::new(),
                accepted: "a path",
            }),
            Some(Some(p)) => Ok(PathBuf::from(p)),
        };
        let mut spec = ExportSpec::new(path("image")?, path("socket")?);
        for (&key, &value) in &given {
            let bad = |accepted| ExportError::BadValue {
                option: key,
                value: value.unwrap_or_default().into(),
                accepted,
            };
            match (key, value) {
                ("image" | "socket", _) => {}
                ("readonly", None) => spec.options.readonly = true,
                ("poll", None) => spec.options.poll = PollMode::Busy,
                ("no-access-platform", None) => spec.access_platform = false,
                ("readonly" | "poll" | "no-access-platform", Some(_)) => {
                    return Err(bad("nothing (a flag takes no value)"))
                }
                ("queues", v) => {
                    spec.options.queues = v
                        .and_then(|v| v.parse().ok())
                        .filter(|q| (1..=64).contains(q))
                        .ok_or_else(|| bad("a queue count, 1 to 64"))?;
                }
                ("poll-us", v) => {
                    spec.options.poll = v
                        .and_then(|v| v.parse().ok())
                        .and_then(|us| PollMode::from_us(us).ok())
                        .ok_or_else(|| bad("whole microseconds, 0 to 100000"))?;
                }
                _ => unreachable!("every option is matched"),
            }
        }
        if given.contains_key("poll") && given.contains_key("poll-us") {
            return Err(ExportError::Conflict {
                options: ("poll", "poll-us"),
            });
        }
        Ok(spec)
    }
}

/// Refuses a set of exports that cannot be served together: two on one
/// socket, or one image exported writable twice (paths compared once
/// resolved, so `./a` and `/dir/a`, or a symlink and its target, are the
/// same).
///
/// # Errors
/// [`ExportError::SameSocket`], [`ExportError::WritableTwice`].
pub fn check(specs: &[ExportSpec]) -> Result<(), ExportError> {
    let mut sockets = HashMap::new();
    let mut writable = HashMap::new();
    for spec in specs {
        if let Some(first) = sockets.insert(resolve_socket(&spec.socket), &spec.socket) {
            return Err(ExportError::SameSocket {
                first: first.clone(),
                second: spec.socket.clone(),
            });
        }
        if spec.options.readonly {
            continue;
        }
        let image = std::fs::canonicalize(&spec.image).unwrap_or_else(|_| spec.image.clone());
        if let Some(first) = writable.insert(image, &spec.image) {
            return Err(ExportError::WritableTwice {
                first: first.clone(),
                second: spec.image.clone(),
            });
        }
    }
    Ok(())
}

/// A socket path with its directory resolved (the socket itself may not
/// exist yet, or be a stale one about to be replaced).
fn resolve_socket(socket: &Path) -> PathBuf {
    let dir = match socket.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    match (std::fs::canonicalize(dir), socket.file_name()) {
        (Ok(dir), Some(name)) => dir.join(name),
        _ => socket.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> Result<ExportSpec, String> {
        s.parse::<ExportSpec>().map_err(|e| e.to_string())
    }

    #[test]
    fn every_option_is_read() {
        let s = parse("image=/i,socket=/s").unwrap();
        assert_eq!(s, ExportSpec::new("/i", "/s"));
        let s = parse("socket=/s,image=/i,readonly,queues=4,poll-us=0,no-access-platform").unwrap();
        assert_eq!(s.image, Path::new("/i"));
        assert_eq!(s.socket, Path::new("/s"));
        assert_eq!(
            s.options,
            BlkOptions {
                queues: 4,
                readonly: true,
                poll: PollMode::SLEEP
            }
        );
        assert!(!s.access_platform);
        assert_eq!(
            parse("image=/i,socket=/s,poll").unwrap().options.poll,
            PollMode::Busy
        );
    }

    #[test]
    fn bad_options_are_named() {
        assert_eq!(
            parse("image=/i,socket=/s,readonyl").unwrap_err(),
            "Unknown export option \"readonyl\" (accepted: image, socket, readonly, \
             queues, poll, poll-us, no-access-platform)"
        );
        assert_eq!(
            parse("image=/i,socket=/s,queues=2,queues=3").unwrap_err(),
            "Export option \"queues\" is given twice"
        );
        assert_eq!(
            parse("image=/i,image=/j,socket=/s").unwrap_err(),
            "Export option \"image\" is given twice"
        );
        assert_eq!(
            parse("image=/i").unwrap_err(),
            "Export option \"socket\" is missing"
        );
        assert_eq!(
            parse("image=/i,socket=/s,queues=0").unwrap_err(),
            "Export option queues=0 is not accepted: it must be a queue count, 1 to 64"
        );
        assert_eq!(
            parse("image=/i,socket=/s,queues").unwrap_err(),
            "Export option queues= is not accepted: it must be a queue count, 1 to 64"
        );
        assert_eq!(
            parse("image=/i,socket=/s,readonly=off").unwrap_err(),
            "Export option readonly=off is not accepted: it must be nothing (a flag takes no value)"
        );
        assert_eq!(
            parse("image=/i,socket=/s,poll-us=100001").unwrap_err(),
            "Export option poll-us=100001 is not accepted: it must be whole microseconds, 0 to 100000"
        );
        assert_eq!(
            parse("image=,socket=/s").unwrap_err(),
            "Export option image= is not accepted: it must be a path"
        );
        assert_eq!(
            parse("image=/i,socket=/s,poll,poll-us=5").unwrap_err(),
            "Export options poll and poll-us cannot both be given"
        );
        assert!(parse("")
            .unwrap_err()
            .contains("Unknown export option \"\""));
    }

    #[test]
    fn one_socket_twice_and_one_image_writable_twice_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let img = dir.path().join("a.img");
        std::fs::write(&img, [0u8; 512]).unwrap();
        std::os::unix::fs::symlink(&img, dir.path().join("link.img")).unwrap();
        let d = dir.path();
        let spec = |image: &str, socket: &str, ro: bool| {
            let mut s = ExportSpec::new(d.join(image), d.join(socket));
            s.options.readonly = ro;
            s
        };
        // Two paths of one socket.
        let err = check(&[
            spec("a.img", "s", true),
            ExportSpec {
                socket: d.join(".").join("s"),
                ..spec("b.img", "s", false)
            },
        ])
        .unwrap_err();
        assert!(matches!(err, ExportError::SameSocket { .. }), "{err}");
        // A symlink and its target, both writable.
        let err = check(&[spec("a.img", "s1", false), spec("link.img", "s2", false)]).unwrap_err();
        assert!(err.to_string().contains("exported writable twice"), "{err}");
        // Read-only views of one image, and one writer beside them, are fine.
        check(&[
            spec("a.img", "s1", true),
            spec("link.img", "s2", true),
            spec("a.img", "s3", false),
        ])
        .unwrap();
    }
}
