//! What an entry must satisfy to be stored.
//!
//! Only the shape is checked (types, roles, JSON structure): a history that breaks provider rules
//! (a missing tool result, an orphan, a duplicate id) is stored as it is and repaired when read,
//! because that is exactly what an agent loop produces after a crash.

use serde_json::Value;

use super::model::{ApiMessage, Content, Entry, EntryKind, Role};

/// Longest accepted uuid, in characters.
pub const MAX_UUID_LEN: usize = 200;

/// Longest accepted subtype, in characters.
pub const MAX_SUBTYPE_LEN: usize = 100;

/// Longest accepted entry type, in characters.
pub const MAX_TYPE_LEN: usize = 100;

/// A field that is not valid, named by its JSON path (`messages[3].message.content[0].type`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{path}: {problem}")]
pub struct FieldError {
    pub path: String,
    pub problem: String,
}

impl FieldError {
    fn new(path: String, problem: impl Into<String>) -> Self {
        FieldError {
            path,
            problem: problem.into(),
        }
    }
}

/// Checks one entry; `path` names it in the request (`messages[3]`).
pub fn check_entry(entry: &Entry, path: &str) -> Result<(), FieldError> {
    if let Some(uuid) = &entry.uuid {
        // Characters, as JSON Schema's `maxLength` counts them.
        if uuid.is_empty() || uuid.chars().count() > MAX_UUID_LEN || uuid.contains('\0') {
            return Err(FieldError::new(
                format!("{path}.uuid"),
                format!("must be 1 to {MAX_UUID_LEN} characters, without NUL characters"),
            ));
        }
    }
    // The type is stored in its own column (PostgreSQL's TEXT cannot hold a NUL).
    let type_name = entry.type_name();
    if type_name.chars().count() > MAX_TYPE_LEN || type_name.contains('\0') {
        return Err(FieldError::new(
            format!("{path}.type"),
            format!("must be at most {MAX_TYPE_LEN} characters, without NUL characters"),
        ));
    }
    // The subtype is stored in its own column and looked up by value.
    if let Some(subtype) = &entry.subtype {
        if subtype.chars().count() > MAX_SUBTYPE_LEN || subtype.contains('\0') {
            return Err(FieldError::new(
                format!("{path}.subtype"),
                format!("must be at most {MAX_SUBTYPE_LEN} characters, without NUL characters"),
            ));
        }
    }
    // The document gives both as objects; null reads as absent.
    if entry
        .compact_metadata
        .as_ref()
        .is_some_and(|m| !m.is_object())
    {
        return Err(FieldError::new(
            format!("{path}.compact_metadata"),
            "must be an object",
        ));
    }
    if let Some(usage) = entry.message.as_ref().and_then(|m| m.usage.as_ref()) {
        if !usage.is_object() {
            return Err(FieldError::new(
                format!("{path}.message.usage"),
                "must be an object",
            ));
        }
    }
    match entry.kind {
        EntryKind::User | EntryKind::Attachment => {
            check_message(entry.message.as_ref(), Role::User, entry.kind, path)
        }
        EntryKind::Assistant => {
            check_message(entry.message.as_ref(), Role::Assistant, entry.kind, path)
        }
        EntryKind::System => {
            if entry.subtype.as_deref().is_none_or(str::is_empty) {
                return Err(FieldError::new(
                    format!("{path}.subtype"),
                    "a system entry needs a subtype (compact_boundary, local_command, informational, …)",
                ));
            }
            if entry.is_snip() && entry.snip_metadata.is_none() {
                return Err(FieldError::new(
                    format!("{path}.snip_metadata"),
                    "a snip entry needs snip_metadata.removed_uuids",
                ));
            }
            let mut removed = entry.snip_metadata.iter().flat_map(|m| &m.removed_uuids);
            if let Some(bad) =
                removed.position(|uuid| uuid.chars().count() > MAX_UUID_LEN || uuid.contains('\0'))
            {
                return Err(FieldError::new(
                    format!("{path}.snip_metadata.removed_uuids[{bad}]"),
                    format!("must be at most {MAX_UUID_LEN} characters, without NUL characters"),
                ));
            }
            check_any_message(entry, path)
        }
        // Stored verbatim and never sent: only what the document says of every entry is checked.
        EntryKind::Progress | EntryKind::Other => check_any_message(entry, path),
    }
}

