//! Least-privilege ACL users: what each lane's user and the lease service's user may do, and, for an
//! embedded Redis (which the daemon owns and therefore configures itself), creating them: one user
//! per lane plus the lease user, each with a random password kept in a 0600 file in the runtime
//! directory and handed to the lanes through the usual `user` / `password_file` settings; and
//! creating them again, with the same passwords, on a server that lost them.
//!
//! Client lanes' users run the commands the active policy could admit on their lane ([`LaneGrants`])
//! on every key and channel except the reserved keyspace ([`complement_patterns`]); only the lease
//! user reaches it.

use std::collections::BTreeSet;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use parking_lot::Mutex;
use rand::Rng;
use tollgate_model::Lane;
use tollgate_resp::Frame;

use tollgate_model::reserved::RESERVED_PREFIX;

use crate::grants::LaneGrants;
use crate::scope_pools::ScopeLogin;
use crate::stream::Stream;
use crate::{Endpoint, LanesConfig};

#[derive(Debug, thiserror::Error)]
pub enum AclError {
    #[error("cannot reach redis at {endpoint} to create lane users: {reason}")]
    Redis { endpoint: Endpoint, reason: String },
    #[error("redis refused `ACL SETUSER {user}`: {reason}")]
    Refused { user: String, reason: String },
    #[error("redis refused `CONFIG SET {setting}`: {reason}")]
    Setting {
        setting: &'static str,
        reason: String,
    },
    #[error("cannot write lane password file {path}: {source}")]
    PasswordFile {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// The lanes config with every lane's user and password file filled in, and the users as created.
#[derive(Debug, Clone)]
pub struct Provisioned {
    pub config: LanesConfig,
    pub users: ProvisionedUsers,
}

/// The users [`provision`] created, with the passwords the lanes read from their files, so that a
/// server that lost them (an embedded server restarted without persistence) gets exactly those
/// back: the lanes keep the passwords they read at open and never read the files again. Clones
/// share the users, so rules [`ProvisionedUsers::regrant`]ed after a policy reload are the ones a
/// restarted server gets.
#[derive(Clone)]
pub struct ProvisionedUsers {
    users: Arc<Mutex<Vec<(DaemonUser, String)>>>,
    /// The scopes' users (`scope_acl`): name, rules and password, kept in memory only (the
    /// daemon makes them again at each start).
    scopes: Arc<Mutex<Vec<ScopeAccount>>>,
    /// Who sets them: the server's administrator (`default` is off on the embedded server).
    admin: Option<Admin>,
    /// The server's `busy-reply-threshold`, set with the users when the daemon keeps one
    /// ([`ProvisionedUsers::keep_busy_threshold`]).
    busy_threshold: Arc<Mutex<Option<Duration>>>,
}

impl ProvisionedUsers {
    /// `ACL SETUSER` for each user on `endpoint`, with its password and current rules, and the
    /// `busy-reply-threshold` kept, if any.
    pub async fn apply(&self, endpoint: &Endpoint) -> Result<(), AclError> {
        let users = self.users.lock().clone();
        let mut commands: Vec<(String, Vec<String>)> = users
            .iter()
            .map(|(user, password)| (user.name.clone(), user.setuser(password)))
            .collect();
        let scopes = self.scopes.lock().clone();
        commands.extend(scopes.iter().map(ScopeAccount::setuser));
        run_as_admin(endpoint, self.admin.as_ref(), &commands).await?;
        let Some(threshold) = *self.busy_threshold.lock() else {
            return Ok(());
        };
        let setting = "busy-reply-threshold";
        let argv =
            ["CONFIG", "SET", setting, &threshold.as_millis().to_string()].map(str::to_owned);
        let set = [(setting.to_owned(), argv.to_vec())];
        run_as_admin(endpoint, self.admin.as_ref(), &set)
            .await
            .map_err(|error| match error {
                AclError::Refused { reason, .. } => AclError::Setting { setting, reason },
                other => other,
            })
    }

    /// Keeps the server's `busy-reply-threshold` at `threshold` from the next
    /// [`ProvisionedUsers::apply`] on (`None`: leaves it as it is). Redis reads nothing, the
    /// daemon's `SCRIPT KILL` included, until a script has run that long: the daemon sets it to
    /// the shortest script time limit it keeps (`script_limit`).
    pub fn keep_busy_threshold(&self, threshold: Option<Duration>) {
        *self.busy_threshold.lock() = threshold;
    }

    /// Makes the scopes' users exactly `wanted` (each a name and its `ACL SETUSER` rules after
    /// `reset`, `ScopeUser::acl_rules`) on `endpoint`: each set (with the password it had, when
    /// it had one), every other scope user deleted (its connections with it). Returns each user's
    /// login for its pool.
    pub async fn set_scopes(
        &self,
        endpoint: &Endpoint,
        wanted: Vec<(String, Vec<String>)>,
    ) -> Result<Vec<ScopeLogin>, AclError> {
        let (kept, gone) = {
            let had = self.scopes.lock();
            let kept: Vec<ScopeAccount> = wanted
                .into_iter()
                .map(|(name, rules)| {
                    let password = had
                        .iter()
                        .find(|old| old.name == name)
                        .map_or_else(random_password, |old| old.password.clone());
                    ScopeAccount {
                        name,
                        rules,
                        password,
                    }
                })
                .collect();
            let gone: Vec<String> = had
                .iter()
                .filter(|old| !kept.iter().any(|user| user.name == old.name))
                .map(|old| old.name.clone())
                .collect();
            (kept, gone)
        };
        let mut commands: Vec<(String, Vec<String>)> =
            kept.iter().map(ScopeAccount::setuser).collect();
        commands.extend(gone.into_iter().map(|name| {
            let argv = vec!["ACL".to_owned(), "DELUSER".to_owned(), name.clone()];
            (name, argv)
        }));
        run_as_admin(endpoint, self.admin.as_ref(), &commands).await?;
        let logins = kept
            .iter()
            .map(|user| ScopeLogin {
                user: user.name.clone(),
                password: user.password.clone(),
            })
            .collect();
        *self.scopes.lock() = kept;
        Ok(logins)
    }

    /// Cuts the lanes' users to `grants` from now on (the next [`ProvisionedUsers::apply`]).
    pub fn regrant(&self, grants: &LaneGrants) {
        for (user, _) in self.users.lock().iter_mut() {
            if let Some(lane) = user.lane {
                user.rules = acl_rules(lane, grants);
            }
        }
    }
}

/// A scope's user as made on the server.
#[derive(Clone)]
struct ScopeAccount {
    name: String,
    rules: Vec<String>,
    password: String,
}

impl ScopeAccount {
    /// `(name, ACL SETUSER <name> reset on ><password> <rules…>)`.
    fn setuser(&self) -> (String, Vec<String>) {
        let mut argv: Vec<String> = ["ACL", "SETUSER", &self.name, "reset", "on"]
            .iter()
            .map(|word| (*word).to_owned())
            .collect();
        argv.push(format!(">{}", self.password));
        argv.extend(self.rules.iter().cloned());
        (self.name.clone(), argv)
    }
}

impl std::fmt::Debug for ProvisionedUsers {
    /// The user names only: the passwords stay out of logs.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.users.lock().iter().map(|(user, _)| user.name.clone()))
            .finish()
    }
}

/// A user allowed to run `ACL SETUSER`, and its password: how the daemon logs in to create the
/// lane users where Redis's `default` user is off (the embedded server; a test's server).
#[derive(Clone)]
pub struct Admin {
    pub user: String,
    pub password: String,
}

impl Admin {
    /// The embedded server's administrator, with a fresh random password, written (0600) to
    /// `<dir>/admin.password` beside the lane users' for an operator who needs to look inside.
    pub fn embedded(dir: &Path) -> Result<Admin, AclError> {
        let password = random_password();
        let path = dir.join("admin.password");
        write_secret(&path, &password).map_err(|source| AclError::PasswordFile { path, source })?;
        Ok(Admin {
            user: EMBEDDED_ADMIN.to_owned(),
            password,
        })
    }

