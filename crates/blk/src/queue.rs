//! [`BlkQueue`]: one virtio-blk request queue of the driver. Requests are
//! cut by [`crate::plan`], their header, range segment and status live in
//! a metadata slot per request in flight in the queue's driver area
//! (coherent, beside the rings), and only the data goes through the DMA
//! ops' `map`/`unmap`.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use iopath_dma::{DmaOps, MapWait};
use iopath_virtio::queue::INDIRECT_MAX;
use iopath_virtio::{PollMode, Poller, Seg, SplitQueue, Transport, Waited};

use vm_memory::ByteValued;

use crate::command::{Command, Done};
use crate::config::DeviceConfig;
use crate::error::{BlkError, Result};
use crate::plan::{cut, PieceSpec};
use crate::queue_wait::{kind_name, UsedRing};
use crate::wire::{
    OutHeader, RangeSegment, HEADER_LEN, RANGE_LEN, VIRTIO_BLK_ID_BYTES as ID_LEN,
    VIRTIO_BLK_S_IOERR as S_IOERR, VIRTIO_BLK_S_OK as S_OK, VIRTIO_BLK_S_UNSUPP as S_UNSUPP,
};

/// Request types (virtio 1.x, 5.2.6) by their short names.
mod req_type {
    pub use crate::wire::{
        VIRTIO_BLK_T_FLUSH as FLUSH, VIRTIO_BLK_T_GET_ID as GET_ID, VIRTIO_BLK_T_IN as IN,
        VIRTIO_BLK_T_OUT as OUT,
    };
}

/// Per-request metadata slot in the queue's driver area: header (16), range
/// segment (16), `GET_ID` answer (20), status (1) at an 8-byte boundary,
/// padded to 64.
pub(crate) const META_SLOT: usize = 64;
const META_RANGE: usize = HEADER_LEN;
const META_ID: usize = META_RANGE + RANGE_LEN;
const META_STATUS: usize = (META_ID + ID_LEN).next_multiple_of(8);
const _: () = assert!(META_STATUS < META_SLOT);
/// Status byte written before submission; a device that completes without
/// writing a status is caught by it.
const STATUS_UNSET: u8 = 0xff;
/// Longest a coalesced wait ([`BlkQueue::coalesce`]) sleeps for its batch
/// before it takes what has completed: some ten times a batch of 32 4 KiB
/// requests here, short beside the request timeout.
const COALESCE_WAIT: Duration = Duration::from_millis(1);

/// A transfer (a [`Command`]) in flight: the virtio requests it was cut into.
#[derive(Debug)]
struct Transfer {
    /// Pieces not yet completed.
    pending: usize,
    /// Pieces not yet submitted (the submit loop is still going).
    submitting: bool,
    error: Option<BlkError>,
}

/// One virtio request in flight, by metadata slot.
#[derive(Debug, Clone, Copy)]
struct Piece {
    tag: u64,
    kind: u32,
    sector: u64,
    /// Order of submission on this queue (the oldest is named on a
    /// timeout).
    seq: u64,
    /// When it was published, if it was submitted under
    /// [`BlkQueue::limit_in_flight`].
    since: Option<Instant>,
}

/// One virtio-blk request queue: submit [`Command`]s with tags, collect
/// [`Done`]s. Many requests may be in flight; a request larger than the
/// device's limits is cut into several virtio requests and completes once.
#[derive(Debug)]
pub struct BlkQueue<O: DmaOps + ?Sized = dyn DmaOps> {
    // The ring goes before the transport (drop order, as in `BlkDriver`).
    vq: SplitQueue<O>,
    transport: Arc<dyn Transport>,
    config: DeviceConfig,
    free_slots: Vec<u16>,
    pieces: Vec<Option<Piece>>,
    /// By tag (foldhash: tags are the caller's, the map is on every
    /// request's path).
    transfers: foldhash::HashMap<u64, Transfer>,
    done: VecDeque<Done>,
    timeout: Duration,
    indirect: bool,
    poller: Poller,
    submitted: u64,
    /// Between [`BlkQueue::plug`] and [`BlkQueue::unplug`]: submissions
    /// do not notify the device.
    plugged: bool,
    /// See [`BlkQueue::coalesce`].
    coalesce: bool,
    /// An interrupt a sleep left for the next one to take (see
    /// [`crate::queue_wait::UsedRing`]).
    irq_pending: bool,
    /// See [`BlkQueue::limit_in_flight`].
    limit: Option<usize>,
}

