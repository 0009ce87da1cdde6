//! Scripts in scopes, end to end: two tenants of `policies/examples/tenants.yaml`, each a real OS
//! user, run scripts through the daemon (its embedded Redis); Redis itself refuses a `redis.call`
//! on a key the tenant's rules do not grant, however the script builds the key's name, and the
//! refusal names the rule whose scope it is. The reserved keyspace is out of every scope's reach.

use std::os::unix::fs::PermissionsExt;

use tollgate::config::SocketMode;
use tollgate_resp::Frame;

use crate::identity::{os_user, redis_cli, repository_policy, run_as, OsUser};
use crate::policy_support::{admission, config};
use crate::support::daemon::{embedded_admin, TestDaemon};
use crate::support::raw::{text, RawClient};

/// The tenants example with each tenant mapped to a real OS user (it grants both `@scripting`).
pub(crate) fn policy(acme: &OsUser, globex: &OsUser) -> String {
    let text = std::fs::read_to_string(repository_policy("examples/tenants.yaml")).unwrap();
    assert!(
        text.contains("commands: [\"@scripting\"]"),
        "tenants.yaml changed shape"
    );
    text.replace("uids: [2001]", &format!("uids: [{}]", acme.uid))
        .replace("uids: [2002]", &format!("uids: [{}]", globex.uid))
}

/// A daemon on its embedded Redis under the tenants example (`policy`), its sockets open to
/// every OS user; and the policy file's path.
pub(crate) async fn tenants_daemon(
    acme: &OsUser,
    globex: &OsUser,
) -> (TestDaemon, std::path::PathBuf) {
    let dir = tempfile::Builder::new()
        .prefix("tollgate-scopes")
        .tempdir()
        .unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let path = dir.path().join("tenants.yaml");
    std::fs::write(&path, policy(acme, globex)).unwrap();
    let mut daemon_config = TestDaemon::config(dir.path());
    daemon_config.runtime_dir = Some(dir.path().join("run"));
    daemon_config.listen.mode = SocketMode(0o666);
    daemon_config.policy.files = vec![path.clone()];
    (TestDaemon::start_config(dir, daemon_config).await, path)
}

/// What `redis-cli` printed for `argv` sent as `user`.
pub(crate) async fn run(daemon: &TestDaemon, user: &OsUser, argv: Vec<String>) -> String {
    let args: Vec<&str> = argv.iter().map(String::as_str).collect();
    redis_cli(user, daemon, &args).await.trim_end().to_owned()
}

