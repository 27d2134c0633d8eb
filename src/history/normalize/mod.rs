//! Normalization: a stored history → the `messages` array a provider accepts.
//!
//! Reproduces Claude Code's request pipeline (`docs/NORMALIZATION.md` § Pipeline: `getMessagesAfterCompactBoundary`,
//! `normalizeMessagesForAPI`, `ensureToolResultPairing`, `stripAdvisorBlocks`, `stripExcessMediaItems`,
//! `addCacheBreakpoints`) and then goes further, so the output satisfies every invariant of
//! `docs/PROVIDER-RULES.md` D1–D4 for its provider (Anthropic, OpenAI Chat Completions, OpenAI
//! Responses, Gemini) for *any* input.
//!
//! # Pipeline, in order
//! The passes run in [`pipeline::run`], each ended by the run's [`pipeline::Seam`]; rendering is
//! [`pipeline::render`]. A read that goes on from a checkpoint of the window's prefix runs the
//! same passes over the entries after the checkpoint only ([`incremental`], `docs/NORMALIZATION.md`
//! § Incremental reads).
//! 1. [`view::slice_after_boundary`] (a): the last compact boundary and what follows it; Loupe's
//!    `preserved_segment {first_seq, last_seq}` re-inserts the kept range after the summaries.
//! 2. [`view::hide_snipped`] (b): every `snip` entry of the input hides its `removed_uuids`;
//!    [`view::hide_erased`] (b') hides tombstones.
//! 3. [`view::reorder_attachments`] (c): `reorderAttachmentsForAPI`.
//! 4. [`view::drop_virtual`] (d).
//! 5. [`media::build_strip_map`] (e): media-error → target message map (interactive and `-p` texts).
//! 6. [`convert::to_messages`] (e, f): drop progress/system/API-error entries, `local_command` → user
//!    text, strip the media named by API errors; Loupe block hygiene (non-object blocks, unknown /
//!    unsupported block types, blocks in the wrong role, unsigned/malformed thinking, reasoning in
//!    `strip` mode / for another provider or model, non-object `tool_use.input`).
//! 7. [`tool_reference::strip_tool_references`] (g).
//! 8. [`merge::merge_messages`] (h): same-id fragment merge across interleaved tool results (indexed
//!    by message id, linear) and `mergeUserMessages` (`joinTextAtSeam`, tool results hoisted).
//! 9. Cleanup (i), [`cleanup`]: `filterOrphanedThinkingOnlyMessages`, whitespace-only assistants,
//!    empty/whitespace text blocks, trailing thinking, adjacent users merged,
//!    `ensureNonEmptyAssistantContent`, `sanitizeErrorToolResultContent`.
//! 10. [`pairing::ensure_tool_result_pairing`] (j).
//! 11. [`advisor::strip_advisor_blocks`] (k, unless `advisor`); media:
//!     [`media::refuse_unacceptable`] (Loupe: media type, magic bytes, 5 MB of base64, 8000 px),
//!     [`media::strip_excess_media`] (l), then the request-wide limits (Loupe):
//!     [`media::refuse_large_images_of_many`] (2000 px beyond 20 images) and
//!     [`media::refuse_oldest_until_fits`] (32 MB in all).
//! 12. [`enforce::run`] (Loupe): id sanitizing, empty error results, trailing thinking, empty
//!     turns, first turn `user`, strict alternation; then, with `thinking=enabled` (Anthropic),
//!     [`thinking::close_loop_after`].
//! 13. Optional tool-result rewrites, on the final shape (results are found by the final, already
//!     paired ids): [`clearing::clear_old_results`] (reversible: old results become stubs naming
//!     their zoom address, in batches), then [`microcompact::microcompact`] (last, so a
//!     placeholder written by an earlier step is never cleared only on a second pass).
//! 14. Rendering, over the shared working shape: [`cache::add_cache_breakpoint`] (m) and
//!     [`output::to_anthropic`] (n), [`output::to_openai`] (Chat Completions),
//!     [`responses::to_responses`] (Responses `input` items) or [`gemini::unsigned_contents`]
//!     (`contents`, whose current turn [`normalize`] then signs: [`gemini::sign_current_turn`]).
//!     The renderers share [`render_shared`]; each holds its own inverse, which
//!     [`entries_from_messages`] picks by provider.
//!
//! Provider-specific reasoning lives in the stored assistant content: Anthropic `thinking` /
//! `redacted_thinking` blocks, OpenAI Responses `reasoning` items stored as blocks of type
//! `reasoning` (`{type, id, summary, encrypted_content}`), and Gemini thought signatures stored as
//! a `thought_signature` field of the text or `tool_use` block they came on. Each reaches only its
//! own provider (dropped silently for the others, like any foreign reasoning); with `model`, those
//! written by another model are dropped and reported (`foreign_thinking_dropped`).
//!
//! # Where Loupe goes beyond the reference
//! - Whitespace-only text blocks are removed everywhere (not only whitespace-only assistants), and
//!   trailing thinking is removed from *every* assistant turn, not only the last one. The text
//!   cleanup runs before the trailing-thinking pass so `[thinking, " "]` cannot end in thinking.
//! - The final assistant turn is never left empty: the list is what precedes the caller's next user
//!   turn, so it is not final in the request.
//! - Unsigned or malformed `thinking`/`redacted_thinking` are dropped (`keep` mode); `strip` drops all.
//! - Blocks that are not JSON objects with a string `type`, user-only blocks in assistant turns and
//!   assistant-only blocks in user turns are dropped; a non-object `tool_use.input` is repaired.
//! - Block types the provider does not accept (unknown / future types such as `future_block`, and
//!   the beta types `compaction`, `fallback`, `tool_addition`, `tool_removal`) are dropped for every
//!   provider (`unsupported_block_dropped`, naming the entry); storage keeps them verbatim.
//! - Orphan server-tool results (`*_tool_result` without an earlier `server_tool_use`) are removed.
//! - Tool ids are rewritten deterministically and consistently on both sides when they do not match
//!   the provider's pattern (`^[a-zA-Z0-9_-]+$`; `^srvtoolu_…` for server tools; ≤ 40 chars on OpenAI).
//! - The first turn is always `user` (a `(no content)` user turn is prepended and reported), turns
//!   strictly alternate (a `(no content)` user turn separates two assistant turns), and no turn is
//!   empty. `is_error` tool results never have empty content.
//! - Media errors also strip the media of a non-meta user prompt (the reference only strips meta
//!   messages, so a pasted oversized image would be re-sent and rejected forever).
//! - Assistant entries without `message.id` never merge with each other.
//!
//! An empty input (or one with nothing model-visible) gives an empty `messages` list: the caller
//! adds its user turn. When the list ends with a user turn the caller must merge its next user
//! content into that turn (after its `tool_result` blocks) rather than append a second user turn.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;

