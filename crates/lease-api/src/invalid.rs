//! The one way a lease request is refused before anything is sent: bad input, naming its field
//! (HTTP 400 with `field`, RESP `-ERR tollgate: <field>: …`).

/// A request the service refuses before sending anything; `field` names the culprit.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct InvalidRequest {
    pub field: &'static str,
    pub message: String,
}