    /// Its rules: everything.
    pub fn acl_rules() -> &'static str {
        "~* &* +@all"
    }
}

impl std::fmt::Debug for Admin {
    /// The user only: the password stays out of logs.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Admin").field("user", &self.user).finish()
    }
}

/// The administrator the daemon creates on its embedded server and `tollgate redis-acl` creates
/// on an external one: every command and key, used instead of Redis's `default` user, which is
/// off. (Not `tollgate-admin`: that is the ADMIN lane's user.)
pub const EMBEDDED_ADMIN: &str = "tollgate-root";

/// The ACL user name of a lane's connections.
pub fn user_name(lane: Lane) -> String {
    format!("tollgate-{}", lane.as_str())
}

/// The ACL user of the lease service's own connections: the only user that may reach the reserved
/// keyspace.
pub const LEASE_USER: &str = "tollgate-leases";

/// Commands no client lane's user may run whatever the policy grants, each because it reaches past
/// the key patterns into the lease database or the lease user: they wipe, swap, open or move keys
/// into another database (`flushall`, `swapdb`, `select`, `move`: clients are served database 0
/// only, so `MOVE` has no use but to put keys where no client sees them); a replica's resync replaces every database
/// (`replicaof`, `slaveof`, `failover`); a replication stream or `monitor` reads
/// every database or every connection's commands (`sync`, `psync`, `monitor`); they change or
/// disconnect other users (`acl|setuser`, `acl|deluser`, `acl|load`, `client|kill`); a module's
/// code runs unchecked (`module|load`, `module|loadex`).
pub const ALWAYS_REFUSED: [&str; 16] = [
    "flushall",
    "swapdb",
    "select",
    "move",
    "replicaof",
    "slaveof",
    "failover",
    "sync",
    "psync",
    "monitor",
    "acl|setuser",
    "acl|deluser",
    "acl|load",
    "client|kill",
    "module|load",
    "module|loadex",
];

