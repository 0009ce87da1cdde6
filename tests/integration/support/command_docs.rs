//! Valid argument vectors for a Redis command, generated from the argument specs its server reports
//! in `COMMAND DOCS` (types, tokens, optional / multiple / multiple_token) with a seeded RNG:
//! optional arguments present or absent, repeats where the spec allows, options given twice,
//! tokens in either case (now and then with a NUL and more after it, which Redis's `strcasecmp`
//! does not see), and key counts such as `numkeys` at and past their edges.

use redis::Value;

/// One argument of a command's syntax.
#[derive(Debug, Clone)]
pub struct ArgSpec {
    pub kind: Kind,
    pub token: Option<String>,
    pub optional: bool,
    pub multiple: bool,
    pub multiple_token: bool,
    pub children: Vec<ArgSpec>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Key,
    String,
    Integer,
    Double,
    Pattern,
    UnixTime,
    PureToken,
    OneOf,
    Block,
}

/// A command or subcommand: the words that name it (`["OBJECT", "ENCODING"]`) and its syntax.
#[derive(Debug, Clone)]
pub struct CommandSpec {
    pub name: String,
    pub words: Vec<String>,
    pub args: Vec<ArgSpec>,
    /// Has subcommands (`OBJECT`): Redis answers for each of them, not for the container.
    pub container: bool,
}

/// Every command and subcommand of a `COMMAND DOCS` reply, containers included.
pub fn commands(docs: &Value) -> Vec<CommandSpec> {
    let mut out = Vec::new();
    for (name, doc) in pairs(docs) {
        collect(&name, doc, &mut out);
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out
}

fn collect(name: &str, doc: &Value, out: &mut Vec<CommandSpec>) {
    let fields = pairs(doc);
    let field = |wanted: &str| fields.iter().find(|(n, _)| n == wanted).map(|(_, v)| *v);
    out.push(CommandSpec {
        name: name.to_ascii_uppercase(),
        words: name.split('|').map(str::to_ascii_uppercase).collect(),
        args: field("arguments").map(arg_specs).unwrap_or_default(),
        container: field("subcommands").is_some(),
    });
    if let Some(subcommands) = field("subcommands") {
        for (sub, doc) in pairs(subcommands) {
            collect(&sub, doc, out);
        }
    }
}

fn arg_specs(list: &Value) -> Vec<ArgSpec> {
    let Value::Array(items) = list else {
        panic!("arguments is not an array: {list:?}")
    };
    items.iter().map(arg_spec).collect()
}

fn arg_spec(value: &Value) -> ArgSpec {
    let fields = pairs(value);
    let field = |wanted: &str| fields.iter().find(|(n, _)| n == wanted).map(|(_, v)| *v);
    let flags: Vec<String> = match field("flags") {
        Some(Value::Array(flags)) => flags.iter().map(string).collect(),
        _ => Vec::new(),
    };
    let kind = match field("type").map(string).as_deref() {
        Some("key") => Kind::Key,
        Some("string") => Kind::String,
        Some("integer") => Kind::Integer,
        Some("double") => Kind::Double,
        Some("pattern") => Kind::Pattern,
        Some("unix-time") => Kind::UnixTime,
        Some("pure-token") => Kind::PureToken,
        Some("oneof") => Kind::OneOf,
        Some("block") => Kind::Block,
        other => panic!("unknown argument type {other:?} in {value:?}"),
    };
    ArgSpec {
        kind,
        token: field("token").map(string),
        optional: flags.iter().any(|f| f == "optional"),
        multiple: flags.iter().any(|f| f == "multiple"),
        multiple_token: flags.iter().any(|f| f == "multiple_token"),
        children: field("arguments").map(arg_specs).unwrap_or_default(),
    }
}

/// A map reply as pairs, whether RESP3 sent a map or RESP2 a flat array.
fn pairs(value: &Value) -> Vec<(String, &Value)> {
    match value {
        Value::Map(map) => map.iter().map(|(k, v)| (string(k), v)).collect(),
        Value::Array(flat) => flat
            .chunks_exact(2)
            .map(|pair| (string(&pair[0]), &pair[1]))
            .collect(),
        other => panic!("not a map: {other:?}"),
    }
}

fn string(value: &Value) -> String {
    match value {
        Value::BulkString(bytes) => String::from_utf8_lossy(bytes).into_owned(),
        Value::SimpleString(text) => text.clone(),
        Value::Int(n) => n.to_string(),
        other => panic!("not a string: {other:?}"),
    }
}

/// SplitMix64: small, seedable, the same sequence on every machine.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    /// True `percent` times in a hundred.
    pub fn chance(&mut self, percent: usize) -> bool {
        self.below(100) < percent
    }

    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }
}

/// Builds one argument vector; every key and string it makes up is unique within the vector.
pub struct Generator<'a> {
    rng: &'a mut Rng,
    out: Vec<Vec<u8>>,
    serial: usize,
    /// The command's tokens, now and then used as a key or string (`STORE` as a key's name).
    tokens: Vec<String>,
}

