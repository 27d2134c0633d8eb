//! What the provider renderers ([`super::output`], [`super::responses`], [`super::gemini`])
//! share, so that each imports it from here and none imports another: Chat Completions user parts
//! and tool-result text (which the Responses and Gemini forms start from), the report of a block
//! with no equivalent, tool calls, and, for their inverses, the entries and stored blocks an
//! output turns back into.

use serde_json::{json, Value};

use super::blocks::{block_type, completed_with_no_output, is_type, str_field};
use super::{render_text, Block, Ctx, RepairKind};
use crate::history::model::{ApiMessage, Content, Entry, EntryKind, Role};

pub(super) fn role_str(role: Role) -> &'static str {
    match role {
        Role::User => "user",
        Role::Assistant => "assistant",
    }
}

fn texts_of(items: &[Value]) -> Vec<String> {
    items
        .iter()
        .filter_map(|x| match block_type(x) {
            Some("text") => str_field(x, "text").map(String::from),
            Some("tool_reference") => Some(format!(
                "[tool_reference: {}]",
                str_field(x, "tool_name").unwrap_or("")
            )),
            _ => render_text::rendered(x).or_else(|| Some(x.to_string())),
        })
        .collect()
}

/// A tool result's content as the string of an OpenAI tool message: its text, and what is
/// readable of its other blocks (a document's title and text, a search result's title, source
/// and text, where an image or document is).
pub(super) fn tool_text(v: &Value, name: &str) -> String {
    let s = match v.get("content") {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(items)) => texts_of(items).join("\n\n"),
        Some(Value::Null) | None => String::new(),
        Some(other) => other.to_string(),
    };
    if s.trim().is_empty() {
        completed_with_no_output(name)
    } else {
        s
    }
}

/// A tool result's output for a target whose tool output is text, plus media in the target's
/// own form where it has one (`native`; Chat Completions has none): the text, with what is
/// readable of the items that have no native form, and the native items in order. An item sent
/// as text is reported (`block_rendered_as_text`).
pub(super) fn tool_output(
    ctx: &mut Ctx,
    result: &Block,
    name: &str,
    api: &str,
    native: impl Fn(&Value) -> Option<Value>,
) -> (String, Vec<Value>) {
    let Some(Value::Array(items)) = result.v.get("content") else {
        return (tool_text(&result.v, name), Vec::new());
    };
    let mut texts = Vec::with_capacity(items.len());
    let mut media = Vec::new();
    let mut rendered = Vec::new();
    for item in items {
        match block_type(item) {
            Some("text") => texts.extend(str_field(item, "text").map(String::from)),
            Some("tool_reference") => texts.push(format!(
                "[tool_reference: {}]",
                str_field(item, "tool_name").unwrap_or("")
            )),
            kind => match native(item) {
                Some(part) => {
                    // Not every target's media part carries a name: the text does.
                    if let Some(title) = str_field(item, "title") {
                        texts.push(format!("[{}: {title}]", kind.unwrap_or("media")));
                    }
                    media.push(part);
                }
                None => {
                    rendered.push(kind.unwrap_or("?"));
                    texts.push(render_text::rendered(item).unwrap_or_else(|| item.to_string()));
                }
            },
        }
    }
    if !rendered.is_empty() {
        ctx.report(
            RepairKind::BlockRenderedAsText,
            [result.src],
            format!(
                "tool_result {}: {} sent as text: no {api} form in a tool result",
                str_field(&result.v, "tool_use_id").unwrap_or(""),
                rendered.join(", ")
            ),
        );
    }
    let text = texts.join("\n\n");
    if text.trim().is_empty() && media.is_empty() {
        return (completed_with_no_output(name), media);
    }
    (text, media)
}

/// Where a stored image or document is, when the target can take it natively: its bytes, or
/// a URL the target fetches itself.
pub(super) enum MediaSource<'a> {
    Base64 { media_type: &'a str, data: &'a str },
    Url(&'a str),
}

impl MediaSource<'_> {
    /// Base64 media as a `data:` URL.
    pub fn data_url(media_type: &str, data: &str) -> String {
        format!("data:{media_type};base64,{data}")
    }
}

/// The source of a stored image or document, unless it is a Files-API id or a text document.
pub(super) fn media_source(v: &Value) -> Option<MediaSource<'_>> {
    let source = v.get("source")?;
    match str_field(source, "type")? {
        "base64" => Some(MediaSource::Base64 {
            media_type: str_field(source, "media_type")?,
            data: str_field(source, "data")?,
        }),
        "url" => str_field(source, "url").map(MediaSource::Url),
        _ => None,
    }
}

/// One user block as a Chat Completions content part, when it has one: text, an image by data
/// URL or URL, a base64 PDF as a `file` part (named by its title).
pub(super) fn chat_part(v: &Value) -> Option<Value> {
    match (block_type(v)?, media_source(v)) {
        ("text", _) => Some(json!({"type": "text", "text": str_field(v, "text").unwrap_or("")})),
        ("image", Some(MediaSource::Base64 { media_type, data })) => Some(
            json!({"type": "image_url", "image_url": {"url": MediaSource::data_url(media_type, data)}}),
        ),
        ("image", Some(MediaSource::Url(url))) => {
            Some(json!({"type": "image_url", "image_url": {"url": url}}))
        }
        (
            "document",
            Some(MediaSource::Base64 {
                media_type: media @ "application/pdf",
                data,
            }),
        ) => Some(json!({"type": "file", "file": {
            "filename": str_field(v, "title").unwrap_or("document.pdf"),
            "file_data": MediaSource::data_url(media, data),
        }})),
        _ => None,
    }
}

