//! Rendering for the OpenAI Responses API: the `input` item list, and its inverse.
//!
//! # Mapping
//! - Assistant turn, block by block in order, except that its texts form one
//!   `{"type":"message","role":"assistant","content":[{"type":"output_text","text","annotations":[]}…]}`
//!   placed before its first call (the calls' outputs must come before the next message item);
//!   `tool_use` → `{"type":"function_call","call_id","name","arguments": JSON string}`; a stored
//!   `reasoning` block → the `reasoning` item as stored (its encrypted content is verified), kept
//!   only when the next item of the turn is not another reasoning item (`reasoning_dropped`
//!   otherwise; a trailing one was already removed by the cleanup). Server tool blocks have no
//!   equivalent (`unsupported_block_dropped`). A turn left with no item gets a `(no content)`
//!   assistant message.
//! - User turn: each `tool_result` → `{"type":"function_call_output","call_id","output": string}`
//!   (the text as for Chat Completions), right after the calls; then the other blocks as one
//!   `{"type":"message","role":"user","content":[…]}` of `input_text`, `input_image` (`image_url`:
//!   a data URL for base64, else the URL; `detail: "auto"`) and `input_file` (base64 PDFs) parts.

use std::collections::HashMap;

use serde_json::{json, Value};

use super::blocks::{block_type, str_field, NO_CONTENT};
use super::render_shared::{
    assistant_entry, parse_arguments, part_to_block, report_dropped, split_user_turn,
    tool_result_block, tool_text, tool_use_block, user_entry, ToolCall,
};
use super::{Ctx, Msg, RepairKind};
use crate::history::model::{Content, Entry, Role};

/// The API [`to_responses`] renders for, as its repairs name it.
const RESPONSES: &str = "Responses";

fn output_text(text: &str) -> Value {
    json!({"type": "output_text", "text": text, "annotations": []})
}

fn assistant_message(parts: Vec<Value>) -> Value {
    json!({"type": "message", "role": "assistant", "content": parts})
}

/// A Chat Completions user part in its Responses form.
fn input_part(chat: Value) -> Value {
    match block_type(&chat) {
        Some("image_url") => {
            let url = chat
                .get("image_url")
                .and_then(|u| str_field(u, "url"))
                .unwrap_or("");
            json!({"type": "input_image", "image_url": url, "detail": "auto"})
        }
        Some("file") => {
            let f = chat.get("file").cloned().unwrap_or_default();
            json!({
                "type": "input_file",
                "filename": str_field(&f, "filename").unwrap_or("document.pdf"),
                "file_data": str_field(&f, "file_data").unwrap_or(""),
            })
        }
        _ => json!({"type": "input_text", "text": str_field(&chat, "text").unwrap_or("")}),
    }
}

enum Item {
    Reasoning(Value, u32),
    /// An `output_text` part.
    Text(Value),
    Message(Value),
    Call(Value),
}

