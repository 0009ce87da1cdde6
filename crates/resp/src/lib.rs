//! RESP2/RESP3 frames: a bounded incremental parser and an encoder, shared by the front door (client
//! side) and the lanes (Redis side).

mod command;
mod encode;
mod frame;
mod parse;

pub use command::{parse_command, Argv, Command};
pub use encode::{bulk_len, encode, encode_bulk, encode_command, encode_header, header_len};
pub use frame::Frame;
pub use parse::{frame_len, parse, parse_i64, Discarded, Limits, ProtocolError, Scanner};
