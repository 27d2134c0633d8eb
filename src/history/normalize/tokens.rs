//! Token estimation (reference-behaviour §8.1, `roughTokenCountEstimation`).

use serde_json::Value;

use super::blocks::{block_type, str_field};

/// `Math.round(len / 4)` with `len` in UTF-16 code units (JavaScript `String.length`).
pub fn rough(s: &str) -> u64 {
    let len: u64 = s.chars().map(|c| c.len_utf16() as u64).sum();
    (len + 2) / 4
}

fn block_tokens(b: &Value) -> u64 {
    match block_type(b) {
        Some("text" | "input_text" | "output_text") => rough(str_field(b, "text").unwrap_or("")),
        Some(
            "image" | "document" | "image_url" | "file" | "input_audio" | "input_image"
            | "input_file",
        ) => 2000,
        Some("tool_result") => content_tokens(b.get("content")),
        Some("tool_use") => {
            let input = b.get("input").map(Value::to_string).unwrap_or_default();
            rough(&format!("{}{}", str_field(b, "name").unwrap_or(""), input))
        }
        Some("thinking") => rough(str_field(b, "thinking").unwrap_or("")),
        Some("redacted_thinking") => rough(str_field(b, "data").unwrap_or("")),
        _ => rough(&b.to_string()),
    }
}

fn gemini_part_tokens(p: &Value) -> u64 {
    if let Some(t) = str_field(p, "text") {
        rough(t)
    } else if p.get("inlineData").is_some() || p.get("fileData").is_some() {
        2000
    } else if let Some(call) = p.get("functionCall") {
        let args = call.get("args").map(Value::to_string).unwrap_or_default();
        rough(&format!(
            "{}{}",
            str_field(call, "name").unwrap_or(""),
            args
        ))
    } else if let Some(resp) = p.get("functionResponse") {
        rough(
            &resp
                .get("response")
                .map(Value::to_string)
                .unwrap_or_default(),
        )
    } else {
        rough(&p.to_string())
    }
}

fn content_tokens(c: Option<&Value>) -> u64 {
    match c {
        Some(Value::String(s)) => rough(s),
        Some(Value::Array(items)) => items.iter().map(block_tokens).sum(),
        _ => 0,
    }
}

/// Rough token count of provider messages (reference §8.1), either shape:
/// - every string is `round(UTF-16 length / 4)`, rounded per block;
/// - string content counts as its text; `text` → its text; `image`/`document` (and the OpenAI
///   `image_url`/`file`/`input_audio` parts) → **2000 flat**, also nested in tool results;
///   `tool_result` → the sum of its content; `tool_use` → `name + JSON(input)`; `thinking` → the
///   thinking text (signature ignored); `redacted_thinking` → `data`; any other block → its JSON;
/// - OpenAI `tool_calls` → `name + arguments` each; `tool` messages → their content;
/// - Responses items: `message` → its content parts (`input_text`/`output_text` as text,
///   `input_image`/`input_file` 2000), `function_call` → `name + arguments`,
///   `function_call_output` → its output, any other item (`reasoning`) → its JSON;
/// - Gemini contents: each part's text, `inlineData` 2000, `functionCall` → `name + JSON(args)`,
///   `functionResponse` → JSON of its response.
pub fn estimate_tokens(messages: &[Value]) -> u64 {
    messages
        .iter()
        .map(|m| {
            if let Some(parts) = m.get("parts").and_then(Value::as_array) {
                return parts.iter().map(gemini_part_tokens).sum();
            }
            match str_field(m, "type") {
                Some("function_call") => {
                    let name = str_field(m, "name").unwrap_or("");
                    let args = str_field(m, "arguments").unwrap_or("");
                    return rough(&format!("{name}{args}"));
                }
                Some("function_call_output") => {
                    return rough(str_field(m, "output").unwrap_or(""));
                }
                Some("message") | None => {}
                Some(_) => return rough(&m.to_string()),
            }
            let calls: u64 = m
                .get("tool_calls")
                .and_then(Value::as_array)
                .map(|calls| {
                    calls
                        .iter()
                        .map(|c| {
                            let f = c.get("function");
                            let name = f.and_then(|f| str_field(f, "name")).unwrap_or("");
                            let args = f.and_then(|f| str_field(f, "arguments")).unwrap_or("");
                            rough(&format!("{name}{args}"))
                        })
                        .sum()
                })
                .unwrap_or(0);
            content_tokens(m.get("content")) + calls
        })
        .sum()
}

/// Rough token count of one stored entry as the model would see it (the running estimate behind
/// automatic compaction): the [`estimate_tokens`] of a user/assistant/attachment message's content,
/// the text of a `local_command` system entry; 0 for every other entry (progress, boundaries,
/// snips, virtual and API-error entries never reach the model).
pub fn estimate_entry_tokens(entry: &crate::history::model::Entry) -> u64 {
    use crate::history::model::{subtype, EntryKind};
    if entry.is_virtual || entry.is_api_error_message() {
        return 0;
    }
    match entry.kind {
        EntryKind::User | EntryKind::Assistant | EntryKind::Attachment => match &entry.message {
            Some(message) => {
                let content = serde_json::to_value(&message.content).unwrap_or(Value::Null);
                content_tokens(Some(&content))
            }
            None => 0,
        },
        EntryKind::System if entry.subtype.as_deref() == Some(subtype::LOCAL_COMMAND) => {
            content_tokens(entry.content.as_ref())
        }
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn entry_estimates_count_only_what_the_model_sees() {
        let entry =
            |v: Value| -> crate::history::model::Entry { serde_json::from_value(v).unwrap() };
        let user =
            entry(json!({"type": "user", "message": {"role": "user", "content": "abcdefgh"}}));
        assert_eq!(estimate_entry_tokens(&user), 2);
        let asst = entry(json!({"type": "assistant", "message": {"role": "assistant",
            "content": [{"type": "text", "text": "abcd"}, {"type": "image", "source": {}}]}}));
        assert_eq!(estimate_entry_tokens(&asst), 2001);
        let progress = entry(json!({"type": "progress", "data": "x".repeat(400)}));
        assert_eq!(estimate_entry_tokens(&progress), 0);
        let boundary = entry(
            json!({"type": "system", "subtype": "compact_boundary", "content": "Conversation compacted"}),
        );
        assert_eq!(estimate_entry_tokens(&boundary), 0);
    }

    #[test]
    fn rough_rounds_like_math_round() {
        assert_eq!(rough(""), 0);
        assert_eq!(rough("a"), 0);
        assert_eq!(rough("ab"), 1);
        assert_eq!(rough("abcdef"), 2);
        assert_eq!(rough("😀😀"), 1); // 4 UTF-16 units
    }

    #[test]
    fn estimates_blocks() {
        let msgs = vec![
            json!({"role": "user", "content": "abcdefgh"}),
            json!({"role": "assistant", "content": [
                {"type": "thinking", "thinking": "abcd", "signature": "zzzzzzzzzzzzzzzz"},
                {"type": "tool_use", "id": "x", "name": "ab", "input": {}}
            ]}),
            json!({"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "x", "content": [{"type": "image", "source": {}}, {"type": "text", "text": "abcd"}]}
            ]}),
        ];
        // 2 + (1 + round(4/4)=1) + (2000 + 1)
        assert_eq!(estimate_tokens(&msgs), 2 + 1 + 1 + 2000 + 1);
        let oa = vec![json!({"role": "assistant", "content": null, "tool_calls": [
            {"id": "c", "type": "function", "function": {"name": "abcd", "arguments": "{}"}}]})];
        assert_eq!(estimate_tokens(&oa), 2);
    }
}
