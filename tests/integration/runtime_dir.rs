//! The runtime directory is the daemon's, tried by a second, real OS user (`tollgate-test-c`, created
//! when the tests run as root; without root they print why and return): a directory that user made
//! first, a `redis.log` link it planted, a directory others may write to, a link where a socket
//! goes, and a Redis server of its own behind the socket the lanes would send passwords to.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use prometheus_client::registry::Registry;
use tollgate::config::Config;
use tollgate::embedded::EmbeddedError;
use tollgate::runtime::StartError;
use tollgate::runtime_dir::{EntryError, RuntimeDirError};
use tollgate::server::socket::BindError;
use tollgate::Daemon;
use tollgate_lanes::{
    CallError, Endpoint, Lane, LaneError, Lanes, LanesConfig, Multiplexed, Topology,
};

use crate::lanes::cmd;
use crate::support::daemon::{tempdir, TestDaemon};

const STRANGER: &str = "tollgate-test-c";

/// Another OS user than the daemon's.
#[derive(Clone, Copy)]
struct Stranger {
    uid: u32,
    gid: u32,
}

impl Stranger {
    /// The second user, created on first use; `None` (with the reason printed) when not root.
    fn get() -> Option<Stranger> {
        if !nix::unistd::geteuid().is_root() {
            println!("skipped: not running as root, so no second OS user can be created or used");
            return None;
        }
        static USER: OnceLock<Stranger> = OnceLock::new();
        Some(*USER.get_or_init(|| {
            if nix::unistd::User::from_name(STRANGER).unwrap().is_none() {
                let status = Command::new("useradd")
                    .args(["--system", "--no-create-home", STRANGER])
                    .status()
                    .expect("run useradd");
                assert!(status.success(), "useradd {STRANGER}: {status}");
            }
            let user = nix::unistd::User::from_name(STRANGER).unwrap().unwrap();
            Stranger {
                uid: user.uid.as_raw(),
                gid: user.gid.as_raw(),
            }
        }))
    }

    /// `argv` run as this user, with no supplementary groups.
    fn command(&self, argv: &[&str]) -> Command {
        let mut command = Command::new("setpriv");
        command
            .arg(format!("--reuid={}", self.uid))
            .arg(format!("--regid={}", self.gid))
            .args(["--clear-groups", "--"])
            .args(argv);
        command
    }

    fn run(&self, argv: &[&str]) -> Output {
        let output = self.command(argv).output().expect("run setpriv");
        assert!(
            output.status.success(),
            "{argv:?} as {STRANGER}: {output:?}"
        );
        output
    }

    fn group_name(&self) -> String {
        nix::unistd::Group::from_gid(self.gid.into())
            .unwrap()
            .expect("the stranger's group exists")
            .name
    }
}

/// A temporary directory like `/tmp` (1777), where the stranger can make directories of its own.
fn shared_base() -> tempfile::TempDir {
    let base = tempdir();
    std::fs::set_permissions(base.path(), std::fs::Permissions::from_mode(0o1777)).unwrap();
    base
}

fn s(path: &Path) -> &str {
    path.to_str().unwrap()
}

/// The embedded default with its runtime directory (and sockets) at `dir`.
async fn start_at(dir: &Path, adjust: impl FnOnce(&mut Config)) -> Result<Daemon, StartError> {
    let mut config = TestDaemon::config(dir);
    adjust(&mut config);
    Daemon::start(config).await
}

/// A root-only file whose bytes and size must survive.
fn root_only_file(base: &Path) -> (PathBuf, Vec<u8>) {
    let path = base.join("root-only");
    let content = b"root's own bytes\n".to_vec();
    std::fs::write(&path, &content).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    (path, content)
}

#[tokio::test]
async fn a_runtime_directory_another_user_created_is_refused() {
    let Some(stranger) = Stranger::get() else {
        return;
    };
    let base = shared_base();
    let dir = base.path().join("run");
    stranger.run(&["mkdir", "-m", "0700", s(&dir)]);

    let error = start_at(&dir, |_| {}).await.err().expect("start refused");
    let StartError::RuntimeDir(RuntimeDirError::NotOwned { path, owner, .. }) = &error else {
        panic!("not refused for its owner: {error}");
    };
    assert_eq!((path, *owner), (&dir, stranger.uid));
    let message = error.to_string();
    assert!(
        message.contains(s(&dir)) && message.contains(&format!("owned by uid {}", stranger.uid)),
        "{message}"
    );
    let left: Vec<_> = std::fs::read_dir(&dir).unwrap().collect();
    assert!(left.is_empty(), "the daemon put files there: {left:?}");
}

