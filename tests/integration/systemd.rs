//! The daemon under systemd's protocols, with real processes: the `tollgate` binary started by
//! `systemd-socket-activate` (Debian's `systemd` package) on two passed sockets named `resp` and
//! `http`, a `NOTIFY_SOCKET` that is a Unix datagram socket of the test's own, and a watchdog
//! (`WATCHDOG_USEC`); and the unit files in dist/systemd checked by `systemd-analyze verify`.

use std::io::{Read, Write};
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tollgate_testkit::http;

use crate::support::daemon::tempdir;

/// How long the daemon may take to say READY=1 (an embedded redis-server starts first).
const PATIENCE: Duration = Duration::from_secs(60);

/// The systemd tool `name` from PATH. Outside CI a missing tool skips the test (saying so); in CI,
/// where scripts/setup.sh installs Debian's `systemd`, it fails it: a skip there would be a test
/// that cannot fail.
fn tool(name: &str) -> Option<PathBuf> {
    let found = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join(name))
            .find(|path| path.is_file())
    });
    if found.is_none() {
        let missing = format!(
            "{name} is not installed (Debian package `systemd`; scripts/setup.sh installs it)"
        );
        assert!(std::env::var_os("CI").is_none(), "{missing}");
        eprintln!("SKIPPED: {missing}");
    }
    found
}

/// The next notification, or `None` when none came within `limit`.
fn next_notice(notify: &UnixDatagram, limit: Duration) -> Option<String> {
    notify.set_read_timeout(Some(limit)).unwrap();
    let mut buffer = [0u8; 4096];
    match notify.recv(&mut buffer) {
        Ok(n) => Some(String::from_utf8_lossy(&buffer[..n]).into_owned()),
        Err(error)
            if matches!(
                error.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ) =>
        {
            None
        }
        Err(error) => panic!("reading NOTIFY_SOCKET: {error}"),
    }
}

/// Notifications until one has a line equal to `wanted`; every one seen, in order.
fn notices_until(notify: &UnixDatagram, wanted: &str, limit: Duration) -> Vec<String> {
    let deadline = Instant::now() + limit;
    let mut seen = Vec::new();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        assert!(
            !left.is_zero(),
            "no {wanted} within {limit:?}; saw {seen:?}"
        );
        let Some(notice) = next_notice(notify, left) else {
            continue;
        };
        let done = notice.lines().any(|line| line == wanted);
        seen.push(notice);
        if done {
            return seen;
        }
    }
}

struct Activated {
    child: Child,
    dir: tempfile::TempDir,
    notify: UnixDatagram,
    resp: PathBuf,
    http: PathBuf,
}

impl Activated {
    /// `systemd-socket-activate` holding both sockets, the daemon exec'd on the first connection
    /// (which the test makes, to the RESP socket), `WATCHDOG_USEC` set when `watchdog` is.
    fn start(policy_interval: &str, watchdog: Option<Duration>) -> Option<Activated> {
        let activate = tool("systemd-socket-activate")?;
        let dir = tempdir();
        let passed = dir.path().join("passed");
        std::fs::create_dir(&passed).unwrap();
        let (resp, http) = (passed.join("resp.sock"), passed.join("http.sock"));
        let notify_path = dir.path().join("notify.sock");
        let notify = UnixDatagram::bind(&notify_path).unwrap();
        let policy = dir.path().join("policy.yaml");
        std::fs::write(&policy, "principals:\n  me: { any: true }\nrules:\n  - id: data\n    commands: [\"@read\", \"@write\", \"@connection\"]\n    allow: data\n").unwrap();
        let run = dir.path().join("run");
        let config = dir.path().join("tollgate.yaml");
        // The configured socket paths are where the daemon would bind had systemd passed nothing.
        std::fs::write(
            &config,
            format!(
                "runtime_dir: {}\nlisten:\n  resp: {}\n  http: {}\npolicy:\n  files: [{}]\nadmin:\n  reload_interval: {policy_interval}\n",
                run.display(),
                run.join("own-resp.sock").display(),
                run.join("own-http.sock").display(),
                policy.display()
            ),
        )
        .unwrap();
        let mut command = Command::new("sh");
        // WATCHDOG_PID must be the daemon's pid: the shell's, which exec keeps through
        // systemd-socket-activate (it execs the daemon in its own process, as LISTEN_PID says).
        let watchdog = match watchdog {
            Some(interval) => format!(
                "-E WATCHDOG_USEC={} -E WATCHDOG_PID=$$",
                interval.as_micros()
            ),
            None => String::new(),
        };
        command
            .arg("-c")
            .arg(format!(
                "exec \"$ACTIVATE\" -l \"$RESP\" -l \"$HTTP\" --fdname=resp:http -E PATH -E NOTIFY_SOCKET=\"$NOTIFY\" {watchdog} \"$TOLLGATE\" serve --config \"$CONFIG\""
            ))
            .env("ACTIVATE", activate)
            .env("RESP", &resp)
            .env("HTTP", &http)
            .env("NOTIFY", &notify_path)
            .env("TOLLGATE", env!("CARGO_BIN_EXE_tollgate"))
            .env("CONFIG", &config)
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let child = command.spawn().unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while !(resp.exists() && http.exists()) {
            assert!(
                Instant::now() < deadline,
                "systemd-socket-activate never bound"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        Some(Activated {
            child,
            dir,
            notify,
            resp,
            http,
        })
    }

    fn signal(&self, signal: nix::sys::signal::Signal) {
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.child.id() as i32), signal).unwrap();
    }
}

