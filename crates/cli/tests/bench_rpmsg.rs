//! `iopath bench rpmsg` through the binary: small loop counts, the JSON
//! shape scripts rely on, and figures that are real measurements.

use std::process::Command;

#[test]
fn bench_rpmsg_json() {
    let o = Command::new(env!("CARGO_BIN_EXE_iopath"))
        .args([
            "bench", "rpmsg", "--loops", "200,300", "--runs", "1", "--count", "300", "--poll",
            "--json",
        ])
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "bench failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let rows = v["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 2);
    for (r, loops) in rows.iter().zip([200, 300]) {
        assert_eq!(r["loops"], loops);
        let (legacy, fd) = (
            r["legacy_us"].as_f64().unwrap(),
            r["fd_us"].as_f64().unwrap(),
        );
        // Each cycle is at least a few system calls and a process switch.
        assert!(legacy > loops as f64 && fd > loops as f64, "{r}");
        assert!(r["limit_us"].as_f64().unwrap() > 0.0, "{r}");
    }
    assert!(v["limit"]["rtt_us"].as_f64().unwrap() > 0.0);
    assert!(v["limit"]["socket_rtt_us"].as_f64().unwrap() > 0.0);
    // Every placement measured, each with its own rows and limit; the
    // first fills the top-level rows.
    let places = v["placements"].as_array().unwrap();
    let names: Vec<&str> = places
        .iter()
        .map(|p| p["placement"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["one", "split", "free"]);
    assert_eq!(v["rows"], places[0]["rows"]);
    for p in places {
        assert_eq!(p["rows"].as_array().unwrap().len(), 2, "{p}");
        assert!(p["limit"]["rtt_us"].as_f64().unwrap() > 0.0, "{p}");
        assert!(p["echo"]["fd"]["p50_us"].as_f64().unwrap() > 0.0, "{p}");
    }
    for k in ["fd", "fd_poll", "limit_eventfd_pingpong"] {
        let e = &v["echo"][k];
        assert_eq!(e["count"], 300, "{k}: {e}");
        assert!(e["p50_us"].as_f64().unwrap() > 0.0, "{k}: {e}");
        assert!(e["max_us"].as_f64() >= e["p50_us"].as_f64(), "{k}: {e}");
    }
}

#[test]
fn bench_rpmsg_bad_loops() {
    let o = Command::new(env!("CARGO_BIN_EXE_iopath"))
        .args(["bench", "rpmsg", "--loops", "0"])
        .output()
        .unwrap();
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("--loops"), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
}
