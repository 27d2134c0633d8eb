//! A proptest generator of chaotic stored histories (`docs/NORMALIZATION.md` § Entries, § Pipeline).
//!
//! A history is built in two stages, both shrinkable:
//! 1. realistic agent loops ([`LoopSpec`]): a user prompt, then assistant steps (thinking with a
//!    signature, text, client `tool_use`, advisor / web_search server tools), each step with tool
//!    calls answered by a user `tool_result` turn; steps may be streamed as split fragments sharing
//!    one `message.id`, with tool results interleaved between fragments;
//! 2. a list of [`Mutation`]s that break it the ways stored histories break: crashes, duplicates,
//!    orphans, empty text, unsigned / trailing thinking, virtual / meta / attachment / system /
//!    progress entries, compact boundaries (with preserved segments) and snips, synthetic API
//!    errors after media, bad ids, non-object inputs, assistant-first lists, > 100 images, unknown
//!    block types, media the providers refuse (media type, magic bytes, size, pixels, many
//!    images).
//!
//! Steps of chaotic loops also switch models ([`MODELS`]) and carry the other providers'
//! reasoning: OpenAI `reasoning` items and Gemini `thought_signature`s.
//!
//! Every text a history carries holds a unique tag like `[u12]`, so a substring check cannot be
//! satisfied by another text.

use std::collections::{HashMap, HashSet};

use loupe::history::{ApiMessage, Content, Entry, EntryKind, Role, SnipMetadata};
use proptest::prelude::*;
use proptest::sample::Index;
use serde_json::{json, Value};

pub const PDF_TOO_LARGE: &str = "PDF too large (max 100 pages, 20MB). Double press esc to go back and try again, or use pdftotext to convert to text first.";
pub const PDF_PASSWORD: &str =
    "PDF is password protected. Please double press esc to edit your message and try again.";
pub const IMAGE_TOO_LARGE: &str =
    "Image was too large. Double press esc to go back and try again with a smaller image.";
pub const REQUEST_TOO_LARGE: &str =
    "Request too large (max 20MB). Double press esc to go back and try with a smaller file.";
/// The non-interactive variant: must *not* match the interactive strip map.
pub const PDF_TOO_LARGE_PRINT: &str = "PDF too large (max 100 pages, 20MB). Try reading the file a different way (e.g., extract text with pdftotext).";

pub const PNG_1PX: &str = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg==";
pub const PDF_STUB: &str =
    "JVBERi0xLjQKJcfsj6IKMSAwIG9iago8PD4+CmVuZG9iagp0cmFpbGVyCjw8Pj4KJSVFT0YK";

const TOOL_NAMES: &[&str] = &["Bash", "Read", "Edit", "Grep", "Glob", "ToolSearch"];
/// The models assistant entries are written by; chaotic histories switch between them.
pub const MODELS: &[&str] = &["claude-opus-5", "claude-sonnet-5"];
/// PNG headers (signature and IHDR) of 9000×10 and 3000×3000 pixels: all a size check reads.
pub const PNG_9000X10: &str = "iVBORw0KGgoAAAANSUhEUgAAIygAAAAKCAYAAAAAAAAA";
pub const PNG_3000X3000: &str = "iVBORw0KGgoAAAANSUhEUgAAC7gAAAu4CAYAAAAAAAAA";
/// A BMP file header.
pub const BMP: &str = "Qk02AAAAAAAAADYAAAA=";

pub fn image_of(media_type: &str, data: &str) -> Value {
    json!({"type": "image", "source": {"type": "base64", "media_type": media_type, "data": data}})
}

pub fn image_block() -> Value {
    json!({"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG_1PX}})
}

pub fn document_block() -> Value {
    json!({"type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": PDF_STUB}})
}

/// How a tool's result is stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResultShape {
    /// `content: "<text>"`
    Text,
    /// `content: [text]`
    Blocks,
    /// `is_error: true`, string content.
    Error,
    /// `is_error: true`, array content holding an image beside the text.
    ErrorWithImage,
    /// `content: [tool_reference]` (ToolSearch).
    ToolReference,
    /// `content: [text, image]`
    WithImage,
    /// No `content` key (an empty tool result).
    Absent,
}

#[derive(Debug, Clone)]
pub struct ToolSpec {
    pub name: usize,
    pub result: ResultShape,
}

#[derive(Debug, Clone)]
pub struct ServerSpec {
    /// `advisor` (result `advisor_tool_result`) or `web_search` (`web_search_tool_result`).
    pub advisor: bool,
    pub answered: bool,
}

/// One assistant response of an agent loop.
#[derive(Debug, Clone)]
pub struct StepSpec {
    pub thinking: bool,
    pub redacted: bool,
    pub text: bool,
    pub server: Option<ServerSpec>,
    pub tools: Vec<ToolSpec>,
    /// Streamed as one entry per block, sharing `message.id`.
    pub split: bool,
    /// With `split`: each tool result stored right after its `tool_use` fragment.
    pub interleave: bool,
    /// The index in [`MODELS`] of the model that wrote it.
    pub model: usize,
    /// An OpenAI Responses `reasoning` item before its text / calls.
    pub reasoning: bool,
    /// A Gemini `thought_signature` on its first call (or its last text).
    pub signed: bool,
}

/// A user prompt and the assistant steps answering it; the last step has no client tool call.
#[derive(Debug, Clone)]
pub struct LoopSpec {
    pub prompt_as_string: bool,
    pub prompt_image: bool,
    pub steps: Vec<StepSpec>,
}