use super::model::{Entry, Role};

pub mod advisor;
pub mod blocks;
pub mod cache;
pub mod cleanup;
pub mod clearing;
pub mod convert;
pub mod enforce;
pub mod estimate;
pub mod gemini;
pub mod ids;
pub mod image;
pub mod incremental;
pub mod media;
pub mod merge;
pub mod microcompact;
pub mod native;
pub mod output;
pub mod pairing;
pub mod pipeline;
pub mod render_shared;
pub mod render_text;
pub mod responses;
pub mod thinking;
pub mod tokens;
pub mod tool_reference;
pub mod view;

pub use estimate::{
    context_entry_tokens, estimate_context, ContextEstimate, EstimateBasis, Estimator,
    LearnedOverheads, Overhead,
};
pub use tokens::{estimate_entry_tokens, estimate_tokens, text_tokens, usage_tokens};

/// The provider whose message format is produced.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema, Default)]
#[serde(rename_all = "snake_case")]
pub enum Provider {
    /// Anthropic Messages API: `{role, content}` messages.
    #[default]
    Anthropic,
    /// OpenAI Chat Completions: user / assistant (`tool_calls`) / tool messages.
    Openai,
    /// OpenAI Responses: the `input` item list (`message`, `function_call`,
    /// `function_call_output`, `reasoning`).
    OpenaiResponses,
    /// Gemini generateContent: the `contents` list (`user` / `model` turns of `parts`).
    Gemini,
}

/// What to do with `thinking` / `redacted_thinking` blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema, Default)]
#[serde(rename_all = "snake_case")]
pub enum ThinkingMode {
    /// Replay signed blocks verbatim; drop unsigned or malformed ones.
    #[default]
    Keep,
    /// Drop every thinking and redacted_thinking block (and OpenAI reasoning items and Gemini
    /// thought signatures).
    Strip,
    /// As `keep`, for a request sent with manual thinking (`thinking.type: "enabled"`, Anthropic):
    /// a tool loop in progress must have been opened by an assistant turn starting with thinking.
    /// When it was not, the loop is closed (see [`thinking::close_loop_without_thinking`]).
    Enabled,
}

/// Options of [`normalize`]. Every field changes the output, so the whole value is what a cached
/// normalization is keyed by (`incremental`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct NormalizeOptions {
    pub provider: Provider,
    /// Tools available to the model: `None` = every tool; `Some(list)` = only those (references to
    /// other tools in `tool_reference` blocks are stripped).
    pub tools: Option<Vec<String>>,
    pub thinking: ThinkingMode,
    /// The model the request goes to. Thinking, OpenAI reasoning items and Gemini thought
    /// signatures written by another model (the stored entry's `message.model`) are dropped.
    /// `None`: every model's are kept.
    pub model: Option<String>,
    /// Put one `cache_control: {"type":"ephemeral"}` on the last block of the last message
    /// (Anthropic only).
    pub cache: bool,
    /// The advisor beta is available; when false, advisor blocks are stripped.
    pub advisor: bool,
    pub microcompact: Option<MicrocompactOptions>,
    /// Reversible clearing of old tool results ([`clearing`]).
    pub clearing: Option<ClearingOptions>,
}

