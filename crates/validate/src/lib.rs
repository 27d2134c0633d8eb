//! An independent validator of provider message-list rules.
//!
//! Written from `docs/PROVIDER-RULES.md` alone (the D1 / D2 invariants, the A / B rows for the
//! detailed rules and the providers' own error texts). It runs on the exact JSON Loupe would return
//! and reports every rule a list breaks; an empty result means "the provider accepts this list" as
//! far as the document lets us tell.
//!
//! Rule ids are the document's: `D1.n` for the Anthropic invariants, `D2.n` for OpenAI Chat
//! Completions, `D3.n` for OpenAI Responses, `D4.n` for Gemini (the image rules of D1.16 apply
//! to every provider's images), and the A / B row id (e.g. `A4.9`) where a check comes from a
//! detailed row that D1 / D2 do not restate. `D1.0` / `D2.0` are the envelope shape (every message an object of the
//! expected keys, content of the expected JSON type).

use std::borrow::Cow;
use std::fmt;

use serde_json::{json, Value};

pub mod anthropic;
pub mod gemini;
pub mod media;
pub mod openai;
pub mod responses;

/// One broken rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    /// The rule id, e.g. `"D1.8"`.
    pub rule: &'static str,
    /// The index of the offending message, when the rule is about one message.
    pub index: Option<usize>,
    /// Modelled on the provider's own error text where the rules document gives it.
    pub message: String,
}

impl Violation {
    pub(crate) fn new(
        rule: &'static str,
        index: Option<usize>,
        message: impl Into<String>,
    ) -> Self {
        Violation {
            rule,
            index,
            message: message.into(),
        }
    }

    pub(crate) fn at(rule: &'static str, index: usize, message: impl Into<String>) -> Self {
        Self::new(rule, Some(index), message)
    }
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.index {
            Some(i) => write!(f, "[{}] (message {}) {}", self.rule, i, self.message),
            None => write!(f, "[{}] {}", self.rule, self.message),
        }
    }
}

/// Request-level settings that change what a valid Anthropic `messages` array is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AnthropicRules {
    /// An empty list is "nothing to send yet" (the caller appends its user turn). Default true.
    pub allow_empty: bool,
    /// The list may end with an assistant turn because the caller appends its next user turn
    /// after it (default true). Such a trailing assistant is then *not* the final message of the
    /// request: it must be non-empty and must not leave client `tool_use` or `server_tool_use`
    /// blocks unanswered (a plain user turn cannot answer them). When false, a trailing assistant
    /// is a D1.6 violation ("must end with a user message").
    pub allow_trailing_assistant: bool,
    /// The trailing assistant really is the last message of the request (prefill, A3.1): it may be
    /// empty, and its last text must not end in whitespace (A3.3). Default false.
    pub trailing_assistant_is_prefill: bool,
    /// `thinking` is enabled for the request. When false, an assistant in final position may not
    /// contain thinking blocks (D1.13 / A6.6). Default false (the API default when omitted).
    pub thinking_enabled: bool,
    /// At most this many `cache_control` markers (D1.15). Default 4.
    pub max_cache_breakpoints: usize,
    /// At most this many `image` + `document` blocks, top level and nested in tool results
    /// (D1.16; the Loupe contract is 100).
    pub max_media: usize,
    /// Reject block types the provider does not list (A2.5). Default true: the provider rejects
    /// unknown types, whatever Loupe stores.
    pub known_block_types_only: bool,
    /// Manual thinking (`thinking.type: "enabled"`, A6.5 / D1.13): when the list ends with a user
    /// turn of tool results only, the assistant turn that opened that tool loop starts with
    /// thinking. Default false.
    pub manual_thinking: bool,
    /// Signatures (and redacted `data`) of thinking written by another model than the request's:
    /// none may be sent (D1.14). Default empty.
    pub foreign_signatures: Vec<String>,
}

