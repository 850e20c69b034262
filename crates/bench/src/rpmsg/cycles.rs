//! The create+destroy rows: an endpoint created and destroyed the legacy
//! way (create, find and open the node, destroy through it, close) and the
//! fd way (create, close), beside the raw fd server's hand-offs, the ways
//! taking turns in chunks of [`CHUNK`] cycles.

use std::time::Instant;

use iopath_rpmsg::ctrl::proto::{O_CLOEXEC, O_RDWR};
use iopath_rpmsg::ctrl::{CtrlClient, EptFd, EptInfo};

use super::raw::fd::{Pass, RawFdServer};
use crate::error::{check, check_failed};
use crate::report::plot::{Chart, LIMIT, PRIMARY, SECONDARY};
use crate::report::{Cell, Column, Table, Unit};
use crate::{Error, Placement, ProgressBar, Result, Stats};

/// Cycles per turn: the ways alternate in chunks of this many.
const CHUNK: u64 = 500;
/// legacy, fd, limit (an eventfd passed), limit (a fresh socket passed),
/// limit (a fresh socket passed and watched until its close with epoll).
pub(super) const WAYS: usize = 5;
const NAMES: [&str; WAYS] = ["legacy", "fd", "limit", "limit-s", "limit-w"];
const LEGACY: usize = 0;
const FD: usize = 1;
const LIMIT_WAY: usize = 2;
/// What the raw fd server passes for the ways from [`LIMIT_WAY`] on.
const PASSES: [Pass; WAYS - LIMIT_WAY] = [Pass::Eventfd, Pass::Socket, Pass::Watched];
/// What each way does per cycle.
const WHAT: [&str; WAYS] = [
    "CREATE_EPT, open the node (connect + greeting), destroy through it, close",
    "CREATE_EPT_FD (the endpoint comes back over SCM_RIGHTS), close",
    "raw SOCK_SEQPACKET request/response, two processes, an eventfd passed",
    "the same, a fresh SOCK_SEQPACKET socket passed (created, closed)",
    "limit-s plus what the service must do per endpoint (the passed end's send buffer at the smallest; the kept end watched by epoll until the client's close, read, closed)",
];

/// One loop count's figures, per way: the totals of each run and the
/// per-cycle microseconds of every chunk of every run.
#[derive(Debug, Default)]
pub(super) struct Row {
    loops: u64,
    totals: [Vec<f64>; WAYS],
    chunks: [Vec<f64>; WAYS],
}

/// A row per loop count in `loops`, `runs` times each: every way through
/// the endpoint service on `c` (holding one endpoint, the echo's) and
/// through the raw fd server `raw`; `placement` names the progress.
pub(super) fn rows(
    c: &CtrlClient,
    raw: &RawFdServer,
    loops: &[u64],
    runs: usize,
    placement: Placement,
    pb: &ProgressBar,
) -> Result<Vec<Row>> {
    let info = EptInfo::new("bench");
    let requests = PASSES.map(RawFdServer::request);
    let requests = requests.into_iter().collect::<Result<Vec<_>>>()?;
    let cycle = |w| match w {
        LEGACY => {
            let (_, path) = c.create_ept(&info).map_err(Error::layer("CREATE_EPT"))?;
            let node =
                EptFd::open_node(&path, O_CLOEXEC).map_err(Error::layer("opening the node"))?;
            node.destroy()
                .map_err(Error::layer("destroying through the node"))
        }
        FD => c
            .create_ept_fd(&info, O_RDWR | O_CLOEXEC)
            .map(drop)
            .map_err(Error::layer("CREATE_EPT_FD")),
        _ => raw.cycle(&requests[w - LIMIT_WAY]),
    };
    let mut rows: Vec<Row> = loops
        .iter()
        .map(|&loops| Row {
            loops,
            ..Row::default()
        })
        .collect();
    for run in 0..runs {
        for row in &mut rows {
            // The ways take turns in chunks, so that each sees the same
            // machine (others' load comes and goes); the order rotates
            // per chunk so that none always runs warm.
            let mut tot = [0.0f64; WAYS];
            let (mut done, mut turn) = (0, run);
            while done < row.loops {
                let n = CHUNK.min(row.loops - done);
                for w in crate::turns(WAYS, turn) {
                    pb.set_message(format!("{} {}", placement.name(), NAMES[w]));
                    let t = Instant::now();
                    for _ in 0..n {
                        cycle(w)?;
                        pb.inc(1);
                    }
                    // Closing is asynchronous: the fd way counts until the
                    // service has freed them all but the echo endpoint the
                    // bench holds.
                    while w == FD && c.stats().map_err(Error::layer("STATS"))?.endpoints() > 1 {
                        std::hint::spin_loop();
                    }
                    let us = t.elapsed().as_secs_f64() * 1e6;
                    tot[w] += us;
                    row.chunks[w].push(us / n as f64);
                }
                done += n;
                turn += 1;
            }
            row.totals.iter_mut().zip(tot).for_each(|(v, t)| v.push(t));
        }
    }
    let st = c.stats().map_err(Error::layer("STATS"))?;
    check!(
        st.endpoints() == 1 && st.open_nodes == 0,
        "the service still holds endpoints after the cycles: {st:?}"
    );
    Ok(rows)
}