pub use clearing::ClearingOptions;

/// Client-side micro-compaction of old tool results (`docs/NORMALIZATION.md` § Micro-compaction; by count here).
///
/// Results of `tools` older than the last `keep_recent` compactable tool calls, whose content is at
/// least `min_bytes` long, get their content replaced by
/// `[Old tool result content cleared: <tool>, <bytes> bytes]` (`tool_use_id` and `is_error` kept).
/// The size of a result is the byte length of its string content, or for array content the sum of
/// its text lengths plus the JSON length of its other blocks.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct MicrocompactOptions {
    /// Compactable tool names.
    pub tools: Vec<String>,
    /// How many of the most recent compactable tool calls keep their results.
    pub keep_recent: usize,
    /// Results shorter than this are left alone.
    pub min_bytes: usize,
}

impl Default for MicrocompactOptions {
    /// The reference's `COMPACTABLE_TOOLS` (Read, Bash, PowerShell, Grep, Glob, WebSearch,
    /// WebFetch, Edit, Write), `keep_recent` 5 (the reference's `keepRecent` default) and
    /// `min_bytes` 2000 (Loupe's choice: smaller results are not worth a cache miss).
    fn default() -> Self {
        MicrocompactOptions {
            tools: [
                "Read",
                "Bash",
                "PowerShell",
                "Grep",
                "Glob",
                "WebSearch",
                "WebFetch",
                "Edit",
                "Write",
            ]
            .iter()
            .map(|s| s.to_string())
            .collect(),
            keep_recent: 5,
            min_bytes: 2000,
        }
    }
}

/// What a repair did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum RepairKind {
    /// An attachment was moved up before the prompt it belongs to (`reorderAttachmentsForAPI`).
    AttachmentMoved,
    /// Media blocks named by a synthetic API error (PDF/image too large, …) were removed.
    MediaStripped,
    /// A message emptied by a repair (or stored empty) was dropped.
    EmptyMessageDropped,
    /// A block that is not an object with a string `type` was dropped.
    InvalidBlockDropped,
    /// A block of the other role (e.g. `tool_result` in an assistant turn) was dropped.
    MisplacedBlockDropped,
    /// An unsigned or malformed thinking / redacted_thinking block was dropped.
    InvalidThinkingDropped,
    /// A `tool_use.input` that was not a JSON object was replaced (parsed, or `{}`).
    InvalidToolInputRepaired,
    /// `tool_reference` blocks to unavailable tools were removed from a tool result.
    ToolReferenceStripped,
    /// Streamed fragments of one response (same message id) were merged into one turn.
    FragmentsMerged,
    /// Consecutive user messages were merged into one turn.
    UserMessagesMerged,
    /// `tool_result` blocks were moved before the other blocks of their user turn.
    ToolResultHoisted,
    /// A thinking-only assistant fragment with no non-thinking sibling was dropped.
    ThinkingOnlyDropped,
    /// Thinking blocks at the end of an assistant turn were removed.
    TrailingThinkingRemoved,
    /// An assistant made only of whitespace text was dropped.
    WhitespaceAssistantDropped,
    /// Empty or whitespace-only text blocks were removed.
    EmptyTextRemoved,
    /// An emptied turn or tool result got placeholder content.
    PlaceholderContent,
    /// An `is_error` tool result with non-text content was reduced to its text.
    ErrorToolResultSanitized,
    /// A `tool_result` was synthesized for a `tool_use` without one.
    SyntheticToolResult,
    /// A `tool_result` without a matching `tool_use` in the previous turn was removed.
    OrphanToolResultRemoved,
    /// A second `tool_result` for the same id was removed.
    DuplicateToolResultRemoved,
    /// A `tool_use` whose id was already used earlier was removed.
    DuplicateToolUseRemoved,
    /// A `server_tool_use` / `mcp_tool_use` without its result in the same turn was removed.
    ServerToolUseRemoved,
    /// A server tool result without its `server_tool_use` earlier in the turn was removed.
    OrphanServerResultRemoved,
    /// An old tool result's content was cleared (micro-compaction).
    Microcompacted,
    /// An old tool result was sent as a stub naming its size and the zoom address of the stored
    /// message (`zoom <seq>+1`), which reads it whole (reversible clearing).
    ToolResultCleared,
    /// Advisor blocks were removed (advisor not available).
    AdvisorStripped,
    /// The oldest media were removed to stay within 100 per request.
    MediaCapped,
    /// A tool id was rewritten to the provider's pattern (both sides of the pair).
    ToolIdRewritten,
    /// A tool name was rewritten to `^[a-zA-Z0-9_-]+$` (OpenAI).
    ToolNameRewritten,
    /// A `(no content)` user turn was prepended because the history starts with an assistant.
    LeadingUserInserted,
    /// A `(no content)` user turn was inserted between two assistant turns.
    PlaceholderTurnInserted,
    /// A block the target API has no form for was sent as the text a model reads in its place
    /// (a server tool call and its result, an MCP call, a document's title and text, media the
    /// target cannot fetch): what it says is kept, its shape is not. Encrypted fields and
    /// signatures stay out.
    BlockRenderedAsText,
    /// A block the provider does not accept was dropped: an unknown or unhandled beta block type
    /// (both providers), or a block with no Chat Completions equivalent (OpenAI conversion).
    UnsupportedBlockDropped,
    /// A thinking / redacted_thinking block, an OpenAI reasoning item or a Gemini thought
    /// signature written by another model than the request's `model` was dropped.
    ForeignThinkingDropped,
    /// An image or document the provider refuses (media type, magic bytes, size, pixels, the
    /// request's total size) was replaced by a short text placeholder naming the reason.
    MediaRefused,
    /// With `thinking=enabled`, the tool loop in progress was opened without thinking: a text
    /// block after its last tool results closes it, so the next response starts a new turn.
    ThinkingLoopClosed,
    /// An OpenAI reasoning item not immediately followed by the item it produced was dropped.
    ReasoningDropped,
    /// An entry an erasure emptied (a tombstone) was left out; a `tool_use` or `tool_result` it
    /// held is repaired as a missing one is.
    Erased,
}

