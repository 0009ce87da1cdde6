//! A view of the WIT `argv` record. `spans` holds three numbers per argument: where it ends in
//! `bytes`, how long it was before the host cut it to a prefix (keys are never cut), and, for a key,
//! how the command uses it. A guard's batch packs the arguments of several commands one after
//! another; [`Args::split`] gives each its own view, numbered from its name.

/// Numbers per argument in `spans`.
const SPAN: usize = 3;

/// The packed arguments of one command (or of a whole batch), borrowed from the generated `Argv`.
#[derive(Clone, Copy)]
pub struct Args<'a> {
    bytes: &'a [u8],
    /// Where this view's argument 0 starts in `bytes`.
    start: usize,
    spans: &'a [u32],
}

/// How a command uses one of its keys: the bits of the WIT `access` flags.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KeyUse(u32);

impl KeyUse {
    pub fn reads(self) -> bool {
        self.0 & 1 != 0
    }

    pub fn writes(self) -> bool {
        self.0 & 2 != 0
    }
}

impl<'a> Args<'a> {
    /// `Args::new(&argv.bytes, &argv.spans)`.
    pub fn new(bytes: &'a [u8], spans: &'a [u32]) -> Args<'a> {
        Args {
            bytes,
            start: 0,
            spans,
        }
    }

    /// Splits a batch's arguments by command: `counts` gives, per command, how many arguments are
    /// its own (the WIT `batched` record's `args`). Stops early at a count that overruns the batch,
    /// so a guard answering one verdict per item gives the host a count it rejects.
    pub fn split(self, counts: impl IntoIterator<Item = u32>) -> impl Iterator<Item = Args<'a>> {
        let mut arg = 0usize;
        counts.into_iter().map_while(move |args| {
            let args = args as usize;
            let view = Args {
                bytes: self.bytes,
                start: self.start(arg)?,
                spans: self.spans.get(arg * SPAN..(arg + args) * SPAN)?,
            };
            arg += args;
            Some(view)
        })
    }

    /// How many arguments, the name included.
    pub fn count(&self) -> usize {
        self.spans.len() / SPAN
    }

    /// What crossed of argument `i`: all of it, or its first bytes when [`Args::is_cut`].
    pub fn get(&self, i: usize) -> Option<&'a [u8]> {
        let end = *self.spans.get(i * SPAN)? as usize;
        self.bytes.get(self.start(i)?..end)
    }

    /// Argument `i`'s full length.
    pub fn len(&self, i: usize) -> Option<u32> {
        self.spans.get(i * SPAN + 1).copied()
    }

    /// How the command uses argument `i`; `None` when it is not a key.
    pub fn key_use(&self, i: usize) -> Option<KeyUse> {
        self.spans
            .get(i * SPAN + 2)
            .filter(|&&bits| bits != 0)
            .map(|&bits| KeyUse(bits))
    }

    /// The command's keys, in argument order: position, key and how it is used.
    pub fn keys(&self) -> impl Iterator<Item = (usize, &'a [u8], KeyUse)> + 'a {
        // One pass over the spans, each argument's start being the previous one's end.
        let (bytes, mut start) = (self.bytes, self.start);
        self.spans
            .chunks_exact(SPAN)
            .enumerate()
            .filter_map(move |(i, span)| {
                let (from, end, using) = (start, span[0] as usize, span[2]);
                start = end;
                if i == 0 || using == 0 {
                    return None;
                }
                Some((i, bytes.get(from..end)?, KeyUse(using)))
            })
    }

    /// Whether only a prefix of argument `i` crossed.
    pub fn is_cut(&self, i: usize) -> bool {
        match (self.get(i), self.len(i)) {
            (Some(crossed), Some(len)) => crossed.len() != len as usize,
            _ => false,
        }
    }

    /// Argument `i` when all of it crossed; keywords, numbers and keys always do.
    pub fn whole(&self, i: usize) -> Option<&'a [u8]> {
        self.get(i).filter(|_| !self.is_cut(i))
    }

    /// Where argument `i` starts in `bytes`.
    fn start(&self, i: usize) -> Option<usize> {
        match i {
            0 => Some(self.start),
            _ => self.spans.get((i - 1) * SPAN).map(|&end| end as usize),
        }
    }
}
