//! Redis's one namespace of scripts and function libraries, divided between tenants (issue 30):
//! two tenants of `policies/examples/tenants.yaml`, each a real OS user granted `@scripting`,
//! load, list, call, delete and flush only their own libraries and kill only their own scripts,
//! through the daemon and its embedded Redis; the operator's library stays callable and untouched.

use std::os::unix::fs::PermissionsExt;
use std::time::{Duration, Instant};

use tollgate::config::SocketMode;
use tollgate_resp::Frame;

use crate::identity::{os_user, run_as, OsUser};
use crate::scopes_daemon::{policy, run};
use crate::support::daemon::{embedded_admin, TestDaemon};
use crate::support::raw::RawClient;

const ACME_LIBRARY: &str = "#!lua name=acmelib\n\
    redis.register_function{function_name='acme_get', \
    callback=function(keys, args) return redis.call('GET', keys[1]) end, flags={'no-writes'}}\n\
    redis.register_function('acme_spin', function(keys, args) while true do end end)";
const GLOBEX_LIBRARY: &str = "#!lua name=globexlib\n\
    redis.register_function('globex_one', function(keys, args) return 1 end)";
const OPERATOR_LIBRARY: &str = "#!lua name=oplib\n\
    redis.register_function{function_name='op_peek', \
    callback=function(keys, args) return redis.call('GET', keys[1]) end, flags={'no-writes'}}";
/// acme's `acmelib`, as another tenant would load it over acme's.
const TAKEOVER: &str = "#!lua name=acmelib\n\
    redis.register_function('taken', function(keys, args) return 'taken' end)";

fn argv(words: &[&str]) -> Vec<String> {
    words.iter().map(|word| word.to_string()).collect()
}