/// One repair applied to the history, naming the stored entries involved.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Repair {
    pub kind: RepairKind,
    /// `seq` of the stored entries involved (their index when they have none), ascending.
    pub seqs: Vec<i64>,
    /// `uuid` of the stored entries involved, when they have one (same order as `seqs`).
    pub uuids: Vec<String>,
    /// Human-readable detail, e.g. "synthetic result for tool_use toolu_X".
    pub detail: String,
}

/// The result of [`normalize`].
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct Normalized {
    /// The provider messages (what precedes the caller's next user turn): Anthropic `messages`,
    /// Chat Completions `messages`, the Responses `input` items, or the Gemini `contents`, ready
    /// to send as they are.
    #[schema(value_type = Vec<Object>)]
    pub messages: Vec<Value>,
    pub repairs: Vec<Repair>,
    /// `seq` of the compact boundary the view starts at.
    pub boundary: Option<i64>,
    /// [`estimate_tokens`] of `messages`.
    pub estimated_tokens: u64,
}

/// A content block with the index (in the input slice) of the entry it came from.
#[derive(Debug, Clone, PartialEq)]
pub struct Block {
    pub v: Value,
    pub src: u32,
}

/// The working form of a message during normalization.
#[derive(Debug, Clone, PartialEq)]
pub struct Msg {
    pub role: Role,
    pub blocks: Vec<Block>,
    /// Provider response id (assistant), used for fragment merging.
    pub id: Option<String>,
    pub is_meta: bool,
    /// Indices of the entries this message was built from (first = primary).
    pub srcs: Vec<u32>,
}

impl Msg {
    pub fn new(role: Role, blocks: Vec<Block>, src: u32) -> Msg {
        Msg {
            role,
            blocks,
            id: None,
            is_meta: false,
            srcs: vec![src],
        }
    }

    /// A synthetic text-only message attributed to `src`.
    pub fn text(role: Role, text: &str, src: u32) -> Msg {
        Msg::new(
            role,
            vec![Block {
                v: blocks::text_block(text),
                src,
            }],
            src,
        )
    }

    pub fn is_user(&self) -> bool {
        self.role == Role::User
    }

    pub fn is_assistant(&self) -> bool {
        self.role == Role::Assistant
    }

    pub fn has_tool_result(&self) -> bool {
        self.blocks
            .iter()
            .any(|b| blocks::is_type(&b.v, "tool_result"))
    }

    pub fn primary_src(&self) -> u32 {
        self.srcs.first().copied().unwrap_or(0)
    }
}

/// Repair collector; resolves entry indices to seqs/uuids.
pub struct Ctx<'a> {
    pub entries: &'a [Entry],
    pub repairs: Vec<Repair>,
    /// Where each pass's repairs end in `repairs` ([`Ctx::end_stage`]). Repairs are reported pass
    /// by pass, so a run resumed after a checkpoint (`incremental`) interleaves the prefix's
    /// repairs with its own stage by stage.
    pub stage_ends: Vec<usize>,
}