impl Default for AnthropicRules {
    fn default() -> Self {
        AnthropicRules {
            allow_empty: true,
            allow_trailing_assistant: true,
            trailing_assistant_is_prefill: false,
            thinking_enabled: false,
            max_cache_breakpoints: 4,
            max_media: 100,
            known_block_types_only: true,
            manual_thinking: false,
            foreign_signatures: Vec::new(),
        }
    }
}

/// Settings for the OpenAI Chat Completions validator.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpenAiRules {
    /// An empty list is "nothing to send yet" (the caller appends its user turn). Default true.
    pub allow_empty: bool,
}

impl Default for OpenAiRules {
    fn default() -> Self {
        OpenAiRules { allow_empty: true }
    }
}

/// Settings for the OpenAI Responses validator.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResponsesRules {
    /// An empty list is "nothing to send yet". Default true.
    pub allow_empty: bool,
    /// Ids of reasoning items written by another model than the request's (D3.4 / §E). Default
    /// empty.
    pub foreign_reasoning: Vec<String>,
}

impl Default for ResponsesRules {
    fn default() -> Self {
        ResponsesRules {
            allow_empty: true,
            foreign_reasoning: Vec::new(),
        }
    }
}

/// Settings for the Gemini validator.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GeminiRules {
    /// An empty list is "nothing to send yet". Default true.
    pub allow_empty: bool,
    /// Gemini 3+: the current turn's function calls carry signatures (D4.5). Default true.
    pub require_signatures: bool,
    /// Thought signatures written by another model (C12). Default empty.
    pub foreign_signatures: Vec<String>,
}

impl Default for GeminiRules {
    fn default() -> Self {
        GeminiRules {
            allow_empty: true,
            require_signatures: true,
            foreign_signatures: Vec::new(),
        }
    }
}

/// The content of a message as blocks: string content is one text block (A2.1).
pub(crate) fn content_blocks(content: Option<&Value>) -> Vec<Cow<'_, Value>> {
    match content {
        Some(Value::String(s)) => vec![Cow::Owned(json!({"type": "text", "text": s}))],
        Some(Value::Array(items)) => items.iter().map(Cow::Borrowed).collect(),
        _ => Vec::new(),
    }
}

/// The `type` of a block, if it is an object with a string `type`.
pub(crate) fn block_type(block: &Value) -> Option<&str> {
    block.get("type").and_then(Value::as_str)
}

/// `^[a-zA-Z0-9_-]+$`
pub(crate) fn is_tool_id(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// `^srvtoolu_[a-zA-Z0-9_]+$`
pub(crate) fn is_server_tool_id(s: &str) -> bool {
    match s.strip_prefix("srvtoolu_") {
        Some(rest) => {
            !rest.is_empty() && rest.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
        }
        None => false,
    }
}

/// Whitespace as the providers see it (`str.strip()`): Unicode whitespace.
pub(crate) fn is_blank(s: &str) -> bool {
    s.trim().is_empty()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn id_patterns() {
        assert!(is_tool_id("toolu_01AbC-9"));
        assert!(!is_tool_id(""));
        assert!(!is_tool_id("functions.Bash:0"));
        assert!(!is_tool_id("tool use"));
        assert!(is_server_tool_id("srvtoolu_01abc_DEF"));
        assert!(!is_server_tool_id("srvtoolu_"));
        assert!(!is_server_tool_id("srvtoolu_a-b"));
        assert!(!is_server_tool_id("toolu_abc"));
    }

    #[test]
    fn string_content_is_one_text_block() {
        let c = json!("hi");
        let blocks = content_blocks(Some(&c));
        assert_eq!(blocks.len(), 1);
        assert_eq!(blocks[0].as_ref(), &json!({"type": "text", "text": "hi"}));
        assert!(content_blocks(Some(&json!(null))).is_empty());
    }

    #[test]
    fn violation_display() {
        let v = Violation::at("D1.3", 0, "x");
        assert_eq!(v.to_string(), "[D1.3] (message 0) x");
    }
}
