//! A stored entry written out whole as text, the way the model reads it: `zoom(id, 1)` answers
//! with this. Nothing is cut or summarized: text and attached files verbatim, tool calls with
//! their full input, tool results with their full content; binary media are named, not inlined.

use serde_json::Value;

use super::model::{Content, Entry, EntryKind};

/// Whether the entry carries a message the model reads (a user, assistant or attachment entry
/// with its message); the others are bookkeeping.
pub fn is_message(entry: &Entry) -> bool {
    matches!(
        entry.kind,
        EntryKind::User | EntryKind::Assistant | EntryKind::Attachment
    ) && entry.message.is_some()
}

/// The entry as text: `user: …`, `assistant: …`, `attachment: …`, or a bracketed note for an
/// entry the model never sees (`(progress)`, `(system: compact_boundary)`).
pub fn entry_text(entry: &Entry) -> String {
    let Some(message) = entry.message.as_ref().filter(|_| is_message(entry)) else {
        let subtype = entry
            .subtype
            .as_deref()
            .map(|s| format!(": {s}"))
            .unwrap_or_default();
        return format!("({}{subtype})", entry.type_name());
    };
    let speaker = match entry.kind {
        EntryKind::Assistant => "assistant",
        EntryKind::Attachment => "attachment",
        _ => "user",
    };
    let body = match &message.content {
        Content::Text(text) => text.clone(),
        Content::Blocks(blocks) => blocks_text(blocks),
    };
    format!("{speaker}: {body}")
}

fn blocks_text(blocks: &[Value]) -> String {
    blocks
        .iter()
        .map(block_text)
        .filter(|part| !part.is_empty())
        .collect::<Vec<_>>()
        .join("\n")
}

fn str_field<'a>(block: &'a Value, key: &str) -> &'a str {
    block.get(key).and_then(Value::as_str).unwrap_or_default()
}

fn block_text(block: &Value) -> String {
    match str_field(block, "type") {
        "text" => str_field(block, "text").to_owned(),
        "thinking" => format!("[thinking]\n{}", str_field(block, "thinking")),
        "redacted_thinking" => "[redacted thinking]".to_owned(),
        "tool_use" | "server_tool_use" => format!(
            "[tool call {} ({}): {}]",
            str_field(block, "name"),
            str_field(block, "id"),
            block.get("input").unwrap_or(&Value::Null)
        ),
        "tool_result" => {
            let error = if block.get("is_error").and_then(Value::as_bool) == Some(true) {
                ", error"
            } else {
                ""
            };
            let content = match block.get("content") {
                Some(Value::String(text)) => text.clone(),
                Some(Value::Array(parts)) => blocks_text(parts),
                _ => String::new(),
            };
            format!(
                "[tool result for {}{error}:]\n{content}",
                str_field(block, "tool_use_id")
            )
        }
        "image" | "document" => media_text(block),
        other => format!("[{other}: {block}]"),
    }
}

/// Media by what they are: text documents whole, binary sources named with their size.
fn media_text(block: &Value) -> String {
    let kind = str_field(block, "type");
    let source = block.get("source").unwrap_or(&Value::Null);
    let title = block
        .get("title")
        .and_then(Value::as_str)
        .map(|t| format!(" {t:?}"))
        .unwrap_or_default();
    match str_field(source, "type") {
        "text" => format!("[{kind}{title}:]\n{}", str_field(source, "data")),
        "base64" => format!(
            "[{kind}{title}: {}, {} bytes of base64]",
            str_field(source, "media_type"),
            str_field(source, "data").len()
        ),
        "url" => format!("[{kind}{title}: {}]", str_field(source, "url")),
        "content" => format!(
            "[{kind}{title}:]\n{}",
            match source.get("content") {
                Some(Value::String(text)) => text.clone(),
                Some(Value::Array(parts)) => blocks_text(parts),
                _ => String::new(),
            }
        ),
        _ => format!("[{kind}{title}: {source}]"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn entry(value: Value) -> Entry {
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn text_and_tool_calls_are_written_whole() {
        let long = "x".repeat(10_000);
        let e = entry(
            json!({"type": "assistant", "message": {"role": "assistant", "content": [
                {"type": "text", "text": "Reading it."},
                {"type": "tool_use", "id": "toolu_1", "name": "Read", "input": {"path": long}}
            ]}}),
        );
        let text = entry_text(&e);
        assert!(
            text.starts_with("assistant: Reading it.\n[tool call Read (toolu_1): {\"path\":\"xxx")
        );
        assert!(text.len() > 10_000, "nothing is cut");
    }

    #[test]
    fn results_files_and_media() {
        let e = entry(
            json!({"type": "user", "message": {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "is_error": true,
                 "content": [{"type": "text", "text": "line 1\nline 2"}]},
                {"type": "document", "title": "notes.md", "source": {"type": "text", "media_type": "text/plain", "data": "# Notes\nall of it"}},
                {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "aGVsbG8="}}
            ]}}),
        );
        assert_eq!(
            entry_text(&e),
            "user: [tool result for toolu_1, error:]\nline 1\nline 2\n[document \"notes.md\":]\n# Notes\nall of it\n[image: image/png, 8 bytes of base64]"
        );
    }

    #[test]
    fn entries_the_model_never_sees_are_notes() {
        let e = entry(json!({"type": "system", "subtype": "compact_boundary"}));
        assert_eq!(entry_text(&e), "(system: compact_boundary)");
        let e = entry(json!({"type": "progress"}));
        assert_eq!(entry_text(&e), "(progress)");
        let e = entry(json!({"type": "user", "message": {"role": "user", "content": "hi"}}));
        assert_eq!(entry_text(&e), "user: hi");
    }
}