/// Commands that name another database in an argument an ACL cannot restrict (`COPY … DB n`,
/// `MIGRATE`'s destination db, which may be this very server): the front door refuses every
/// database but 0 at admission, but the `redis.call`s of a script are not admitted, so a user that
/// runs scripts ([`runs_scripts`]) does not get them at all.
pub const REFUSED_TO_SCRIPTS: [&str; 2] = ["copy", "migrate"];

/// The commands that run a script as the user that sends them.
const RUN_SCRIPTS: [&str; 6] = [
    "eval",
    "evalsha",
    "eval_ro",
    "evalsha_ro",
    "fcall",
    "fcall_ro",
];

/// Whether `lane`'s user may run scripts, whose calls run as that user unadmitted: SCRIPT's when
/// the policy grants them, TRANSACTION's too (a script inside MULTI or after WATCH runs there).
pub fn runs_scripts(lane: Lane, grants: &LaneGrants) -> bool {
    RUN_SCRIPTS.iter().any(|name| grants.is_granted(lane, name))
}

/// What a lane's connections send on their own, whatever the policy: `HELLO` (with `AUTH` and
/// `SETNAME`) to open, `PING` to probe; on a cluster `ASKING` and the slot map's `CLUSTER SHARDS`
/// (`SLOTS`, `INFO`); a TRANSACTION connection's `DISCARD`/`UNWATCH` to come back
/// clean; the shared subscriber connection's unsubscribes when a channel's last local subscriber
/// leaves; SCRIPT's kill connection's `FUNCTION STATS`, `SCRIPT KILL` and `FUNCTION KILL`, which
/// stop a client's script past `resp.script_time_limit` whether or not the policy lets clients
/// send them (`script_limit`).
pub fn plumbing(lane: Lane) -> &'static [&'static str] {
    match lane {
        Lane::Transaction => &["hello", "ping", "asking", "discard", "unwatch"],
        Lane::Pubsub => &[
            "hello",
            "ping",
            "unsubscribe",
            "punsubscribe",
            "sunsubscribe",
        ],
        // On a cluster: ASKING before a command redirected to a slot being imported, and the
        // slot map, which the REGULAR lane's user reads. The near cache's tracking connection
        // logs in as this user, turns tracking on and reads a filled key's expiry (`cache`);
        // clients cannot send CLIENT TRACKING (the front door answers it itself).
        Lane::Regular => &[
            "hello",
            "ping",
            "asking",
            "client|tracking",
            "pttl",
            "cluster|shards",
            "cluster|slots",
            "cluster|info",
        ],
        Lane::Script => &[
            "hello",
            "ping",
            "asking",
            "function|stats",
            "script|kill",
            "function|kill",
        ],
        Lane::Blocking | Lane::Admin => &["hello", "ping", "asking"],
    }
}

