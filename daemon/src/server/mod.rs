//! The daemon's listeners: Unix sockets for the Redis protocol and for HTTP/JSON.

pub mod http;
pub mod identity;
pub mod limits;
mod occasional;
pub mod peer;
pub mod resp;
pub mod socket;
