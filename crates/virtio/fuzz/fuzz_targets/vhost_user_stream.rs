//! A hostile front end's message stream into the device side's request
//! handling (`serve_connection`) over a real unix socket pair: feature and
//! protocol negotiation, `SET_MEM_TABLE`/`ADD_MEM_REG` with memfds this
//! target creates (filled with fuzzer bytes, so rings and descriptors hold
//! anything), vring setup and kicks (a device thread then walks the rings
//! through the IOTLB), `IOTLB_MSG`, `SET_BACKEND_REQ_FD`, `GET_CONFIG`,
//! `GET_INFLIGHT_FD`/`SET_INFLIGHT_FD` (the inflight record given back in
//! a memfd of fuzzer bytes, which the device's recovery then reads and its
//! pops and puts keep), and raw messages with any code, flags, payload and
//! fds, in any order.
//!
//! The server must end every connection by itself once the front end
//! closes (no hang), never panic (its thread's join would fail), and its
//! device must only ever see memory the front end shared.
#![no_main]

#[path = "vhost_user_stream/front_end.rs"]
mod front_end;
#[path = "vhost_user_stream/input.rs"]
mod input;

use std::sync::Arc;

use iopath_virtio::device::{serve_connection, QueueContext, VirtioDevice};
use iopath_virtio::features;
use libfuzzer_sys::fuzz_target;
use virtio_queue::Queue;
use vm_memory::Bytes;

use input::Input;

/// A device that copies each chain's readable bytes into its writable ones
/// (like a block device's data path, through every address check).
struct Copier;

impl VirtioDevice for Copier {
    fn features(&self) -> u64 {
        features::VIRTIO_F_VERSION_1
            | features::VIRTIO_F_ACCESS_PLATFORM
            | features::VIRTIO_F_EVENT_IDX
            | features::VIRTIO_F_INDIRECT_DESC
    }
    fn num_queues(&self) -> usize {
        2
    }
    fn max_queue_size(&self) -> u16 {
        16
    }
    fn read_config(&self, offset: u32, len: u32) -> Vec<u8> {
        (0..len).map(|i| (offset.wrapping_add(i)) as u8).collect()
    }
    fn run_queue(&self, mut ctx: QueueContext) -> Queue {
        // Heads a hostile inflight record names: walked like any chain.
        {
            let mem = ctx.memory();
            for head in ctx.take_resubmits() {
                let n = ctx.chain_at(&mem, head).take(32).count() as u32;
                let _ = ctx.add_used(&mem, head, n);
            }
        }
        loop {
            let wake = match ctx.wait(None) {
                Ok(w) => w,
                Err(_) => break,
            };
            if wake.stop {
                break;
            }
            let _batch = ctx.dma_batch();
            let mem = ctx.memory();
            let mut chains = Vec::new();
            // At most a queue's worth per kick: a hostile avail index must
            // not make this loop forever.
            for _ in 0..16 {
                let Some(chain) = ctx.pop_chain(&mem) else {
                    break;
                };
                let head = chain.head_index();
                let mut data = Vec::new();
                let mut written = 0u32;
                for d in chain.take(32) {
                    let len = (d.len() as usize).min(4096);
                    if d.is_write_only() {
                        let n = data.len().min(len);
                        if mem.write_slice(&data[..n], d.addr()).is_ok() {
                            written += n as u32;
                        }
                    } else {
                        let mut buf = vec![0u8; len];
                        if mem.read_slice(&mut buf, d.addr()).is_ok() {
                            data.extend_from_slice(&buf);
                        }
                    }
                }
                chains.push((head, written));
            }
            for (head, written) in chains {
                let _ = ctx.add_used(&mem, head, written);
            }
            ctx.notify(&mem);
        }
        ctx.into_queue()
    }
}

fuzz_target!(|input: Input| {
    front_end::drive(input, |sock| {
        let _ = serve_connection(sock, Arc::new(Copier));
    });
});