impl<'a> Ctx<'a> {
    pub fn new(entries: &'a [Entry]) -> Ctx<'a> {
        Ctx {
            entries,
            repairs: Vec::new(),
            stage_ends: Vec::new(),
        }
    }

    /// Closes the current pass: the repairs reported since the last call form its stage.
    pub fn end_stage(&mut self) {
        self.stage_ends.push(self.repairs.len());
    }

    /// Records a repair involving the entries at `srcs` (indices into the input slice).
    pub fn report<I: IntoIterator<Item = u32>>(
        &mut self,
        kind: RepairKind,
        srcs: I,
        detail: String,
    ) {
        self.report_after(kind, None, srcs, detail);
    }

    /// As [`Ctx::report`], also naming an `earlier` entry (`seq`, `uuid`) that lies before the
    /// input slice: an entry of a checkpointed prefix, which a resumed run no longer holds.
    pub fn report_after<I: IntoIterator<Item = u32>>(
        &mut self,
        kind: RepairKind,
        earlier: Option<(i64, Option<&str>)>,
        srcs: I,
        detail: String,
    ) {
        let mut idx: Vec<u32> = srcs.into_iter().collect();
        idx.sort_unstable();
        idx.dedup();
        let mut seqs = Vec::with_capacity(idx.len() + 1);
        let mut uuids = Vec::new();
        if let Some((seq, uuid)) = earlier {
            seqs.push(seq);
            uuids.extend(uuid.map(str::to_owned));
        }
        for i in idx {
            if let Some(e) = self.entries.get(i as usize) {
                seqs.push(e.seq_or(i as usize));
                if let Some(u) = &e.uuid {
                    uuids.push(u.clone());
                }
            }
        }
        self.repairs.push(Repair {
            kind,
            seqs,
            uuids,
            detail,
        });
    }
}

/// Why a run resumed after a checkpoint cannot go on: something after the checkpoint could change
/// what the checkpoint holds, so the read normalizes the whole window instead (`incremental`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fallback(pub &'static str);

/// What runs after every pass of the pipeline ([`pipeline::run`]): it closes the pass's stage of
/// repairs and, in a run resumed after a checkpoint, checks that the pass could not have reached
/// across into the prefix ([`incremental`]).
pub trait PassEnd {
    fn pass_done(&mut self, msgs: &[Msg], ctx: &mut Ctx) -> Result<(), Fallback>;
}

/// The end of a pass of a plain run: only the stage is closed.
pub struct NoSeam;

impl PassEnd for NoSeam {
    fn pass_done(&mut self, _msgs: &[Msg], ctx: &mut Ctx) -> Result<(), Fallback> {
        ctx.end_stage();
        Ok(())
    }
}

/// Turns a normalized output back into entries (for idempotence checks: normalizing the result
/// again gives the same messages). Each assistant turn gets a distinct synthetic message id
/// (`msg_loupe_<i>`) so no merging happens across turns; `seq` is the message index. Each
/// provider's renderer holds its inverse: [`output::entries_from_chat`] (Anthropic, Chat
/// Completions), [`responses::entries_from_items`] and [`gemini::entries_from_contents`].
pub fn entries_from_messages(messages: &[Value], provider: Provider) -> Vec<Entry> {
    match provider {
        Provider::Anthropic | Provider::Openai => output::entries_from_chat(messages, provider),
        Provider::OpenaiResponses => responses::entries_from_items(messages),
        Provider::Gemini => gemini::entries_from_contents(messages),
    }
}

/// Normalizes a stored history into the provider's message list. See the module docs for the
/// pipeline. Deterministic; never fails; the output satisfies `docs/PROVIDER-RULES.md` D1 / D2 once the
/// caller adds its next user turn (merged into a trailing user turn, if any).
///
/// An empty history, or one with nothing model-visible, gives `messages: []` (the caller's user
/// turn is then the whole request). `repairs` lists every change to stored user/assistant content
/// in pipeline order; routine reductions (dropping progress/system entries, virtual and snipped
/// messages, API-error records, reduction to `{role, content}`) are not reported.
pub fn normalize(entries: &[Entry], opts: &NormalizeOptions) -> Normalized {
    let mut ctx = Ctx::new(entries);
    let mut seam = incremental::CheckpointSeam::start();
    let (msgs, boundary) = pipeline::run(entries, opts, &mut seam, &mut ctx)
        .expect("a run from the start of the view never falls back");
    let mut messages = pipeline::render(msgs, opts, true, &mut ctx);
    if opts.provider == Provider::Gemini {
        gemini::sign_current_turn(&mut messages);
    }
    let estimated_tokens = estimate_tokens(&messages);
    Normalized {
        messages,
        repairs: ctx.repairs,
        boundary,
        estimated_tokens,
    }
}

#[cfg(test)]
pub(crate) mod testutil {
    use super::*;
    use serde_json::json;

    /// A real 1×1 PNG, base64.
    pub const PNG: &str = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg==";

    pub fn entry(v: Value) -> Entry {
        serde_json::from_value(v).expect("valid entry")
    }

    /// The provider's messages, read back into entries and normalized again, come out the same.
    pub fn assert_round_trips(n: &Normalized, opts: &NormalizeOptions) {
        let again = normalize(&entries_from_messages(&n.messages, opts.provider), opts);
        assert_eq!(again.messages, n.messages);
    }

    /// The providers other than Anthropic, whose blocks the history stores.
    pub const OTHER_PROVIDERS: [Provider; 3] = [
        Provider::Openai,
        Provider::OpenaiResponses,
        Provider::Gemini,
    ];

    /// `entries` normalized for `provider` with default options.
    pub fn normalize_for(entries: &[Entry], provider: Provider) -> Normalized {
        normalize(
            entries,
            &NormalizeOptions {
                provider,
                ..Default::default()
            },
        )
    }

