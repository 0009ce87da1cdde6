//! A call Redis refuses inside a script, because the lane's ACL user the policy shaped may not run
//! it, reaches the client with the policy rule behind it, not Redis's bare words alone.

use tollgate_resp::Frame;
use tollgate_testkit::RedisServer;

use crate::support::daemon::TestDaemon;
use crate::support::raw::{text, RawClient};

const REDIS_WORDS: &str = "The user executing the script can't run this command or subcommand";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scripts_refused_call_names_the_rule_behind_it_under_the_default_policy() {
    let redis = RedisServer::start();
    let daemon = TestDaemon::start(&redis).await;
    let mut client = RawClient::connect(&daemon.resp_socket()).await;

    let keys = "local found = {}\nfound = redis.call('KEYS', ARGV[1])\nreturn found";
    let reply = client.call(&["EVAL", keys, "0", "*"]).await;
    let message = text(&reply);
    assert!(matches!(reply, Frame::Error(_)), "{reply:?}");
    assert!(message.contains(REDIS_WORDS), "{message}");
    assert!(
        message.ends_with("(tollgate: the policy's rule no-keys denies KEYS)"),
        "{message}"
    );

    // pcall gets the same error as a value; a command the daemon refuses to every script says so.
    let flush = client
        .call(&["EVAL", "return redis.call(\"FLUSHALL\")", "0"])
        .await;
    assert!(
        text(&flush).ends_with("(tollgate: the policy's rule no-wipe denies FLUSHALL)"),
        "{flush:?}"
    );
    let moved = client
        .call(&["EVAL", "return redis.call('MOVE', KEYS[1], '1')", "1", "k"])
        .await;
    assert!(
        text(&moved).ends_with(
            "(tollgate: the daemon refuses MOVE to every script's user, whatever the policy allows)"
        ) || text(&moved).contains("MOVE is refused"),
        "{moved:?}"
    );

    // EVALSHA: the body never crossed the daemon, so the note says where to look.
    let sha = client
        .call(&["SCRIPT", "LOAD", "return redis.call('KEYS', '*')"])
        .await;
    let reply = client.call(&["EVALSHA", &text(&sha), "0"]).await;
    assert!(
        text(&reply).contains(REDIS_WORDS)
            && text(&reply).ends_with(
                "(tollgate: a script runs only the commands the policy lets local run; `tollgate policy explain` says which rule refuses a command)"
            ),
        "{reply:?}"
    );

    // A script's other errors are Redis's own, unchanged.
    let error = client
        .call(&["EVAL", "return redis.call('GET')", "0"])
        .await;
    assert!(!text(&error).contains("tollgate"), "{error:?}");
    daemon.stop().await;
}
