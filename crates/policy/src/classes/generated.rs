//! Seeded policies for the property test of the classes and for the diff benchmark
//! (`benches/diff.rs`): the same seed gives the same policy on every run.

/// A small deterministic generator (xorshift).
pub struct Draw(pub u64);

impl Draw {
    /// The next 64 random bits.
    pub fn bits(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// A number below `n` (0 when `n` is 0).
    pub fn below(&mut self, n: usize) -> usize {
        (self.bits() % n.max(1) as u64) as usize
    }
}

/// A policy of `rules` rules (commands by name and category, keys and lease resources from
/// overlapping globs, five principals by uid and gid, allow and deny) drawn from `seed`. Key
/// globs fall under `prefixes` prefixes (`k0`, `k1` …), nine globs each, nested and overlapping.
pub fn policy(seed: u64, rules: usize, prefixes: usize) -> String {
    let mut draw = Draw(seed);
    const GLOBS: &[&str] = &[
        "*", "a*", "a:?*", "a:[0-4]*", "b*", "ab*", "*:x", "[^a]*", "t*",
    ];
    const COMMANDS: &[&str] = &[
        "GET",
        "MGET",
        "SET",
        "MSET",
        "DEL",
        "'@string'",
        "'@list'",
        "'@hash'",
        "INFO",
        "PING",
    ];
    let mut out = String::from("principals:\n");
    for p in 0..4 {
        out.push_str(&format!("  p{p}: {{ uids: [{}] }}\n", 3000 + p));
    }
    out.push_str("  g0: { gids: [4000] }\nrules:\n");
    for r in 0..rules {
        let glob_a = format!(
            "k{}{}",
            draw.below(prefixes),
            GLOBS[draw.below(GLOBS.len())]
        );
        let glob_b = GLOBS[draw.below(GLOBS.len())];
        let command = COMMANDS[draw.below(COMMANDS.len())];
        let principal = match draw.below(6) {
            0 => String::new(),
            n => format!(
                "    principals: [{}]\n",
                if n == 5 {
                    "g0".to_owned()
                } else {
                    format!("p{}", n - 1)
                }
            ),
        };
        let keys = match draw.below(3) {
            0 => String::new(),
            1 => format!("    keys: ['{glob_a}']\n"),
            _ => format!("    keys: ['{glob_a}', '{glob_b}']\n"),
        };
        let action = if draw.below(3) == 0 { "deny" } else { "allow" };
        if draw.below(8) == 0 {
            out.push_str(&format!(
                "  - id: r{r}\n{principal}    leases: ['{glob_a}']\n    {action}: drawn\n"
            ));
        } else {
            out.push_str(&format!(
                "  - id: r{r}\n{principal}    commands: [{command}]\n{keys}    {action}: drawn\n"
            ));
        }
    }
    out
}
