//! Rendering for Gemini generateContent: the `contents` list, and its inverse.
//!
//! # Mapping
//! - Assistant turn → `{"role":"model","parts":[…]}`: text → `{text}`, `tool_use` →
//!   `{functionCall: {id, name, args}}`; a stored `thought_signature` goes on the same part as
//!   `thoughtSignature`. Server tool and MCP blocks have no equivalent: they are text parts where
//!   they stood (`block_rendered_as_text`). A turn left with no part gets `(no content)`.
//! - User turn → `{"role":"user","parts":[…]}`: text, base64 images and PDFs as
//!   `{inlineData: {mimeType, data}}`, URL media whose URL names its type as
//!   `{fileData: {fileUri, mimeType}}` (Gemini fetches it); other blocks (text documents, search
//!   results, Files-API media, other URLs) as text. Its `tool_result`s become one user turn of
//!   `{functionResponse: {id, name, response: {output | error}}}` parts in the order of the calls
//!   (the text as for Chat Completions); a functionResponse turn holds nothing else, so the turn's
//!   other blocks follow as a user turn of their own after a `(no content)` model turn
//!   (`placeholder_turn_inserted`).
//! - The list never ends with a model turn: a `(no content)` user turn is appended
//!   (`placeholder_turn_inserted`), which the caller's next user content joins.
//! - In the current turn (the contents after the last user turn with something other than
//!   function responses), the first `functionCall` part of each model turn carries a
//!   `thoughtSignature`: the stored one, else the documented dummy
//!   ([`DUMMY_THOUGHT_SIGNATURE`]).

use std::collections::HashMap;

use serde_json::{json, Map, Value};

use super::blocks::{
    block_type, is_media, str_field, DUMMY_THOUGHT_SIGNATURE, NO_CONTENT, THOUGHT_SIGNATURE,
};
use super::render_shared::{
    assistant_entry, media_source, rendered_or_dropped, split_user_turn, tool_output,
    tool_result_block, tool_use_block, user_entry, MediaSource, ToolCall,
};
use super::{Block, Ctx, Msg, RepairKind};
use crate::history::model::{Content, Entry, Role};

/// The API [`to_gemini`] renders for, as its repairs name it.
const GEMINI: &str = "Gemini";

fn text_part(text: &str) -> Value {
    json!({"text": text})
}

fn content(role: &str, parts: Vec<Value>) -> Value {
    json!({"role": role, "parts": parts})
}

/// A part with the block's stored thought signature, if any.
fn signed(mut part: Value, block: &Value) -> Value {
    if let Some(sig) = str_field(block, THOUGHT_SIGNATURE) {
        part["thoughtSignature"] = json!(sig);
    }
    part
}

/// The media type a URL's file name implies, for Gemini's `fileData` (which needs one).
fn media_type_of_url(url: &str) -> Option<&'static str> {
    let path = url.split(['?', '#']).next()?.to_ascii_lowercase();
    let (_, extension) = path.rsplit_once('.')?;
    Some(match extension {
        "png" => "image/png",
        "jpg" | "jpeg" => "image/jpeg",
        "gif" => "image/gif",
        "webp" => "image/webp",
        "pdf" => "application/pdf",
        _ => return None,
    })
}

/// A stored user block in its Gemini form, when it has one: text; base64 media as `inlineData`;
/// URL media as `fileData`, which Gemini fetches itself, when the URL names its media type.
fn gemini_part(v: &Value) -> Option<Value> {
    match (block_type(v)?, media_source(v)) {
        ("text", _) => Some(text_part(str_field(v, "text").unwrap_or(""))),
        ("image" | "document", Some(MediaSource::Base64 { media_type, data })) => {
            Some(json!({"inlineData": {"mimeType": media_type, "data": data}}))
        }
        ("image" | "document", Some(MediaSource::Url(url))) => {
            let media_type = media_type_of_url(url)?;
            Some(json!({"fileData": {"fileUri": url, "mimeType": media_type}}))
        }
        _ => None,
    }
}

/// Gemini's `inlineData` carries no name: a titled document sent inline is preceded by a text
/// part naming it, so the model reads the title it was given.
fn with_titles(blocks: Vec<Block>) -> Vec<Block> {
    let mut out = Vec::with_capacity(blocks.len());
    for b in blocks {
        let title = str_field(&b.v, "title").filter(|_| {
            block_type(&b.v) == Some("document")
                && matches!(media_source(&b.v), Some(MediaSource::Base64 { .. }))
        });
        if let Some(title) = title {
            out.push(Block {
                v: json!({"type": "text", "text": format!("[document: {title}]")}),
                src: b.src,
            });
        }
        out.push(b);
    }
    out
}

