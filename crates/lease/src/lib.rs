//! Leases that can protect correctness: owner tokens, replay, fencing tokens, waiting, watchdog.