impl<O: DmaOps + ?Sized> BlkQueue<O> {
    /// A queue on the ring `vq` (already given to the device), whose
    /// driver area has [`META_SLOT`] bytes per ring entry for the
    /// requests' headers and statuses; `indirect` when indirect
    /// descriptors were negotiated; waits for completions as `poll` says.
    pub(crate) fn new(
        transport: Arc<dyn Transport>,
        config: DeviceConfig,
        mut vq: SplitQueue<O>,
        timeout: Duration,
        indirect: bool,
        poll: PollMode,
    ) -> Self {
        let size = vq.size();
        // A request of one data segment (header, data, status) is chained
        // in the ring rather than put in an indirect table: the back end
        // then reads three descriptors instead of one plus a table.
        vq.chain_up_to(3);
        let mut poller = Poller::new(poll);
        poller.set_peer(transport.peer());
        BlkQueue {
            transport,
            config,
            vq,
            free_slots: (0..size).rev().collect(),
            pieces: vec![None; usize::from(size)],
            transfers: foldhash::HashMap::default(),
            done: VecDeque::new(),
            timeout,
            indirect,
            poller,
            submitted: 0,
            plugged: false,
            coalesce: false,
            irq_pending: false,
            limit: None,
        }
    }

    /// Queue index.
    pub fn index(&self) -> u16 {
        self.vq.index()
    }

    /// Requests submitted and not yet returned by [`BlkQueue::complete`].
    pub fn in_flight(&self) -> usize {
        self.transfers.len()
    }

    /// Submits `req` under `tag` (unique among this queue's requests in
    /// flight). Returns once every piece is on the ring; when the ring or
    /// the DMA ops' space is full it first waits for completions (kept for
    /// [`BlkQueue::complete`]).
    ///
    /// # Errors
    /// Argument errors ([`BlkError::Unaligned`], [`BlkError::OutOfRange`],
    /// [`BlkError::Empty`], [`BlkError::NotSupported`],
    /// [`BlkError::ReadOnly`], [`BlkError::DuplicateTag`], a buffer range
    /// outside the buffer) before anything is queued; queue, DMA and
    /// transport errors after (pieces already queued still complete under
    /// `tag`, with the error).
    pub fn submit(&mut self, req: Command<'_>, tag: u64) -> Result<()> {
        if self.transfers.contains_key(&tag) {
            return Err(BlkError::DuplicateTag { tag });
        }
        let max_descs = u32::from(self.vq.size()).min(if self.indirect {
            INDIRECT_MAX as u32
        } else {
            u32::MAX
        });
        let max_map = self.vq.ops().max_mapping_size() as u64;
        let pieces = cut(&req, &self.config, max_map, max_descs)?;
        self.transfers.insert(
            tag,
            Transfer {
                pending: 0,
                submitting: true,
                error: None,
            },
        );
        let mut result = Ok(());
        for p in pieces {
            if let Err(e) = self.submit_piece(&req, &p, tag) {
                result = Err(e);
                break;
            }
            if let Some(t) = self.transfers.get_mut(&tag) {
                t.pending += 1;
            }
        }
        self.release_held();
        if !self.plugged && self.vq.should_notify() {
            if let Err(e) = self.transport.notify(self.vq.index()) {
                result = result.and(Err(e.into()));
            }
        }
        let t = self.transfers.get_mut(&tag).expect("inserted above");
        t.submitting = false;
        if let Err(e) = result {
            if t.pending == 0 {
                self.transfers.remove(&tag);
                return Err(e);
            }
            t.error.get_or_insert(e);
        } else if t.pending == 0 {
            self.finish(tag, None);
        }
        Ok(())
    }

