//! The create+destroy experiment of `tests/c/rpmsg_cycles.c`, through
//! iopath's client library instead of the Linux uAPI under the preload,
//! with the same output, so that the two can be run in turn against one
//! service (`scripts/rpmsg-preload-bench`) and the preload's own cost read
//! off per step:
//!
//! ```text
//! rpmsg_cycles CTRL legacy|fd LOOPS
//! mode=MODE loops=N total_us=T per_cycle_us=P [create_us= open_us= destroy_us= close_us=]
//! ```
//!
//! legacy: CREATE_EPT, open the node it names, destroy through it, close;
//! fd: CREATE_EPT_FD, close. 100 cycles of warm-up first.

use std::path::Path;
use std::process::ExitCode;
use std::time::Instant;

use iopath_rpmsg::ctrl::proto::{O_CLOEXEC, O_RDWR};
use iopath_rpmsg::ctrl::{CtrlClient, CtrlError, EptFd, EptInfo};

fn legacy(c: &CtrlClient, info: &EptInfo, steps: &mut [f64; 4]) -> Result<(), CtrlError> {
    let a = Instant::now();
    let (_, node) = c.create_ept(info)?;
    let b = Instant::now();
    let ep = EptFd::open_node(&node, O_CLOEXEC)?;
    let c = Instant::now();
    ep.shut()?;
    let d = Instant::now();
    drop(ep);
    let e = Instant::now();
    for (s, (x, y)) in steps.iter_mut().zip([(a, b), (b, c), (c, d), (d, e)]) {
        *s += (y - x).as_secs_f64() * 1e6;
    }
    Ok(())
}

fn fd_way(c: &CtrlClient, info: &EptInfo) -> Result<(), CtrlError> {
    drop(c.create_ept_fd(info, O_RDWR | O_CLOEXEC)?);
    Ok(())
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    let (Some(ctrl), Some(mode), Some(Ok(loops))) = (
        args.get(1),
        args.get(2),
        args.get(3).map(|n| n.parse::<u32>()),
    ) else {
        eprintln!("usage: rpmsg_cycles CTRL legacy|fd LOOPS");
        return ExitCode::from(2);
    };
    let is_fd = match mode.as_str() {
        "fd" => true,
        "legacy" => false,
        other => {
            eprintln!("rpmsg_cycles: mode {other}: legacy or fd");
            return ExitCode::from(2);
        }
    };
    let c = match CtrlClient::connect(Path::new(ctrl)) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("rpmsg_cycles: {ctrl}: {e}");
            return ExitCode::FAILURE;
        }
    };
    // The C program's channel name.
    let info = EptInfo::new("echo");
    let mut steps = [0f64; 4];
    let run = |n: u32, steps: &mut [f64; 4]| -> Result<(), CtrlError> {
        for _ in 0..n {
            if is_fd {
                fd_way(&c, &info)?;
            } else {
                legacy(&c, &info, steps)?;
            }
        }
        Ok(())
    };
    let timed = run(100, &mut steps).and_then(|()| {
        steps = [0.0; 4];
        let t = Instant::now();
        run(loops, &mut steps).map(|()| t.elapsed())
    });
    let us = match timed {
        Ok(t) => t.as_secs_f64() * 1e6,
        Err(e) => {
            eprintln!("rpmsg_cycles: {mode} cycle: {e}");
            return ExitCode::FAILURE;
        }
    };
    let n = f64::from(loops);
    print!(
        "mode={mode} loops={loops} total_us={us:.0} per_cycle_us={:.2}",
        us / n
    );
    if !is_fd {
        print!(
            " create_us={:.2} open_us={:.2} destroy_us={:.2} close_us={:.2}",
            steps[0] / n,
            steps[1] / n,
            steps[2] / n,
            steps[3] / n
        );
    }
    println!();
    ExitCode::SUCCESS
}