/// A way stored histories break. Indices are resolved against the list at the time the mutation
/// is applied; compact boundaries and snips are applied after all other mutations.
#[derive(Debug, Clone)]
pub enum Mutation {
    /// Any entry lost.
    DropEntry(Index),
    /// Crash mid tool call: the user turn holding some tool results is lost.
    DropToolResults(Index),
    /// Crash right after an assistant entry with a `tool_use`: everything after it is lost.
    Truncate(Index),
    /// A `tool_result` for an id no assistant used.
    OrphanResult(Index),
    /// A stored entry appears twice (resume replay), new uuid.
    DuplicateEntry(Index),
    /// A tool_result block appears twice in its turn.
    DuplicateResultBlock(Index),
    /// A `tool_use` takes the id of another `tool_use`.
    DuplicateToolUseId(Index, Index),
    /// Empty / whitespace-only text, as string or block content, user or assistant (variant 0..8).
    EmptyText(Index, u8),
    /// An assistant fragment holding only a (signed) thinking block; shares the next assistant's
    /// `message.id` when `share_id`.
    ThinkingOnly(Index, bool),
    /// A thinking block loses its signature (interrupted stream); `""` when the bool is set.
    Unsign(Index, bool),
    /// The history ends in an assistant fragment whose last block is thinking.
    TrailingThinking(bool),
    /// A display-only entry (never sent); assistant when the bool is set.
    Virtual(Index, bool),
    /// A meta user message (system reminder), string content when the bool is set.
    Meta(Index, bool),
    /// An attachment entry (role user, text and optionally an image).
    Attachment(Index, bool),
    /// `system` / `informational`.
    Informational(Index),
    /// `system` / `local_command` with string content (sent as user text).
    LocalCommand(Index),
    Progress(Index),
    /// A meta user message with a document and/or image, then a synthetic API error assistant
    /// (variant 0..5 picks the error text).
    ApiError(Index, u8),
    /// A `tool_use` id from another provider: `functions.Bash:0`, empty, or 60 characters
    /// (variant 0..3); the matching results renamed too when the bool is set.
    BadToolId(Index, u8, bool),
    /// A `tool_use.input` that is not an object (variant 0..4).
    NonObjectInput(Index, u8),
    /// The list starts with an assistant entry (with an unanswered `tool_use` when set).
    AssistantFirst(bool),
    /// A user prompt with this many images.
    ManyImages(Index, usize),
    /// A user entry carrying `{"type":"future_block","x":1}`.
    UnknownBlock(Index),
    /// A kept synthetic assistant (`No response requested.`, model `<synthetic>`).
    SyntheticAssistant(Index),
    /// A `compact_boundary` plus its summary user message, optionally with a preserved segment
    /// (two indices among the entries before it).
    CompactBoundary(Index, Option<(Index, Index)>),
    /// A `snip` entry hiding up to a few earlier entries.
    Snip(Index, Vec<Index>),
    /// An entry an erasure made a tombstone (its content gone, its place kept).
    Erase(Index),
    /// A user prompt with media a provider refuses (variant 0..6): a BMP, JPEG bytes declared
    /// PNG, over 5 MB of base64, 9000 px wide, 25 images of 3000 px, a "PDF" without `%PDF-`.
    BadMedia(Index, u8),
    /// Programmatic tool calling: a code-execution call that makes this many client calls, one
    /// response each, its result in the response after the last. Variant 0..4: as sent; the
    /// server id another provider's (`srv-…`); the result never came; the server id one an
    /// earlier call already used.
    Programmatic(Index, u8, u8),
}

impl Mutation {
    fn is_late(&self) -> bool {
        matches!(
            self,
            Mutation::CompactBoundary(..) | Mutation::Snip(..) | Mutation::Erase(..)
        )
    }
}

// ---------------------------------------------------------------------------------------------
// Strategies

fn result_shape() -> impl Strategy<Value = ResultShape> {
    prop_oneof![
        4 => Just(ResultShape::Text),
        2 => Just(ResultShape::Blocks),
        1 => Just(ResultShape::Error),
        1 => Just(ResultShape::ErrorWithImage),
        1 => Just(ResultShape::ToolReference),
        1 => Just(ResultShape::WithImage),
        1 => Just(ResultShape::Absent),
    ]
}

fn tool_spec() -> impl Strategy<Value = ToolSpec> {
    (0..TOOL_NAMES.len(), result_shape()).prop_map(|(name, result)| ToolSpec { name, result })
}

/// One step; `chaos` allows split fragments and unanswered server tools.
fn step_spec(chaos: bool, with_tools: bool) -> impl Strategy<Value = StepSpec> {
    step_spec_split(chaos, if chaos { 0.35 } else { 0.0 }, with_tools)
}

/// [`step_spec`] with responses streamed as fragments with probability `split`.
fn step_spec_split(chaos: bool, split: f64, with_tools: bool) -> impl Strategy<Value = StepSpec> {
    let tools = if with_tools {
        prop::collection::vec(tool_spec(), 1..=3).boxed()
    } else {
        Just(Vec::new()).boxed()
    };
    let server = prop::option::weighted(
        0.2,
        (
            any::<bool>(),
            prop::bool::weighted(if chaos { 0.7 } else { 1.0 }),
        )
            .prop_map(|(advisor, answered)| ServerSpec { advisor, answered }),
    );
    let split = prop::bool::weighted(split);
    let model = prop::bool::weighted(if chaos { 0.25 } else { 0.0 }).prop_map(usize::from);
    (
        prop::bool::weighted(0.5),
        prop::bool::weighted(0.1),
        any::<bool>(),
        server,
        tools,
        split,
        any::<bool>(),
        model,
        prop::bool::weighted(if chaos { 0.25 } else { 0.0 }),
        prop::bool::weighted(if chaos { 0.3 } else { 0.0 }),
    )
        .prop_map(
            |(
                thinking,
                redacted,
                text,
                server,
                tools,
                split,
                interleave,
                model,
                reasoning,
                signed,
            )| {
                StepSpec {
                    thinking,
                    redacted,
                    text,
                    server,
                    tools,
                    split,
                    interleave,
                    model,
                    reasoning,
                    signed,
                }
            },
        )
}

fn loop_spec(chaos: bool) -> impl Strategy<Value = LoopSpec> {
    (
        any::<bool>(),
        prop::bool::weighted(0.1),
        prop::collection::vec(step_spec(chaos, true), 0..=3),
        step_spec(chaos, false),
    )
        .prop_map(|(prompt_as_string, prompt_image, mut steps, last)| {
            steps.push(last);
            LoopSpec {
                prompt_as_string,
                prompt_image,
                steps,
            }
        })
}

