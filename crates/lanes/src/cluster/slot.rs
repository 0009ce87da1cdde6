//! Redis Cluster's key slots: CRC16 (XMODEM) of the key, or of its hash tag, modulo 16384. The
//! daemon computes a command's slot from the catalog's keys before anything is sent, so that it
//! routes and refuses cross-slot requests itself (Redis's `keyHashSlot` in `cluster.c`).

use std::fmt;

/// How many slots a cluster has.
pub const SLOT_COUNT: u16 = 16384;

/// One of the 16384 slots.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Slot(pub(super) u16);

impl Slot {
    /// The slot of `key`: of the part between the first `{` and the next `}` when that part is not
    /// empty (a hash tag), of the whole key otherwise.
    pub fn of(key: &[u8]) -> Slot {
        Slot(crc16(hash_tag(key)) % SLOT_COUNT)
    }

    /// Slot `number`, if there is one.
    pub fn new(number: u16) -> Option<Slot> {
        (number < SLOT_COUNT).then_some(Slot(number))
    }

    pub fn number(self) -> u16 {
        self.0
    }
}

impl fmt::Display for Slot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// The bytes of `key` that decide its slot.
fn hash_tag(key: &[u8]) -> &[u8] {
    let Some(open) = key.iter().position(|&b| b == b'{') else {
        return key;
    };
    match key[open + 1..].iter().position(|&b| b == b'}') {
        Some(0) | None => key,
        Some(length) => &key[open + 1..open + 1 + length],
    }
}

/// CRC16-CCITT (XMODEM): polynomial 0x1021, initial value 0, no reflection.
fn crc16(bytes: &[u8]) -> u16 {
    bytes.iter().fold(0u16, |crc, &byte| {
        let mut crc = crc ^ (u16::from(byte) << 8);
        for _ in 0..8 {
            crc = match crc & 0x8000 {
                0 => crc << 1,
                _ => (crc << 1) ^ 0x1021,
            };
        }
        crc
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc16_is_xmodem() {
        // The check value of CRC-16/XMODEM, and Redis's own example in the cluster spec.
        assert_eq!(crc16(b"123456789"), 0x31C3);
    }

    #[test]
    fn slots_match_redis_cluster_keyslot() {
        // Values from `CLUSTER KEYSLOT` on Redis 7.0.
        for (key, slot) in [
            ("foo", 12182),
            ("bar", 5061),
            ("{user1000}.following", 3443),
            ("{user1000}.followers", 3443),
            ("", 0),
        ] {
            assert_eq!(Slot::of(key.as_bytes()).number(), slot, "{key}");
        }
    }

    #[test]
    fn only_a_non_empty_first_tag_counts() {
        assert_eq!(Slot::of(b"{}foo"), Slot(crc16(b"{}foo") % SLOT_COUNT));
        assert_eq!(
            Slot::of(b"foo{}{bar}"),
            Slot(crc16(b"foo{}{bar}") % SLOT_COUNT)
        );
        assert_eq!(Slot::of(b"foo{{bar}}zap"), Slot::of(b"{bar"));
        assert_eq!(Slot::of(b"foo{bar}{zap}"), Slot::of(b"bar"));
        assert_eq!(
            Slot::of(b"{unclosed"),
            Slot(crc16(b"{unclosed") % SLOT_COUNT)
        );
    }

    #[test]
    fn slot_numbers_stop_below_16384() {
        assert_eq!(Slot::new(16383).map(Slot::number), Some(16383));
        assert_eq!(Slot::new(16384), None);
    }
}
