//! Who a peer is to the daemon: its principal, derived from the kernel's credentials and the policy
//! alone, and whether it is an administrator. Both listeners derive callers here and nowhere else.
//!
//! A principal never comes from a name the peer's user could choose: a login name may equal a
//! principal's name (a user called `globex`), so an unmapped uid is `uid:<n>` or is refused.

use tollgate_model::Caller;
use tollgate_policy::Admission;

use crate::config::{AdminConfig, IdentityConfig, Unmapped};
use crate::server::peer::PeerCredentials;

/// Derives callers and decides who administers the daemon.
#[derive(Clone)]
pub struct Identities {
    admission: Admission,
    unmapped: Unmapped,
    admins: Admins,
}

/// A peer without a principal: the policy maps neither its uid nor its gid and the config says to
/// refuse such peers.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "uid {uid} (gid {gid}) maps to no principal of the policy, and identity.unmapped is `refuse`"
)]
pub struct Refused {
    pub uid: u32,
    pub gid: u32,
}

/// A peer asked for something only administrators may do.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{action} is for administrators; uid {uid} (gid {gid}) is not one (`admin:` in the daemon's config)"
)]
pub struct NotAdmin {
    pub action: String,
    pub uid: u32,
    pub gid: u32,
}

/// The administrators' uids and gids, resolved once at start-up.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Admins {
    uids: Vec<u32>,
    gids: Vec<u32>,
}

impl Admins {
    /// Root and the daemon's own uid unless the config names the uids; `own_uid` is passed in so
    /// that the default is testable.
    fn from_config(config: &AdminConfig, own_uid: u32) -> Admins {
        Admins {
            uids: config.uids.clone().unwrap_or_else(|| vec![0, own_uid]),
            gids: config.gids.clone(),
        }
    }

    fn admit(&self, peer: PeerCredentials, action: &str) -> Result<(), NotAdmin> {
        if self.uids.contains(&peer.uid) || self.gids.contains(&peer.gid) {
            return Ok(());
        }
        Err(NotAdmin {
            action: action.to_owned(),
            uid: peer.uid,
            gid: peer.gid,
        })
    }
}

impl Identities {
    pub fn new(admission: Admission, identity: &IdentityConfig, admin: &AdminConfig) -> Self {
        Identities {
            admission,
            unmapped: identity.unmapped,
            admins: Admins::from_config(admin, nix::unistd::geteuid().as_raw()),
        }
    }

    /// The caller these credentials are under the active policy.
    pub fn caller(&self, peer: PeerCredentials) -> Result<Caller, Refused> {
        let mapped = self.admission.principal_for(peer.uid, peer.gid);
        Ok(Caller {
            principal: principal(mapped, self.unmapped, peer)?,
            uid: peer.uid,
            gid: peer.gid,
            pid: peer.pid,
        })
    }

    /// Whether a peer of these credentials administers the daemon.
    pub fn is_admin(&self, uid: u32, gid: u32) -> bool {
        self.admins.uids.contains(&uid) || self.admins.gids.contains(&gid)
    }

    /// Whether the peer may do `action` (named in the refusal), which only administrators may.
    pub fn admin(&self, peer: PeerCredentials, action: &str) -> Result<(), NotAdmin> {
        self.admins.admit(peer, action)
    }
}

/// The policy's principal for the peer, else what `unmapped` says: `uid:<n>` or a refusal.
fn principal(
    mapped: Option<String>,
    unmapped: Unmapped,
    peer: PeerCredentials,
) -> Result<String, Refused> {
    match (mapped, unmapped) {
        (Some(principal), _) => Ok(principal),
        (None, Unmapped::Uid) => Ok(Caller::unmapped_principal(peer.uid)),
        (None, Unmapped::Refuse) => Err(Refused {
            uid: peer.uid,
            gid: peer.gid,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peer(uid: u32, gid: u32) -> PeerCredentials {
        PeerCredentials { uid, gid, pid: 1 }
    }

    #[test]
    fn an_unmapped_peer_is_its_uid_or_refused_never_its_login_name() {
        // uid 0 is `root` on every machine: a login name, if it leaked through, would show here.
        assert_eq!(principal(None, Unmapped::Uid, peer(0, 0)).unwrap(), "uid:0");
        assert_eq!(
            principal(None, Unmapped::Refuse, peer(4242, 7)).unwrap_err(),
            Refused { uid: 4242, gid: 7 }
        );
        let refusal = principal(None, Unmapped::Refuse, peer(4242, 7))
            .unwrap_err()
            .to_string();
        assert!(refusal.contains("uid 4242"), "{refusal}");
        // The policy's own mapping wins in both modes.
        for mode in [Unmapped::Uid, Unmapped::Refuse] {
            assert_eq!(
                principal(Some("acme".into()), mode, peer(2001, 0)).unwrap(),
                "acme"
            );
        }
    }

    #[test]
    fn administrators_are_root_and_the_daemons_uid_unless_configured() {
        let default = Admins::from_config(&AdminConfig::default(), 1000);
        assert!(default.admit(peer(0, 0), "reloading").is_ok());
        assert!(default.admit(peer(1000, 1000), "reloading").is_ok());
        let refused = default.admit(peer(1001, 1000), "reloading").unwrap_err();
        assert_eq!(
            refused,
            NotAdmin {
                action: "reloading".into(),
                uid: 1001,
                gid: 1000
            }
        );
        assert!(refused
            .to_string()
            .starts_with("reloading is for administrators; uid 1001"));

        let configured = Admins::from_config(
            &AdminConfig {
                uids: Some(vec![2000]),
                gids: vec![10],
                ..AdminConfig::default()
            },
            1000,
        );
        assert!(configured.admit(peer(2000, 2000), "x").is_ok());
        assert!(configured.admit(peer(3000, 10), "x").is_ok(), "by gid");
        assert!(
            configured.admit(peer(0, 0), "x").is_err(),
            "the list replaces the default"
        );
        assert!(configured.admit(peer(1000, 1000), "x").is_err());
    }
}