    /// Holds the device's notification back until [`BlkQueue::unplug`]
    /// (as Linux's `blk_start_plug`): requests submitted meanwhile go on the
    /// ring, and the device, woken once, finds them all there instead of
    /// racing the driver for each. A wait for completions unplugs first.
    pub fn plug(&mut self) {
        self.plugged = true;
    }

    /// Whether this thread and the device's process may both run only on
    /// one and the same CPU (as the queue's poller last checked): then a
    /// notification hands the device the CPU, and is best sent once a batch
    /// is on the ring.
    pub fn shares_cpu_with_device(&mut self) -> bool {
        self.poller.shares_cpu_with_peer()
    }

    /// Ends [`BlkQueue::plug`]: notifies the device if what was submitted
    /// since needs it (`VIRTIO_RING_F_EVENT_IDX` says whether it sleeps).
    ///
    /// # Errors
    /// The transport's notification failed.
    pub fn unplug(&mut self) -> Result<()> {
        self.plugged = false;
        self.release_held();
        if self.vq.should_notify() {
            self.transport.notify(self.vq.index())?;
        }
        Ok(())
    }

    /// Puts one virtio request on the ring, waiting for room if needed.
    fn submit_piece(&mut self, req: &Command<'_>, p: &PieceSpec, tag: u64) -> Result<()> {
        loop {
            if self.free_slots.is_empty() {
                self.reap_blocking()?;
                continue;
            }
            // With requests of ours in flight, fail fast and reap them to get
            // room back; with none, the room (bounce slots, IOVAs) is held by
            // other queues of the same ops: wait for them to free it.
            let wait = if self.vq.in_flight() > 0 {
                MapWait::Fail
            } else {
                MapWait::Timeout(self.timeout)
            };
            match self.try_add(req, p, tag, wait) {
                Ok(()) => return Ok(()),
                Err(BlkError::Virtio(iopath_virtio::Error::QueueFull { .. }))
                | Err(BlkError::Virtio(iopath_virtio::Error::Dma(iopath_dma::Error::NoSpace {
                    ..
                })))
                | Err(BlkError::Dma(iopath_dma::Error::NoSpace { .. }))
                    if self.vq.in_flight() > 0 =>
                {
                    // Room comes back as requests complete.
                    self.reap_blocking()?;
                }
                Err(e) => return Err(e),
            }
        }
    }

