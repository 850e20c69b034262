//! A real Linux guest drives a vhost-user-blk back end: `scripts/guest-dd`
//! boots Debian's kernel under QEMU (TCG) on the back end's socket and runs
//! `dd if=/dev/zero of=/dev/vda bs=8M count=N oflag=direct`, a direct read of
//! the same range, then writes a pattern and reads it back. The host then
//! checks the image byte for byte: zeros where dd wrote zeros, the pattern
//! where the guest wrote it, and the untouched fill everywhere else.
//!
//! Back ends: iopath's own (`iopath blk serve`) and, as a second peer,
//! `qemu-storage-daemon`. Each runs with 1 and with 2 queues (the guest then
//! has 2 CPUs and writes one pattern slice from each, so both virtqueues
//! carry requests). A short 4 KiB random run (`--access rand`) on iopath's
//! back end checks every block it read in the guest and every block it
//! wrote on the image.

mod guest;

use guest::rand::*;
use guest::restart::*;
use guest::*;

use std::process::Command;

#[test]
fn guest_dd_qemu_storage_daemon() {
    if !iopath_testkit::have_peers(&[QSD]) {
        return;
    }
    guest_dd_against(start_qsd);
}

#[test]
fn guest_dd_iopath_blk_serve() {
    guest_dd_against(start_iopath);
}

/// The device behind the guest's intel-iommu: `ACCESS_PLATFORM`, every
/// address an IOVA the back end resolves through IOTLB misses answered by
/// QEMU, while the guest's lazy IOTLB flushes invalidate ranges with I/O in
/// flight (which once deadlocked the miss, the invalidation's
/// acknowledgement and the I/O until the miss timed out).
#[test]
fn guest_dd_iommu_iopath_blk_serve() {
    let Some((_guard, dir)) = guest_ready() else {
        return;
    };
    let seed = 0x10_4d4d_55ee_d001u64;
    let image = dir.path().join("disk-iommu.img");
    let sock = dir.path().join("vu-iommu.sock");
    make_image(&image, &RUN);
    let mut backend = start_iopath(&image, &sock, 1, dir.path().join("backend-iommu.log"));
    wait_for_socket(&mut backend, &sock);
    run_guest(&mut backend, &sock, dir.path(), 1, seed, Dma::Iommu);
    drop(backend);
    if let Err(e) = check_image(&image, &RUN, seed) {
        panic!("behind the vIOMMU: the image disagrees with the guest: {e}");
    }
    println!("behind intel-iommu: guest dd and pattern passed, image checked byte for byte");
}

