//! Linux's own rpmsg stack as iopath's peer: in the lab's User-Mode Linux
//! (`scripts/linux-lab`), `virtio_rpmsg_bus` drives `iopath rpmsg remote
//! --vhost-user` as a virtio-rpmsg device (ID 7), and programs written for
//! Linux's `rpmsg_ctrl` / `rpmsg_char` (`tests/linux/*.c`, built on the
//! host) run inside the guest against it.
//!
//! ```text
//!   guest: rpmsg_echo / seed002 / rpmsg_client_sample
//!            │ /dev/rpmsg_ctrl0, /dev/rpmsgN
//!          rpmsg_char, rpmsg_ctrl ── virtio_rpmsg_bus ── virtio_uml
//!            │ vhost-user socket
//!   host:  iopath rpmsg remote --vhost-user SOCK (echo services, announced)
//! ```

#[allow(dead_code)]
mod common;
#[allow(dead_code)]
mod lab;

use std::path::{Path, PathBuf};

use iopath_rpmsg::ctrl::uapi::{RpmsgEndpointFdInfo, RpmsgEndpointInfo};
use rustix::ioctl::opcode;

use common::{s, Proc};
use lab::{cc, Guest, Lab};

/// The guest's time limit for one test's boot.
const GUEST_TIMEOUT_S: u32 = 240;

/// The largest payload of a 512-byte virtio-rpmsg buffer.
const MAX_PAYLOAD: usize = 496;

/// Cycles of each of seed 002's loops.
const SEED_LOOPS: u32 = 200;

/// A lab boot against a fresh `iopath rpmsg remote --vhost-user`, with the
/// guest programs built: `None` (skipped) without the lab or gcc.
struct Setup {
    dir: tempfile::TempDir,
    lab: &'static Lab,
    remote: Proc,
    sock: PathBuf,
}

impl Setup {
    fn new(echo: &[&str]) -> Option<Setup> {
        Self::on(Lab::get, echo)
    }

    /// The same on the lab kernel `lab` gives.
    fn on(lab: fn() -> Option<&'static Lab>, echo: &[&str]) -> Option<Setup> {
        Self::with_args(lab, echo, &[])
    }

    /// The same, the remote given `extra` options.
    fn with_args(
        lab: fn() -> Option<&'static Lab>,
        echo: &[&str],
        extra: &[&str],
    ) -> Option<Setup> {
        if !iopath_testkit::have_peer("cc", "gcc") {
            return None;
        }
        let lab = lab()?;
        let dir = tempfile::tempdir().unwrap();
        build_programs(lab, dir.path());
        let sock = dir.path().join("rpmsg.sock");
        let mut args = vec!["rpmsg", "remote", "--vhost-user", s(&sock)];
        for name in echo {
            args.extend(["--echo", name]);
        }
        args.extend_from_slice(extra);
        let remote = Proc::spawn(dir.path(), "remote", &args);
        Some(Setup {
            dir,
            lab,
            remote,
            sock,
        })
    }

