//! Anthropic Messages API: the D1 invariants of `docs/PROVIDER-RULES.md`, on the exact JSON.
//!
//! Each check is one function over the parsed view of the list; [`validate`] runs them all.

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};

use serde_json::Value;

use super::{
    block_type, content_blocks, is_blank, is_server_tool_id, is_tool_id, AnthropicRules, Violation,
};

/// A1.1: at most 100,000 messages per request.
pub const MAX_MESSAGES: usize = 100_000;
/// A1.8: the whole body is at most 32 MB; the messages alone must fit.
pub const MAX_BODY_BYTES: usize = 32 * 1024 * 1024;
pub use crate::media::{IMAGE_MEDIA_TYPES, MAX_IMAGE_BASE64_BYTES};

/// A2.5: block types a user/assistant message may carry (GA and beta).
pub const KNOWN_BLOCK_TYPES: &[&str] = &[
    "text",
    "image",
    "document",
    "search_result",
    "thinking",
    "redacted_thinking",
    "tool_use",
    "tool_result",
    "server_tool_use",
    "web_search_tool_result",
    "web_fetch_tool_result",
    "code_execution_tool_result",
    "bash_code_execution_tool_result",
    "text_editor_code_execution_tool_result",
    "tool_search_tool_result",
    "container_upload",
    "compaction",
    "mcp_tool_use",
    "mcp_tool_result",
    "advisor_tool_result",
    "fallback",
];

/// A4.9: block types a `tool_result` array content may carry.
pub const TOOL_RESULT_CONTENT_TYPES: &[&str] = &[
    "text",
    "image",
    "document",
    "search_result",
    "tool_reference",
];

/// Validate an Anthropic `messages` array. An empty result means every checked rule holds.
pub fn validate(messages: &[Value], rules: &AnthropicRules) -> Vec<Violation> {
    let msgs = view(messages);
    let mut out = Vec::new();
    for check in CHECKS {
        check(&msgs, rules, &mut out);
    }
    out
}

type Check = fn(&[Msg<'_>], &AnthropicRules, &mut Vec<Violation>);

const CHECKS: &[Check] = &[
    check_size,
    check_shape,
    check_known_block_types,
    check_roles,
    check_first_is_user,
    check_alternation,
    check_non_empty,
    check_ending,
    check_ids,
    check_results_follow_uses,
    check_no_orphan_results,
    check_server_tools,
    check_thinking_shape,
    check_thinking_mode,
    check_manual_thinking,
    check_thinking_provenance,
    check_cache_control,
    check_media,
    check_tool_result_content,
];

/// One message as the checks see it.
struct Msg<'a> {
    raw: &'a Value,
    role: Option<&'a str>,
    content: Option<&'a Value>,
    /// String content as one text block; non-string, non-array content as no blocks.
    blocks: Vec<Cow<'a, Value>>,
}

impl Msg<'_> {
    fn is_user(&self) -> bool {
        self.role == Some("user")
    }
    fn is_assistant(&self) -> bool {
        self.role == Some("assistant")
    }
    fn typed(&self) -> impl Iterator<Item = (usize, &str, &Value)> {
        self.blocks
            .iter()
            .enumerate()
            .filter_map(|(j, b)| block_type(b).map(|t| (j, t, b.as_ref())))
    }
    fn ids_of(&self, ty: &str) -> Vec<String> {
        self.typed()
            .filter(|(_, t, _)| *t == ty)
            .map(|(_, _, b)| id_of(b, "id"))
            .collect()
    }
}

fn view(messages: &[Value]) -> Vec<Msg<'_>> {
    messages
        .iter()
        .map(|raw| {
            let content = raw.get("content");
            Msg {
                raw,
                role: raw.get("role").and_then(Value::as_str),
                content,
                blocks: content_blocks(content),
            }
        })
        .collect()
}

fn id_of(block: &Value, key: &str) -> String {
    block
        .get(key)
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string()
}

fn non_empty_str<'v>(block: &'v Value, key: &str) -> Option<&'v str> {
    block
        .get(key)
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
}

fn is_thinking(ty: &str) -> bool {
    ty == "thinking" || ty == "redacted_thinking"
}

/// A server tool's result block: `<name>_tool_result` (not the client `tool_result`), MCP results.
fn is_server_result(ty: &str) -> bool {
    ty != "tool_result" && ty.ends_with("_tool_result")
}

fn is_server_use(ty: &str) -> bool {
    ty == "server_tool_use" || ty == "mcp_tool_use"
}

