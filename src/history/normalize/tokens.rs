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
        Some("text") => rough(str_field(b, "text").unwrap_or("")),
        Some("image" | "document" | "image_url" | "file" | "input_audio") => 2000,
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
/// - OpenAI `tool_calls` → `name + arguments` each; `tool` messages → their content.
pub fn estimate_tokens(messages: &[Value]) -> u64 {
    messages
        .iter()
        .map(|m| {
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

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

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
