//! `--poll-us` and `--poll` on `iopath blk serve` and `iopath blk dd`: a
//! window out of range, or both options at once, is a usage error (exit
//! 2) naming the option and the range; the help says the default.

use std::process::Command;

fn iopath(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_iopath"))
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn out_of_range_windows_are_refused_with_the_range() {
    let dir = tempfile::tempdir().unwrap();
    let image = dir.path().join("disk.img");
    std::fs::File::create(&image)
        .unwrap()
        .set_len(1 << 20)
        .unwrap();
    let image = image.to_str().unwrap();
    let socket = dir.path().join("blk.sock");
    let socket = socket.to_str().unwrap();
    let serve = ["blk", "serve", "--image", image, "--socket", socket];
    let dd = [
        "blk", "dd", "--socket", socket, "--bs", "4K", "--count", "1",
    ];
    for base in [&serve[..], &dd[..]] {
        for (extra, says) in [
            (
                &["--poll-us", "100001"][..],
                "100001 us is out of range (0 to 100000 us)",
            ),
            (&["--poll-us=-5"][..], "0 to 100000"),
            (&["--poll-us", "ten"][..], "0 to 100000"),
            (&["--poll", "--poll-us", "10"][..], "cannot be used with"),
        ] {
            let out = iopath(&[base, extra].concat());
            let err = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(2), "{base:?} {extra:?}: {err}");
            assert!(err.contains("--poll"), "{extra:?}: no option named: {err}");
            assert!(err.contains(says), "{extra:?}: {err}");
        }
    }
    // Nothing was served or connected to.
    assert!(!std::path::Path::new(socket).exists());
}

#[test]
fn the_help_names_the_default_window() {
    for cmd in ["serve", "dd"] {
        let out = iopath(&["blk", cmd, "--help"]);
        let help = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success());
        assert!(help.contains("--poll-us <US>"), "{help}");
        assert!(help.contains("The default, 50"), "{help}");
        assert!(help.contains("never sleep"), "{help}");
    }
}
