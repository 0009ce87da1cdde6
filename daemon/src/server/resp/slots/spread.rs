//! Where a keyless command goes in a cluster: to any master, as most do (`PING`, `INFO`, `TIME`),
//! or to every master where its meaning is the whole data set or state every node must hold, with
//! the replies combined into one. `DBSIZE`, `KEYS`, `RANDOMKEY` and the flushes never come here:
//! the daemon serves them over the caller's keys on every master (`keyspace.rs`).

use super::combine::Combine;

/// Which masters a keyless command is sent to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Spread {
    AnyMaster,
    /// Every master, the replies (in the order the masters were asked) combined so.
    EveryMaster(Combine),
}

/// Where the keyless command `name` (the catalog's: `DBSIZE`, `SCRIPT|LOAD`) is sent.
pub fn spread(name: &str) -> Spread {
    use Combine::*;
    match name {
        // Scripts and functions live on each node, and EVALSHA or FCALL runs on whichever master
        // its keys' slot is on: every master must hold the same ones, loaded and flushed alike.
        // A failure on one master may leave the others changed; the client gets that error.
        "SCRIPT|LOAD" | "FUNCTION|LOAD" => Spread::EveryMaster(Same),
        "SCRIPT|EXISTS" => Spread::EveryMaster(EveryHas),
        "SCRIPT|FLUSH" | "FUNCTION|FLUSH" | "FUNCTION|DELETE" | "FUNCTION|RESTORE" => {
            Spread::EveryMaster(AllOk)
        }
        // WAIT counts the replicas that acknowledged the writes made before it on its connection;
        // a client's writes went to whichever masters their slots are on, so what holds for all
        // of them is the least count. A master the client did not write to answers at once.
        "WAIT" => Spread::EveryMaster(Least),
        // CONFIG SET stays on one master: settings are per node and some differ between nodes by
        // design (ports, paths, memory); changing every node is an operator's cluster-wide step,
        // and half applied it would leave the nodes differing with no reply saying which.
        _ => Spread::AnyMaster,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn whole_data_set_and_per_node_state_commands_go_to_every_master() {
        for (name, combine) in [
            ("SCRIPT|LOAD", Combine::Same),
            ("SCRIPT|EXISTS", Combine::EveryHas),
            ("SCRIPT|FLUSH", Combine::AllOk),
            ("FUNCTION|LOAD", Combine::Same),
            ("FUNCTION|FLUSH", Combine::AllOk),
            ("FUNCTION|DELETE", Combine::AllOk),
            ("FUNCTION|RESTORE", Combine::AllOk),
            ("WAIT", Combine::Least),
        ] {
            assert_eq!(spread(name), Spread::EveryMaster(combine), "{name}");
        }
    }

    #[test]
    fn every_other_keyless_command_goes_to_any_master() {
        for name in [
            "PING",
            "INFO",
            "TIME",
            "CONFIG|SET",
            "CONFIG|GET",
            "FUNCTION|LIST",
        ] {
            assert_eq!(spread(name), Spread::AnyMaster, "{name}");
        }
    }
}
