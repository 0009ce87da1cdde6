//! Byte budgets (`resp.budgets`, `resp.max_subscriptions`) as hostile clients meet them, each
//! measured on the real binary's RSS (`/proc/<pid>/status`, sampled through the attack) with small
//! budgets: a client that never reads its replies, connections that each hold an unfinished frame,
//! a subscriber that never reads, and one `SUBSCRIBE` of 50,000 channels. In each, the daemon's RSS
//! stays under the budget plus a constant, and another client is served meanwhile.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::AsyncWriteExt;
use tokio::net::UnixStream;
use tollgate_resp::Frame;

use crate::foundation::wait_for_status;
use crate::support::daemon::tempdir;
use crate::support::raw::{text, RawClient};

pub(crate) const MIB: usize = 1024 * 1024;
/// How long anything here is waited for before the test fails.
const PATIENCE: Duration = Duration::from_secs(30);

/// The real binary (its own embedded Redis) with `resp:` settings from `resp_yaml`.
struct Daemon {
    child: tokio::process::Child,
    resp: PathBuf,
    _dir: tempfile::TempDir,
}

impl Daemon {
    async fn start(resp_yaml: &str) -> Daemon {
        let dir = tempdir();
        let runtime = dir.path().join("run");
        let file = dir.path().join("tollgate.yaml");
        std::fs::write(
            &file,
            format!("runtime_dir: {}\nresp:\n{resp_yaml}", runtime.display()),
        )
        .unwrap();
        let child = tokio::process::Command::new(env!("CARGO_BIN_EXE_tollgate"))
            .arg("serve")
            .arg("--config")
            .arg(&file)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("run tollgate");
        wait_for_status(&runtime.join("http.sock"), "/readyz", 200).await;
        Daemon {
            child,
            resp: runtime.join("resp.sock"),
            _dir: dir,
        }
    }

    fn pid(&self) -> u32 {
        self.child.id().expect("running")
    }

    fn rss(&self) -> usize {
        rss(self.pid())
    }

    /// Samples the RSS until the returned guard is asked for the peak.
    fn watch(&self) -> Peak {
        let pid = self.pid();
        let stop = Arc::new(AtomicBool::new(false));
        let peak = Arc::new(AtomicUsize::new(rss(pid)));
        let sampler = {
            let (stop, peak) = (stop.clone(), peak.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    peak.fetch_max(rss(pid), Ordering::Relaxed);
                    std::thread::sleep(Duration::from_millis(5));
                }
            })
        };
        Peak {
            stop,
            peak,
            sampler: Some(sampler),
        }
    }
}

struct Peak {
    stop: Arc<AtomicBool>,
    peak: Arc<AtomicUsize>,
    sampler: Option<std::thread::JoinHandle<()>>,
}

impl Peak {
    fn peak(mut self) -> usize {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(sampler) = self.sampler.take() {
            sampler.join().unwrap();
        }
        self.peak.load(Ordering::Relaxed)
    }
}

fn rss(pid: u32) -> usize {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| {
            rest.trim()
                .trim_end_matches("kB")
                .trim()
                .parse::<usize>()
                .ok()
        })
        .map_or(0, |kib| kib * 1024)
}

fn mib(bytes: usize) -> f64 {
    bytes as f64 / MIB as f64
}