fn mutation() -> impl Strategy<Value = Mutation> {
    let i = || any::<Index>();
    prop_oneof![
        1 => i().prop_map(Mutation::DropEntry),
        1 => i().prop_map(Mutation::DropToolResults),
        1 => i().prop_map(Mutation::Truncate),
        1 => i().prop_map(Mutation::OrphanResult),
        1 => i().prop_map(Mutation::DuplicateEntry),
        1 => i().prop_map(Mutation::DuplicateResultBlock),
        1 => (i(), i()).prop_map(|(a, b)| Mutation::DuplicateToolUseId(a, b)),
        2 => (i(), 0u8..8).prop_map(|(a, v)| Mutation::EmptyText(a, v)),
        1 => (i(), any::<bool>()).prop_map(|(a, b)| Mutation::ThinkingOnly(a, b)),
        1 => (i(), any::<bool>()).prop_map(|(a, b)| Mutation::Unsign(a, b)),
        1 => any::<bool>().prop_map(Mutation::TrailingThinking),
        1 => (i(), any::<bool>()).prop_map(|(a, b)| Mutation::Virtual(a, b)),
        1 => (i(), any::<bool>()).prop_map(|(a, b)| Mutation::Meta(a, b)),
        1 => (i(), any::<bool>()).prop_map(|(a, b)| Mutation::Attachment(a, b)),
        1 => i().prop_map(Mutation::Informational),
        1 => i().prop_map(Mutation::LocalCommand),
        1 => i().prop_map(Mutation::Progress),
        1 => (i(), 0u8..5).prop_map(|(a, v)| Mutation::ApiError(a, v)),
        1 => (i(), 0u8..3, any::<bool>()).prop_map(|(a, v, b)| Mutation::BadToolId(a, v, b)),
        1 => (i(), 0u8..4).prop_map(|(a, v)| Mutation::NonObjectInput(a, v)),
        1 => any::<bool>().prop_map(Mutation::AssistantFirst),
        1 => (i(), 95usize..130).prop_map(|(a, n)| Mutation::ManyImages(a, n)),
        1 => i().prop_map(Mutation::UnknownBlock),
        1 => i().prop_map(Mutation::SyntheticAssistant),
        2 => (i(), prop::option::of((i(), i()))).prop_map(|(a, p)| Mutation::CompactBoundary(a, p)),
        1 => (i(), prop::collection::vec(i(), 1..4)).prop_map(|(a, v)| Mutation::Snip(a, v)),
        1 => i().prop_map(Mutation::Erase),
        2 => (i(), 0u8..6).prop_map(|(a, v)| Mutation::BadMedia(a, v)),
        2 => (i(), 1u8..4, 0u8..4).prop_map(|(a, n, v)| Mutation::Programmatic(a, n, v)),
    ]
}

/// Realistic, valid histories: no fragments, no mutation (their naive `{role, content}`
/// conversion is a valid Anthropic list with thinking enabled).
pub fn clean_history() -> impl Strategy<Value = Vec<Entry>> {
    prop::collection::vec(loop_spec(false), 1..=4).prop_map(|loops| build(&loops, &[]))
}

/// Well-formed agent loops as an agent writes them: a prompt, then up to eight steps of a response
/// (streamed as one entry per block, sharing `message.id`, in about half the steps, tool results
/// interleaved or after the fragments) with every call answered, and a final answer; one model,
/// no mutation.
pub fn agent_loop_history() -> impl Strategy<Value = Vec<Entry>> {
    let agent_loop = (
        any::<bool>(),
        prop::bool::weighted(0.1),
        prop::collection::vec(step_spec_split(false, 0.5, true), 0..=8),
        step_spec_split(false, 0.5, false),
    )
        .prop_map(|(prompt_as_string, prompt_image, mut steps, last)| {
            steps.push(last);
            LoopSpec {
                prompt_as_string,
                prompt_image,
                steps,
            }
        });
    prop::collection::vec(agent_loop, 1..=5).prop_map(|loops| build(&loops, &[]))
}

/// The loops and mutations a chaotic history is built from (shrinkable).
pub fn chaos_spec() -> impl Strategy<Value = (Vec<LoopSpec>, Vec<Mutation>)> {
    (
        prop::collection::vec(loop_spec(true), 1..=4),
        prop::collection::vec(mutation(), 0..=6),
    )
}

/// Chaotic stored histories: `seq` dense from 0, unique uuids.
pub fn chaotic_history() -> impl Strategy<Value = Vec<Entry>> {
    chaos_spec().prop_map(|(loops, muts)| build(&loops, &muts))
}

// ---------------------------------------------------------------------------------------------
// Building

pub fn build(loops: &[LoopSpec], mutations: &[Mutation]) -> Vec<Entry> {
    let mut b = Builder::default();
    for l in loops {
        b.agent_loop(l);
    }
    for m in mutations.iter().filter(|m| !m.is_late()) {
        b.apply(m);
    }
    for m in mutations.iter().filter(|m| m.is_late()) {
        b.apply(m);
    }
    b.finish()
}

fn message(role: Role, content: Content) -> ApiMessage {
    ApiMessage::new(role, content)
}

fn blocks_of(e: &Entry) -> &[Value] {
    match e.message.as_ref().map(|m| &m.content) {
        Some(Content::Blocks(b)) => b,
        _ => &[],
    }
}

fn blocks_mut(e: &mut Entry) -> Option<&mut Vec<Value>> {
    match e.message.as_mut().map(|m| &mut m.content) {
        Some(Content::Blocks(b)) => Some(b),
        _ => None,
    }
}

fn has_block(e: &Entry, ty: &str) -> bool {
    blocks_of(e).iter().any(|b| b["type"] == ty)
}

#[derive(Default)]
struct Builder {
    n: u64,
    /// The index in [`MODELS`] of the model writing assistant entries now.
    model: usize,
    entries: Vec<Entry>,
    /// boundary uuid → (first uuid, last uuid) of its preserved segment.
    preserved: HashMap<String, (String, String)>,
}