/// The index of the last message when it is an assistant turn that truly ends the request.
fn prefill_index(msgs: &[Msg<'_>], rules: &AnthropicRules) -> Option<usize> {
    let last = msgs.len().checked_sub(1)?;
    (rules.trailing_assistant_is_prefill && msgs[last].is_assistant()).then_some(last)
}

fn joined(ids: &[String]) -> String {
    ids.join(", ")
}

/// D1.1 size: 1 ≤ len ≤ 100,000 (an empty list allowed when `allow_empty`); serialized ≤ 32 MB.
fn check_size(msgs: &[Msg<'_>], rules: &AnthropicRules, out: &mut Vec<Violation>) {
    if msgs.is_empty() && !rules.allow_empty {
        out.push(Violation::new(
            "D1.1",
            None,
            "messages: messages must have at least one element",
        ));
    }
    if msgs.len() > MAX_MESSAGES {
        out.push(Violation::new(
            "D1.1",
            None,
            format!(
                "messages: There is a limit of {MAX_MESSAGES} messages in a single request. Found {}.",
                msgs.len()
            ),
        ));
    }
    let bytes: usize = msgs
        .iter()
        .map(|m| serde_json::to_vec(m.raw).map_or(0, |v| v.len() + 1))
        .sum();
    if bytes > MAX_BODY_BYTES {
        out.push(Violation::new(
            "D1.1",
            None,
            format!("request_too_large: messages serialize to {bytes} bytes > {MAX_BODY_BYTES}"),
        ));
    }
}

/// D1.0 envelope: each message is an object with exactly `role` and `content`; content is a string
/// or an array of objects with a string `type`; the fields each known block needs are present.
fn check_shape(msgs: &[Msg<'_>], _: &AnthropicRules, out: &mut Vec<Violation>) {
    for (i, m) in msgs.iter().enumerate() {
        let Some(obj) = m.raw.as_object() else {
            out.push(Violation::at(
                "D1.0",
                i,
                format!("messages.{i}: Input should be a valid dictionary"),
            ));
            continue;
        };
        for key in obj.keys() {
            if key != "role" && key != "content" {
                out.push(Violation::at(
                    "D1.0",
                    i,
                    format!("messages.{i}.{key}: Extra inputs are not permitted"),
                ));
            }
        }
        for key in ["role", "content"] {
            if !obj.contains_key(key) {
                out.push(Violation::at(
                    "D1.0",
                    i,
                    format!("messages.{i}.{key}: Field required"),
                ));
            }
        }
        if obj.get("role").is_some_and(|r| !r.is_string()) {
            out.push(Violation::at(
                "D1.0",
                i,
                format!("messages.{i}.role: Input should be a valid string"),
            ));
        }
        match m.content {
            None | Some(Value::String(_)) => {}
            Some(Value::Array(items)) => {
                for (j, b) in items.iter().enumerate() {
                    if let Some(problem) = block_shape_problem(b) {
                        out.push(Violation::at(
                            "D1.0",
                            i,
                            format!("messages.{i}.content.{j}{problem}"),
                        ));
                    }
                }
            }
            Some(_) => out.push(Violation::at(
                "D1.0",
                i,
                format!("messages.{i}.content: Input should be a valid string or a valid list"),
            )),
        }
    }
}

/// The first missing/mistyped field of a block, as a `.path: error` suffix.
fn block_shape_problem(b: &Value) -> Option<String> {
    if !b.is_object() {
        return Some(": Input should be a valid dictionary".into());
    }
    let Some(ty) = block_type(b) else {
        return Some(".type: Field required".into());
    };
    let need_str = |key: &str| match b.get(key) {
        Some(Value::String(_)) => None,
        Some(_) => Some(format!(".{ty}.{key}: Input should be a valid string")),
        None => Some(format!(".{ty}.{key}: Field required")),
    };
    match ty {
        "text" => need_str("text"),
        "tool_use" | "server_tool_use" | "mcp_tool_use" => {
            need_str("id").or_else(|| need_str("name")).or_else(|| {
                (b.get("name").and_then(Value::as_str) == Some(""))
                    .then(|| format!(".{ty}.name: String should have at least 1 character"))
            })
        }
        "tool_result" => need_str("tool_use_id"),
        "image" | "document" => (!b.get("source").is_some_and(Value::is_object))
            .then(|| format!(".{ty}.source: Field required")),
        t if is_server_result(t) => need_str("tool_use_id"),
        _ => None,
    }
}

/// A2.5: only block types the provider lists (when `known_block_types_only`).
fn check_known_block_types(msgs: &[Msg<'_>], rules: &AnthropicRules, out: &mut Vec<Violation>) {
    if !rules.known_block_types_only {
        return;
    }
    for (i, m) in msgs.iter().enumerate() {
        for (j, ty, _) in m.typed() {
            if !KNOWN_BLOCK_TYPES.contains(&ty) {
                out.push(Violation::at(
                    "A2.5",
                    i,
                    format!("messages.{i}.content.{j}: Input tag '{ty}' found using 'type' does not match any of the expected tags"),
                ));
            }
        }
    }
}

/// D1.2: role ∈ {user, assistant} (no `system` role: Loupe targets every model).
fn check_roles(msgs: &[Msg<'_>], _: &AnthropicRules, out: &mut Vec<Violation>) {
    for (i, m) in msgs.iter().enumerate() {
        if let Some(role) = m.role {
            if role != "user" && role != "assistant" {
                out.push(Violation::at(
                    "D1.2",
                    i,
                    format!(
                        "messages.{i}.role: Input should be 'user' or 'assistant' (found '{role}')"
                    ),
                ));
            }
        }
    }
}

/// D1.3: the first message is `user`, unless it is an assistant message that opens with a
/// server-side `compaction` block: that block must be the first one sent, and stands for
/// everything before it (A9.1, § F).
fn check_first_is_user(msgs: &[Msg<'_>], _: &AnthropicRules, out: &mut Vec<Violation>) {
    if let Some(first) = msgs.first() {
        let opens_with_compaction = first.is_assistant()
            && first
                .typed()
                .next()
                .is_some_and(|(j, t, _)| j == 0 && t == "compaction");
        if !first.is_user() && !opens_with_compaction {
            out.push(Violation::at(
                "D1.3",
                0,
                "messages: first message must use the \"user\" role",
            ));
        }
    }
}

/// D1.4: strict alternation (no reliance on server-side merging).
fn check_alternation(msgs: &[Msg<'_>], _: &AnthropicRules, out: &mut Vec<Violation>) {
    for i in 1..msgs.len() {
        if let (Some(a), Some(b)) = (msgs[i - 1].role, msgs[i].role) {
            if a == b {
                out.push(Violation::at(
                    "D1.4",
                    i,
                    format!("messages.{i}: roles must alternate between \"user\" and \"assistant\", but found multiple \"{b}\" roles in a row"),
                ));
            }
        }
    }
}

/// D1.5: non-empty content (except a true prefill), no `""` text block anywhere (also nested in
/// tool results, A2.3), no whitespace-only top-level text block or string content (A2.4, the
/// conservative form).
fn check_non_empty(msgs: &[Msg<'_>], rules: &AnthropicRules, out: &mut Vec<Violation>) {
    let prefill = prefill_index(msgs, rules);
    for (i, m) in msgs.iter().enumerate() {
        let exempt = prefill == Some(i);
        let empty = match m.content {
            Some(Value::String(s)) => s.is_empty(),
            Some(Value::Array(a)) => a.is_empty(),
            _ => false,
        };
        if empty {
            if !exempt {
                out.push(Violation::at(
                    "D1.5",
                    i,
                    format!("messages.{i}: all messages must have non-empty content except for the optional final assistant message"),
                ));
            }
            continue;
        }
        for (j, ty, b) in m.typed() {
            if ty == "text" {
                if let Some(text) = b.get("text").and_then(Value::as_str) {
                    if text.is_empty() {
                        out.push(Violation::at(
                            "D1.5",
                            i,
                            format!(
                                "messages.{i}.content.{j}: text content blocks must be non-empty"
                            ),
                        ));
                    } else if is_blank(text) {
                        out.push(Violation::at(
                            "D1.5",
                            i,
                            format!("messages.{i}.content.{j}: text content blocks must contain non-whitespace text"),
                        ));
                    }
                }
            }
            if ty == "tool_result" {
                if let Some(Value::Array(items)) = b.get("content") {
                    for (k, nested) in items.iter().enumerate() {
                        if block_type(nested) == Some("text")
                            && nested.get("text").and_then(Value::as_str) == Some("")
                        {
                            out.push(Violation::at(
                                "D1.5",
                                i,
                                format!("messages.{i}.content.{j}.content.{k}: text content blocks must be non-empty"),
                            ));
                        }
                    }
                }
            }
        }
    }
}

/// D1.6 ending: a trailing assistant needs `allow_trailing_assistant`; a true prefill must not
/// end in whitespace (A3.3). (Trailing thinking is D1.11, unanswered tool use D1.8 / D1.10.)
fn check_ending(msgs: &[Msg<'_>], rules: &AnthropicRules, out: &mut Vec<Violation>) {
    let Some(last) = msgs.len().checked_sub(1) else {
        return;
    };
    if !msgs[last].is_assistant() {
        return;
    }
    if !rules.allow_trailing_assistant {
        out.push(Violation::at(
            "D1.6",
            last,
            "This model does not support assistant message prefill. The conversation must end with a user message.",
        ));
    }
    if prefill_index(msgs, rules).is_some() {
        let last_text = msgs[last]
            .typed()
            .filter(|(_, t, _)| *t == "text")
            .filter_map(|(_, _, b)| b.get("text").and_then(Value::as_str))
            .last();
        if last_text.is_some_and(|t| t.ends_with(char::is_whitespace)) {
            out.push(Violation::at(
                "D1.6",
                last,
                "messages: final assistant content cannot end with trailing whitespace",
            ));
        }
    }
}

/// D1.7 ids: `tool_use.id` =~ `^[a-zA-Z0-9_-]+$` (also `tool_result.tool_use_id`),
/// `server_tool_use.id` =~ `^srvtoolu_[a-zA-Z0-9_]+$`, ids unique request-wide, `input` objects.
fn check_ids(msgs: &[Msg<'_>], _: &AnthropicRules, out: &mut Vec<Violation>) {
    let mut seen: HashSet<String> = HashSet::new();
    for (i, m) in msgs.iter().enumerate() {
        for (j, ty, b) in m.typed() {
            match ty {
                "tool_use" | "server_tool_use" | "mcp_tool_use" => {
                    let id = b.get("id").and_then(Value::as_str);
                    if let Some(id) = id {
                        if ty == "tool_use" && !is_tool_id(id) {
                            out.push(Violation::at(
                                "D1.7",
                                i,
                                format!("messages.{i}.content.{j}.tool_use.id: String should match pattern '^[a-zA-Z0-9_-]+$' (got {id:?})"),
                            ));
                        }
                        if ty == "server_tool_use" && !is_server_tool_id(id) {
                            out.push(Violation::at(
                                "D1.7",
                                i,
                                format!("messages.{i}.content.{j}.server_tool_use.id: String should match pattern '^srvtoolu_[a-zA-Z0-9_]+$' (got {id:?})"),
                            ));
                        }
                        if !seen.insert(id.to_string()) {
                            out.push(Violation::at(
                                "D1.7",
                                i,
                                format!("messages.{i}.content.{j}: `tool_use` ids must be unique (duplicate {id:?})"),
                            ));
                        }
                    }
                    if !b.get("input").is_some_and(Value::is_object) {
                        out.push(Violation::at(
                            "D1.7",
                            i,
                            format!("messages.{i}.content.{j}.{ty}.input: Input should be a valid dictionary"),
                        ));
                    }
                }
                "tool_result" => {
                    if let Some(id) = b.get("tool_use_id").and_then(Value::as_str) {
                        if !is_tool_id(id) {
                            out.push(Violation::at(
                                "D1.7",
                                i,
                                format!("messages.{i}.content.{j}.tool_result.tool_use_id: String should match pattern '^[a-zA-Z0-9_-]+$' (got {id:?})"),
                            ));
                        }
                    }
                }
                _ => {}
            }
        }
    }
}

/// D1.8 results follow uses: an assistant turn with client `tool_use` ids U is followed by a user
/// turn starting with exactly |U| `tool_result` blocks whose ids are U; no `tool_result` after a
/// non-`tool_result` block; `tool_use` only in assistant turns. A trailing assistant with `tool_use`
/// fails: whatever comes after it (the caller's user turn, or nothing) cannot answer it.
fn check_results_follow_uses(msgs: &[Msg<'_>], _: &AnthropicRules, out: &mut Vec<Violation>) {
    for (i, m) in msgs.iter().enumerate() {
        if m.is_user() {
            let mut seen_other = false;
            for (j, ty, _) in m.typed() {
                match ty {
                    "tool_result" if seen_other => out.push(Violation::at(
                        "D1.8",
                        i,
                        format!("messages.{i}.content.{j}: `tool_result` blocks must come first in a user message: found one after a non-`tool_result` block"),
                    )),
                    "tool_result" => {}
                    "tool_use" => out.push(Violation::at(
                        "D1.8",
                        i,
                        format!("messages.{i}.content.{j}: `tool_use` blocks can only appear in assistant messages"),
                    )),
                    _ => seen_other = true,
                }
            }
        }
        if !m.is_assistant() {
            continue;
        }
        let uses = m.ids_of("tool_use");
        if uses.is_empty() {
            continue;
        }
        let leading: Vec<String> = match msgs.get(i + 1) {
            Some(next) if next.is_user() => next
                .blocks
                .iter()
                .take_while(|b| block_type(b) == Some("tool_result"))
                .map(|b| id_of(b, "tool_use_id"))
                .collect(),
            _ => Vec::new(),
        };
        let missing: Vec<String> = uses
            .iter()
            .filter(|u| !leading.contains(u))
            .cloned()
            .collect();
        if !missing.is_empty() {
            out.push(Violation::at(
                "D1.8",
                i + 1,
                format!("messages.{}: `tool_use` ids were found without `tool_result` blocks immediately after: {}. Each `tool_use` block must have a corresponding `tool_result` block in the next message.", i + 1, joined(&missing)),
            ));
        } else if leading.len() != uses.len() {
            out.push(Violation::at(
                "D1.8",
                i + 1,
                format!("messages.{}: Found {} `tool_result` block(s) at the beginning of this message for {} `tool_use` block(s). Messages following `tool_use` blocks must begin with a matching number of `tool_result` blocks.", i + 1, leading.len(), uses.len()),
            ));
        }
    }
}

/// D1.9 no orphan / duplicate results: every `tool_result` is in a user turn, answers a `tool_use`
/// of the previous (assistant) turn, and its id is unique within the turn.
fn check_no_orphan_results(msgs: &[Msg<'_>], _: &AnthropicRules, out: &mut Vec<Violation>) {
    for (i, m) in msgs.iter().enumerate() {
        let prev_uses: Vec<String> = match i.checked_sub(1).map(|p| &msgs[p]) {
            Some(prev) if prev.is_assistant() => prev.ids_of("tool_use"),
            _ => Vec::new(),
        };
        let mut seen: HashSet<String> = HashSet::new();
        for (j, ty, b) in m.typed() {
            if ty != "tool_result" {
                continue;
            }
            let id = id_of(b, "tool_use_id");
            if !m.is_user() {
                out.push(Violation::at(
                    "D1.9",
                    i,
                    format!("messages.{i}.content.{j}: `tool_result` blocks can only appear in user messages"),
                ));
            } else if !prev_uses.contains(&id) {
                out.push(Violation::at(
                    "D1.9",
                    i,
                    format!("messages.{i}.content.{j}: unexpected `tool_use_id` found in `tool_result` blocks: {id}. Each `tool_result` block must have a corresponding `tool_use` block in the previous message."),
                ));
            }
            if !seen.insert(id.clone()) {
                out.push(Violation::at(
                    "D1.9",
                    i,
                    format!("messages.{i}.content.{j}: each tool_use must have a single result. Found multiple `tool_result` blocks with id: {id}"),
                ));
            }
        }
    }
}

/// A user turn that holds only `tool_result` blocks (and at least one).
fn is_tool_result_only(m: &Msg<'_>) -> bool {
    m.is_user()
        && !m.blocks.is_empty()
        && m.blocks
            .iter()
            .all(|b| block_type(b) == Some("tool_result"))
}

/// The server call that made a client `tool_use` (programmatic tool calling).
fn caller_of(b: &Value) -> Option<&str> {
    b.get("caller")?.get("tool_id")?.as_str()
}

/// Whether the assistant turn `at` goes on with the programmatic call `id`: it holds client
/// calls, each made by `id`, and a tool-result-only user turn answers it.
fn continues_call(msgs: &[Msg<'_>], at: usize, id: &str) -> bool {
    let m = &msgs[at];
    let calls: Vec<&Value> = m
        .typed()
        .filter(|(_, t, _)| *t == "tool_use")
        .map(|(_, _, b)| b)
        .collect();
    m.is_assistant() && !calls.is_empty() && calls.iter().all(|b| caller_of(b) == Some(id))
}

/// The assistant turn before `i` that makes server call `id` (of type `ty`) and whose result is
/// deferred to turn `i` (A5.3): turn i−2 across a tool-result-only user turn, or further back
/// through turns that go on with that call (each tool-result-only user turn after a turn whose
/// client calls `id` made).
fn deferred_origin(msgs: &[Msg<'_>], i: usize, ty: &str, id: &str) -> Option<usize> {
    let mut at = i;
    loop {
        let before = at.checked_sub(2)?;
        if !(is_tool_result_only(&msgs[at - 1]) && msgs[before].is_assistant()) {
            return None;
        }
        if msgs[before].ids_of(ty).iter().any(|u| u == id) {
            return Some(before);
        }
        if !continues_call(msgs, before, id) {
            return None;
        }
        at = before;
    }
}

/// Whether a later turn answers server call `id` of assistant turn `i` (deferred, A5.3).
fn answered_after(msgs: &[Msg<'_>], i: usize, id: &str) -> bool {
    let mut at = i;
    loop {
        let (Some(between), Some(later)) = (msgs.get(at + 1), msgs.get(at + 2)) else {
            return false;
        };
        if !(is_tool_result_only(between) && later.is_assistant()) {
            return false;
        }
        let answers = later
            .typed()
            .any(|(_, t, b)| is_server_result(t) && id_of(b, "tool_use_id") == id);
        if answers {
            return true;
        }
        if !continues_call(msgs, at + 2, id) {
            return false;
        }
        at += 2;
    }
}

/// D1.10 server tools: every server result block references a `server_tool_use` earlier in the
/// same assistant turn, or a deferred one ([`deferred_origin`], A5.3); every `server_tool_use`
/// gets its result that way; a client call's `caller` names a server call of its turn or one
/// still deferred. A trailing assistant may keep one unresolved only as a true prefill
/// (`pause_turn` continuation, A3.6): a plain user turn cannot follow it.
fn check_server_tools(msgs: &[Msg<'_>], rules: &AnthropicRules, out: &mut Vec<Violation>) {
    let prefill = prefill_index(msgs, rules);
    for (i, m) in msgs.iter().enumerate() {
        let mut uses_so_far: HashSet<String> = HashSet::new();
        for (j, ty, b) in m.typed() {
            if is_server_use(ty) {
                uses_so_far.insert(id_of(b, "id"));
                continue;
            }
            if ty == "tool_use" {
                if let Some(caller) = caller_of(b) {
                    let known = uses_so_far.contains(caller)
                        || m.ids_of("server_tool_use").iter().any(|u| u == caller)
                        || deferred_origin(msgs, i, "server_tool_use", caller).is_some();
                    if !known {
                        out.push(Violation::at(
                            "D1.10",
                            i,
                            format!("messages.{i}.content.{j}: `caller.tool_id` {caller} names no `server_tool_use` of this turn or one still running"),
                        ));
                    }
                }
                continue;
            }
            if !is_server_result(ty) {
                continue;
            }
            let id = id_of(b, "tool_use_id");
            let expected = if ty == "mcp_tool_result" {
                "mcp_tool_use"
            } else {
                "server_tool_use"
            };
            let ok = m.is_assistant()
                && (uses_so_far.contains(&id) || deferred_origin(msgs, i, expected, &id).is_some());
            if !ok {
                out.push(Violation::at(
                    "D1.10",
                    i,
                    format!("messages.{i}.content.{j}: unexpected `tool_use_id` found in `{ty}` blocks: {id}. Each `{ty}` block must have a corresponding `{expected}` block before it."),
                ));
            }
        }
        if !m.is_assistant() || prefill == Some(i) {
            continue;
        }
        let results_here: Vec<(usize, String)> = m
            .typed()
            .filter(|(_, t, _)| is_server_result(t))
            .map(|(j, _, b)| (j, id_of(b, "tool_use_id")))
            .collect();
        for (j, ty, b) in m.typed() {
            if !is_server_use(ty) {
                continue;
            }
            let id = id_of(b, "id");
            let answered_later = results_here.iter().any(|(k, r)| *k > j && *r == id);
            if answered_later || answered_after(msgs, i, &id) {
                continue;
            }
            let name = b.get("name").and_then(Value::as_str).unwrap_or("mcp");
            let name = if ty == "mcp_tool_use" { "mcp" } else { name };
            out.push(Violation::at(
                "D1.10",
                i,
                format!("messages.{i}.content.{j}: `{name}` tool use with id `{id}` was found without a corresponding `{name}_tool_result` block"),
            ));
        }
    }
}

/// D1.11 thinking shape: `thinking` has a `thinking` string and a non-empty `signature`;
/// `redacted_thinking` has `data`; thinking only in assistant turns and never their last block.
fn check_thinking_shape(msgs: &[Msg<'_>], _: &AnthropicRules, out: &mut Vec<Violation>) {
    for (i, m) in msgs.iter().enumerate() {
        for (j, ty, b) in m.typed() {
            match ty {
                "thinking" => {
                    if !b.get("thinking").is_some_and(Value::is_string) {
                        out.push(Violation::at(
                            "D1.11",
                            i,
                            format!("messages.{i}.content.{j}.thinking.thinking: Field required"),
                        ));
                    }
                    if non_empty_str(b, "signature").is_none() {
                        out.push(Violation::at(
                            "D1.11",
                            i,
                            format!("messages.{i}.content.{j}.thinking.signature: Field required"),
                        ));
                    }
                }
                "redacted_thinking" => {
                    if non_empty_str(b, "data").is_none() {
                        out.push(Violation::at(
                            "D1.11",
                            i,
                            format!(
                                "messages.{i}.content.{j}.redacted_thinking.data: Field required"
                            ),
                        ));
                    }
                }
                _ => continue,
            }
            if !m.is_assistant() {
                out.push(Violation::at(
                    "D1.11",
                    i,
                    format!("messages.{i}.content.{j}: `{ty}` blocks can only appear in assistant messages"),
                ));
            }
        }
        if m.is_assistant() {
            if let Some(last) = m.blocks.last().and_then(|b| block_type(b)) {
                if is_thinking(last) {
                    out.push(Violation::at(
                        "D1.11",
                        i,
                        format!("messages.{i}: The final block in an assistant message cannot be `thinking`."),
                    ));
                }
            }
        }
    }
}

/// D1.13: with thinking disabled, an assistant in final position holds no thinking blocks.
/// (Checked on a trailing assistant even though the caller appends a user turn: conservative.)
fn check_thinking_mode(msgs: &[Msg<'_>], rules: &AnthropicRules, out: &mut Vec<Violation>) {
    if rules.thinking_enabled {
        return;
    }
    let Some(last) = msgs.last() else { return };
    if !last.is_assistant() {
        return;
    }
    let i = msgs.len() - 1;
    if let Some((j, _, _)) = last.typed().find(|(_, t, _)| is_thinking(t)) {
        out.push(Violation::at(
            "D1.13",
            i,
            format!("messages.{i}.content.{j}: When thinking is disabled, an `assistant` message in the final position cannot contain `thinking`. To use thinking blocks, enable `thinking` in your request."),
        ));
    }
}

/// D1.13 (manual mode, A6.5): when the list ends with a tool-result-only user turn, the assistant
/// turn that opened the loop (the first after the last user turn with anything else) starts with
/// thinking.
fn check_manual_thinking(msgs: &[Msg<'_>], rules: &AnthropicRules, out: &mut Vec<Violation>) {
    if !rules.manual_thinking || !msgs.last().is_some_and(is_tool_result_only) {
        return;
    }
    let start = msgs
        .iter()
        .rposition(|m| m.is_user() && !is_tool_result_only(m))
        .map_or(0, |i| i + 1);
    let Some((i, opener)) = msgs
        .iter()
        .enumerate()
        .skip(start)
        .find(|(_, m)| m.is_assistant())
    else {
        return;
    };
    // A server-side compaction block opening the turn stands for what came before it: the
    // turn starts after it.
    let first = opener
        .blocks
        .iter()
        .filter_map(|b| block_type(b))
        .find(|t| *t != "compaction")
        .unwrap_or("");
    if !is_thinking(first) {
        out.push(Violation::at(
            "D1.13",
            i,
            format!("messages.{i}.content.0.type: Expected `thinking` or `redacted_thinking`, but found `{first}`. When `thinking` is enabled, a final `assistant` message must start with a thinking block (preceeding the lastmost set of `tool_use` and `tool_result` blocks)."),
        ));
    }
}

/// D1.14: no thinking block written by another model (its signature or redacted data is listed in
/// `foreign_signatures`).
fn check_thinking_provenance(msgs: &[Msg<'_>], rules: &AnthropicRules, out: &mut Vec<Violation>) {
    if rules.foreign_signatures.is_empty() {
        return;
    }
    for (i, m) in msgs.iter().enumerate() {
        for (j, t, b) in m.typed() {
            let sig = match t {
                "thinking" => b.get("signature"),
                "redacted_thinking" => b.get("data"),
                _ => continue,
            };
            let sig = sig.and_then(Value::as_str).unwrap_or_default();
            if rules.foreign_signatures.iter().any(|f| f == sig) {
                out.push(Violation::at(
                    "D1.14",
                    i,
                    format!("messages.{i}.content.{j}: Invalid `signature` in `{t}` block (written by another model)"),
                ));
            }
        }
    }
}

/// Every block of a message with its path, including blocks nested in `tool_result` content.
fn all_blocks<'m>(m: &'m Msg<'_>) -> Vec<(String, bool, &'m Value)> {
    let mut v = Vec::new();
    for (j, b) in m.blocks.iter().enumerate() {
        let b: &Value = b.as_ref();
        v.push((format!("content.{j}"), false, b));
        if block_type(b) == Some("tool_result") {
            if let Some(Value::Array(items)) = b.get("content") {
                for (k, nested) in items.iter().enumerate() {
                    v.push((format!("content.{j}.content.{k}"), true, nested));
                }
            }
        }
    }
    v
}

/// D1.15 caching: ≤ `max_cache_breakpoints` markers, well-formed (`ephemeral`, ttl 5m/1h), none on
/// thinking / redacted_thinking / empty text, and no `1h` marker after a `5m` one (A8.2).
fn check_cache_control(msgs: &[Msg<'_>], rules: &AnthropicRules, out: &mut Vec<Violation>) {
    let mut count = 0usize;
    let mut seen_5m = false;
    for (i, m) in msgs.iter().enumerate() {
        for (path, _, b) in all_blocks(m) {
            let Some(cc) = b.get("cache_control").filter(|c| !c.is_null()) else {
                continue;
            };
            count += 1;
            if cc.get("type").and_then(Value::as_str) != Some("ephemeral") {
                out.push(Violation::at(
                    "D1.15",
                    i,
                    format!("messages.{i}.{path}.cache_control.type: Input should be 'ephemeral'"),
                ));
            }
            let ttl = match cc.get("ttl") {
                None | Some(Value::Null) => "5m",
                Some(t) => t.as_str().unwrap_or("?"),
            };
            match ttl {
                "5m" => seen_5m = true,
                "1h" if seen_5m => out.push(Violation::at(
                    "D1.15",
                    i,
                    format!("messages.{i}.{path}.cache_control.ttl: a ttl='1h' cache_control block must not come after a ttl='5m' cache_control block. Note that blocks are processed in the following order: `tools`, `system`, `messages`."),
                )),
                "1h" => {}
                other => out.push(Violation::at(
                    "D1.15",
                    i,
                    format!("messages.{i}.{path}.cache_control.ttl: Input should be '5m' or '1h' (got {other:?})"),
                )),
            }
            let ty = block_type(b).unwrap_or_default();
            let empty_text = ty == "text" && b.get("text").and_then(Value::as_str) == Some("");
            if is_thinking(ty) || empty_text {
                out.push(Violation::at(
                    "D1.15",
                    i,
                    format!(
                        "messages.{i}.{path}: cache_control cannot be set on {} blocks",
                        if empty_text { "empty text" } else { ty }
                    ),
                ));
            }
        }
    }
    if count > rules.max_cache_breakpoints {
        out.push(Violation::new(
            "D1.15",
            None,
            format!(
                "A maximum of {} blocks with cache_control may be provided. Found {count}.",
                rules.max_cache_breakpoints
            ),
        ));
    }
}

/// D1.16 media: images / documents only in user turns or inside a `tool_result`; at most
/// `max_media` of them in all; base64 images pass the shared image rules (A7.1–A7.3: media type,
/// magic bytes, ≤ 5 MB, ≤ 8000 px, ≤ 2000 px beyond 20 images; see [`crate::media`]).
fn check_media(msgs: &[Msg<'_>], rules: &AnthropicRules, out: &mut Vec<Violation>) {
    let mut count = 0usize;
    let mut images = Vec::new();
    for (i, m) in msgs.iter().enumerate() {
        for (path, nested, b) in all_blocks(m) {
            let ty = block_type(b).unwrap_or_default();
            if ty != "image" && ty != "document" {
                continue;
            }
            count += 1;
            if !nested && !m.is_user() {
                out.push(Violation::at(
                    "D1.16",
                    i,
                    format!("messages.{i}.{path}: `{ty}` blocks are only allowed in user messages"),
                ));
            }
            let source = b.get("source");
            if ty == "image"
                && source.and_then(|s| s.get("type")).and_then(Value::as_str) == Some("base64")
            {
                let source = source.unwrap_or(&Value::Null);
                let media = source
                    .get("media_type")
                    .and_then(Value::as_str)
                    .unwrap_or_default();
                let data = source
                    .get("data")
                    .and_then(Value::as_str)
                    .unwrap_or_default();
                images.push((
                    i,
                    format!("{path}.image.source.base64"),
                    media.to_string(),
                    data.to_string(),
                ));
            }
        }
    }
    for (i, path, problem) in crate::media::check_images(&images) {
        out.push(Violation::at(
            "D1.16",
            i,
            format!("messages.{i}.{path}: {problem}"),
        ));
    }
    if count > rules.max_media {
        out.push(Violation::new(
            "D1.16",
            None,
            format!(
                "Too many media items: found {count} image/document blocks, at most {} are allowed",
                rules.max_media
            ),
        ));
    }
}

/// A4.9: `tool_result.content` is absent, a string, or an array of text / image / document /
/// search_result / tool_reference blocks (a tool_reference not mixed with other types);
/// `is_error` is a bool.
fn check_tool_result_content(msgs: &[Msg<'_>], _: &AnthropicRules, out: &mut Vec<Violation>) {
    for (i, m) in msgs.iter().enumerate() {
        for (j, ty, b) in m.typed() {
            if ty != "tool_result" {
                continue;
            }
            if b.get("is_error").is_some_and(|e| !e.is_boolean()) {
                out.push(Violation::at(
                    "A4.9",
                    i,
                    format!("messages.{i}.content.{j}.tool_result.is_error: Input should be a valid boolean"),
                ));
            }
            match b.get("content") {
                None | Some(Value::String(_)) => {}
                Some(Value::Array(items)) => {
                    let mut kinds: HashMap<bool, usize> = HashMap::new();
                    for (k, nested) in items.iter().enumerate() {
                        let nty = block_type(nested);
                        match nty {
                            Some(t) if TOOL_RESULT_CONTENT_TYPES.contains(&t) => {
                                *kinds.entry(t == "tool_reference").or_default() += 1;
                                if t == "text" && !nested.get("text").is_some_and(Value::is_string) {
                                    out.push(Violation::at(
                                        "A4.9",
                                        i,
                                        format!("messages.{i}.content.{j}.content.{k}.text: Field required"),
                                    ));
                                }
                            }
                            _ => out.push(Violation::at(
                                "A4.9",
                                i,
                                format!("messages.{i}.content.{j}.content.{k}.type: Input should be 'text', 'image', 'document', 'search_result' or 'tool_reference' (got {})", nty.map_or("no type".to_string(), |t| format!("'{t}'"))),
                            )),
                        }
                    }
                    if kinds.len() == 2 {
                        out.push(Violation::at(
                            "A4.9",
                            i,
                            format!("messages.{i}.content.{j}.content: `tool_reference` blocks cannot be mixed with other content types in a `tool_result`"),
                        ));
                    }
                }
                Some(_) => out.push(Violation::at(
                    "A4.9",
                    i,
                    format!("messages.{i}.content.{j}.tool_result.content: Input should be a valid string or a valid list"),
                )),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn msgs(v: Value) -> Vec<Value> {
        v.as_array().expect("array").clone()
    }

    /// Run one check on a list with the given rules.
    fn run_with(check: Check, list: Value, rules: &AnthropicRules) -> Vec<Violation> {
        let list = msgs(list);
        let view = view(&list);
        let mut out = Vec::new();
        check(&view, rules, &mut out);
        out
    }

    fn run(check: Check, list: Value) -> Vec<Violation> {
        run_with(check, list, &AnthropicRules::default())
    }

    fn rules_of(v: &[Violation]) -> Vec<&'static str> {
        v.iter().map(|v| v.rule).collect()
    }

    fn tool_loop() -> Value {
        json!([
            {"role": "user", "content": "list the files"},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "use ls", "signature": "sig1"},
                {"type": "text", "text": "Listing."},
                {"type": "tool_use", "id": "toolu_01", "name": "Bash", "input": {"command": "ls"}},
                {"type": "tool_use", "id": "toolu_02", "name": "Bash", "input": {"command": "pwd"}}
            ]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_02", "content": "/work"},
                {"type": "tool_result", "tool_use_id": "toolu_01", "content": [{"type": "text", "text": "a b"}], "is_error": false},
                {"type": "text", "text": "thanks", "cache_control": {"type": "ephemeral"}}
            ]},
            {"role": "assistant", "content": [
                {"type": "server_tool_use", "id": "srvtoolu_01", "name": "web_search", "input": {"query": "x"}},
                {"type": "web_search_tool_result", "tool_use_id": "srvtoolu_01", "content": []},
                {"type": "text", "text": "Two files."}
            ]}
        ])
    }

    #[test]
    fn good_list_passes_every_check() {
        let list = msgs(tool_loop());
        assert_eq!(validate(&list, &AnthropicRules::default()), vec![]);
        let strict = AnthropicRules {
            allow_empty: false,
            known_block_types_only: true,
            ..AnthropicRules::default()
        };
        assert_eq!(validate(&list, &strict), vec![]);
        assert_eq!(validate(&[], &AnthropicRules::default()), vec![]);
    }

    #[test]
    fn size() {
        let strict = AnthropicRules {
            allow_empty: false,
            ..AnthropicRules::default()
        };
        assert_eq!(
            rules_of(&run_with(check_size, json!([]), &strict)),
            ["D1.1"]
        );
        assert!(run(check_size, json!([])).is_empty());
        assert!(run_with(
            check_size,
            json!([{"role": "user", "content": "x"}]),
            &strict
        )
        .is_empty());
        let huge = "x".repeat(MAX_BODY_BYTES + 1);
        assert_eq!(
            rules_of(&run(check_size, json!([{"role": "user", "content": huge}]))),
            ["D1.1"]
        );
    }

    #[test]
    fn shape() {
        let bad = json!([
            "not an object",
            {"role": "user", "content": "x", "id": "msg_1"},
            {"role": "assistant"},
            {"role": "user", "content": 7},
            {"role": "assistant", "content": [{"text": "no type"}, 3, {"type": "text"}]},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "", "input": {}}]},
            {"role": "user", "content": [{"type": "image"}, {"type": "tool_result"}]}
        ]);
        let v = run(check_shape, bad);
        assert!(v.iter().all(|v| v.rule == "D1.0"));
        let text: Vec<String> = v.iter().map(|v| v.message.clone()).collect();
        assert_eq!(v.len(), 10, "{text:#?}");
        assert!(text.contains(&"messages.1.id: Extra inputs are not permitted".to_string()));
        assert!(text.contains(&"messages.2.content: Field required".to_string()));
        assert!(text.contains(&"messages.4.content.2.text.text: Field required".to_string()));
        assert!(run(check_shape, tool_loop()).is_empty());
    }

    #[test]
    fn known_block_types() {
        let bad = json!([{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "future_block", "x": 1}]}]);
        let v = run(check_known_block_types, bad.clone());
        assert_eq!(rules_of(&v), ["A2.5"]);
        assert_eq!(v[0].index, Some(0));
        let lax = AnthropicRules {
            known_block_types_only: false,
            ..AnthropicRules::default()
        };
        assert!(run_with(check_known_block_types, bad, &lax).is_empty());
        let tool_ref_top_level =
            json!([{"role": "user", "content": [{"type": "tool_reference", "tool_name": "X"}]}]);
        assert_eq!(
            rules_of(&run(check_known_block_types, tool_ref_top_level)),
            ["A2.5"]
        );
        assert!(run(check_known_block_types, tool_loop()).is_empty());
    }

    #[test]
    fn roles() {
        let bad = json!([{"role": "system", "content": "s"}, {"role": "tool", "content": "t"}]);
        assert_eq!(rules_of(&run(check_roles, bad)), ["D1.2", "D1.2"]);
        assert!(run(check_roles, tool_loop()).is_empty());
    }

    #[test]
    fn first_is_user() {
        let bad = json!([{"role": "assistant", "content": "hi"}, {"role": "user", "content": "x"}]);
        let v = run(check_first_is_user, bad);
        assert_eq!(
            v[0].message,
            "messages: first message must use the \"user\" role"
        );
        assert!(run(check_first_is_user, tool_loop()).is_empty());
    }

    #[test]
    fn alternation() {
        let bad = json!([
            {"role": "user", "content": "a"}, {"role": "user", "content": "b"},
            {"role": "assistant", "content": "c"}, {"role": "assistant", "content": "d"}
        ]);
        let v = run(check_alternation, bad);
        assert_eq!(rules_of(&v), ["D1.4", "D1.4"]);
        assert_eq!(v[0].index, Some(1));
        assert_eq!(v[1].index, Some(3));
        assert!(run(check_alternation, tool_loop()).is_empty());
    }

    #[test]
    fn non_empty() {
        let bad = json!([
            {"role": "user", "content": ""},
            {"role": "assistant", "content": []},
            {"role": "user", "content": [{"type": "text", "text": ""}]},
            {"role": "assistant", "content": [{"type": "text", "text": " \n"}, {"type": "text", "text": "real"}]},
            {"role": "user", "content": "\t "},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "X", "input": {}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": [{"type": "text", "text": ""}]}]},
            {"role": "assistant", "content": ""}
        ]);
        let v = run(check_non_empty, bad.clone());
        let idx: Vec<Option<usize>> = v.iter().map(|v| v.index).collect();
        assert_eq!(idx, [0, 1, 2, 3, 4, 6, 7].map(Some).to_vec(), "{v:#?}");
        assert!(v[0]
            .message
            .contains("all messages must have non-empty content"));
        assert!(v[2]
            .message
            .ends_with("text content blocks must be non-empty"));
        assert!(v[3].message.ends_with("must contain non-whitespace text"));
        // A true prefill may be empty.
        let prefill = AnthropicRules {
            trailing_assistant_is_prefill: true,
            ..AnthropicRules::default()
        };
        let v = run_with(check_non_empty, bad, &prefill);
        assert!(v.iter().all(|v| v.index != Some(7)));
        assert!(run(check_non_empty, tool_loop()).is_empty());
    }

    #[test]
    fn ending() {
        let list =
            json!([{"role": "user", "content": "a"}, {"role": "assistant", "content": "b "}]);
        assert!(run(check_ending, list.clone()).is_empty());
        let no_trailing = AnthropicRules {
            allow_trailing_assistant: false,
            ..AnthropicRules::default()
        };
        let v = run_with(check_ending, list.clone(), &no_trailing);
        assert_eq!(rules_of(&v), ["D1.6"]);
        assert!(v[0].message.contains("must end with a user message"));
        let prefill = AnthropicRules {
            trailing_assistant_is_prefill: true,
            ..AnthropicRules::default()
        };
        let v = run_with(check_ending, list, &prefill);
        assert_eq!(
            v[0].message,
            "messages: final assistant content cannot end with trailing whitespace"
        );
        let user_last = json!([{"role": "user", "content": "a"}]);
        assert!(run_with(check_ending, user_last, &no_trailing).is_empty());
    }

    #[test]
    fn ids() {
        let bad = json!([
            {"role": "user", "content": "a"},
            {"role": "assistant", "content": [
                {"type": "tool_use", "id": "functions.Bash:0", "name": "Bash", "input": {}},
                {"type": "tool_use", "id": "", "name": "Bash", "input": {}},
                {"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": "{\"partial"},
                {"type": "server_tool_use", "id": "toolu_x", "name": "web_search", "input": {}}
            ]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "functions.Bash:0"}]},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": {}}]}
        ]);
        let v = run(check_ids, bad);
        assert_eq!(v.len(), 6, "{v:#?}");
        assert!(v[0].message.starts_with(
            "messages.1.content.0.tool_use.id: String should match pattern '^[a-zA-Z0-9_-]+$'"
        ));
        assert_eq!(
            v[2].message,
            "messages.1.content.2.tool_use.input: Input should be a valid dictionary"
        );
        assert!(v[3].message.contains("'^srvtoolu_[a-zA-Z0-9_]+$'"));
        assert!(v[4].message.contains("tool_result.tool_use_id"));
        assert!(v[5].message.contains("`tool_use` ids must be unique"));
        assert!(run(check_ids, tool_loop()).is_empty());
    }

    #[test]
    fn results_follow_uses() {
        let use_ab = json!({"role": "assistant", "content": [
            {"type": "tool_use", "id": "A", "name": "X", "input": {}},
            {"type": "tool_use", "id": "B", "name": "X", "input": {}}
        ]});
        let tr = |id: &str| json!({"type": "tool_result", "tool_use_id": id, "content": "ok"});
        let prompt = json!({"role": "user", "content": "go"});
        // Missing B.
        let v = run(
            check_results_follow_uses,
            json!([prompt, use_ab, {"role": "user", "content": [tr("A")]}]),
        );
        assert_eq!(rules_of(&v), ["D1.8"]);
        assert!(v[0].message.starts_with("messages.2: `tool_use` ids were found without `tool_result` blocks immediately after: B."));
        // Text before results.
        let v = run(
            check_results_follow_uses,
            json!([prompt, use_ab, {"role": "user", "content": [{"type": "text", "text": "x"}, tr("A"), tr("B")]}]),
        );
        assert_eq!(rules_of(&v), ["D1.8", "D1.8", "D1.8"]);
        // Split parallel results.
        let v = run(
            check_results_follow_uses,
            json!([prompt, use_ab, {"role": "user", "content": [tr("A")]}, {"role": "user", "content": [tr("B")]}]),
        );
        assert_eq!(rules_of(&v), ["D1.8"]);
        // Split assistant turn.
        let v = run(
            check_results_follow_uses,
            json!([prompt,
            {"role": "assistant", "content": [{"type": "tool_use", "id": "A", "name": "X", "input": {}}]},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "B", "name": "X", "input": {}}]},
            {"role": "user", "content": [tr("A"), tr("B")]}]),
        );
        // A is unanswered after the first fragment; the second has one result too many.
        assert_eq!(rules_of(&v), ["D1.8", "D1.8"]);
        // Trailing assistant with tool_use.
        let v = run(check_results_follow_uses, json!([prompt, use_ab]));
        assert_eq!(rules_of(&v), ["D1.8"]);
        // Extra (duplicate) result at the front.
        let v = run(
            check_results_follow_uses,
            json!([prompt, use_ab, {"role": "user", "content": [tr("A"), tr("B"), tr("B")]}]),
        );
        assert_eq!(rules_of(&v), ["D1.8"]);
        assert!(v[0].message.contains("matching number"));
        // tool_use in a user turn.
        let v = run(
            check_results_follow_uses,
            json!([{"role": "user", "content": [{"type": "tool_use", "id": "A", "name": "X", "input": {}}]}]),
        );
        assert_eq!(rules_of(&v), ["D1.8"]);
        // Good: any order, text after results.
        let good = json!([prompt, use_ab, {"role": "user", "content": [tr("B"), tr("A"), {"type": "text", "text": "more"}]}]);
        assert!(run(check_results_follow_uses, good).is_empty());
        assert!(run(check_results_follow_uses, tool_loop()).is_empty());
    }

    #[test]
    fn no_orphan_results() {
        let tr = |id: &str| json!({"type": "tool_result", "tool_use_id": id, "content": "ok"});
        let list = json!([
            {"role": "user", "content": [tr("A")]},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "B", "name": "X", "input": {}}, tr("B")]},
            {"role": "user", "content": [tr("B"), tr("B"), tr("C")]}
        ]);
        let v = run(check_no_orphan_results, list);
        assert_eq!(rules_of(&v), ["D1.9", "D1.9", "D1.9", "D1.9"]);
        assert!(v[0].message.starts_with(
            "messages.0.content.0: unexpected `tool_use_id` found in `tool_result` blocks: A."
        ));
        assert!(v[1].message.contains("can only appear in user messages"));
        assert!(v[2]
            .message
            .contains("Found multiple `tool_result` blocks with id: B"));
        assert!(v[3].message.contains("blocks: C."));
        assert!(run(check_no_orphan_results, tool_loop()).is_empty());
    }

    #[test]
    fn server_tools() {
        let srv = |id: &str, name: &str| json!({"type": "server_tool_use", "id": id, "name": name, "input": {}});
        let res = |ty: &str, id: &str| json!({"type": ty, "tool_use_id": id, "content": []});
        let prompt = json!({"role": "user", "content": "go"});
        // Result before its use; advisor without result, in a non-last turn.
        let v = run(
            check_server_tools,
            json!([prompt,
                {"role": "assistant", "content": [res("advisor_tool_result", "srvtoolu_1"), srv("srvtoolu_1", "advisor"), {"type": "text", "text": "x"}]},
                {"role": "user", "content": "next"},
                {"role": "assistant", "content": [srv("srvtoolu_2", "web_search"), {"type": "text", "text": "y"}]}
            ]),
        );
        assert_eq!(rules_of(&v), ["D1.10", "D1.10", "D1.10"], "{v:#?}");
        assert!(v[0].message.contains("Each `advisor_tool_result` block must have a corresponding `server_tool_use` block before it."));
        assert!(v[1].message.contains("`advisor` tool use with id `srvtoolu_1` was found without a corresponding `advisor_tool_result` block"));
        assert!(v[2]
            .message
            .contains("`web_search` tool use with id `srvtoolu_2`"));
        // A trailing unresolved server tool use is fine only as a true prefill.
        let pause =
            json!([prompt, {"role": "assistant", "content": [srv("srvtoolu_2", "web_search")]}]);
        let prefill = AnthropicRules {
            trailing_assistant_is_prefill: true,
            ..AnthropicRules::default()
        };
        assert!(run_with(check_server_tools, pause, &prefill).is_empty());
        // Deferred: mixed turn, tool_result-only user turn, result first in the next assistant turn.
        let deferred = json!([prompt,
            {"role": "assistant", "content": [srv("srvtoolu_3", "web_search"), {"type": "tool_use", "id": "A", "name": "X", "input": {}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "A", "content": "ok"}]},
            {"role": "assistant", "content": [res("web_search_tool_result", "srvtoolu_3"), {"type": "text", "text": "done"}]}
        ]);
        assert!(run(check_server_tools, deferred).is_empty());
        // …but not across a user turn that has other content.
        let not_deferred = json!([prompt,
            {"role": "assistant", "content": [srv("srvtoolu_3", "web_search"), {"type": "tool_use", "id": "A", "name": "X", "input": {}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "A", "content": "ok"}, {"type": "text", "text": "hm"}]},
            {"role": "assistant", "content": [res("web_search_tool_result", "srvtoolu_3"), {"type": "text", "text": "done"}]}
        ]);
        assert_eq!(
            rules_of(&run(check_server_tools, not_deferred)),
            ["D1.10", "D1.10"]
        );
        // Server result in a user turn.
        let in_user =
            json!([{"role": "user", "content": [res("web_search_tool_result", "srvtoolu_1")]}]);
        assert_eq!(rules_of(&run(check_server_tools, in_user)), ["D1.10"]);
        assert!(run(check_server_tools, tool_loop()).is_empty());
    }

    /// Programmatic tool calling: code execution calls client tools one response at a time, and
    /// its result comes after the last; each client call names it as its `caller`.
    #[test]
    fn programmatic_calls_chain_to_their_result() {
        let prompt = json!({"role": "user", "content": "go"});
        let code = json!({"type": "server_tool_use", "id": "srvtoolu_9", "name": "code_execution", "input": {}});
        let call = |id: &str, caller: &str| {
            json!({"type": "tool_use", "id": id, "name": "q", "input": {},
                "caller": {"type": "code_execution_20250825", "tool_id": caller}})
        };
        let answer = |id: &str| json!({"role": "user", "content": [{"type": "tool_result", "tool_use_id": id, "content": "r"}]});
        let result = json!({"type": "code_execution_tool_result", "tool_use_id": "srvtoolu_9",
            "content": {"type": "code_execution_result", "stdout": "", "stderr": "", "return_code": 0, "content": []}});
        let chain = json!([prompt,
            {"role": "assistant", "content": [code, call("t1", "srvtoolu_9")]}, answer("t1"),
            {"role": "assistant", "content": [call("t2", "srvtoolu_9")]}, answer("t2"),
            {"role": "assistant", "content": [result, {"type": "text", "text": "done"}]}
        ]);
        assert!(run(check_server_tools, chain).is_empty());
        // A turn in between whose call another made breaks the chain.
        let broken = json!([prompt,
            {"role": "assistant", "content": [code, call("t1", "srvtoolu_9")]}, answer("t1"),
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t2", "name": "q", "input": {}}]}, answer("t2"),
            {"role": "assistant", "content": [result, {"type": "text", "text": "done"}]}
        ]);
        assert_eq!(
            rules_of(&run(check_server_tools, broken)),
            ["D1.10", "D1.10"]
        );
        // A caller that names no running call.
        let dangling = json!([prompt,
            {"role": "assistant", "content": [call("t1", "srvtoolu_8")]}, answer("t1")
        ]);
        let v = run(check_server_tools, dangling);
        assert_eq!(rules_of(&v), ["D1.10"]);
        assert!(v[0].message.contains("caller.tool_id"), "{v:#?}");
    }

    #[test]
    fn thinking_shape() {
        let list = json!([
            {"role": "user", "content": [{"type": "thinking", "thinking": "x", "signature": "s"}]},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "no sig"},
                {"type": "thinking", "thinking": "empty sig", "signature": ""},
                {"type": "redacted_thinking"},
                {"type": "text", "text": "ok"}
            ]},
            {"role": "user", "content": "next"},
            {"role": "assistant", "content": [{"type": "text", "text": "a"}, {"type": "redacted_thinking", "data": "abc"}]}
        ]);
        let v = run(check_thinking_shape, list);
        assert_eq!(v.len(), 5, "{v:#?}");
        assert!(v[0]
            .message
            .contains("can only appear in assistant messages"));
        assert_eq!(
            v[1].message,
            "messages.1.content.0.thinking.signature: Field required"
        );
        assert!(v[3]
            .message
            .contains("redacted_thinking.data: Field required"));
        assert_eq!(
            v[4].message,
            "messages.3: The final block in an assistant message cannot be `thinking`."
        );
        // Empty thinking text with a signature is valid (display: omitted).
        let omitted = json!([{"role": "user", "content": "q"}, {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "", "signature": "s"}, {"type": "text", "text": "a"}]}]);
        assert!(run(check_thinking_shape, omitted).is_empty());
        assert!(run(check_thinking_shape, tool_loop()).is_empty());
    }

    #[test]
    fn thinking_mode() {
        let list = json!([{"role": "user", "content": "q"}, {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "t", "signature": "s"}, {"type": "text", "text": "a"}]}]);
        let v = run(check_thinking_mode, list.clone());
        assert_eq!(rules_of(&v), ["D1.13"]);
        assert!(v[0].message.contains("When thinking is disabled, an `assistant` message in the final position cannot contain `thinking`"));
        let on = AnthropicRules {
            thinking_enabled: true,
            ..AnthropicRules::default()
        };
        assert!(run_with(check_thinking_mode, list, &on).is_empty());
        // Earlier turns may keep thinking.
        assert!(run(check_thinking_mode, tool_loop()).is_empty());
    }

    #[test]
    fn cache_control() {
        let cc = json!({"type": "ephemeral"});
        let t =
            |s: &str| json!({"type": "text", "text": s, "cache_control": {"type": "ephemeral"}});
        let five = json!([{"role": "user", "content": [t("a"), t("b"), t("c"), t("d"), t("e")]}]);
        let v = run(check_cache_control, five);
        assert_eq!(v.len(), 1);
        assert_eq!(
            v[0].message,
            "A maximum of 4 blocks with cache_control may be provided. Found 5."
        );
        let misplaced = json!([
            {"role": "user", "content": [{"type": "text", "text": "", "cache_control": cc}]},
            {"role": "assistant", "content": [{"type": "thinking", "thinking": "t", "signature": "s", "cache_control": cc}, {"type": "text", "text": "x"}]},
            {"role": "user", "content": [{"type": "text", "text": "x", "cache_control": {"type": "ephemeral", "ttl": "1h"}}]}
        ]);
        let v = run(check_cache_control, misplaced);
        assert_eq!(v.len(), 3, "{v:#?}");
        assert!(v[0].message.contains("empty text"));
        assert!(v[1].message.contains("thinking"));
        assert!(v[2].message.contains(
            "a ttl='1h' cache_control block must not come after a ttl='5m' cache_control block"
        ));
        let nested = json!([{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "a",
            "content": [{"type": "text", "text": "x", "cache_control": {"type": "persistent"}}]}]}]);
        assert_eq!(rules_of(&run(check_cache_control, nested)), ["D1.15"]);
        let ok = json!([{"role": "user", "content": [
            {"type": "text", "text": "x", "cache_control": {"type": "ephemeral", "ttl": "1h"}},
            t("a"), t("b"), t("c")]}]);
        assert!(run(check_cache_control, ok).is_empty());
        assert!(run(check_cache_control, tool_loop()).is_empty());
    }

    #[test]
    fn media() {
        let png = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg==";
        let img = json!({"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": png}});
        let doc = json!({"type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": "JVBERi0="}});
        let bmp = json!({"type": "image", "source": {"type": "base64", "media_type": "image/bmp", "data": "Qk0="}});
        let list = json!([
            {"role": "user", "content": [img, bmp]},
            {"role": "assistant", "content": [doc, {"type": "text", "text": "x"}]}
        ]);
        let v = run(check_media, list);
        assert_eq!(rules_of(&v), ["D1.16", "D1.16"]);

        assert!(v
            .iter()
            .any(|v| v.message.contains("Image format image/bmp not supported")));
        assert!(v
            .iter()
            .any(|v| v.message.contains("only allowed in user messages")));
        // A PNG header of 9000 px wide (A7.3).
        let wide = "iVBORw0KGgoAAAANSUhEUgAAIygAAAABCAYAAAAfFcSJ";
        let v = run(
            check_media,
            json!([{"role": "user", "content": [{"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": wide}}]}]),
        );
        assert_eq!(rules_of(&v), ["D1.16"]);
        assert!(v[0].message.contains("9000x1"), "{v:?}");
        let jpeg_as_png = json!([{"role": "user", "content": [{"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "/9j/4AAQSkZJRg=="}}]}]);
        let v = run(check_media, jpeg_as_png);
        assert_eq!(rules_of(&v), ["D1.16"]);
        assert!(v[0].message.contains("Could not process image"));
        // 101 media: 60 top-level images + 41 documents nested in a tool result.
        let mut top: Vec<Value> = (0..60).map(|_| img.clone()).collect();
        let nested: Vec<Value> = (0..41).map(|_| doc.clone()).collect();
        top.insert(
            0,
            json!({"type": "tool_result", "tool_use_id": "A", "content": nested}),
        );
        let v = run(
            check_media,
            json!([{"role": "user", "content": top.clone()}]),
        );
        assert_eq!(rules_of(&v), ["D1.16"]);
        assert!(v[0].message.contains("found 101"));
        top.pop();
        assert!(run(check_media, json!([{"role": "user", "content": top}])).is_empty());
        assert!(run(check_media, tool_loop()).is_empty());
    }

    #[test]
    fn tool_result_content() {
        let tr =
            |content: Value| json!({"type": "tool_result", "tool_use_id": "A", "content": content});
        let list = json!([{"role": "user", "content": [
            tr(json!(5)),
            tr(json!([{"type": "tool_use", "id": "x"}])),
            tr(json!([{"type": "tool_reference", "tool_name": "Grep"}, {"type": "text", "text": "Tool loaded."}])),
            {"type": "tool_result", "tool_use_id": "A", "is_error": "yes"},
            tr(json!([{"type": "text"}]))
        ]}]);
        let v = run(check_tool_result_content, list);
        assert_eq!(rules_of(&v), ["A4.9"; 5], "{v:#?}");
        let ok = json!([{"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "A"},
            tr(json!([{"type": "tool_reference", "tool_name": "Grep"}])),
            tr(json!([{"type": "text", "text": "x"}, {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "x"}}]))
        ]}]);
        assert!(run(check_tool_result_content, ok).is_empty());
    }
}
