//! A guard's cost stays with its caller, through the RESP socket of a daemon on one worker thread
//! (the test's own current-thread runtime) with the repository's spinning guard configured: a
//! client pipelining commands the guard spins on gets each refused for the budget it ran out of,
//! and another client is served while that pipeline is still being decided.

use tollgate_policy::{ModuleConfig, ModuleLimits};
use tollgate_resp::Frame;
use tollgate_testkit::RedisServer;

use crate::support::daemon::TestDaemon;
use crate::support::raw::{text, RawClient};

/// Commands of the spinning pipeline: ten runs of the 64 the daemon admits together.
const SPINS: usize = 640;
/// GETs the other client completes, one at a time, while the spinning pipeline is decided.
const GETS: usize = 20;

/// The hostile guard spins on any command whose first key is `hostile` and allows the others.
pub(crate) fn spinning_guard() -> ModuleConfig {
    ModuleConfig::WithConfig {
        path: tollgate_policy::built_component("hostile"),
        config: "spin".into(),
        limits: ModuleLimits::default(),
    }
}

#[tokio::test]
async fn a_spinning_guard_refuses_its_callers_pipeline_while_another_client_is_served() {
    let redis = RedisServer::start();
    // The production limits (fuel and the wall-clock backstop), not the tests' fuel-only ones.
    let daemon = TestDaemon::start_with(&redis, |config| {
        config.policy.modules = vec![spinning_guard()];
    })
    .await;
    let mut other = RawClient::connect(&daemon.resp_socket()).await;
    assert_eq!(text(&other.call(&["SET", "fine", "v"]).await), "OK");

    let mut spinner = RawClient::connect(&daemon.resp_socket()).await;
    let pipeline: Vec<&[&str]> = vec![&["GET", "hostile"]; SPINS];
    spinner.pipeline(&pipeline).await;
    let spinning = tokio::spawn(async move {
        let mut replies = Vec::with_capacity(SPINS);
        for _ in 0..SPINS {
            replies.push(spinner.read().await);
        }
        replies
    });

    for _ in 0..GETS {
        assert_eq!(
            other.call(&["GET", "fine"]).await,
            Frame::Bulk(bytes::Bytes::from_static(b"v"))
        );
    }
    assert!(
        !spinning.is_finished(),
        "the other client's {GETS} GETs were answered only after the spinning pipeline"
    );

    let replies = spinning.await.expect("the spinning client's reader");
    for (at, reply) in replies.iter().enumerate() {
        assert!(
            matches!(reply, Frame::Error(_))
                && text(reply)
                    == "NOPERM tollgate: rule sandbox denies GET: module hostile ran out of its budget (fuel or deadline)",
            "spinning command {at} was answered {}",
            text(reply)
        );
    }
    daemon.stop().await;
}
