//! The protocols themselves: the sockets systemd passed ([`Activation`]), notifications
//! ([`Notifier`]) and the watchdog's interval, read once from the environment ([`Systemd`]).

use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::net::UnixListener;
use std::time::Duration;

use sd_notify::NotifyState;

/// `FileDescriptorName=` of the RESP socket in `tollgate.socket`.
pub const RESP_FD_NAME: &str = "resp";
/// `FileDescriptorName=` of the HTTP socket in `tollgate.socket`.
pub const HTTP_FD_NAME: &str = "http";

/// Variables of the service manager's protocols that a child of the daemon must not see.
pub const PROTOCOL_VARIABLES: [&str; 6] = [
    "NOTIFY_SOCKET",
    "LISTEN_PID",
    "LISTEN_FDS",
    "LISTEN_FDNAMES",
    "WATCHDOG_USEC",
    "WATCHDOG_PID",
];

#[derive(Debug, thiserror::Error)]
pub enum ActivationError {
    #[error("cannot read the sockets systemd passed (LISTEN_FDS, LISTEN_FDNAMES): {0}")]
    Environment(std::io::Error),
    #[error(
        "systemd passed sockets named {names:?}; tollgate needs two, named `resp` and `http` \
         (FileDescriptorName= in tollgate.socket)"
    )]
    Names { names: Vec<String> },
    #[error("the socket systemd passed as `{name}` is not a listening Unix stream socket{detail}")]
    NotUnixListener { name: String, detail: String },
}

/// What systemd handed this process.
#[derive(Debug, Default)]
pub struct Systemd {
    /// The listening sockets, when socket-activated.
    pub activation: Option<Activation>,
    pub notifier: Notifier,
    /// `WatchdogSec=`, when set for this process.
    pub watchdog: Option<Duration>,
}

impl Systemd {
    /// Reads (and for the listeners and the watchdog, removes) systemd's variables. Call it before
    /// any thread is started: it changes the environment.
    pub fn from_env() -> Result<Systemd, ActivationError> {
        let activation = Activation::from_env()?;
        let mut usec = 0;
        let watchdog = sd_notify::watchdog_enabled(true, &mut usec)
            .then(|| Duration::from_micros(usec))
            .filter(|interval| !interval.is_zero());
        Ok(Systemd {
            activation,
            notifier: Notifier::from_env(),
            watchdog,
        })
    }
}

/// The two listening sockets systemd bound for the daemon.
#[derive(Debug)]
pub struct Activation {
    pub resp: UnixListener,
    pub http: UnixListener,
}

impl Activation {
    /// `None` when the process was not socket-activated.
    fn from_env() -> Result<Option<Activation>, ActivationError> {
        let passed =
            sd_notify::listen_fds_with_names(true).map_err(ActivationError::Environment)?;
        if passed.len() == 0 {
            return Ok(None);
        }
        let (mut resp, mut http, mut names) = (None, None, Vec::new());
        for (fd, name) in passed {
            // SAFETY: the service manager passed this descriptor to this process for it to own;
            // nothing else in the process has taken it (this runs once, before any thread).
            let owned = unsafe { OwnedFd::from_raw_fd(fd) };
            names.push(name.clone());
            match name.as_str() {
                RESP_FD_NAME if resp.is_none() => resp = Some(listener(&name, owned)?),
                HTTP_FD_NAME if http.is_none() => http = Some(listener(&name, owned)?),
                // Anything else is closed here: the daemon serves on nothing it was not told of.
                _ => drop(owned),
            }
        }
        match (resp, http) {
            (Some(resp), Some(http)) if names.len() == 2 => Ok(Some(Activation { resp, http })),
            _ => Err(ActivationError::Names { names }),
        }
    }
}

/// `fd` as a listener, once the kernel confirms it is a listening Unix stream socket.
fn listener(name: &str, fd: OwnedFd) -> Result<UnixListener, ActivationError> {
    use nix::sys::socket::{getsockname, getsockopt, sockopt, SockType, UnixAddr};
    let refuse = |detail: String| ActivationError::NotUnixListener {
        name: name.to_owned(),
        detail,
    };
    let stream = getsockopt(&fd, sockopt::SockType).map_err(|e| refuse(format!(": {e}")))?;
    let listening = getsockopt(&fd, sockopt::AcceptConn).map_err(|e| refuse(format!(": {e}")))?;
    let unix = getsockname::<UnixAddr>(std::os::fd::AsRawFd::as_raw_fd(&fd)).is_ok();
    if stream != SockType::Stream || !listening || !unix {
        return Err(refuse(String::new()));
    }
    let listener = UnixListener::from(fd);
    listener
        .set_nonblocking(true)
        .map_err(|e| refuse(format!(": {e}")))?;
    Ok(listener)
}

/// Sends state changes to the service manager; does nothing where there is none.
#[derive(Debug, Clone, Copy, Default)]
pub struct Notifier {
    pub(super) enabled: bool,
}

impl Notifier {
    fn from_env() -> Notifier {
        Notifier {
            enabled: std::env::var_os("NOTIFY_SOCKET").is_some_and(|path| !path.is_empty()),
        }
    }

    fn send(&self, states: &[NotifyState]) {
        if !self.enabled {
            return;
        }
        if let Err(error) = sd_notify::notify(false, states) {
            tracing::warn!(%error, "cannot notify the service manager");
        }
    }

    pub fn ready(&self) {
        self.send(&[NotifyState::Ready, NotifyState::Status("serving")]);
    }

    /// A reload begins; `MONOTONIC_USEC` lets `Type=notify-reload` match it to its request.
    pub fn reloading(&self) {
        match NotifyState::monotonic_usec_now() {
            Ok(now) => self.send(&[NotifyState::Reloading, now]),
            Err(_) => self.send(&[NotifyState::Reloading]),
        }
    }

    pub fn stopping(&self) {
        self.send(&[NotifyState::Stopping, NotifyState::Status("stopping")]);
    }

    pub fn watchdog(&self) {
        self.send(&[NotifyState::Watchdog]);
    }

    pub fn status(&self, status: &str) {
        self.send(&[NotifyState::Status(status)]);
    }
}
