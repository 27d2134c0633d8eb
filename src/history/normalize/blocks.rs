//! Content-block helpers and the fixed strings of `docs/NORMALIZATION.md` § Fixed strings.

use serde_json::{json, Value};

/// `NO_CONTENT_MESSAGE`.
pub const NO_CONTENT: &str = "(no content)";
/// Empty assistant after trailing thinking was removed.
pub const NO_MESSAGE_CONTENT: &str = "[No message content]";
/// Assistant emptied by `ensureToolResultPairing`.
pub const TOOL_USE_INTERRUPTED: &str = "[Tool use interrupted]";
/// `SYNTHETIC_TOOL_RESULT_PLACEHOLDER`.
pub const SYNTHETIC_TOOL_RESULT: &str = "[Tool result missing due to internal error]";
/// First message emptied of orphan tool results.
pub const ORPHANED_TOOL_RESULT: &str = "[Orphaned tool result removed due to conversation resume]";
/// Assistant emptied by `stripAdvisorBlocks`.
pub const ADVISOR_RESPONSE: &str = "[Advisor response]";
/// Tool result emptied of references to tools no longer available.
pub const TOOL_REFERENCES_REMOVED: &str = "[Tool references removed - tools no longer available]";
/// Closes a tool loop that was opened without thinking (`thinking=enabled`).
pub const LOOP_CLOSED: &str = "[Continue from the tool results above]";
/// Gemini's documented stand-in for a missing thought signature on a function call.
pub const DUMMY_THOUGHT_SIGNATURE: &str = "skip_thought_signature_validator";
/// The stored field holding a Gemini thought signature on a text or `tool_use` block.
pub const THOUGHT_SIGNATURE: &str = "thought_signature";
/// Prefix of micro-compaction placeholders.
pub const CLEARED_PREFIX: &str = "[Old tool result content cleared";
/// What every stub of reversible clearing (`clearing`) starts with.
pub const STUB_PREFIX: &str = "[Old tool result cleared: ";

/// `(<ToolName> completed with no output)`.
pub fn completed_with_no_output(tool: &str) -> String {
    format!("({tool} completed with no output)")
}

pub fn text_block(text: &str) -> Value {
    json!({"type": "text", "text": text})
}

pub fn block_type(v: &Value) -> Option<&str> {
    v.get("type").and_then(Value::as_str)
}

pub fn is_type(v: &Value, t: &str) -> bool {
    #[cfg(test)]
    TYPE_CHECKS.with(|count| count.set(count.get() + 1));
    block_type(v) == Some(t)
}

#[cfg(test)]
thread_local! {
    /// Block type checks made by this thread: the unit of work of the cost ladders in tests.
    pub static TYPE_CHECKS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

pub fn str_field<'a>(v: &'a Value, field: &str) -> Option<&'a str> {
    v.get(field).and_then(Value::as_str)
}

/// Size of a tool result's content in bytes: string length, or for an array the sum of text
/// lengths plus the JSON length of the other blocks.
pub fn content_bytes(content: Option<&Value>) -> usize {
    match content {
        Some(Value::String(s)) => s.len(),
        Some(Value::Array(items)) => items
            .iter()
            .map(|x| match (is_type(x, "text"), str_field(x, "text")) {
                (true, Some(t)) => t.len(),
                _ => x.to_string().len(),
            })
            .sum(),
        Some(Value::Null) | None => 0,
        Some(other) => other.to_string().len(),
    }
}

/// Thinking of any provider: Anthropic `thinking` / `redacted_thinking`, and OpenAI `reasoning`
/// items stored as blocks. None of them may end an assistant turn.
pub fn is_thinking(v: &Value) -> bool {
    matches!(
        block_type(v),
        Some("thinking" | "redacted_thinking" | "reasoning")
    )
}

pub fn is_media(v: &Value) -> bool {
    matches!(block_type(v), Some("image" | "document"))
}

/// Whether Loupe sends a top-level block of this type (to either provider). These are the
/// Anthropic GA types of `docs/PROVIDER-RULES.md` A2.5 plus the beta types whose use Loupe itself handles:
/// `mcp_tool_use` / `mcp_tool_result` (paired like server tools) and `advisor_tool_result` (the
/// `advisor` option), and `fallback`, kept where it stood between thinking runs (A9.4; dropping
/// it merges them into one span the API refuses). A `compaction` block is a boundary of its own
/// (`view::cut_at_server_compaction`); `tool_addition` / `tool_removal` belong to system messages
/// only (A9.3) and are dropped, as are unknown (future) types: the provider rejects them.
pub fn is_supported_type(t: &str) -> bool {
    matches!(
        t,
        "text"
            | "image"
            | "document"
            | "search_result"
            | "thinking"
            | "redacted_thinking"
            | "tool_use"
            | "tool_result"
            | "server_tool_use"
            | "web_search_tool_result"
            | "web_fetch_tool_result"
            | "code_execution_tool_result"
            | "bash_code_execution_tool_result"
            | "text_editor_code_execution_tool_result"
            | "tool_search_tool_result"
            | "container_upload"
            | "mcp_tool_use"
            | "mcp_tool_result"
            | "advisor_tool_result"
            | "fallback"
            | "reasoning"
    )
}

