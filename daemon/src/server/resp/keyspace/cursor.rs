//! The cursor a client's `SCAN` carries on a cluster: which master the scan is on and that master's
//! own cursor, packed in one decimal integer that fits an unsigned 64-bit one (what clients parse).
//!
//! From the low bits up: the master's index in the masters' stable order (10 bits), a fingerprint
//! of that order (10 bits), and the node's own cursor (44 bits; Redis's cursor is bounded by its
//! table size, so 2^44 is out of reach of any node's memory). Cursor 0 starts at the first master,
//! and 0 comes back only after the last master's scan ended, so a client's loop runs as on one
//! server.
//!
//! A cursor whose fingerprint is not the current masters' (a failover or a reshard changed the
//! list mid-scan, or the cursor is not one of ours) restarts the scan from the first master rather
//! than failing: a full scan of the new masters follows, so every key present throughout is still
//! returned, at the price of keys returned again — which SCAN allows. One fingerprint in 1024
//! collides; a colliding change resumes at an index of the new list, as any per-node scan would.

use tollgate_lanes::Route;

const INDEX_BITS: u32 = 10;
const PRINT_BITS: u32 = 10;
const NODE_SHIFT: u32 = INDEX_BITS + PRINT_BITS;
const INDEX_MASK: u64 = (1 << INDEX_BITS) - 1;
const PRINT_MASK: u64 = (1 << PRINT_BITS) - 1;

/// The most masters a cluster SCAN can tell apart.
pub const MAX_MASTERS: usize = 1 << INDEX_BITS;
/// The largest node cursor the client's cursor can carry.
const MAX_NODE_CURSOR: u64 = u64::MAX >> NODE_SHIFT;

/// The masters as a cursor sees them: how many, and their order's fingerprint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    masters: usize,
    print: u64,
}

/// Where a client's cursor resumes: the master's index and the cursor to send it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Position {
    pub master: usize,
    pub node_cursor: u64,
}

/// Why a scan cannot go on with this encoding.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CursorError {
    #[error("ERR tollgate: SCAN over {0} masters (at most {MAX_MASTERS})")]
    TooManyMasters(usize),
    #[error("ERR tollgate: a master's SCAN cursor {0} is too large to carry (at most {MAX_NODE_CURSOR})")]
    NodeCursorTooLarge(u64),
}

impl Layout {
    /// The layout of `masters`, in the lanes' stable order.
    pub fn of(masters: &[Route]) -> Result<Layout, CursorError> {
        if masters.len() > MAX_MASTERS {
            return Err(CursorError::TooManyMasters(masters.len()));
        }
        Ok(Layout {
            masters: masters.len(),
            print: fingerprint(masters),
        })
    }

    /// Where the client's `cursor` resumes; the first master when it was made for other masters.
    pub fn resume(&self, cursor: u64) -> Position {
        let master = (cursor & INDEX_MASK) as usize;
        let print = (cursor >> INDEX_BITS) & PRINT_MASK;
        if print != self.print || master >= self.masters {
            return Position {
                master: 0,
                node_cursor: 0,
            };
        }
        Position {
            master,
            node_cursor: cursor >> NODE_SHIFT,
        }
    }

    /// The client's next cursor after master `master` answered `node_next`: that master again, the
    /// next master from its start once this one is done, 0 once the last one is.
    pub fn next(&self, master: usize, node_next: u64) -> Result<u64, CursorError> {
        if node_next > MAX_NODE_CURSOR {
            return Err(CursorError::NodeCursorTooLarge(node_next));
        }
        let (master, node_cursor) = match node_next {
            0 if master + 1 >= self.masters => return Ok(0),
            0 => (master + 1, 0),
            more => (master, more),
        };
        Ok(node_cursor << NODE_SHIFT | self.print << INDEX_BITS | master as u64)
    }
}