impl Builder {
    fn next(&mut self) -> u64 {
        self.n += 1;
        self.n
    }

    fn uuid(&mut self) -> String {
        let n = self.next();
        format!("6f1c{n:04x}-7a2b-4c3d-8e4f-{n:012x}")
    }

    /// A unique tag for texts.
    fn tag(&mut self, prefix: &str) -> String {
        let n = self.next();
        format!("[{prefix}{n}]")
    }

    fn entry(&mut self, kind: EntryKind, message: Option<ApiMessage>) -> Entry {
        let mut e = Entry::new(kind);
        e.uuid = Some(self.uuid());
        e.message = message;
        e
    }

    fn user(&mut self, content: Content) -> Entry {
        self.entry(EntryKind::User, Some(message(Role::User, content)))
    }

    fn assistant(&mut self, msg_id: &str, blocks: Vec<Value>, stop: Option<&str>) -> Entry {
        let mut m = message(Role::Assistant, Content::Blocks(blocks));
        m.id = Some(msg_id.to_string());
        m.model = Some(MODELS[self.model].to_string());
        m.stop_reason = stop.map(str::to_string);
        m.usage = Some(
            json!({"input_tokens": 1200 + self.n, "output_tokens": 80, "cache_read_input_tokens": 0}),
        );
        self.entry(EntryKind::Assistant, Some(m))
    }

    fn msg_id(&mut self) -> String {
        let n = self.next();
        format!("msg_01{n:020}")
    }

    fn text(&mut self, prefix: &str, body: &str) -> String {
        format!("{} {body}", self.tag(prefix))
    }

    fn thinking(&mut self) -> Value {
        let t = self.text("th", "Let me look at the repository layout first.");
        let sig = format!("EqQBCkYIBxgCKkD{}sig", self.next());
        json!({"type": "thinking", "thinking": t, "signature": sig})
    }

    fn tool_result(&mut self, id: &str, shape: ResultShape) -> Value {
        let mut text = self.text("r", "total 3\nCargo.toml\nsrc");
        // Every third result is long, as real tool output often is (what clearing clears).
        if self.n.is_multiple_of(3) {
            text.push_str(&"\nsrc/module.rs: fn handler() -> Result<(), Error>".repeat(8));
        }
        match shape {
            ResultShape::Text => json!({"type": "tool_result", "tool_use_id": id, "content": text}),
            ResultShape::Blocks => {
                json!({"type": "tool_result", "tool_use_id": id, "content": [{"type": "text", "text": text}]})
            }
            ResultShape::Error => {
                json!({"type": "tool_result", "tool_use_id": id, "is_error": true, "content": format!("{text}: Exit code 1")})
            }
            ResultShape::ErrorWithImage => {
                json!({"type": "tool_result", "tool_use_id": id, "is_error": true, "content": [{"type": "text", "text": text}, image_block()]})
            }
            ResultShape::ToolReference => {
                json!({"type": "tool_result", "tool_use_id": id, "content": [{"type": "tool_reference", "tool_name": "Grep"}]})
            }
            ResultShape::WithImage => {
                json!({"type": "tool_result", "tool_use_id": id, "content": [{"type": "text", "text": text}, image_block()]})
            }
            ResultShape::Absent => json!({"type": "tool_result", "tool_use_id": id}),
        }
    }

    fn agent_loop(&mut self, l: &LoopSpec) {
        let prompt = self.text("u", "please list the files and run the tests");
        let content = if l.prompt_as_string && !l.prompt_image {
            Content::Text(prompt)
        } else {
            let mut blocks = vec![json!({"type": "text", "text": prompt})];
            if l.prompt_image {
                blocks.push(image_block());
            }
            Content::Blocks(blocks)
        };
        let e = self.user(content);
        self.entries.push(e);
        for step in &l.steps {
            self.step(step);
        }
    }

    fn step(&mut self, s: &StepSpec) {
        self.model = s.model;
        let msg_id = self.msg_id();
        let mut blocks = Vec::new();
        if s.thinking {
            blocks.push(self.thinking());
        }
        if s.redacted {
            let data = format!("EmwKAhgBEgy{}redacted", self.next());
            blocks.push(json!({"type": "redacted_thinking", "data": data}));
        }
        if s.reasoning {
            let n = self.next();
            blocks.push(json!({"type": "reasoning", "id": format!("rs_{n:020}"), "summary": [], "encrypted_content": format!("gAAAAB{n}enc")}));
        }
        if s.text || (s.tools.is_empty() && s.server.is_none()) {
            let t = self.text("a", "I'll check the project structure.");
            blocks.push(json!({"type": "text", "text": t}));
        }
        if let Some(srv) = &s.server {
            let id = format!("srvtoolu_01{:020}", self.next());
            let (name, input) = if srv.advisor {
                ("advisor", json!({}))
            } else {
                ("web_search", json!({"query": "rust proptest strategies"}))
            };
            blocks.push(json!({"type": "server_tool_use", "id": id, "name": name, "input": input}));
            if srv.answered {
                let t = self.text("adv", "Consider the edge cases first.");
                blocks.push(if srv.advisor {
                    json!({"type": "advisor_tool_result", "tool_use_id": id, "content": {"type": "advisor_result", "text": t}})
                } else {
                    json!({"type": "web_search_tool_result", "tool_use_id": id, "content": [{"type": "web_search_result", "url": "https://example.com/proptest", "title": "proptest", "encrypted_content": "EqgfCioIARgBIiQ3", "page_age": null}]})
                });
            }
            if s.tools.is_empty() {
                let t = self.text("a", "Here is what I found.");
                blocks.push(json!({"type": "text", "text": t}));
            }
        }
        let mut ids = Vec::new();
        for t in &s.tools {
            let id = format!("toolu_01{:020}", self.next());
            let input = match TOOL_NAMES[t.name] {
                "Bash" => json!({"command": "ls -la", "description": "List files"}),
                "Read" => json!({"file_path": "/work/src/lib.rs"}),
                "Edit" => {
                    json!({"file_path": "/work/src/lib.rs", "old_string": "a", "new_string": "b"})
                }
                "ToolSearch" => json!({"query": "select:Grep"}),
                _ => json!({"pattern": "fn main"}),
            };
            blocks.push(
                json!({"type": "tool_use", "id": id, "name": TOOL_NAMES[t.name], "input": input}),
            );
            ids.push((id, t.result));
        }
        if s.signed {
            let sig = format!("CiQB{}thoughtsig", self.next());
            let at = blocks
                .iter()
                .position(|b| b["type"] == "tool_use")
                .or_else(|| blocks.iter().rposition(|b| b["type"] == "text"));
            if let Some(at) = at {
                blocks[at]["thought_signature"] = json!(sig);
            }
        }
        let stop = if ids.is_empty() {
            "end_turn"
        } else {
            "tool_use"
        };
        let results: Vec<Value> = ids
            .iter()
            .map(|(id, shape)| self.tool_result(id, *shape))
            .collect();
        if !s.split {
            let e = self.assistant(&msg_id, blocks, Some(stop));
            self.entries.push(e);
            if !results.is_empty() {
                let e = self.user(Content::Blocks(results));
                self.entries.push(e);
            }
            return;
        }
        let last = blocks.len() - 1;
        let mut results = results.into_iter();
        for (k, block) in blocks.into_iter().enumerate() {
            let is_use = block["type"] == "tool_use";
            let e = self.assistant(&msg_id, vec![block], (k == last).then_some(stop));
            self.entries.push(e);
            if is_use && s.interleave {
                if let Some(r) = results.next() {
                    let e = self.user(Content::Blocks(vec![r]));
                    self.entries.push(e);
                }
            }
        }
        let rest: Vec<Value> = results.collect();
        if !rest.is_empty() {
            let e = self.user(Content::Blocks(rest));
            self.entries.push(e);
        }
    }