#[tokio::test]
async fn a_planted_redis_log_link_is_refused_and_its_target_untouched() {
    let Some(stranger) = Stranger::get() else {
        return;
    };
    let base = shared_base();
    let (target, content) = root_only_file(base.path());

    // In a directory the stranger controls: refused for the directory's owner already.
    let theirs = base.path().join("theirs");
    stranger.run(&["mkdir", "-m", "0755", s(&theirs)]);
    stranger.run(&["ln", "-s", s(&target), s(&theirs.join("redis.log"))]);
    let error = start_at(&theirs, |_| {})
        .await
        .err()
        .expect("start refused");
    assert!(
        matches!(
            error,
            StartError::RuntimeDir(RuntimeDirError::NotOwned { .. })
        ),
        "{error}"
    );

    // In the daemon's own directory (a link left there somehow): refused for the link itself,
    // before redis-server could open it.
    let own = base.path().join("own");
    std::fs::create_dir(&own).unwrap();
    std::fs::set_permissions(&own, std::fs::Permissions::from_mode(0o700)).unwrap();
    let log = own.join("redis.log");
    std::os::unix::fs::symlink(&target, &log).unwrap();
    let error = start_at(&own, |_| {}).await.err().expect("start refused");
    let StartError::Embedded(EmbeddedError::Unsafe(EntryError::Symlink { path })) = &error else {
        panic!("not refused for the link: {error}");
    };
    assert_eq!(path, &log);
    assert!(error.to_string().contains("symbolic link"), "{error}");

    assert_eq!(
        std::fs::read(&target).unwrap(),
        content,
        "the target changed"
    );
    assert!(
        std::fs::symlink_metadata(&log).unwrap().is_symlink(),
        "the link is left for the operator to look at"
    );
}

#[tokio::test]
async fn a_runtime_directory_others_may_write_to_is_refused() {
    let Some(stranger) = Stranger::get() else {
        return;
    };
    let base = shared_base();
    // World-writable, and writable by the stranger's group: either lets the stranger swap files.
    let world = base.path().join("world");
    std::fs::create_dir(&world).unwrap();
    std::fs::set_permissions(&world, std::fs::Permissions::from_mode(0o777)).unwrap();
    let group = base.path().join("group");
    std::fs::create_dir(&group).unwrap();
    nix::unistd::chown(&group, None, Some(stranger.gid.into())).unwrap();
    std::fs::set_permissions(&group, std::fs::Permissions::from_mode(0o770)).unwrap();

    for (dir, who) in [(&world, "its group and everyone"), (&group, "its group")] {
        let error = start_at(dir, |_| {}).await.err().expect("start refused");
        assert!(
            matches!(&error, StartError::RuntimeDir(RuntimeDirError::Writable { path, who: w, .. })
                if path == dir && *w == who),
            "{error}"
        );
        assert!(
            std::fs::read_dir(dir).unwrap().next().is_none(),
            "{}: the daemon put files there",
            dir.display()
        );
    }
    // What the stranger can write to, it could have used: prove the refusal is not academic.
    stranger.run(&["touch", s(&group.join("planted"))]);
}

#[tokio::test]
async fn the_daemons_own_new_directory_is_private_and_0750_for_its_group() {
    let Some(stranger) = Stranger::get() else {
        return;
    };
    let base = shared_base();
    // The HTTP health check answers anyone who can reach the socket.
    // Awaited, not blocking: the daemon answers on this test's own runtime thread.
    let health = |socket: &Path| {
        let command = stranger.command(&[
            "curl",
            "-s",
            "--unix-socket",
            s(socket),
            "http://localhost/healthz",
        ]);
        async move {
            let output = tokio::process::Command::from(command)
                .output()
                .await
                .expect("run curl");
            String::from_utf8_lossy(&output.stdout).into_owned()
        }
    };

    let private = base.path().join("private");
    let daemon = start_at(&private, |_| {}).await.expect("daemon starts");
    let metadata = std::fs::metadata(&private).unwrap();
    assert_eq!(metadata.mode() & 0o7777, 0o700);
    assert_eq!(metadata.uid(), nix::unistd::geteuid().as_raw());
    let refused = health(daemon.http_socket()).await;
    assert!(refused.is_empty(), "{STRANGER} got through: {refused}");
    daemon.shutdown().await;

    let grouped = base.path().join("grouped");
    let group = stranger.group_name();
    let daemon = start_at(&grouped, |config| config.listen.group = Some(group.clone()))
        .await
        .expect("daemon starts");
    let metadata = std::fs::metadata(&grouped).unwrap();
    assert_eq!(metadata.mode() & 0o7777, 0o750);
    assert_eq!(metadata.gid(), stranger.gid);
    let admitted = health(daemon.http_socket()).await;
    assert!(
        admitted.contains("outcome"),
        "a member of listen.group reaches the socket: {admitted:?}"
    );
    daemon.shutdown().await;
}

