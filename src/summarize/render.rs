//! Reading history entries for a summarizer.
//!
//! [`turns`] reduces entries to what a summary needs: who spoke, their text, tool calls as short
//! descriptions (`Read(src/main.rs)`, `Bash(cargo test)`), tool results with their size and error
//! flag, media as `[image]` / `[document]`. Thinking, ids (uuids, `seq`, tool-use ids, message
//! ids), system bookkeeping, progress events, virtual entries and synthetic API-error entries are
//! left out. [`transcript_items`] renders the turns as the plain-text transcript a model
//! summarizer reads: never raw provider blocks, so no pairing rules apply.

use std::collections::HashMap;

use serde_json::Value;

use super::text::{cut_words, head_tail, human_bytes, newlines_to_spaces, squash};
use crate::history::model::{Content, Entry, EntryKind};

/// Bytes of a tool result kept in the transcript (head and tail).
pub const TOOL_RESULT_BYTES: usize = 2_000;
/// Bytes of a meta message, attachment or command output kept in the transcript.
pub const CONTEXT_BYTES: usize = 1_000;
/// Bytes of a tool call's key input kept in its description.
pub const TOOL_INPUT_BYTES: usize = 80;

/// Who a turn is from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Speaker {
    /// A user turn that is not meta: the user's own words, and tool results.
    User,
    /// A meta user message: reminders, context, recovery nudges.
    Context,
    Attachment,
    /// The output of a local command (a `system` entry of subtype `local_command`).
    CommandOutput,
    /// A compaction summary written earlier.
    EarlierSummary,
    Assistant,
}

impl Speaker {
    pub fn tag(self) -> &'static str {
        match self {
            Speaker::User => "user",
            Speaker::Context => "context",
            Speaker::Attachment => "attachment",
            Speaker::CommandOutput => "command output",
            Speaker::EarlierSummary => "earlier summary",
            Speaker::Assistant => "assistant",
        }
    }
}

/// One piece of a turn.
#[derive(Debug, Clone, PartialEq)]
pub enum Part {
    Text(String),
    /// `[image]`, `[document]`, `[web_search_tool_result]`, …
    Marker(String),
    ToolUse {
        /// Index into [`Turns::tools`].
        tool: usize,
    },
    ToolResult {
        /// The call it answers, when that call is among the entries.
        tool: Option<usize>,
        is_error: bool,
        /// The result as text (media as markers), whole.
        text: String,
    },
}

#[derive(Debug, Clone, PartialEq)]
pub struct Turn {
    pub speaker: Speaker,
    pub parts: Vec<Part>,
}

impl Turn {
    /// The turn's plain text parts joined by newlines.
    pub fn text(&self) -> String {
        let texts: Vec<&str> = self
            .parts
            .iter()
            .filter_map(|p| match p {
                Part::Text(t) => Some(t.as_str()),
                _ => None,
            })
            .collect();
        texts.join("\n")
    }
}

/// A tool call seen in the entries.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolCall {
    /// `Read(src/main.rs)`.
    pub description: String,
    /// Size of its result in bytes, once seen.
    pub result_bytes: Option<usize>,
    pub is_error: bool,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct Turns {
    pub turns: Vec<Turn>,
    pub tools: Vec<ToolCall>,
}

/// Text that carries nothing (placeholders written by the agent loop).
fn is_placeholder(text: &str) -> bool {
    matches!(
        text.trim(),
        "" | "(no content)" | "[No message content]" | "No response requested."
    )
}

/// Removes `<system-reminder>…</system-reminder>` spans, which the agent loop injects.
pub fn strip_reminders(text: &str) -> String {
    const OPEN: &str = "<system-reminder>";
    const CLOSE: &str = "</system-reminder>";
    let mut out = String::new();
    let mut rest = text;
    while let Some(start) = rest.find(OPEN) {
        out.push_str(&rest[..start]);
        match rest[start..].find(CLOSE) {
            Some(end) => rest = &rest[start + end + CLOSE.len()..],
            None => {
                rest = "";
                break;
            }
        }
    }
    out.push_str(rest);
    out.trim().to_string()
}

