//! Redis ACL categories as a bit set whose bit order is the order of the `categories` flags in
//! `wit/policy.wit`, so a guest can take `categories.bits()` as it is.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Category {
    Keyspace,
    Read,
    Write,
    Set,
    Sortedset,
    List,
    Hash,
    String,
    Bitmap,
    Hyperloglog,
    Geo,
    Stream,
    Pubsub,
    Admin,
    Fast,
    Slow,
    Blocking,
    Dangerous,
    Connection,
    Transaction,
    Scripting,
}

impl Category {
    /// Every category in bit order.
    pub const ALL: [Category; 21] = [
        Category::Keyspace,
        Category::Read,
        Category::Write,
        Category::Set,
        Category::Sortedset,
        Category::List,
        Category::Hash,
        Category::String,
        Category::Bitmap,
        Category::Hyperloglog,
        Category::Geo,
        Category::Stream,
        Category::Pubsub,
        Category::Admin,
        Category::Fast,
        Category::Slow,
        Category::Blocking,
        Category::Dangerous,
        Category::Connection,
        Category::Transaction,
        Category::Scripting,
    ];

    /// The name Redis uses, without the `@`.
    pub fn as_str(self) -> &'static str {
        match self {
            Category::Keyspace => "keyspace",
            Category::Read => "read",
            Category::Write => "write",
            Category::Set => "set",
            Category::Sortedset => "sortedset",
            Category::List => "list",
            Category::Hash => "hash",
            Category::String => "string",
            Category::Bitmap => "bitmap",
            Category::Hyperloglog => "hyperloglog",
            Category::Geo => "geo",
            Category::Stream => "stream",
            Category::Pubsub => "pubsub",
            Category::Admin => "admin",
            Category::Fast => "fast",
            Category::Slow => "slow",
            Category::Blocking => "blocking",
            Category::Dangerous => "dangerous",
            Category::Connection => "connection",
            Category::Transaction => "transaction",
            Category::Scripting => "scripting",
        }
    }

    pub fn from_name(name: &str) -> Option<Category> {
        Category::ALL
            .into_iter()
            .find(|category| category.as_str().eq_ignore_ascii_case(name))
    }

    fn bit(self) -> u32 {
        1 << (self as u32)
    }
}

/// A set of categories; bit `i` is `Category::ALL[i]`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct CategorySet(pub u32);

impl CategorySet {
    pub fn with(self, category: Category) -> CategorySet {
        CategorySet(self.0 | category.bit())
    }

    pub fn contains(self, category: Category) -> bool {
        self.0 & category.bit() != 0
    }

    pub fn intersects(self, other: CategorySet) -> bool {
        self.0 & other.0 != 0
    }

    pub fn iter(self) -> impl Iterator<Item = Category> {
        Category::ALL
            .into_iter()
            .filter(move |category| self.contains(*category))
    }
}

impl FromIterator<Category> for CategorySet {
    fn from_iter<I: IntoIterator<Item = Category>>(iter: I) -> Self {
        iter.into_iter()
            .fold(CategorySet::default(), CategorySet::with)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bits_follow_declaration_order() {
        for (index, category) in Category::ALL.into_iter().enumerate() {
            assert_eq!(category as usize, index);
            assert_eq!(Category::from_name(category.as_str()), Some(category));
        }
        let set: CategorySet = [Category::Read, Category::Scripting].into_iter().collect();
        assert_eq!(set.0, 0b10 | 1 << 20);
        assert_eq!(
            set.iter().collect::<Vec<_>>(),
            [Category::Read, Category::Scripting]
        );
    }
}
