//! Step n — the Anthropic and Chat Completions message shapes, and the inverse
//! ([`entries_from_chat`]). What the renderers share is in [`super::render_shared`].
//!
//! # OpenAI Chat Completions mapping
//! - Assistant: text blocks joined by `"\n\n"` into `content` (a string); `tool_use` →
//!   `tool_calls[] {id, type:"function", function:{name, arguments: JSON string}}` (no key when
//!   none). `content` is `null` only when there are tool calls and no text; otherwise a turn with
//!   no text gets `(no content)`. Thinking is dropped silently (earlier); other assistant blocks
//!   (`server_tool_use`, server results, MCP calls and results, `container_upload`) have no
//!   equivalent and are sent as text where they stood ([`super::render_text`];
//!   `block_rendered_as_text`), or dropped when nothing of them is readable
//!   (`unsupported_block_dropped`).
//! - User: each `tool_result` → `{"role":"tool","tool_call_id","content": string}` right after the
//!   assistant, in order; the string is the result's string content, or its array rendered as text
//!   (texts joined by `"\n\n"`, other blocks as [`super::render_text`] renders them,
//!   `[tool_reference: <name>]`); an empty result becomes `(<ToolName> completed with no output)`.
//!   The remaining blocks form a user message (a string when it is one text part): text → text
//!   part; image → `image_url` (a `data:` URL for base64, else the URL); a base64 PDF → a `file`
//!   part (`file_data` data URL, `filename` = title or `document.pdf`); every other block (text
//!   and content documents, URL and Files-API media, search results) is sent as text.

use std::collections::HashMap;

use serde_json::{json, Map, Value};

use super::blocks::{block_type, is_type, str_field, NO_CONTENT};
use super::render_shared::{
    assistant_entry, chat_part, parse_arguments, part_to_block, rendered_or_dropped, role_str,
    split_user_turn, tool_output, tool_result_block, tool_use_block, user_entry, ToolCall,
};
use super::{Ctx, Msg, Provider};
use crate::history::model::{Content, Entry, Role};

/// Anthropic: each message reduced to `{role, content}` (content always an array of blocks).
pub fn to_anthropic(msgs: Vec<Msg>) -> Vec<Value> {
    msgs.into_iter()
        .map(|m| {
            let blocks: Vec<Value> = m.blocks.into_iter().map(|b| b.v).collect();
            let mut obj = Map::with_capacity(2);
            obj.insert("role".into(), Value::String(role_str(m.role).into()));
            obj.insert("content".into(), Value::Array(blocks));
            Value::Object(obj)
        })
        .collect()
}

/// The API [`to_openai`] renders for, as its repairs name it.
const CHAT_COMPLETIONS: &str = "Chat Completions";

/// OpenAI Chat Completions messages (see the module docs for the mapping).
pub fn to_openai(msgs: Vec<Msg>, ctx: &mut Ctx) -> Vec<Value> {
    let mut out = Vec::with_capacity(msgs.len() + 8);
    let mut names: HashMap<String, String> = HashMap::new();
    for m in msgs {
        if m.is_assistant() {
            names.clear();
            let mut texts: Vec<String> = Vec::new();
            let mut calls: Vec<Value> = Vec::new();
            for b in m.blocks {
                match block_type(&b.v) {
                    Some("text") => texts.push(str_field(&b.v, "text").unwrap_or("").to_string()),
                    Some("tool_use") => {
                        let call = ToolCall::of(&b.v);
                        names.insert(call.id.to_string(), call.name.to_string());
                        calls.push(json!({"id": call.id, "type": "function", "function": {"name": call.name, "arguments": call.arguments()}}));
                    }
                    Some("thinking" | "redacted_thinking") => {}
                    _ => texts.extend(rendered_or_dropped(
                        ctx,
                        Role::Assistant,
                        &b,
                        CHAT_COMPLETIONS,
                    )),
                }
            }
            let content = if !texts.is_empty() {
                Value::String(texts.join("\n\n"))
            } else if !calls.is_empty() {
                Value::Null
            } else {
                Value::String(NO_CONTENT.into())
            };
            let mut obj = Map::new();
            obj.insert("role".into(), json!("assistant"));
            obj.insert("content".into(), content);
            if !calls.is_empty() {
                obj.insert("tool_calls".into(), Value::Array(calls));
            }
            out.push(Value::Object(obj));
            continue;
        }
        let (results, mut parts) = split_user_turn(
            m.blocks,
            CHAT_COMPLETIONS,
            chat_part,
            |text| json!({"type": "text", "text": text}),
            ctx,
        );
        for r in &results {
            let id = str_field(&r.v, "tool_use_id").unwrap_or("");
            let name = names.get(id).map_or("tool", String::as_str);
            // A Chat Completions tool message is text only.
            let (text, _) = tool_output(ctx, r, name, CHAT_COMPLETIONS, |_| None);
            out.push(json!({"role": "tool", "tool_call_id": id, "content": text}));
        }
        let content = match parts.len() {
            0 if !results.is_empty() => continue,
            0 => Value::String(NO_CONTENT.into()),
            1 if is_type(&parts[0], "text") => parts
                .pop()
                .and_then(|p| p.get("text").cloned())
                .unwrap_or_default(),
            _ => Value::Array(parts),
        };
        out.push(json!({"role": "user", "content": content}));
    }
    out
}

