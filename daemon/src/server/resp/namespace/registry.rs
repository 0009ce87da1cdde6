//! What the namespace keeps between commands: whose each function is (so that a tenant's `FCALL`
//! is judged without a round trip), the one lock tenants' library changes take, which tenants
//! have scripts in flight (so that a tenant's `SCRIPT KILL` stops only a script of its own), and
//! each flushed tenant's view of the script cache.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use parking_lot::{Mutex, RwLock};
use tollgate_model::Tenant;

use super::library::Listed;

/// The two kinds of script, each stopped by its own kill.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ScriptKind {
    /// `EVAL` and its `_RO` and `SHA` forms: `SCRIPT KILL`.
    Eval,
    /// `FCALL`, `FCALL_RO`: `FUNCTION KILL`.
    Function,
}

impl ScriptKind {
    /// The kind of script the command `name` runs, if it runs one.
    pub fn of(name: &str) -> Option<ScriptKind> {
        match name {
            "EVAL" | "EVAL_RO" | "EVALSHA" | "EVALSHA_RO" => Some(ScriptKind::Eval),
            "FCALL" | "FCALL_RO" => Some(ScriptKind::Function),
            _ => None,
        }
    }

    fn index(self) -> usize {
        match self {
            ScriptKind::Eval => 0,
            ScriptKind::Function => 1,
        }
    }
}

/// Whose a function is, as far as the daemon knows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Whose {
    /// The functions have not been read since the daemon started or since someone changed them.
    Unread,
    /// Not known to be a tenant's: the operator's, or no function at all (Redis will say).
    Operator,
    /// A tenant's library's.
    Tenant { library: String, owner: String },
}

/// Each function's library and its owner (`None`: the operator's), by function name.
type Functions = HashMap<String, (String, Option<String>)>;

/// The namespace's shared state (one per daemon).
#[derive(Default)]
pub struct Namespace {
    /// Each known function's library and owner; `None`: unread.
    functions: RwLock<Option<Functions>>,
    /// Bumped whenever the functions may have changed, so that a read begun before is not kept.
    changes: AtomicU64,
    /// Held while a tenant's `FUNCTION LOAD`, `DELETE` or `FLUSH` checks and changes the libraries.
    pub(crate) changing: tokio::sync::Mutex<()>,
    /// Scripts in flight through the daemon, of every caller, per kind.
    in_flight: [AtomicUsize; 2],
    /// Scripts in flight per kind and scoped tenant.
    by_tenant: Mutex<HashMap<(ScriptKind, Tenant), usize>>,
    /// Whether any tenant has flushed its scripts: until then no script command looks further.
    any_flushed: AtomicBool,
    /// Each tenant that flushed its scripts: the scripts it loaded or ran since.
    flushed: Mutex<HashMap<Tenant, Seen>>,
}

/// A script's name: its SHA-1 in lower-case hex, as Redis keeps it.
pub type Sha = [u8; 40];

/// The SHA-1 of a script body, as Redis names it.
pub fn sha_of(body: &[u8]) -> Sha {
    let mut sha = [0u8; 40];
    sha.copy_from_slice(sha1_smol::Sha1::from(body).digest().to_string().as_bytes());
    sha
}

/// A script name as a client sent it (Redis reads it case-insensitively); `None` when it is not
/// 40 characters.
pub fn sha_named(name: &[u8]) -> Option<Sha> {
    let mut sha: Sha = name.try_into().ok()?;
    sha.make_ascii_lowercase();
    Some(sha)
}

/// Scripts a tenant's view holds at most: a script forgotten is answered `NOSCRIPT`, which every
/// client meets on a Redis restart anyway and answers by sending the script again.
const SEEN_PER_TENANT: usize = 4096;
/// Tenants with a view of their own at most (views are dropped with the daemon).
const FLUSHED_TENANTS: usize = 4096;

/// One flushed tenant's scripts since its flush, oldest first.
#[derive(Default)]
struct Seen {
    order: VecDeque<Sha>,
    set: HashSet<Sha>,
}

impl Seen {
    fn insert(&mut self, sha: Sha) {
        if !self.set.insert(sha) {
            return;
        }
        self.order.push_back(sha);
        if self.order.len() > SEEN_PER_TENANT {
            if let Some(oldest) = self.order.pop_front() {
                self.set.remove(&oldest);
            }
        }
    }
}

/// Too many tenants have flushed their scripts for the daemon to keep another view.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TooManyViews;

impl Namespace {
    /// Whose function `name` is.
    pub fn whose(&self, name: &[u8]) -> Whose {
        let functions = self.functions.read();
        let Some(functions) = functions.as_ref() else {
            return Whose::Unread;
        };
        let found = std::str::from_utf8(name)
            .ok()
            .and_then(|name| functions.get(name));
        match found {
            Some((library, Some(owner))) => Whose::Tenant {
                library: library.clone(),
                owner: owner.clone(),
            },
            _ => Whose::Operator,
        }
    }

