//! The daemon's client sessions as `CLIENT LIST`, `CLIENT INFO` and `CLIENT KILL` see them: Redis
//! would describe its own connections, which through the daemon are shared lane connections, so
//! the daemon answers with its sessions instead, in Redis's format. A caller sees (and may kill)
//! the sessions of its own principal; administrators (`admin:`) see all of them.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use parking_lot::Mutex;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tollgate_model::Caller;
use tollgate_policy::Descriptor;

use super::coarse::Coarse;
use super::mailbox::Mailbox;

/// Every live session of one listener.
#[derive(Default)]
pub struct Clients {
    sessions: Mutex<BTreeMap<u64, Arc<Client>>>,
}

/// One session as listed.
pub struct Client {
    pub id: u64,
    pub principal: String,
    /// Sees every session, not only its principal's.
    pub admin: bool,
    /// What `addr=` shows: the socket and the session id, so that each address names one session.
    addr: String,
    laddr: String,
    created: Instant,
    state: Mutex<State>,
    killed: CancellationToken,
    /// Its blocking command, which `CLIENT UNBLOCK` may end.
    blocked: Mutex<Blocked>,
    unblocked: Notify,
    /// Who it is, for `CLIENT TRACKING`: no client is told of a key its caller may not read.
    pub caller: Caller,
    /// `CLIENT TRACKING` is on (kept by `tracking_hub.rs`): its reads are remembered.
    pub tracking: AtomicBool,
    /// Invalidations for it (`CLIENT TRACKING`).
    pub mailbox: Mailbox,
}

/// How `CLIENT UNBLOCK` ends a blocked command: as if it timed out, or with `-UNBLOCKED`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UnblockMode {
    Timeout,
    Error,
}

/// Whether a session waits in a blocking command, and whether it was asked to stop.
#[derive(Debug, Default)]
struct Blocked {
    blocked: bool,
    asked: Option<UnblockMode>,
}

/// What changes over a session's life.
#[derive(Debug, Clone)]
pub struct State {
    pub name: Option<Bytes>,
    /// When the last command ran, on the coarse clock: shown in whole seconds (`idle=`).
    pub last_command: Coarse,
    /// The last command, which `cmd=` names as Redis does (`get`, `client|list`).
    pub command: LastCommand,
    pub subscriptions: Subscribed,
    /// Commands queued in MULTI, or `None` outside one.
    pub multi: Option<usize>,
    pub resp: u8,
}

/// A session's last command: described by the catalog, or one the daemon answers itself.
#[derive(Debug, Clone)]
pub enum LastCommand {
    None,
    Admitted(Arc<Descriptor>),
    Local(&'static str),
}

impl State {
    /// The session ran a command the daemon answers itself, Redis's name for it given.
    pub fn ran_local(&mut self, name: &'static str) {
        self.last_command = Coarse::now();
        self.command = LastCommand::Local(name);
    }
}

impl std::fmt::Display for LastCommand {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LastCommand::None => f.write_str("NULL"),
            LastCommand::Admitted(descriptor) => f.write_str(&descriptor.name.to_ascii_lowercase()),
            LastCommand::Local(name) => f.write_str(name),
        }
    }
}

/// Subscription counts, as `sub=`, `psub=` and `ssub=` show them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Subscribed {
    pub channels: usize,
    pub patterns: usize,
    pub shards: usize,
}

impl Subscribed {
    pub fn any(self) -> bool {
        self.channels + self.patterns + self.shards > 0
    }
}

/// A session's place in [`Clients`]; dropping it removes the session from the list.
pub struct Registration {
    clients: Arc<Clients>,
    pub client: Arc<Client>,
    /// What the list was last told the session ran, and the coarse clock's reading then: a
    /// command that would change neither is not told again (see [`Registration::ran`]).
    listed: Option<(Arc<Descriptor>, Coarse)>,
}

