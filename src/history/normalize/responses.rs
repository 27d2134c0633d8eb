//! Rendering for the OpenAI Responses API: the `input` item list, and its inverse.
//!
//! # Mapping
//! - Assistant turn, block by block in order, except that its texts form one message in the
//!   easy input form, `{"type":"message","role":"assistant","content":"<texts joined by a blank
//!   line>"}`, placed before its first call (the calls' outputs must come before the next message
//!   item); `tool_use` → `{"type":"function_call","call_id","name","arguments": JSON string}`; a
//!   stored `reasoning` block → the `reasoning` item as stored (its encrypted content is
//!   verified), kept only when the next item of the turn is not another reasoning item
//!   (`reasoning_dropped` otherwise; a trailing one was already removed by the cleanup). Server
//!   tool and MCP blocks have no equivalent: they are texts of the turn
//!   (`block_rendered_as_text`). A turn left with no item gets a `(no content)` assistant message.
//! - User turn: each `tool_result` → `{"type":"function_call_output","call_id","output": string}`
//!   (the text as for Chat Completions), right after the calls; then the other blocks as one
//!   `{"type":"message","role":"user","content":[…]}` of `input_text`, `input_image` (`image_url`:
//!   a data URL for base64, else the URL; `detail: "auto"`) and `input_file` (base64 PDFs by
//!   `file_data`, URL documents by `file_url`) parts; other blocks are sent as text.

use std::collections::{HashMap, HashSet};

use serde_json::{json, Value};

use super::blocks::{block_type, is_media, str_field, NO_CONTENT};
use super::native::native_block;
use super::render_shared::{
    assistant_entry, media_source, parse_arguments, part_to_block, rendered_or_dropped,
    split_user_turn, tool_output, tool_result_block, tool_use_block, user_entry, MediaSource,
    ToolCall,
};
use super::{Block, Ctx, Msg, RepairKind};
use crate::history::model::{Content, Entry, Role};

/// The API [`to_responses`] renders for, as its repairs name it.
const RESPONSES: &str = "Responses";

/// An assistant message in the easy input form (string content): the output-message form with
/// `output_text` parts is typed to need the `id` and `status` of a stored response, which
/// servers validating against the SDK types require.
fn assistant_message(texts: &[String]) -> Value {
    json!({"type": "message", "role": "assistant", "content": texts.join("\n\n")})
}

fn input_text(text: &str) -> Value {
    json!({"type": "input_text", "text": text})
}

/// A stored user block in its Responses form, when it has one: text, an image by data URL or
/// URL, a base64 PDF as a named file, a URL document as a file the API fetches.
fn input_part(v: &Value) -> Option<Value> {
    match (block_type(v)?, media_source(v)) {
        ("text", _) => Some(input_text(str_field(v, "text").unwrap_or(""))),
        ("image", Some(MediaSource::Base64 { media_type, data })) => Some(json!({
            "type": "input_image", "image_url": MediaSource::data_url(media_type, data),
            "detail": "auto",
        })),
        ("image", Some(MediaSource::Url(url))) => {
            Some(json!({"type": "input_image", "image_url": url, "detail": "auto"}))
        }
        (
            "document",
            Some(MediaSource::Base64 {
                media_type: media @ "application/pdf",
                data,
            }),
        ) => Some(json!({
            "type": "input_file",
            "filename": str_field(v, "title").unwrap_or("document.pdf"),
            "file_data": MediaSource::data_url(media, data),
        })),
        ("document", Some(MediaSource::Url(url))) => {
            Some(json!({"type": "input_file", "file_url": url}))
        }
        _ => None,
    }
}

enum Item {
    Reasoning(Value, u32),
    /// A text of the turn.
    Text(String),
    Message(Value),
    Call(Value),
    /// An item sent as it was stored.
    Verbatim(Value),
}

