//! Which stored entries ever reach the model.
//!
//! One predicate, [`is_sent_to_model`], decides it for everything that needs to know without
//! normalizing a whole context (the summary tree gives such entries no line of their own). It
//! agrees with what normalization sends (`normalize::convert`): user, assistant and attachment
//! messages, and a `local_command` system entry's output; never progress events, other system
//! records (compact boundaries, snips), virtual entries or synthetic API-error entries. A kind
//! Loupe does not know is bookkeeping until proven otherwise: not sent.

use super::model::{subtype, Entry, EntryKind};

/// Whether the entry is ever part of what the model reads.
pub fn is_sent_to_model(entry: &Entry) -> bool {
    if entry.is_virtual || entry.is_api_error_message() || entry.is_erased() {
        return false;
    }
    match entry.kind {
        EntryKind::User | EntryKind::Assistant | EntryKind::Attachment => entry.message.is_some(),
        EntryKind::System => entry.subtype.as_deref() == Some(subtype::LOCAL_COMMAND),
        // Listed rather than matched by `_`, so a new kind has to be decided here.
        EntryKind::Progress => false,
        // Types Loupe does not model (file-history-snapshot, queue-operation, …) are kept,
        // never sent.
        EntryKind::Other => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    fn entry(value: Value) -> Entry {
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn messages_and_command_output_are_sent_bookkeeping_is_not() {
        let sent = [
            json!({"type": "user", "message": {"role": "user", "content": "hi"}}),
            json!({"type": "assistant", "message": {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "hm", "signature": "s"}]}}),
            json!({"type": "attachment", "message": {"role": "user", "content": "file"}}),
            json!({"type": "system", "subtype": "local_command", "content": "ok"}),
        ];
        for value in sent {
            assert!(is_sent_to_model(&entry(value.clone())), "{value}");
        }
        let never = [
            json!({"type": "progress", "data": {"step": 1}}),
            json!({"type": "system", "subtype": "compact_boundary"}),
            json!({"type": "system", "subtype": "informational", "content": "x"}),
            json!({"type": "user", "is_virtual": true,
                   "message": {"role": "user", "content": "shown to people only"}}),
            json!({"type": "assistant", "is_api_error": true,
                   "message": {"role": "assistant", "content": "API Error: 529"}}),
            json!({"type": "attachment"}),
        ];
        for value in never {
            assert!(!is_sent_to_model(&entry(value.clone())), "{value}");
        }
    }
}
