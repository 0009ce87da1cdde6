//! Test helpers shared by every crate's integration tests: real `redis-server` processes on temporary
//! Unix sockets, a real local Redis Cluster, and a small HTTP client for the daemon's HTTP socket.
//! Nothing here mocks Redis; each helper starts, waits for and reaps a real process.

mod cluster;
pub mod http;
mod ports;
mod redis_server;

pub use cluster::{Calls, ClusterNode, RedisCluster};
pub use ports::loopback_port;
pub use redis_server::{admin_password, login, RedisServer, RedisServerBuilder, ADMIN_USER};
