//! Tests of the lanes' log spans: a line logged on a connection names its node once, however
//! often the connection was lost and opened again (issue 34: each reconnect recorded `node=` on
//! the driver's long-lived span again, and the log formatter appended it every time).

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use tollgate_model::Multiplexed;
use tollgate_testkit::RedisServer;

use crate::{Endpoint, Lanes, LanesConfig, Topology};

/// The log lines written, shared with the subscriber.
#[derive(Clone, Default)]
struct Lines(Arc<Mutex<Vec<u8>>>);

impl Write for Lines {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test]
async fn a_connection_s_lines_name_its_node_once_after_many_reconnects() {
    let lines = Lines::default();
    let writer = lines.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .finish();
    // The test's runtime is one thread: the drivers log through this subscriber too.
    let _guard = tracing::subscriber::set_default(subscriber);
    let redis = RedisServer::start();
    let topology = Topology::Standalone(Endpoint::Unix(redis.socket().to_owned()));
    let mut registry = prometheus_client::registry::Registry::default();
    // Redis's `default` user is off on testkit's servers: every lane logs in as testkit's admin.
    let mut config = LanesConfig::default();
    for lane in tollgate_model::Lane::ALL {
        let overrides = config.overrides_mut(lane);
        overrides.user = Some(tollgate_testkit::ADMIN_USER.to_owned());
        overrides.password_file = Some(redis.admin_password_file());
    }
    let lanes = Lanes::open(&topology, &config, &mut registry).unwrap();
    let ping = || Bytes::from_static(b"*1\r\n$4\r\nPING\r\n");
    let text = || String::from_utf8(lines.0.lock().unwrap().clone()).unwrap();
    let lost_count = || text().matches("connection to redis lost").count();
    for round in 1..=4 {
        let channel = lanes.multiplexed(Multiplexed::Regular).unwrap();
        // The first PING after a kill may meet the lost connection; the next one reconnects.
        for _ in 0..50 {
            if channel.send(ping()).await.is_ok() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        redis.inline("CLIENT KILL TYPE normal");
        // Until the driver has noticed and logged it (polled: a fixed pause lost the race on a
        // loaded machine).
        for _ in 0..250 {
            if lost_count() >= round {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    let text = text();
    let lost: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("connection to redis lost"))
        .collect();
    assert!(
        lost.len() >= 4,
        "the connection was lost and logged each time: {text}"
    );
    for line in lost {
        assert_eq!(line.matches("node=").count(), 1, "{line}");
    }
}