    /// The functions may have changed (a library was loaded, deleted, flushed or restored).
    pub fn changed(&self) {
        self.changes.fetch_add(1, Ordering::AcqRel);
        *self.functions.write() = None;
    }

    /// Where a read of the libraries begins: pass it to [`Namespace::read`] with what was read.
    pub fn reading(&self) -> u64 {
        self.changes.load(Ordering::Acquire)
    }

    /// What a whole `FUNCTION LIST WITHCODE` begun at `began` found; kept unless the functions
    /// changed meanwhile.
    pub fn read(&self, began: u64, libraries: &[Listed]) {
        let mut functions = self.functions.write();
        if self.changes.load(Ordering::Acquire) != began {
            return;
        }
        let mut map = HashMap::new();
        for library in libraries {
            for function in &library.functions {
                map.insert(
                    function.clone(),
                    (library.name.clone(), library.owner.clone()),
                );
            }
        }
        *functions = Some(map);
    }

    /// One script of `kind` sent for `tenant` (`None`: a caller no scope confines), counted until
    /// the guard is dropped (when its reply has arrived or its session ended).
    pub fn started(self: &Arc<Self>, kind: ScriptKind, tenant: Option<Tenant>) -> InFlight {
        self.in_flight[kind.index()].fetch_add(1, Ordering::AcqRel);
        if let Some(tenant) = &tenant {
            *self
                .by_tenant
                .lock()
                .entry((kind, tenant.clone()))
                .or_default() += 1;
        }
        InFlight {
            namespace: self.clone(),
            kind,
            tenant,
        }
    }

    /// Whether some tenant has flushed its scripts (only then does a script command look
    /// further than this).
    pub fn any_flushed(&self) -> bool {
        self.any_flushed.load(Ordering::Acquire)
    }

    /// `tenant`'s `SCRIPT FLUSH`: from now on it knows no script until it loads or runs it again.
    pub fn flush(&self, tenant: &Tenant) -> Result<(), TooManyViews> {
        let mut flushed = self.flushed.lock();
        if !flushed.contains_key(tenant) && flushed.len() >= FLUSHED_TENANTS {
            return Err(TooManyViews);
        }
        flushed.insert(tenant.clone(), Seen::default());
        self.any_flushed.store(true, Ordering::Release);
        Ok(())
    }

    /// `tenant` loaded or ran the script `sha`.
    pub fn saw(&self, tenant: &Tenant, sha: Sha) {
        if let Some(seen) = self.flushed.lock().get_mut(tenant) {
            seen.insert(sha);
        }
    }

    /// Whether `tenant` knows the script `sha`: always, unless it flushed since it last loaded or
    /// ran it.
    pub fn knows(&self, tenant: &Tenant, sha: &Sha) -> bool {
        self.flushed
            .lock()
            .get(tenant)
            .is_none_or(|seen| seen.set.contains(sha))
    }

    /// Whether `tenant` has a view of its own (it flushed).
    pub fn flushed(&self, tenant: &Tenant) -> bool {
        self.flushed.lock().contains_key(tenant)
    }

    /// Whether every script of `kind` the daemon has in flight is `tenant`'s (and it has one):
    /// then the one Redis runs, if any of the daemon's, is the tenant's to stop.
    pub fn all_in_flight_are(&self, kind: ScriptKind, tenant: &Tenant) -> bool {
        let by_tenant = self.by_tenant.lock();
        let mine = by_tenant.get(&(kind, tenant.clone())).copied().unwrap_or(0);
        mine > 0 && self.in_flight[kind.index()].load(Ordering::Acquire) == mine
    }
}

/// A script in flight, counted while held.
pub struct InFlight {
    namespace: Arc<Namespace>,
    kind: ScriptKind,
    tenant: Option<Tenant>,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if let Some(tenant) = self.tenant.take() {
            let mut by_tenant = self.namespace.by_tenant.lock();
            let key = (self.kind, tenant);
            if let Some(count) = by_tenant.get_mut(&key) {
                *count -= 1;
                if *count == 0 {
                    by_tenant.remove(&key);
                }
            }
        }
        self.namespace.in_flight[self.kind.index()].fetch_sub(1, Ordering::AcqRel);
    }
}

impl std::fmt::Debug for InFlight {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InFlight")
            .field("kind", &self.kind)
            .field("tenant", &self.tenant)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tenant(principal: &str, uid: u32) -> Tenant {
        Tenant {
            principal: principal.into(),
            uid,
        }
    }