/// The Responses `input` items (see the module docs for the mapping).
pub fn to_responses(msgs: Vec<Msg>, ctx: &mut Ctx) -> Vec<Value> {
    let mut out = Vec::with_capacity(msgs.len() * 2);
    let mut names: HashMap<String, String> = HashMap::new();
    // An item id names one item of the request: a reasoning item repeated (a response stored
    // twice) is sent once.
    let mut reasoning_ids: HashSet<String> = HashSet::new();
    for m in msgs {
        if m.is_assistant() {
            names.clear();
            let mut items = Vec::with_capacity(m.blocks.len());
            for b in m.blocks {
                match block_type(&b.v) {
                    Some("text") => {
                        items.push(Item::Text(str_field(&b.v, "text").unwrap_or("").to_owned()))
                    }
                    Some("reasoning") => items.push(Item::Reasoning(b.v, b.src)),
                    // Only its own compaction item reaches here, first, as it was returned.
                    // (without what only the output form has: the input type refuses it).
                    Some("compaction") => {
                        let mut item = b.v;
                        super::native::strip_output_only("compaction", &mut item);
                        items.push(Item::Verbatim(item));
                    }
                    // Its own items, as returned (the native pass turned the unpaired to text):
                    // a call the client answers is ordered as a function call is.
                    Some(t) if native_block(&b.v).is_some() => {
                        if t.ends_with("_call") && b.v.get("call_id").is_some() {
                            items.push(Item::Call(b.v));
                        } else {
                            items.push(Item::Verbatim(b.v));
                        }
                    }
                    Some("tool_use") => {
                        let call = ToolCall::of(&b.v);
                        names.insert(call.id.to_string(), call.name.to_string());
                        items.push(Item::Call(json!({
                            "type": "function_call", "call_id": call.id, "name": call.name,
                            "arguments": call.arguments(),
                        })));
                    }
                    Some("thinking" | "redacted_thinking") => {}
                    _ => items.extend(
                        rendered_or_dropped(ctx, Role::Assistant, &b, RESPONSES).map(Item::Text),
                    ),
                }
            }
            let before = out.len();
            // Outputs answer a run of calls before the next message item, and the outputs come
            // in the user turn: the turn's texts form one message item placed before its first
            // call (or where its first text was, if earlier).
            let has_text = items.iter().any(|i| matches!(i, Item::Text(_)));
            let mut texts: Vec<String> = Vec::new();
            let mut rest: Vec<Item> = Vec::with_capacity(items.len());
            let mut message_at = None;
            for item in items {
                match item {
                    Item::Text(text) => {
                        if message_at.is_none() {
                            message_at = Some(rest.len());
                        }
                        texts.push(text);
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
                rest.insert(at, Item::Message(assistant_message(&texts)));
            }
            let mut it = rest.into_iter().peekable();
            while let Some(item) = it.next() {
                match item {
                    Item::Reasoning(v, src) => {
                        let id = str_field(&v, "id").unwrap_or("").to_owned();
                        if !reasoning_ids.insert(id.clone()) {
                            ctx.report(
                                RepairKind::ReasoningDropped,
                                [src],
                                format!("dropped reasoning item {id}: an earlier item has its id"),
                            );
                        } else if matches!(
                            it.peek(),
                            Some(Item::Message(_) | Item::Call(_) | Item::Verbatim(_))
                        ) {
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
                    Item::Message(v) | Item::Call(v) | Item::Verbatim(v) => out.push(v),
                    Item::Text(_) => unreachable!("texts were gathered into the message"),
                }
            }
            if out.len() == before {
                out.push(assistant_message(&[NO_CONTENT.to_owned()]));
            }
            continue;
        }
        // The outputs of its own calls go as items, right after the function call outputs.
        let (outputs, blocks): (Vec<Block>, Vec<Block>) = m
            .blocks
            .into_iter()
            .partition(|b| native_block(&b.v).is_some());
        let (results, mut parts) = split_user_turn(blocks, RESPONSES, input_part, input_text, ctx);
        for r in &results {
            let id = str_field(&r.v, "tool_use_id").unwrap_or("");
            let name = names.get(id).map_or("tool", String::as_str);
            // Media a tool returned go natively, as a list of input parts.
            let (text, media) = tool_output(ctx, r, name, RESPONSES, |item| {
                is_media(item).then(|| input_part(item)).flatten()
            });
            let output = if media.is_empty() {
                json!(text)
            } else {
                let text = (!text.is_empty()).then(|| input_text(&text));
                Value::Array(text.into_iter().chain(media).collect())
            };
            out.push(json!({"type": "function_call_output", "call_id": id, "output": output}));
        }
        let answered = !results.is_empty() || !outputs.is_empty();
        out.extend(outputs.into_iter().map(|b| b.v));
        if parts.is_empty() {
            if answered {
                continue;
            }
            parts.push(input_text(NO_CONTENT));
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
        let parts = || match item.get("content") {
            Some(Value::String(text)) => vec![json!({"type": "text", "text": text})],
            Some(Value::Array(ps)) => ps.iter().map(part_block).collect(),
            _ => Vec::new(),
        };
        let assistant_side: Option<Vec<Value>> = match (ty, role) {
            ("message", "assistant") => Some(parts()),
            ("reasoning", _) => Some(vec![item.clone()]),
            _ if native_block(item).is_some_and(|(_, in_response)| in_response) => {
                Some(vec![item.clone()])
            }
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
            ("function_call_output", _) => {
                let output = match item.get("output") {
                    Some(Value::Array(parts)) => {
                        Value::Array(parts.iter().map(part_block).collect())
                    }
                    Some(other) => other.clone(),
                    None => json!(""),
                };
                vec![tool_result_block(
                    str_field(item, "call_id").unwrap_or(""),
                    output,
                )]
            }
            ("message", "user") => parts(),
            _ if native_block(item).is_some() => vec![item.clone()],
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
                json!({"type": "message", "role": "assistant", "content": "running"}),
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

    /// A response stored twice repeats its reasoning item's id, which names one item of a
    /// request: it is sent once, reported.
    #[test]
    fn a_repeated_reasoning_item_is_sent_once() {
        let e = vec![
            user(0, json!("go")),
            asst(1, "X", json!([reasoning("rs_1"), text("first")])),
            user(2, json!("again")),
            asst(3, "Y", json!([reasoning("rs_1"), text("second")])),
            user(4, json!("next")),
        ];
        let n = normalize(&e, &opts());
        let reasoning_items = n
            .messages
            .iter()
            .filter(|m| m["type"] == "reasoning")
            .count();
        assert_eq!(reasoning_items, 1, "{:?}", n.messages);
        assert!(sent_json(&n).contains("second"));
        assert!(n
            .repairs
            .iter()
            .any(|r| r.kind == RepairKind::ReasoningDropped && r.seqs == [3]));
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
            let other = normalize_for(&e, provider);
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
        // The web search has no Responses form: its call is sent as text, its empty result
        // (nothing a model could read) is dropped; both are reported.
        assert_eq!(
            n.messages[1],
            json!({"type": "message", "role": "assistant", "content": "[web_search call]"})
        );
        let kinds: Vec<RepairKind> = n.repairs.iter().map(|r| r.kind).collect();
        assert_eq!(
            kinds,
            [
                RepairKind::BlockRenderedAsText,
                RepairKind::UnsupportedBlockDropped
            ]
        );
        assert_round_trips(&n, &opts());
    }
}
