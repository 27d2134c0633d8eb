//! Agent transcripts as JSON Lines (Claude Code's `.jsonl` session files): one entry per line.
//!
//! Pure: reading a line into an entry, naming the entries that carry no uuid, and telling which
//! sub-agent (sidechain) an entry belongs to. The importer (`crate::import`) does the I/O.

use serde_json::Value;
use sha2::{Digest, Sha256};

use super::ingest::check_entry;
use super::model::Entry;

/// Why a line was refused; the import goes on with the next one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LineError {
    pub reason: String,
}

/// Reads one line (without its line break) into an entry that keeps the line as its sent text.
///
/// Entries without a `uuid` (`file-history-snapshot`, `queue-operation`, `summary`) get one
/// derived from the previous entry's uuid and the line itself, so re-importing the same file
/// names them the same way and stays idempotent, while identical lines at different places get
/// different names. The derived uuid lives in the store's column; the stored body stays the line.
pub fn read_line(line: &str, previous_uuid: &str) -> Result<Entry, LineError> {
    let mut entry: Entry = serde_json::from_str(line).map_err(|e| LineError {
        reason: format!("not a valid entry: {e}"),
    })?;
    if entry.uuid.is_none() {
        entry.uuid = Some(derived_uuid(previous_uuid, line));
    }
    check_entry(&entry, "entry").map_err(|e| LineError {
        reason: e.to_string(),
    })?;
    entry.sent = Some(line.to_owned());
    Ok(entry)
}

/// `line-` and 32 hex digits of SHA-256(previous uuid, NUL, line).
pub fn derived_uuid(previous_uuid: &str, line: &str) -> String {
    let mut hash = Sha256::new();
    hash.update(previous_uuid.as_bytes());
    hash.update([0]);
    hash.update(line.as_bytes());
    format!("line-{}", &hex::encode(hash.finalize())[..32])
}

/// The sub-agent an entry belongs to: `Some(agent)` for a sidechain entry (`isSidechain: true`),
/// named by its `agentId` (or `sidechain` when it has none); `None` for the main thread.
pub fn sidechain_agent(entry: &Entry) -> Option<String> {
    if entry.extra.get("isSidechain").and_then(Value::as_bool) != Some(true) {
        return None;
    }
    let agent = entry
        .extra
        .get("agentId")
        .and_then(Value::as_str)
        .filter(|id| !id.is_empty())
        .unwrap_or("sidechain");
    Some(agent.to_owned())
}

/// The thread a sub-agent's entries go to: `<thread>.agent-<agent>`, keeping only the characters
/// a thread id may hold. An agent id that had to change (another character, or past 64) gets a
/// hash of itself, so two agents never share a thread (`a/b` and `a-b` would).
pub fn sidechain_thread_id(thread_id: &str, agent: &str) -> String {
    let kept: String = agent
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '-'
            }
        })
        .take(64)
        .collect();
    if kept == agent {
        return format!("{thread_id}.agent-{kept}");
    }
    use sha2::Digest;
    let digest = hex::encode(&sha2::Sha256::digest(agent.as_bytes())[..6]);
    format!("{thread_id}.agent-{kept}-{digest}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::model::EntryKind;

    #[test]
    fn a_line_keeps_its_exact_text_and_its_camel_case_flags() {
        let line = r#"{"parentUuid":null,"isMeta":true,"type":"user","message":{"role":"user","content":"x"},"uuid":"u1"}"#;
        let entry = read_line(line, "").unwrap();
        assert!(entry.is_meta);
        assert_eq!(entry.sent.as_deref(), Some(line));
        assert_eq!(entry.uuid.as_deref(), Some("u1"));
    }

    #[test]
    fn entries_without_uuid_get_a_stable_one_that_depends_on_their_place() {
        let line = r#"{"type":"queue-operation","operation":"enqueue","timestamp":"2026-01-01T00:00:00Z"}"#;
        let a = read_line(line, "u1").unwrap();
        let again = read_line(line, "u1").unwrap();
        let elsewhere = read_line(line, a.uuid.as_deref().unwrap()).unwrap();
        assert_eq!(a.kind, EntryKind::Other);
        assert_eq!(a.type_name(), "queue-operation");
        assert_eq!(a.uuid, again.uuid);
        assert_ne!(a.uuid, elsewhere.uuid);
    }

    #[test]
    fn bad_lines_say_why() {
        assert!(read_line("{not json", "").is_err());
        let error = read_line(r#"{"type":"user","uuid":"u"}"#, "").unwrap_err();
        assert!(error.reason.contains("message"), "{}", error.reason);
    }

    #[test]
    fn sidechains_are_named_by_their_agent() {
        let entry = |v: Value| -> Entry { serde_json::from_value(v).unwrap() };
        let main = entry(serde_json::json!({"type": "progress", "isSidechain": false}));
        assert_eq!(sidechain_agent(&main), None);
        let side =
            entry(serde_json::json!({"type": "progress", "isSidechain": true, "agentId": "a1b2"}));
        assert_eq!(sidechain_agent(&side).as_deref(), Some("a1b2"));
        assert_eq!(sidechain_thread_id("t", "a1b2"), "t.agent-a1b2");
        let folded = ["a/b", "a\0b", "a-b", "a b"].map(|agent| sidechain_thread_id("t", agent));
        assert!(folded[0].starts_with("t.agent-a-b-"), "{}", folded[0]);
        assert_eq!(folded[2], "t.agent-a-b");
        for (i, a) in folded.iter().enumerate() {
            for b in &folded[i + 1..] {
                assert_ne!(a, b, "two agents share a thread");
            }
        }
        let long = "x".repeat(80);
        assert_ne!(
            sidechain_thread_id("t", &long),
            sidechain_thread_id("t", &"x".repeat(81))
        );
    }
}
