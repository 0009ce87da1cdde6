//! `tollgate.yaml`: the daemon's configuration, with defaults for everything, unknown keys rejected,
//! and errors that name the file, line, column and key.

mod budgets;
mod cache;

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

pub use budgets::{BudgetsConfig, ByteSize, ClassBudgets, Limit};
pub use cache::CacheConfig;
use serde::Deserialize;
use tollgate_lanes::{LanesConfig, RedisConfig};
use tollgate_lease::LeaseConfig;
use tollgate_policy::quota::MIN_SCRIPT_TIME_LIMIT;
use tollgate_policy::PolicyConfig;

/// The whole configuration file. Every section is optional.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// Directory for sockets and the embedded Redis: default `$XDG_RUNTIME_DIR/tollgate`, else `./.tollgate`.
    pub runtime_dir: Option<PathBuf>,
    pub listen: ListenConfig,
    pub resp: RespConfig,
    pub limits: LimitsConfig,
    /// Where Redis is. Absent: the daemon starts its own `redis-server` (see `embedded`).
    pub redis: Option<RedisConfig>,
    pub embedded: EmbeddedConfig,
    pub lanes: LanesConfig,
    pub policy: PolicyConfig,
    pub leases: LeaseConfig,
    pub identity: IdentityConfig,
    pub admin: AdminConfig,
    pub logging: LoggingConfig,
    pub shutdown: ShutdownConfig,
    /// The near cache (docs/cache.md); off by default.
    pub cache: CacheConfig,
    /// Threads that serve clients and Redis. Default: half the CPUs, at least one, because the
    /// daemon shares its machine with Redis (one busy thread) and with the applications it serves.
    pub worker_threads: Option<usize>,
}

/// The Unix sockets applications reach the daemon on.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ListenConfig {
    /// Redis-protocol socket; default `<runtime_dir>/resp.sock`.
    pub resp: Option<PathBuf>,
    /// HTTP/JSON socket; default `<runtime_dir>/http.sock`.
    pub http: Option<PathBuf>,
    /// File mode of both socket files, octal as a string (`"0660"`).
    pub mode: SocketMode,
    /// Group that owns both socket files; default: the daemon's own group.
    pub group: Option<String>,
}

impl Default for ListenConfig {
    fn default() -> Self {
        Self {
            resp: None,
            http: None,
            mode: SocketMode(0o660),
            group: None,
        }
    }
}

/// A Unix file mode written in octal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SocketMode(pub u32);

impl<'de> Deserialize<'de> for SocketMode {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        let digits = text.trim_start_matches("0o");
        match u32::from_str_radix(digits, 8) {
            Ok(mode) if mode <= 0o777 => Ok(SocketMode(mode)),
            _ => Err(serde::de::Error::custom(format!(
                "invalid file mode `{text}`: expected octal digits such as \"0660\""
            ))),
        }
    }
}

/// The `resp:` section of the config: limits on what one client may send and buffer.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct RespConfig {
    /// Largest command a client may send, in bytes (Redis's own ceiling is 512 MiB).
    pub max_command_bytes: usize,
    /// Most arguments in one command.
    pub max_arguments: usize,
    /// Longest inline (telnet-style) command line.
    pub max_inline_bytes: usize,
    /// Most commands of one client in flight at once; past it the daemon stops reading that client.
    pub max_pipeline: usize,
    /// Pub/sub messages buffered for one subscriber before it is disconnected as too slow.
    pub subscriber_buffer: usize,
    /// How long Redis may take to answer a command, on any lane, before its connection is closed
    /// (and replaced) and the client gets `-IOERR … (command may have run)`. Commands that say how
    /// long they take (blocking commands, `WAIT`, `DEBUG SLEEP`) get that plus 2 s instead.
    #[serde(with = "humantime_serde")]
    pub command_timeout: Duration,
    /// How long a client's script (`EVAL`, `FCALL` …) may run before the daemon stops it (`SCRIPT
    /// KILL` / `FUNCTION KILL`) and the client gets `-ERR tollgate: script stopped after
    /// resp.script_time_limit …`; well under Redis's 5 s `busy-reply-threshold`, past which Redis
    /// answers every other client `BUSY`. `0` turns it off. Redis must read the kill in time:
    /// its `busy-reply-threshold` must not be above this (the daemon sets it for the embedded
    /// server). A script that has written cannot be stopped (docs/lanes.md).
    #[serde(with = "humantime_serde")]
    pub script_time_limit: Duration,
    /// How long one user's scripts are refused after one of them was stopped at
    /// `script_time_limit` (`-BUSY tollgate: this user's scripts are refused for N ms more …`), so
    /// that sending a runaway script again at once cannot hold Redis nearly all the time. `0`: off.
    #[serde(with = "humantime_serde")]
    pub script_cooldown: Duration,
    /// Most subscriptions (channels, patterns and shard channels together) one client may hold.
    pub max_subscriptions: usize,
    /// Most subscriptions all clients of one OS user of a principal may hold together (each holds
    /// a forwarding task and buffers on the PUBSUB lane); `0`: no cap past `max_subscriptions`.
    pub max_subscriptions_per_uid: usize,
    /// Bytes held for clients: replies not yet read, input not yet parsed.
    pub budgets: BudgetsConfig,
    /// Deadlines of commands known to run longer than `command_timeout`, by name (`SAVE`) or name
    /// and subcommand (`DEBUG RELOAD`), over the built-in ones (`server::resp::deadline`).
    #[serde(deserialize_with = "durations")]
    pub command_deadlines: BTreeMap<String, Duration>,
}

