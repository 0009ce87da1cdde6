//! systemd's side of the daemon (the `sd-notify` crate speaks the protocols):
//!
//! - **Socket activation.** With `tollgate.socket`, systemd binds both sockets and passes them in
//!   `LISTEN_FDS`, named by `FileDescriptorName=` in `LISTEN_FDNAMES`: `resp` and `http`. The
//!   daemon then serves on them and creates no socket files of its own ([`Activation`]).
//! - **Notifications** to `NOTIFY_SOCKET` ([`Notifier`]): `READY=1` only once `/readyz` would
//!   answer 200 (Redis answers on the client and lease lanes, a policy is loaded), so that units
//!   ordered `After=tollgate.service` start against a daemon that serves; `RELOADING=1` and
//!   `READY=1` around a policy reload; `STOPPING=1` when a shutdown begins.
//! - **Watchdog.** With `WatchdogSec=` (`WATCHDOG_USEC`), `WATCHDOG=1` at half the interval from a
//!   task on the daemon's runtime, so a runtime that stops making progress gets restarted.
//!
//! Everything is read from the environment once, before the async runtime starts
//! ([`Systemd::from_env`]), and the variables systemd meant for this process alone are removed so
//! that the embedded redis-server does not inherit them (it would take the listeners' names or
//! the watchdog for its own); `NOTIFY_SOCKET` is removed from its environment where it is spawned.

mod attend;
pub mod protocol;

pub use self::attend::attend;
pub use self::protocol::{
    Activation, ActivationError, Notifier, Systemd, HTTP_FD_NAME, PROTOCOL_VARIABLES, RESP_FD_NAME,
};