/// FNV-1a over the masters' addresses, folded to [`PRINT_BITS`]: the same in every daemon build, so
/// a restarted daemon resumes its clients' scans.
fn fingerprint(masters: &[Route]) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for master in masters {
        let name = match master {
            Route::Node(endpoint) => endpoint.to_string(),
            other => format!("{other:?}"),
        };
        for byte in name.bytes().chain([0]) {
            hash ^= u64::from(byte);
            hash = hash.wrapping_mul(0x0100_0000_01b3);
        }
    }
    let mut folded = 0;
    while hash != 0 {
        folded ^= hash & PRINT_MASK;
        hash >>= PRINT_BITS;
    }
    folded
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use tollgate_lanes::Endpoint;

    fn masters(ports: &[u16]) -> Vec<Route> {
        ports
            .iter()
            .map(|&port| {
                Route::Node(Endpoint::Tcp {
                    host: "127.0.0.1".to_owned(),
                    port,
                })
            })
            .collect()
    }

    const START: Position = Position {
        master: 0,
        node_cursor: 0,
    };

    #[test]
    fn cursor_zero_starts_at_the_first_master_and_zero_ends_after_the_last() {
        let layout = Layout::of(&masters(&[7000, 7001, 7002])).unwrap();
        assert_eq!(layout.resume(0), START);
        let second = layout.next(0, 0).unwrap();
        assert_ne!(second, 0);
        assert_eq!(
            layout.resume(second),
            Position {
                master: 1,
                node_cursor: 0
            }
        );
        assert_eq!(layout.next(2, 0).unwrap(), 0);
    }

    #[test]
    fn one_master_ends_when_its_scan_ends() {
        let layout = Layout::of(&masters(&[7000])).unwrap();
        assert_eq!(layout.next(0, 0).unwrap(), 0);
        let more = layout.next(0, 17).unwrap();
        assert_eq!(
            layout.resume(more),
            Position {
                master: 0,
                node_cursor: 17
            }
        );
    }

    #[test]
    fn a_cursor_made_for_other_masters_restarts_from_the_first() {
        let before = Layout::of(&masters(&[7000, 7001, 7002])).unwrap();
        let after = Layout::of(&masters(&[7000, 7001, 7005])).unwrap();
        assert_ne!(before, after);
        let cursor = before.next(1, 99).unwrap();
        assert_eq!(after.resume(cursor), START);
        // Fewer masters: an index past the end restarts too, whatever its fingerprint.
        let fewer = Layout::of(&masters(&[7000, 7001])).unwrap();
        let forged = fewer.print << INDEX_BITS | 2;
        assert_eq!(fewer.resume(forged), START);
    }

    #[test]
    fn a_node_cursor_too_large_to_carry_is_an_error() {
        let layout = Layout::of(&masters(&[7000, 7001])).unwrap();
        assert_eq!(
            layout.next(0, MAX_NODE_CURSOR + 1),
            Err(CursorError::NodeCursorTooLarge(MAX_NODE_CURSOR + 1))
        );
        assert!(layout.next(0, MAX_NODE_CURSOR).is_ok());
    }

    #[test]
    fn more_masters_than_the_index_holds_are_refused() {
        let many: Vec<u16> = (0..=MAX_MASTERS as u16).collect();
        assert_eq!(
            Layout::of(&masters(&many)),
            Err(CursorError::TooManyMasters(MAX_MASTERS + 1))
        );
    }

    proptest! {
        /// Every cursor handed out resumes where it was made, on the same masters.
        #[test]
        fn a_cursor_resumes_where_it_was_made(
            count in 1usize..64,
            master in 0usize..64,
            node_cursor in 1u64..=MAX_NODE_CURSOR,
        ) {
            let ports: Vec<u16> = (0..count as u16).map(|n| 7000 + n).collect();
            let layout = Layout::of(&masters(&ports)).unwrap();
            let master = master % count;
            let cursor = layout.next(master, node_cursor).unwrap();
            prop_assert_ne!(cursor, 0);
            prop_assert_eq!(layout.resume(cursor), Position { master, node_cursor });
        }
    }
}