/// Whether [`acl_rules`] lets `lane`'s user run `name` (lower case): granted or plumbing, and not
/// always refused.
pub(crate) fn may_run(lane: Lane, grants: &LaneGrants, name: &str) -> bool {
    (grants.is_granted(lane, name) || plumbing(lane).contains(&name))
        && (lane == Lane::Pubsub || !ALWAYS_REFUSED.contains(&name))
        && !(REFUSED_TO_SCRIPTS.contains(&name) && runs_scripts(lane, grants))
}

/// What `lane`'s user may do, as `ACL SETUSER` rules applied after `reset` (no keys, commands or
/// channels): the commands `grants` gives the lane, and [`plumbing`]. Every lane but PUBSUB gets
/// the key and channel patterns outside the reserved keyspace and then loses [`ALWAYS_REFUSED`].
/// PUBSUB keeps every channel: Redis matches a PSUBSCRIBE pattern literally against a user's
/// channel patterns; its user never publishes, and the lease service's release notifications go by
/// SPUBLISH, which no client subscription of another name hears.
pub fn acl_rules(lane: Lane, grants: &LaneGrants) -> Vec<String> {
    let mut rules = Vec::new();
    if lane == Lane::Pubsub {
        rules.push("&*".to_owned());
    } else {
        let patterns = complement_patterns(RESERVED_PREFIX);
        rules.extend(patterns.iter().map(|pattern| format!("~{pattern}")));
        rules.extend(patterns.iter().map(|pattern| format!("&{pattern}")));
    }
    let commands: BTreeSet<&str> = plumbing(lane)
        .iter()
        .copied()
        .chain(grants.granted(lane))
        .collect();
    rules.extend(commands.iter().map(|name| format!("+{name}")));
    // Redis grants a parent's subcommands with it (`+command` is `+command|docs` too): a parent
    // granted to run bare loses again each subcommand the lane was not granted.
    rules.extend(
        grants
            .known()
            .map(|(name, _)| name)
            .filter(|name| {
                name.split_once('|')
                    .is_some_and(|(parent, _)| commands.contains(parent))
                    && !commands.contains(name)
            })
            .map(|name| format!("-{name}")),
    );
    if lane != Lane::Pubsub {
        rules.extend(ALWAYS_REFUSED.iter().map(|name| format!("-{name}")));
    }
    if runs_scripts(lane, grants) {
        rules.extend(REFUSED_TO_SCRIPTS.iter().map(|name| format!("-{name}")));
    }
    rules
}

/// The lease service's user: the reserved keyspace only, the commands its scripts and waits need,
/// and what the daemon checks at start that no other user can reach that keyspace with: `ACL
/// DRYRUN`, `ACL LIST` (every user the server has) and `ROLE` (a master's replicas, which are
/// checked too).
pub fn lease_acl_rules() -> Vec<String> {
    let prefix = escape_glob(RESERVED_PREFIX);
    [
        format!("~{prefix}*"),
        format!("&{prefix}*"),
        "+@all".into(),
        "-@admin".into(),
        "-@dangerous".into(),
        "+acl|dryrun".into(),
        "+acl|list".into(),
        "+role".into(),
    ]
    .into()
}

/// Redis glob patterns that together match every name that does not start with `prefix`, and no
/// name that does: for each proper prefix `p` of `prefix` followed by the byte `c`, the names
/// `p[^c]*` (they leave the prefix at `c`) and `p` itself (they end inside it). Redis tries a
/// user's patterns in order until one matches, so the ones that leave the prefix come first, the
/// earliest exit first: a key like `key:1` is matched by the first pattern, and only names that
/// follow the prefix a long way walk further.
pub fn complement_patterns(prefix: &str) -> Vec<String> {
    let mut leaving = Vec::with_capacity(prefix.len());
    let mut inside = Vec::with_capacity(prefix.len());
    for (at, next) in prefix.char_indices() {
        let head = escape_glob(&prefix[..at]);
        leaving.push(format!(
            "{head}[^{}]*",
            escape_glob(next.encode_utf8(&mut [0; 4]))
        ));
        // The empty key is left out: `ACL SETUSER` has no way to write an empty pattern.
        if at > 0 {
            inside.push(head);
        }
    }
    leaving.extend(inside);
    leaving
}