    fn try_add(&mut self, req: &Command<'_>, p: &PieceSpec, tag: u64, wait: MapWait) -> Result<()> {
        let slot = *self.free_slots.last().expect("checked by caller");
        let base = usize::from(slot) * META_SLOT;
        let (kind, sector) = match *p {
            PieceSpec::Data { sector, .. } => (
                if matches!(req, Command::Write { .. }) {
                    req_type::OUT
                } else {
                    req_type::IN
                },
                sector,
            ),
            PieceSpec::Flush => (req_type::FLUSH, 0),
            PieceSpec::Range {
                kind,
                sector,
                sectors,
                unmap,
            } => {
                self.vq.area_write(
                    base + META_RANGE,
                    RangeSegment::new(sector, sectors, unmap).as_slice(),
                )?;
                (kind, sector)
            }
            PieceSpec::GetId => (req_type::GET_ID, 0),
        };
        self.vq
            .area_write(base, OutHeader::new(kind, sector).as_slice())?;
        self.vq.area_write(base + META_STATUS, &[STATUS_UNSET])?;
        let hdr = Seg::area(base, HEADER_LEN);
        let status = Seg::area(base + META_STATUS, 1);
        let buf = match req {
            Command::Read { buf, .. } | Command::Write { buf, .. } => Some(*buf),
            _ => None,
        };
        // The common request, one data segment, is built on the stack.
        if let (
            Some(buf),
            PieceSpec::Data {
                buf_offset, chunk, ..
            },
        ) = (buf, p)
        {
            if chunk.len <= chunk.seg {
                let data = Seg::buf(buf, *buf_offset, chunk.len as usize);
                let (out, inp): (&[Seg<'_>], &[Seg<'_>]) = if kind == req_type::OUT {
                    (&[hdr, data], &[status])
                } else {
                    (&[hdr], &[data, status])
                };
                self.vq.add_wait(out, inp, u64::from(slot), wait)?;
                self.added(slot, tag, kind, sector);
                return Ok(());
            }
        }
        let mut data: Vec<Seg<'_>> = Vec::new();
        if let (
            Some(buf),
            PieceSpec::Data {
                buf_offset, chunk, ..
            },
        ) = (buf, p)
        {
            let mut at = *buf_offset;
            for s in chunk.segs() {
                data.push(Seg::buf(buf, at, s as usize));
                at += s as usize;
            }
        }
        let (out, inp): (Vec<Seg<'_>>, Vec<Seg<'_>>) = match (kind, p) {
            (req_type::OUT, _) => (std::iter::once(hdr).chain(data).collect(), vec![status]),
            (req_type::IN, _) => (vec![hdr], data.into_iter().chain([status]).collect()),
            (_, PieceSpec::Range { .. }) => (
                vec![hdr, Seg::area(base + META_RANGE, RANGE_LEN)],
                vec![status],
            ),
            (_, PieceSpec::GetId) => (vec![hdr], vec![Seg::area(base + META_ID, ID_LEN), status]),
            _ => (vec![hdr], vec![status]),
        };
        self.vq.add_wait(&out, &inp, u64::from(slot), wait)?;
        self.added(slot, tag, kind, sector);
        Ok(())
    }

    /// Records the request just put on the ring with metadata `slot`.
    fn added(&mut self, slot: u16, tag: u64, kind: u32, sector: u64) {
        self.free_slots.pop();
        self.submitted += 1;
        self.pieces[usize::from(slot)] = Some(Piece {
            tag,
            kind,
            sector,
            seq: self.submitted,
            since: None,
        });
    }

    /// Keeps at most `n` requests with the device at once (`None`: no
    /// limit, the default): requests submitted beyond it are built and put
    /// on the ring but held back ([`SplitQueue::hold`]), and each
    /// completion that is seen publishes one, before the completion is
    /// taken. A caller that submits one request more than `n` thus has the
    /// next one handed to the device in a single store as the last one
    /// completes, rather than after its completion was taken and a new
    /// request built; [`Done::timing`] then says when each was handed over and seen done.
    ///
    /// # Errors
    /// The transport's notification failed (lifting a limit publishes and
    /// notifies what was held).
    pub fn limit_in_flight(&mut self, n: Option<usize>) -> Result<()> {
        self.limit = n.map(|n| n.max(1));
        let lifted = self.limit.is_none() && self.hand_over(u16::MAX).is_some();
        if lifted && !self.plugged && self.vq.should_notify() {
            self.transport.notify(self.vq.index())?;
        }
        self.vq.hold(self.limit.is_some());
        Ok(())
    }

    /// Publishes the held requests the limit lets go: one for each request
    /// the device has completed or no longer has, oldest first.
    /// Returns the time it read after publishing, if it did.
    fn release_held(&mut self) -> Option<Instant> {
        let limit = self.limit?;
        if self.vq.held() == 0 {
            return None;
        }
        // The device still works on what is published and not completed
        // (saturating: used.idx is the device's to write).
        let working = self.working().saturating_sub(self.vq.used_pending().into());
        self.hand_over(u16::try_from(limit.saturating_sub(working)).unwrap_or(u16::MAX))
    }

    /// Publishes up to `n` held requests and stamps them with the time
    /// read after the store (not on the device's path); that time, if any
    /// was published.
    fn hand_over(&mut self, n: u16) -> Option<Instant> {
        let mut now = None;
        let pieces = &mut self.pieces;
        self.vq.publish_each(n, |token| {
            let t = *now.get_or_insert_with(Instant::now);
            if let Some(p) = pieces.get_mut(token as usize).and_then(Option::as_mut) {
                p.since = Some(t);
            }
        });
        now
    }