    /// See [`Mutation::Programmatic`].
    fn programmatic(&mut self, at: &Index, calls: u8, variant: u8) {
        let earlier = self
            .block_positions("server_tool_use")
            .first()
            .map(|&(i, j)| blocks_of(&self.entries[i])[j]["id"].clone());
        let server_id = match (variant, earlier) {
            (1, _) => json!(format!("srv-{}", self.next())),
            (3, Some(id)) => id,
            _ => json!(format!("srvtoolu_01{:020}", self.next())),
        };
        let code = self.text("code", "rows = [await query_db(day=d) for d in days]");
        let mut chain = Vec::new();
        for k in 0..calls {
            let call_id = format!("toolu_01{:020}", self.next());
            let mut blocks = Vec::new();
            if k == 0 {
                blocks.push(json!({"type": "server_tool_use", "id": server_id,
                    "name": "code_execution", "input": {"code": code}}));
            }
            blocks.push(
                json!({"type": "tool_use", "id": call_id, "name": "query_db",
                "input": {"day": k}, "caller": {"type": "code_execution_20250825",
                "tool_id": server_id}}),
            );
            let msg_id = self.msg_id();
            chain.push(self.assistant(&msg_id, blocks, Some("tool_use")));
            let rows = self.text("rows", "[3, 1, 4]");
            chain.push(self.user(Content::Blocks(vec![json!({"type": "tool_result",
                "tool_use_id": call_id, "content": rows})])));
        }
        let mut last = Vec::new();
        if variant != 2 {
            let stdout = self.text("stdout", "8 rows in all");
            last.push(
                json!({"type": "code_execution_tool_result", "tool_use_id": server_id,
                "content": {"type": "code_execution_result", "stdout": stdout, "stderr": "",
                    "return_code": 0, "content": []}}),
            );
        }
        let t = self.text("a", "The query returned 8 rows.");
        last.push(json!({"type": "text", "text": t}));
        let msg_id = self.msg_id();
        chain.push(self.assistant(&msg_id, last, Some("end_turn")));
        let pos = at.index(self.entries.len() + 1);
        self.entries.splice(pos..pos, chain);
    }

    /// Positions of entries matching `pred`.
    fn positions(&self, pred: impl Fn(&Entry) -> bool) -> Vec<usize> {
        (0..self.entries.len())
            .filter(|&i| pred(&self.entries[i]))
            .collect()
    }

    fn insert_at(&mut self, at: &Index, e: Entry) {
        let pos = at.index(self.entries.len() + 1);
        self.entries.insert(pos, e);
    }

    /// (entry position, block position) of every block of `ty`.
    fn block_positions(&self, ty: &str) -> Vec<(usize, usize)> {
        let mut v = Vec::new();
        for (i, e) in self.entries.iter().enumerate() {
            for (j, b) in blocks_of(e).iter().enumerate() {
                if b["type"] == ty {
                    v.push((i, j));
                }
            }
        }
        v
    }

    fn rename_results(&mut self, from: &str, to: &str) {
        for e in &mut self.entries {
            if e.kind != EntryKind::User {
                continue;
            }
            if let Some(blocks) = blocks_mut(e) {
                for b in blocks.iter_mut() {
                    if b["type"] == "tool_result" && b["tool_use_id"] == from {
                        b["tool_use_id"] = json!(to);
                    }
                }
            }
        }
    }