    /// The messages sent, as one JSON string to search.
    pub fn sent_json(n: &Normalized) -> String {
        serde_json::to_string(&n.messages).unwrap()
    }

    pub fn user(seq: i64, content: Value) -> Entry {
        entry(
            json!({"seq": seq, "uuid": format!("u{seq}"), "type": "user",
            "message": {"role": "user", "content": content}}),
        )
    }

    pub fn meta_user(seq: i64, content: Value) -> Entry {
        let mut e = user(seq, content);
        e.is_meta = true;
        e
    }

    pub fn asst(seq: i64, id: &str, content: Value) -> Entry {
        entry(
            json!({"seq": seq, "uuid": format!("u{seq}"), "type": "assistant",
            "message": {"role": "assistant", "id": id, "content": content}}),
        )
    }

    pub fn attachment(seq: i64, content: Value) -> Entry {
        entry(
            json!({"seq": seq, "uuid": format!("u{seq}"), "type": "attachment",
            "message": {"role": "user", "content": content}}),
        )
    }

    pub fn system(seq: i64, subtype: &str, content: Value) -> Entry {
        entry(
            json!({"seq": seq, "uuid": format!("u{seq}"), "type": "system",
            "subtype": subtype, "content": content}),
        )
    }

    pub fn tu(id: &str) -> Value {
        json!({"type": "tool_use", "id": id, "name": "Bash", "input": {"command": "ls"}})
    }

    pub fn tr(id: &str) -> Value {
        json!({"type": "tool_result", "tool_use_id": id, "content": "ok"})
    }

    pub fn text(t: &str) -> Value {
        json!({"type": "text", "text": t})
    }

    pub fn thinking(t: &str) -> Value {
        json!({"type": "thinking", "thinking": t, "signature": "sig"})
    }

    /// Entries → working messages (steps a–f with default options).
    pub fn msgs(entries: &[Entry]) -> Vec<Msg> {
        let mut ctx = Ctx::new(entries);
        let idx: Vec<usize> = (0..entries.len()).collect();
        convert::to_messages(
            entries,
            &idx,
            &Default::default(),
            &NormalizeOptions::default(),
            &mut ctx,
        )
    }

    /// The block values of each message.
    pub fn shape(msgs: &[Msg]) -> Vec<(Role, Vec<Value>)> {
        msgs.iter()
            .map(|m| (m.role, m.blocks.iter().map(|b| b.v.clone()).collect()))
            .collect()
    }

    pub fn kinds(ctx: &Ctx) -> Vec<RepairKind> {
        ctx.repairs.iter().map(|r| r.kind).collect()
    }

    pub fn anth(entries: &[Entry]) -> Normalized {
        normalize(entries, &NormalizeOptions::default())
    }
}

#[cfg(test)]
mod pipeline_tests {
    use super::blocks::{NO_CONTENT, SYNTHETIC_TOOL_RESULT};
    use super::testutil::*;
    use super::*;
    use serde_json::json;

    fn msg(role: &str, content: Value) -> Value {
        json!({"role": role, "content": content})
    }

    #[test]
    fn reference_split_fragment_example() {
        let e = vec![
            user(0, json!("go")),
            asst(1, "X", json!([tu("tu_A")])),
            user(2, json!([tr("tu_A")])),
            asst(3, "X", json!([tu("tu_B")])),
            user(4, json!([tr("tu_B")])),
        ];
        let n = anth(&e);
        assert_eq!(
            n.messages,
            vec![
                msg("user", json!([text("go")])),
                msg("assistant", json!([tu("tu_A"), tu("tu_B")])),
                msg("user", json!([tr("tu_A"), tr("tu_B")])),
            ]
        );
        let k: Vec<RepairKind> = n.repairs.iter().map(|r| r.kind).collect();
        assert_eq!(
            k,
            vec![RepairKind::FragmentsMerged, RepairKind::UserMessagesMerged]
        );
        assert_eq!(n.repairs[0].uuids, vec!["u1".to_string(), "u3".to_string()]);
    }

    #[test]
    fn reference_attachment_example_puts_attachment_before_prompt() {
        let e = vec![
            user(0, json!("q")),
            asst(1, "A", json!([text("a")])),
            user(2, json!("prompt")),
            attachment(3, json!([text("<system-reminder>X</system-reminder>")])),
        ];
        let n = anth(&e);
        assert_eq!(
            n.messages[2],
            msg(
                "user",
                json!([
                    text("<system-reminder>X</system-reminder>\n"),
                    text("prompt")
                ])
            )
        );
        assert!(n
            .repairs
            .iter()
            .any(|r| r.kind == RepairKind::AttachmentMoved && r.seqs == vec![3]));
    }

