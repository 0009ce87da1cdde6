//! The daemon's reserved keyspace against hostile clients: lease keys, fence counters and release
//! channels cannot be read, written, listed, flushed or reached from a script by any client of the
//! RESP socket, whatever the policy allows, because admission refuses the names and Redis's own ACL
//! refuses the client lanes' users. An external Redis whose users could reach them is refused at
//! start, and a corrupt fence counter fails closed.

use redis::AsyncCommands;
use tollgate::runtime::StartError;
use tollgate::Daemon;
use tollgate_lanes::{Endpoint, ReachError, RedisConfig};
use tollgate_lease::{LeaseKeys, Resource};
use tollgate_resp::Frame;
use tollgate_testkit::RedisServer;

use crate::support::daemon::{tempdir, TestDaemon};
use crate::support::raw::{text, RawClient};

/// The lease database, as the daemon's lease user sees it (the test talks to Redis as `default`).
async fn lease_database(redis: &RedisServer) -> redis::aio::MultiplexedConnection {
    redis::Client::open(redis.url_in(1))
        .expect("redis-rs client")
        .get_multiplexed_async_connection()
        .await
        .expect("connect to redis")
}

async fn acquire(daemon: &TestDaemon, resource: &str, owner: &str) -> serde_json::Value {
    let body = serde_json::json!({
        "attempt": {"owner": owner, "operation_id": "op"},
        "ttl_ms": 30_000,
    });
    daemon
        .post(&format!("/v1/leases/{resource}/acquire"), &body.to_string())
        .await
        .json()
}

async fn release(daemon: &TestDaemon, resource: &str, owner: &str) -> serde_json::Value {
    let body = serde_json::json!({"attempt": {"owner": owner, "operation_id": "op"}});
    daemon
        .post(&format!("/v1/leases/{resource}/release"), &body.to_string())
        .await
        .json()
}

/// Refused by admission (`-NOPERM tollgate: rule reserved …`) or by Redis's ACL (`-NOPERM …`, or
/// from inside a script "The user executing the script can't …").
fn is_refusal(frame: &Frame) -> bool {
    let message = text(frame);
    matches!(frame, Frame::Error(_))
        && ["NOPERM", "reserved", "user executing the script can't"]
            .iter()
            .any(|word| message.contains(word))
}

/// A policy that lets every command through, so what refuses the attacks is the host and Redis.
const ALLOW_EVERYTHING: &str = r#"
principals:
  everyone: { any: true }