    fn apply(&mut self, m: &Mutation) {
        match m {
            Mutation::DropEntry(at) => {
                if !self.entries.is_empty() {
                    let pos = at.index(self.entries.len());
                    self.entries.remove(pos);
                }
            }
            Mutation::DropToolResults(at) => {
                let c =
                    self.positions(|e| e.kind == EntryKind::User && has_block(e, "tool_result"));
                if !c.is_empty() {
                    self.entries.remove(c[at.index(c.len())]);
                }
            }
            Mutation::Truncate(at) => {
                let c =
                    self.positions(|e| e.kind == EntryKind::Assistant && has_block(e, "tool_use"));
                if !c.is_empty() {
                    self.entries.truncate(c[at.index(c.len())] + 1);
                }
            }
            Mutation::OrphanResult(at) => {
                let id = format!("toolu_01orphan{}", self.next());
                let r = self.tool_result(&id, ResultShape::Text);
                let e = self.user(Content::Blocks(vec![r]));
                self.insert_at(at, e);
            }
            Mutation::DuplicateEntry(at) => {
                if !self.entries.is_empty() {
                    let pos = at.index(self.entries.len());
                    let mut e = self.entries[pos].clone();
                    e.uuid = Some(self.uuid());
                    self.entries.insert(pos + 1, e);
                }
            }
            Mutation::DuplicateResultBlock(at) => {
                let c = self.block_positions("tool_result");
                if !c.is_empty() {
                    let (i, j) = c[at.index(c.len())];
                    if let Some(blocks) = blocks_mut(&mut self.entries[i]) {
                        let dup = blocks[j].clone();
                        blocks.insert(j + 1, dup);
                    }
                }
            }
            Mutation::DuplicateToolUseId(a, b) => {
                let c = self.block_positions("tool_use");
                if c.len() >= 2 {
                    let (ia, ja) = c[a.index(c.len())];
                    let (ib, jb) = c[b.index(c.len())];
                    let id = blocks_of(&self.entries[ib])[jb]["id"].clone();
                    if let Some(blocks) = blocks_mut(&mut self.entries[ia]) {
                        blocks[ja]["id"] = id;
                    }
                }
            }
            Mutation::EmptyText(at, variant) => self.empty_text(at, *variant),
            Mutation::ThinkingOnly(at, share_id) => {
                let pos = at.index(self.entries.len() + 1);
                let shared = if *share_id {
                    self.entries[pos..]
                        .iter()
                        .find(|e| e.kind == EntryKind::Assistant)
                        .and_then(|e| e.response_id().map(str::to_string))
                } else {
                    None
                };
                let id = shared.unwrap_or_else(|| self.msg_id());
                let t = self.thinking();
                let e = self.assistant(&id, vec![t], None);
                self.entries.insert(pos, e);
            }
            Mutation::Unsign(at, empty) => {
                let c = self.block_positions("thinking");
                if !c.is_empty() {
                    let (i, j) = c[at.index(c.len())];
                    if let Some(blocks) = blocks_mut(&mut self.entries[i]) {
                        let obj = blocks[j].as_object_mut().expect("thinking block");
                        if *empty {
                            obj.insert("signature".into(), json!(""));
                        } else {
                            obj.remove("signature");
                        }
                    }
                }
            }
            Mutation::TrailingThinking(only) => {
                let last_id = self
                    .entries
                    .iter()
                    .rev()
                    .find(|e| e.kind == EntryKind::Assistant)
                    .and_then(|e| e.response_id().map(str::to_string));
                let id = match (only, last_id) {
                    (true, Some(id)) => id,
                    _ => self.msg_id(),
                };
                let mut blocks = Vec::new();
                if !only {
                    let t = self.text("a", "Now running the tests.");
                    blocks.push(json!({"type": "text", "text": t}));
                }
                blocks.push(self.thinking());
                let e = self.assistant(&id, blocks, None);
                self.entries.push(e);
            }
            Mutation::Virtual(at, assistant) => {
                let t = self.text("v", "REPL inner call output");
                let mut e = if *assistant {
                    let id = self.msg_id();
                    self.assistant(
                        &id,
                        vec![json!({"type": "text", "text": t})],
                        Some("end_turn"),
                    )
                } else {
                    self.user(Content::Text(t))
                };
                e.is_virtual = true;
                self.insert_at(at, e);
            }
            Mutation::Meta(at, string) => {
                let t = format!(
                    "<system-reminder>\n{}\n</system-reminder>",
                    self.text("m", "The user opened src/lib.rs in the IDE.")
                );
                let content = if *string {
                    Content::Text(t)
                } else {
                    Content::Blocks(vec![json!({"type": "text", "text": t})])
                };
                let mut e = self.user(content);
                e.is_meta = true;
                self.insert_at(at, e);
            }
            Mutation::Attachment(at, image) => {
                let t = self.text("att", "Contents of notes.md:\n# Notes");
                let mut blocks = vec![json!({"type": "text", "text": t})];
                if *image {
                    blocks.push(image_block());
                }
                let e = self.entry(
                    EntryKind::Attachment,
                    Some(message(Role::User, Content::Blocks(blocks))),
                );
                self.insert_at(at, e);
            }
            Mutation::Informational(at) => {
                let mut e = self.entry(EntryKind::System, None);
                e.subtype = Some("informational".into());
                e.content = Some(json!(self.text("sys", "Auto-update available")));
                e.extra.insert("level".into(), json!("info"));
                self.insert_at(at, e);
            }
            Mutation::LocalCommand(at) => {
                let mut e = self.entry(EntryKind::System, None);
                e.subtype = Some("local_command".into());
                let t = self.text("lc", "Total cost: $0.12");
                e.content = Some(json!(format!(
                    "<local-command-stdout>{t}</local-command-stdout>"
                )));
                self.insert_at(at, e);
            }
            Mutation::Progress(at) => {
                let mut e = self.entry(EntryKind::Progress, None);
                e.extra.insert(
                    "data".into(),
                    json!({"type": "bash_progress", "output": "running…"}),
                );
                e.extra
                    .insert("tool_use_id".into(), json!("toolu_01progress"));
                self.insert_at(at, e);
            }
            Mutation::ApiError(at, variant) => {
                let (error, media): (&str, Vec<Value>) = match variant {
                    0 => (PDF_TOO_LARGE, vec![document_block()]),
                    1 => (IMAGE_TOO_LARGE, vec![image_block()]),
                    2 => (REQUEST_TOO_LARGE, vec![document_block(), image_block()]),
                    3 => (PDF_PASSWORD, vec![document_block()]),
                    _ => (PDF_TOO_LARGE_PRINT, vec![document_block()]),
                };
                let t = self.text("m", "Attached: report.pdf");
                let mut blocks = vec![json!({"type": "text", "text": t})];
                blocks.extend(media);
                let mut meta = self.user(Content::Blocks(blocks));
                meta.is_meta = true;
                let id = self.uuid();
                let mut err = self.assistant(
                    &id,
                    vec![json!({"type": "text", "text": error})],
                    Some("stop_sequence"),
                );
                err.is_api_error = true;
                if let Some(m) = err.message.as_mut() {
                    m.model = Some("<synthetic>".into());
                    m.usage = None;
                }
                let pos = at.index(self.entries.len() + 1);
                self.entries.insert(pos, err);
                self.entries.insert(pos, meta);
            }
            Mutation::BadToolId(at, variant, with_results) => {
                let c = self.block_positions("tool_use");
                if !c.is_empty() {
                    let (i, j) = c[at.index(c.len())];
                    let new = match variant {
                        0 => "functions.Bash:0".to_string(),
                        1 => String::new(),
                        _ => format!("toolu_{}", "A1b2C3d4E5".repeat(6))[..60].to_string(),
                    };
                    let old = blocks_of(&self.entries[i])[j]["id"]
                        .as_str()
                        .unwrap_or_default()
                        .to_string();
                    if let Some(blocks) = blocks_mut(&mut self.entries[i]) {
                        blocks[j]["id"] = json!(new);
                    }
                    if *with_results {
                        self.rename_results(&old, &new);
                    }
                }
            }
            Mutation::NonObjectInput(at, variant) => {
                let c = self.block_positions("tool_use");
                if !c.is_empty() {
                    let (i, j) = c[at.index(c.len())];
                    let input = match variant {
                        0 => json!("{\"command\": \"ls -"),
                        1 => json!(["ls", "-la"]),
                        2 => Value::Null,
                        _ => json!(42),
                    };
                    if let Some(blocks) = blocks_mut(&mut self.entries[i]) {
                        blocks[j]["input"] = input;
                    }
                }
            }
            Mutation::AssistantFirst(with_tool) => {
                let id = self.msg_id();
                let t = self.text("a", "Resuming the previous task.");
                let mut blocks = vec![json!({"type": "text", "text": t})];
                if *with_tool {
                    let tid = format!("toolu_01{:020}", self.next());
                    blocks.push(json!({"type": "tool_use", "id": tid, "name": "Bash", "input": {"command": "git status"}}));
                }
                let e = self.assistant(&id, blocks, Some("tool_use"));
                self.entries.insert(0, e);
            }
            Mutation::ManyImages(at, n) => {
                let t = self.text("u", "here are the screenshots");
                let mut blocks = vec![json!({"type": "text", "text": t})];
                blocks.extend((0..*n).map(|_| image_block()));
                let e = self.user(Content::Blocks(blocks));
                self.insert_at(at, e);
            }
            Mutation::BadMedia(at, variant) => {
                let t = self.text("u", "what is in this picture?");
                let mut blocks = vec![json!({"type": "text", "text": t})];
                match variant {
                    0 => blocks.push(image_of("image/bmp", BMP)),
                    1 => blocks.push(image_of("image/jpeg", PNG_1PX)),
                    2 => {
                        let big = PNG_1PX.to_string() + &"A".repeat(5_600_000);
                        blocks.push(image_of("image/png", &big));
                    }
                    3 => blocks.push(image_of("image/png", PNG_9000X10)),
                    4 => blocks.extend((0..25).map(|_| image_of("image/png", PNG_3000X3000))),
                    _ => blocks.push(
                        json!({"type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": "AAAAAAAA"}}),
                    ),
                }
                let e = self.user(Content::Blocks(blocks));
                self.insert_at(at, e);
            }
            Mutation::Programmatic(at, calls, variant) => self.programmatic(at, *calls, *variant),
            Mutation::UnknownBlock(at) => {
                let t = self.text("u", "what is this block?");
                let e = self.user(Content::Blocks(vec![
                    json!({"type": "text", "text": t}),
                    json!({"type": "future_block", "x": 1}),
                ]));
                self.insert_at(at, e);
            }
            Mutation::SyntheticAssistant(at) => {
                let id = self.uuid();
                let mut e = self.assistant(
                    &id,
                    vec![json!({"type": "text", "text": "No response requested."})],
                    Some("stop_sequence"),
                );
                if let Some(m) = e.message.as_mut() {
                    m.model = Some("<synthetic>".into());
                    m.usage = None;
                }
                self.insert_at(at, e);
            }
            Mutation::CompactBoundary(at, preserved) => {
                let pos = at.index(self.entries.len() + 1);
                let mut b = self.entry(EntryKind::System, None);
                b.subtype = Some("compact_boundary".into());
                b.content = Some(json!("Conversation compacted"));
                b.compact_metadata =
                    Some(json!({"trigger": "auto", "pre_tokens": 167_000 + self.n}));
                if let (Some((x, y)), true) = (preserved, pos > 0) {
                    let (x, y) = (x.index(pos), y.index(pos));
                    let (first, last) = (x.min(y), x.max(y));
                    let first = self.entries[first].uuid.clone().unwrap_or_default();
                    let last = self.entries[last].uuid.clone().unwrap_or_default();
                    self.preserved
                        .insert(b.uuid.clone().unwrap_or_default(), (first, last));
                }
                let t = format!(
                    "This session is being continued from a previous conversation that ran out of context. The summary below covers the earlier portion of the conversation.\n\nSummary:\n{}",
                    self.text("sum", "1. Primary Request and Intent: list the files.")
                );
                let mut summary = self.user(Content::Text(t));
                summary.is_compact_summary = true;
                self.entries.insert(pos, summary);
                self.entries.insert(pos, b);
            }
            Mutation::Snip(at, victims) => {
                let pos = at.index(self.entries.len() + 1);
                if pos == 0 {
                    return;
                }
                let mut removed: Vec<String> = victims
                    .iter()
                    .filter_map(|v| self.entries[v.index(pos)].uuid.clone())
                    .collect();
                removed.dedup();
                let mut e = self.entry(EntryKind::System, None);
                e.subtype = Some("snip".into());
                e.content = Some(json!("Snipped"));
                e.snip_metadata = Some(SnipMetadata {
                    removed_uuids: removed,
                });
                self.entries.insert(pos, e);
            }
            Mutation::Erase(at) => {
                if !self.entries.is_empty() {
                    let pos = at.index(self.entries.len());
                    let mark = loupe::history::ErasedMark {
                        erasure_id: "erasure-1".into(),
                        erased_at: chrono::DateTime::from_timestamp(1_800_000_000, 0).unwrap(),
                    };
                    self.entries[pos] = self.entries[pos].tombstone(mark);
                }
            }
        }
    }

    fn empty_text(&mut self, at: &Index, variant: u8) {
        let blank = if variant.is_multiple_of(2) {
            ""
        } else {
            " \n\t"
        };
        match variant {
            0 | 1 => {
                let e = self.user(Content::Text(blank.into()));
                self.insert_at(at, e);
            }
            2 | 3 => {
                let e = self.user(Content::Blocks(vec![
                    json!({"type": "text", "text": blank}),
                ]));
                self.insert_at(at, e);
            }
            4 | 5 => {
                let id = self.msg_id();
                let e = self.assistant(
                    &id,
                    vec![json!({"type": "text", "text": blank})],
                    Some("end_turn"),
                );
                self.insert_at(at, e);
            }
            6 => {
                // A blank text block added to an existing assistant entry.
                let c = self.positions(|e| e.kind == EntryKind::Assistant);
                if !c.is_empty() {
                    let i = c[at.index(c.len())];
                    if let Some(blocks) = blocks_mut(&mut self.entries[i]) {
                        blocks.insert(0, json!({"type": "text", "text": "  "}));
                    }
                }
            }
            _ => {
                let e = self.user(Content::Blocks(Vec::new()));
                self.insert_at(at, e);
            }
        }
    }

    fn finish(mut self) -> Vec<Entry> {
        let mut seq_of: HashMap<String, i64> = HashMap::new();
        for (i, e) in self.entries.iter_mut().enumerate() {
            e.seq = Some(i as i64);
            seq_of.insert(e.uuid.clone().unwrap_or_default(), i as i64);
        }
        for e in &mut self.entries {
            let Some((first, last)) = e.uuid.as_ref().and_then(|u| self.preserved.get(u)) else {
                continue;
            };
            if let (Some(a), Some(b)) = (seq_of.get(first), seq_of.get(last)) {
                if let Some(Value::Object(meta)) = e.compact_metadata.as_mut() {
                    meta.insert(
                        "preserved_segment".into(),
                        json!({"first_seq": a, "last_seq": b}),
                    );
                }
            }
        }
        self.entries
    }
}