/// The Responses `input` items (see the module docs for the mapping).
pub fn to_responses(msgs: Vec<Msg>, ctx: &mut Ctx) -> Vec<Value> {
    let mut out = Vec::with_capacity(msgs.len() * 2);
    let mut names: HashMap<String, String> = HashMap::new();
    for m in msgs {
        if m.is_assistant() {
            names.clear();
            let mut items = Vec::with_capacity(m.blocks.len());
            for b in m.blocks {
                match block_type(&b.v) {
                    Some("text") => items.push(Item::Text(output_text(
                        str_field(&b.v, "text").unwrap_or(""),
                    ))),
                    Some("reasoning") => items.push(Item::Reasoning(b.v, b.src)),
                    Some("tool_use") => {
                        let call = ToolCall::of(&b.v);
                        names.insert(call.id.to_string(), call.name.to_string());
                        items.push(Item::Call(json!({
                            "type": "function_call", "call_id": call.id, "name": call.name,
                            "arguments": call.arguments(),
                        })));
                    }
                    Some("thinking" | "redacted_thinking") => {}
                    _ => report_dropped(ctx, Role::Assistant, &b, RESPONSES),
                }
            }
            let before = out.len();
            // Outputs answer a run of calls before the next message item, and the outputs come
            // in the user turn: the turn's texts form one message item placed before its first
            // call (or where its first text was, if earlier).
            let has_text = items.iter().any(|i| matches!(i, Item::Text(_)));
            let mut texts: Vec<Value> = Vec::new();
            let mut rest: Vec<Item> = Vec::with_capacity(items.len());
            let mut message_at = None;
            for item in items {
                match item {
                    Item::Text(part) => {
                        if message_at.is_none() {
                            message_at = Some(rest.len());
                        }
                        texts.push(part);
                    }
                    Item::Call(_) if has_text => {
                        if message_at.is_none() {
                            message_at = Some(rest.len());
                        }
                        rest.push(item);
                    }
                    other => rest.push(other),
                }
            }
            if let Some(at) = message_at.filter(|_| !texts.is_empty()) {
                rest.insert(at, Item::Message(assistant_message(texts)));
            }
            let mut it = rest.into_iter().peekable();
            while let Some(item) = it.next() {
                match item {
                    Item::Reasoning(v, src) => {
                        if matches!(it.peek(), Some(Item::Message(_) | Item::Call(_))) {
                            out.push(v);
                        } else {
                            ctx.report(
                                RepairKind::ReasoningDropped,
                                [src],
                                format!(
                                    "dropped reasoning item {}: not followed by the item it produced",
                                    str_field(&v, "id").unwrap_or("?")
                                ),
                            );
                        }
                    }
                    Item::Message(v) | Item::Call(v) | Item::Text(v) => out.push(v),
                }
            }
            if out.len() == before {
                out.push(assistant_message(vec![output_text(NO_CONTENT)]));
            }
            continue;
        }
        let (results, parts) = split_user_turn(m.blocks, RESPONSES, ctx);
        for r in &results {
            let id = str_field(r, "tool_use_id").unwrap_or("");
            let name = names.get(id).map_or("tool", String::as_str);
            out.push(json!({
                "type": "function_call_output", "call_id": id, "output": tool_text(r, name),
            }));
        }
        let mut parts: Vec<Value> = parts.into_iter().map(input_part).collect();
        if parts.is_empty() {
            if !results.is_empty() {
                continue;
            }
            parts.push(json!({"type": "input_text", "text": NO_CONTENT}));
        }
        out.push(json!({"type": "message", "role": "user", "content": parts}));
    }
    out
}

/// A Responses part as a stored block.
fn part_block(p: &Value) -> Value {
    match block_type(p) {
        Some("input_text" | "output_text") => {
            json!({"type": "text", "text": str_field(p, "text").unwrap_or("")})
        }
        Some("input_image") => part_to_block(
            &json!({"type": "image_url", "image_url": {"url": str_field(p, "image_url").unwrap_or("")}}),
        ),
        Some("input_file") => part_to_block(&json!({"type": "file", "file": {
            "filename": str_field(p, "filename"),
            "file_data": str_field(p, "file_data").unwrap_or(""),
        }})),
        _ => p.clone(),
    }
}