impl Registration {
    /// The session ran `descriptor`'s command now. The list's state is shared (locked by
    /// `CLIENT LIST` and the like), so it is changed only when what it shows would change: the
    /// command's name, or the coarse clock's tick its idle time is counted from. A pipelined
    /// batch of one command, which runs within a tick, locks it once instead of once a command.
    pub fn ran(&mut self, descriptor: &Arc<Descriptor>) {
        let now = Coarse::now();
        if let Some((listed, at)) = &self.listed {
            if *at == now && Arc::ptr_eq(listed, descriptor) {
                return;
            }
        }
        self.client.update(|state| {
            state.last_command = now;
            state.command = LastCommand::Admitted(descriptor.clone());
        });
        self.listed = Some((descriptor.clone(), now));
    }

    /// The session ran a command the daemon answers itself, Redis's name for it given.
    pub fn ran_local(&mut self, name: &'static str) {
        self.listed = None;
        self.client.update(|state| state.ran_local(name));
    }

    /// How many sessions of the listener this one sees (as `CLIENT LIST` lists them), itself
    /// included: `INFO`'s `connected_clients` for it.
    pub fn sessions_seen(&self) -> usize {
        let sessions = self.clients.sessions.lock();
        sessions
            .values()
            .filter(|client| self.client.sees(client))
            .count()
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.clients.sessions.lock().remove(&self.client.id);
    }
}

/// `CLIENT LIST [TYPE normal|pubsub] [ID id …]`: which sessions to list.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct ListFilter {
    kind: Option<Kind>,
    ids: Option<Vec<u64>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Normal,
    Pubsub,
    /// `master`/`replica`: no session of the daemon is one.
    Replication,
}

/// `CLIENT KILL`'s filters, new style; the old `CLIENT KILL addr` form is `addr` alone.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct KillFilter {
    id: Option<u64>,
    addr: Option<String>,
    laddr: Option<String>,
    user: Option<String>,
    kind: Option<Kind>,
    max_age_secs: Option<u64>,
    skip_me: bool,
    /// The old form answers `+OK` or an error, not a count.
    legacy: bool,
}

impl Clients {
    pub fn register(
        self: &Arc<Self>,
        id: u64,
        caller: &Caller,
        admin: bool,
        socket: &str,
    ) -> Registration {
        let now = Instant::now();
        let client = Arc::new(Client {
            id,
            principal: caller.principal.clone(),
            caller: caller.clone(),
            tracking: AtomicBool::new(false),
            mailbox: Mailbox::default(),
            admin,
            addr: format!("{socket}:{id}"),
            laddr: format!("{socket}:0"),
            created: now,
            state: Mutex::new(State {
                name: None,
                last_command: Coarse::now(),
                command: LastCommand::None,
                subscriptions: Subscribed::default(),
                multi: None,
                resp: 2,
            }),
            killed: CancellationToken::new(),
            blocked: Mutex::default(),
            unblocked: Notify::new(),
        });
        self.sessions.lock().insert(id, client.clone());
        Registration {
            clients: self.clone(),
            client,
            listed: None,
        }
    }

    /// Session `id`, if it is live.
    pub fn get(&self, id: u64) -> Option<Arc<Client>> {
        self.sessions.lock().get(&id).cloned()
    }

    /// `CLIENT LIST` as `viewer` may see it: one line per session, oldest first.
    pub fn list(&self, viewer: &Client, filter: &ListFilter) -> String {
        let visible: Vec<Arc<Client>> = self
            .sessions
            .lock()
            .values()
            .filter(|client| viewer.sees(client))
            .filter(|client| {
                filter
                    .ids
                    .as_ref()
                    .is_none_or(|ids| ids.contains(&client.id))
            })
            .filter(|client| filter.kind.is_none_or(|kind| client.kind() == kind))
            .cloned()
            .collect();
        let mut out = String::new();
        for client in visible {
            out.push_str(&client.line());
            out.push('\n');
        }
        out
    }

    /// Kills the sessions `filter` picks among those `killer` sees; returns how many.
    pub fn kill(&self, killer: &Client, filter: &KillFilter) -> usize {
        let now = Instant::now();
        let chosen: Vec<Arc<Client>> = self
            .sessions
            .lock()
            .values()
            .filter(|client| killer.sees(client) && filter.picks(client, killer.id, now))
            .cloned()
            .collect();
        for client in &chosen {
            client.killed.cancel();
        }
        chosen.len()
    }

