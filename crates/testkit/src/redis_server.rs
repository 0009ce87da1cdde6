//! A `redis-server` child on a temporary Unix socket (`--port 0 --save ""`), ready when `start`
//! returns, killed and reaped on drop, with its log printed when the owning test panics.
//!
//! Like a deployment the daemon accepts, Redis's `default` user is off: the test's own connections
//! log in as [`ADMIN_USER`] (every command, every key) with [`admin_password`], which the server
//! reads on its standard input, not its command line. [`RedisServerBuilder::open_default`] keeps
//! `default` on without a password, for the tests of the daemon refusing such a server.

use std::hash::{BuildHasher, Hasher};
use std::io::{Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The user tests (and testkit itself) log in to every server as: every command, every key.
pub const ADMIN_USER: &str = "testkit-admin";

/// [`ADMIN_USER`]'s password: random, the same for every server of this test process (a cluster's
/// and a Sentinel group's nodes replicate as it).
pub fn admin_password() -> &'static str {
    static PASSWORD: OnceLock<String> = OnceLock::new();
    PASSWORD.get_or_init(|| {
        let random = || {
            std::collections::hash_map::RandomState::new()
                .build_hasher()
                .finish()
        };
        format!("{:016x}{:016x}", random(), random())
    })
}

/// `AUTH <admin> <password>` as an inline command line.
fn auth_line() -> String {
    format!("AUTH {ADMIN_USER} {}\r\n", admin_password())
}

/// How long a fresh server gets to answer PING before the test gives up.
const READY_TIMEOUT: Duration = Duration::from_secs(10);

/// Configures a server before it starts: extra `redis-server` arguments such as ACL users.
#[derive(Debug, Default)]
pub struct RedisServerBuilder {
    extra_args: Vec<String>,
    open_default: bool,
}

impl RedisServerBuilder {
    /// Adds each word of `words` as an argument (`"alice on >pw ~app:* +get"` after `--user`).
    pub fn args_of(mut self, words: &str) -> Self {
        self.extra_args
            .extend(words.split_ascii_whitespace().map(str::to_owned));
        self
    }

    /// Leaves Redis's `default` user on without a password, as a stock `redis-server` is: any
    /// local user who can open the socket may do anything.
    pub fn open_default(mut self) -> Self {
        self.open_default = true;
        self
    }

    /// Adds one argument as `redis-server` would take it on its command line (`--maxmemory`, `10mb`).
    pub fn arg(mut self, arg: impl Into<String>) -> Self {
        self.extra_args.push(arg.into());
        self
    }

    pub fn start(self) -> RedisServer {
        let dir = tempfile::Builder::new()
            .prefix("tollgate-redis-")
            .tempdir()
            .expect("create a temporary directory for redis-server");
        let mut server = RedisServer {
            socket: dir.path().join("redis.sock"),
            log: dir.path().join("redis.log"),
            extra_args: self.extra_args,
            open_default: self.open_default,
            child: None,
            dir,
        };
        server.spawn();
        server
    }
}

/// A running `redis-server`. Dropping it kills and reaps the process.
pub struct RedisServer {
    socket: PathBuf,
    log: PathBuf,
    extra_args: Vec<String>,
    open_default: bool,
    child: Option<Child>,
    dir: tempfile::TempDir,
}

impl RedisServer {
    /// Starts a plain server and waits until it answers.
    pub fn start() -> Self {
        RedisServerBuilder::default().start()
    }

    pub fn builder() -> RedisServerBuilder {
        RedisServerBuilder::default()
    }

    /// The Unix socket the server listens on; it stays the same across `restart`.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// The temporary directory that holds the socket and the log.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// A `redis+unix://` URL for redis-rs, logged in as [`ADMIN_USER`].
    pub fn url(&self) -> String {
        format!(
            "redis+unix://{}?user={ADMIN_USER}&pass={}",
            self.socket.display(),
            admin_password()
        )
    }

    /// [`RedisServer::url`] in database `db`.
    pub fn url_in(&self, db: u32) -> String {
        format!("{}&db={db}", self.url())
    }

    /// A file holding [`admin_password`] (mode 0600), for configs that take a password file.
    pub fn admin_password_file(&self) -> PathBuf {
        self.dir.path().join("admin.password")
    }

    /// A connection to the server logged in as [`ADMIN_USER`].
    pub fn connect(&self) -> UnixStream {
        let mut stream = UnixStream::connect(&self.socket).expect("connect to redis-server");
        stream
            .set_read_timeout(Some(Duration::from_secs(5)))
            .expect("set read timeout");
        login(&mut stream);
        stream
    }