/// Gemini parts stored as blocks of their own type (`native`), and the part member holding them.
const NATIVE_PARTS: &[(&str, &str)] = &[
    ("executable_code", "executableCode"),
    ("code_execution_result", "codeExecutionResult"),
];

/// The part member a stored native block of type `t` goes under.
fn native_part_key(t: &str) -> Option<&'static str> {
    NATIVE_PARTS
        .iter()
        .find(|(ty, _)| *ty == t)
        .map(|(_, key)| *key)
}

/// A stored native block's fields, as the part's value (its `type` and signature are the part's).
fn without_type(v: &Value) -> Value {
    let mut fields = v.as_object().cloned().unwrap_or_default();
    fields.remove("type");
    fields.remove(THOUGHT_SIGNATURE);
    Value::Object(fields)
}

fn is_function_response(p: &Value) -> bool {
    p.get("functionResponse").is_some()
}

/// The Gemini `contents` (see the module docs for the mapping).
pub fn to_gemini(msgs: Vec<Msg>, ctx: &mut Ctx) -> Vec<Value> {
    let mut out = unsigned_contents(msgs, ctx);
    sign_current_turn(&mut out);
    out
}

/// [`to_gemini`] without the signatures of the current turn: which turn is current depends on what
/// follows, so a checkpointed prefix keeps its contents unsigned (`incremental`).
pub fn unsigned_contents(msgs: Vec<Msg>, ctx: &mut Ctx) -> Vec<Value> {
    let mut out: Vec<Value> = Vec::with_capacity(msgs.len() + 1);
    // id → (name, position) of the calls of the last model turn.
    let mut calls: HashMap<String, (String, usize)> = HashMap::new();
    let mut last_src = 0u32;
    for m in msgs {
        last_src = m.primary_src();
        if m.is_assistant() {
            calls.clear();
            let mut parts = Vec::with_capacity(m.blocks.len());
            for b in m.blocks {
                match block_type(&b.v) {
                    Some("text") => parts.push(signed(
                        text_part(str_field(&b.v, "text").unwrap_or("")),
                        &b.v,
                    )),
                    Some("tool_use") => {
                        let call = ToolCall::of(&b.v);
                        calls.insert(call.id.to_string(), (call.name.to_string(), calls.len()));
                        parts.push(signed(
                            json!({"functionCall": {"id": call.id, "name": call.name, "args": call.args()}}),
                            &b.v,
                        ));
                    }
                    Some("thinking" | "redacted_thinking" | "reasoning") => {}
                    // Its own code execution parts, as returned.
                    t => match t.and_then(native_part_key) {
                        Some(key) => parts.push(signed(json!({ key: without_type(&b.v) }), &b.v)),
                        None => parts.extend(
                            rendered_or_dropped(ctx, Role::Assistant, &b, GEMINI)
                                .map(|t| text_part(&t)),
                        ),
                    },
                }
            }
            if parts.is_empty() {
                parts.push(text_part(NO_CONTENT));
            }
            out.push(content("model", parts));
            continue;
        }
        let (results, parts) =
            split_user_turn(with_titles(m.blocks), GEMINI, gemini_part, text_part, ctx);
        let mut responses: Vec<(usize, Value)> = Vec::with_capacity(results.len());
        for r in &results {
            let (r_block, r) = (r, &r.v);
            let id = str_field(r, "tool_use_id").unwrap_or("");
            let (name, at) = calls
                .get(id)
                .map_or(("tool", usize::MAX), |(name, at)| (name.as_str(), *at));
            // Media a tool returned go natively, as the response's parts.
            let (text, media) = tool_output(ctx, r_block, name, GEMINI, |item| {
                is_media(item).then(|| gemini_part(item)).flatten()
            });
            let key = if r.get("is_error") == Some(&json!(true)) {
                "error"
            } else {
                "output"
            };
            let mut response = Map::new();
            response.insert(key.into(), json!(text));
            let mut function_response = json!({"id": id, "name": name, "response": response});
            if !media.is_empty() {
                function_response["parts"] = Value::Array(media);
            }
            responses.push((at, json!({"functionResponse": function_response})));
        }
        let mut parts = parts;
        if !responses.is_empty() {
            responses.sort_by_key(|(at, _)| *at);
            out.push(content(
                "user",
                responses.into_iter().map(|(_, p)| p).collect(),
            ));
            if parts.is_empty() {
                continue;
            }
            out.push(content("model", vec![text_part(NO_CONTENT)]));
            ctx.report(
                RepairKind::PlaceholderTurnInserted,
                [last_src],
                format!("{NO_CONTENT} model turn inserted between function responses and the user's other content"),
            );
        }
        if parts.is_empty() {
            parts.push(text_part(NO_CONTENT));
        }
        out.push(content("user", parts));
    }
    if out.last().is_some_and(|c| c["role"] == "model") {
        out.push(content("user", vec![text_part(NO_CONTENT)]));
        ctx.report(
            RepairKind::PlaceholderTurnInserted,
            [last_src],
            format!(
                "{NO_CONTENT} user turn appended: a Gemini request cannot end with a model turn"
            ),
        );
    }
    out
}

