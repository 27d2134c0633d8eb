//! What search finds in a stored entry: every text a model could read of it, with thinking
//! apart (it is searched only when the caller's thinking mode would send it). Signatures,
//! encrypted fields, ids and media bytes are not text and stay out (`normalize::render_text`).

use serde_json::Value;

use super::model::{Content, Entry};
use super::normalize::render_text::{readable_text, rendered};
use super::visibility::is_sent_to_model;

/// An entry's searchable text.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Searchable {
    /// Text, tool calls and their results, documents, summaries: one piece a line.
    pub text: String,
    /// Thinking, in order.
    pub thinking: String,
}

/// The searchable text of an entry the model reads; `None` for one it never reads (progress,
/// bookkeeping, an erased entry's tombstone) or that holds no text.
pub fn searchable(entry: &Entry) -> Option<Searchable> {
    if !is_sent_to_model(entry) {
        return None;
    }
    let mut text = Vec::new();
    let mut thinking = Vec::new();
    match entry.message.as_ref().map(|m| &m.content) {
        Some(Content::Text(s)) => text.push(s.clone()),
        Some(Content::Blocks(blocks)) => {
            for block in blocks {
                piece(block, &mut text, &mut thinking);
            }
        }
        None => {}
    }
    text.retain(|s| !s.trim().is_empty());
    thinking.retain(|s| !s.trim().is_empty());
    if text.is_empty() && thinking.is_empty() {
        return None;
    }
    Some(Searchable {
        text: text.join("\n"),
        thinking: thinking.join("\n"),
    })
}

fn piece(block: &Value, text: &mut Vec<String>, thinking: &mut Vec<String>) {
    let field = |key: &str| block.get(key).and_then(Value::as_str).unwrap_or_default();
    match field("type") {
        "text" => text.push(field("text").to_owned()),
        "thinking" => thinking.push(field("thinking").to_owned()),
        "redacted_thinking" => {}
        "tool_use" => {
            text.push(field("name").to_owned());
            text.push(readable_text(block.get("input").unwrap_or(&Value::Null)));
        }
        "tool_result" => text.push(readable_text(block.get("content").unwrap_or(&Value::Null))),
        _ => text.extend(rendered(block)),
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
    fn what_a_model_reads_is_found_and_bytes_are_not() {
        let e = entry(
            json!({"type": "assistant", "message": {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "the error is E0282", "signature": "c2lnbmF0dXJl"},
                {"type": "text", "text": "Running the tests."},
                {"type": "tool_use", "id": "toolu_1", "name": "Bash",
                    "input": {"command": "cargo test -p loupe --lib store::jobs"}},
                {"type": "web_fetch_tool_result", "tool_use_id": "srvtoolu_1", "content": {
                    "type": "web_fetch_result", "url": "https://docs.rs/sqlx",
                    "content": {"type": "document", "title": "sqlx docs",
                        "source": {"type": "text", "media_type": "text/plain", "data": "Pool::begin"}}}}
            ]}}),
        );
        let found = searchable(&e).unwrap();
        assert_eq!(found.thinking, "the error is E0282");
        for text in [
            "Running the tests.",
            "Bash",
            "cargo test -p loupe --lib store::jobs",
            "https://docs.rs/sqlx",
            "sqlx docs",
            "Pool::begin",
        ] {
            assert!(found.text.contains(text), "{text}: {}", found.text);
        }
        for hidden in ["c2lnbmF0dXJl", "toolu_1", "srvtoolu_1", "E0282"] {
            assert!(!found.text.contains(hidden), "{hidden}: {}", found.text);
        }
        let result = entry(
            json!({"type": "user", "message": {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": [
                    {"type": "text", "text": "test result: FAILED. 7-4-1-9"},
                    {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo"}}]}
            ]}}),
        );
        let found = searchable(&result).unwrap();
        assert!(found.text.contains("7-4-1-9"), "{}", found.text);
        assert!(!found.text.contains("iVBORw0KGgo"), "{}", found.text);
    }

    #[test]
    fn entries_no_model_reads_are_not_searched() {
        for e in [
            json!({"type": "progress", "data": {"text": "compiling"}}),
            json!({"type": "system", "subtype": "compact_boundary", "content": "Conversation compacted"}),
            json!({"type": "user", "message": {"role": "user", "content": "  "}}),
        ] {
            assert_eq!(searchable(&entry(e.clone())), None, "{e}");
        }
    }
}