rules:
  - id: everything
    commands: ["*"]
    allow: every command, to see what the host and Redis refuse on their own
  - id: leases
    leases: ["*"]
    allow: any lease
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_client_command_or_script_reaches_lease_state_under_the_default_policy() {
    let redis = RedisServer::start();
    let daemon = TestDaemon::start(&redis).await;
    attack_lease_state(&redis, daemon).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_client_command_or_script_reaches_lease_state_under_a_policy_that_allows_everything() {
    let redis = RedisServer::start();
    let policy = redis.dir().join("everything.yaml");
    std::fs::write(&policy, ALLOW_EVERYTHING).unwrap();
    let daemon = TestDaemon::start_with(&redis, |config| config.policy.files = vec![policy]).await;
    attack_lease_state(&redis, daemon).await;
}

/// Holds a lease, throws every attack at its keys over the RESP socket, and checks that each was
/// refused, that nothing changed, and that the next holder's fence is larger.
async fn attack_lease_state(redis: &RedisServer, daemon: TestDaemon) {
    let held = acquire(&daemon, "orders", "alice").await;
    assert_eq!(held["outcome"], "acquired", "{held}");
    let fence = held["fence"].as_u64().expect("a fence");
    let keys = LeaseKeys::of(&Resource::parse("orders").unwrap());
    let mut direct = lease_database(redis).await;
    let state_before: Vec<(String, String)> = direct.hgetall(&keys.lease).await.unwrap();
    assert!(
        !state_before.is_empty(),
        "the lease lives in the lease database"
    );

    let mut client = RawClient::connect(&daemon.resp_socket()).await;
    let counter = keys.fence.as_str();
    let lease = keys.lease.as_str();
    let attacks: Vec<Vec<&str>> = vec![
        vec!["DEL", lease],
        vec!["DEL", "decoy", lease],
        vec!["UNLINK", "decoy", counter],
        vec!["INCRBY", counter, "-1"],
        vec!["SET", counter, "-1000"],
        vec!["SET", counter, "9223372036854775807"],
        vec!["HSET", lease, "owner", "mallory", "fence", "1"],
        vec!["HGETALL", lease],
        vec!["MSET", "decoy", "1", counter, "1"],
        vec!["RENAME", "decoy", counter],
        vec!["COPY", "decoy", counter],
        vec!["EXPIRE", lease, "1"],
        vec!["PUBLISH", keys.channel.as_str(), "released"],
        vec!["SPUBLISH", keys.channel.as_str(), "released"],
        vec!["SWAPDB", "0", "1"],
        // Keys built inside a script: no admission sees them; Redis's ACL refuses them.
        vec![
            "EVAL",
            "return redis.call('DEL', 'tollgate:lease:' .. ARGV[1])",
            "0",
            &lease["tollgate:lease:".len()..],
        ],
        vec![
            "EVAL",
            "return redis.call('INCRBY', ARGV[1], -1)",
            "0",
            counter,
        ],
        vec![
            "EVAL",
            "redis.call('SELECT', 1) return redis.call('DEL', KEYS[1])",
            "1",
            "decoy",
        ],
        vec!["EVAL", "return redis.call('FLUSHALL')", "0"],
    ];
    for attack in &attacks {
        let reply = client.call(attack).await;
        assert!(is_refusal(&reply), "{attack:?} was not refused: {reply:?}");
    }
    // FLUSHALL, where the policy allows it, is served as UNLINK of the keys this client may touch:
    // the lease state (checked unchanged below) is not among them.
    let flushed = client.call(&["FLUSHALL"]).await;
    assert!(
        text(&flushed) == "OK" || is_refusal(&flushed),
        "FLUSHALL: {flushed:?}"
    );

    // A function, loaded and called with the key built inside it.
    let library = "#!lua name=attack\nredis.register_function('wipe', function(keys, args) return redis.call('DEL', args[1]) end)";
    let loaded = client.call(&["FUNCTION", "LOAD", "REPLACE", library]).await;
    assert_eq!(text(&loaded), "attack", "{loaded:?}");
    let called = client.call(&["FCALL", "wipe", "0", lease]).await;
    assert!(is_refusal(&called), "FCALL reached the lease: {called:?}");

    // Listing shows nothing of the daemon's: its keys are in a database no client can select.
    let scan = client
        .call(&["SCAN", "0", "MATCH", "tollgate:*", "COUNT", "1000"])
        .await;
    let Frame::Array(parts) = &scan else {
        panic!("SCAN answered {scan:?}");
    };
    assert_eq!(parts[1], Frame::Array(vec![]), "SCAN listed reserved keys");
    let listed = client.call(&["KEYS", "tollgate:*"]).await;
    assert!(
        listed == Frame::Array(vec![]) || is_refusal(&listed),
        "KEYS listed reserved keys: {listed:?}"
    );
    let select = client.call(&["SELECT", "1"]).await;
    assert!(matches!(select, Frame::Error(_)), "{select:?}");
    let keys_in_script = client
        .call(&[
            "EVAL",
            "return redis.call('SCAN', 0, 'MATCH', 'tollgate:*')",
            "0",
        ])
        .await;
    assert_eq!(
        keys_in_script,
        Frame::Array(vec![Frame::Bulk("0".into()), Frame::Array(vec![])]),
    );

    // Nothing moved: the same holder, the same fence; the next holder's fence is larger.
    let state_after: Vec<(String, String)> = direct.hgetall(&keys.lease).await.unwrap();
    assert_eq!(state_after, state_before);
    assert_eq!(
        release(&daemon, "orders", "alice").await["outcome"],
        "released"
    );
    let next = acquire(&daemon, "orders", "bob").await;
    assert_eq!(next["outcome"], "acquired", "{next}");
    assert!(
        next["fence"].as_u64().unwrap() > fence,
        "{next} after {fence}"
    );
    daemon.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_external_redis_whose_lane_users_reach_the_reserved_keyspace_is_refused() {
    // A plain Redis: every lane would connect as `default`, which may touch every key.
    let redis = RedisServer::builder().open_default().start();
    let dir = tempdir();
    let mut config = TestDaemon::config(dir.path());
    config.redis = Some(RedisConfig::standalone(Endpoint::Unix(
        redis.socket().to_owned(),
    )));
    let error = Daemon::start(config).await.err().expect("refused to start");
    let StartError::Reach(ReachError::Reachable { user, probe, .. }) = &error else {
        panic!("not a reach error: {error}");
    };
    assert_eq!(user, "default");
    assert!(probe.contains("tollgate:"), "{probe}");
    let message = error.to_string();
    assert!(
        message.contains("`default`") && message.contains("tollgate:*"),
        "{message}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupt_fence_counter_fails_closed_and_a_lost_one_restarts_above_every_fence() {
    let redis = RedisServer::start();
    let daemon = TestDaemon::start(&redis).await;
    let keys = LeaseKeys::of(&Resource::parse("jobs").unwrap());
    let mut direct = lease_database(&redis).await;

    let first = acquire(&daemon, "jobs", "a").await;
    let first_fence = first["fence"].as_u64().expect("a fence");
    assert_eq!(release(&daemon, "jobs", "a").await["outcome"], "released");

    for corrupt in ["not-a-number", "0", "-5", "1.5", "9007199254740991"] {
        let () = direct.set(&keys.fence, corrupt).await.unwrap();
        let refused = acquire(&daemon, "jobs", "b").await;
        assert_eq!(refused["outcome"], "unavailable", "{corrupt}: {refused}");
        assert!(
            refused["reason"].as_str().unwrap().contains("FENCE"),
            "{refused}"
        );
        let held: bool = direct.exists(&keys.lease).await.unwrap();
        assert!(!held, "{corrupt}: a lease was written on a corrupt counter");
    }

    // The counter is lost with the data (a flush, a restart without persistence): the next
    // fence is still larger than every fence handed out before.
    let () = direct.del(&keys.fence).await.unwrap();
    let again = acquire(&daemon, "jobs", "c").await;
    assert_eq!(again["outcome"], "acquired", "{again}");
    assert!(again["fence"].as_u64().unwrap() > first_fence, "{again}");
    daemon.stop().await;
}

/// A small deterministic generator, so a failing interleaving of the property test can be replayed.
struct Xorshift(u64);

impl Xorshift {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }

    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len() as u64) as usize]
    }
}