    /// Requests with the device (added, and not held).
    fn working(&self) -> usize {
        self.vq.in_flight().saturating_sub(self.vq.held().into())
    }

    /// Whether a sleeping wait wakes at the first completion (`false`, the
    /// default: what a caller waiting on one request needs) or once about
    /// three quarters of the requests in flight have completed, or after
    /// 1 ms with whatever has (`true`: for a caller that keeps the queue
    /// full, which then refills it while the device still has work, and
    /// both sides wake less; the device needs `EVENT_IDX` for it, else the
    /// first completion wakes).
    pub fn coalesce(&mut self, on: bool) {
        self.coalesce = on;
    }

    /// Takes the completions the device has published, up to the first
    /// that finishes a request. Returns how many.
    fn reap(&mut self) -> Result<usize> {
        // Under a limit, when the completions taken below were seen.
        let mut seen = None;
        if self.limit.is_some() && self.vq.used_pending() > 0 {
            // A completion seen frees a turn: the next request goes to the
            // device before anything else is done, and the time is read
            // before the notification (a system call) is sent.
            let now = self.release_held().unwrap_or_else(Instant::now);
            seen = Some(now);
            if !self.plugged && self.vq.should_notify() {
                self.transport.notify(self.vq.index())?;
            }
        }
        if self.coalesce {
            // No interrupt while taking them (each take would otherwise
            // ask for one at the next entry); the next sleep asks again.
            self.vq.disable_interrupts();
        }
        let mut n = 0;
        while let Some(c) = self.vq.pop_used()? {
            n += 1;
            let slot = c.token as usize;
            let Some(piece) = self.pieces.get_mut(slot).and_then(Option::take) else {
                continue;
            };
            self.free_slots.push(slot as u16);
            let mut st = [0u8; 1];
            self.vq.area_read(slot * META_SLOT + META_STATUS, &mut st)?;
            let outcome = match st[0] {
                S_OK => Ok(()),
                S_IOERR => Err(BlkError::IoError {
                    sector: piece.sector,
                }),
                S_UNSUPP => Err(BlkError::Unsupported { kind: piece.kind }),
                other => Err(BlkError::BadStatus {
                    status: other,
                    kind: piece.kind,
                }),
            };
            let Some(t) = self.transfers.get_mut(&piece.tag) else {
                continue;
            };
            t.pending -= 1;
            if let Err(e) = outcome {
                t.error.get_or_insert(e);
            }
            if t.pending == 0 && !t.submitting {
                // One that came after the look above is seen now.
                let timing = piece
                    .since
                    .map(|s| (s, *seen.get_or_insert_with(Instant::now)));
                self.finish(piece.tag, timing);
                // One request done is enough: the caller can refill its
                // slot before the rest are taken.
                break;
            }
        }
        Ok(n)
    }

    fn finish(&mut self, tag: u64, timing: Option<(Instant, Instant)>) {
        if let Some(t) = self.transfers.remove(&tag) {
            self.done.push_back(Done {
                tag,
                result: t.error.map_or(Ok(()), Err),
                timing,
            });
        }
    }

    /// Waits (polling, then on the interrupt, up to the timeout) until at
    /// least one completion was taken.
    fn reap_blocking(&mut self) -> Result<()> {
        // Whatever was queued but not yet announced must be, or the wait
        // below would be for requests the device never heard of.
        self.unplug()?;
        loop {
            if self.reap()? > 0 {
                return Ok(());
            }
            let after = match self.coalesce {
                true => (self.working() * 3 / 4).try_into().unwrap_or(0),
                false => 0,
            };
            // A coalesced wait is bounded: a device that holds some requests
            // back must not keep the completed ones from the caller.
            if after > 0 && self.wait(after, COALESCE_WAIT.min(self.timeout))? == Waited::Ready {
                continue;
            }
            if self.wait(0, self.timeout)? == Waited::TimedOut {
                return Err(self.timed_out());
            }
        }
    }