/// `Name(key input)` for a tool call: the first present of the fields that say what the call is
/// about (path, command, pattern, url, query, …), on one line, cut to [`TOOL_INPUT_BYTES`].
pub fn describe_tool_use(name: &str, input: &Value) -> String {
    const KEYS: &[&str] = &[
        "file_path",
        "notebook_path",
        "command",
        "cmd",
        "pattern",
        "path",
        "url",
        "query",
        "skill",
        "description",
        "subject",
        "prompt",
        "task",
    ];
    let name = if name.is_empty() { "tool" } else { name };
    let Some(obj) = input.as_object() else {
        return name.to_string();
    };
    let string_of = |key: &str| obj.get(key).and_then(Value::as_str).map(squash);
    let key = KEYS
        .iter()
        .copied()
        .find(|k| string_of(k).is_some_and(|v| !v.is_empty()));
    let value = match key {
        Some(k) => {
            let mut v = string_of(k).unwrap_or_default();
            if k == "pattern" {
                if let Some(path) = string_of("path").filter(|p| !p.is_empty()) {
                    v = format!("{v} in {path}");
                }
            }
            v
        }
        None => obj
            .values()
            .find_map(|v| v.as_str().map(squash).filter(|s| !s.is_empty()))
            .unwrap_or_default(),
    };
    if value.is_empty() {
        format!("{name}()")
    } else {
        format!("{name}({})", cut_words(&value, TOOL_INPUT_BYTES))
    }
}

/// Text of a nested content value (a tool result's content, a command's output).
fn value_text(value: &Value) -> String {
    match value {
        Value::String(s) => s.clone(),
        Value::Array(items) => items
            .iter()
            .map(|item| match item.get("type").and_then(Value::as_str) {
                Some("text") => item
                    .get("text")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_string(),
                Some(_) => marker(item),
                None => value_text(item),
            })
            .filter(|s| !s.is_empty())
            .collect::<Vec<_>>()
            .join("\n"),
        Value::Null => String::new(),
        Value::Object(_) => match value.get("text").and_then(Value::as_str) {
            Some(t) => t.to_string(),
            None => marker(value),
        },
        other => other.to_string(),
    }
}

/// A short marker for a block that is not text.
fn marker(block: &Value) -> String {
    let kind = block.get("type").and_then(Value::as_str).unwrap_or("block");
    match kind {
        "image" => "[image]".to_string(),
        "document" => match block.get("title").and_then(Value::as_str) {
            Some(title) => format!("[document: {}]", cut_words(&squash(title), 80)),
            None => "[document]".to_string(),
        },
        "search_result" => match block.get("title").and_then(Value::as_str) {
            Some(title) => format!("[search result: {}]", cut_words(&squash(title), 80)),
            None => "[search result]".to_string(),
        },
        "tool_reference" => match block.get("tool_name").and_then(Value::as_str) {
            Some(name) => format!("[tool loaded: {name}]"),
            None => "[tool loaded]".to_string(),
        },
        other => format!("[{other}]"),
    }
}