    /// Whether `CLIENT KILL USER user` names a user `killer` knows of, as Redis's `No such user`
    /// tells an unknown ACL user: its own principal; for an administrator also one the policy
    /// names (`named`) or a session has (`uid:<n>`, a caller no principal names). To anyone else
    /// another principal is as unknown as in `CLIENT LIST`, which shows only its own sessions.
    pub fn knows_user(&self, killer: &Client, user: &str, named: impl Fn(&str) -> bool) -> bool {
        killer.principal == user
            || killer.admin
                && (named(user)
                    || self
                        .sessions
                        .lock()
                        .values()
                        .any(|client| client.principal == user))
    }

    /// Whether session `id` is connected and `by` may see it (a `CLIENT TRACKING … REDIRECT id`
    /// names no session of another principal's).
    pub fn sees_id(&self, by: &Client, id: u64) -> bool {
        let target = self.sessions.lock().get(&id).cloned();
        target.is_some_and(|target| by.sees(&target))
    }

    /// `CLIENT UNBLOCK id`: asks session `id`, if `by` may see it and it waits in a blocking
    /// command, to end that command; whether it did wait.
    pub fn unblock(&self, by: &Client, id: u64, mode: UnblockMode) -> bool {
        let target = self.sessions.lock().get(&id).cloned();
        let Some(target) = target.filter(|target| by.sees(target)) else {
            return false;
        };
        let mut blocked = target.blocked.lock();
        if !blocked.blocked {
            return false;
        }
        blocked.asked = Some(mode);
        drop(blocked);
        target.unblocked.notify_one();
        true
    }
}

impl Client {
    fn sees(&self, other: &Client) -> bool {
        self.sees_principal(&other.principal)
    }

    /// Whether this session may see the sessions of `principal`.
    pub fn sees_principal(&self, principal: &str) -> bool {
        self.admin || self.principal == principal
    }

    /// The address `CLIENT LIST` and `MONITOR` show for this session.
    pub fn addr(&self) -> &str {
        &self.addr
    }

    fn kind(&self) -> Kind {
        if self.state.lock().subscriptions.any() {
            Kind::Pubsub
        } else {
            Kind::Normal
        }
    }

    /// This session's blocking command started (`true`) or was answered.
    pub fn set_blocked(&self, blocked: bool) {
        *self.blocked.lock() = Blocked {
            blocked,
            asked: None,
        };
    }

    /// Resolves when `CLIENT UNBLOCK` asks this session to end its blocking command.
    pub async fn unblocked(&self) -> UnblockMode {
        loop {
            self.unblocked.notified().await;
            if let Some(mode) = self.blocked.lock().asked.take() {
                return mode;
            }
        }
    }

    /// Cancelled when another session (or this one) killed this session.
    pub fn killed(&self) -> CancellationToken {
        self.killed.clone()
    }

    /// Changes what is listed of this session.
    pub fn update(&self, change: impl FnOnce(&mut State)) {
        change(&mut self.state.lock());
    }

    /// How `CLIENT TRACKING` reaches it now: its protocol, and whether it subscribes.
    pub fn peer(&self) -> (u8, bool) {
        let state = self.state.lock();
        (state.resp, state.subscriptions.any())
    }

    pub fn name(&self) -> Option<Bytes> {
        self.state.lock().name.clone()
    }

    /// One `CLIENT LIST` line, with Redis 7's fields in Redis's order. Buffer sizes are the
    /// daemon's business and shown as 0; `user=` is the principal.
    pub fn line(&self) -> String {
        let state = self.state.lock().clone();
        let now = Instant::now();
        let mut flags = String::new();
        if state.subscriptions.any() {
            flags.push('P');
        }
        if state.multi.is_some() {
            flags.push('x');
        }
        flags.push('U');
        let name = state
            .name
            .as_deref()
            .map(String::from_utf8_lossy)
            .unwrap_or_default();
        let mut line = String::new();
        let _ = write!(
            line,
            "id={} addr={} laddr={} fd=-1 name={} age={} idle={} flags={} db=0 sub={} psub={} ssub={} multi={} qbuf=0 qbuf-free=0 argv-mem=0 multi-mem=0 rbs=0 rbp=0 obl=0 oll=0 omem=0 tot-mem=0 events=r cmd={} user={} redir=-1 resp={}",
            self.id,
            self.addr,
            self.laddr,
            name,
            now.duration_since(self.created).as_secs(),
            Coarse::now().duration_since(state.last_command).as_secs(),
            flags,
            state.subscriptions.channels,
            state.subscriptions.patterns,
            state.subscriptions.shards,
            state.multi.map_or(-1, |queued| queued as i64),
            state.command,
            self.principal,
            state.resp,
        );
        line
    }
}