/// `text` with Redis glob's special characters escaped, so that it matches only itself.
fn escape_glob(text: &str) -> String {
    let mut escaped = String::with_capacity(text.len());
    for c in text.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\' | '^' | '-') {
            escaped.push('\\');
        }
        escaped.push(c);
    }
    escaped
}

/// One ACL user the daemon needs: a lane's, or (`lane: None`) the lease service's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DaemonUser {
    pub lane: Option<Lane>,
    pub name: String,
    /// `ACL SETUSER` rules, applied after `reset`.
    pub rules: Vec<String>,
    /// Where its password is kept: `<dir>/lane-<lane>.password` or `<dir>/leases.password`.
    pub password_file: PathBuf,
}

impl DaemonUser {
    /// `ACL SETUSER <name> reset on ><password> <rules…>`, as arguments.
    pub fn setuser(&self, password: &str) -> Vec<String> {
        let mut argv = vec![
            "ACL".to_owned(),
            "SETUSER".to_owned(),
            self.name.clone(),
            "reset".to_owned(),
            "on".to_owned(),
            format!(">{password}"),
        ];
        argv.extend(self.rules.iter().cloned());
        argv
    }
}

/// Every user the daemon connects as, with its password file in `dir`, the lanes' users cut to
/// `grants`.
pub fn daemon_users(dir: &Path, grants: &LaneGrants) -> Vec<DaemonUser> {
    let lanes = Lane::ALL.into_iter().map(|lane| DaemonUser {
        lane: Some(lane),
        name: user_name(lane),
        rules: acl_rules(lane, grants),
        password_file: dir.join(format!("lane-{}.password", lane.as_str())),
    });
    lanes
        .chain(std::iter::once(DaemonUser {
            lane: None,
            name: LEASE_USER.to_owned(),
            rules: lease_acl_rules(),
            password_file: dir.join("leases.password"),
        }))
        .collect()
}

/// `base` with every lane and the lease connections pointed at their user in `users`.
pub fn configured(base: &LanesConfig, users: &[DaemonUser]) -> LanesConfig {
    let mut config = base.clone();
    for user in users {
        let (name, file) = match user.lane {
            Some(lane) => {
                let overrides = config.overrides_mut(lane);
                (&mut overrides.user, &mut overrides.password_file)
            }
            None => (&mut config.leases.user, &mut config.leases.password_file),
        };
        *name = Some(user.name.clone());
        *file = Some(user.password_file.clone());
    }
    config
}

/// Creates (or resets) [`daemon_users`] on every server in `endpoints` (the same users and
/// passwords on each, since Redis does not replicate ACLs: a replica promoted by a failover must
/// know them too), writes each random password to its file in `dir` (0600), and returns `base`
/// pointing every lane and the lease connections at their users.
pub async fn provision(
    endpoints: &[Endpoint],
    admin: Option<&Admin>,
    dir: &Path,
    base: &LanesConfig,
    grants: &LaneGrants,
) -> Result<Provisioned, AclError> {
    let users: Vec<(DaemonUser, String)> = daemon_users(dir, grants)
        .into_iter()
        .map(|user| (user, random_password()))
        .collect();
    for endpoint in endpoints {
        set_users(endpoint, admin, &users).await?;
    }
    for (user, password) in &users {
        write_secret(&user.password_file, password).map_err(|source| AclError::PasswordFile {
            path: user.password_file.clone(),
            source,
        })?;
    }
    let names: Vec<DaemonUser> = users.iter().map(|(user, _)| user.clone()).collect();
    Ok(Provisioned {
        config: configured(base, &names),
        users: ProvisionedUsers {
            users: Arc::new(Mutex::new(users)),
            scopes: Arc::new(Mutex::new(Vec::new())),
            admin: admin.cloned(),
            busy_threshold: Arc::default(),
        },
    })
}

