//! The front door under hostile input and hostile replies: numbers no command could mean, replies
//! nested deeper than any parser's recursion should go, and clients that hang up while their
//! session waits on Redis. Each costs at most its own command or its own connection.

use std::time::{Duration, Instant};

use bytes::Bytes;
use tollgate_resp::Frame;
use tollgate_testkit::RedisServer;

use crate::support::daemon::TestDaemon;
use crate::support::raw::{text, RawClient};

fn pong() -> Frame {
    Frame::Simple(Bytes::from_static(b"PONG"))
}

#[tokio::test]
async fn timeouts_no_duration_holds_get_redis_own_error_and_the_connection_stays() {
    let redis = RedisServer::start();
    let daemon = TestDaemon::start(&redis).await;
    let mut client = RawClient::connect(&daemon.resp_socket()).await;
    let timeouts = ["1e308", "1e300", "-1", "-1e308", "nan", "inf", "-inf", "1e400"];
    for timeout in timeouts {
        let commands: [Vec<&str>; 11] = [
            vec!["BLPOP", "k", timeout],
            vec!["BRPOP", "k", timeout],
            vec!["BZPOPMIN", "z", timeout],
            vec!["BZPOPMAX", "z", timeout],
            vec!["BLMPOP", timeout, "1", "k", "LEFT"],
            vec!["BZMPOP", timeout, "1", "z", "MIN"],
            vec!["BRPOPLPUSH", "a", "b", timeout],
            vec!["BLMOVE", "a", "b", "LEFT", "RIGHT", timeout],
            vec!["XREAD", "BLOCK", timeout, "STREAMS", "s", "0"],
            vec!["XREADGROUP", "GROUP", "g", "c", "BLOCK", timeout, "STREAMS", "s", ">"],
            vec!["WAIT", "0", timeout],
        ];
        for argv in commands {
            let reply = client.call(&argv).await;
            // Redis's own words: "timeout is negative", "timeout is out of range", "… not a float".
            assert!(
                matches!(&reply, Frame::Error(e) if e.starts_with(b"ERR") && text(&reply).contains("timeout")),
                "{argv:?}: {reply:?}"
            );
            assert_eq!(client.call(&["PING"]).await, pong(), "after {argv:?}");
        }
    }
    // A huge timeout that Redis does accept blocks as asked and is answered when data arrives.
    client.send(&["BLPOP", "later", "1e15"]).await;
    let mut producer = RawClient::connect(&daemon.resp_socket()).await;
    assert_eq!(
        producer.call(&["RPUSH", "later", "v"]).await,
        Frame::Integer(1)
    );
    assert_eq!(
        client.read().await,
        Frame::Array(vec![
            Frame::Bulk(Bytes::from_static(b"later")),
            Frame::Bulk(Bytes::from_static(b"v"))
        ])
    );
    assert_eq!(client.call(&["PING"]).await, pong());
    daemon.stop().await;
}
