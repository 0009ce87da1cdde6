//! The lease API's JSON request bodies (`tollgate::server::http::decode_json`) and resource
//! names: well-formed bodies with hostile values, mutated bodies and noise decode to the request
//! or to a typed `400 bad_request` naming what is wrong, never a panic; a decoded request
//! serialises and decodes back to itself.

use proptest::prelude::*;
use serde::de::DeserializeOwned;
use serde::Serialize;
use tollgate::server::http::{decode_json, ApiError};
use tollgate_lease::api::{AcquireRequest, InspectRequest, ReleaseRequest, RenewRequest};
use tollgate_lease::Resource;

use crate::mutate::{apply, mutations};
use crate::support::check;

/// Bytes that mean something in JSON.
const SPECIALS: &[u8] = b"{}[]\":,\\-.0123456789eE tnfu";

/// A JSON value near the edges of what the fields take.
fn value() -> impl Strategy<Value = serde_json::Value> {
    use serde_json::json;
    prop_oneof![
        any::<u64>().prop_map(|n| json!(n)),
        any::<i64>().prop_map(|n| json!(n)),
        any::<f64>().prop_map(|f| json!(f)),
        Just(json!(u64::MAX)),
        Just(json!(-1)),
        Just(json!(1e300)),
        Just(json!(null)),
        any::<bool>().prop_map(|b| json!(b)),
        "\\PC{0,12}".prop_map(|s| json!(s)),
        Just(json!({})),
        Just(json!([])),
    ]
}

const FIELDS: &[&str] = &[
    "attempt",
    "ttl_ms",
    "wait_ms",
    "watchdog",
    "replicas",
    "owner",
    "operation_id",
    "extra",
];

/// A body object: a plausible attempt plus any of the fields, each with any value.
fn body() -> impl Strategy<Value = Vec<u8>> {
    let attempt = ("\\PC{0,12}", "\\PC{0,12}", any::<bool>()).prop_map(|(owner, op, valid)| {
        if valid {
            serde_json::json!({ "owner": owner, "operation_id": op })
        } else {
            serde_json::json!({ "owner": owner })
        }
    });
    let fields = proptest::collection::vec((proptest::sample::select(FIELDS), value()), 0..6);
    (attempt, fields, any::<bool>(), mutations(3, SPECIALS)).prop_map(
        |(attempt, fields, with_ttl, mutations)| {
            let mut object = serde_json::Map::new();
            object.insert("attempt".into(), attempt);
            if with_ttl {
                object.insert("ttl_ms".into(), 30_000.into());
            }
            for (field, value) in fields {
                object.insert(field.into(), value);
            }
            let text = serde_json::to_vec(&serde_json::Value::Object(object)).expect("JSON");
            apply(text, &mutations)
        },
    )
}

fn noise() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        proptest::collection::vec(any::<u8>(), 0..64),
        (1usize..5000).prop_map(|depth| [b"[".repeat(depth), b"]".repeat(depth)].concat()),
        (1usize..5000).prop_map(|depth| b"{\"attempt\":".repeat(depth)),
    ]
}

/// Decodes `bytes` as `T`: a request that round-trips, or a `BadRequest` with a message.
fn decodes_or_refuses<T>(bytes: &[u8]) -> Result<(), TestCaseError>
where
    T: DeserializeOwned + Serialize + PartialEq + std::fmt::Debug,
{
    match decode_json::<T>(bytes) {
        Ok(request) => {
            let again = serde_json::to_vec(&request).expect("a request serialises");
            let back = decode_json::<T>(&again)
                .map_err(|error| TestCaseError::fail(format!("re-decoding failed: {error}")))?;
            prop_assert_eq!(back, request);
        }
        Err(ApiError::BadRequest { message, .. }) => prop_assert!(!message.is_empty()),
        Err(other) => return Err(TestCaseError::fail(format!("not a 400: {other:?}"))),
    }
    Ok(())
}

#[test]
fn lease_request_bodies_decode_or_are_refused_as_bad_requests() {
    let strategy = prop_oneof![3 => body(), 1 => noise()];
    check(2048, strategy, |bytes| {
        decodes_or_refuses::<AcquireRequest>(&bytes)?;
        decodes_or_refuses::<RenewRequest>(&bytes)?;
        decodes_or_refuses::<ReleaseRequest>(&bytes)?;
        decodes_or_refuses::<InspectRequest>(&bytes)
    });
}

#[test]
fn resource_names_parse_or_are_refused() {
    check(
        2048,
        "\\PC{0,300}|[a-z:]{0,10}(tollgate:)?[a-z:%/.]{0,10}",
        |name| {
            if let Ok(resource) = Resource::parse(&name) {
                prop_assert_eq!(resource.as_str(), name.as_str());
            }
            Ok(())
        },
    );
}