/// Everything a hostile client might throw at one resource's lease state, with the real names.
fn hostile_commands(keys: &tollgate_lease::LeaseKeys) -> Vec<Vec<String>> {
    let digest = keys.lease["tollgate:lease:".len()..].to_owned();
    let owned = |argv: &[&str]| argv.iter().map(|a| (*a).to_owned()).collect::<Vec<_>>();
    vec![
        owned(&["DEL", &keys.lease]),
        owned(&["DEL", "decoy", &keys.fence]),
        owned(&["INCRBY", &keys.fence, "-1"]),
        owned(&["DECR", &keys.fence]),
        owned(&["SET", &keys.fence, "1"]),
        owned(&["GETDEL", &keys.fence]),
        owned(&["HSET", &keys.lease, "owner", "x", "fence", "1"]),
        owned(&["HDEL", &keys.lease, "owner"]),
        owned(&["PEXPIRE", &keys.lease, "1"]),
        owned(&["RENAME", "decoy", &keys.fence]),
        owned(&["MSET", "decoy", "1", &keys.fence, "1"]),
        owned(&["SPUBLISH", &keys.channel, "released"]),
        owned(&["FLUSHALL"]),
        owned(&["FLUSHDB"]),
        owned(&["SWAPDB", "0", "1"]),
        owned(&["SCAN", "0", "MATCH", "tollgate:*"]),
        owned(&[
            "EVAL",
            "return redis.call('DEL', 'tollgate:lease:' .. ARGV[1])",
            "0",
            &digest,
        ]),
        owned(&[
            "EVAL",
            "return redis.call('SET', ARGV[1], '1')",
            "0",
            &keys.fence,
        ]),
        owned(&[
            "EVAL",
            "redis.call('SELECT', 1) return redis.call('FLUSHDB')",
            "0",
        ]),
        owned(&["EVAL", "return redis.call('FLUSHALL')", "0"]),
        owned(&["FCALL", "wipe", "0", &keys.fence]),
        owned(&["SET", "ordinary", "value"]),
        owned(&["INCR", "ordinary:counter"]),
    ]
}

