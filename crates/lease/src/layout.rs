//! The version of the lease key layout (`keys.rs`), and what a daemon does when Redis still holds
//! leases of an earlier one: it refuses to start, naming the keys and what to do. A daemon on a
//! new layout does not see leases taken under the old one, and would hand the same resources to a
//! second holder; refusing loudly is the only safe answer that needs no second code path for reading
//! old leases.
//!
//! Layouts so far:
//!
//! - **1** (before the fence buckets): the lease hash at `tollgate:lease:{<sha256 hex>}`, a counter
//!   per resource at `tollgate:lease:{<sha256 hex>}:fence`.
//! - **2** (now): the lease hash at `tollgate:lease:{<bucket>}:<sha256 hex>`, one counter per bucket
//!   at `tollgate:lease:{<bucket>}:fence` ([`crate::keys`]).
//!
//! Only an earlier layout's *leases* block a start: they expire by their TTL, and once gone nothing
//! of them matters (fences drawn under layout 2 start at the server's clock, above every old fence;
//! old fence counters are left alone, docs/leases.md says how to delete them).

use bytes::BytesMut;
use tollgate_lanes::{Exclusive, Lanes, Protocol, Route};
use tollgate_resp::Frame;

/// The layout this daemon writes (`keys.rs`).
pub const LAYOUT_VERSION: u32 = 2;

/// At most this many keys are named in the refusal; the rest are counted.
const NAMED: usize = 10;
/// Keys per `SCAN` step.
const SCAN_COUNT: &str = "1000";

/// An earlier layout: its version and a `SCAN MATCH` pattern for its lease keys only.
struct Earlier {
    version: u32,
    leases: fn() -> String,
}

const EARLIER: [Earlier; 1] = [Earlier {
    version: 1,
    // `tollgate:lease:{` 64 hex digits `}`: the hash tag was the whole digest. `{` and `}` are
    // not special in Redis's glob; layout 2's tags have three digits, its keys never match.
    leases: || {
        format!(
            "{}lease:{{{}}}",
            tollgate_model::reserved::RESERVED_PREFIX,
            "?".repeat(64)
        )
    },
}];

/// A lease of an earlier layout found in Redis.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EarlierLease {
    pub key: String,
    /// Milliseconds until it expires; `None` for a key without expiry.
    pub expires_in_ms: Option<u64>,
}

#[derive(Debug, thiserror::Error)]
pub enum LayoutError {
    #[error("{}", refusal(*.version, .leases, *.more))]
    EarlierLeases {
        version: u32,
        /// The first [`NAMED`] found.
        leases: Vec<EarlierLease>,
        /// How many more were found.
        more: usize,
    },
    #[error("cannot check Redis for leases of an earlier key layout: {0}")]
    Unanswered(String),
}

fn refusal(version: u32, leases: &[EarlierLease], more: usize) -> String {
    let named: Vec<String> = leases
        .iter()
        .map(|lease| match lease.expires_in_ms {
            Some(ms) => format!("{} (expires in {:.1}s)", lease.key, ms as f64 / 1000.0),
            None => format!("{} (no expiry)", lease.key),
        })
        .collect();
    let longest = leases.iter().filter_map(|l| l.expires_in_ms).max();
    let wait = match longest {
        Some(ms) => format!(
            " (the longest of those named has {:.1}s left)",
            ms as f64 / 1000.0
        ),
        None => String::new(),
    };
    let others = if more > 0 {
        format!(" and {more} more")
    } else {
        String::new()
    };
    format!(
        "redis holds leases taken by an earlier tollgate under lease key layout {version}: {}{others}. \
         This daemon uses layout {LAYOUT_VERSION} and would not see them, so it could hand those \
         resources to a second holder; it refuses to start. Stop every tollgate daemon of the \
         earlier version and start this one once these leases have expired{wait}; or, if no daemon \
         of the earlier version runs and nothing relies on these leases any more, delete the keys \
         (DEL on the lease database) and start again (docs/leases.md, \"Upgrades\").",
        named.join(", ")
    )
}