    /// The remote's log once it holds `what` (it prints a session's
    /// figures when the guest is gone), or after 10 s.
    fn remote_log_with(&self, what: &str) -> String {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            let err = self.remote.stderr();
            if err.contains(what) || std::time::Instant::now() > deadline {
                return err;
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    }

    /// Boots the guest with the remote as device 7 and runs
    /// `rpmsg_guest.sh BIN STEP ARGS`.
    fn guest(&self, step: &str, args: &[&str]) -> Guest {
        let mut a = vec![s(self.dir.path()), step];
        a.extend_from_slice(args);
        let g = self.lab.run(
            &[format!("{}:7", s(&self.sock))],
            GUEST_TIMEOUT_S,
            &lab::src_dir().join("rpmsg_guest.sh"),
            &a,
        );
        eprintln!("--- guest\n{}--- remote\n{}", g.out, self.remote.stderr());
        g
    }
}

/// The guest programs, against the lab kernel's `<linux/rpmsg.h>` (the
/// host's when the lab installed no headers); seed 002's program also
/// through `tests/linux/compat`, which adds what the fd series would.
fn build_programs(lab: &Lab, dir: &Path) {
    let kernel = lab.include().map(|k| format!("-I{}", s(&k)));
    let kernel: Vec<&str> = kernel.iter().map(String::as_str).collect();
    let compat = format!("-I{}", s(&lab::src_dir().join("compat")));
    let strict = ["-Wextra", "-Werror"];
    let echo_args = [&strict[..], &kernel].concat();
    cc(dir, "rpmsg_echo.c", "rpmsg_echo", &echo_args);
    // Someone else's program: warnings are not ours to fix.
    let seed_args = [&[compat.as_str()][..], &kernel].concat();
    cc(dir, "seed002.c", "seed002", &seed_args);
    let so_args = [&["-shared", "-fPIC"][..], &strict].concat();
    cc(dir, "ioctl_errno.c", "ioctl_errno.so", &so_args);
}

/// `rpmsg_ctrl`'s `RPMSG_CREATE_EPT_IOCTL` plus `/dev/rpmsgN`, towards the
/// address iopath's echo was announced at: every payload size from 1 to
/// 496 comes back byte-exact. Twice, by two boots in turn: the first guest
/// powers off under the remote without resetting the device, and the
/// remote serves the next driver, which finds the channel again.
#[test]
fn rpmsg_ctrl_endpoint_echoes_every_size() {
    let Some(st) = Setup::new(&["iopath-echo"]) else {
        return;
    };
    let mut hosts = 0;
    for boot in 1..=2 {
        let g = st.guest("ctrl", &["iopath-echo"]);
        g.assert_ok();
        hosts += 1 + g.hung_boots as usize;
        // The remote's announcement is a Linux rpmsg device.
        for ch in ["rpmsg_ctrl", "iopath-echo"] {
            assert!(
                g.has_line(&format!("channel {ch}")),
                "boot {boot}: no channel {ch}:\n{}",
                g.out
            );
        }
        assert_echoed(&g, "ctrl");
    }
    let err = st.remote_log_with("remote: rx ");
    assert_eq!(err.matches("remote: host ready").count(), hosts, "{err}");
    // Every message was delivered: nothing refused, nothing malformed.
    let stats: Vec<&str> = err
        .lines()
        .filter(|l| l.starts_with("remote: rx "))
        .collect();
    assert!(!stats.is_empty(), "no stats line:\n{err}");
    assert!(
        stats.iter().all(|l| l.contains(" refused 0 malformed 0 ")),
        "{err}"
    );
}

/// A channel the remote announces as `rpmsg-raw` is bound by Linux's
/// `rpmsg_char` itself, with no ioctl: every payload size from 1 to 496
/// comes back byte-exact through the node it makes.
#[test]
fn rpmsg_raw_channel_echoes_every_size() {
    let Some(st) = Setup::new(&["rpmsg-raw"]) else {
        return;
    };
    // Bound in the announcement's interrupt context, a built-in rpmsg_char
    // would sleep there and panic the guest (scripts/linux-lab, CONFIG).
    let ko = st.lab.module("rpmsg_char.ko");
    assert!(
        ko.is_file(),
        "{} missing: the lab kernel has rpmsg_char built in",
        ko.display()
    );
    let g = st.guest("raw", &["rpmsg-raw"]);
    g.assert_ok();
    assert!(g.has_line("channel rpmsg-raw"), "{}", g.out);
    assert_echoed(&g, "raw");
}

/// A remote offering 4 KiB buffers to Linux 6.12 without the buffer-size
/// series: the driver does not know bit 1 and does not ack it, and both
/// sides keep 512-byte buffers (1 to 496 bytes echoed, 497 refused).
#[test]
fn offer_unknown_to_linux_6_12_is_512() {
    let Some(st) = Setup::with_args(Lab::get, &["rpmsg-raw"], &["--buf-size", "4K"]) else {
        return;
    };
    let g = st.guest("raw", &["rpmsg-raw"]);
    g.assert_ok();
    assert_echoed(&g, "raw");
    let err = st.remote_log_with("remote: rx ");
    assert!(
        err.contains("remote: host ready (features NS, EVENT_IDX)"),
        "{err}"
    );
}

/// Asserts `rpmsg_echo MODE` checked every size and every byte.
#[track_caller]
fn assert_echoed(g: &Guest, mode: &str) {
    let bytes = MAX_PAYLOAD * (MAX_PAYLOAD + 1) / 2;
    let want = format!("rpmsg_echo {mode}: ok: sizes 1..{MAX_PAYLOAD}, {bytes} bytes echoed");
    assert!(
        g.out.lines().any(|l| l.starts_with(&want)),
        "no {want:?} in:\n{}",
        g.out
    );
}

/// Linux's `rpmsg_client_sample` module against iopath's echo announced as
/// `rpmsg-client-sample`: its 100 round trips, then "goodbye!". The guest
/// rebinds the bus around the insmod (see `rpmsg_guest.sh`), so the remote
/// also serves a second driver after a reset: it counts two hosts (and one
/// per boot that hung), and the sample's 100 messages come back with none
/// refused.
#[test]
fn rpmsg_client_sample_completes_its_round_trips() {
    let Some(st) = Setup::new(&["rpmsg-client-sample"]) else {
        return;
    };
    let module = st.lab.module("rpmsg_client_sample.ko");
    assert!(
        module.is_file(),
        "{} missing from the lab",
        module.display()
    );
    let g = st.guest("sample", &[s(&module)]);
    g.assert_ok();
    let sample: Vec<&str> = g
        .out
        .lines()
        .filter_map(|l| l.split_once("rpmsg-client-sample").map(|(_, rest)| rest))
        .collect();
    // "virtio0.rpmsg-client-sample.-1.ADDR: incoming msg N (src: 0xADDR)".
    let incoming: Vec<u32> = sample
        .iter()
        .filter_map(|l| {
            l.split_once("incoming msg ")?
                .1
                .split_once(' ')?
                .0
                .parse()
                .ok()
        })
        .collect();
    assert_eq!(incoming, (1..=100).collect::<Vec<u32>>(), "{}", g.out);
    assert!(
        sample.iter().any(|l| l.ends_with(": goodbye!")),
        "{}",
        g.out
    );
    assert!(!g.out.contains("rpmsg_send failed"), "{}", g.out);
    // The remote prints a session's figures once the guest is gone.
    let err = st.remote_log_with("remote: rx 100 ");
    let hosts = 2 + g.hung_boots as usize;
    assert_eq!(err.matches("remote: host ready").count(), hosts, "{err}");
    assert!(
        err.contains("remote: rx 100 tx 101 refused 0 malformed 0 "),
        "{err}"
    );
}

/// Seed 002's benchmark program, compiled unmodified against the kernel's
/// `<linux/rpmsg.h>`: its legacy loop (create, open, destroy, close) runs
/// on the real `rpmsg_char` with no failed call; its fd loop gets the
/// kernel's own answer to an ioctl 6.12 does not have, `EINVAL` from
/// `rpmsg_ctrl`, then `EBADF` for the fd it never got.
#[test]
fn seed_002_legacy_loop_on_linux_rpmsg_char() {
    let Some(st) = Setup::new(&["iopath-echo"]) else {
        return;
    };
    if st.lab.include().is_some_and(|inc| has_fd_ioctl(&inc)) {
        // Debian's 6.12 has no RPMSG_CREATE_EPT_FD_IOCTL; a lab kernel with
        // it is checked by seed_002_both_loops_on_linux_with_the_fd_series.
        iopath_testkit::skip(
            iopath_testkit::Feature::Package("linux-source-6.12"),
            "the lab kernel has RPMSG_CREATE_EPT_FD_IOCTL: this test needs 6.12's rpmsg_ctrl without it",
        );
        return;
    }
    let loops = SEED_LOOPS.to_string();
    let g = st.guest("seed", &[&loops]);
    g.assert_ok();
    let out = &g.out;
    let (legacy, fd) = out
        .split_once("time for old way: [")
        .unwrap_or_else(|| panic!("no legacy time in:\n{out}"));
    // The legacy loop: nothing printed but its count.
    let legacy_lines: Vec<&str> = legacy
        .lines()
        .skip_while(|l| !l.starts_with("loop["))
        .collect();
    assert_eq!(legacy_lines, [format!("loop[{loops}]")], "{out}");
    let legacy_us: u64 = fd.split_once(']').unwrap().0.parse().unwrap();
    // The fd loop: each cycle's two calls fail, and say so.
    let fails = |what: &str| fd.lines().filter(|l| *l == what).count();
    let n = SEED_LOOPS as usize;
    assert_eq!(
        fails("ioctl[RPMSG_CREATE_EPT_FD_IOCTL] failed, ret[-1]"),
        n,
        "{out}"
    );
    assert_eq!(
        fails("new ioctl[RPMSG_DESTROY_EPT_IOCTL] failed, ret[-1]"),
        n,
        "{out}"
    );

    // The calls as the kernel answered them (ioctl_errno.so's tallies).
    let create = opcode::write::<RpmsgEndpointInfo>(0xb5, 1);
    let destroy = opcode::none(0xb5, 2);
    let create_fd = opcode::read_write::<RpmsgEndpointFdInfo>(0xb5, 7);
    let mut want = vec![
        format!("ioctl 0x{create:x} ok {n}"),
        format!("open 0x0 ok {}", n + 1),
        format!("ioctl 0x{destroy:x} ok {n}"),
        format!("close 0x0 ok {}", n + 1),
        format!("ioctl 0x{create_fd:x} failed EINVAL {n}"),
        format!("ioctl 0x{destroy:x} failed EBADF {n}"),
        format!("close 0x0 failed EBADF {n}"),
    ];
    let mut got: Vec<String> = out
        .lines()
        .filter_map(|l| l.strip_prefix("ioctl_errno: "))
        .map(str::to_owned)
        .collect();
    want.sort();
    got.sort();
    assert_eq!(got, want, "{out}");
    eprintln!(
        "seed 002 in UML: legacy loop {} us per cycle ({SEED_LOOPS} cycles)",
        legacy_us as f64 / SEED_LOOPS as f64
    );
}

/// Seed 002's program, unmodified, on Linux with the fd series applied
/// (Dawei Li's v5, three patches from the list archive in the directory
/// `IOPATH_FD_SERIES` names; README, "Linux as the peer"): both loops run
/// with no failed call, the kernel answering every
/// `RPMSG_CREATE_EPT_FD_IOCTL` with an endpoint fd that
/// `RPMSG_DESTROY_EPT_IOCTL` and `close` accept. The timings are the
/// seed's own figures (`scripts/rpmsg-fd-series-bench` repeats them beside
/// iopath's). Opt-in: the patches are Linux's code, not ours, and the
/// patched kernel is a second lab build of several minutes.
#[test]
#[ignore = "needs the fd series: IOPATH_FD_SERIES=DIR cargo test -p iopath --test linux_rpmsg -- --ignored fd_series"]
fn seed_002_both_loops_on_linux_with_the_fd_series() {
    let Some(st) = Setup::on(|| Lab::patched("IOPATH_FD_SERIES"), &["iopath-echo"]) else {
        return;
    };
    let inc = st
        .lab
        .include()
        .expect("the patched lab installs its headers");
    assert!(
        has_fd_ioctl(&inc),
        "{}: no RPMSG_CREATE_EPT_FD_IOCTL; did the fd series apply?",
        inc.display()
    );
    let loops = SEED_LOOPS.to_string();
    let g = st.guest("seed", &[&loops]);
    g.assert_ok();
    let out = &g.out;
    // Nothing printed but the counts, the times and the ratio: each
    // failed call would print a line.
    assert!(!out.contains("failed"), "{out}");
    let times: Vec<u64> = out
        .lines()
        .filter_map(|l| {
            l.strip_prefix("time for ")?
                .split_once('[')?
                .1
                .split_once(']')
        })
        .map(|(t, _)| t.parse().unwrap())
        .collect();
    assert_eq!(times.len(), 2, "{out}");

    let n = SEED_LOOPS as usize;
    let create = opcode::write::<RpmsgEndpointInfo>(0xb5, 1);
    let destroy = opcode::none(0xb5, 2);
    let create_fd = opcode::read_write::<RpmsgEndpointFdInfo>(0xb5, 7);
    let mut want = vec![
        format!("ioctl 0x{create:x} ok {n}"),
        format!("open 0x0 ok {}", n + 1),
        format!("ioctl 0x{destroy:x} ok {}", 2 * n),
        format!("ioctl 0x{create_fd:x} ok {n}"),
        format!("close 0x0 ok {}", 2 * n + 1),
    ];
    let mut got: Vec<String> = out
        .lines()
        .filter_map(|l| l.strip_prefix("ioctl_errno: "))
        .map(str::to_owned)
        .collect();
    want.sort();
    got.sort();
    assert_eq!(got, want, "{out}");
    let per = |t: u64| t as f64 / SEED_LOOPS as f64;
    eprintln!(
        "seed 002 on Linux + fd series in UML: legacy {:.1} us, fd {:.1} us per cycle, legacy/fd {:.1}",
        per(times[0]),
        per(times[1]),
        times[0] as f64 / times[1] as f64
    );
}

/// Whether the installed `<linux/rpmsg.h>` under `inc` names the fd ioctl.
fn has_fd_ioctl(inc: &Path) -> bool {
    std::fs::read_to_string(inc.join("linux/rpmsg.h"))
        .is_ok_and(|h| h.contains("RPMSG_CREATE_EPT_FD_IOCTL"))
}

/// Buffer sizes with Linux itself: Linux 6.12 with "Enhance RPMsg buffer
/// management" v5 (the patches in the directory `IOPATH_BUFSZ_SERIES`
/// names; README, "Linux as the peer") drives `iopath rpmsg remote
/// --vhost-user` offering 4 KiB buffers, then 2 KiB remote → Linux and
/// 8 KiB Linux → remote. For each: `virtio_rpmsg_bus` acks the feature
/// bit; the patched `rpmsg_client_sample` reports its MTU (the remote's rx
/// size less the header) and completes its round trips; an `rpmsg-raw`
/// channel bound by `rpmsg_char` sends every payload size from 1 to the
/// MTU, those the remote can send back (its tx size less the header)
/// echoed byte-exact, the others received and counted by the remote; one
/// byte past the MTU is the kernel's own `EMSGSIZE` ("message is too
/// big"). Round trips per second through `/dev/rpmsgN` at 496, 2048 and
/// 4080 bytes (4 KiB buffers) are printed. Opt-in: the patches are
/// Linux's code, not ours, and the patched kernel is a lab build of its
/// own.
#[test]
#[ignore = "needs the buffer-size series: IOPATH_BUFSZ_SERIES=DIR cargo test -p iopath --test linux_rpmsg -- --ignored bufsz_series"]
fn bufsz_series_sizes_reach_linux() {
    let patched = || Lab::patched("IOPATH_BUFSZ_SERIES");
    // (remote options, Linux's MTU, the largest payload back, timed sizes)
    let cases: [(&[&str], usize, usize, &[&str]); 2] = [
        (&["--buf-size", "4K"], 4080, 4080, &["496", "2048", "4080"]),
        (
            &["--tx-buf-size", "2K", "--rx-buf-size", "8K"],
            8176,
            2032,
            &[],
        ),
    ];
    for (opts, mtu, back, timed) in cases {
        // rpmsg_client_sample: the MTU, then its 100 round trips.
        let Some(st) = Setup::with_args(patched, &["rpmsg-client-sample"], opts) else {
            return;
        };
        let module = st.lab.module("rpmsg_client_sample.ko");
        let g = st.guest("sample", &[s(&module)]);
        g.assert_ok();
        assert!(
            g.out.lines().any(|l| l.contains("rpmsg_client_sample")
                && l.ends_with(&format!(": rpmsg MTU size = {}", mtu))),
            "{opts:?}: no MTU {mtu} in:\n{}",
            g.out
        );
        let incoming = g.out.matches(": incoming msg ").count();
        assert_eq!(incoming, 100, "{opts:?}:\n{}", g.out);
        let err = st.remote_log_with("remote: rx ");
        assert!(
            err.contains("remote: host ready (features NS, BUFSZ"),
            "{opts:?}: the driver did not ack BUFSZ:\n{err}"
        );
        drop(st);

        // rpmsg-raw through rpmsg_char: every size, then one byte more.
        let Some(st) = Setup::with_args(patched, &["rpmsg-raw"], opts) else {
            return;
        };
        let mut args = vec!["rpmsg-raw".to_owned(), mtu.to_string(), back.to_string()];
        args.extend(timed.iter().map(|t| t.to_string()));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let g = st.guest("raw", &args);
        g.assert_ok();
        let bytes = back * (back + 1) / 2;
        let sent = if back < mtu {
            format!(", sizes {}..{mtu} sent one way", back + 1)
        } else {
            String::new()
        };
        let want = format!(
            "rpmsg_echo raw: ok: sizes 1..{back}, {bytes} bytes echoed byte-exact{sent}, {} bytes EMSGSIZE, through ",
            mtu + 1
        );
        assert!(
            g.out.lines().any(|l| l.starts_with(&want)),
            "{opts:?}: no {want:?} in:\n{}",
            g.out
        );
        // The kernel's own refusal, and no buffer of ours it dropped.
        assert!(
            g.out
                .lines()
                .any(|l| l.ends_with(&format!("message is too big ({})", mtu + 1))),
            "{opts:?}:\n{}",
            g.out
        );
        assert!(!g.out.contains("inbound msg too big"), "{}", g.out);
        assert!(!g.out.contains("probe with driver"), "{}", g.out);
        for t in timed {
            let timing = g.out.lines().find(|l| {
                l.starts_with(&format!("rpmsg_echo raw: {t} bytes: ")) && l.ends_with("/s")
            });
            let Some(timing) = timing else {
                panic!("{opts:?}: no timing at {t} bytes:\n{}", g.out);
            };
            // The figure BENCHMARKS.md carries (seen with --nocapture).
            eprintln!("{opts:?}: {timing}");
        }
        // Every message arrived; all but those past BACK went back (and
        // the channel's announcement).
        let err = st.remote_log_with("remote: rx ");
        let stats = err
            .lines()
            .find_map(|l| l.strip_prefix("remote: rx "))
            .unwrap_or_else(|| panic!("no stats line:\n{err}"));
        let field = |i: usize| -> usize { stats.split(' ').nth(i).unwrap().parse().unwrap() };
        let (rx, tx) = (field(0), field(2));
        assert!(
            rx >= mtu,
            "{opts:?}: the remote received {rx} messages:\n{err}"
        );
        assert_eq!(tx, rx - (mtu - back) + 1, "{opts:?}: {stats}");
        assert!(stats.contains(" refused 0 malformed 0 "), "{err}");
    }
}