/// Where the current turn starts: just after the last user content holding something other than
/// function responses; `None` when there is none (the turn started earlier, or at the start).
pub fn current_turn_start(contents: &[Value]) -> Option<usize> {
    contents
        .iter()
        .rposition(|c| {
            c["role"] == "user"
                && c["parts"]
                    .as_array()
                    .is_some_and(|ps| ps.iter().any(|p| !is_function_response(p)))
        })
        .map(|i| i + 1)
}

/// The first `functionCall` part of each model turn of the current turn gets the dummy signature
/// when it has none.
pub fn sign_current_turn(contents: &mut [Value]) {
    let start = current_turn_start(contents).unwrap_or(0);
    for c in contents[start..].iter_mut() {
        if let Some(signed) = signed_in_current_turn(c) {
            *c = signed;
        }
    }
}

/// A content as it is sent inside the current turn, when that differs: a model turn whose first
/// `functionCall` part has no signature gets the dummy one.
pub fn signed_in_current_turn(content: &Value) -> Option<Value> {
    if content["role"] != "model" {
        return None;
    }
    let parts = content["parts"].as_array()?;
    let at = parts.iter().position(|p| p.get("functionCall").is_some())?;
    if str_field(&parts[at], "thoughtSignature").is_some_and(|s| !s.is_empty()) {
        return None;
    }
    let mut signed = content.clone();
    signed["parts"][at]["thoughtSignature"] = json!(DUMMY_THOUGHT_SIGNATURE);
    Some(signed)
}

/// A Gemini part as a stored block.
fn part_block(p: &Value) -> Option<Value> {
    let mut block = if let Some(t) = str_field(p, "text") {
        json!({"type": "text", "text": t})
    } else if let Some(call) = p.get("functionCall") {
        tool_use_block(
            str_field(call, "id").unwrap_or(""),
            str_field(call, "name").unwrap_or(""),
            call.get("args").cloned().unwrap_or_else(|| json!({})),
        )
    } else if let Some(resp) = p.get("functionResponse") {
        let response = resp.get("response");
        let error = response.and_then(|r| r.get("error"));
        let text = error
            .or_else(|| response.and_then(|r| r.get("output")))
            .cloned()
            .unwrap_or_else(|| json!(""));
        // Media the tool returned come back as the result's blocks after its text.
        let media: Vec<Value> = resp
            .get("parts")
            .and_then(Value::as_array)
            .map(|parts| parts.iter().filter_map(part_block).collect())
            .unwrap_or_default();
        let content = if media.is_empty() {
            text
        } else {
            let text = text
                .as_str()
                .filter(|t| !t.is_empty())
                .map(|t| json!({"type": "text", "text": t}));
            Value::Array(text.into_iter().chain(media).collect())
        };
        let mut b = tool_result_block(str_field(resp, "id").unwrap_or(""), content);
        if error.is_some() {
            b["is_error"] = json!(true);
        }
        b
    } else if let Some(inline) = p.get("inlineData") {
        let media = str_field(inline, "mimeType").unwrap_or("");
        let ty = if media.starts_with("image/") {
            "image"
        } else {
            "document"
        };
        json!({"type": ty, "source": {"type": "base64", "media_type": media, "data": str_field(inline, "data").unwrap_or("")}})
    } else if let Some((ty, fields)) = NATIVE_PARTS
        .iter()
        .find_map(|(ty, key)| p.get(*key).map(|fields| (*ty, fields)))
    {
        // Its own code execution parts, stored under the convention of `native`.
        let mut block = Map::new();
        block.insert("type".into(), json!(ty));
        block.extend(fields.as_object().cloned().unwrap_or_default());
        Value::Object(block)
    } else if let Some(file) = p.get("fileData") {
        let ty = if str_field(file, "mimeType").is_some_and(|m| m.starts_with("image/")) {
            "image"
        } else {
            "document"
        };
        json!({"type": ty, "source": {"type": "url", "url": str_field(file, "fileUri").unwrap_or("")}})
    } else {
        return None;
    };
    if let Some(sig) = str_field(p, "thoughtSignature") {
        block[THOUGHT_SIGNATURE] = json!(sig);
    }
    Some(block)
}