/// A message on an entry of any type has the one shape the document gives every entry's message.
fn check_any_message(entry: &Entry, path: &str) -> Result<(), FieldError> {
    entry
        .message
        .as_ref()
        .map_or(Ok(()), |message| check_blocks(message, path))
}

fn check_message(
    message: Option<&ApiMessage>,
    role: Role,
    kind: EntryKind,
    path: &str,
) -> Result<(), FieldError> {
    let message = message.ok_or_else(|| {
        FieldError::new(
            format!("{path}.message"),
            format!("a {} entry needs a message", kind.as_str()),
        )
    })?;
    if message.role != role {
        return Err(FieldError::new(
            format!("{path}.message.role"),
            format!(
                "a {} entry carries a message with role {:?}",
                kind.as_str(),
                match role {
                    Role::User => "user",
                    Role::Assistant => "assistant",
                }
            ),
        ));
    }
    check_blocks(message, path)
}

fn check_blocks(message: &ApiMessage, path: &str) -> Result<(), FieldError> {
    if let Content::Blocks(blocks) = &message.content {
        for (index, block) in blocks.iter().enumerate() {
            check_block(block, &format!("{path}.message.content[{index}]"))?;
        }
    }
    Ok(())
}

/// A content block is an object with a string `type`; anything else about it is kept verbatim.
fn check_block(block: &Value, path: &str) -> Result<(), FieldError> {
    let object = block
        .as_object()
        .ok_or_else(|| FieldError::new(path.to_owned(), "a content block must be an object"))?;
    match object.get("type") {
        Some(Value::String(kind)) if !kind.is_empty() => Ok(()),
        Some(_) => Err(FieldError::new(
            format!("{path}.type"),
            "must be a non-empty string",
        )),
        None => Err(FieldError::new(
            format!("{path}.type"),
            "a content block needs a type",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn entry(value: Value) -> Entry {
        serde_json::from_value(value).unwrap()
    }

    /// The type is stored in a column of its own: a NUL, which PostgreSQL cannot store, or a
    /// name past the limit is the caller's mistake on both backends.
    #[test]
    fn a_type_is_at_most_100_characters_without_nul() {
        let typed = |name: &str| entry(json!({"type": name, "data": 1}));
        assert!(check_entry(&typed("file-history-snapshot"), "m").is_ok());
        assert!(check_entry(&typed(&"t".repeat(100)), "m").is_ok());
        assert_eq!(check_entry(&typed("a\0b"), "m").unwrap_err().path, "m.type");
        assert_eq!(
            check_entry(&typed(&"t".repeat(101)), "m").unwrap_err().path,
            "m.type"
        );
    }

    /// The subtype's limit counts characters, as the schema's `maxLength` does.
    #[test]
    fn a_subtype_is_up_to_100_characters_without_nul() {
        let system =
            |subtype: &str| entry(json!({"type": "system", "subtype": subtype, "content": "x"}));
        assert_eq!(check_entry(&system(&"é".repeat(100)), "m"), Ok(()));
        let long = check_entry(&system(&"é".repeat(101)), "m").unwrap_err();
        assert_eq!(long.path, "m.subtype");
        assert!(check_entry(&system("a\0b"), "m").is_err());
    }

    #[test]
    fn plain_turns_and_unknown_blocks_are_accepted() {
        let user = entry(json!({"type": "user", "message": {"role": "user", "content": "hi"}}));
        assert_eq!(check_entry(&user, "messages[0]"), Ok(()));
        let future = entry(
            json!({"type": "assistant", "message": {"role": "assistant", "id": "msg_1",
            "content": [{"type": "future_block", "anything": [1, 2]}]}}),
        );
        assert_eq!(check_entry(&future, "messages[1]"), Ok(()));
    }

    #[test]
    fn a_role_that_does_not_match_the_type_names_the_field() {
        let wrong =
            entry(json!({"type": "assistant", "message": {"role": "user", "content": "x"}}));
        let error = check_entry(&wrong, "messages[2]").unwrap_err();
        assert_eq!(error.path, "messages[2].message.role");
    }

    #[test]
    fn attachments_are_user_messages() {
        let ok = entry(
            json!({"type": "attachment", "message": {"role": "user", "content": [{"type": "text", "text": "file"}]}}),
        );
        assert_eq!(check_entry(&ok, "m"), Ok(()));
        let bad =
            entry(json!({"type": "attachment", "message": {"role": "assistant", "content": "x"}}));
        assert_eq!(check_entry(&bad, "m").unwrap_err().path, "m.message.role");
    }

    /// schemathesis found this: the document gives every entry's message the same block shape,
    /// so a progress or unknown entry's message is held to it too.
    #[test]
    fn a_message_on_any_entry_type_has_typed_blocks() {
        for kind in ["progress", "queue-operation", "system"] {
            let bad = entry(json!({"type": kind, "subtype": "x",
                "message": {"role": "assistant", "content": [{"type": false}]}}));
            assert_eq!(
                check_entry(&bad, "m").unwrap_err().path,
                "m.message.content[0].type",
                "{kind}"
            );
            let good = entry(json!({"type": kind, "subtype": "x",
                "message": {"role": "user", "content": [{"type": "text", "text": "x"}]}}));
            assert_eq!(check_entry(&good, "m"), Ok(()), "{kind}");
        }
    }

    #[test]
    fn compact_metadata_and_usage_are_objects() {
        let boundary = |metadata: Value| {
            entry(
                json!({"type": "system", "subtype": "compact_boundary", "compact_metadata": metadata}),
            )
        };
        assert_eq!(
            check_entry(&boundary(json!({"trigger": "auto"})), "m"),
            Ok(())
        );
        assert_eq!(check_entry(&boundary(Value::Null), "m"), Ok(()));
        let error = check_entry(&boundary(json!([1])), "m").unwrap_err();
        assert_eq!(error.path, "m.compact_metadata");
        let reply = |usage: Value| {
            entry(
                json!({"type": "assistant", "message": {"role": "assistant", "content": "x", "usage": usage}}),
            )
        };
        assert_eq!(check_entry(&reply(json!({"input_tokens": 3})), "m"), Ok(()));
        let error = check_entry(&reply(json!("3")), "m").unwrap_err();
        assert_eq!(error.path, "m.message.usage");
    }

    #[test]
    fn blocks_need_a_string_type() {
        let bad =
            entry(json!({"type": "user", "message": {"role": "user", "content": [{"text": "x"}]}}));
        assert_eq!(
            check_entry(&bad, "messages[0]").unwrap_err().path,
            "messages[0].message.content[0].type"
        );
        let bad = entry(json!({"type": "user", "message": {"role": "user", "content": ["x"]}}));
        assert_eq!(
            check_entry(&bad, "messages[0]").unwrap_err().path,
            "messages[0].message.content[0]"
        );
    }

    #[test]
    fn messages_and_subtypes_are_required_where_they_mean_something() {
        let bad = entry(json!({"type": "user"}));
        assert_eq!(check_entry(&bad, "m").unwrap_err().path, "m.message");
        let bad = entry(json!({"type": "system", "content": "x"}));
        assert_eq!(check_entry(&bad, "m").unwrap_err().path, "m.subtype");
        let bad = entry(json!({"type": "system", "subtype": "snip"}));
        assert_eq!(check_entry(&bad, "m").unwrap_err().path, "m.snip_metadata");
        let ok = entry(json!({"type": "progress", "data": {"step": 1}}));
        assert_eq!(check_entry(&ok, "m"), Ok(()));
        let bad = entry(json!({"uuid": "", "type": "progress"}));
        assert_eq!(check_entry(&bad, "m").unwrap_err().path, "m.uuid");
    }
}
