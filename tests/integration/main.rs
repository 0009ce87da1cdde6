//! Integration tests: real `redis-server` processes on temporary Unix sockets, the daemon in-process
//! on temporary sockets, and the real `tollgate` binary. One test binary keeps links fast.

mod foundation;
mod support;
