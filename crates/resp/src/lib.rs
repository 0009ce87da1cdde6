//! RESP2/RESP3 frames: a bounded incremental parser and an encoder, shared by the front door (client
//! side) and the lanes (Redis side).