/// Waits until the embedded Redis answers `BUSY` (a script runs past its busy threshold).
async fn until_busy(operator: &mut RawClient) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match operator.call(&["PING"]).await {
            Frame::Error(text) if text.starts_with(b"BUSY") => return,
            other => assert!(Instant::now() < deadline, "never busy: {other:?}"),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn start(acme: &OsUser, globex: &OsUser) -> TestDaemon {
    let dir = tempfile::Builder::new()
        .prefix("tollgate-namespace")
        .tempdir()
        .unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let path = dir.path().join("tenants.yaml");
    std::fs::write(&path, policy(acme, globex)).unwrap();
    let mut config = TestDaemon::config(dir.path());
    config.runtime_dir = Some(dir.path().join("run"));
    config.listen.mode = SocketMode(0o666);
    config.policy.files = vec![path];
    // Redis reads a kill once a script has run its busy threshold: 200 ms here, so that a
    // tenant's own kill comes long before the daemon's time limit would stop the script.
    config.embedded.args = argv(&["--busy-reply-threshold", "200"]);
    config.resp.script_time_limit = Duration::from_secs(20);
    TestDaemon::start_config(dir, config).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_tenant_loads_lists_calls_deletes_and_flushes_only_its_own_libraries() {
    let (Some(acme), Some(globex)) = (os_user("tollgate-acme"), os_user("tollgate-globex")) else {
        return;
    };
    let daemon = start(&acme, &globex).await;
    let mut operator = embedded_admin(&daemon.dir().join("run")).await;
    assert_eq!(
        operator.call(&["FUNCTION", "LOAD", OPERATOR_LIBRARY]).await,
        Frame::Bulk("oplib".into())
    );
    assert_eq!(
        run(&daemon, &acme, argv(&["SET", "acme:1", "mine"])).await,
        "OK"
    );

    // acme loads a library and calls it; the library is marked acme's on the server.
    let loaded = run(&daemon, &acme, argv(&["FUNCTION", "LOAD", ACME_LIBRARY])).await;
    assert_eq!(loaded, "acmelib");
    let get = |who: &str| argv(&["FCALL_RO", "acme_get", "1", &format!("{who}:1")]);
    assert_eq!(run(&daemon, &acme, get("acme")).await, "mine");
    let stored = operator
        .call(&["FUNCTION", "LIST", "LIBRARYNAME", "acmelib", "WITHCODE"])
        .await;
    assert!(
        format!("{stored:?}").contains("-- tollgate-owner: acme"),
        "{stored:?}"
    );
    // acme sees its code as it loaded it.
    let listed = run(&daemon, &acme, argv(&["FUNCTION", "LIST", "WITHCODE"])).await;
    assert!(
        listed.contains("acmelib") && listed.contains("acme_spin") && listed.contains("while true"),
        "{listed}"
    );
    assert!(
        !listed.contains("tollgate-owner") && !listed.contains("oplib"),
        "{listed}"
    );

    // globex can neither see, call, replace nor delete it.
    let listed = run(&daemon, &globex, argv(&["FUNCTION", "LIST", "WITHCODE"])).await;
    assert!(
        !listed.contains("acmelib") && !listed.contains("acme_get"),
        "{listed}"
    );
    let called = run(&daemon, &globex, get("globex")).await;
    assert!(
        called.contains(
            "NOPERM tollgate: rule scope denies FCALL_RO: function acme_get is of library \
             acmelib, which another tenant loaded"
        ),
        "{called}"
    );
    let replaced = run(
        &daemon,
        &globex,
        argv(&["FUNCTION", "LOAD", "REPLACE", TAKEOVER]),
    )
    .await;
    assert!(
        replaced.contains("library 'acmelib' is not globex's to replace"),
        "{replaced}"
    );
    let loaded = run(&daemon, &globex, argv(&["FUNCTION", "LOAD", TAKEOVER])).await;
    assert!(
        loaded.contains("Library 'acmelib' already exists"),
        "{loaded}"
    );
    let deleted = run(&daemon, &globex, argv(&["FUNCTION", "DELETE", "acmelib"])).await;
    assert!(deleted.contains("Library not found"), "{deleted}");
    // The operator's library is not a tenant's to replace or delete either, but to call.
    let deleted = run(&daemon, &globex, argv(&["FUNCTION", "DELETE", "oplib"])).await;
    assert!(deleted.contains("Library not found"), "{deleted}");
    assert_eq!(
        run(
            &daemon,
            &globex,
            argv(&["FCALL_RO", "op_peek", "1", "globex:none"])
        )
        .await,
        ""
    );
    // globex's flush flushes globex's (none yet): acme's library and the operator's stay.
    assert_eq!(
        run(&daemon, &globex, argv(&["FUNCTION", "FLUSH"])).await,
        "OK"
    );
    assert_eq!(run(&daemon, &acme, get("acme")).await, "mine");

    // globex's own library is its own the same way.
    let loaded = run(
        &daemon,
        &globex,
        argv(&["FUNCTION", "LOAD", GLOBEX_LIBRARY]),
    )
    .await;
    assert_eq!(loaded, "globexlib");
    let one = argv(&["FCALL", "globex_one", "0"]);
    assert_eq!(run(&daemon, &globex, one.clone()).await, "1");
    let called = run(&daemon, &acme, one).await;
    assert!(called.contains("which another tenant loaded"), "{called}");

    // What acts on every tenant's libraries at once, or holds a shared connection, is refused.
    for words in [
        &["FUNCTION", "DUMP"][..],
        &["FUNCTION", "RESTORE", "x"],
        &["SCRIPT", "DEBUG", "SYNC"],
    ] {
        let refused = run(&daemon, &globex, argv(words)).await;
        assert!(
            refused.starts_with("NOPERM tollgate:"),
            "{words:?}: {refused}"
        );
    }

    // Inside a transaction the TRANSACTION connection would run it undivided: refused.
    let socket = daemon.resp_socket();
    let piped = format!(
        "printf 'MULTI\\nFUNCTION FLUSH\\nEXEC\\n' | redis-cli -s {}",
        socket.display()
    );
    let output = run_as(&globex, "sh", &["-c", &piped]).await;
    let printed = String::from_utf8_lossy(&output.stdout);
    assert!(
        printed.contains("NOPERM tollgate: rule scope denies FUNCTION")
            && printed.contains("EXECABORT"),
        "{printed}"
    );
    assert_eq!(run(&daemon, &acme, get("acme")).await, "mine");

    // acme's flush deletes acme's library only.
    assert_eq!(
        run(&daemon, &acme, argv(&["FUNCTION", "FLUSH"])).await,
        "OK"
    );
    let left = operator.call(&["FUNCTION", "LIST"]).await;
    let left = format!("{left:?}");
    assert!(
        !left.contains("acmelib") && left.contains("globexlib") && left.contains("oplib"),
        "{left}"
    );
    daemon.stop().await;
}

/// A tenant's `SCRIPT FLUSH` empties its own view of the script cache (per OS user), not Redis's
/// cache: the other tenant's cached scripts still run, and the flushing tenant's come back as it
/// loads or runs them again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenants_script_flush_flushes_its_own_view_and_no_one_elses_scripts() {
    let (Some(acme), Some(globex)) = (os_user("tollgate-acme"), os_user("tollgate-globex")) else {
        return;
    };
    let daemon = start(&acme, &globex).await;
    let body = "return 'cached'";
    let other = "return 'other'";
    let sha = run(&daemon, &acme, argv(&["SCRIPT", "LOAD", body])).await;
    assert_eq!(sha.len(), 40, "{sha}");
    let evalsha = |sha: &str| argv(&["EVALSHA", sha, "0"]);
    let exists = |sha: &str| argv(&["SCRIPT", "EXISTS", sha]);
    assert_eq!(run(&daemon, &globex, evalsha(&sha)).await, "cached");

    assert_eq!(
        run(&daemon, &globex, argv(&["SCRIPT", "FLUSH"])).await,
        "OK"
    );
    let flushed = run(&daemon, &globex, evalsha(&sha.to_uppercase())).await;
    assert!(flushed.starts_with("NOSCRIPT"), "{flushed}");
    assert_eq!(run(&daemon, &globex, exists(&sha)).await, "0");
    // acme's view, and Redis's cache, are as they were.
    assert_eq!(run(&daemon, &acme, evalsha(&sha)).await, "cached");
    assert_eq!(run(&daemon, &acme, exists(&sha)).await, "1");
    // Loaded or run again, globex knows it again.
    assert_eq!(
        run(&daemon, &globex, argv(&["EVAL", body, "0"])).await,
        "cached"
    );
    assert_eq!(run(&daemon, &globex, evalsha(&sha)).await, "cached");
    let other_sha = run(&daemon, &acme, argv(&["SCRIPT", "LOAD", other])).await;
    assert_eq!(run(&daemon, &globex, exists(&other_sha)).await, "0");
    assert_eq!(
        run(&daemon, &globex, argv(&["SCRIPT", "LOAD", other])).await,
        other_sha
    );
    assert_eq!(run(&daemon, &globex, exists(&other_sha)).await, "1");
    daemon.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_kills_its_own_running_script_and_never_another_tenants() {
    let (Some(acme), Some(globex)) = (os_user("tollgate-acme"), os_user("tollgate-globex")) else {
        return;
    };
    let daemon = start(&acme, &globex).await;
    let mut operator = embedded_admin(&daemon.dir().join("run")).await;

    // An EVAL: globex's SCRIPT KILL finds none of its own; acme's stops it.
    let spin = run(&daemon, &acme, argv(&["EVAL", "while true do end", "0"]));
    let kills = async {
        until_busy(&mut operator).await;
        let theirs = run(&daemon, &globex, argv(&["SCRIPT", "KILL"])).await;
        let own = run(&daemon, &acme, argv(&["SCRIPT", "KILL"])).await;
        (theirs, own)
    };
    let (spun, (theirs, own)) = tokio::join!(spin, kills);
    assert!(
        theirs.starts_with("NOTBUSY") && theirs.contains("none of globex's"),
        "{theirs}"
    );
    assert_eq!(own, "OK");
    assert!(spun.contains("killed by user"), "{spun}");

    // A function: only its own tenant sees it running in FUNCTION STATS, and only it kills it.
    let loaded = run(&daemon, &acme, argv(&["FUNCTION", "LOAD", ACME_LIBRARY])).await;
    assert_eq!(loaded, "acmelib");
    let spin = run(&daemon, &acme, argv(&["FCALL", "acme_spin", "0"]));
    let kills = async {
        until_busy(&mut operator).await;
        let their_stats = run(&daemon, &globex, argv(&["FUNCTION", "STATS"])).await;
        let own_stats = run(&daemon, &acme, argv(&["FUNCTION", "STATS"])).await;
        let theirs = run(&daemon, &globex, argv(&["FUNCTION", "KILL"])).await;
        let own = run(&daemon, &acme, argv(&["FUNCTION", "KILL"])).await;
        (their_stats, own_stats, theirs, own)
    };
    let (spun, (their_stats, own_stats, theirs, own)) = tokio::join!(spin, kills);
    assert!(!their_stats.contains("acme_spin"), "{their_stats}");
    assert!(own_stats.contains("acme_spin"), "{own_stats}");
    assert!(
        theirs.starts_with("NOTBUSY") && theirs.contains("none of globex's"),
        "{theirs}"
    );
    assert_eq!(own, "OK");
    assert!(spun.contains("killed by user"), "{spun}");
    // Nothing runs now: acme's kill finds nothing either.
    let none = run(&daemon, &acme, argv(&["SCRIPT", "KILL"])).await;
    assert!(none.starts_with("NOTBUSY"), "{none}");
    daemon.stop().await;
}
