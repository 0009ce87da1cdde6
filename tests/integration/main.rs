//! Integration tests: real `redis-server` processes on temporary Unix sockets, the daemon in-process
//! on temporary sockets, and the real `tollgate` binary. One test binary keeps links fast.

mod foundation;
mod support;
mod lanes;
mod lanes_ceiling;
mod lanes_lifecycle;
mod lanes_privilege;
mod lanes_pubsub;