pub(crate) const REFUSED: &str = "can't access at least one of the keys";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenants_scripts_reach_only_the_keys_its_rules_grant() {
    let (Some(acme), Some(globex)) = (os_user("tollgate-acme"), os_user("tollgate-globex")) else {
        return;
    };
    let (daemon, path) = tenants_daemon(&acme, &globex).await;
    let eval = |body: &str| vec!["EVAL".to_owned(), body.to_owned(), "0".to_owned()];

    // Its own keys, read and written by a script.
    let own = run(
        &daemon,
        &acme,
        eval("redis.call('SET', 'acme:1', 'mine') return redis.call('GET', 'acme:1')"),
    )
    .await;
    assert_eq!(own, "mine");
    // Another tenant's key: Redis refuses the call, and the reply says whose scope it is.
    let words = "(tollgate: scope of rule acme-keys does not include that key)";
    for body in [
        "return redis.call('GET', 'globex:secret')",
        "local k = 'glo' .. 'bex' .. ':' .. 'secret' return redis.call('GET', k)",
        "return redis.pcall('SET', string.format('%s:%s', 'globex', 'x'), 'taken')",
    ] {
        let refused = run(&daemon, &acme, eval(body)).await;
        assert!(
            refused.contains(REFUSED) && refused.ends_with(words),
            "{body}: {refused}"
        );
    }
    // Shared keys: read, never written.
    assert_eq!(
        run(
            &daemon,
            &acme,
            eval("return redis.call('EXISTS', 'shared:motd')")
        )
        .await,
        "0"
    );
    let written = run(
        &daemon,
        &acme,
        eval("return redis.call('SET', 'shared:motd', 'x')"),
    )
    .await;
    assert!(
        written.contains(REFUSED) && written.ends_with(words),
        "{written}"
    );
    // The other tenant is held to its own scope the same way.
    let across = run(&daemon, &globex, eval("return redis.call('GET', 'acme:1')")).await;
    assert!(
        across.contains(REFUSED)
            && across.ends_with("(tollgate: scope of rule globex-keys does not include that key)"),
        "{across}"
    );
    assert_eq!(
        run(
            &daemon,
            &globex,
            eval("return redis.call('INCR', 'globex:n')")
        )
        .await,
        "1"
    );

    // The script cache is the server's: loaded by one session, run by another, and NOSCRIPT
    // for a script never loaded.
    let sha = run(
        &daemon,
        &acme,
        vec![
            "SCRIPT".into(),
            "LOAD".into(),
            "return redis.call('GET', 'acme:1')".into(),
        ],
    )
    .await;
    assert_eq!(sha.len(), 40, "{sha}");
    assert_eq!(
        run(
            &daemon,
            &acme,
            vec!["EVALSHA".into(), sha.clone(), "0".into()]
        )
        .await,
        "mine"
    );
    let missing = run(
        &daemon,
        &acme,
        vec!["EVALSHA".into(), "0".repeat(40), "0".into()],
    )
    .await;
    assert!(missing.contains("NOSCRIPT"), "{missing}");
    // The same cached script, run by globex, meets globex's scope.
    let theirs = run(&daemon, &globex, vec!["EVALSHA".into(), sha, "0".into()]).await;
    assert!(theirs.contains(REFUSED), "{theirs}");

    // A function runs as its caller's user too: the operator's library (loaded on the server
    // directly, and so every tenant's to call) reads what acme may read.
    let library = "#!lua name=oplib\nredis.register_function{function_name='peek', \
                   callback=function(keys, args) return redis.call('GET', args[1]) end, \
                   flags={'no-writes'}}";
    let mut operator = embedded_admin(&daemon.dir().join("run")).await;
    assert_eq!(
        operator.call(&["FUNCTION", "LOAD", library]).await,
        Frame::Bulk("oplib".into())
    );
    let fcall = |key: &str| {
        vec![
            "FCALL_RO".to_owned(),
            "peek".to_owned(),
            "0".to_owned(),
            key.to_owned(),
        ]
    };
    assert_eq!(run(&daemon, &acme, fcall("acme:1")).await, "mine");
    let peeked = run(&daemon, &acme, fcall("globex:secret")).await;
    assert!(
        peeked.contains(REFUSED) && peeked.ends_with(words),
        "{peeked}"
    );

    // The scope users, as Redis has them: the reserved keyspace is out of reach.
    let generation = admission(&config(&[&path], Vec::new())).current();
    let user = &generation.scopes().of("acme").expect("acme is scoped").user;
    let mut redis = embedded_admin(&daemon.dir().join("run")).await;
    let dryrun =
        |command: &'static str, key: &'static str| ["ACL", "DRYRUN", user.as_str(), command, key];
    assert_eq!(
        redis.call(&dryrun("GET", "acme:1")).await,
        Frame::Simple("OK".into())
    );
    for key in ["tollgate:lease:1", "tollgate:", "globex:1"] {
        let reply = redis.call(&dryrun("GET", key)).await;
        assert_ne!(reply, Frame::Simple("OK".into()), "{user} GET {key}");
    }
    let reply = redis
        .call(&["ACL", "DRYRUN", user, "SET", "shared:motd", "x"])
        .await;
    assert_ne!(reply, Frame::Simple("OK".into()));
    daemon.stop().await;
}