/// Reduces entries to turns. Tool results are linked to the calls they answer by
/// `tool_use_id`, which itself is not kept.
pub fn turns(entries: &[Entry]) -> Turns {
    let mut out = Turns::default();
    let mut by_id: HashMap<String, usize> = HashMap::new();
    for entry in entries {
        if entry.is_virtual || entry.is_api_error {
            continue;
        }
        let speaker = match entry.kind {
            EntryKind::User if entry.is_compact_summary => Speaker::EarlierSummary,
            EntryKind::User if entry.is_meta => Speaker::Context,
            EntryKind::User => Speaker::User,
            EntryKind::Assistant => Speaker::Assistant,
            EntryKind::Attachment => Speaker::Attachment,
            EntryKind::System if entry.subtype.as_deref() == Some("local_command") => {
                let text = entry.content.as_ref().map(value_text).unwrap_or_default();
                if !is_placeholder(&text) {
                    out.turns.push(Turn {
                        speaker: Speaker::CommandOutput,
                        parts: vec![Part::Text(text.trim().to_string())],
                    });
                }
                continue;
            }
            EntryKind::System | EntryKind::Progress | EntryKind::Other => continue,
        };
        let Some(message) = &entry.message else {
            if speaker == Speaker::Attachment {
                let kind = entry
                    .extra
                    .get("attachment")
                    .and_then(|a| a.get("type"))
                    .and_then(Value::as_str)
                    .unwrap_or("attachment");
                out.turns.push(Turn {
                    speaker,
                    parts: vec![Part::Marker(format!("[{kind}]"))],
                });
            }
            continue;
        };
        let blocks = match &message.content {
            Content::Text(text) => vec![serde_json::json!({"type": "text", "text": text})],
            Content::Blocks(blocks) => blocks.clone(),
        };
        let mut parts = Vec::new();
        for block in &blocks {
            let kind = block.get("type").and_then(Value::as_str).unwrap_or("");
            match kind {
                "text" => {
                    let text = block.get("text").and_then(Value::as_str).unwrap_or("");
                    let text = if matches!(speaker, Speaker::User | Speaker::Context) {
                        strip_reminders(text)
                    } else {
                        text.trim().to_string()
                    };
                    if !is_placeholder(&text) {
                        parts.push(Part::Text(text));
                    }
                }
                "thinking" | "redacted_thinking" => {}
                "tool_use" | "server_tool_use" | "mcp_tool_use" => {
                    let name = block.get("name").and_then(Value::as_str).unwrap_or("tool");
                    let input = block.get("input").cloned().unwrap_or(Value::Null);
                    let index = out.tools.len();
                    out.tools.push(ToolCall {
                        description: describe_tool_use(name, &input),
                        result_bytes: None,
                        is_error: false,
                    });
                    if let Some(id) = block.get("id").and_then(Value::as_str) {
                        by_id.insert(id.to_string(), index);
                    }
                    parts.push(Part::ToolUse { tool: index });
                }
                "tool_result" | "mcp_tool_result" => {
                    let tool = block
                        .get("tool_use_id")
                        .and_then(Value::as_str)
                        .and_then(|id| by_id.get(id).copied());
                    let is_error = block
                        .get("is_error")
                        .and_then(Value::as_bool)
                        .unwrap_or(false);
                    let text = block.get("content").map(value_text).unwrap_or_default();
                    if let Some(i) = tool {
                        out.tools[i].result_bytes = Some(text.len());
                        out.tools[i].is_error = is_error;
                    }
                    parts.push(Part::ToolResult {
                        tool,
                        is_error,
                        text,
                    });
                }
                _ => parts.push(Part::Marker(marker(block))),
            }
        }
        if !parts.is_empty() {
            out.turns.push(Turn { speaker, parts });
        }
    }
    out
}

/// A tool result's heading: `result of Read(src/main.rs), 1.2 KB` / `error from Bash(x)`.
fn result_heading(turns: &Turns, tool: Option<usize>, is_error: bool, bytes: usize) -> String {
    let of = tool.map(|i| turns.tools[i].description.as_str());
    match (is_error, of) {
        (false, Some(d)) => format!("result of {d}, {}", human_bytes(bytes)),
        (false, None) => format!("tool result, {}", human_bytes(bytes)),
        (true, Some(d)) => format!("error from {d}"),
        (true, None) => "tool error".to_string(),
    }
}