    /// Kills the server (SIGKILL, as a crash would) and waits until the process is gone.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = std::fs::remove_file(&self.socket);
    }

    /// Starts the server again on the same socket, after `kill`.
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }

    /// The server's process id while it runs (to stop it with `SIGSTOP`, as a hung server would).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    /// Sends one inline command and returns the raw reply bytes (enough for test setup and checks).
    pub fn inline(&self, command: &str) -> String {
        self.try_inline(command).expect("ask redis-server")
    }

    /// [`RedisServer::inline`], with the connection's error instead of a panic: for a server whose
    /// clients may be cut off meanwhile (Sentinel kills every normal client of an instance it
    /// reconfigures during a failover).
    pub fn try_inline(&self, command: &str) -> std::io::Result<String> {
        // Connected and logged in without `connect`'s panics: the cut may come during the AUTH.
        let mut stream = UnixStream::connect(&self.socket)?;
        stream.set_read_timeout(Some(Duration::from_secs(5)))?;
        stream.write_all(auth_line().as_bytes())?;
        let mut ok = [0u8; 5];
        stream.read_exact(&mut ok)?;
        assert_eq!(
            &ok, b"+OK\r\n",
            "redis-server refused the testkit admin's AUTH"
        );
        stream.write_all(format!("{command}\r\n").as_bytes())?;
        let mut buf = vec![0u8; 64 * 1024];
        let n = stream.read(&mut buf)?;
        Ok(String::from_utf8_lossy(&buf[..n]).into_owned())
    }

    /// [`RedisServer::inline`] in database `db` (the daemon keeps lease state in database 1).
    pub fn inline_in(&self, db: u32, command: &str) -> String {
        let mut stream = self.connect();
        stream
            .write_all(format!("SELECT {db}\r\n{command}\r\n").as_bytes())
            .expect("write to redis-server");
        let mut reply = Vec::new();
        let mut buf = vec![0u8; 64 * 1024];
        // SELECT's `+OK` first, then the command's reply.
        while reply.len() <= b"+OK\r\n".len() {
            let n = stream.read(&mut buf).expect("read from redis-server");
            assert!(n > 0, "redis-server hung up");
            reply.extend_from_slice(&buf[..n]);
        }
        let reply = String::from_utf8_lossy(&reply).into_owned();
        match reply.strip_prefix("+OK\r\n") {
            Some(rest) => rest.to_owned(),
            None => panic!("SELECT {db} refused: {reply}"),
        }
    }

    /// The server's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn spawn(&mut self) {
        let password_file = self.admin_password_file();
        let _ = std::fs::remove_file(&password_file);
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&password_file)
            .and_then(|mut file| writeln!(file, "{}", admin_password()))
            .expect("write the admin password file");
        let default = match self.open_default {
            true => "user default on nopass ~* &* +@all",
            false => "user default off",
        };
        // A replica (of a cluster, of a Sentinel group) logs in to its master as the admin too.
        let users = format!(
            "{default}\nuser {ADMIN_USER} on >{password} ~* &* +@all\n\
             masteruser {ADMIN_USER}\nmasterauth {password}\n",
            password = admin_password()
        );
        let mut child = Command::new(redis_server_binary())
            // `-`: the users come on standard input, where other local users cannot read them.
            .arg("-")
            .arg("--port")
            .arg("0")
            .arg("--unixsocket")
            .arg(&self.socket)
            .arg("--unixsocketperm")
            .arg("700")
            .arg("--save")
            .arg("")
            .arg("--appendonly")
            .arg("no")
            .arg("--dir")
            .arg(self.dir.path())
            .arg("--logfile")
            .arg(&self.log)
            .args(&self.extra_args)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|error| {
                panic!("cannot start redis-server ({error}); install it with `apt-get install redis-server`")
            });
        if let Some(mut stdin) = child.stdin.take() {
            // Redis reads it to the end before starting; a failed write means it exited, which
            // `wait_ready` reports with its log.
            let _ = stdin.write_all(users.as_bytes());
        }
        self.child = Some(child);
        self.wait_ready();
    }

    fn wait_ready(&mut self) {
        let deadline = Instant::now() + READY_TIMEOUT;
        while Instant::now() < deadline {
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                panic!(
                    "redis-server exited with {status} before it was ready:\n{}",
                    self.log()
                );
            }
            if answers_ping(&self.socket) {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        panic!(
            "redis-server did not answer within {READY_TIMEOUT:?}:\n{}",
            self.log()
        );
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "--- redis-server log ({}) ---\n{}",
                self.log.display(),
                self.log()
            );
        }
        self.kill();
    }
}

/// The `redis-server` to run: `$REDIS_SERVER` if set, else the one on `PATH`.
fn redis_server_binary() -> String {
    std::env::var("REDIS_SERVER").unwrap_or_else(|_| "redis-server".to_owned())
}

/// Logs `stream` in as [`ADMIN_USER`], reading exactly the `+OK`.
pub fn login(stream: &mut impl ReadWrite) {
    try_login(stream).expect("log in to redis-server as the testkit admin");
}

/// [`login`], with the connection's error instead of a panic (a refused AUTH still panics).
fn try_login(stream: &mut impl ReadWrite) -> std::io::Result<()> {
    stream.write_all(auth_line().as_bytes())?;
    let mut ok = [0u8; 5];
    stream.read_exact(&mut ok)?;
    assert_eq!(
        &ok, b"+OK\r\n",
        "redis-server refused the testkit admin's AUTH"
    );
    Ok(())
}

pub trait ReadWrite: Read + Write {}
impl<T: Read + Write> ReadWrite for T {}

fn answers_ping(socket: &Path) -> bool {
    let Ok(mut stream) = UnixStream::connect(socket) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_millis(500)));
    if stream
        .write_all(format!("{}PING\r\n", auth_line()).as_bytes())
        .is_err()
    {
        return false;
    }
    let mut buf = [0u8; 12];
    let mut read = 0;
    while read < buf.len() {
        match stream.read(&mut buf[read..]) {
            Ok(0) | Err(_) => break,
            Ok(n) => read += n,
        }
        if buf[..read].ends_with(b"+PONG\r\n") {
            return true;
        }
    }
    false
}
