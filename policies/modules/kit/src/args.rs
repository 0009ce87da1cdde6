//! A view of the WIT `argv` record: argument `i` is `bytes[ends[i-1] .. ends[i]]`, and was
//! `lens[i]` bytes long before the host cut it to a prefix (keys are never cut). A guard's batch
//! packs the arguments of several commands one after another; [`Args::split`] gives each its own
//! view, numbered from its name.

/// The packed arguments of one command (or of a whole batch), borrowed from the generated `Argv`.
#[derive(Clone, Copy)]
pub struct Args<'a> {
    bytes: &'a [u8],
    /// Where this view's argument 0 starts in `bytes`.
    start: usize,
    ends: &'a [u32],
    lens: &'a [u32],
}

impl<'a> Args<'a> {
    /// `Args::new(&argv.bytes, &argv.ends, &argv.lens)`.
    pub fn new(bytes: &'a [u8], ends: &'a [u32], lens: &'a [u32]) -> Args<'a> {
        Args {
            bytes,
            start: 0,
            ends,
            lens,
        }
    }

    /// Splits a batch's arguments and `keys` by command: `counts` gives, per command, how many
    /// arguments and keys are its own (the WIT `batched` record's `args` and `keys`). Yields each
    /// command's arguments and keys; stops early at counts that overrun the batch, so a guard
    /// answering one verdict per item gives the host a count it rejects.
    pub fn split<K>(
        self,
        counts: impl IntoIterator<Item = (u32, u32)>,
        keys: &'a [K],
    ) -> impl Iterator<Item = (Args<'a>, &'a [K])> {
        let (mut arg, mut key) = (0usize, 0usize);
        counts.into_iter().map_while(move |(args, count)| {
            let (args, count) = (args as usize, count as usize);
            let start = match arg {
                0 => self.start,
                _ => *self.ends.get(arg - 1)? as usize,
            };
            let view = Args {
                bytes: self.bytes,
                start,
                ends: self.ends.get(arg..arg + args)?,
                lens: self.lens.get(arg..arg + args)?,
            };
            let own = keys.get(key..key + count)?;
            (arg, key) = (arg + args, key + count);
            Some((view, own))
        })
    }

    /// How many arguments, the name included.
    pub fn count(&self) -> usize {
        self.ends.len()
    }

    /// What crossed of argument `i`: all of it, or its first bytes when [`Args::is_cut`].
    pub fn get(&self, i: usize) -> Option<&'a [u8]> {
        let start = match i {
            0 => self.start,
            _ => *self.ends.get(i - 1)? as usize,
        };
        self.bytes.get(start..*self.ends.get(i)? as usize)
    }

    /// Argument `i`'s full length.
    pub fn len(&self, i: usize) -> Option<u32> {
        self.lens.get(i).copied()
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
}
