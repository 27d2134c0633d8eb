//! The identifiers of a thread and of its messages, as types of their own, so that one is never
//! passed where another is meant (a leaf: it names nothing else of the crate).
//!
//! A thread has two: the [`ThreadId`] its client chose (or that was generated for it), unique
//! within its tenant, which requests name it by; and the [`ThreadKey`] minted with it, which every
//! table of thread data is keyed by. The key is opaque and never leaves the server: a thread
//! deleted and created again under the same id gets another key, so nothing stored or cached for
//! the old one is taken for the new one. The store finds a thread's key from its tenant and id
//! (`Store::thread_head`); nothing derives one from the other.

use std::fmt;

use serde::{Deserialize, Serialize};

/// The id a thread is known by to its client, unique within its tenant: the `{thread_id}` of the
/// paths. On the wire it is a plain string.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct ThreadId(String);

impl ThreadId {
    /// The id a request or a caller names (checked, where it must be, by whoever reads it).
    pub fn new(id: impl Into<String>) -> Self {
        ThreadId(id.into())
    }

    /// A fresh id for a thread created without one.
    pub fn generate() -> Self {
        ThreadId(format!("thr_{}", uuid::Uuid::now_v7().simple()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    pub fn into_string(self) -> String {
        self.0
    }
}

impl From<&str> for ThreadId {
    fn from(id: &str) -> Self {
        ThreadId::new(id)
    }
}

impl From<String> for ThreadId {
    fn from(id: String) -> Self {
        ThreadId(id)
    }
}

impl fmt::Display for ThreadId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl PartialEq<str> for ThreadId {
    fn eq(&self, other: &str) -> bool {
        self.0 == other
    }
}

impl PartialEq<&str> for ThreadId {
    fn eq(&self, other: &&str) -> bool {
        self.0 == *other
    }
}

impl PartialEq<String> for ThreadId {
    fn eq(&self, other: &String) -> bool {
        &self.0 == other
    }
}

/// A thread's internal key: what every table of thread data is keyed by. Minted once, when the
/// thread is created, and otherwise only read back from the database.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ThreadKey(String);

impl ThreadKey {
    /// The key of a thread being created: a time-ordered UUID, so new threads' rows go in order.
    pub(crate) fn mint() -> Self {
        ThreadKey(uuid::Uuid::now_v7().to_string())
    }

    /// A key as stored in a `thread_key` column.
    pub(crate) fn from_stored(key: String) -> Self {
        ThreadKey(key)
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for ThreadKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl PartialEq<str> for ThreadKey {
    fn eq(&self, other: &str) -> bool {
        self.0 == other
    }
}

impl PartialEq<&str> for ThreadKey {
    fn eq(&self, other: &&str) -> bool {
        self.0 == *other
    }
}

/// A message's place in its thread: 0 for the first, then one more for each message appended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Seq(i64);

impl Seq {
    pub const fn new(seq: i64) -> Self {
        Seq(seq)
    }

    pub const fn get(self) -> i64 {
        self.0
    }
}

impl fmt::Display for Seq {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_thread_id_is_a_plain_string_on_the_wire() {
        let id = ThreadId::new("support-4711");
        assert_eq!(serde_json::to_string(&id).unwrap(), r#""support-4711""#);
        let back: ThreadId = serde_json::from_str(r#""support-4711""#).unwrap();
        assert_eq!(back, id);
        assert_eq!(id.to_string(), "support-4711");
    }

    #[test]
    fn minted_keys_and_generated_ids_are_fresh() {
        assert_ne!(ThreadKey::mint(), ThreadKey::mint());
        let id = ThreadId::generate();
        assert!(id.as_str().starts_with("thr_"));
        assert_ne!(id, ThreadId::generate());
    }
}
