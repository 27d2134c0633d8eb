//! The internal history format: one stored entry of a thread.
//!
//! This is the shape an agent loop produces (`docs/NORMALIZATION.md` § Entries), written in snake_case JSON.
//! It is stored losslessly: content blocks are kept as raw JSON values (block types Loupe does not
//! know are returned verbatim), and top-level fields it does not know are kept in `extra`.
//!
//! Claude Code's own transcript spelling is understood as written: `isMeta`, `isVirtual`,
//! `isCompactSummary`, `isApiErrorMessage`, `isVisibleInTranscriptOnly`, `compactMetadata` and
//! `snipMetadata` mean what the snake_case fields mean, and an entry whose `type` Loupe does not
//! model is kept as [`EntryKind::Other`] with its own type name. The JSON a client sent is kept
//! as [`Entry::sent`], and that text is what the store writes, so an export gives back exactly
//! what came in.

use chrono::{DateTime, Utc};
use serde::de::Error as _;
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::{Map, Value};
use utoipa::ToSchema;

/// The discriminator of an entry (`type` in JSON). The set is open: a type Loupe does not model
/// is [`EntryKind::Other`], stored as sent and never sent to a model.
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
    /// Any other type (`file-history-snapshot`, `queue-operation`, `summary`, …): stored verbatim,
    /// listed with its own type name ([`Entry::type_name`]), never sent.
    #[serde(other)]
    Other,
}

