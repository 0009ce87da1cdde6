//! Loopback TCP ports for the servers tests start (cluster nodes, their buses, sentinels).
//!
//! Asking the kernel for a free port (`bind 127.0.0.1:0`) and handing the number to a process
//! that binds it later is a race: the number comes from the ephemeral range, and between the two
//! binds any outgoing connection on the machine (a cluster node's bus, a client's connect) may be
//! given the same number as its local port. CI met exactly that ("bind: Address already in use"
//! for a cluster node). So the ports here come from *below* the ephemeral range, where the kernel
//! never picks a local port on its own, and a process-wide counter keeps two tests of one binary
//! from taking the same one. Each candidate is still bound once to skip ports someone else holds.

use std::net::TcpListener;
use std::sync::atomic::{AtomicU32, Ordering};

/// Where our ports start: above the well-known and most registered services' numbers.
const FLOOR: u32 = 20_000;

/// The next candidate's offset into the range; starts at a pid-derived place so that two test
/// binaries run one after another do not walk the same numbers.
static NEXT: AtomicU32 = AtomicU32::new(u32::MAX);

/// A loopback TCP port that nothing listens on now and that the kernel will not hand out as an
/// outgoing connection's local port.
pub fn loopback_port() -> u16 {
    let ceiling = ephemeral_start().max(FLOOR + 1_000);
    let span = ceiling - FLOOR;
    let _ = NEXT.compare_exchange(
        u32::MAX,
        std::process::id().wrapping_mul(97) % span,
        Ordering::Relaxed,
        Ordering::Relaxed,
    );
    for _ in 0..span {
        let offset = NEXT.fetch_add(1, Ordering::Relaxed) % span;
        // Below 65536: `ceiling` is at most the kernel's ephemeral start (a port number) or FLOOR + 1000.
        let port = (FLOOR + offset) as u16;
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free loopback port between {FLOOR} and {ceiling}");
}

/// The first port of the kernel's ephemeral range (32768 when it cannot be read, Linux's default).
fn ephemeral_start() -> u32 {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|text| text.split_whitespace().next()?.parse().ok())
        .unwrap_or(32_768)
        .min(65_535)
}