// ---------------------------------------------------------------------------------------------
// Oracles

/// The `(first_seq, last_seq)` preserved segment of a compact boundary.
pub fn preserved_segment(boundary: &Entry) -> Option<(i64, i64)> {
    let p = boundary
        .compact_metadata
        .as_ref()?
        .get("preserved_segment")?;
    Some((p.get("first_seq")?.as_i64()?, p.get("last_seq")?.as_i64()?))
}

/// Every uuid some snip entry removes (a snip hides its targets from every later context).
pub fn snipped_uuids(entries: &[Entry]) -> HashSet<String> {
    entries
        .iter()
        .filter(|e| e.is_snip())
        .filter_map(|e| e.snip_metadata.as_ref())
        .flat_map(|m| m.removed_uuids.iter().cloned())
        .collect()
}

/// The texts of one entry's message: string content, text blocks, and (user side) the texts of
/// tool results.
pub fn entry_texts(e: &Entry) -> Vec<String> {
    let Some(m) = &e.message else {
        return Vec::new();
    };
    let mut out = Vec::new();
    match &m.content {
        Content::Text(s) => out.push(s.clone()),
        Content::Blocks(blocks) => {
            for b in blocks {
                match b["type"].as_str() {
                    Some("text") => out.extend(b["text"].as_str().map(str::to_string)),
                    Some("tool_result") if e.kind == EntryKind::User => match &b["content"] {
                        Value::String(s) => out.push(s.clone()),
                        Value::Array(items) => out.extend(
                            items
                                .iter()
                                .filter(|i| i["type"] == "text")
                                .filter_map(|i| i["text"].as_str().map(str::to_string)),
                        ),
                        _ => {}
                    },
                    _ => {}
                }
            }
        }
    }
    out
}

