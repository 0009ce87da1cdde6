//! A number of bytes as operators write it in YAML (`32MiB`), shared by the daemon's config and
//! the policy compiler so both read sizes the same way.

use std::fmt;

use serde::Deserialize;

/// A number of bytes: an integer, or a string such as `512KiB`, `32MiB`, `1GiB` (also `KB`, `MB`,
/// `GB` as Redis writes them, meaning the same powers of 1024). Zero means "no limit".
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct ByteSize(pub usize);

impl ByteSize {
    pub const fn mib(n: usize) -> Self {
        ByteSize(n * 1024 * 1024)
    }

    pub fn parse(text: &str) -> Option<ByteSize> {
        let text = text.trim();
        let digits = text
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(text.len());
        let (number, unit) = text.split_at(digits);
        let number: usize = number.parse().ok()?;
        let scale: usize = match unit.trim().to_ascii_lowercase().as_str() {
            "" | "b" => 1,
            "k" | "kb" | "kib" => 1 << 10,
            "m" | "mb" | "mib" => 1 << 20,
            "g" | "gb" | "gib" => 1 << 30,
            _ => return None,
        };
        number.checked_mul(scale).map(ByteSize)
    }
}

impl fmt::Display for ByteSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} bytes", self.0)
    }
}

impl<'de> Deserialize<'de> for ByteSize {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Written {
            Number(usize),
            Text(String),
        }
        match Written::deserialize(deserializer)? {
            Written::Number(bytes) => Ok(ByteSize(bytes)),
            Written::Text(text) => ByteSize::parse(&text).ok_or_else(|| {
                serde::de::Error::custom(format!(
                    "invalid size `{text}`: expected bytes or a number with KiB, MiB or GiB"
                ))
            }),
        }
    }
}