/// Responses items back into entries (see [`super::entries_from_messages`]): the assistant-side
/// items between two user-side items form one assistant entry; each `function_call_output` and
/// user message is a user entry.
pub fn entries_from_items(items: &[Value]) -> Vec<Entry> {
    let mut out = Vec::with_capacity(items.len());
    let mut asst: Vec<Value> = Vec::new();
    let mut asst_at = 0usize;
    let flush = |asst: &mut Vec<Value>, at: usize, out: &mut Vec<Entry>| {
        if !asst.is_empty() {
            out.push(assistant_entry(at, Content::Blocks(std::mem::take(asst))));
        }
    };
    for (i, item) in items.iter().enumerate() {
        let ty = str_field(item, "type").unwrap_or("");
        let role = str_field(item, "role").unwrap_or("");
        let parts = || {
            item.get("content")
                .and_then(Value::as_array)
                .map(|ps| ps.iter().map(part_block).collect::<Vec<_>>())
                .unwrap_or_default()
        };
        let assistant_side: Option<Vec<Value>> = match (ty, role) {
            ("message", "assistant") => Some(parts()),
            ("reasoning", _) => Some(vec![item.clone()]),
            ("function_call", _) => Some(vec![tool_use_block(
                str_field(item, "call_id").unwrap_or(""),
                str_field(item, "name").unwrap_or(""),
                parse_arguments(str_field(item, "arguments")),
            )]),
            _ => None,
        };
        if let Some(blocks) = assistant_side {
            if asst.is_empty() {
                asst_at = i;
            }
            asst.extend(blocks);
            continue;
        }
        flush(&mut asst, asst_at, &mut out);
        let blocks = match (ty, role) {
            ("function_call_output", _) => vec![tool_result_block(
                str_field(item, "call_id").unwrap_or(""),
                item.get("output").cloned().unwrap_or_else(|| json!("")),
            )],
            ("message", "user") => parts(),
            _ => continue,
        };
        out.push(user_entry(i, Content::Blocks(blocks)));
    }
    flush(&mut asst, asst_at, &mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::super::testutil::*;
    use super::super::{normalize, NormalizeOptions, Provider};
    use super::*;

    fn opts() -> NormalizeOptions {
        NormalizeOptions {
            provider: Provider::OpenaiResponses,
            ..Default::default()
        }
    }

    fn reasoning(id: &str) -> Value {
        json!({"type": "reasoning", "id": id, "summary": [], "encrypted_content": format!("enc-{id}")})
    }

    #[test]
    fn items_calls_outputs_and_reasoning_in_order() {
        let e = vec![
            user(0, json!("go")),
            asst(
                1,
                "X",
                json!([
                    thinking("t"),
                    reasoning("rs_1"),
                    text("running"),
                    tu("c1"),
                    reasoning("rs_2"),
                    tu("c2")
                ]),
            ),
            user(2, json!([tr("c2"), tr("c1"), text("and?")])),
        ];
        let n = normalize(&e, &opts());
        assert_eq!(
            n.messages,
            vec![
                json!({"type": "message", "role": "user", "content": [{"type": "input_text", "text": "go"}]}),
                reasoning("rs_1"),
                json!({"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "running", "annotations": []}]}),
                json!({"type": "function_call", "call_id": "c1", "name": "Bash", "arguments": "{\"command\":\"ls\"}"}),
                reasoning("rs_2"),
                json!({"type": "function_call", "call_id": "c2", "name": "Bash", "arguments": "{\"command\":\"ls\"}"}),
                json!({"type": "function_call_output", "call_id": "c2", "output": "ok"}),
                json!({"type": "function_call_output", "call_id": "c1", "output": "ok"}),
                json!({"type": "message", "role": "user", "content": [{"type": "input_text", "text": "and?"}]}),
            ]
        );
        assert!(n.repairs.is_empty());
        assert_round_trips(&n, &opts());
    }

    #[test]
    fn reasoning_elsewhere_is_dropped_silently_and_unpaired_reasoning_reported() {
        let e = vec![
            user(0, json!("go")),
            asst(
                1,
                "X",
                json!([reasoning("rs_1"), reasoning("rs_2"), text("a")]),
            ),
            user(2, json!("next")),
            asst(3, "Y", json!([text("b"), reasoning("rs_3")])),
        ];
        let n = normalize(&e, &opts());
        assert_eq!(n.messages[1], reasoning("rs_2"));
        let kinds: Vec<RepairKind> = n.repairs.iter().map(|r| r.kind).collect();
        assert_eq!(
            kinds,
            vec![
                RepairKind::TrailingThinkingRemoved,
                RepairKind::ReasoningDropped
            ]
        );
        for provider in [Provider::Anthropic, Provider::Openai, Provider::Gemini] {
            let other = normalize(
                &e,
                &NormalizeOptions {
                    provider,
                    ..Default::default()
                },
            );
            assert!(!other.messages.iter().any(|m| m.to_string().contains("rs_")));
            assert!(
                other.repairs.iter().all(|r| !matches!(
                    r.kind,
                    RepairKind::ReasoningDropped
                        | RepairKind::TrailingThinkingRemoved
                        | RepairKind::InvalidThinkingDropped
                )),
                "{provider:?}: {:?}",
                other.repairs
            );
        }
    }

    #[test]
    fn media_parts_and_empty_turns() {
        let img = json!({"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG}});
        let e = vec![
            user(0, json!([text("see"), img])),
            asst(
                1,
                "X",
                json!([{"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search", "input": {}},
                {"type": "web_search_tool_result", "tool_use_id": "srvtoolu_1", "content": []}]),
            ),
        ];
        let n = normalize(&e, &opts());
        assert_eq!(
            n.messages[0]["content"][1],
            json!({"type": "input_image", "image_url": format!("data:image/png;base64,{PNG}"), "detail": "auto"})
        );
        assert_eq!(
            n.messages[1],
            json!({"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": NO_CONTENT, "annotations": []}]})
        );
        assert_round_trips(&n, &opts());
    }
}