/// Every local user is `local`; a deny rule with keys makes its scripts scoped, although the
/// rule that allows them names no key.
pub(crate) const EVERYTHING_BUT_RO: &str = "principals:\n  local: { any: true }\nrules:\n\
    \x20 - id: ro-is-read-only\n    commands: [\"@write\"]\n    keys: [\"ro:*\"]\n    deny: read only\n\
    \x20 - id: all\n    commands: [\"*\"]\n    allow: everything else\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deny_rule_with_keys_confines_scripts_a_pool_closes_unheld_and_reloads_move_scopes() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("policy.yaml");
    std::fs::write(&path, EVERYTHING_BUT_RO).unwrap();
    let mut daemon_config = TestDaemon::config(dir.path());
    daemon_config.policy.files = vec![path.clone()];
    daemon_config.lanes.scopes.idle = std::time::Duration::from_secs(1);
    let daemon = TestDaemon::start_config(dir, daemon_config).await;
    let mut client = RawClient::connect(&daemon.resp_socket()).await;
    let words = "(tollgate: scope of rule all does not include that key)";
    for key in ["ro:1", "tollgate:lease:1"] {
        let body = format!("return redis.call('SET', '{key}', 'x')");
        let reply = client.call(&["EVAL", &body, "0"]).await;
        assert!(
            text(&reply).contains(REFUSED) && text(&reply).ends_with(words),
            "{key}: {reply:?}"
        );
    }
    let reply = client
        .call(&["EVAL", "return redis.call('SET', 'rw:1', 'x')", "0"])
        .await;
    assert_eq!(text(&reply), "OK");
    let reply = client
        .call(&["EVAL", "return redis.call('GET', 'ro:1')", "0"])
        .await;
    assert_eq!(reply, Frame::Null);

    // In a transaction the session's connection runs as the scope's user: a script queued in
    // MULTI is held to the scope, and its refusal names the rule.
    let generation = admission(&config(&[&path], Vec::new())).current();
    let user = generation
        .scopes()
        .of("local")
        .expect("local is scoped")
        .user
        .clone();
    let mut redis = embedded_admin(daemon.dir()).await;
    let connected = |list: &Frame| text(list).matches(&format!(" user={user} ")).count();
    assert_eq!(text(&client.call(&["MULTI"]).await), "OK");
    for body in [
        "return redis.call('SET', 'ro:2', 'x')",
        "return redis.call('SET', 'rw:2', 'x')",
    ] {
        assert_eq!(text(&client.call(&["EVAL", body, "0"]).await), "QUEUED");
    }
    // The pool's connection, and the transaction's while it is in progress.
    assert_eq!(connected(&redis.call(&["CLIENT", "LIST"]).await), 2);
    let Frame::Array(answers) = client.call(&["EXEC"]).await else {
        panic!("EXEC gave no array");
    };
    assert!(
        text(&answers[0]).contains(REFUSED) && text(&answers[0]).ends_with(words),
        "{answers:?}"
    );
    assert_eq!(text(&answers[1]), "OK");
    assert_eq!(redis.call(&["EXISTS", "ro:2"]).await, Frame::Integer(0));

    // The transaction's connection went back to its lane as the lane's own user; the scope's
    // pool keeps its connection while the session holds it, none a while after.
    assert_eq!(connected(&redis.call(&["CLIENT", "LIST"]).await), 1);
    drop(client);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while connected(&redis.call(&["CLIENT", "LIST"]).await) > 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the unheld pool stayed open"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }

    // A reload that moves the deny rule to other keys gives the scope another user and deletes
    // the old one.
    std::fs::write(&path, EVERYTHING_BUT_RO.replace("ro:*", "frozen:*")).unwrap();
    let reloaded = daemon.post("/v1/policy/reload", "{}").await;
    assert_eq!(reloaded.status, 200, "{reloaded:?}");
    assert_eq!(redis.call(&["ACL", "GETUSER", &user]).await, Frame::Null);
    let mut client = RawClient::connect(&daemon.resp_socket()).await;
    let reply = client
        .call(&["EVAL", "return redis.call('SET', 'ro:1', 'x')", "0"])
        .await;
    assert_eq!(text(&reply), "OK");
    let reply = client
        .call(&["EVAL", "return redis.call('SET', 'frozen:1', 'x')", "0"])
        .await;
    assert!(text(&reply).contains(REFUSED), "{reply:?}");
    daemon.stop().await;
}