/// One row per way: its total per loop count, its cost per cycle (over
/// every chunk of every row), and the fd way's cost over it (over limit-s
/// and limit-w: the fd way against the cheapest hand-off with the same
/// semantics).
pub(super) fn table(placement: Placement, place: &str, rows: &[Row], runs: usize) -> Table {
    let mut columns = vec![Column::left("way")];
    let totals = rows.iter().map(|r| format!("{} loops, total us", r.loops));
    columns.extend(totals.map(Column::right));
    columns.extend([Column::right("per cycle us"), Column::right("fd / way")]);
    let name = placement.name();
    let title = format!("endpoint create+destroy, placement {name} ({place}): {runs} runs; totals median (min-max); per cycle: median (min-max) over {CHUNK}-cycle chunks");
    let mut t = Table::new(title, columns);
    let per_cycle: [Vec<f64>; WAYS] =
        std::array::from_fn(|w| rows.iter().flat_map(|r| r.chunks[w].clone()).collect());
    let fd = Stats::of(&per_cycle[FD]).median;
    for (w, pc) in per_cycle.iter().enumerate() {
        let totals = rows.iter().map(|r| &r.totals[w]);
        let mut cells = vec![Cell::text(NAMES[w])];
        cells.extend(totals.map(|v| Cell::runs(v, Unit::Grouped, 0)));
        cells.push(Cell::runs(pc, Unit::Plain, 1));
        cells.push(Cell::times(fd / Stats::of(pc).median));
        t.row(cells);
    }
    for (name, what) in NAMES.iter().zip(WHAT) {
        t.note(format!("{name}: {what}"));
    }
    t
}

/// The chart of `t` (the table at `placement`): each way's microseconds
/// per cycle, min-max over its chunks, in a group of the placement.
pub(super) fn chart(placement: Placement, t: &Table) -> Chart {
    let title = "Creating and destroying an rpmsg endpoint: us per cycle, legacy vs fd";
    let about = format!(
        "median (min-max) over {CHUNK}-cycle chunks; the limits hand an eventfd or a socket \
         over a raw SOCK_SEQPACKET between two processes"
    );
    let mut c = Chart::new("rpmsg-endpoint-create-destroy", title, "us")
        .about(about, "us per create+destroy cycle, lower is faster")
        .legend(&[
            ("legacy: CREATE_EPT, open the node", SECONDARY),
            ("fd: CREATE_EPT_FD", PRIMARY),
            ("limits: raw fd hand-offs", LIMIT),
        ]);
    c.group(format!("placement {}", placement.name()));
    let v = t.col("per cycle us");
    let bars = [
        ("legacy", SECONDARY),
        ("fd", PRIMARY),
        ("limit: eventfd passed", LIMIT),
        ("limit-s: socket passed", LIMIT),
        ("limit-w: socket, watched", LIMIT),
    ];
    for (row, (label, color)) in t.rows.iter().zip(bars) {
        debug_assert!(label.starts_with(&row[0].to_string()));
        c.bar(label, &row[v], color);
    }
    c
}