/// Writes a `PING` to a client that otherwise never reads until the daemon has closed it (the
/// write then fails), so that the test knows the client was disconnected without reading.
async fn until_closed(stream: &mut UnixStream) {
    let deadline = Instant::now() + PATIENCE;
    loop {
        // Bounded: a daemon that stopped reading this client without closing it fails the test.
        let write = tokio::time::timeout(Duration::from_millis(100), stream.write_all(b"PING\r\n"));
        if let Ok(Err(_)) = write.await {
            return;
        }
        assert!(Instant::now() < deadline, "the client was not disconnected");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Another client's `PING`s while `attack` runs: every one answered.
async fn served_meanwhile(socket: &Path, attack: impl std::future::Future<Output = ()>) -> usize {
    let mut bystander = RawClient::connect(socket).await;
    let mut attack = std::pin::pin!(attack);
    let mut answered = 0;
    loop {
        tokio::select! {
            () = &mut attack => break,
            reply = bystander.call(&["PING"]) => {
                assert_eq!(text(&reply), "PONG");
                answered += 1;
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
    }
    assert_eq!(text(&bystander.call(&["PING"]).await), "PONG");
    answered
}

/// Reads what a client that stopped reading was sent, up to the close, and returns its last error.
async fn last_error(stream: UnixStream) -> String {
    let frames = RawClient::from_stream(stream)
        .read_until_closed(PATIENCE)
        .await;
    frames.last().map(text).unwrap_or_default()
}

/// Sixteen connections that each start a `mib` MiB `SET` and never finish it (one chunk short),
/// each held open until its task is aborted; and how many bytes they got written.
pub(crate) fn unfinished_frames(
    socket: &Path,
    mib: usize,
) -> (Vec<tokio::task::JoinHandle<()>>, Arc<AtomicUsize>) {
    let written = Arc::new(AtomicUsize::new(0));
    let holders = (0..16)
        .map(|_| {
            let (socket, written) = (socket.to_owned(), written.clone());
            tokio::spawn(async move {
                let mut stream = UnixStream::connect(&socket).await.unwrap();
                let header = format!("*3\r\n$3\r\nSET\r\n$1\r\nk\r\n${}\r\n", mib * MIB);
                stream.write_all(header.as_bytes()).await.unwrap();
                let chunk = vec![b'x'; 256 * 1024];
                for _ in 0..(mib * 4 - 1) {
                    if stream.write_all(&chunk).await.is_err() {
                        break;
                    }
                    written.fetch_add(chunk.len(), Ordering::Relaxed);
                }
                std::future::pending::<()>().await;
            })
        })
        .collect();
    (holders, written)
}

/// Returns once `written` has not moved for a second: the daemon has stopped reading the writers.
pub(crate) async fn until_still(written: &AtomicUsize) -> usize {
    let mut last = 0;
    let mut still = 0;
    while still < 5 {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let now = written.load(Ordering::Relaxed);
        still = if now == last { still + 1 } else { 0 };
        last = now;
    }
    last
}

#[tokio::test]
async fn budgets_a_client_that_never_reads_is_disconnected_at_its_output_limit() {
    let daemon = Daemon::start(
        "  budgets:\n    total: 256MiB\n    normal:\n      output: {hard: 64MiB}\n      input: {hard: 64MiB}\n",
    )
    .await;
    let value = "v".repeat(32 * MIB);
    let mut setter = RawClient::connect(&daemon.resp).await;
    assert_eq!(text(&setter.call(&["SET", "big", &value]).await), "OK");
    // One GET read in full, so that the allocator has seen a reply of this size once.
    let Frame::Bulk(read) = setter.call(&["GET", "big"]).await else {
        panic!("GET big")
    };
    assert_eq!(read.len(), 32 * MIB);
    drop((value, read, setter));
    let before = daemon.rss();

    let watch = daemon.watch();
    let mut attacker = UnixStream::connect(&daemon.resp).await.unwrap();
    let answered = served_meanwhile(&daemon.resp, async {
        attacker
            .write_all(&b"*2\r\n$3\r\nGET\r\n$3\r\nbig\r\n".repeat(32))
            .await
            .unwrap();
        until_closed(&mut attacker).await;
    })
    .await;
    let peak = watch.peak();
    println!(
        "32 x GET of 32 MiB, never read: RSS {:.0} MiB before, peak {:.0} MiB (+{:.0}); {answered} PINGs answered meanwhile",
        mib(before),
        mib(peak),
        mib(peak.saturating_sub(before))
    );
    // Held: at most the 64 MiB hard limit; besides, the reply a lane is reading and the session's
    // copy of the one it writes (32 MiB each) and allocator slack.
    assert!(
        peak < before + 64 * MIB + 128 * MIB,
        "RSS grew by {:.0} MiB",
        mib(peak - before)
    );
    // The bystander's PINGs (each a round trip to Redis) all got PONG, and one after the attack:
    // how many fit in before the attacker is cut off is timing, so it is printed, not asserted.
}

#[tokio::test]
async fn budgets_unfinished_frames_wait_for_the_total_and_one_over_its_input_limit_is_disconnected()
{
    let daemon = Daemon::start(
        // One user here (the test's): no share per user, so that the total is what fills.
        "  budgets:\n    total: 96MiB\n    per_uid: 0\n    normal:\n      output: {hard: 64MiB}\n      input: {hard: 32MiB}\n",
    )
    .await;
    // One frame larger than the input limit: told why, then closed.
    let mut greedy = UnixStream::connect(&daemon.resp).await.unwrap();
    let header = format!("*3\r\n$3\r\nSET\r\n$1\r\nk\r\n${}\r\n", 40 * MIB);
    greedy.write_all(header.as_bytes()).await.unwrap();
    let chunk = vec![b'x'; MIB];
    for _ in 0..40 {
        if greedy.write_all(&chunk).await.is_err() {
            break;
        }
    }
    let error = last_error(greedy).await;
    assert!(
        error.starts_with("ERR tollgate: unparsed input from this client")
            && error.contains("over resp.budgets.normal.input.hard (33554432 bytes)"),
        "{error}"
    );

    // Sixteen connections that each start a 60 MiB frame: the daemon reads them only until all
    // clients together hold the total, and keeps serving small commands.
    let before = daemon.rss();
    let watch = daemon.watch();
    let (holders, written) = unfinished_frames(&daemon.resp, 60);
    let answered = served_meanwhile(&daemon.resp, async {
        until_still(&written).await;
    })
    .await;
    let peak = watch.peak();
    let accepted = written.load(Ordering::Relaxed);
    println!(
        "16 unfinished 60 MiB frames: {:.0} MiB accepted, RSS {:.0} MiB before, peak {:.0} MiB (+{:.0}); {answered} PINGs answered meanwhile",
        mib(accepted),
        mib(before),
        mib(peak),
        mib(peak.saturating_sub(before))
    );
    assert!(accepted < 16 * 60 * MIB / 2, "the writers were not paused");
    assert!(
        peak < before + 96 * MIB + 32 * MIB,
        "RSS grew by {:.0} MiB",
        mib(peak - before)
    );
    assert!(answered > 0);
    for holder in holders {
        holder.abort();
    }
}

#[tokio::test]
async fn budgets_a_subscriber_that_never_reads_is_disconnected_at_its_pubsub_output_limit() {
    let daemon = Daemon::start(
        "  budgets:\n    total: 256MiB\n    pubsub:\n      output: {hard: 32MiB}\n      input: {hard: 1MiB}\n",
    )
    .await;
    let mut subscriber = RawClient::connect(&daemon.resp).await;
    let confirmed = subscriber.call(&["SUBSCRIBE", "news"]).await;
    assert!(matches!(confirmed, Frame::Array(_)), "{confirmed:?}");
    let mut subscriber = subscriber.into_stream();
    let message = "m".repeat(10 * MIB);
    let mut publisher = RawClient::connect(&daemon.resp).await;
    // Warm: one message of this size through the daemon once, to a subscriber that reads it.
    let mut reader = RawClient::connect(&daemon.resp).await;
    reader.call(&["SUBSCRIBE", "warm"]).await;
    publisher.call(&["PUBLISH", "warm", &message]).await;
    reader.read().await;
    drop(reader);
    let before = daemon.rss();

    let watch = daemon.watch();
    let mut published = 0;
    let answered = served_meanwhile(&daemon.resp, async {
        for _ in 0..100 {
            let Frame::Integer(receivers) = publisher.call(&["PUBLISH", "news", &message]).await
            else {
                panic!("PUBLISH answers an integer")
            };
            published += 1;
            if receivers == 0 {
                break;
            }
        }
        until_closed(&mut subscriber).await;
    })
    .await;
    let peak = watch.peak();
    println!(
        "{published} x 10 MiB to a subscriber that never reads: RSS {:.0} MiB before, peak {:.0} MiB (+{:.0}); {answered} PINGs answered meanwhile",
        mib(before),
        mib(peak),
        mib(peak.saturating_sub(before))
    );
    assert!(published < 100, "the subscriber was never dropped");
    // Held: at most 32 MiB; besides, the message being published (the publisher's command, the
    // lane's copy, the subscriber connection's read) and the session's copy of the one it writes.
    assert!(
        peak < before + 32 * MIB + 64 * MIB,
        "RSS grew by {:.0} MiB",
        mib(peak - before)
    );
}

#[tokio::test]
async fn budgets_a_subscribe_past_the_subscription_cap_is_refused_whole() {
    let daemon = Daemon::start("  max_subscriptions: 1000\n").await;
    let mut client = RawClient::connect(&daemon.resp).await;
    let some: Vec<String> = (0..500).map(|i| format!("some:{i}")).collect();
    let mut argv = vec!["SUBSCRIBE"];
    argv.extend(some.iter().map(String::as_str));
    client.send(&argv).await;
    for _ in 0..500 {
        assert!(matches!(client.read().await, Frame::Array(_)));
    }
    let before = daemon.rss();
    let watch = daemon.watch();
    let many: Vec<String> = (0..50_000).map(|i| format!("channel:{i}")).collect();
    let mut argv = vec!["SUBSCRIBE"];
    argv.extend(many.iter().map(String::as_str));
    let answered = served_meanwhile(&daemon.resp, async {
        let refused = client.call(&argv).await;
        assert_eq!(
            text(&refused),
            "ERR tollgate: 50000 more subscriptions would take this client past resp.max_subscriptions (1000); none were made"
        );
    })
    .await;
    let peak = watch.peak();
    println!(
        "SUBSCRIBE of 50,000 past a cap of 1,000: RSS {:.0} MiB before, peak {:.0} MiB (+{:.1}); {answered} PINGs answered meanwhile",
        mib(before),
        mib(peak),
        mib(peak.saturating_sub(before))
    );
    // The command itself (50,000 names, about 1 MiB) is all the daemon held.
    assert!(
        peak < before + 16 * MIB,
        "RSS grew by {:.0} MiB",
        mib(peak - before)
    );
    // The client keeps what it had, and may still subscribe up to the cap.
    let last = client.call(&["SUBSCRIBE", "one-more"]).await;
    let Frame::Array(items) = last else {
        panic!("{last:?}")
    };
    assert_eq!(items[2], Frame::Integer(501));
}

#[tokio::test]
async fn budgets_clients_that_hang_up_while_paused_give_the_total_back_at_once() {
    // No soft limits: nothing but the hang-up itself can free what the holders hold.
    let daemon = Daemon::start(
        // One user here (the test's): no share per user, so that the total is what fills.
        "  budgets:\n    total: 96MiB\n    per_uid: 0\n    normal:\n      output: {hard: 64MiB}\n      input: {hard: 32MiB}\n",
    )
    .await;
    // Sixteen connections each start a 30 MiB frame and never finish it: together they hold the
    // total, and the daemon stops reading them.
    let (holders, written) = unfinished_frames(&daemon.resp, 30);
    let last = until_still(&written).await;
    assert!(last < 16 * 30 * MIB, "the holders were not paused");

    // A victim's 1 MiB SET waits for room under the total...
    let mut victim = RawClient::connect(&daemon.resp).await;
    let value = "v".repeat(MIB);
    let argv = ["SET", "victim", value.as_str()];
    let mut set = std::pin::pin!(victim.call(&argv));
    assert!(
        tokio::time::timeout(Duration::from_secs(1), &mut set)
            .await
            .is_err(),
        "the holders did not take the total"
    );
    // ...until the holders are killed: their sessions read nothing, but notice the hang-up.
    let killed = Instant::now();
    for holder in holders {
        holder.abort();
        let _ = holder.await;
    }
    let reply = tokio::time::timeout(PATIENCE, set)
        .await
        .expect("the victim's SET waited on for the hung-up clients' bytes");
    assert_eq!(text(&reply), "OK");
    println!(
        "a 1 MiB SET answered {:?} after 16 paused holders hung up",
        killed.elapsed()
    );
}
