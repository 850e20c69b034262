//! The guest rows of `iopath bench blk --guest`: a Linux guest's dd
//! (scripts/guest-dd, QEMU with TCG) on iopath's back end with virtio's
//! direct addresses, on the same back end with `swiotlb=force` behind the
//! vIOMMU (every block bounced by Linux, every address translated through
//! the IOTLB), and on qemu-storage-daemon. Each run measures every guest
//! row once, in an order that rotates from run to run, so the direct and
//! swiotlb rows alternate and their per-run ratios pair runs made side by
//! side.

use super::*;
use crate::guest::GuestDma;

/// Row names.
pub(super) const GUEST_OURS: &str = "guest dd (Linux, TCG) on iopath blk serve";
pub(super) const GUEST_SWIOTLB: &str =
    "guest dd (Linux, TCG) on iopath blk serve, swiotlb=force behind vIOMMU";
pub(super) const GUEST_PEER: &str = "guest dd (Linux, TCG) on qemu-storage-daemon";

/// One guest row: the socket it drives, how the guest maps its buffers.
struct GuestRow<'a> {
    sock: &'a Path,
    dma: GuestDma,
    series: Series,
}

/// The guest rows of one bench run, with the prepared guest (or why it
/// could not be prepared).
pub(super) struct GuestRows<'a> {
    script: Option<Result<PathBuf>>,
    rows: Vec<GuestRow<'a>>,
}

impl<'a> GuestRows<'a> {
    /// With `cfg.guest`: prepares the guest and sets up a row per guest
    /// setup; a back end that failed to start fails its rows. Without it:
    /// no rows.
    pub(super) fn new(
        cfg: &BlkBenchConfig,
        ours: (&'a Path, Option<&Error>),
        peer: (&'a Path, Option<&Error>),
    ) -> Self {
        let script = cfg.guest.then(crate::guest::prepare);
        let mut rows = Vec::new();
        if let Some(script) = &script {
            for (name, (sock, backend), dma) in [
                (GUEST_OURS, ours, GuestDma::Direct),
                (GUEST_SWIOTLB, ours, GuestDma::SwiotlbIommu),
                (GUEST_PEER, peer, GuestDma::Direct),
            ] {
                let failed = script.as_ref().err().or(backend);
                rows.push(GuestRow {
                    sock,
                    dma,
                    series: Series::new(name.into(), failed),
                });
            }
        }
        GuestRows { script, rows }
    }

    /// Rows to measure per run.
    pub(super) fn len(&self) -> usize {
        self.rows.len()
    }

    /// Measures every row once, starting at a row that moves by one each
    /// run. The guest (its QEMU) runs on `cpu`.
    pub(super) fn measure(
        &mut self,
        run: usize,
        cfg: &BlkBenchConfig,
        cpu: Option<usize>,
        cpus: &Cpus,
        bar: &ProgressBar,
    ) {
        let n = self.rows.len();
        for k in 0..n {
            let row = &mut self.rows[(k + run) % n];
            bar.set_message(format!("run {}: {}", run + 1, row.series.name));
            let (sock, dma) = (row.sock, row.dma);
            row.series.measure(|| match &self.script {
                Some(Ok(script)) => on_cpu(cpu, cpus, || {
                    crate::guest::dd_once(
                        script,
                        sock,
                        cfg.bs as u64,
                        (cfg.size / cfg.bs) as u64,
                        dma,
                    )
                }),
                _ => check_failed!("the guest is not prepared"),
            });
            bar.inc(1);
        }
    }

    /// The finished rows, iopath's two beside each other, then the peer's.
    pub(super) fn into_rows(self, limit: f64) -> Vec<Row> {
        self.rows.into_iter().map(|r| r.series.row(limit)).collect()
    }
}
