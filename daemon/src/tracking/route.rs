//! Where one tracking client's invalidation goes (`sendTrackingMessage`): to itself as a RESP3
//! `invalidate` push; with `REDIRECT`, to the target instead, as a push if it speaks RESP3, or as
//! a message on `__redis__:invalidate` if it is a RESP2 subscriber; nowhere otherwise (RESP2 has
//! no push on a connection that is not subscribed). A target that is gone marks the redirect
//! broken and, if the tracking client speaks RESP3, tells it `tracking-redir-broken` — every time
//! an invalidation finds it so, as Redis does. What is decided here is who gets what; how it is
//! written is the session's.

use bytes::Bytes;
use tollgate_model::Protocol;

use super::client::On;
use super::{ClientId, Directory};

/// What was invalidated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Invalidation {
    /// These keys (written as an array of bulk strings).
    Keys(Vec<Bytes>),
    /// Every key: a flush (written as a null, in the recipient's protocol).
    Everything,
}

/// What one client is sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Message {
    /// A RESP3 push: `>2 $10 invalidate <keys or null>`.
    Push(Invalidation),
    /// A pub/sub message, RESP2: `*3 $7 message $20 __redis__:invalidate <keys or null>`.
    PubSub(Invalidation),
    /// A RESP3 push to the tracking client: `>2 $21 tracking-redir-broken :<redirect id>`.
    RedirectBroken(ClientId),
}

/// One message for one session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delivery {
    /// Whose tracking it comes from: it must wait for this client's replies in flight (the
    /// ordering rule, see the module's header), even when it is written to another client.
    pub tracking: ClientId,
    /// The session that writes it: the tracking client or its redirect target.
    pub to: ClientId,
    pub message: Message,
}

/// `invalidation` of `tracking`'s (its tracking state `on`), routed into `out`. A redirected key
/// the target's principal may not read is left out.
pub fn send(
    tracking: ClientId,
    on: &mut On,
    invalidation: Invalidation,
    directory: &impl Directory,
    out: &mut Vec<Delivery>,
) {
    let Some(target) = on.redirect else {
        if speaks_resp3(directory, tracking) {
            out.push(Delivery {
                tracking,
                to: tracking,
                message: Message::Push(invalidation),
            });
        }
        return;
    };
    let Some(peer) = directory.peer(target) else {
        on.broken = true;
        if speaks_resp3(directory, tracking) {
            out.push(Delivery {
                tracking,
                to: tracking,
                message: Message::RedirectBroken(target),
            });
        }
        return;
    };
    let invalidation = match invalidation {
        Invalidation::Keys(keys) if target != tracking => {
            let keys: Vec<Bytes> = keys
                .into_iter()
                .filter(|key| directory.may_read(target, key))
                .collect();
            if keys.is_empty() {
                return;
            }
            Invalidation::Keys(keys)
        }
        invalidation => invalidation,
    };
    let message = match (peer.protocol, peer.subscribed) {
        (Protocol::Resp3, _) => Message::Push(invalidation),
        (Protocol::Resp2, true) => Message::PubSub(invalidation),
        (Protocol::Resp2, false) => return,
    };
    out.push(Delivery {
        tracking,
        to: target,
        message,
    });
}

fn speaks_resp3(directory: &impl Directory, client: ClientId) -> bool {
    directory
        .peer(client)
        .is_some_and(|peer| peer.protocol == Protocol::Resp3)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::super::client::Mode;
    use super::super::testing::{keys, message, push, Clients};
    use super::*;

    fn on(redirect: Option<ClientId>) -> On {
        On {
            mode: Mode::Default,
            noloop: false,
            redirect,
            caching: false,
            broken: false,
            prefixes: BTreeSet::new(),
        }
    }

    fn routed(tracking: ClientId, on: &mut On, clients: &Clients) -> Vec<Delivery> {
        let mut out = Vec::new();
        send(
            tracking,
            on,
            Invalidation::Keys(keys(&["k"])),
            clients,
            &mut out,
        );
        out
    }

    /// tracking.c (7.0) `sendTrackingMessage`, lines 295-313: RESP3 gets a push; RESP2 gets
    /// nothing on its own connection.
    #[test]
    fn without_redirect_only_resp3_hears_of_it() {
        let mut clients = Clients::default();
        clients.connect(1, Protocol::Resp3);
        clients.connect(2, Protocol::Resp2);
        clients.subscribed(2, true);
        assert_eq!(routed(1, &mut on(None), &clients), vec![push(1, 1, &["k"])]);
        // Subscribed or not: pub/sub messages are for a redirect target only.
        assert_eq!(routed(2, &mut on(None), &clients), vec![]);
    }

    /// tracking.c (7.0) `sendTrackingMessage`, lines 299-312: a RESP3 target gets a push, a RESP2
    /// one a message on `__redis__:invalidate` if it is subscribed (to anything), else nothing.
    #[test]
    fn a_redirect_target_hears_of_it_in_its_own_protocol() {
        let mut clients = Clients::default();
        clients.connect(1, Protocol::Resp2);
        clients.connect(2, Protocol::Resp2);
        let mut redirected = on(Some(2));
        assert_eq!(routed(1, &mut redirected, &clients), vec![]);
        clients.subscribed(2, true);
        assert_eq!(
            routed(1, &mut redirected, &clients),
            vec![message(1, 2, &["k"])]
        );
        clients.hello(2, Protocol::Resp3);
        assert_eq!(
            routed(1, &mut redirected, &clients),
            vec![push(1, 2, &["k"])]
        );
        assert!(!redirected.broken);
    }

    /// tracking.c (7.0) `sendTrackingMessage`, lines 273-287: a gone target marks the redirect
    /// broken and tells a RESP3 tracking client so, each time.
    #[test]
    fn a_gone_target_breaks_the_redirect() {
        let mut clients = Clients::default();
        clients.connect(1, Protocol::Resp3);
        let mut redirected = on(Some(2));
        let broken = Delivery {
            tracking: 1,
            to: 1,
            message: Message::RedirectBroken(2),
        };
        assert_eq!(routed(1, &mut redirected, &clients), vec![broken.clone()]);
        assert!(redirected.broken);
        assert_eq!(routed(1, &mut redirected, &clients), vec![broken]);
        clients.hello(1, Protocol::Resp2);
        assert_eq!(routed(1, &mut redirected, &clients), vec![]);
    }

    #[test]
    fn a_redirect_target_is_told_only_of_keys_its_principal_may_read() {
        let mut clients = Clients::default();
        clients.connect(1, Protocol::Resp3);
        clients.connect(2, Protocol::Resp3);
        clients.refuse(2, "secret:");
        let mut out = Vec::new();
        let both = Invalidation::Keys(keys(&["secret:x", "public"]));
        send(1, &mut on(Some(2)), both, &clients, &mut out);
        assert_eq!(out, vec![push(1, 2, &["public"])]);
        out.clear();
        let secret = Invalidation::Keys(keys(&["secret:x"]));
        send(1, &mut on(Some(2)), secret, &clients, &mut out);
        assert_eq!(out, vec![]);
        // A flush names no key.
        send(
            1,
            &mut on(Some(2)),
            Invalidation::Everything,
            &clients,
            &mut out,
        );
        assert_eq!(out.len(), 1);
    }
}
