//! Bus round trip in one process (host and remote threads): `cargo run
//! --release -p iopath-rpmsg --example rtt -- [eventfd|unix|poll] [count]`.

use std::time::{Duration, Instant};

use iopath_rpmsg::rsc_table::ShmLayout;
use iopath_rpmsg::vring::VIRTIO_RING_F_EVENT_IDX;
use iopath_rpmsg::{Bus, EndpointOptions, Event, NotifySpec, SharedMem, HOST_FEATURES};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let kind = args.get(1).map_or("eventfd", String::as_str);
    let count: usize = args.get(2).map_or(Ok(20000), |c| c.parse())?;
    let dir = std::env::temp_dir().join(format!("iopath-rtt-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let spec: NotifySpec = match kind {
        "poll" => "poll".parse()?,
        k => format!("{k}:{}", dir.join("n").display()).parse()?,
    };
    let mut layout = ShmLayout::openamp_demo();
    layout.dfeatures |= 1 << VIRTIO_RING_F_EVENT_IDX;
    let shm = SharedMem::create(&dir.join("shm"), &layout)?;
    let l = spec.bind()?;
    let t = Duration::from_secs(10);
    let remote = std::thread::spawn(move || {
        let bus = Bus::remote(shm, l.accept().unwrap(), Some(t)).unwrap();
        let ep = bus
            .create_with_callback(EndpointOptions::new("echo"), move |ep, ev| {
                if let Event::Message(m) = ev {
                    ep.send_to(m.src, &m.data, Some(t)).unwrap();
                }
            })
            .unwrap();
        (bus, ep)
    });
    let host = Bus::host(
        SharedMem::open(&dir.join("shm"))?,
        spec.connect(t)?,
        HOST_FEATURES,
    )?;
    let ch = host.wait_channel("echo", t)?;
    let ep = host.create(EndpointOptions::new("echo").dst(ch.addr))?;
    let mut lat = Vec::with_capacity(count);
    let data = [0x5au8; 64];
    for _ in 0..count {
        let s = Instant::now();
        ep.send(&data)?;
        ep.recv(Some(t))?;
        lat.push(s.elapsed().as_secs_f64() * 1e6);
    }
    lat.sort_by(f64::total_cmp);
    println!(
        "{kind}: {count} round trips in-process: p50 {:.1} us, p99 {:.1} us",
        lat[count / 2],
        lat[count * 99 / 100]
    );
    let (rb, rep) = remote.join().unwrap();
    drop((ep, rep));
    host.shutdown();
    rb.shutdown();
    std::fs::remove_dir_all(&dir)?;
    Ok(())
}