    #[test]
    fn crash_mid_tool_call_gets_synthetic_result() {
        let e = vec![
            user(0, json!("run it")),
            asst(1, "X", json!([text("ok"), tu("toolu_1")])),
        ];
        let n = anth(&e);
        assert_eq!(n.messages.len(), 3);
        assert_eq!(
            n.messages[2],
            msg(
                "user",
                json!([{"type": "tool_result", "tool_use_id": "toolu_1", "content": SYNTHETIC_TOOL_RESULT, "is_error": true}])
            )
        );
        assert_eq!(n.repairs[0].kind, RepairKind::SyntheticToolResult);
        assert_eq!(n.repairs[0].seqs, vec![1]);
    }

    #[test]
    fn media_error_strips_the_named_document_and_error_is_not_sent() {
        let pdf = json!({"type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": "JVBE"}});
        let mut err = asst(2, "e", json!([text("PDF too large (max 100 pages, 20MB). Try reading the file a different way (e.g., extract text with pdftotext).")]));
        err.is_api_error = true;
        let e = vec![
            user(0, json!("read it")),
            meta_user(1, json!([pdf, text("doc.pdf")])),
            err,
            user(3, json!("then?")),
        ];
        let n = anth(&e);
        assert_eq!(
            n.messages,
            vec![msg(
                "user",
                json!([text("read it\n"), text("doc.pdf\n"), text("then?")])
            )]
        );
        assert!(n
            .repairs
            .iter()
            .any(|r| r.kind == RepairKind::MediaStripped && r.seqs == vec![1]));
    }

    #[test]
    fn boundary_summary_preserved_segment_and_snip() {
        let mut b = system(4, "compact_boundary", json!("Conversation compacted"));
        b.compact_metadata =
            Some(json!({"trigger": "auto", "preserved_segment": {"first_seq": 2, "last_seq": 3}}));
        let mut s = user(5, json!("Summary: earlier"));
        s.is_compact_summary = true;
        let mut snip = system(7, "snip", json!(null));
        snip.snip_metadata = Some(crate::history::SnipMetadata {
            removed_uuids: vec!["u6".into()],
        });
        let e = vec![
            user(0, json!("old")),
            asst(1, "O", json!([text("old answer")])),
            user(2, json!("kept q")),
            asst(3, "K", json!([text("kept a")])),
            b,
            s,
            user(6, json!("snipped")),
            snip,
            user(8, json!("new q")),
        ];
        let n = anth(&e);
        assert_eq!(n.boundary, Some(4));
        assert_eq!(
            n.messages,
            vec![
                msg("user", json!([text("Summary: earlier\n"), text("kept q")])),
                msg("assistant", json!([text("kept a")])),
                msg("user", json!([text("new q")])),
            ]
        );
    }

    #[test]
    fn thinking_keep_and_strip() {
        let e = vec![
            user(0, json!("q")),
            asst(
                1,
                "X",
                json!([thinking("t"), {"type": "thinking", "thinking": "u"}, text("a")]),
            ),
        ];
        let keep = anth(&e);
        assert_eq!(
            keep.messages[1],
            msg("assistant", json!([thinking("t"), text("a")]))
        );
        assert!(keep
            .repairs
            .iter()
            .any(|r| r.kind == RepairKind::InvalidThinkingDropped));
        let strip = normalize(
            &e,
            &NormalizeOptions {
                thinking: ThinkingMode::Strip,
                ..Default::default()
            },
        );
        assert_eq!(strip.messages[1], msg("assistant", json!([text("a")])));
        assert!(strip.repairs.is_empty());
    }

    #[test]
    fn cache_marker_on_last_block_of_string_content() {
        let e = vec![user(0, json!("hello"))];
        let n = normalize(
            &e,
            &NormalizeOptions {
                cache: true,
                ..Default::default()
            },
        );
        assert_eq!(
            n.messages,
            vec![msg(
                "user",
                json!([{"type": "text", "text": "hello", "cache_control": {"type": "ephemeral"}}])
            )]
        );
    }

    #[test]
    fn tool_reference_option_and_advisor_option() {
        let e = vec![
            user(0, json!("q")),
            asst(
                1,
                "X",
                json!([
                    {"type": "server_tool_use", "id": "srvtoolu_1", "name": "advisor", "input": {}},
                    {"type": "advisor_tool_result", "tool_use_id": "srvtoolu_1", "content": {}},
                    tu("ts")
                ]),
            ),
            user(
                2,
                json!([{"type": "tool_result", "tool_use_id": "ts", "content": [{"type": "tool_reference", "tool_name": "Gone"}]}]),
            ),
        ];
        let n = normalize(
            &e,
            &NormalizeOptions {
                tools: Some(vec!["Bash".into()]),
                ..Default::default()
            },
        );
        assert_eq!(n.messages[1], msg("assistant", json!([tu("ts")])));
        assert_eq!(
            n.messages[2]["content"][0]["content"],
            json!([text(blocks::TOOL_REFERENCES_REMOVED)])
        );
        let with_advisor = normalize(
            &e,
            &NormalizeOptions {
                advisor: true,
                ..Default::default()
            },
        );
        assert_eq!(
            with_advisor.messages[1]["content"]
                .as_array()
                .unwrap()
                .len(),
            3
        );
        assert!(with_advisor.repairs.is_empty());
    }

