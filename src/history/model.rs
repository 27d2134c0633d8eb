//! The internal history format: one stored entry of a thread.
//!
//! This is the shape an agent loop produces (`docs/NORMALIZATION.md` § Entries), written in snake_case JSON.
//! It is stored losslessly: content blocks are kept as raw JSON values (block types Loupe does not
//! know are returned verbatim), and top-level fields it does not know are kept in `extra`.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use utoipa::ToSchema;

/// The discriminator of an entry (`type` in JSON).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum EntryKind {
    /// A user turn: a prompt, tool results, or a meta message (reminders, summaries).
    User,
    /// One API response, or one streamed fragment of it (fragments share `message.id`).
    Assistant,
    /// Context attached to a prompt (files, reminders); sent as a meta user message.
    Attachment,
    /// Bookkeeping that never reaches the model, except `local_command` output.
    System,
    /// UI progress events; never sent.
    Progress,
}

impl EntryKind {
    pub fn as_str(self) -> &'static str {
        match self {
            EntryKind::User => "user",
            EntryKind::Assistant => "assistant",
            EntryKind::Attachment => "attachment",
            EntryKind::System => "system",
            EntryKind::Progress => "progress",
        }
    }

    /// User and assistant entries are what the model sees (`docs/NORMALIZATION.md` § Model-visible entries).
    pub fn is_model_visible(self) -> bool {
        matches!(self, EntryKind::User | EntryKind::Assistant)
    }
}

/// The role of an API message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    User,
    Assistant,
}

/// Message content: a plain string (shorthand for one text block) or an array of content blocks.
/// Blocks are raw JSON objects with a `type`; unknown block types are kept verbatim.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(untagged)]
pub enum Content {
    Text(String),
    Blocks(Vec<Value>),
}

impl Content {
    /// The content as blocks; a string becomes one text block.
    pub fn to_blocks(&self) -> Vec<Value> {
        match self {
            Content::Text(text) => vec![serde_json::json!({"type": "text", "text": text})],
            Content::Blocks(blocks) => blocks.clone(),
        }
    }
}

/// The API message carried by a user, assistant or attachment entry.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ApiMessage {
    pub role: Role,
    pub content: Content,
    /// The provider's response id (`msg_…`); streamed fragments of one response share it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop_reason: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub usage: Option<Value>,
    /// Fields Loupe does not model, kept as they came.
    #[serde(flatten)]
    #[schema(value_type = Object)]
    pub extra: Map<String, Value>,
}

/// One entry of a thread's history.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Entry {
    /// Position in the thread, dense from 0; assigned by the server, the entry's permanent id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(read_only)]
    pub seq: Option<i64>,
    /// Unique within the thread (and within a batch); generated when omitted. Re-sending the same
    /// uuid is idempotent. 1–200 characters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(min_length = 1, max_length = 200)]
    pub uuid: Option<String>,
    #[serde(rename = "type")]
    pub kind: EntryKind,
    /// Present on `user`, `assistant` and `attachment` entries.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<ApiMessage>,
    /// Sent to the model but not shown to people (reminders, attachments, recovery nudges).
    #[serde(default, skip_serializing_if = "is_false")]
    pub is_meta: bool,
    /// Display-only; never sent to the model.
    #[serde(default, skip_serializing_if = "is_false")]
    pub is_virtual: bool,
    /// The summary written by a compaction.
    #[serde(default, skip_serializing_if = "is_false")]
    pub is_compact_summary: bool,
    /// A synthetic assistant entry recording an API error (its text names the error).
    #[serde(default, skip_serializing_if = "is_false")]
    pub is_api_error: bool,
    /// For `system` entries: `compact_boundary`, `local_command`, `snip`, `informational`, …
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subtype: Option<String>,
    /// For `system` entries: their text (a `local_command` entry's output becomes user text).
    /// Any JSON value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<serde_json::Value>)]
    pub content: Option<Value>,
    /// For a `compact_boundary` entry: trigger, tokens before, messages summarized, summarizer,
    /// preserved segment.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub compact_metadata: Option<Value>,
    /// For a `snip` entry: the messages it hides from every later context.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snip_metadata: Option<SnipMetadata>,
    /// When the entry was created; set by the server when omitted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created_at: Option<DateTime<Utc>>,
    /// Fields Loupe does not model (progress `data`, transcript fields, …), kept as they came.
    #[serde(flatten)]
    #[schema(value_type = Object)]
    pub extra: Map<String, Value>,
}

