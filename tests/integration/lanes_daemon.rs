//! The lanes inside the daemon: embedded mode creates one least-privilege ACL user per lane with a
//! password in a 0600 file, `GET /v1/lanes` and `/metrics` report every lane, and shutdown closes
//! every lane connection before the embedded Redis stops.

use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use tollgate_lanes::Lane;

use crate::support::daemon::TestDaemon;

/// One inline command on the embedded server, logged in as its administrator (the password is in
/// the runtime directory beside the socket); `default` is off there.
fn inline(socket: &Path, command: &str) -> String {
    let password = std::fs::read_to_string(socket.with_file_name("admin.password")).unwrap();
    let auth = format!(
        "AUTH {} {}\r\n",
        tollgate_lanes::EMBEDDED_ADMIN,
        password.trim_end()
    );
    let reply = raw(socket, &format!("{auth}{command}\r\n"));
    match reply.strip_prefix("+OK\r\n") {
        Some(rest) => rest.to_owned(),
        None => panic!("the embedded admin's AUTH refused: {reply}"),
    }
}

/// Writes `bytes` on a fresh connection and reads until a read would wait.
fn raw(socket: &Path, bytes: &str) -> String {
    let mut stream = UnixStream::connect(socket).expect("connect to the embedded redis");
    stream
        .set_read_timeout(Some(Duration::from_millis(300)))
        .unwrap();
    stream.write_all(bytes.as_bytes()).unwrap();
    let mut reply = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    while let Ok(n) = stream.read(&mut buf) {
        if n == 0 {
            break;
        }
        reply.extend_from_slice(&buf[..n]);
    }
    String::from_utf8_lossy(&reply).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedded_mode_creates_a_private_user_per_lane_and_reports_every_lane() {
    let daemon = TestDaemon::start_embedded().await;
    let redis = daemon.dir().join("redis.sock");

    // Redis's `default` user is off: a connection without the password gets nothing.
    assert!(
        raw(&redis, "PING\r\n").starts_with("-NOAUTH"),
        "the embedded server answers without a password"
    );
    let default = inline(&redis, "ACL LIST");
    assert!(default.contains("user default off"), "{default}");
    let users = inline(&redis, "ACL USERS");
    for lane in Lane::ALL {
        let user = tollgate_lanes::user_name(lane);
        assert!(users.contains(&user), "{user} missing from {users}");
        let file = daemon
            .dir()
            .join(format!("lane-{}.password", lane.as_str()));
        let mode = std::fs::metadata(&file)
            .expect("password file")
            .permissions()
            .mode();
        assert_eq!(
            mode & 0o777,
            0o600,
            "{} is readable by others",
            file.display()
        );
    }
    let admin_rules = inline(&redis, "ACL GETUSER tollgate-admin");
    assert!(
        !admin_rules.contains("+@all"),
        "the admin user is not all-powerful: {admin_rules}"
    );

    // /readyz pings through the REGULAR lane as tollgate-regular.
    assert_eq!(daemon.get("/readyz").await.status, 200);
    let clients = inline(&redis, "CLIENT LIST");
    assert!(clients.contains("user=tollgate-regular"), "{clients}");

    let reply = daemon.get("/v1/lanes").await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    let body = reply.json();
    assert_eq!(body["outcome"], "ok");
    assert_eq!(body["state"], "open");
    let lanes = body["lanes"].as_array().expect("lanes array");
    assert_eq!(lanes.len(), 6);
    let regular = lanes
        .iter()
        .find(|l| l["lane"] == "regular")
        .expect("regular");
    assert_eq!(regular["user"], "tollgate-regular");
    assert_eq!(regular["sharing"], "multiplexed");
    // Four per protocol: RESP2 and RESP3 clients each get connections that speak theirs.
    assert_eq!(regular["max_connections"], 8);
    assert!(regular["open"].as_i64().unwrap() >= 1);

    let metrics = daemon.get("/metrics").await.body;
    for lane in Lane::ALL {
        for family in [
            "tollgate_lane_connections_open",
            "tollgate_lane_in_use",
            "tollgate_lane_waiting",
        ] {
            let sample = format!("{family}{{lane=\"{}\"}}", lane.as_str());
            assert!(metrics.contains(&sample), "{sample} missing from /metrics");
        }
        assert!(metrics.contains(&format!(
            "tollgate_lane_rejections_total{{lane=\"{}\",cause=\"wait_expired\"}}",
            lane.as_str()
        )));
    }
    assert!(metrics.contains("tollgate_lane_wait_seconds_bucket"));
    assert!(metrics.contains("tollgate_lane_reconnects_total"));

    daemon.stop().await;
}