impl EntryKind {
    pub fn as_str(self) -> &'static str {
        match self {
            EntryKind::User => "user",
            EntryKind::Assistant => "assistant",
            EntryKind::Attachment => "attachment",
            EntryKind::System => "system",
            EntryKind::Progress => "progress",
            EntryKind::Other => "other",
        }
    }

    /// The kind a `type` names; any name Loupe does not model is [`EntryKind::Other`].
    pub fn from_name(name: &str) -> Self {
        match name {
            "user" => EntryKind::User,
            "assistant" => EntryKind::Assistant,
            "attachment" => EntryKind::Attachment,
            "system" => EntryKind::System,
            "progress" => EntryKind::Progress,
            _ => EntryKind::Other,
        }
    }

    pub fn is_other(&self) -> bool {
        *self == EntryKind::Other
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
    /// The provider's token counts for the response, stored as its SDK returns them: Anthropic's
    /// or the Responses API's `usage` (`input_tokens`, `output_tokens`, cache figures), Chat
    /// Completions' `usage` (`prompt_tokens`, `completion_tokens`,
    /// `prompt_tokens_details.cached_tokens`) or Gemini's `usageMetadata` (`promptTokenCount`,
    /// `candidatesTokenCount`, `cachedContentTokenCount`, `thoughtsTokenCount`,
    /// `toolUsePromptTokenCount`, or their snake_case names). The context's
    /// `context_tokens` anchors on the last one (docs/TRANSCRIPTS.md § Context tokens).
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
#[serde(from = "EntryWire")]
pub struct Entry {
    /// Position in the thread, dense from 0; assigned by the server, the entry's permanent id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(read_only)]
    pub seq: Option<i64>,
    /// Unique within the thread (and within a batch); generated when omitted. Re-sending the same
    /// uuid is idempotent. 1–200 characters, no NUL.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(min_length = 1, max_length = 200, pattern = r"^[^\u0000]*$")]
    pub uuid: Option<String>,
    /// An open string. Loupe models `user`, `assistant`, `attachment`, `system` and `progress`;
    /// any other type (`file-history-snapshot`, `queue-operation`, `summary`, …) is stored as sent,
    /// listed with its type and never sent to a model. At most 100 characters, no NUL.
    #[serde(rename = "type", skip_serializing_if = "EntryKind::is_other")]
    #[schema(value_type = String, example = "user", max_length = 100, pattern = r"^[^\u0000]*$")]
    pub kind: EntryKind,
    /// Present on `user`, `assistant` and `attachment` entries.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<ApiMessage>,
    /// Sent to the model but not shown to people (reminders, attachments, recovery nudges).
    /// Also read as `isMeta`; the same holds for each flag below and its camelCase name.
    #[serde(default, skip_serializing_if = "is_false")]
    pub is_meta: bool,
    /// Display-only; never sent to the model (`isVirtual`).
    #[serde(default, skip_serializing_if = "is_false")]
    pub is_virtual: bool,
    /// The summary written by a compaction (`isCompactSummary`).
    #[serde(default, skip_serializing_if = "is_false")]
    pub is_compact_summary: bool,
    /// A synthetic assistant entry recording an API error (its text names the error);
    /// `isApiErrorMessage`. Never sent to the model.
    #[serde(default, skip_serializing_if = "is_false")]
    pub is_api_error: bool,
    /// Shown in the transcript only (`isVisibleInTranscriptOnly`): Claude Code marks its compact
    /// summaries so. Such an entry is still sent to the model.
    #[serde(default, skip_serializing_if = "is_false")]
    pub is_visible_in_transcript_only: bool,
    /// For `system` entries: `compact_boundary`, `local_command`, `snip`, `informational`, …
    /// At most 100 characters, no NUL.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(max_length = 100, pattern = r"^[^\u0000]*$")]
    pub subtype: Option<String>,
    /// For `system` entries: their text (a `local_command` entry's output becomes user text).
    /// Any JSON value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<serde_json::Value>)]
    pub content: Option<Value>,
    /// For a `compact_boundary` entry: trigger, tokens before, messages summarized, summarizer,
    /// preserved segment (`compactMetadata` with `trigger`, `preTokens` and
    /// `preservedSegment {headUuid, anchorUuid, tailUuid}` is understood too).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub compact_metadata: Option<Value>,
    /// For a `snip` entry: the messages it hides from every later context.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snip_metadata: Option<SnipMetadata>,
    /// Set on a tombstone: an erasure took this entry's content (`POST
    /// /v1/threads/{thread_id}/erasures`). A tombstone keeps its seq, uuid, type and role, holds
    /// no content and is never sent to a model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub erased: Option<ErasedMark>,
    /// When the entry was created; set by the server when omitted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created_at: Option<DateTime<Utc>>,
    /// Fields Loupe does not model (progress `data`, transcript fields, …), kept as they came.
    /// For an [`EntryKind::Other`] entry it also holds the entry's `type`.
    #[serde(flatten)]
    #[schema(value_type = Object)]
    pub extra: Map<String, Value>,
    /// The JSON text the client sent, when the entry came from a client: the store writes this
    /// text as the entry's body, so exports give it back exactly.
    #[serde(skip)]
    pub sent: Option<String>,
}

/// The wire form of an entry: `type` as any string, and Claude Code's camelCase names.
#[derive(Deserialize)]
struct EntryWire {
    #[serde(default)]
    seq: Option<i64>,
    #[serde(default)]
    uuid: Option<String>,
    #[serde(rename = "type")]
    type_name: String,
    #[serde(default)]
    message: Option<ApiMessage>,
    #[serde(default, alias = "isMeta")]
    is_meta: bool,
    #[serde(default, alias = "isVirtual")]
    is_virtual: bool,
    #[serde(default, alias = "isCompactSummary")]
    is_compact_summary: bool,
    #[serde(default, alias = "isApiErrorMessage")]
    is_api_error: bool,
    #[serde(default, alias = "isVisibleInTranscriptOnly")]
    is_visible_in_transcript_only: bool,
    #[serde(default)]
    subtype: Option<String>,
    #[serde(default)]
    content: Option<Value>,
    #[serde(default, alias = "compactMetadata")]
    compact_metadata: Option<Value>,
    #[serde(default, alias = "snipMetadata")]
    snip_metadata: Option<SnipMetadata>,
    #[serde(default)]
    erased: Option<ErasedMark>,
    #[serde(default)]
    created_at: Option<DateTime<Utc>>,
    #[serde(flatten)]
    extra: Map<String, Value>,
}

impl From<EntryWire> for Entry {
    fn from(wire: EntryWire) -> Self {
        let kind = EntryKind::from_name(&wire.type_name);
        let mut extra = wire.extra;
        if kind == EntryKind::Other {
            extra.insert("type".to_owned(), Value::String(wire.type_name));
        }
        Entry {
            seq: wire.seq,
            uuid: wire.uuid,
            kind,
            message: wire.message,
            is_meta: wire.is_meta,
            is_virtual: wire.is_virtual,
            is_compact_summary: wire.is_compact_summary,
            is_api_error: wire.is_api_error,
            is_visible_in_transcript_only: wire.is_visible_in_transcript_only,
            subtype: wire.subtype,
            content: wire.content,
            compact_metadata: wire.compact_metadata,
            snip_metadata: wire.snip_metadata,
            erased: wire.erased,
            created_at: wire.created_at,
            extra,
            sent: None,
        }
    }
}

/// Parses entries a client sent, keeping each one's JSON as [`Entry::sent`]
/// (`#[serde(deserialize_with = "…")]` on a request's list of entries).
pub fn deserialize_sent_entries<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<Vec<Entry>, D::Error> {
    struct Sent(Entry);
    impl<'de> Deserialize<'de> for Sent {
        fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
            let value = Value::deserialize(deserializer)?;
            let mut entry = Entry::deserialize(&value).map_err(D::Error::custom)?;
            entry.sent = Some(value.to_string());
            Ok(Sent(entry))
        }
    }
    let sent = Vec::<Sent>::deserialize(deserializer)?;
    Ok(sent.into_iter().map(|Sent(entry)| entry).collect())
}