/// The block as text for a target `api` with no form for it, reported
/// (`block_rendered_as_text`); `None`, reported dropped, when nothing of it is readable.
pub(super) fn rendered_or_dropped(
    ctx: &mut Ctx,
    role: Role,
    block: &Block,
    api: &str,
) -> Option<String> {
    match render_text::rendered(&block.v) {
        Some(text) => {
            ctx.report(
                RepairKind::BlockRenderedAsText,
                [block.src],
                format!(
                    "{} {} block sent as text: no {api} equivalent",
                    role_str(role),
                    block_type(&block.v).unwrap_or("?")
                ),
            );
            Some(text)
        }
        None => {
            report_dropped(ctx, role, block, api);
            None
        }
    }
}

/// Reports a block the target `api` has no form for (`unsupported_block_dropped`).
pub(super) fn report_dropped(ctx: &mut Ctx, role: Role, block: &Block, api: &str) {
    ctx.report(
        RepairKind::UnsupportedBlockDropped,
        [block.src],
        format!(
            "dropped {} {} block: no {api} equivalent",
            role_str(role),
            block_type(&block.v).unwrap_or("?")
        ),
    );
}

/// A `tool_use` block as the call an assistant turn makes in the OpenAI and Gemini APIs.
pub(super) struct ToolCall<'a> {
    pub id: &'a str,
    pub name: &'a str,
    input: Option<&'a Value>,
}

impl<'a> ToolCall<'a> {
    pub fn of(block: &'a Value) -> Self {
        ToolCall {
            id: str_field(block, "id").unwrap_or(""),
            name: str_field(block, "name").unwrap_or(""),
            input: block.get("input"),
        }
    }

    /// The input as a JSON string (OpenAI's `arguments`), `{}` when there is none.
    pub fn arguments(&self) -> String {
        self.input
            .map_or_else(|| "{}".to_string(), Value::to_string)
    }

    /// The input as an object (Gemini's `args`), `{}` when there is none.
    pub fn args(&self) -> Value {
        self.input.cloned().unwrap_or_else(|| json!({}))
    }
}

/// A user turn's blocks as the OpenAI and Gemini renderers take them: its `tool_result` blocks in
/// order, and its other blocks as the target's parts: `native` gives a block's own form, and a
/// block with none is sent as text in its place (`block_rendered_as_text`), or dropped when
/// nothing of it is readable.
pub(super) fn split_user_turn(
    blocks: Vec<Block>,
    api: &str,
    native: impl Fn(&Value) -> Option<Value>,
    as_text: impl Fn(&str) -> Value,
    ctx: &mut Ctx,
) -> (Vec<Block>, Vec<Value>) {
    let mut results = Vec::new();
    let mut parts = Vec::new();
    for b in blocks {
        if is_type(&b.v, "tool_result") {
            results.push(b);
        } else if let Some(p) = native(&b.v) {
            parts.push(p);
        } else if let Some(text) = rendered_or_dropped(ctx, Role::User, &b, api) {
            parts.push(as_text(&text));
        }
    }
    (results, parts)
}

/// The media type and the data of a base64 `data:` URL.
pub(super) fn split_data_url(url: &str) -> Option<(&str, &str)> {
    url.strip_prefix("data:")?.split_once(";base64,")
}

pub(super) fn part_to_block(p: &Value) -> Value {
    match block_type(p) {
        Some("image_url") => {
            let url = p
                .get("image_url")
                .and_then(|u| str_field(u, "url"))
                .unwrap_or("");
            match split_data_url(url) {
                Some((media, data)) => {
                    json!({"type": "image", "source": {"type": "base64", "media_type": media, "data": data}})
                }
                None => json!({"type": "image", "source": {"type": "url", "url": url}}),
            }
        }
        Some("file") => {
            let f = p.get("file").cloned().unwrap_or_default();
            let data = str_field(&f, "file_data").unwrap_or("");
            let (media, b64) = split_data_url(data).unwrap_or(("application/pdf", data));
            let mut doc = json!({"type": "document", "source": {"type": "base64", "media_type": media, "data": b64}});
            if let Some(name) = str_field(&f, "filename") {
                doc["title"] = json!(name);
            }
            doc
        }
        _ => p.clone(),
    }
}

fn entry(i: usize, kind: EntryKind, role: Role, content: Content, id: Option<String>) -> Entry {
    Entry {
        seq: Some(i as i64),
        message: Some(ApiMessage {
            id,
            ..ApiMessage::new(role, content)
        }),
        ..Entry::new(kind)
    }
}

/// The user entry of the `i`th message of an output.
pub(super) fn user_entry(i: usize, content: Content) -> Entry {
    entry(i, EntryKind::User, Role::User, content, None)
}

/// The assistant entry of the `i`th message of an output, with the synthetic message id
/// `msg_loupe_<i>`, distinct for each turn so that no two turns merge.
pub(super) fn assistant_entry(i: usize, content: Content) -> Entry {
    let id = Some(format!("msg_loupe_{i}"));
    entry(i, EntryKind::Assistant, Role::Assistant, content, id)
}

/// A stored `tool_use` block.
pub(super) fn tool_use_block(id: &str, name: &str, input: Value) -> Value {
    json!({"type": "tool_use", "id": id, "name": name, "input": input})
}

/// The input of a call whose `arguments` are a JSON string (OpenAI); `{}` when they do not parse.
pub(super) fn parse_arguments(arguments: Option<&str>) -> Value {
    arguments
        .and_then(|a| serde_json::from_str::<Value>(a).ok())
        .unwrap_or_else(|| json!({}))
}

/// A stored `tool_result` block answering the call `id`.
pub(super) fn tool_result_block(id: &str, content: Value) -> Value {
    json!({"type": "tool_result", "tool_use_id": id, "content": content})
}