/// A map of names to human-readable durations (`5m`).
fn durations<'de, D: serde::Deserializer<'de>>(
    deserializer: D,
) -> Result<BTreeMap<String, Duration>, D::Error> {
    let written = BTreeMap::<String, humantime_serde::Serde<Duration>>::deserialize(deserializer)?;
    Ok(written
        .into_iter()
        .map(|(name, deadline)| (name, deadline.into_inner()))
        .collect())
}

impl Default for RespConfig {
    fn default() -> Self {
        Self {
            max_command_bytes: 64 * 1024 * 1024,
            max_arguments: 1024 * 1024,
            max_inline_bytes: 64 * 1024,
            max_pipeline: 1024,
            subscriber_buffer: 1024,
            command_timeout: Duration::from_secs(10),
            script_time_limit: Duration::from_secs(1),
            script_cooldown: Duration::from_secs(5),
            command_deadlines: BTreeMap::new(),
            max_subscriptions: 10_000,
            max_subscriptions_per_uid: 100_000,
            budgets: BudgetsConfig::default(),
        }
    }
}

impl RespConfig {
    /// The parser limits these settings imply for client commands.
    pub fn limits(&self) -> tollgate_resp::Limits {
        tollgate_resp::Limits {
            max_frame_bytes: self.max_command_bytes,
            max_elements: self.max_arguments,
            max_depth: 1,
            max_inline_bytes: self.max_inline_bytes,
        }
    }
}

/// The `limits:` section: how many connections the daemon holds. Each listener (RESP, HTTP) counts
/// its own connections against these numbers.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct LimitsConfig {
    /// Most connections open at once on one listener; past it a new one is refused.
    pub max_clients: usize,
    /// Most connections one uid may hold open on one listener. Administrators (`admin:`) are
    /// exempt, so that an operator can always get in while some user is at its cap.
    pub max_clients_per_uid: usize,
    /// How long an HTTP client may take to send a request's headers, from their first byte.
    #[serde(with = "humantime_serde")]
    pub http_header_timeout: Duration,
    /// How long an HTTP connection may wait for its (next) request before it is closed.
    #[serde(with = "humantime_serde")]
    pub http_idle_timeout: Duration,
}

impl Default for LimitsConfig {
    fn default() -> Self {
        Self {
            max_clients: 10_000,
            max_clients_per_uid: 1_000,
            http_header_timeout: Duration::from_secs(5),
            http_idle_timeout: Duration::from_secs(60),
        }
    }
}

/// The private `redis-server` started when no `redis:` section is given.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct EmbeddedConfig {
    /// The `redis-server` binary to run.
    pub binary: PathBuf,
    /// Keep data across restarts (RDB snapshots in the runtime directory). Off by default.
    pub persistence: bool,
    /// More arguments for `redis-server`, as on its command line.
    pub args: Vec<String>,
}

impl Default for EmbeddedConfig {
    fn default() -> Self {
        Self {
            binary: PathBuf::from("redis-server"),
            persistence: false,
            args: Vec::new(),
        }
    }
}