/// Whether a value is shaped like an id (a uuid, a provider response id): 1–200 characters of
/// `[A-Za-z0-9_.:-]`, room for no sentence. A tombstone keeps only such ids.
fn is_id_like(value: &Value) -> bool {
    value.as_str().is_some_and(|id| {
        (1..=200).contains(&id.len())
            && id
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b':' | b'-'))
    })
}

/// What a tombstone keeps of a compact boundary's metadata: its preserved segment, by seqs or by
/// id-shaped uuids.
fn boundary_shape(metadata: &Value) -> Value {
    let mut kept = Map::new();
    if let Some(segment) = metadata.get("preserved_segment") {
        let seq = |key: &str| segment.get(key).and_then(Value::as_i64);
        if let (Some(first), Some(last)) = (seq("first_seq"), seq("last_seq")) {
            kept.insert(
                "preserved_segment".to_owned(),
                serde_json::json!({"first_seq": first, "last_seq": last}),
            );
        }
    }
    if let Some(segment) = metadata.get("preservedSegment") {
        let ids: Map<String, Value> = ["headUuid", "anchorUuid", "tailUuid"]
            .into_iter()
            .filter_map(|key| {
                let id = segment.get(key).filter(|v| is_id_like(v))?;
                Some((key.to_owned(), id.clone()))
            })
            .collect();
        kept.insert("preservedSegment".to_owned(), Value::Object(ids));
    }
    Value::Object(kept)
}

/// What a snip entry hides.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct SnipMetadata {
    #[serde(alias = "removedUuids")]
    pub removed_uuids: Vec<String>,
}