/// Random interleavings of hostile clients and lease holders on one resource, for a fixed budget
/// (`TOLLGATE_FENCE_STEPS` holder steps, default 120): every fence handed out is larger than every
/// fence handed out before that acquire began, and none repeats.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fences_strictly_increase_whatever_clients_do_meanwhile() {
    let steps: u64 = std::env::var("TOLLGATE_FENCE_STEPS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(120);
    let redis = RedisServer::start();
    let daemon = std::sync::Arc::new(TestDaemon::start(&redis).await);
    let keys = LeaseKeys::of(&Resource::parse("contested").unwrap());
    let attacks = std::sync::Arc::new(hostile_commands(&keys));
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));

    let mut attackers = Vec::new();
    for seed in [0x9e37_79b9_7f4a_7c15_u64, 0xd1b5_4a32_d192_ed03] {
        let (daemon, attacks, done) = (daemon.clone(), attacks.clone(), done.clone());
        attackers.push(tokio::spawn(async move {
            let mut rng = Xorshift(seed);
            let mut client = RawClient::connect(&daemon.resp_socket()).await;
            let library = "#!lua name=attack\nredis.register_function('wipe', function(keys, args) return redis.call('DEL', args[1]) end)";
            client.call(&["FUNCTION", "LOAD", "REPLACE", library]).await;
            let mut sent = 0u64;
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                let argv = rng.pick(&attacks);
                let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
                client.call(&argv).await;
                sent += 1;
            }
            sent
        }));
    }

    let record = std::sync::Arc::new(std::sync::Mutex::new((0u64, Vec::<u64>::new())));
    let mut holders = Vec::new();
    for (holder, seed) in [
        (0u64, 0x2545_f491_4f6c_dd1d_u64),
        (1, 0x1234_5678_9abc_def1),
        (2, 7),
    ] {
        let (daemon, record) = (daemon.clone(), record.clone());
        holders.push(tokio::spawn(async move {
            let mut rng = Xorshift(seed);
            for step in 0..steps / 3 {
                // A fresh owner each time: a lease left to run out is another owner's, to wait for.
                let owner = format!("holder-{holder}-{step}");
                let attempt =
                    serde_json::json!({"owner": owner, "operation_id": format!("op-{step}")});
                let floor = record.lock().unwrap().0;
                let body = serde_json::json!({"attempt": attempt, "ttl_ms": 150, "wait_ms": 300});
                let reply = daemon
                    .post("/v1/leases/contested/acquire", &body.to_string())
                    .await
                    .json();
                if reply["outcome"] != "acquired" {
                    continue;
                }
                let fence = reply["fence"].as_u64().expect("a fence");
                {
                    let mut record = record.lock().unwrap();
                    assert!(
                        fence > floor,
                        "fence {fence} not above {floor}, handed out before this acquire began"
                    );
                    record.0 = record.0.max(fence);
                    record.1.push(fence);
                }
                tokio::time::sleep(std::time::Duration::from_millis(rng.below(10))).await;
                // Now and then the holder forgets to release and the lease runs out instead.
                if rng.below(8) != 0 {
                    let body = serde_json::json!({"attempt": attempt});
                    daemon
                        .post("/v1/leases/contested/release", &body.to_string())
                        .await;
                }
            }
        }));
    }
    for holder in holders {
        holder.await.expect("a holder panicked");
    }
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut attacks_sent = 0;
    for attacker in attackers {
        attacks_sent += attacker.await.expect("an attacker panicked");
    }
    let fences = record.lock().unwrap().1.clone();
    let mut distinct = fences.clone();
    distinct.sort_unstable();
    distinct.dedup();
    assert_eq!(
        distinct.len(),
        fences.len(),
        "a fence was handed out twice: {fences:?}"
    );
    assert!(
        fences.len() as u64 >= steps / 4,
        "too few acquisitions to say anything: {}",
        fences.len()
    );
    println!(
        "{} acquisitions, fences strictly increasing, with {attacks_sent} hostile commands in between",
        fences.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_names_the_lease_service_when_its_connections_cannot_reach_redis() {
    let redis = RedisServer::start();
    let daemon = TestDaemon::start(&redis).await;
    assert_eq!(daemon.get("/readyz").await.status, 200);
    // The lease user goes away (and Redis drops its connections); the client lanes are untouched.
    assert!(redis
        .inline(&format!("ACL DELUSER {}", tollgate_lanes::LEASE_USER))
        .starts_with(":1"));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let reply = loop {
        let reply = daemon.get("/readyz").await;
        if reply.status == 503 || std::time::Instant::now() > deadline {
            break reply;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    };
    assert_eq!(reply.status, 503, "{}", reply.body);
    assert!(reply.body.contains("lease"), "{}", reply.body);
    let mut client = RawClient::connect(&daemon.resp_socket()).await;
    assert_eq!(text(&client.call(&["SET", "still", "served"]).await), "OK");
    daemon.stop().await;
}