/// The `identity:` section: what a peer whose uid and gid the policy maps to no principal becomes.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct IdentityConfig {
    pub unmapped: Unmapped,
}

/// The principal of an unmapped peer. Never its login name: a user may be called like a principal.
#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Unmapped {
    /// The principal `uid:<n>`, which only rules without `principals:` can match.
    #[default]
    Uid,
    /// No principal: RESP connections get `-NOPERM` and are closed, HTTP requests get 403.
    Refuse,
}

/// The `admin:` section: who may reload the policy and explain another principal's decisions.
/// Matched against the peer's uid and primary gid as the kernel reports them (`SO_PEERCRED`).
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct AdminConfig {
    /// Administrators' uids; absent: root and the uid the daemon runs as.
    pub uids: Option<Vec<u32>>,
    /// Groups whose members (by primary gid) are administrators.
    pub gids: Vec<u32>,
    /// The least time between two policy reloads over HTTP (each compiles every module).
    #[serde(with = "humantime_serde")]
    pub reload_interval: Duration,
}

impl Default for AdminConfig {
    fn default() -> Self {
        Self {
            uids: None,
            gids: Vec::new(),
            reload_interval: Duration::from_secs(1),
        }
    }
}

#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable lines (the default).
    #[default]
    Human,
    /// One JSON object per line.
    Json,
}

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct LoggingConfig {
    pub format: LogFormat,
    /// A `tracing` filter such as `info` or `tollgate=debug`; `RUST_LOG` wins when set.
    pub level: String,
}

impl Default for LoggingConfig {
    fn default() -> Self {
        Self {
            format: LogFormat::Human,
            level: "info".to_owned(),
        }
    }
}

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ShutdownConfig {
    /// How long in-flight work may take to finish after SIGTERM.
    #[serde(with = "humantime_serde")]
    pub drain_timeout: Duration,
}

impl Default for ShutdownConfig {
    fn default() -> Self {
        Self {
            drain_timeout: Duration::from_secs(10),
        }
    }
}

/// Why a configuration could not be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{path}: cannot read: {source}")]
    Unreadable {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{}", .0)]
    Invalid(Box<InvalidConfig>),
}

/// A configuration file that parsed wrongly or failed validation, with where and which key.
#[derive(Debug)]
pub struct InvalidConfig {
    pub path: PathBuf,
    pub line: Option<usize>,
    pub column: Option<usize>,
    /// Dotted path of the offending key (`lanes.regular.connections`); empty for the whole file.
    pub key: String,
    pub message: String,
}

impl fmt::Display for InvalidConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.path.display())?;
        if let (Some(line), Some(column)) = (self.line, self.column) {
            write!(f, ":{line}:{column}")?;
        }
        if !self.key.is_empty() {
            write!(f, ": key `{}`", self.key)?;
        }
        write!(f, ": {}", self.message)
    }
}