/// What a snip entry hides.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct SnipMetadata {
    pub removed_uuids: Vec<String>,
}

fn is_false(value: &bool) -> bool {
    !*value
}

pub mod subtype {
    pub const COMPACT_BOUNDARY: &str = "compact_boundary";
    pub const LOCAL_COMMAND: &str = "local_command";
    pub const SNIP: &str = "snip";
}

impl ApiMessage {
    /// A message with only a role and content (no provider id, model or usage).
    pub fn new(role: Role, content: Content) -> Self {
        ApiMessage {
            role,
            content,
            id: None,
            model: None,
            stop_reason: None,
            usage: None,
            extra: Map::new(),
        }
    }
}

impl Entry {
    /// An entry of `kind` with every optional field empty and every flag off.
    pub fn new(kind: EntryKind) -> Self {
        Entry {
            seq: None,
            uuid: None,
            kind,
            message: None,
            is_meta: false,
            is_virtual: false,
            is_compact_summary: false,
            is_api_error: false,
            subtype: None,
            content: None,
            compact_metadata: None,
            snip_metadata: None,
            created_at: None,
            extra: Map::new(),
        }
    }

    /// A snip entry hiding `removed_uuids` from every later context.
    pub fn snip(removed_uuids: Vec<String>) -> Self {
        Entry {
            subtype: Some(subtype::SNIP.to_owned()),
            content: Some(Value::String(format!(
                "Snipped {} message(s)",
                removed_uuids.len()
            ))),
            snip_metadata: Some(SnipMetadata { removed_uuids }),
            ..Entry::new(EntryKind::System)
        }
    }

    /// The provider response id of an assistant entry.
    pub fn response_id(&self) -> Option<&str> {
        self.message.as_ref().and_then(|m| m.id.as_deref())
    }

    pub fn is_compact_boundary(&self) -> bool {
        self.kind == EntryKind::System && self.subtype.as_deref() == Some(subtype::COMPACT_BOUNDARY)
    }

    pub fn is_snip(&self) -> bool {
        self.kind == EntryKind::System && self.subtype.as_deref() == Some(subtype::SNIP)
    }

    /// The entry's position: its `seq`, or `index` (its position in the slice) when unset.
    pub fn seq_or(&self, index: usize) -> i64 {
        self.seq.unwrap_or(index as i64)
    }

    /// The `[first_seq, last_seq]` range a compact boundary keeps by reference
    /// (`compact_metadata.preserved_segment`), when present and well-formed.
    pub fn preserved_segment(&self) -> Option<(i64, i64)> {
        let seg = self.compact_metadata.as_ref()?.get("preserved_segment")?;
        let first = seg.get("first_seq")?.as_i64()?;
        let last = seg.get("last_seq")?.as_i64()?;
        Some((first, last))
    }

    /// A synthetic assistant entry recording an API error.
    pub fn is_api_error_message(&self) -> bool {
        self.kind == EntryKind::Assistant && self.is_api_error
    }

    /// The text of the first text block (or the string content) of the entry's message.
    pub fn first_text(&self) -> Option<&str> {
        match &self.message.as_ref()?.content {
            Content::Text(text) => Some(text.as_str()),
            Content::Blocks(blocks) => blocks
                .iter()
                .find(|b| b.get("type").and_then(Value::as_str) == Some("text"))
                .and_then(|b| b.get("text"))
                .and_then(Value::as_str),
        }
    }
}