/// The DMA API in a real guest: the device behind intel-iommu and the
/// guest booted with `swiotlb=force` (`iommu=pt`, since the translating
/// DMA layer ignores it), so Linux copies every block through its bounce
/// buffer and the back end resolves every address through IOTLB misses.
/// The guest must show the bounce buffer in use and its segments capped
/// at swiotlb's 256 KiB, the back end's IOTLB summary must show the
/// misses it reported and the updates that answered them, and the image
/// must hold exactly what the guest wrote.
#[test]
fn guest_dd_swiotlb_iommu_iopath_blk_serve() {
    let Some((_guard, dir)) = guest_ready() else {
        return;
    };
    let seed = 0x5b10_7bf0_4ced_0002u64;
    let image = dir.path().join("disk-swiotlb.img");
    let sock = dir.path().join("vu-swiotlb.sock");
    let log = dir.path().join("backend-swiotlb.log");
    make_image(&image, &RUN);
    let mut backend = start_iopath(&image, &sock, 1, log.clone());
    wait_for_socket(&mut backend, &sock);
    let json = run_guest(&mut backend, &sock, dir.path(), 1, seed, Dma::IommuSwiotlb);
    drop(backend);
    if let Err(e) = check_image(&image, &RUN, seed) {
        panic!("swiotlb=force behind the vIOMMU: the image disagrees with the guest: {e}");
    }
    let dma = &json["dma"];
    assert_eq!(dma["iommu"], true, "{dma}");
    assert_eq!(dma["swiotlb_force"], true, "{dma}");
    assert_eq!(dma["iommu_group"], "identity", "iommu=pt: {dma}");
    assert_eq!(
        dma["max_segment_size"], 262144,
        "swiotlb caps a segment at 256 KiB: {dma}"
    );
    assert!(dma["swiotlb_mb"].as_u64().unwrap_or(0) > 0, "{dma}");
    let peak = dma["swiotlb_peak_slabs"].as_u64().unwrap_or(0);
    assert!(peak > 0, "the bounce buffer was never in use: {dma}");
    // The back end's summary of this front end's IOTLB. Every translation
    // began as a miss: a guest that bounced 64 MiB of dd and the pattern
    // through a 64 MiB buffer touched thousands of 4 KiB IOVA pages.
    let text = std::fs::read_to_string(&log).expect("read back-end log");
    let summary = text
        .lines()
        .find_map(|l| l.split_once("front end's IOTLB: ").map(|(_, s)| s))
        .unwrap_or_else(|| panic!("no IOTLB summary in the back end's log:\n{text}"));
    // "16139 updates, 0 invalidations, 16137 misses reported (0 unanswered)"
    let words: Vec<&str> = summary
        .split([' ', ',', '(', ')'])
        .filter(|w| !w.is_empty())
        .collect();
    let count = |what: &str| -> u64 {
        words
            .windows(2)
            .find(|w| w[1] == what)
            .and_then(|w| w[0].parse().ok())
            .unwrap_or_else(|| panic!("no count of {what} in {summary:?}"))
    };
    let (updates, misses, unanswered) = (count("updates"), count("misses"), count("unanswered"));
    assert!(misses >= 1024, "too few IOTLB misses: {summary}");
    assert!(updates >= misses, "a miss went unanswered: {summary}");
    assert_eq!(unanswered, 0, "{summary}");
    println!(
        "swiotlb=force behind intel-iommu: write {} MB/s, read {} MB/s; bounce peak {peak} \
         slabs; back end's IOTLB: {summary}; image checked byte for byte",
        json["write"]["mb_per_s"], json["read"]["mb_per_s"]
    );
}

/// 4 KiB random I/O in the guest (`guest-dd --access rand`) on `iopath blk
/// serve`, two requests in flight: every random read matched the pattern
/// in the guest, the writes' complement blocks are exactly where the
/// guest counted them, on the image, and the rest of the image is
/// untouched.
#[test]
fn guest_rand_4k_iopath_blk_serve() {
    let Some((_guard, dir)) = guest_ready() else {
        return;
    };
    let seed = 0x4b1d_0000_7a9d_0028u64;
    let image = dir.path().join("disk-rand.img");
    let sock = dir.path().join("vu-rand.sock");
    make_rand_image(&image);
    let mut backend = start_iopath(&image, &sock, 1, dir.path().join("backend-rand.log"));
    wait_for_socket(&mut backend, &sock);
    let json = run_guest_rand(&mut backend, &sock, dir.path(), 400, 2, seed);
    drop(backend);
    let written = check_rand_image(&image, seed)
        .unwrap_or_else(|e| panic!("after random I/O, the image disagrees with the guest: {e}"));
    assert_eq!(
        json["write"]["distinct_blocks"], written,
        "blocks the guest wrote vs blocks holding its data on the image"
    );
    // The check itself must be able to fail: another seed is another pattern.
    assert!(
        check_rand_image(&image, seed ^ 8).is_err(),
        "the random-I/O image check accepts any seed"
    );
    println!(
        "random 4K, QD2: read {} IOPS (p50 {} us, p99 {} us), write {} IOPS (p50 {} us, \
         p99 {} us); {written} blocks written, image checked block by block",
        json["read"]["iops"],
        json["read"]["p50_us"],
        json["read"]["p99_us"],
        json["write"]["iops"],
        json["write"]["p50_us"],
        json["write"]["p99_us"]
    );
}