/// What a tombstone says of the erasure that emptied it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ErasedMark {
    /// The erasure's id (its receipt in `GET /v1/threads/{thread_id}/erasures`).
    pub erasure_id: String,
    /// When the content was erased.
    pub erased_at: DateTime<Utc>,
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
            is_visible_in_transcript_only: false,
            subtype: None,
            content: None,
            compact_metadata: None,
            snip_metadata: None,
            erased: None,
            created_at: None,
            extra: Map::new(),
            sent: None,
        }
    }

    /// The entry's `type` as sent: the kind's name, or an [`EntryKind::Other`] entry's own.
    pub fn type_name(&self) -> &str {
        match self.kind {
            EntryKind::Other => self
                .extra
                .get("type")
                .and_then(Value::as_str)
                .unwrap_or("other"),
            kind => kind.as_str(),
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

    /// A tombstone left by an erasure: no content, never in a model's view.
    pub fn is_erased(&self) -> bool {
        self.erased.is_some()
    }

    /// The tombstone of this entry: its seq, uuid, type, role (with an empty content), time,
    /// and only what keeps the thread's shape, each kept only in the form it takes when it
    /// carries no text: a provider response id shaped like one (rounds stay grouped), its place
    /// in the transcript's tree (`parentUuid` as an id, `isSidechain` as a flag), and what makes
    /// a compact boundary (its preserved segment) or a snip (the uuids it hides). Everything
    /// else, content and unmodelled fields alike, goes.
    pub fn tombstone(&self, mark: ErasedMark) -> Entry {
        let mut extra = Map::new();
        if let Some(kind) = self
            .extra
            .get("type")
            .filter(|_| self.kind == EntryKind::Other)
        {
            extra.insert("type".to_owned(), kind.clone());
        }
        if let Some(parent) = self.extra.get("parentUuid").filter(|v| is_id_like(v)) {
            extra.insert("parentUuid".to_owned(), parent.clone());
        }
        if let Some(flag) = self.extra.get("isSidechain").filter(|v| v.is_boolean()) {
            extra.insert("isSidechain".to_owned(), flag.clone());
        }
        let structural = self.is_compact_boundary() || self.is_snip();
        Entry {
            seq: self.seq,
            uuid: self.uuid.clone(),
            kind: self.kind,
            message: self.message.as_ref().map(|message| ApiMessage {
                id: message
                    .id
                    .clone()
                    .filter(|id| is_id_like(&Value::String(id.clone()))),
                ..ApiMessage::new(message.role, Content::Blocks(Vec::new()))
            }),
            subtype: self.subtype.clone().filter(|_| structural),
            is_compact_summary: self.is_compact_summary,
            compact_metadata: self
                .compact_metadata
                .as_ref()
                .filter(|_| self.is_compact_boundary())
                .map(boundary_shape),
            snip_metadata: self.snip_metadata.clone().filter(|_| self.is_snip()),
            erased: Some(mark),
            created_at: self.created_at,
            extra,
            ..Entry::new(self.kind)
        }
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

    /// The `(headUuid, tailUuid)` of a Claude Code boundary's
    /// `compactMetadata.preservedSegment`: the kept range, named by uuids instead of seqs.
    pub fn preserved_uuids(&self) -> Option<(&str, &str)> {
        let seg = self.compact_metadata.as_ref()?.get("preservedSegment")?;
        let head = seg.get("headUuid")?.as_str()?;
        let tail = seg.get("tailUuid")?.as_str()?;
        Some((head, tail))
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

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn mark() -> ErasedMark {
        ErasedMark {
            erasure_id: "e-1".into(),
            erased_at: DateTime::from_timestamp(1_800_000_000, 0).unwrap(),
        }
    }

    /// Every free-form place a client can write text goes; only id-shaped structure stays.
    #[test]
    fn a_tombstone_keeps_structure_and_no_text() {
        let entries = [
            json!({"type": "user", "uuid": "u1", "parentUuid": "a secret parent",
                "isSidechain": "a secret flag", "subtype": "a secret subtype",
                "compact_metadata": {"note": "a secret note"},
                "snip_metadata": {"removed_uuids": ["a secret uuid"]},
                "toolUseResult": {"stdout": "a secret output"},
                "message": {"role": "user", "content": "a secret", "id": "msg a secret id"}}),
            json!({"type": "system", "uuid": "b1", "subtype": "compact_boundary",
                "content": "a secret boundary text",
                "compact_metadata": {"trigger": "a secret trigger",
                    "preserved_segment": {"first_seq": 1, "last_seq": 2},
                    "preservedSegment": {"headUuid": "h-1", "tailUuid": "a secret tail"}}}),
            json!({"type": "assistant", "uuid": "a1", "parentUuid": "u1", "isSidechain": true,
                "message": {"role": "assistant", "id": "msg_01abc", "model": "a secret model",
                    "content": [{"type": "text", "text": "a secret"}]}}),
        ];
        for value in entries {
            let entry: Entry = serde_json::from_value(value).unwrap();
            let tombstone = entry.tombstone(mark());
            let text = serde_json::to_string(&tombstone).unwrap();
            assert!(!text.contains("secret"), "{text}");
            assert_eq!(tombstone.kind, entry.kind);
            assert_eq!(tombstone.uuid, entry.uuid);
            assert_eq!(
                tombstone.message.as_ref().map(|m| m.role),
                entry.message.as_ref().map(|m| m.role)
            );
            assert_eq!(tombstone.is_compact_boundary(), entry.is_compact_boundary());
            assert_eq!(tombstone.preserved_segment(), entry.preserved_segment());
        }
        let assistant: Entry = serde_json::from_value(json!({"type": "assistant", "uuid": "a1",
            "parentUuid": "u1", "isSidechain": true,
            "message": {"role": "assistant", "id": "msg_01abc", "content": "x"}}))
        .unwrap();
        let tombstone = assistant.tombstone(mark());
        assert_eq!(tombstone.response_id(), Some("msg_01abc"));
        assert_eq!(tombstone.extra["parentUuid"], "u1");
        assert_eq!(tombstone.extra["isSidechain"], true);
        // A tombstone's tombstone is itself: erasing again changes nothing.
        assert_eq!(tombstone.tombstone(mark()), tombstone);
    }
}
