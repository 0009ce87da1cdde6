//! Mutual exclusion where it matters: many clients take the same lease through the daemon and
//! write through a store that refuses fencing tokens lower than the last one it saw. Half of them
//! stall past their TTL while holding, so leases expire under them and others take over; the
//! stalled holders' writes must be the ones refused, and no fence ever belongs to two holders.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tollgate_lease_client::{AcquireRequest, Acquisition, LeaseClient};
use tollgate_testkit::RedisServer;

use crate::lease::resource;
use crate::lease_http::lease_daemon_with;

const CLIENTS: usize = 6;
const ROUNDS: usize = 4;
const TTL: Duration = Duration::from_millis(200);

/// The protected resource: accepts a write only with a fence at least as new as the last one.
#[derive(Default)]
struct FencedStore {
    last: u64,
    accepted: Vec<(u64, usize)>,
    refused: Vec<(u64, usize)>,
}

impl FencedStore {
    fn write(&mut self, fence: u64, client: usize) {
        if fence < self.last {
            self.refused.push((fence, client));
        } else {
            self.last = fence;
            self.accepted.push((fence, client));
        }
    }
}

#[tokio::test]
async fn no_stale_holder_writes_through_a_fenced_store() {
    let redis = RedisServer::start();
    let daemon = lease_daemon_with(&redis, |config| {
        config.leases.min_ttl = Duration::from_millis(50);
    })
    .await;
    let store = Arc::new(Mutex::new(FencedStore::default()));
    let mut tasks = Vec::new();
    for client_id in 0..CLIENTS {
        let client = LeaseClient::new(&daemon.http_socket());
        let store = store.clone();
        tasks.push(tokio::spawn(async move {
            // Even clients stall well past the TTL while holding; odd ones work briskly.
            let stall = if client_id % 2 == 0 {
                TTL * 5 / 2
            } else {
                Duration::from_millis(5)
            };
            let mut fences = Vec::new();
            for _ in 0..ROUNDS {
                let request = AcquireRequest {
                    attempt: LeaseClient::new_attempt(),
                    ttl: TTL,
                    wait: Duration::from_secs(20),
                    watchdog: false,
                    replicas: 0,
                    value: None,
                    permits: None,
                    count: None,
                    mode: None,
                };
                let Acquisition::Held(mut lease) =
                    client.acquire(&resource(), &request).await.unwrap()
                else {
                    continue;
                };
                fences.push(lease.fence());
                tokio::time::sleep(stall).await;
                store.lock().unwrap().write(lease.fence(), client_id);
                let _ = lease.release().await;
            }
            (client_id, fences)
        }));
    }
    let mut holder_of = HashMap::new();
    for task in tasks {
        let (client_id, fences) = task.await.unwrap();
        for fence in fences {
            assert!(
                holder_of.insert(fence, client_id).is_none(),
                "fence {fence} handed out twice"
            );
        }
    }
    daemon.stop().await;
    let store = store.lock().unwrap();
    assert!(
        holder_of.len() >= CLIENTS * ROUNDS / 2,
        "most rounds held the lease: {holder_of:?}"
    );
    for (fence, client) in &store.accepted {
        assert_eq!(
            holder_of[fence], *client,
            "an accepted write came from the fence's holder"
        );
    }
    assert!(
        !store.refused.is_empty(),
        "stalled holders outlived their leases and tried to write"
    );
    for (fence, client) in &store.refused {
        assert_eq!(
            client % 2,
            0,
            "only a stalled holder (fence {fence}) is ever refused"
        );
    }
}