/// Bad random-I/O options are refused before anything boots, with usage
/// status 2 and the option named.
#[test]
fn guest_dd_rand_refuses_bad_values() {
    for (args, option) in [
        (&["--access", "random"][..], "--access"),
        (&["--rand-threads", "2"], "--rand-threads"),
        (
            &["--access", "rand", "--rand-threads", "0"],
            "--rand-threads",
        ),
        (
            &["--access", "rand", "--rand-threads", "65"],
            "--rand-threads",
        ),
        (&["--access", "rand", "--bs", "512"], "--bs"),
        (&["--access", "rand", "--bs", "8M"], "--pattern-size"),
        (&["--access", "rand", "--count", "0"], "--count"),
        (
            &["--access", "rand", "--check-image", "x.img"],
            "--check-image",
        ),
    ] {
        let out = Command::new(repo().join("scripts/guest-dd"))
            .args(["--socket", "/nonexistent/vu.sock"])
            .args(args)
            .output()
            .expect("run scripts/guest-dd");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(
            stderr.contains(option),
            "{args:?}: the error names no {option}: {stderr}"
        );
    }
}

#[test]
fn pattern_word_is_offset_xor_seed_little_endian() {
    assert_eq!(pattern_word(8, 0), [8, 0, 0, 0, 0, 0, 0, 0]);
    assert_eq!(pattern_word(0x1000, 0xff), [0xff, 0x10, 0, 0, 0, 0, 0, 0]);
}

/// `scripts/guest-dd-bench` puts the guest's dd on each back end, and on
/// iopath's with swiotlb=force behind the vIOMMU, beside the host's
/// O_DIRECT dd, and below them the back ends' ratio and the bounced row's
/// to the direct one, of the medians and round by round.
#[test]
fn guest_dd_bench_rows_and_ratios() {
    if !iopath_testkit::have_peers(&[QEMU, QSD]) {
        return;
    }
    let _guard = guest_lock();
    prepare();
    let dir = tempfile::tempdir_in("/var/tmp").expect("tempdir");
    let out = Command::new(repo().join("scripts/guest-dd-bench"))
        .args([
            "--count",
            "4",
            "--runs",
            "2",
            "--iopath",
            env!("CARGO_BIN_EXE_iopath"),
        ])
        .arg("--dir")
        .arg(dir.path())
        .output()
        .expect("run scripts/guest-dd-bench");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "guest-dd-bench failed: {stderr}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = |start: &str| {
        let l = stdout.lines().find(|l| l.starts_with(start));
        l.unwrap_or_else(|| panic!("no line {start:?} in {stdout}"))
    };
    let first_figure = |s: &str| s.split_whitespace().next()?.parse::<f64>().ok();
    for row in [
        "host dd, O_DIRECT, same image (limit)",
        "guest dd on qemu-storage-daemon",
        "guest dd on iopath blk serve",
        "guest dd on iopath blk serve, swiotlb=force behind vIOMMU",
    ] {
        let l = line(&format!("| {row} |"));
        let write = l.split('|').nth(2).and_then(first_figure);
        assert!(write.is_some_and(|w| w > 0.0), "{row}: {l}");
    }
    for ratio in [
        "guest dd: iopath blk serve / qemu-storage-daemon, medians: write ",
        "guest dd: swiotlb=force behind vIOMMU / direct (iopath blk serve), medians: write ",
    ] {
        let l = line(ratio);
        assert!(
            first_figure(&l[ratio.len()..]).is_some_and(|r| r > 0.0),
            "{l}"
        );
        assert!(l.contains("(round by round "), "{l}");
    }
}

/// The guest's own check can fail: against a back end that drops writes
/// and reads zeros (qemu-storage-daemon's null-co driver), guest-dd exits 1
/// with the pattern mismatch as its reason.
#[test]
fn guest_dd_fails_when_the_back_end_loses_writes() {
    if !iopath_testkit::have_peers(&[QEMU, QSD]) {
        return;
    }
    let _guard = guest_lock();
    prepare();
    let dir = tempfile::tempdir().expect("tempdir");
    let sock = dir.path().join("null.sock");
    let mut cmd = Command::new("qemu-storage-daemon");
    cmd.arg("--blockdev")
        .arg(format!(
            "driver=null-co,node-name=disk,size={},read-zeroes=on",
            64u64 << 20
        ))
        .arg("--export")
        .arg(format!(
            "type=vhost-user-blk,id=exp,node-name=disk,addr.type=unix,addr.path={},writable=on",
            sock.display()
        ));
    let mut backend = guest::spawn(
        "qemu-storage-daemon (null-co)",
        cmd,
        dir.path().join("b.log"),
    );
    wait_for_socket(&mut backend, &sock);
    let out = Command::new(repo().join("scripts/guest-dd"))
        .arg("--socket")
        .arg(&sock)
        .args(["--count", "1", "--timeout", "240", "--json"])
        .output()
        .expect("run scripts/guest-dd");
    drop(backend);
    assert_eq!(out.status.code(), Some(1), "guest-dd must fail: {out:?}");
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("failure JSON");
    assert_eq!(json["result"], "fail");
    assert_eq!(json["reason"], "pattern read-back differs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("first mismatch at device offset 65536"),
        "the guest names the first bad word: {stderr}"
    );
}