/// What `redis-cli` printed for `lines`, sent as `user` on one connection, one command a line.
async fn session(daemon: &TestDaemon, user: &OsUser, lines: &[&str]) -> String {
    let socket = daemon.resp_socket();
    let script = format!(
        "redis-cli -s '{}' <<'TOLLGATE_END'\n{}\nTOLLGATE_END\n",
        socket.display(),
        lines.join("\n")
    );
    let output = run_as(user, "sh", &["-c", &script]).await;
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// A tenant's transaction runs on a connection logged in as its scope's user from WATCH or MULTI
/// on: a script queued in MULTI or run after WATCH reaches only the tenant's keys, and the
/// connection goes back to the TRANSACTION lane as the lane's own user.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenants_scripts_in_multi_and_after_watch_are_held_to_its_scope() {
    let (Some(acme), Some(globex)) = (os_user("tollgate-acme"), os_user("tollgate-globex")) else {
        return;
    };
    let (daemon, path) = tenants_daemon(&acme, &globex).await;
    let mut redis = embedded_admin(&daemon.dir().join("run")).await;
    assert_eq!(
        redis.call(&["SET", "globex:secret", "theirs"]).await,
        Frame::Simple("OK".into())
    );
    let words = "(tollgate: scope of rule acme-keys does not include that key)";

    // Queued in MULTI: the script on another tenant's key is refused by Redis, with the policy's
    // words, built by concatenation or not; the scripts on its own keys ran.
    let multi = session(
        &daemon,
        &acme,
        &[
            "MULTI",
            "EVAL \"return redis.call('GET', 'globex:secret')\" 0",
            "EVAL \"return redis.call('GET', 'glo' .. 'bex:secret')\" 0",
            "EVAL \"return redis.call('SET', 'acme:t', 'in-multi')\" 0",
            "EVAL \"return redis.call('SET', 'shared:motd', 'taken')\" 0",
            "EVAL \"return redis.call('EXISTS', 'shared:motd')\" 0",
            "EXEC",
        ],
    )
    .await;
    assert_eq!(multi.matches(REFUSED).count(), 3, "{multi}");
    assert_eq!(multi.matches(words).count(), 3, "{multi}");
    assert!(!multi.contains("theirs"), "{multi}");
    assert_eq!(
        redis.call(&["GET", "acme:t"]).await,
        Frame::Bulk("in-multi".into())
    );
    assert_eq!(
        redis.call(&["EXISTS", "shared:motd"]).await,
        Frame::Integer(0)
    );

    // After WATCH, a script runs at once on the pinned connection: held to the scope too.
    let watched = session(
        &daemon,
        &acme,
        &[
            "WATCH acme:w",
            "EVAL \"return redis.call('GET', 'globex:secret')\" 0",
            "EVAL \"return redis.call('INCR', 'acme:w')\" 0",
            "UNWATCH",
        ],
    )
    .await;
    assert!(
        watched.contains(REFUSED) && watched.contains(words) && !watched.contains("theirs"),
        "{watched}"
    );
    assert_eq!(
        redis.call(&["GET", "acme:w"]).await,
        Frame::Bulk("1".into())
    );

    // A plain transaction of the tenant's keys runs as ever; globex's is held to globex's.
    let plain = session(
        &daemon,
        &acme,
        &["MULTI", "SET acme:p 1", "INCR acme:p", "EXEC"],
    )
    .await;
    assert!(plain.contains("OK") && plain.contains('2'), "{plain}");
    let theirs = session(
        &daemon,
        &globex,
        &[
            "MULTI",
            "EVAL \"return redis.call('GET', 'acme:p')\" 0",
            "EVAL \"return redis.call('GET', 'globex:secret')\" 0",
            "EXEC",
        ],
    )
    .await;
    assert!(
        theirs.contains("theirs")
            && theirs.contains("(tollgate: scope of rule globex-keys does not include that key)"),
        "{theirs}"
    );

    // Every TRANSACTION connection is back as the lane's user: none stayed logged in as a scope
    // user, and they were given back rather than closed.
    let generation = admission(&config(&[&path], Vec::new())).current();
    let scope_users: Vec<String> = ["acme", "globex"]
        .iter()
        .map(|who| generation.scopes().of(who).expect("scoped").user.clone())
        .collect();
    let list = text(&redis.call(&["CLIENT", "LIST"]).await);
    let transaction: Vec<&str> = list
        .lines()
        .filter(|line| line.contains(" name=tollgate-transaction "))
        .collect();
    assert!(!transaction.is_empty(), "{list}");
    for line in transaction {
        for user in &scope_users {
            assert!(!line.contains(&format!(" user={user} ")), "{line}");
        }
    }
    daemon.stop().await;
}
