//! The Redis-protocol front door: any Redis client on the RESP Unix socket. Each connection is a
//! [`session`]; every command it sends is admitted by the policy, then travels on its lane.
//!
//! A command's path through these files: `listener.rs` accepts the connection; `door.rs` lets the connection in; `session.rs` (the loop
//! and its I/O) reads the bytes; `ahead.rs` parses each command, classifies it once (`kind.rs`)
//! and admits a pipeline's run together; `state.rs` asks `plan.rs` what the command becomes in
//! this session and carries that out as a [`schedule`] step: sent on its lane (`pending.rs`, its
//! reply corrected by `amend.rs` where needed), or answered by the daemon (`answer.rs`,
//! `transaction.rs`, `subscriptions.rs`, `keyspace.rs`, `lease.rs`, `lease_watch.rs`);
//! `schedule.rs` hands the replies back in order and `session.rs` writes them. Every error the
//! daemon answers is worded in `replies.rs`; what the front door sends where (for the lane users'
//! ACLs) is `route.rs`.

pub mod admission_clock;
mod ahead;
mod amend;
mod answer;
mod budget;
pub mod cached;
mod client_tracking;
mod clients;
mod coarse;
mod cooldowns;
mod databases;
mod deadline;
mod door;
mod ended;
pub mod flights;
mod front;
mod hang_up;
mod keyspace;
mod kind;
mod lease;
mod lease_reply;
pub(crate) mod lease_watch;
mod listener;
mod local;
mod mailbox;
mod monitor;
pub mod namespace;
mod outbox;
mod pending;
mod placing;
mod plan;
pub mod pool;
mod queued;
mod refusal;
mod replies;
mod route;
mod schedule;
mod scoped;
mod script_refusal;
mod session;
mod slots;
mod sources;
mod state;
mod subscriptions;
mod tenants;
mod tracking_hub;
mod transaction;
#[cfg(test)]
mod words;

pub use self::front::FrontDoor;
pub use self::listener::serve;
pub use self::route::Route;
