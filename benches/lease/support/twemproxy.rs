//! The benchmark's twemproxy (Debian's `nutcracker`, 0.5): a proxy that only forwards, with no
//! admission, lanes or lease service, started on a Unix socket in front of the benchmark's
//! redis-server. The same scripts run through it show what one more process hop costs on its own,
//! beside what the daemon's hop costs. It refuses `SCRIPT LOAD` and `CLIENT SETINFO` (it closes
//! the connection on commands it does not know), so its clients skip the latter and the scripts are
//! loaded on Redis directly first.
//!
//! Twemproxy logs in to Redis only as its `default` user (`redis_auth: <password>` sends
//! `AUTH <password>` on each server connection), which testkit's servers have off: the benchmark
//! turns `default` on for its server with the password given to [`Twemproxy::start`]. With
//! `redis_auth` set, twemproxy also asks its own clients for that password (it answers their `AUTH`
//! itself), so [`Twemproxy::client`] sends it.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::programs::{free_ports, on_path};

/// How long twemproxy may take to open its socket.
const STARTUP: Duration = Duration::from_secs(10);

/// A running twemproxy, stopped when dropped.
pub struct Twemproxy {
    child: Child,
    socket: PathBuf,
    password: String,
    _dir: tempfile::TempDir,
}

impl Twemproxy {
    /// Starts twemproxy in front of the Redis at `redis`, logging in as `default` with `password`,
    /// or says why not and returns `None` (its rows of the benchmark are skipped).
    pub fn start(redis: &Path, password: &str) -> Option<Twemproxy> {
        let Some(binary) = on_path("nutcracker") else {
            println!(
                "twemproxy: skipped: no `nutcracker` on PATH (Debian: apt-get install nutcracker)"
            );
            return None;
        };
        let dir = tempfile::tempdir().expect("twemproxy's directory");
        let socket = dir.path().join("twemproxy.sock");
        let config = dir.path().join("nutcracker.yml");
        std::fs::write(
            &config,
            format!(
                "bench:\n  listen: {} 0600\n  redis: true\n  redis_auth: {password}\n  hash: fnv1a_64\n  distribution: ketama\n  hash_tag: \"{{}}\"\n  servers:\n   - {}:1\n",
                socket.display(),
                redis.display()
            ),
        )
        .expect("write twemproxy's config");
        let [stats] = free_ports();
        let child = Command::new(binary)
            .arg("-c")
            .arg(&config)
            .arg("-o")
            .arg(dir.path().join("nutcracker.log"))
            .args(["-a", "127.0.0.1", "-s", &stats.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start nutcracker");
        let deadline = Instant::now() + STARTUP;
        while std::os::unix::net::UnixStream::connect(&socket).is_err() {
            assert!(
                Instant::now() < deadline,
                "twemproxy did not open {} within {STARTUP:?}",
                socket.display()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        Some(Twemproxy {
            child,
            socket,
            password: password.to_owned(),
            _dir: dir,
        })
    }

    /// A redis-rs client of twemproxy's socket that skips `CLIENT SETINFO` and sends twemproxy's
    /// password (`AUTH <password>`, once per connection).
    pub fn client(&self) -> redis::Client {
        let info = redis::IntoConnectionInfo::into_connection_info(format!(
            "redis+unix://{}",
            self.socket.display()
        ))
        .expect("twemproxy's address");
        let settings = info
            .redis_settings()
            .clone()
            .set_skip_set_lib_name()
            .set_password(&self.password);
        redis::Client::open(info.set_redis_settings(settings))
            .expect("redis-rs client of twemproxy")
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Twemproxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