impl Config {
    /// Reads, parses and validates a configuration file.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Unreadable {
            path: path.to_owned(),
            source,
        })?;
        Config::parse(path, &text)
    }

    /// Parses and validates configuration text; `path` is only used in error messages.
    pub fn parse(path: &Path, text: &str) -> Result<Config, ConfigError> {
        let invalid = |line, column, key: String, message: String| {
            ConfigError::Invalid(Box::new(InvalidConfig {
                path: path.to_owned(),
                line,
                column,
                key,
                message,
            }))
        };
        // An empty file is a valid, all-defaults configuration.
        if text.trim().is_empty() {
            return Ok(Config::default());
        }
        let deserializer = serde_yaml::Deserializer::from_str(text);
        let config: Config = serde_path_to_error::deserialize(deserializer).map_err(|error| {
            let key = error.path().to_string();
            let key = if key == "." { String::new() } else { key };
            let inner = error.into_inner();
            let location = inner.location();
            let message = tidy_message(&inner.to_string(), &key);
            invalid(
                location.as_ref().map(|l| l.line()),
                location.as_ref().map(|l| l.column()),
                key,
                message,
            )
        })?;
        config
            .validate()
            .map_err(|(key, message)| invalid(None, None, key, message))?;
        Ok(config)
    }

    /// Checks what types alone cannot: returns the offending key and why.
    fn validate(&self) -> Result<(), (String, String)> {
        self.lanes
            .validate()
            .map_err(|error| ("lanes".to_owned(), error.to_string()))?;
        self.leases
            .validate()
            .map_err(|error| ("leases".to_owned(), error.to_string()))?;
        self.cache.validate()?;
        if self.worker_threads == Some(0) {
            return Err(("worker_threads".to_owned(), "must be at least 1".to_owned()));
        }
        if self.admin.reload_interval.is_zero() {
            return Err((
                "admin.reload_interval".to_owned(),
                "must be longer than zero".to_owned(),
            ));
        }
        if self.resp.command_timeout.is_zero() {
            return Err((
                "resp.command_timeout".to_owned(),
                "must be longer than zero".to_owned(),
            ));
        }
        // Not checked against `command_timeout`: a config valid before the limit existed (a
        // timeout under the default 1 s) must stay valid; a limit at or past a script's deadline
        // never acts, which docs/lanes.md says.
        let limit = self.resp.script_time_limit;
        if !limit.is_zero() && limit < MIN_SCRIPT_TIME_LIMIT {
            return Err((
                "resp.script_time_limit".to_owned(),
                format!("must be 0 (off) or at least {MIN_SCRIPT_TIME_LIMIT:?}"),
            ));
        }
        if let Some((name, _)) = self
            .resp
            .command_deadlines
            .iter()
            .find(|(_, deadline)| deadline.is_zero())
        {
            return Err((
                format!("resp.command_deadlines.{name}"),
                "must be longer than zero".to_owned(),
            ));
        }
        if self.limits.max_clients == 0 || self.limits.max_clients_per_uid == 0 {
            return Err((
                "limits".to_owned(),
                "max_clients and max_clients_per_uid must be at least 1".to_owned(),
            ));
        }
        for (key, timeout) in [
            (
                "limits.http_header_timeout",
                self.limits.http_header_timeout,
            ),
            ("limits.http_idle_timeout", self.limits.http_idle_timeout),
        ] {
            if timeout.is_zero() {
                return Err((key.to_owned(), "must be longer than zero".to_owned()));
            }
        }
        if self.shutdown.drain_timeout.is_zero() {
            return Err((
                "shutdown.drain_timeout".to_owned(),
                "must be longer than zero".to_owned(),
            ));
        }
        Ok(())
    }

    /// How many threads serve clients and Redis (see `worker_threads`).
    pub fn worker_threads(&self) -> usize {
        self.worker_threads.unwrap_or_else(|| {
            let cpus = std::thread::available_parallelism().map_or(1, usize::from);
            (cpus / 2).max(1)
        })
    }

    /// The async runtime that serves with [`Config::worker_threads`] workers. One worker needs no
    /// work stealing: the current-thread scheduler wakes tasks without the multi-thread one's
    /// cross-thread bookkeeping.
    pub fn async_runtime(&self) -> std::io::Result<tokio::runtime::Runtime> {
        match self.worker_threads() {
            1 => tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build(),
            workers => tokio::runtime::Builder::new_multi_thread()
                .worker_threads(workers)
                .enable_all()
                .build(),
        }
    }

    /// The directory for sockets and the embedded Redis.
    pub fn runtime_dir(&self) -> PathBuf {
        if let Some(dir) = &self.runtime_dir {
            return dir.clone();
        }
        match std::env::var_os("XDG_RUNTIME_DIR") {
            Some(dir) if !dir.is_empty() => PathBuf::from(dir).join("tollgate"),
            _ => PathBuf::from(".tollgate"),
        }
    }

    pub fn resp_socket(&self) -> PathBuf {
        self.listen
            .resp
            .clone()
            .unwrap_or_else(|| self.runtime_dir().join("resp.sock"))
    }

    pub fn http_socket(&self) -> PathBuf {
        self.listen
            .http
            .clone()
            .unwrap_or_else(|| self.runtime_dir().join("http.sock"))
    }
}

