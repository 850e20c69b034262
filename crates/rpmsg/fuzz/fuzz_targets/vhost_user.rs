//! A hostile front end's message stream into the remote served over
//! vhost-user: the same front end as iopath-virtio's `vhost_user_stream`
//! target (memory tables of fuzzer bytes, so rings, descriptors, rpmsg
//! headers and name-service records hold anything; vring setup, kicks,
//! resets, raw messages), against the virtio-rpmsg device, whose session
//! thread runs the bus and the echo service on whatever the rings say.
//!
//! The server must end every connection by itself once the front end
//! closes, never panic, and hand both queues back so the next driver can
//! come: the session thread then sees no driver and ends.
#![no_main]

#[path = "../../../virtio/fuzz/fuzz_targets/vhost_user_stream/front_end.rs"]
mod front_end;
#[path = "../../../virtio/fuzz/fuzz_targets/vhost_user_stream/input.rs"]
mod input;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use iopath_rpmsg::vhost_user::{RpmsgDevice, WaitDriverError};
use iopath_rpmsg::tools::RemoteChannels;
use iopath_rpmsg::Bus;
use iopath_virtio::device::serve_connection;
use libfuzzer_sys::fuzz_target;

use input::Input;

/// Serves drivers on `device` until `done` and no driver is there.
fn sessions(device: RpmsgDevice, done: Arc<AtomicBool>) {
    let channels = RemoteChannels {
        echo: vec!["echo".into()],
        sink: vec!["sink".into()],
        ..RemoteChannels::default()
    };
    loop {
        match device.wait_driver(Some(Duration::from_millis(20))) {
            Ok((link, notifier)) => {
                let bus = Bus::start(Box::new(link), Box::new(notifier));
                // Announcing may fail (no buffers, a reset): served anyway.
                let session = channels.announce(&bus, |_, _| {});
                bus.wait_down(Some(Duration::from_secs(30)));
                if let Ok(s) = session {
                    drop(s);
                }
                bus.shutdown();
            }
            Err(WaitDriverError::Timeout { .. }) if done.load(Ordering::SeqCst) => return,
            Err(WaitDriverError::Timeout { .. }) => {}
            Err(e) => panic!("waiting for a driver: {e}"),
        }
    }
}

fuzz_target!(|input: Input| {
    // ACCESS_PLATFORM offered: the IOTLB path is fuzzed too.
    let device = RpmsgDevice::new().with_access_platform(true);
    let done = Arc::new(AtomicBool::new(false));
    let session = {
        let (d, done) = (device.clone(), Arc::clone(&done));
        std::thread::spawn(move || sessions(d, done))
    };
    front_end::drive(input, move |sock| {
        let _ = serve_connection(sock, Arc::new(device));
    });
    done.store(true, Ordering::SeqCst);
    session.join().expect("the session thread panicked");
});