/// Back-end restart under a running guest: `iopath blk serve` is killed
/// with SIGKILL while requests are in flight, once during the guest's dd
/// and once during its pattern write, and started again on the same image
/// and socket; QEMU reconnects (`reconnect-ms`), hands the new back end
/// the inflight record (`SET_INFLIGHT_FD`), and the back end resubmits the
/// heads it holds. Two virtqueues (the guest has two CPUs and writes half
/// the pattern from each), so each queue's region of the record must be
/// kept and replayed apart. The guest's dd and pattern check must pass
/// without an I/O error and the image must hold exactly what the guest
/// wrote.
#[test]
fn guest_dd_survives_iopath_blk_serve_restarts() {
    let Some((_guard, dir)) = guest_ready() else {
        return;
    };
    let seed = 0x7e57_a27e_d0d0_cafeu64;
    let run = guest_through_restarts(dir.path(), seed, 2, &start_iopath);
    println!("restart: {}", describe(&run));
    assert_eq!(run.kills.len(), 2, "both kills landed: {}", describe(&run));
    if let Err(e) = &run.guest {
        panic!(
            "the guest failed through the restarts: {e}\n{}",
            describe(&run)
        );
    }
    if let Err(e) = &run.image {
        panic!(
            "the image disagrees with the guest: {e}\n{}",
            describe(&run)
        );
    }
    // The record was there at every kill, and at least once held requests
    // (the stop is retried until it does); each restarted back end
    // resubmitted what the record held at its predecessor's kill (one
    // fewer when the kill fell between a used-ring update and the record's:
    // that head was complete and is not run again).
    assert!(
        run.kills.iter().all(|k| k.inflight.is_some()),
        "no inflight record: {}",
        describe(&run)
    );
    let mut total = 0;
    for k in &run.kills {
        let log = std::fs::read_to_string(&k.log).unwrap_or_default();
        for (q, &held) in k.inflight.iter().flatten().enumerate() {
            let resubmitted = log
                .lines()
                .find_map(|l| {
                    let (_, rest) = l.split_once(&format!("queue {q}: "))?;
                    let (n, _) = rest.split_once(" request(s) were in flight")?;
                    n.parse::<usize>().ok()
                })
                .unwrap_or(0);
            assert!(
                resubmitted == held || resubmitted + 1 == held,
                "killed during {}: queue {q}'s record held {held} heads, the new back end \
                 resubmitted {resubmitted}\n{log}",
                k.during
            );
            total += resubmitted;
        }
    }
    assert!(
        total > 0,
        "no restart resubmitted a request: {}",
        describe(&run)
    );
}

/// The same restarts with `qemu-storage-daemon` as the back end: a peer's
/// result, recorded (BENCHMARKS.md), not required; the test fails only if
/// the run itself could not be made.
#[test]
fn guest_dd_restart_qemu_storage_daemon_recorded() {
    if !iopath_testkit::have_peers(&[QSD]) {
        return;
    }
    let Some((_guard, dir)) = guest_ready() else {
        return;
    };
    let seed = 0x0a5d_0a5d_0a5d_0a5du64;
    let run = guest_through_restarts(dir.path(), seed, 2, &start_qsd);
    println!("restart: {}", describe(&run));
    // The second kill waits for the pattern, which a guest stuck after the
    // first never writes: only the first must have landed.
    assert!(!run.kills.is_empty(), "no kill landed: {}", describe(&run));
}