/// serde_yaml wraps its messages as "<path>: <message> at line L column C"; we print the key and
/// the location ourselves, so keep only the message.
fn tidy_message(message: &str, key: &str) -> String {
    let message = match message.find(" at line ") {
        Some(index) => &message[..index],
        None => message,
    };
    match message.split_once(": ") {
        Some((path, rest)) if !path.contains(' ') && key.starts_with(path) => rest.to_owned(),
        _ => message.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tollgate_lanes::Lane;

    fn parse(text: &str) -> Result<Config, String> {
        Config::parse(Path::new("tollgate.yaml"), text).map_err(|e| e.to_string())
    }

    #[test]
    fn empty_file_means_defaults() {
        assert_eq!(parse("").unwrap(), Config::default());
    }

    #[test]
    fn unknown_key_names_file_line_column_and_key() {
        let error = parse("listen:\n  http: /tmp/h.sock\n  colour: blue\n").unwrap_err();
        assert!(
            error.starts_with("tollgate.yaml:3:3: key `listen.colour`: unknown field `colour`"),
            "{error}"
        );
    }

    #[test]
    fn wrong_type_names_the_key_and_what_was_expected() {
        let error = parse("lanes:\n  regular:\n    connections: many\n").unwrap_err();
        assert!(
            error.starts_with("tollgate.yaml:3:18: key `lanes.regular.connections`"),
            "{error}"
        );
        assert!(error.contains("expected"), "{error}");
    }

    #[test]
    fn validation_errors_name_the_key() {
        let error = parse("lanes:\n  admin:\n    connections: 0\n").unwrap_err();
        assert!(
            error.contains("lanes.admin.connections must be at least 1"),
            "{error}"
        );
    }

    #[test]
    fn the_script_time_limit_is_a_second_by_default_zero_is_off_and_it_is_checked() {
        assert_eq!(
            Config::default().resp.script_time_limit,
            Duration::from_secs(1)
        );
        let read = |text: &str| parse(text).map(|config| config.resp.script_time_limit);
        assert_eq!(
            read("resp:\n  script_time_limit: 250ms\n"),
            Ok(Duration::from_millis(250))
        );
        assert_eq!(read("resp:\n  script_time_limit: 0s\n"), Ok(Duration::ZERO));
        for refused in ["1ms", "9ms", "500us"] {
            let error = read(&format!("resp:\n  script_time_limit: {refused}\n")).unwrap_err();
            assert!(
                error.contains("resp.script_time_limit"),
                "{refused}: {error}"
            );
        }
        // A command timeout under the default limit stays valid (the limit then never acts).
        assert_eq!(
            read("resp:\n  command_timeout: 500ms\n"),
            Ok(Duration::from_secs(1))
        );
        assert_eq!(
            read("resp:\n  command_timeout: 1m\n  script_time_limit: 10s\n"),
            Ok(Duration::from_secs(10))
        );
    }

    #[test]
    fn command_deadlines_and_lane_shares_are_read_and_checked() {
        let config = parse(
            "resp:\n  command_deadlines:\n    EVAL: 30s\n    DEBUG RELOAD: 10m\nlanes:\n  blocking:\n    per_principal: 5\n",
        )
        .unwrap();
        assert_eq!(
            config.resp.command_deadlines,
            BTreeMap::from([
                ("DEBUG RELOAD".to_owned(), Duration::from_secs(600)),
                ("EVAL".to_owned(), Duration::from_secs(30)),
            ])
        );
        assert_eq!(config.lanes.settings(Lane::Blocking).per_principal, 5);
        // Three quarters of each lane's connections by default, never every one of a shared lane.
        let defaults = Config::default();
        assert_eq!(defaults.lanes.settings(Lane::Blocking).per_principal, 24);
        assert_eq!(defaults.lanes.settings(Lane::Admin).per_principal, 1);
        let error = parse("resp:\n  command_deadlines:\n    SAVE: 0s\n").unwrap_err();
        assert!(
            error.contains("key `resp.command_deadlines.SAVE`"),
            "{error}"
        );
        let error = parse("lanes:\n  admin:\n    per_principal: 0\n").unwrap_err();
        assert!(
            error.contains("lanes.admin.per_principal must be at least 1"),
            "{error}"
        );
    }

    #[test]
    fn worker_threads_are_configured_or_half_the_cpus() {
        assert_eq!(
            parse(
                "worker_threads: 3
"
            )
            .unwrap()
            .worker_threads(),
            3
        );
        let cpus = std::thread::available_parallelism().map_or(1, usize::from);
        assert_eq!(Config::default().worker_threads(), (cpus / 2).max(1));
        let error = parse(
            "worker_threads: 0
",
        )
        .unwrap_err();
        assert!(
            error.contains("key `worker_threads`: must be at least 1"),
            "{error}"
        );
    }

    #[test]
    fn identity_and_admin_sections_parse() {
        let config = parse(
            "identity:\n  unmapped: refuse\nadmin:\n  uids: [1000]\n  gids: [10]\n  reload_interval: 5s\n",
        )
        .unwrap();
        assert_eq!(config.identity.unmapped, Unmapped::Refuse);
        assert_eq!(config.admin.uids, Some(vec![1000]));
        assert_eq!(config.admin.gids, vec![10]);
        assert_eq!(config.admin.reload_interval, Duration::from_secs(5));
        assert_eq!(Config::default().identity.unmapped, Unmapped::Uid);
        let error = parse("identity:\n  unmapped: login\n").unwrap_err();
        assert!(error.contains("key `identity.unmapped`"), "{error}");
        assert!(parse("admin:\n  users: [root]\n").is_err());
        let error = parse("admin:\n  reload_interval: 0s\n").unwrap_err();
        assert!(error.contains("key `admin.reload_interval`"), "{error}");
    }

    #[test]
    fn limits_parse_with_defaults_for_a_shared_machine_and_refuse_zero() {
        let config = parse(
            "limits:\n  max_clients: 50\n  max_clients_per_uid: 5\n  http_header_timeout: 2s\n  http_idle_timeout: 30s\n",
        )
        .unwrap();
        assert_eq!(
            config.limits,
            LimitsConfig {
                max_clients: 50,
                max_clients_per_uid: 5,
                http_header_timeout: Duration::from_secs(2),
                http_idle_timeout: Duration::from_secs(30),
            }
        );
        let defaults = LimitsConfig::default();
        assert_eq!(
            (defaults.max_clients, defaults.max_clients_per_uid),
            (10_000, 1_000)
        );
        let error = parse("limits:\n  max_clients_per_uid: 0\n").unwrap_err();
        assert!(error.contains("key `limits`"), "{error}");
        let error = parse("limits:\n  http_idle_timeout: 0s\n").unwrap_err();
        assert!(error.contains("key `limits.http_idle_timeout`"), "{error}");
    }

    #[test]
    fn budgets_parse_sizes_and_point_at_a_soft_limit_over_its_hard_one() {
        let config = parse(
            "resp:\n  max_subscriptions: 50\n  budgets:\n    total: 1GiB\n    pubsub:\n      output: {hard: 4MiB, soft: 1MiB, soft_for: 5s}\n      input: {hard: 65536}\n",
        )
        .unwrap();
        let budgets = &config.resp.budgets;
        assert_eq!(config.resp.max_subscriptions, 50);
        assert_eq!(budgets.total, ByteSize(1 << 30));
        assert_eq!(
            budgets.per_uid(),
            ByteSize(1 << 28),
            "a quarter of the total"
        );
        let shareless = parse("resp:\n  budgets:\n    per_uid: 0\n").unwrap();
        assert_eq!(shareless.resp.budgets.per_uid(), ByteSize(0));
        assert_eq!(budgets.pubsub.output.hard, ByteSize(4 << 20));
        assert_eq!(budgets.pubsub.output.soft_for, Duration::from_secs(5));
        assert_eq!(budgets.pubsub.input.soft, ByteSize(0));
        assert_eq!(budgets.normal, BudgetsConfig::default().normal);
        let error = parse(
            "resp:\n  budgets:\n    normal:\n      output: {hard: 1MiB, soft: 2MiB}\n      input: {hard: 1MiB}\n",
        )
        .unwrap_err();
        assert!(
            error.starts_with("tollgate.yaml:4:7: key `resp.budgets.normal.output`"),
            "{error}"
        );
        assert!(
            error.contains("soft (2097152 bytes) is over hard (1048576 bytes)"),
            "{error}"
        );
        let error = parse("resp:\n  budgets:\n    total: lots\n").unwrap_err();
        assert!(
            error.contains("key `resp.budgets.total`: invalid size `lots`"),
            "{error}"
        );
    }

    #[test]
    fn socket_mode_is_octal() {
        let config = parse("listen:\n  mode: \"0600\"\n").unwrap();
        assert_eq!(config.listen.mode, SocketMode(0o600));
        assert!(parse("listen:\n  mode: \"0999\"\n").is_err());
    }
}
