//! `GET /v1/cache` (administrators only: entries' keys are tenants' data): the near cache's
//! state — whether its tracking connection is up, its entries, bytes and bounds, hits and misses,
//! and its largest entries. `enabled: false` when `cache.keys` is empty (the default).

use hyper::body::Incoming;
use hyper::{Request, StatusCode};

use super::{admin_only, json, only_get, ApiError, HttpResponse};
use crate::services::Services;

/// How many of the largest entries the reply lists.
const LARGEST: usize = 10;

#[derive(serde::Serialize)]
struct CacheReply {
    outcome: &'static str,
    enabled: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    cache: Option<State>,
}

#[derive(serde::Serialize)]
struct State {
    tracking: bool,
    keys: Vec<String>,
    entries: usize,
    bytes: usize,
    max_bytes: usize,
    max_entry_bytes: usize,
    max_staleness_ms: u128,
    hits: u64,
    misses: u64,
    largest: Vec<Entry>,
}

#[derive(serde::Serialize)]
struct Entry {
    /// The key, lossily as UTF-8.
    key: String,
    bytes: usize,
}

pub async fn handle(
    request: Request<Incoming>,
    shared: &Services,
) -> Result<HttpResponse, ApiError> {
    only_get(&request)?;
    admin_only(&request, shared, "reading the near cache")?;
    let cache = shared.cache.as_ref().map(|near| {
        let summary = near.cache.summary(LARGEST);
        State {
            tracking: summary.tracking,
            keys: near.keys().to_vec(),
            entries: summary.entries,
            bytes: summary.bytes,
            max_bytes: summary.bounds.max_bytes,
            max_entry_bytes: summary.bounds.max_entry_bytes,
            max_staleness_ms: summary.bounds.max_staleness.as_millis(),
            hits: summary.hits,
            misses: summary.misses,
            largest: (summary.largest.into_iter())
                .map(|(key, bytes)| Entry {
                    key: String::from_utf8_lossy(&key).into_owned(),
                    bytes,
                })
                .collect(),
        }
    });
    let reply = CacheReply {
        outcome: "ok",
        enabled: cache.is_some(),
        cache,
    };
    Ok(json(StatusCode::OK, &reply))
}
