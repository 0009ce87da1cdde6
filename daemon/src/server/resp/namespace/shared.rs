//! The commands of Redis's script and function namespace that the daemon serves for a tenant
//! (`namespace.rs`): a plain value the session's plan carries, with no tie to how it is served.

/// A namespace command of a tenant, served by the daemon.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shared {
    ScriptKill,
    /// `SCRIPT DEBUG`: a debugging session holds the connection (or, SYNC, the server).
    ScriptDebug,
    ScriptFlush,
    FunctionKill,
    FunctionLoad,
    FunctionDelete,
    FunctionFlush,
    FunctionList,
    FunctionStats,
    FunctionDump,
    FunctionRestore,
    /// An `FCALL` while the daemon has not read whose the functions are: read, then judged.
    FCall,
    /// `SCRIPT EXISTS` of a tenant that flushed its scripts: answered for its view.
    ScriptExists,
    /// `EVALSHA` of a script the tenant flushed and has not loaded or run since.
    NoScript,
}

impl Shared {
    /// The namespace command a catalog name is, for a tenant.
    pub(super) fn of(name: &str) -> Option<Shared> {
        Some(match name {
            "SCRIPT|KILL" => Shared::ScriptKill,
            "SCRIPT|DEBUG" => Shared::ScriptDebug,
            "SCRIPT|FLUSH" => Shared::ScriptFlush,
            "FUNCTION|KILL" => Shared::FunctionKill,
            "FUNCTION|LOAD" => Shared::FunctionLoad,
            "FUNCTION|DELETE" => Shared::FunctionDelete,
            "FUNCTION|FLUSH" => Shared::FunctionFlush,
            "FUNCTION|LIST" => Shared::FunctionList,
            "FUNCTION|STATS" => Shared::FunctionStats,
            "FUNCTION|DUMP" => Shared::FunctionDump,
            "FUNCTION|RESTORE" => Shared::FunctionRestore,
            _ => return None,
        })
    }
}