    /// One wait of the poller for more than `after` completions (only its
    /// sleep counts them; a look while polling takes any) up to `timeout`.
    fn wait(&mut self, after: u16, timeout: Duration) -> Result<Waited> {
        let mut ring = UsedRing {
            vq: &mut self.vq,
            transport: &*self.transport,
            looks: 0,
            after,
            pending: &mut self.irq_pending,
        };
        self.poller.wait(&mut ring, Some(timeout))
    }

    /// The timeout error, naming the oldest request still unanswered.
    fn timed_out(&self) -> BlkError {
        let oldest = self.pieces.iter().flatten().min_by_key(|p| p.seq);
        BlkError::Timeout {
            queue: self.vq.index(),
            timeout: self.timeout,
            request: oldest.map_or("request", |p| kind_name(p.kind)),
            sector: oldest.map_or(0, |p| p.sector),
            in_flight: self.pieces.iter().flatten().count(),
        }
    }

    /// Returns a finished request without waiting, if there is one.
    ///
    /// # Errors
    /// Queue errors (a device breaking the ring).
    pub fn try_complete(&mut self) -> Result<Option<Done>> {
        if self.done.is_empty() {
            self.reap()?;
        }
        Ok(self.done.pop_front())
    }

    /// Waits for the next finished request.
    ///
    /// # Errors
    /// [`BlkError::Timeout`] if nothing completes in time,
    /// [`BlkError::Idle`] if nothing is in flight, queue and transport
    /// errors.
    pub fn complete(&mut self) -> Result<Done> {
        loop {
            if let Some(d) = self.try_complete()? {
                return Ok(d);
            }
            if self.transfers.is_empty() {
                return Err(BlkError::Idle {
                    queue: self.vq.index(),
                });
            }
            self.reap_blocking()?;
        }
    }

    /// Submits `req` and waits for it (other requests' completions are kept).
    ///
    /// # Errors
    /// As [`BlkQueue::submit`] and the request's outcome.
    pub fn run(&mut self, req: Command<'_>) -> Result<()> {
        let tag = u64::MAX - 1;
        self.submit(req, tag)?;
        self.wait_tag(tag)
    }

    fn wait_tag(&mut self, tag: u64) -> Result<()> {
        loop {
            if let Some(i) = self.done.iter().position(|d| d.tag == tag) {
                return self.done.remove(i).expect("index from position").result;
            }
            self.reap_blocking()?;
        }
    }

    /// `GET_ID` on this queue.
    ///
    /// # Errors
    /// As [`crate::BlkDriver::get_id`].
    pub fn get_id(&mut self) -> Result<Vec<u8>> {
        let tag = u64::MAX - 2;
        if self.transfers.contains_key(&tag) {
            return Err(BlkError::DuplicateTag { tag });
        }
        self.transfers.insert(
            tag,
            Transfer {
                pending: 0,
                submitting: true,
                error: None,
            },
        );
        if let Err(e) = self.submit_piece(&Command::Flush, &PieceSpec::GetId, tag) {
            self.transfers.remove(&tag);
            return Err(e);
        }
        // The slot used is the one whose piece carries `tag`.
        let slot = self
            .pieces
            .iter()
            .position(|p| p.is_some_and(|p| p.tag == tag))
            .expect("piece just added");
        if let Some(t) = self.transfers.get_mut(&tag) {
            t.pending = 1;
            t.submitting = false;
        }
        if self.vq.should_notify() {
            self.transport.notify(self.vq.index())?;
        }
        self.wait_tag(tag)?;
        let mut id = [0u8; ID_LEN];
        self.vq.area_read(slot * META_SLOT + META_ID, &mut id)?;
        let end = id.iter().position(|&b| b == 0).unwrap_or(ID_LEN);
        Ok(id[..end].to_vec())
    }
}