impl Drop for Activated {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn ping(resp: &Path) -> String {
    let client = redis::Client::open(format!("unix://{}", resp.display())).unwrap();
    let mut connection = client.get_multiplexed_async_connection().await.unwrap();
    redis::cmd("PING")
        .query_async(&mut connection)
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn socket_activated_daemon_serves_on_the_passed_sockets_and_tells_systemd_its_state() {
    let Some(mut daemon) = Activated::start("1s", None) else {
        return;
    };
    // The first connection is what makes systemd-socket-activate exec the daemon; it waits in
    // the passed socket's backlog until the daemon accepts it.
    let mut first = std::os::unix::net::UnixStream::connect(&daemon.resp).unwrap();

    // READY=1 comes only once /readyz answers 200: asked right after it, /readyz must agree.
    let before_ready = notices_until(&daemon.notify, "READY=1", PATIENCE);
    let ready = http::get(&daemon.http, "/readyz").await.unwrap();
    assert_eq!(
        ready.status,
        200,
        "READY=1 was sent before /readyz passed: {:?}",
        ready.json()
    );
    for notice in &before_ready[..before_ready.len() - 1] {
        assert!(
            !notice.lines().any(|line| line == "READY=1"),
            "{before_ready:?}"
        );
    }
    first.write_all(b"*1\r\n$4\r\nPING\r\n").unwrap();
    first.set_read_timeout(Some(PATIENCE)).unwrap();
    let mut answer = [0u8; 7];
    first.read_exact(&mut answer).unwrap();
    assert_eq!(
        &answer, b"+PONG\r\n",
        "the connection that started the daemon is served"
    );
    assert_eq!(ping(&daemon.resp).await, "PONG");

    // Served on systemd's sockets; none of the daemon's own was created.
    let run = daemon.dir.path().join("run");
    assert!(!run.join("own-resp.sock").exists());
    assert!(!run.join("own-http.sock").exists());

    // A SIGHUP reload (systemctl reload's ExecReload=) is bracketed by RELOADING=1 … READY=1.
    daemon.signal(nix::sys::signal::Signal::SIGHUP);
    let reload = notices_until(&daemon.notify, "READY=1", PATIENCE);
    assert!(
        reload[0].lines().any(|line| line == "RELOADING=1"),
        "the reload did not begin with RELOADING=1: {reload:?}"
    );
    assert!(
        reload[0]
            .lines()
            .any(|line| line.starts_with("MONOTONIC_USEC=")),
        "{reload:?}"
    );
    let shown = http::get(&daemon.http, "/v1/policy").await.unwrap().json();
    assert_eq!(shown["generation"]["number"], 2, "{shown}");

    // SIGTERM: STOPPING=1, an orderly exit, and systemd's socket files left where they are.
    daemon.signal(nix::sys::signal::Signal::SIGTERM);
    notices_until(&daemon.notify, "STOPPING=1", PATIENCE);
    let status = daemon.child.wait().unwrap();
    assert!(status.success(), "{status:?}");
    assert!(daemon.resp.exists() && daemon.http.exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_watchdog_is_petted_at_half_its_interval() {
    let interval = Duration::from_millis(400);
    let Some(daemon) = Activated::start("1s", Some(interval)) else {
        return;
    };
    let _first = std::os::unix::net::UnixStream::connect(&daemon.resp).unwrap();
    notices_until(&daemon.notify, "READY=1", PATIENCE);
    // Five pets, counted from the first one seen.
    notices_until(&daemon.notify, "WATCHDOG=1", PATIENCE);
    let started = Instant::now();
    for _ in 0..5 {
        notices_until(&daemon.notify, "WATCHDOG=1", Duration::from_secs(5));
    }
    let elapsed = started.elapsed();
    // At interval/2 five take 1 s; at the full interval (too slow for systemd) 2 s; a daemon
    // that sent them as fast as it could would take a few milliseconds.
    assert!(
        elapsed < interval * 4 && elapsed > interval,
        "five WATCHDOG=1 took {elapsed:?}; a {interval:?} watchdog wants one every {:?}",
        interval / 2
    );
}

#[test]
fn the_unit_files_pass_systemd_analyze_verify() {
    let Some(analyze) = tool("systemd-analyze") else {
        return;
    };
    let units = Path::new(env!("CARGO_MANIFEST_DIR")).join("dist/systemd");
    let dir = tempdir();
    let mut files = Vec::new();
    for name in [
        "tollgate.service",
        "tollgate.socket",
        "tollgate-http.socket",
    ] {
        let text = std::fs::read_to_string(units.join(name)).unwrap();
        // The units name the installed binary; here the one just built stands in for it.
        let text = text.replace("/usr/bin/tollgate", env!("CARGO_BIN_EXE_tollgate"));
        let file = dir.path().join(name);
        std::fs::write(&file, text).unwrap();
        files.push(file);
    }
    let output = Command::new(analyze)
        .arg("verify")
        .arg("--man=no")
        .args(&files)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success() && stderr.trim().is_empty(),
        "systemd-analyze verify: {:?}\n{stderr}",
        output.status
    );
}