/// The non-whitespace texts (trimmed) of the user / assistant entries that should reach the
/// model: after the last compact boundary (plus that boundary's preserved segment, without older
/// compact summaries in it), not virtual,
/// not snipped, not erased, not synthetic API error assistants. Tool-result texts count as user text.
pub fn text_inventory(entries: &[Entry]) -> Vec<(i64, String)> {
    let snipped = snipped_uuids(entries);
    let boundary = entries.iter().rposition(Entry::is_compact_boundary);
    let preserved = boundary.and_then(|b| preserved_segment(&entries[b]));
    let mut out = Vec::new();
    for (i, e) in entries.iter().enumerate() {
        let seq = e.seq.unwrap_or(i as i64);
        let in_context = match boundary {
            None => true,
            // An older compact summary inside the preserved range is superseded (the view
            // skips it; see `view::slice_after_boundary`).
            Some(b) => {
                i > b
                    || (preserved.is_some_and(|(a, z)| (a..=z).contains(&seq))
                        && !e.is_compact_summary)
            }
        };
        if !in_context
            || !e.kind.is_model_visible()
            || e.is_virtual
            || (e.kind == EntryKind::Assistant && e.is_api_error)
            || e.is_erased()
            || e.uuid.as_ref().is_some_and(|u| snipped.contains(u))
        {
            continue;
        }
        for t in entry_texts(e) {
            let t = t.trim();
            if !t.is_empty() {
                out.push((seq, t.to_string()));
            }
        }
    }
    out
}

/// The naive conversion: every entry with a message, in order, as `{role, content}`.
pub fn naive_messages(entries: &[Entry]) -> Vec<Value> {
    entries
        .iter()
        .filter_map(|e| e.message.as_ref())
        .map(|m| json!({"role": m.role, "content": m.content}))
        .collect()
}