/// Refuses (with every key named, up to [`NAMED`]) while any master the lease lanes reach holds a
/// lease of an earlier layout.
pub async fn check_layout(lanes: &Lanes) -> Result<(), LayoutError> {
    let masters = lanes
        .masters()
        .await
        .map_err(|error| LayoutError::Unanswered(error.to_string()))?;
    for earlier in &EARLIER {
        let pattern = (earlier.leases)();
        let mut found = Vec::new();
        let mut more = 0;
        for master in &masters {
            scan(lanes, master.clone(), &pattern, &mut found, &mut more).await?;
        }
        if !found.is_empty() {
            return Err(LayoutError::EarlierLeases {
                version: earlier.version,
                leases: found,
                more,
            });
        }
    }
    Ok(())
}

/// Every key matching `pattern` on the master `route` leads to: the first into `found` (with their
/// expiry), the others counted in `more`.
async fn scan(
    lanes: &Lanes,
    route: Route,
    pattern: &str,
    found: &mut Vec<EarlierLease>,
    more: &mut usize,
) -> Result<(), LayoutError> {
    let unanswered = |error: String| LayoutError::Unanswered(error);
    let mut conn = lanes
        .borrow_at(route, Exclusive::Admin, Protocol::Resp2, None)
        .await
        .map_err(|error| unanswered(error.to_string()))?;
    let result = async {
        let mut cursor = "0".to_owned();
        loop {
            let reply = call(
                &mut conn,
                &["SCAN", &cursor, "MATCH", pattern, "COUNT", SCAN_COUNT],
            )
            .await?;
            let (next, keys) = match reply {
                Frame::Array(mut parts) if parts.len() == 2 => {
                    let keys = parts.pop().expect("two parts");
                    let next = parts.pop().expect("two parts");
                    (text(&next)?, keys)
                }
                other => return Err(unanswered(format!("unexpected SCAN reply {other:?}"))),
            };
            let Frame::Array(keys) = keys else {
                return Err(unanswered(format!("unexpected SCAN keys {keys:?}")));
            };
            for key in keys {
                let key = text(&key)?;
                if found.len() >= NAMED {
                    *more += 1;
                    continue;
                }
                let expires_in_ms = match call(&mut conn, &["PTTL", &key]).await? {
                    // Gone since the SCAN saw it.
                    Frame::Integer(-2) => continue,
                    Frame::Integer(ms) => u64::try_from(ms).ok(),
                    other => return Err(unanswered(format!("unexpected PTTL reply {other:?}"))),
                };
                found.push(EarlierLease { key, expires_in_ms });
            }
            if next == "0" {
                return Ok(());
            }
            cursor = next;
        }
    }
    .await;
    conn.release().await;
    result
}

async fn call(conn: &mut tollgate_lanes::Borrowed, argv: &[&str]) -> Result<Frame, LayoutError> {
    let mut out = BytesMut::new();
    tollgate_resp::encode_command(argv, &mut out);
    let reply = conn
        .send(out.freeze())
        .await
        .map_err(|error| LayoutError::Unanswered(error.to_string()))?;
    match reply.frame() {
        Ok(Frame::Error(message)) => Err(LayoutError::Unanswered(
            String::from_utf8_lossy(&message).into_owned(),
        )),
        Ok(frame) => Ok(frame),
        Err(error) => Err(LayoutError::Unanswered(error.to_string())),
    }
}

fn text(frame: &Frame) -> Result<String, LayoutError> {
    match frame.as_bytes() {
        Some(bytes) => Ok(String::from_utf8_lossy(bytes).into_owned()),
        None => Err(LayoutError::Unanswered(format!(
            "expected a string, got {frame:?}"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_1_pattern_matches_its_leases_and_none_of_layout_2() {
        let pattern = (EARLIER[0].leases)();
        assert_eq!(pattern.len(), "tollgate:lease:{}".len() + 64);
        let layout_2 = crate::LeaseKeys::of(&crate::Resource::parse("orders:42").unwrap());
        // Layout 2's lease key is as long as the pattern, but its tag closes after 3 characters.
        assert_eq!(layout_2.lease.len(), "tollgate:lease:{25f}:".len() + 64);
        assert_ne!(layout_2.lease.len(), pattern.len());
    }

    #[test]
    fn the_refusal_names_the_keys_and_what_to_do() {
        let message = refusal(
            1,
            &[EarlierLease {
                key: "tollgate:lease:{ab}".into(),
                expires_in_ms: Some(12_500),
            }],
            3,
        );
        assert!(message.contains("tollgate:lease:{ab} (expires in 12.5s) and 3 more"));
        assert!(message.contains("layout 1"));
        assert!(message.contains("Stop every tollgate daemon of the earlier version"));
        assert!(message.contains("DEL"));
    }
}
