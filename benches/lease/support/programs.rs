//! What the benchmark's peer programs (etcd, twemproxy) need to be started: their binary on PATH
//! and free loopback ports.

use std::net::TcpListener;
use std::path::PathBuf;

/// `name` in a directory of PATH, if there is one.
pub fn on_path(name: &str) -> Option<PathBuf> {
    let paths = std::env::var_os("PATH")?;
    std::env::split_paths(&paths)
        .map(|dir| dir.join(name))
        .find(|candidate| candidate.is_file())
}

/// `N` distinct free loopback ports (all held until all are known, so they differ).
pub fn free_ports<const N: usize>() -> [u16; N] {
    let listeners = [(); N].map(|()| TcpListener::bind("127.0.0.1:0").expect("a loopback port"));
    listeners.map(|listener| listener.local_addr().expect("its address").port())
}
