//! Integration tests: real `redis-server` processes on temporary Unix sockets, the daemon in-process
//! on temporary sockets, and the real `tollgate` binary. One test binary keeps links fast.

mod embedded_supervision;
mod foundation;
mod front_door;
mod front_door_faults;
mod identity;
mod lanes;
mod lanes_batching;
mod lanes_ceiling;
mod lanes_daemon;
mod lanes_lifecycle;
mod lanes_privilege;
mod lanes_pubsub;
mod lanes_sentinel;
mod lease;
mod lease_fenced;
mod lease_http;
mod lease_resp;
mod lease_run;
mod lease_watchdogs;
mod limits;
mod policy;
mod policy_catalog;
mod policy_compile;
mod policy_daemon;
mod policy_decoys;
mod policy_guard_cost;
mod policy_keys;
mod policy_sandbox;
mod policy_snapshots;
mod policy_support;
mod reserved;
mod runtime_dir;
mod support;