impl<'a> Generator<'a> {
    pub fn argv(rng: &'a mut Rng, command: &CommandSpec) -> Vec<Vec<u8>> {
        let mut tokens = Vec::new();
        gather_tokens(&command.args, &mut tokens);
        let mut generator = Generator {
            rng,
            out: Vec::new(),
            serial: 0,
            tokens,
        };
        for word in &command.words {
            let word = generator.cased(word);
            generator.out.push(word.into_bytes());
        }
        generator.args(&command.args);
        generator.out
    }

    fn args(&mut self, args: &[ArgSpec]) {
        // Sibling lists repeat together (XREAD's keys and IDs, one ID per key).
        let together = 1 + self.rng.below(3);
        let mut i = 0;
        while i < args.len() {
            let arg = &args[i];
            let counted = args.get(i + 1).filter(|next| {
                arg.kind == Kind::Integer
                    && arg.token.is_none()
                    && next.kind == Kind::Key
                    && next.multiple
            });
            if let Some(keys) = counted {
                self.counted_keys(keys);
                i += 2;
                continue;
            }
            self.arg(arg, together);
            i += 1;
        }
    }

    /// A count such as `numkeys` and the keys it counts: mostly right, sometimes at or past its
    /// edges (zero, one too many or too few, signs, blanks, numbers that overflow a C `int`).
    fn counted_keys(&mut self, keys: &ArgSpec) {
        let count = if keys.optional && self.rng.chance(25) {
            0
        } else {
            1 + self.rng.below(4)
        };
        let said = if self.rng.chance(70) {
            count.to_string()
        } else {
            let edges = [
                "0".to_owned(),
                (count + 1).to_string(),
                count.saturating_sub(1).to_string(),
                "-1".to_owned(),
                format!("+{count}"),
                format!(" {count}"),
                format!("0{count}"),
                format!("{count}x"),
                "4294967296".to_owned(),
                format!("{}", 4_294_967_296u64 + count as u64),
                "-4294967295".to_owned(),
                "99999999999999999999".to_owned(),
                String::new(),
            ];
            self.rng.pick(&edges).clone()
        };
        self.out.push(said.into_bytes());
        for _ in 0..count {
            let key = self.value(Kind::Key);
            self.out.push(key);
        }
    }

    fn arg(&mut self, arg: &ArgSpec, together: usize) {
        if arg.optional && self.rng.chance(45) {
            return;
        }
        // An option given twice (`STORE a STORE b`): Redis takes one of them, usually the last.
        let twice = !arg.multiple && arg.optional && arg.token.is_some() && self.rng.chance(15);
        let times = match (arg.multiple, twice) {
            (true, _) if arg.token.is_none() => together,
            (true, _) => 1 + self.rng.below(3),
            (false, true) => 2,
            (false, false) => 1,
        };
        for time in 0..times {
            if let Some(token) = &arg.token {
                if time == 0 || arg.multiple_token || twice {
                    let token = self.token(token);
                    self.out.push(token);
                }
            }
            match arg.kind {
                Kind::PureToken => {}
                Kind::OneOf => {
                    let child = self.rng.pick(&arg.children).clone();
                    self.arg(
                        &ArgSpec {
                            optional: false,
                            ..child
                        },
                        together,
                    );
                }
                Kind::Block => self.args(&arg.children),
                kind => {
                    let value = self.value(kind);
                    self.out.push(value);
                }
            }
        }
    }

    fn value(&mut self, kind: Kind) -> Vec<u8> {
        self.serial += 1;
        let serial = self.serial;
        let hostile = !self.tokens.is_empty() && self.rng.chance(4);
        match kind {
            Kind::Key | Kind::String if hostile => {
                let token = self.rng.pick(&self.tokens).clone();
                token.into_bytes()
            }
            Kind::Key => format!("k{serial}").into_bytes(),
            Kind::String => format!("s{serial}").into_bytes(),
            Kind::Pattern => format!("p{serial}*").into_bytes(),
            Kind::Integer => self
                .rng
                .pick(&["0", "1", "2", "3", "10", "-1"])
                .as_bytes()
                .to_vec(),
            Kind::Double => self.rng.pick(&["0", "1.5", "-2.5"]).as_bytes().to_vec(),
            Kind::UnixTime => b"1700000000".to_vec(),
            Kind::PureToken | Kind::OneOf | Kind::Block => unreachable!("{kind:?} has no value"),
        }
    }

    fn token(&mut self, token: &str) -> Vec<u8> {
        let mut bytes = self.cased(token).into_bytes();
        if !token.is_empty() && self.rng.chance(4) {
            bytes.extend_from_slice(b"\0tail");
        }
        bytes
    }

    fn cased(&mut self, word: &str) -> String {
        match self.rng.below(3) {
            0 => word.to_ascii_uppercase(),
            1 => word.to_ascii_lowercase(),
            _ => word
                .chars()
                .enumerate()
                .map(|(i, c)| {
                    if i % 2 == 0 {
                        c.to_ascii_lowercase()
                    } else {
                        c.to_ascii_uppercase()
                    }
                })
                .collect(),
        }
    }
}

fn gather_tokens(args: &[ArgSpec], out: &mut Vec<String>) {
    for arg in args {
        if let Some(token) = arg.token.as_ref().filter(|t| !t.is_empty()) {
            if !out.contains(token) {
                out.push(token.clone());
            }
        }
        gather_tokens(&arg.children, out);
    }
}