impl ListFilter {
    /// Parses `CLIENT LIST`'s arguments after `LIST`; the error is Redis's.
    pub fn parse(args: &[&[u8]]) -> Result<ListFilter, String> {
        let mut filter = ListFilter::default();
        let mut rest = args.iter();
        while let Some(option) = rest.next() {
            if option.eq_ignore_ascii_case(b"TYPE") {
                let kind = rest.next().ok_or_else(syntax_error)?;
                filter.kind = Some(parse_kind(kind)?);
            } else if option.eq_ignore_ascii_case(b"ID") {
                let ids: Result<Vec<u64>, String> = rest
                    .by_ref()
                    .map(|id| parse_number(id).ok_or_else(|| "ERR Invalid client ID".to_owned()))
                    .collect();
                filter.ids = Some(ids?);
            } else {
                return Err(syntax_error());
            }
        }
        Ok(filter)
    }
}

impl KillFilter {
    /// Parses `CLIENT KILL`'s arguments after `KILL`; the error is Redis's.
    pub fn parse(args: &[&[u8]]) -> Result<KillFilter, String> {
        if let [addr] = args {
            return Ok(KillFilter {
                addr: Some(String::from_utf8_lossy(addr).into_owned()),
                legacy: true,
                ..KillFilter::default()
            });
        }
        if args.is_empty() || !args.len().is_multiple_of(2) {
            return Err(syntax_error());
        }
        let mut filter = KillFilter {
            skip_me: true,
            ..KillFilter::default()
        };
        for pair in args.chunks(2) {
            let (option, value) = (pair[0], pair[1]);
            let text = || String::from_utf8_lossy(value).into_owned();
            if option.eq_ignore_ascii_case(b"ID") {
                // Redis takes 1 and up: its ids start at 1, as the daemon's do.
                filter.id = Some(
                    parse_number(value)
                        .filter(|&id| id > 0)
                        .ok_or_else(|| "ERR client-id should be greater than 0".to_owned())?,
                );
            } else if option.eq_ignore_ascii_case(b"ADDR") {
                filter.addr = Some(text());
            } else if option.eq_ignore_ascii_case(b"LADDR") {
                filter.laddr = Some(text());
            } else if option.eq_ignore_ascii_case(b"USER") {
                filter.user = Some(text());
            } else if option.eq_ignore_ascii_case(b"TYPE") {
                filter.kind = Some(parse_kind(value)?);
            } else if option.eq_ignore_ascii_case(b"MAXAGE") {
                filter.max_age_secs = Some(parse_number(value).ok_or_else(syntax_error)?);
            } else if option.eq_ignore_ascii_case(b"SKIPME") {
                filter.skip_me = if value.eq_ignore_ascii_case(b"yes") {
                    true
                } else if value.eq_ignore_ascii_case(b"no") {
                    false
                } else {
                    return Err(syntax_error());
                };
            } else {
                return Err(syntax_error());
            }
        }
        Ok(filter)
    }

    /// The user (the principal) it picks by, if any.
    pub fn user(&self) -> Option<&str> {
        self.user.as_deref()
    }

    /// Whether the old form, which answers `+OK` or `-ERR No such client`.
    pub fn legacy(&self) -> bool {
        self.legacy
    }