/// What a `compaction` block stands for: everything before it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compaction<'a> {
    /// Anthropic's server-side compaction: its `content` is the summary a model reads.
    Summary(&'a str),
    /// An OpenAI Responses `compaction` item: only its own provider can read it.
    Opaque,
}

/// The compaction a block is, if any. A `content: null` Anthropic block is a compaction that
/// failed (a no-op), and stands for nothing.
pub fn compaction(v: &Value) -> Option<Compaction<'_>> {
    if !is_type(v, "compaction") {
        return None;
    }
    match v.get("content") {
        Some(Value::String(s)) if !s.is_empty() => Some(Compaction::Summary(s)),
        // Anthropic's blocks carry a `signature` member; a failed one may omit `content`.
        None if v.get("encrypted_content").is_some_and(Value::is_string)
            && v.get("signature").is_none() =>
        {
            Some(Compaction::Opaque)
        }
        _ => None,
    }
}

/// A text block whose text is empty or whitespace only.
pub fn is_blank_text(v: &Value) -> bool {
    is_type(v, "text") && str_field(v, "text").is_none_or(|t| t.trim().is_empty())
}

/// `server_tool_use` / `mcp_tool_use`: answered by a result block in the same assistant turn.
pub fn is_server_use(v: &Value) -> bool {
    matches!(block_type(v), Some("server_tool_use" | "mcp_tool_use"))
}

/// A server-side result block in an assistant turn (`web_search_tool_result`,
/// `advisor_tool_result`, `mcp_tool_result`, …): anything with a `tool_use_id` that is not a
/// client `tool_result`.
pub fn is_server_result(v: &Value) -> bool {
    !is_type(v, "tool_result") && v.get("tool_use_id").is_some()
}

/// The text of a tool result's content (string, or the texts of its array), for size checks.
pub fn tool_result_content(v: &Value) -> Option<&Value> {
    v.get("content")
}

/// Whether a tool result's content is empty (missing, null, "", [] or only blank text).
pub fn tool_result_is_empty(v: &Value) -> bool {
    match v.get("content") {
        None | Some(Value::Null) => true,
        Some(Value::String(s)) => s.trim().is_empty(),
        Some(Value::Array(items)) => items.iter().all(is_blank_text),
        Some(_) => false,
    }
}

/// `^[a-zA-Z0-9_-]+$`.
pub fn is_valid_tool_id(id: &str) -> bool {
    !id.is_empty()
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// `^srvtoolu_[a-zA-Z0-9_]+$`.
pub fn is_valid_server_tool_id(id: &str) -> bool {
    id.strip_prefix("srvtoolu_").is_some_and(|rest| {
        !rest.is_empty() && rest.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
    })
}

/// FNV-1a 64, for deterministic short ids.
pub fn fnv1a(data: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in data {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// Shortens a string for a repair detail.
pub fn preview(s: &str) -> String {
    const MAX: usize = 60;
    if s.chars().count() <= MAX {
        s.to_string()
    } else {
        let cut: String = s.chars().take(MAX).collect();
        format!("{cut}…")
    }
}

/// The server call that made a client `tool_use` (programmatic tool calling): `caller.tool_id`.
pub fn caller_of(block: &Value) -> Option<&str> {
    block.get("caller")?.get("tool_id")?.as_str()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn id_patterns() {
        assert!(is_valid_tool_id("toolu_01-A"));
        assert!(!is_valid_tool_id(""));
        assert!(!is_valid_tool_id("functions.Bash:0"));
        assert!(is_valid_server_tool_id("srvtoolu_01abc"));
        assert!(!is_valid_server_tool_id("srvtoolu_"));
        assert!(!is_valid_server_tool_id("srvtoolu_a-b"));
        assert!(!is_valid_server_tool_id("toolu_x"));
    }

    #[test]
    fn blank_text_and_empty_results() {
        assert!(is_blank_text(&text_block(" \n")));
        assert!(is_blank_text(&json!({"type": "text"})));
        assert!(!is_blank_text(&text_block("x")));
        assert!(tool_result_is_empty(
            &json!({"type": "tool_result", "tool_use_id": "a"})
        ));
        assert!(tool_result_is_empty(
            &json!({"type": "tool_result", "content": [{"type":"text","text":" "}]})
        ));
        assert!(!tool_result_is_empty(
            &json!({"type": "tool_result", "content": "x"})
        ));
    }

    #[test]
    fn preview_truncates() {
        assert_eq!(preview("abc"), "abc");
        assert_eq!(preview(&"x".repeat(100)).chars().count(), 61);
    }
}