#[tokio::test]
async fn a_link_where_a_socket_goes_is_refused_not_followed() {
    let base = tempdir();
    let (target, content) = root_only_file(base.path());
    let dir = base.path().join("run");
    std::fs::create_dir(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    let http = dir.join("http.sock");
    std::os::unix::fs::symlink(&target, &http).unwrap();

    let error = start_at(&dir, |_| {}).await.err().expect("start refused");
    assert!(
        matches!(&error, StartError::Bind(BindError::Existing(EntryError::Symlink { path })) if path == &http),
        "{error}"
    );
    assert!(std::fs::symlink_metadata(&http).unwrap().is_symlink());
    assert_eq!(std::fs::read(&target).unwrap(), content);

    // A regular file is not taken for a stale socket and removed either.
    std::fs::remove_file(&http).unwrap();
    std::fs::write(&http, "not a socket").unwrap();
    let error = start_at(&dir, |_| {}).await.err().expect("start refused");
    assert!(
        matches!(
            &error,
            StartError::Bind(BindError::Existing(EntryError::WrongKind { .. }))
        ),
        "{error}"
    );
    assert_eq!(std::fs::read_to_string(&http).unwrap(), "not a socket");
}

/// A `redis-server` run by the stranger on a socket in a directory of its own.
struct StrangersRedis {
    child: Child,
    socket: PathBuf,
}

impl StrangersRedis {
    fn start(stranger: Stranger, base: &Path) -> StrangersRedis {
        let dir = base.join("theirs");
        stranger.run(&["mkdir", "-m", "0700", s(&dir)]);
        let socket = dir.join("redis.sock");
        let child = stranger
            .command(&[
                "redis-server",
                "--port",
                "0",
                "--unixsocket",
                s(&socket),
                "--dir",
                s(&dir),
                "--save",
                "",
                "--appendonly",
                "no",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start the stranger's redis-server");
        let server = StrangersRedis { child, socket };
        let deadline = Instant::now() + Duration::from_secs(10);
        while server.cli(&["PING"]) != "PONG" {
            assert!(
                Instant::now() < deadline,
                "the stranger's redis-server never answered"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        server
    }

    /// Asks the server as root, with redis-cli.
    fn cli(&self, argv: &[&str]) -> String {
        let output = Command::new("redis-cli")
            .arg("-s")
            .arg(&self.socket)
            .args(argv)
            .output()
            .expect("run redis-cli");
        String::from_utf8_lossy(&output.stdout).trim().to_owned()
    }

    /// Whether anyone tried to authenticate: a HELLO was run, or an AUTH failed into the ACL log.
    fn saw_a_password(&self) -> bool {
        self.cli(&["INFO", "commandstats"])
            .contains("cmdstat_hello")
            || !self.cli(&["ACL", "LOG"]).is_empty()
    }
}

impl Drop for StrangersRedis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Lanes whose REGULAR user has a password, pointed at `socket`, expecting `server_uid`.
fn lanes_to(socket: &Path, dir: &Path, server_uid: Option<u32>) -> Lanes {
    let password = dir.join("regular.password");
    std::fs::write(&password, "a-secret-password").unwrap();
    let mut config = LanesConfig::default();
    let regular = config.overrides_mut(Lane::Regular);
    regular.user = Some("tollgate-regular".into());
    regular.password_file = Some(password);
    config.server_uid = server_uid;
    Lanes::open(
        &Topology::Standalone(Endpoint::Unix(socket.to_owned())),
        &config,
        &mut Registry::default(),
    )
    .expect("open lanes")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lanes_send_no_password_to_a_server_another_uid_runs() {
    let Some(stranger) = Stranger::get() else {
        return;
    };
    let base = shared_base();
    let theirs = StrangersRedis::start(stranger, base.path());
    let daemon_uid = nix::unistd::geteuid().as_raw();

    let lanes = lanes_to(&theirs.socket, base.path(), Some(daemon_uid));
    let refused = lanes
        .multiplexed(Multiplexed::Regular)
        .unwrap()
        .send(cmd(&["PING"]))
        .await
        .expect_err("refused");
    let CallError::NotSent(LaneError::Unavailable { reason }) = &refused else {
        panic!("not refused as not sent: {refused}");
    };
    assert!(
        reason.contains(&format!(
            "runs as uid {}, not uid {daemon_uid}",
            stranger.uid
        )),
        "{reason}"
    );
    assert!(refused.to_string().contains("not sent"), "{refused}");
    assert!(!theirs.saw_a_password(), "the password went out");

    // The same lanes without the check would have sent it: the stranger's server sees the attempt.
    let unchecked = lanes_to(&theirs.socket, base.path(), None);
    let _ = unchecked
        .multiplexed(Multiplexed::Regular)
        .unwrap()
        .send(cmd(&["PING"]))
        .await;
    assert!(theirs.saw_a_password(), "the control sent nothing");
}