    fn picks(&self, client: &Client, killer: u64, now: Instant) -> bool {
        (!self.skip_me || client.id != killer)
            && self.id.is_none_or(|id| id == client.id)
            && self.addr.as_ref().is_none_or(|addr| *addr == client.addr)
            && self
                .laddr
                .as_ref()
                .is_none_or(|laddr| *laddr == client.laddr)
            && self
                .user
                .as_ref()
                .is_none_or(|user| *user == client.principal)
            && self.kind.is_none_or(|kind| kind == client.kind())
            && self
                .max_age_secs
                .is_none_or(|max| now.duration_since(client.created).as_secs() >= max)
    }
}

fn parse_kind(word: &[u8]) -> Result<Kind, String> {
    let is = |name: &[u8]| word.eq_ignore_ascii_case(name);
    if is(b"normal") {
        Ok(Kind::Normal)
    } else if is(b"pubsub") {
        Ok(Kind::Pubsub)
    } else if is(b"master") || is(b"replica") || is(b"slave") {
        Ok(Kind::Replication)
    } else {
        Err(format!(
            "ERR Unknown client type '{}'",
            String::from_utf8_lossy(word)
        ))
    }
}

fn parse_number(word: &[u8]) -> Option<u64> {
    std::str::from_utf8(word).ok()?.parse().ok()
}