/// The password kept in `path`, or a new random one written there (0600) when there is none.
pub fn password_in(path: &Path) -> std::io::Result<String> {
    match std::fs::read_to_string(path) {
        Ok(text) => Ok(text.lines().next().unwrap_or_default().to_owned()),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
            let password = random_password();
            write_secret(path, &password)?;
            Ok(password)
        }
        Err(error) => Err(error),
    }
}

/// `ACL SETUSER` for each user, on one server, logged in as `admin` (else as `default`).
async fn set_users(
    endpoint: &Endpoint,
    admin: Option<&Admin>,
    users: &[(DaemonUser, String)],
) -> Result<(), AclError> {
    let commands: Vec<(String, Vec<String>)> = users
        .iter()
        .map(|(user, password)| (user.name.clone(), user.setuser(password)))
        .collect();
    run_as_admin(endpoint, admin, &commands).await
}

/// Each `(user, argv)` in turn on one server, logged in as `admin` (else as `default`); a
/// refusal names the user.
async fn run_as_admin(
    endpoint: &Endpoint,
    admin: Option<&Admin>,
    commands: &[(String, Vec<String>)],
) -> Result<(), AclError> {
    let unreachable = |reason: String| AclError::Redis {
        endpoint: endpoint.clone(),
        reason,
    };
    let mut stream = Stream::connect(endpoint)
        .await
        .map_err(|e| unreachable(e.to_string()))?;
    if let Some(admin) = admin {
        let mut read = BytesMut::new();
        let auth = ["AUTH", admin.user.as_str(), admin.password.as_str()];
        let reply = stream
            .exchange(&mut read, &auth)
            .await
            .map_err(|e| unreachable(e.to_string()))?;
        if let Frame::Error(reason) = reply {
            return Err(unreachable(format!(
                "login as `{}` refused: {}",
                admin.user,
                String::from_utf8_lossy(&reason)
            )));
        }
    }
    for (user, argv) in commands {
        let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
        let mut read = BytesMut::new();
        let reply = stream
            .exchange(&mut read, &argv)
            .await
            .map_err(|e| unreachable(e.to_string()))?;
        if let Frame::Error(reason) = reply {
            return Err(AclError::Refused {
                user: user.clone(),
                reason: String::from_utf8_lossy(&reason).into_owned(),
            });
        }
    }
    Ok(())
}

fn random_password() -> String {
    let bytes: [u8; 24] = rand::rng().random();
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Writes a fresh 0600 file. Unlinking first and creating exclusively, without following a link,
/// means a link or a file someone else made at `path` is never written through: creation fails.
fn write_secret(path: &Path, secret: &str) -> std::io::Result<()> {
    match std::fs::remove_file(path) {
        Err(error) if error.kind() != std::io::ErrorKind::NotFound => return Err(error),
        _ => {}
    }
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .custom_flags(nix::libc::O_NOFOLLOW)
        .mode(0o600)
        .open(path)?;
    writeln!(file, "{secret}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grants(lane: Lane, names: &[&str]) -> LaneGrants {
        let mut grants = LaneGrants::default();
        for name in names {
            grants.know(name, -1);
            grants.grant(lane, name);
        }
        grants
    }

    #[test]
    fn a_user_that_runs_scripts_never_gets_a_command_with_a_database_argument() {
        let granted = ["get", "copy", "migrate", "move", "evalsha"];
        for lane in [Lane::Script, Lane::Transaction] {
            let grants = grants(lane, &granted);
            let rules = acl_rules(lane, &grants);
            for refused in ["-copy", "-migrate", "-move"] {
                assert!(rules.contains(&refused.to_owned()), "{lane:?}: {rules:?}");
            }
            assert!(may_run(lane, &grants, "get"));
            for name in ["copy", "migrate", "move"] {
                assert!(!may_run(lane, &grants, name), "{lane:?} may run {name}");
            }
        }
        // Without scripts, the front door's admission refuses their other databases: COPY stays.
        let grants = grants(Lane::Transaction, &["get", "copy", "move"]);
        let rules = acl_rules(Lane::Transaction, &grants);
        assert!(!rules.contains(&"-copy".to_owned()), "{rules:?}");
        assert!(rules.contains(&"-move".to_owned()), "{rules:?}");
        assert!(may_run(Lane::Transaction, &grants, "copy"));
        assert!(!may_run(Lane::Transaction, &grants, "move"));
    }
}