    fn listed(name: &str, owner: Option<&str>, functions: &[&str]) -> Listed {
        Listed {
            name: name.into(),
            owner: owner.map(str::to_owned),
            functions: functions.iter().map(|f| f.to_string()).collect(),
        }
    }

    #[test]
    fn functions_are_unread_until_read_and_again_after_a_change() {
        let namespace = Namespace::default();
        assert_eq!(namespace.whose(b"f"), Whose::Unread);
        let began = namespace.reading();
        namespace.read(
            began,
            &[
                listed("a", Some("acme"), &["fa"]),
                listed("op", None, &["fo"]),
            ],
        );
        assert_eq!(
            namespace.whose(b"fa"),
            Whose::Tenant {
                library: "a".into(),
                owner: "acme".into()
            }
        );
        assert_eq!(namespace.whose(b"fo"), Whose::Operator);
        assert_eq!(namespace.whose(b"nothing"), Whose::Operator);
        namespace.changed();
        assert_eq!(namespace.whose(b"fa"), Whose::Unread);
    }

    #[test]
    fn a_read_begun_before_a_change_is_not_kept() {
        let namespace = Namespace::default();
        let began = namespace.reading();
        namespace.changed();
        namespace.read(began, &[listed("a", Some("acme"), &["fa"])]);
        assert_eq!(namespace.whose(b"fa"), Whose::Unread);
    }

    #[test]
    fn a_flush_empties_only_the_flushing_tenants_view_until_it_loads_again() {
        let namespace = Namespace::default();
        let (acme, globex) = (tenant("acme", 1), tenant("globex", 2));
        let sha = sha_of(b"return 1");
        assert_eq!(&sha, b"e0e1f9fabfc9d4800c877a703b823ac0578ff8db");
        assert_eq!(
            sha_named(b"E0E1F9FABFC9D4800C877A703B823AC0578FF8DB"),
            Some(sha)
        );
        assert_eq!(sha_named(b"e0e1"), None);
        assert!(!namespace.any_flushed());
        assert!(namespace.knows(&acme, &sha));
        namespace.flush(&acme).unwrap();
        assert!(namespace.any_flushed());
        assert!(!namespace.knows(&acme, &sha));
        assert!(namespace.knows(&globex, &sha));
        namespace.saw(&acme, sha);
        namespace.saw(&globex, sha_of(b"return 2"));
        assert!(namespace.knows(&acme, &sha));
        assert!(!namespace.knows(&acme, &sha_of(b"return 2")));
        // Bounded: the oldest script is forgotten first.
        for n in 0..SEEN_PER_TENANT {
            namespace.saw(&acme, sha_of(format!("return {n} + 0").as_bytes()));
        }
        assert!(!namespace.knows(&acme, &sha));
        assert_eq!(namespace.flushed.lock()[&acme].set.len(), SEEN_PER_TENANT);
    }

    #[test]
    fn views_are_bounded_in_number() {
        let namespace = Namespace::default();
        for uid in 0..FLUSHED_TENANTS as u32 {
            namespace.flush(&tenant("t", uid)).unwrap();
        }
        assert_eq!(namespace.flush(&tenant("t", u32::MAX)), Err(TooManyViews));
        // One that has a view may flush again.
        assert_eq!(namespace.flush(&tenant("t", 0)), Ok(()));
    }

    #[test]
    fn a_tenant_may_stop_the_running_script_only_when_every_one_in_flight_is_its_own() {
        let namespace = Arc::new(Namespace::default());
        let acme = tenant("acme", 1);
        let acme_other_user = tenant("acme", 2);
        assert!(!namespace.all_in_flight_are(ScriptKind::Eval, &acme));
        let mine = namespace.started(ScriptKind::Eval, Some(acme.clone()));
        assert!(namespace.all_in_flight_are(ScriptKind::Eval, &acme));
        assert!(!namespace.all_in_flight_are(ScriptKind::Function, &acme));
        assert!(!namespace.all_in_flight_are(ScriptKind::Eval, &acme_other_user));
        // Someone else's script in flight too: which one runs cannot be told.
        let unconstrained = namespace.started(ScriptKind::Eval, None);
        assert!(!namespace.all_in_flight_are(ScriptKind::Eval, &acme));
        drop(unconstrained);
        let same_principal = namespace.started(ScriptKind::Eval, Some(acme_other_user.clone()));
        assert!(!namespace.all_in_flight_are(ScriptKind::Eval, &acme));
        drop(same_principal);
        assert!(namespace.all_in_flight_are(ScriptKind::Eval, &acme));
        drop(mine);
        assert!(!namespace.all_in_flight_are(ScriptKind::Eval, &acme));
        assert!(namespace.by_tenant.lock().is_empty());
    }
}
