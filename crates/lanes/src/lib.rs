//! The six lanes of Redis connections (DESIGN.md, "Lanes"): the daemon's only way to Redis.

mod config;
mod topology;

pub use config::{LaneOverrides, LaneSettings, LanesConfig};
pub use topology::{Endpoint, InvalidEndpoint, RedisConfig};