    #[test]
    fn microcompact_option() {
        let big = "x".repeat(2500);
        let mut e = vec![user(0, json!("q"))];
        for i in 0..7 {
            let id = format!("t{i}");
            e.push(asst(
                1 + 2 * i,
                &format!("m{i}"),
                json!([{"type": "tool_use", "id": id, "name": "Read", "input": {}}]),
            ));
            e.push(user(
                2 + 2 * i,
                json!([{"type": "tool_result", "tool_use_id": id, "content": big}]),
            ));
        }
        let n = normalize(
            &e,
            &NormalizeOptions {
                microcompact: Some(MicrocompactOptions::default()),
                ..Default::default()
            },
        );
        let cleared: Vec<&Repair> = n
            .repairs
            .iter()
            .filter(|r| r.kind == RepairKind::Microcompacted)
            .collect();
        assert_eq!(cleared.len(), 2);
        assert_eq!(
            n.messages[2]["content"][0]["content"],
            json!("[Old tool result content cleared: Read, 2500 bytes]")
        );
        assert_eq!(n.messages[14]["content"][0]["content"], json!(big));
    }

    #[test]
    fn only_invisible_entries_give_empty_list_and_user_only_is_kept() {
        let e = vec![
            system(0, "informational", json!("x")),
            entry(json!({"seq": 1, "type": "progress"})),
        ];
        assert!(anth(&e).messages.is_empty());
        let e2 = vec![user(0, json!("pending prompt"))];
        assert_eq!(
            anth(&e2).messages,
            vec![msg("user", json!([text("pending prompt")]))]
        );
    }

    #[test]
    fn assistant_first_history_and_final_empty_assistant() {
        let e = vec![
            asst(0, "X", json!([text("hello")])),
            user(1, json!("hi")),
            asst(2, "Y", json!([])),
        ];
        let n = anth(&e);
        assert_eq!(n.messages[0], msg("user", json!([text(NO_CONTENT)])));
        assert_eq!(n.messages[3], msg("assistant", json!([text(NO_CONTENT)])));
        let k: Vec<RepairKind> = n.repairs.iter().map(|r| r.kind).collect();
        assert_eq!(
            k,
            vec![
                RepairKind::PlaceholderContent,
                RepairKind::LeadingUserInserted
            ]
        );
    }

    #[test]
    fn accepted_blocks_pass_through_verbatim_unknown_ones_are_dropped() {
        let odd = json!({"type": "container_upload", "file_id": "f1", "extra": [1, 2]});
        let e = vec![
            user(0, json!([text("q"), {"type": "future_block", "x": 1}])),
            asst(1, "X", json!([odd.clone(), text("a")])),
        ];
        let n = anth(&e);
        assert_eq!(n.messages[0], msg("user", json!([text("q")])));
        assert_eq!(n.messages[1], msg("assistant", json!([odd, text("a")])));
        assert_eq!(n.repairs.len(), 1);
        assert_eq!(n.repairs[0].kind, RepairKind::UnsupportedBlockDropped);
        assert_eq!(n.repairs[0].seqs, vec![0]);
    }

    #[test]
    fn estimated_tokens_and_determinism() {
        let e = vec![
            user(0, json!("abcdefgh")),
            asst(1, "X", json!([text("abcd")])),
        ];
        let a = anth(&e);
        assert_eq!(a.estimated_tokens, 3);
        let b = anth(&e);
        assert_eq!(a.messages, b.messages);
        assert_eq!(a.repairs, b.repairs);
    }

    #[test]
    fn idempotent_on_messy_example_both_providers() {
        let e = vec![
            asst(
                0,
                "X",
                json!([thinking("t"), {"type": "tool_use", "id": "functions.Bash:0", "name": "Bash", "input": "[1]"}]),
            ),
            user(
                1,
                json!([
                    text(" "),
                    tr("functions.Bash:0"),
                    tr("zzz"),
                    tr("functions.Bash:0")
                ]),
            ),
            attachment(2, json!([text("att")])),
            asst(3, "Y", json!([text("  ")])),
            asst(4, "Z", json!([text("done"), thinking("t2")])),
        ];
        for provider in [Provider::Anthropic, Provider::Openai] {
            let opts = NormalizeOptions {
                provider,
                cache: true,
                ..Default::default()
            };
            let first = normalize(&e, &opts);
            let again = normalize(&entries_from_messages(&first.messages, provider), &opts);
            assert_eq!(first.messages, again.messages);
        }
    }

    #[test]
    fn repair_kinds_serialize_snake_case() {
        assert_eq!(
            serde_json::to_value(RepairKind::SyntheticToolResult).unwrap(),
            json!("synthetic_tool_result")
        );
        assert_eq!(
            serde_json::to_value(Provider::Openai).unwrap(),
            json!("openai")
        );
        assert_eq!(
            serde_json::to_value(ThinkingMode::Strip).unwrap(),
            json!("strip")
        );
    }
}