/// Gemini contents back into entries (see [`super::entries_from_messages`]): one entry per
/// content, `model` as assistant.
pub fn entries_from_contents(contents: &[Value]) -> Vec<Entry> {
    contents
        .iter()
        .enumerate()
        .filter_map(|(i, c)| {
            let blocks: Vec<Value> = c
                .get("parts")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(part_block)
                .collect();
            match str_field(c, "role") {
                Some("model") => Some(assistant_entry(i, Content::Blocks(blocks))),
                Some("user") => Some(user_entry(i, Content::Blocks(blocks))),
                _ => None,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::super::testutil::*;
    use super::super::{normalize, NormalizeOptions, Provider};
    use super::*;

    fn opts() -> NormalizeOptions {
        NormalizeOptions {
            provider: Provider::Gemini,
            ..Default::default()
        }
    }

    fn signed_tu(id: &str, sig: &str) -> Value {
        let mut b = tu(id);
        b["thought_signature"] = json!(sig);
        b
    }

    fn call(id: &str) -> Value {
        json!({"functionCall": {"id": id, "name": "Bash", "args": {"command": "ls"}}})
    }

    fn response(id: &str) -> Value {
        json!({"functionResponse": {"id": id, "name": "Bash", "response": {"output": "ok"}}})
    }

    #[test]
    fn calls_are_answered_in_order_and_signatures_stay_on_their_part() {
        let e = vec![
            user(0, json!("go")),
            asst(
                1,
                "X",
                json!([
                    thinking("t"),
                    text("running"),
                    signed_tu("c1", "SIG1"),
                    tu("c2")
                ]),
            ),
            user(2, json!([tr("c2"), tr("c1")])),
            asst(3, "Y", json!([tu("c3")])),
            user(4, json!([tr("c3")])),
        ];
        let n = normalize(&e, &opts());
        let mut c1 = call("c1");
        c1["thoughtSignature"] = json!("SIG1");
        let mut c3 = call("c3");
        c3["thoughtSignature"] = json!(DUMMY_THOUGHT_SIGNATURE);
        assert_eq!(
            n.messages,
            vec![
                json!({"role": "user", "parts": [{"text": "go"}]}),
                json!({"role": "model", "parts": [{"text": "running"}, c1, call("c2")]}),
                json!({"role": "user", "parts": [response("c1"), response("c2")]}),
                json!({"role": "model", "parts": [c3]}),
                json!({"role": "user", "parts": [response("c3")]}),
            ]
        );
        assert!(n.repairs.is_empty());
        assert_round_trips(&n, &opts());
    }

    #[test]
    fn mixed_user_turn_is_split_and_the_list_ends_with_the_user() {
        let e = vec![
            user(0, json!("go")),
            asst(1, "X", json!([tu("c1")])),
            user(
                2,
                json!([{"type": "tool_result", "tool_use_id": "c1", "is_error": true, "content": "boom"}, text("why?")]),
            ),
            asst(3, "Y", json!([text("because")])),
        ];
        let n = normalize(&e, &opts());
        assert_eq!(
            n.messages[2],
            json!({"role": "user", "parts": [{"functionResponse": {"id": "c1", "name": "Bash", "response": {"error": "boom"}}}]})
        );
        assert_eq!(
            n.messages[3],
            json!({"role": "model", "parts": [{"text": NO_CONTENT}]})
        );
        assert_eq!(
            n.messages[4],
            json!({"role": "user", "parts": [{"text": "why?"}]})
        );
        assert_eq!(
            n.messages[6],
            json!({"role": "user", "parts": [{"text": NO_CONTENT}]})
        );
        assert_eq!(n.messages.len(), 7);
        let kinds: Vec<RepairKind> = n.repairs.iter().map(|r| r.kind).collect();
        assert_eq!(
            kinds,
            vec![
                RepairKind::PlaceholderTurnInserted,
                RepairKind::PlaceholderTurnInserted
            ]
        );
        assert_round_trips(&n, &opts());
    }

    #[test]
    fn signatures_of_another_model_are_dropped_and_others_never_see_them() {
        let mut a = asst(1, "X", json!([signed_tu("c1", "SIG1")]));
        a.message.as_mut().unwrap().model = Some("gemini-a".into());
        let e = vec![user(0, json!("go")), a, user(2, json!([tr("c1")]))];
        let other = normalize(
            &e,
            &NormalizeOptions {
                model: Some("gemini-b".into()),
                ..opts()
            },
        );
        assert_eq!(
            other.messages[1]["parts"][0]["thoughtSignature"],
            json!(DUMMY_THOUGHT_SIGNATURE)
        );
        assert_eq!(other.repairs[0].kind, RepairKind::ForeignThinkingDropped);
        let same = normalize(
            &e,
            &NormalizeOptions {
                model: Some("gemini-a".into()),
                ..opts()
            },
        );
        assert_eq!(
            same.messages[1]["parts"][0]["thoughtSignature"],
            json!("SIG1")
        );
        let anthropic = normalize(&e, &NormalizeOptions::default());
        assert_eq!(anthropic.messages[1]["content"][0], tu("c1"));
    }
}
