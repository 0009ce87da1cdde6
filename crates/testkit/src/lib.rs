//! Test helpers shared by every crate's integration tests: real `redis-server` processes on temporary
//! Unix sockets. Nothing here mocks Redis; each helper starts, waits for and reaps a real process.

mod redis_server;

pub use redis_server::{RedisServer, RedisServerBuilder};
