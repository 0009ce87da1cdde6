//! Principal classes: peers (uid, gid) that every policy compared maps to the same principal.
//! A rule names principals, and a principal is chosen by uid, then gid, then `any`; so the peers
//! worth telling apart are each uid and gid some policy names, and "any other" of each.

use std::collections::BTreeSet;

use serde::Serialize;

use crate::generation::Generation;

/// Peers that map to the same principal under every generation compared.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PrincipalClass {
    /// A witness peer.
    pub uid: u32,
    pub gid: u32,
    /// The principal under each generation; `None`: unmapped, the peer is `uid:<n>`.
    pub names: Vec<Option<String>>,
    /// Whether the witness uid is one a policy names (else it stands for every other uid).
    pub named_uid: bool,
    pub named_gid: bool,
}

impl PrincipalClass {
    /// The principal name the guards see under generation `at`.
    pub fn principal(&self, at: usize) -> String {
        self.names[at]
            .clone()
            .unwrap_or_else(|| format!("uid:{}", self.uid))
    }

    /// The principal under the last generation: `app`, or `(unmapped)`.
    pub fn name(&self) -> String {
        self.names
            .last()
            .cloned()
            .flatten()
            .unwrap_or_else(|| "(unmapped)".into())
    }

    /// The flags that make `policy explain` judge as this class's witness peer.
    pub fn replay(&self) -> String {
        let principals: Vec<String> = (0..self.names.len()).map(|at| self.principal(at)).collect();
        super::verdict::peer_flags(self.uid, self.gid, &principals)
    }

    /// `app (uid 1000)`, `reporting (gid 3000)`, `local (any other uid)`; `a -> b` when the
    /// generations map the peer differently.
    pub fn label(&self) -> String {
        let mut names: Vec<String> = self
            .names
            .iter()
            .map(|name| name.clone().unwrap_or_else(|| "(unmapped)".into()))
            .collect();
        names.dedup();
        let peer = match (self.named_uid, self.named_gid) {
            (true, _) => format!("uid {}", self.uid),
            (false, true) => format!("gid {}", self.gid),
            (false, false) => "any other uid".to_owned(),
        };
        format!("{} ({peer})", names.join(" -> "))
    }
}

/// The first uid at or above `from` that `named` does not hold.
fn other(named: &BTreeSet<u32>, from: u32) -> u32 {
    (from..=u32::MAX)
        .find(|id| !named.contains(id))
        .unwrap_or(from)
}

pub fn classes(generations: &[&Generation]) -> Vec<PrincipalClass> {
    let principals = generations.iter().flat_map(|g| g.principals());
    let uids: BTreeSet<u32> = principals.clone().flat_map(|p| p.uids.clone()).collect();
    let gids: BTreeSet<u32> = principals.flat_map(|p| p.gids.clone()).collect();
    // 65534 is `nobody`: an id no policy is likely to name, and visibly not root.
    let other_uid = other(&uids, 65534);
    let other_gid = other(&gids, 65534);
    let uid_choices = uids.iter().map(|&u| (u, true)).chain([(other_uid, false)]);
    let mut out: Vec<PrincipalClass> = Vec::new();
    for (uid, named_uid) in uid_choices {
        // An unnamed gid first: it stands for a uid's class when the gid does not matter.
        let gid_choices = [(other_gid, false)]
            .into_iter()
            .chain(gids.iter().map(|&g| (g, true)));
        for (gid, named_gid) in gid_choices {
            let names: Vec<Option<String>> = generations
                .iter()
                .map(|g| g.principal_for(uid, gid))
                .collect();
            // The first peer found for a mapping stands for all of its peers.
            if out.iter().any(|c| c.names == names) {
                continue;
            }
            out.push(PrincipalClass {
                uid,
                gid,
                names,
                named_uid,
                named_gid,
            });
        }
    }
    out
}
