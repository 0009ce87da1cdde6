//! A view of the WIT `argv` record: argument `i` is `bytes[ends[i-1] .. ends[i]]`, and was
//! `lens[i]` bytes long before the host cut it to a prefix (keys are never cut).

/// The packed arguments of one command, borrowed from the generated `Argv`.
#[derive(Clone, Copy)]
pub struct Args<'a> {
    bytes: &'a [u8],
    ends: &'a [u32],
    lens: &'a [u32],
}

impl<'a> Args<'a> {
    /// `Args::new(&argv.bytes, &argv.ends, &argv.lens)`.
    pub fn new(bytes: &'a [u8], ends: &'a [u32], lens: &'a [u32]) -> Args<'a> {
        Args { bytes, ends, lens }
    }

    /// How many arguments, the name included.
    pub fn count(&self) -> usize {
        self.ends.len()
    }

    /// What crossed of argument `i`: all of it, or its first bytes when [`Args::is_cut`].
    pub fn get(&self, i: usize) -> Option<&'a [u8]> {
        let start = match i {
            0 => 0,
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
