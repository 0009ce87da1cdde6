//! How two globs' key sets relate: whether they share a key, and whether one holds every key of
//! the other. The walk is the policy rules' own ([`tollgate_policy_rules::relation`]), which
//! admission also uses on channel patterns: one algebra for keys and channels.

pub use tollgate_policy_rules::relation::relate;