/// Anthropic or Chat Completions messages back into entries (see
/// [`super::entries_from_messages`]): one entry per message; OpenAI `tool` messages become user
/// entries holding one `tool_result` each (merged again by normalization); `system`/`developer`
/// messages, and the lists of other providers, give none.
pub fn entries_from_chat(messages: &[Value], provider: Provider) -> Vec<Entry> {
    let mut out = Vec::with_capacity(messages.len());
    for (i, m) in messages.iter().enumerate() {
        let role = str_field(m, "role").unwrap_or("");
        let content = m.get("content");
        match (provider, role) {
            (Provider::Anthropic, "user" | "assistant") => {
                let c = match content {
                    Some(Value::String(s)) => Content::Text(s.clone()),
                    Some(Value::Array(items)) => Content::Blocks(items.clone()),
                    _ => Content::Blocks(Vec::new()),
                };
                out.push(if role == "user" {
                    user_entry(i, c)
                } else {
                    assistant_entry(i, c)
                });
            }
            (Provider::Openai, "user") => {
                let c = match content {
                    Some(Value::String(s)) => Content::Text(s.clone()),
                    Some(Value::Array(items)) => {
                        Content::Blocks(items.iter().map(part_to_block).collect())
                    }
                    _ => Content::Blocks(Vec::new()),
                };
                out.push(user_entry(i, c));
            }
            (Provider::Openai, "assistant") => {
                let mut blocks = Vec::new();
                match content {
                    Some(Value::String(s)) => blocks.push(json!({"type": "text", "text": s})),
                    Some(Value::Array(items)) => blocks.extend(items.iter().cloned()),
                    _ => {}
                }
                for call in m
                    .get("tool_calls")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                {
                    let f = call.get("function").cloned().unwrap_or_default();
                    blocks.push(tool_use_block(
                        str_field(call, "id").unwrap_or(""),
                        str_field(&f, "name").unwrap_or(""),
                        parse_arguments(str_field(&f, "arguments")),
                    ));
                }
                out.push(assistant_entry(i, Content::Blocks(blocks)));
            }
            (Provider::Openai, "tool") => {
                let block = tool_result_block(
                    str_field(m, "tool_call_id").unwrap_or(""),
                    content.cloned().unwrap_or_else(|| json!("")),
                );
                out.push(user_entry(i, Content::Blocks(vec![block])));
            }
            _ => {}
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::super::testutil::*;
    use super::super::{entries_from_messages, normalize, NormalizeOptions, RepairKind};
    use super::*;

    fn openai() -> NormalizeOptions {
        NormalizeOptions {
            provider: Provider::Openai,
            ..Default::default()
        }
    }

    #[test]
    fn anthropic_reduces_to_role_and_content() {
        let e = vec![user(0, json!("hi")), asst(1, "X", json!([text("yo")]))];
        let out = anth(&e).messages;
        assert_eq!(
            out,
            vec![
                json!({"role": "user", "content": [text("hi")]}),
                json!({"role": "assistant", "content": [text("yo")]}),
            ]
        );
    }

    #[test]
    fn openai_tool_calls_tool_messages_and_trailing_user_text() {
        let e = vec![
            user(0, json!("go")),
            asst(
                1,
                "X",
                json!([thinking("t"), text("running"), tu("toolu_1"), {"type": "tool_use", "id": "toolu_2", "name": "Read", "input": {"p": 1}}]),
            ),
            user(
                2,
                json!([tr("toolu_2"), {"type": "tool_result", "tool_use_id": "toolu_1", "content": [text("a"), text("b")]}, text("and now?")]),
            ),
        ];
        let out = normalize(&e, &openai()).messages;
        assert_eq!(
            out,
            vec![
                json!({"role": "user", "content": "go"}),
                json!({"role": "assistant", "content": "running", "tool_calls": [
                    {"id": "toolu_1", "type": "function", "function": {"name": "Bash", "arguments": "{\"command\":\"ls\"}"}},
                    {"id": "toolu_2", "type": "function", "function": {"name": "Read", "arguments": "{\"p\":1}"}},
                ]}),
                json!({"role": "tool", "tool_call_id": "toolu_2", "content": "ok"}),
                json!({"role": "tool", "tool_call_id": "toolu_1", "content": "a\n\nb"}),
                json!({"role": "user", "content": "and now?"}),
            ]
        );
    }

    #[test]
    fn openai_null_content_with_calls_and_media_parts() {
        let img = json!({"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG}});
        let pdf = json!({"type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": "JVBERi0x"}});
        let urlimg = json!({"type": "image", "source": {"type": "url", "url": "https://x/y.png"}});
        let e = vec![
            user(0, json!([text("see"), img, pdf, urlimg])),
            asst(1, "X", json!([tu("c1")])),
            user(
                2,
                json!([{"type": "tool_result", "tool_use_id": "c1", "content": ""}]),
            ),
        ];
        let out = normalize(&e, &openai()).messages;
        assert_eq!(
            out[0]["content"],
            json!([
                {"type": "text", "text": "see"},
                {"type": "image_url", "image_url": {"url": format!("data:image/png;base64,{PNG}")}},
                {"type": "file", "file": {"filename": "document.pdf", "file_data": "data:application/pdf;base64,JVBERi0x"}},
                {"type": "image_url", "image_url": {"url": "https://x/y.png"}},
            ])
        );
        assert_eq!(out[1]["content"], Value::Null);
        assert_eq!(
            out[2],
            json!({"role": "tool", "tool_call_id": "c1", "content": "(Bash completed with no output)"})
        );
        assert_eq!(out.len(), 3);
    }

    #[test]
    fn openai_long_ids_mapped_consistently() {
        let long = "toolu_01".to_string() + &"Z".repeat(50);
        let e = vec![
            user(0, json!("go")),
            asst(1, "X", json!([tu(&long)])),
            user(2, json!([tr(&long)])),
        ];
        let n = normalize(&e, &openai());
        let id = n.messages[1]["tool_calls"][0]["id"]
            .as_str()
            .unwrap()
            .to_string();
        assert!(id.len() <= 40);
        assert_eq!(n.messages[2]["tool_call_id"], json!(id));
        assert!(n
            .repairs
            .iter()
            .any(|r| r.kind == RepairKind::ToolIdRewritten));
    }

    #[test]
    fn roundtrip_entries() {
        let e = vec![
            user(0, json!("go")),
            asst(1, "X", json!([tu("a")])),
            user(2, json!([tr("a"), text("x")])),
        ];
        for opts in [NormalizeOptions::default(), openai()] {
            let first = normalize(&e, &opts).messages;
            let again = normalize(&entries_from_messages(&first, opts.provider), &opts).messages;
            assert_eq!(first, again);
        }
    }
}