fn syntax_error() -> String {
    "ERR syntax error".to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::resp::words::argv;

    fn caller(principal: &str) -> Caller {
        Caller {
            principal: principal.into(),
            uid: 1000,
            gid: 1000,
            pid: 1,
        }
    }

    fn clients() -> (Arc<Clients>, Vec<Registration>) {
        let clients = Arc::new(Clients::default());
        let sessions = vec![
            clients.register(1, &caller("alice"), false, "/run/resp.sock"),
            clients.register(2, &caller("alice"), false, "/run/resp.sock"),
            clients.register(3, &caller("bob"), false, "/run/resp.sock"),
            clients.register(4, &caller("ops"), true, "/run/resp.sock"),
        ];
        (clients, sessions)
    }

    fn ids(list: &str) -> Vec<&str> {
        list.lines()
            .map(|line| line.split(' ').next().unwrap())
            .collect()
    }

    #[test]
    fn a_caller_lists_its_own_principals_sessions_and_an_administrator_all() {
        let (clients, sessions) = clients();
        let everything = ListFilter::default();
        assert_eq!(
            ids(&clients.list(&sessions[0].client, &everything)),
            ["id=1", "id=2"]
        );
        assert_eq!(
            ids(&clients.list(&sessions[2].client, &everything)),
            ["id=3"]
        );
        assert_eq!(
            ids(&clients.list(&sessions[3].client, &everything)),
            ["id=1", "id=2", "id=3", "id=4"]
        );
    }

    #[test]
    fn a_line_shows_the_name_the_command_and_the_subscriptions_as_redis_does() {
        let (_clients, sessions) = clients();
        sessions[0].client.update(|state| {
            state.name = Some(Bytes::from_static(b"worker-1"));
            state.ran_local("client|list");
            state.subscriptions.channels = 2;
        });
        let line = sessions[0].client.line();
        assert!(line.starts_with("id=1 addr=/run/resp.sock:1 laddr=/run/resp.sock:0 fd=-1 name=worker-1 age=0 idle=0 flags=PU db=0 sub=2 psub=0 ssub=0 multi=-1 "), "{line}");
        assert!(
            line.ends_with(" cmd=client|list user=alice redir=-1 resp=2"),
            "{line}"
        );
    }

    fn described(name: &str) -> Arc<Descriptor> {
        Arc::new(Descriptor {
            name: name.into(),
            lane: tollgate_model::Lane::Regular,
            categories: tollgate_policy::CategorySet::default(),
            traits: tollgate_policy::Traits::default(),
            arity: 2,
            keys: Vec::new(),
        })
    }

    fn listed_command(me: &Registration) -> String {
        let line = me.client.line();
        let after = line.split(" cmd=").nth(1).expect("a cmd= field");
        after.split(' ').next().unwrap().to_owned()
    }

    #[test]
    fn the_list_names_every_command_as_it_runs_even_within_one_clock_tick() {
        let (_clients, mut sessions) = clients();
        let (get, set) = (described("GET"), described("SET"));
        let me = &mut sessions[0];
        me.ran(&get);
        assert_eq!(listed_command(me), "get");
        me.ran(&set);
        assert_eq!(listed_command(me), "set");
        // A command the daemon answers itself in between: the same command again is told again.
        me.ran(&set);
        me.ran_local("ping");
        assert_eq!(listed_command(me), "ping");
        me.ran(&set);
        assert_eq!(listed_command(me), "set");
    }

    #[test]
    fn the_same_command_again_after_a_tick_moves_the_idle_clock() {
        let (_clients, mut sessions) = clients();
        let get = described("GET");
        let me = &mut sessions[0];
        me.ran(&get);
        let first = me.client.state.lock().last_command;
        std::thread::sleep(std::time::Duration::from_millis(30));
        me.ran(&get);
        let second = me.client.state.lock().last_command;
        assert!(
            second.duration_since(first) >= std::time::Duration::from_millis(10),
            "{first:?} then {second:?}"
        );
    }

    #[test]
    fn list_filters_by_type_and_id() {
        let (clients, sessions) = clients();
        sessions[1]
            .client
            .update(|state| state.subscriptions.patterns = 1);
        let admin = &sessions[3].client;
        let pubsub = ListFilter::parse(&argv("TYPE pubsub")).unwrap();
        assert_eq!(ids(&clients.list(admin, &pubsub)), ["id=2"]);
        let some = ListFilter::parse(&argv("ID 3 1 9")).unwrap();
        assert_eq!(ids(&clients.list(admin, &some)), ["id=1", "id=3"]);
        assert!(ListFilter::parse(&argv("TYPE nonsense")).is_err());
        assert!(ListFilter::parse(&argv("ID x")).is_err());
    }

    #[test]
    fn a_user_is_known_to_its_own_sessions_and_to_an_administrator_if_named_or_connected() {
        let (clients, sessions) = clients();
        let (alice, ops) = (&sessions[0].client, &sessions[3].client);
        let named = |user: &str| ["alice", "bob", "carol"].contains(&user);
        assert!(clients.knows_user(alice, "alice", named));
        // Another principal is as unknown to alice as CLIENT LIST shows it.
        assert!(!clients.knows_user(alice, "bob", named));
        assert!(!clients.knows_user(alice, "wrong_user", named));
        // An administrator knows the policy's principals, with or without sessions, and callers
        // no principal names (`uid:<n>`) while they are connected.
        assert!(clients.knows_user(ops, "carol", named));
        assert!(clients.knows_user(ops, "bob", |_| false));
        assert!(!clients.knows_user(ops, "wrong_user", named));
    }

    #[test]
    fn kill_reaches_only_sessions_the_killer_sees_and_skips_itself_by_default() {
        let (clients, sessions) = clients();
        let alice = &sessions[0].client;
        let by_user = KillFilter::parse(&argv("USER bob")).unwrap();
        assert_eq!(
            clients.kill(alice, &by_user),
            0,
            "bob's session is not alice's to kill"
        );
        let all_alice = KillFilter::parse(&argv("USER alice")).unwrap();
        assert_eq!(clients.kill(alice, &all_alice), 1, "skips itself");
        assert!(sessions[1].client.killed().is_cancelled());
        assert!(!alice.killed().is_cancelled());
        let me_too = KillFilter::parse(&argv("ID 1 SKIPME no")).unwrap();
        assert_eq!(clients.kill(alice, &me_too), 1);
        let legacy = KillFilter::parse(&argv("/run/resp.sock:3")).unwrap();
        assert!(legacy.legacy());
        assert_eq!(clients.kill(&sessions[3].client, &legacy), 1);
        assert!(sessions[2].client.killed().is_cancelled());
        assert!(KillFilter::parse(&argv("ID 1 USER")).is_err());
        assert!(KillFilter::parse(&argv("SKIPME maybe")).is_err());
    }

    #[test]
    fn a_dropped_registration_leaves_the_list() {
        let (clients, mut sessions) = clients();
        sessions.remove(1);
        assert_eq!(
            ids(&clients.list(&sessions[0].client, &ListFilter::default())),
            ["id=1"]
        );
    }
}