/// One rendered turn of the transcript: `user: …`, `assistant: …` with `tool call: …` lines,
/// tool results cut head and tail to [`TOOL_RESULT_BYTES`], context cut to [`CONTEXT_BYTES`].
pub fn render_turn(turns: &Turns, turn: &Turn) -> String {
    let mut lines: Vec<String> = Vec::new();
    let context = matches!(
        turn.speaker,
        Speaker::Context | Speaker::Attachment | Speaker::CommandOutput
    );
    for part in &turn.parts {
        match part {
            Part::Text(text) if context => lines.push(head_tail(text, CONTEXT_BYTES)),
            Part::Text(text) => lines.push(text.clone()),
            Part::Marker(m) => lines.push(m.clone()),
            Part::ToolUse { tool } => {
                lines.push(format!("[tool call: {}]", turns.tools[*tool].description))
            }
            Part::ToolResult {
                tool,
                is_error,
                text,
            } => {
                let heading = result_heading(turns, *tool, *is_error, text.len());
                let body = head_tail(text.trim(), TOOL_RESULT_BYTES);
                if body.is_empty() {
                    lines.push(format!("[{heading}: (empty)]"));
                } else {
                    lines.push(format!("[{heading}:]\n{body}"));
                }
            }
        }
    }
    let only_results = turn.speaker == Speaker::User
        && turn
            .parts
            .iter()
            .all(|p| matches!(p, Part::ToolResult { .. }));
    let tag = if only_results {
        "tool"
    } else {
        turn.speaker.tag()
    };
    format!("{tag}: {}", lines.join("\n"))
}

/// The transcript a model summarizer reads, one item per turn (join with a blank line).
pub fn transcript_items(entries: &[Entry]) -> Vec<String> {
    let turns = turns(entries);
    turns.turns.iter().map(|t| render_turn(&turns, t)).collect()
}

/// The whole source as one line, when it fits `max_bytes`: a single turn's text verbatim
/// (line breaks become spaces), several turns as `tag: text` joined by `; `. Such a line needs no
/// summarizing ("free node").
pub fn verbatim_line(entries: &[Entry], max_bytes: usize) -> Option<String> {
    let turns = turns(entries);
    // Only when rendering cut nothing: a line with `[… bytes omitted]` is not the source.
    let context_limit = |s: Speaker| match s {
        Speaker::Context | Speaker::Attachment | Speaker::CommandOutput => CONTEXT_BYTES,
        _ => usize::MAX,
    };
    let whole = turns.turns.iter().all(|t| {
        t.parts.iter().all(|p| match p {
            Part::ToolResult { text, .. } => text.trim().len() <= TOOL_RESULT_BYTES,
            Part::Text(text) => text.len() <= context_limit(t.speaker),
            _ => true,
        })
    });
    if !whole {
        return None;
    }
    let one_line = |t: &Turn| newlines_to_spaces(&render_turn(&turns, t));
    let line = match turns.turns.as_slice() {
        [] => return None,
        [turn] => {
            let rendered = one_line(turn);
            let tag_end = rendered.find(": ").map_or(0, |i| i + 2);
            rendered[tag_end..].to_string()
        }
        many => many.iter().map(one_line).collect::<Vec<_>>().join("; "),
    };
    (line.len() <= max_bytes).then_some(line)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn describes_tool_calls_by_key_field() {
        assert_eq!(
            describe_tool_use("Read", &json!({"file_path": "src/main.rs", "limit": 10})),
            "Read(src/main.rs)"
        );
        assert_eq!(
            describe_tool_use("Grep", &json!({"pattern": "fn main", "path": "src"})),
            "Grep(fn main in src)"
        );
        assert_eq!(
            describe_tool_use("TodoWrite", &json!({"todos": []})),
            "TodoWrite()"
        );
        let long = describe_tool_use("Bash", &json!({"command": "x ".repeat(200)}));
        assert!(long.len() <= "Bash()".len() + TOOL_INPUT_BYTES, "{long}");
    }

    #[test]
    fn reminders_are_stripped() {
        assert_eq!(
            strip_reminders("fix it <system-reminder>secret</system-reminder> now"),
            "fix it  now"
        );
    }
}
