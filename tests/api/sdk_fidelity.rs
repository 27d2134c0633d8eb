//! SDK fidelity (issue 34): histories made of the block types today's SDKs send
//! (`docs/NORMALIZATION.md` § Block fidelity: anthropic 2.16, openai 3.60, google-genai 3.6), normalized
//! for every provider, checked three ways:
//! a. every output message / item validates with the provider's own SDK request type, unknown keys
//!    refused (`scripts/sdk_check.py`: `BetaMessageParam`, `ChatCompletionMessageParam`,
//!    `ResponseInputItemParam`, `google.genai.types.Content`);
//! b. every model-readable string stored (text, titles, URLs, sources, tool names and inputs,
//!    server tool results, MCP and advisor text, the compaction summary, browser tabs) is in the
//!    output, natively or rendered as text; only signatures, encrypted fields, opaque file ids and
//!    thinking sent to another provider (or with `thinking=strip`) may go;
//! c. every stored block that does not reach the output in the provider's native form is named by
//!    a repair (one whose `seqs` hold the block's entry, of a kind that changes content: merges,
//!    hoists and id rewrites do not count).
//!
//! The histories are what a Claude-Code-style client stores: `{uuid, type, message}` entries, one
//! per response or one per streamed block (same `message.id`), user prompts with media and
//! documents, tool loops (browser toolset, programmatic calls whose code-execution result arrives
//! in the next response), server tools with realistic results, MCP, advisor, `fallback` between
//! two thinking runs, a server-side `compaction` block opening a response.
//!
//! The tools Loupe adds to a context (`zoom`, `search`) are checked against each SDK's tool type
//! too (`BetaToolUnionParam`, `ChatCompletionToolUnionParam`, Responses' `ToolParam`,
//! `google.genai.types.Tool`).
//!
//! A fixed number of histories (deterministic seed; `FIDELITY_CASES` to change) is generated
//! once per test; the SDK check runs the Python once for all of them. Findings are grouped by
//! check × block × provider, each with the smallest example (shrunk with proptest for b and c).

use std::collections::BTreeMap;
use std::io::Write;
use std::process::{Command, Stdio};

use loupe::history::normalize::image::decode_base64_prefix;
use loupe::history::{
    normalize, ApiMessage, Content, Entry, EntryKind, NormalizeOptions, Normalized, Provider,
    RepairKind, Role, ThinkingMode,
};
use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};
use serde_json::{json, Value};

use crate::chaos::{PDF_STUB, PNG_1PX};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");
const MODEL: &str = "claude-opus-5";
const FALLBACK_MODEL: &str = "claude-sonnet-5";
const DEFAULT_CASES: usize = 128;
/// Shrink steps tried per finding of checks b and c.
const SHRINK_STEPS: usize = 400;

fn providers() -> [(Provider, &'static str); 4] {
    [
        (Provider::Anthropic, "anthropic"),
        (Provider::Openai, "openai"),
        (Provider::OpenaiResponses, "openai_responses"),
        (Provider::Gemini, "gemini"),
    ]
}

// ---------------------------------------------------------------------------------------------
// What a history is made of

/// A block a user prompt carries besides its text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Media {
    ImageBase64,
    ImageUrl,
    ImageFile,
    PdfBase64,
    /// `source: {type: text}`, with `title` and `context`.
    TextDocument,
    /// `source: {type: content}`: a list of text and image blocks.
    ContentDocument,
    PdfUrl,
    DocumentFile,
    SearchResult,
    /// A file handed to code execution (a user block).
    ContainerUpload,
}

const MEDIA: [Media; 10] = [
    Media::ImageBase64,
    Media::ImageUrl,
    Media::ImageFile,
    Media::PdfBase64,
    Media::TextDocument,
    Media::ContentDocument,
    Media::PdfUrl,
    Media::DocumentFile,
    Media::SearchResult,
    Media::ContainerUpload,
];

/// What a client tool returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Returned {
    String,
    Text,
    Image,
    Document,
    SearchResult,
    /// A browser toolset call: text and a `browser_state` block.
    Browser,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Server {
    WebSearch,
    WebFetch,
    CodeExecution,
    BashCodeExecution,
    TextEditorCodeExecution,
    ToolSearch,
    Mcp,
    Advisor,
}

/// One assistant response (and what answers it).
#[derive(Debug, Clone)]
enum Step {
    /// Text, citing the prompt's documents when asked and there are some.
    Text { citations: bool },
    /// Client tool calls, answered by one user turn of results.
    Tools(Vec<Returned>),
    /// A server tool call and its result in the same response, then text.
    Server(Server),
    /// Programmatic tool calling: a code-execution `server_tool_use` whose code calls a client
    /// tool (`caller` names it); the client's `tool_result` follows, and the code-execution result
    /// opens the next response.
    Programmatic,
    /// A thinking run, `fallback`, a thinking run by the fallback model, text.
    Fallback,
}

#[derive(Debug, Clone)]
struct LoopSpec {
    media: Vec<Media>,
    steps: Vec<Step>,
}

#[derive(Debug, Clone)]
struct HistorySpec {
    loops: Vec<LoopSpec>,
    /// Responses open with a signed thinking block.
    thinking: bool,
    /// Responses stored one entry per block, as streamed.
    split: bool,
    /// The loop whose first response opens with a server-side `compaction` block.
    compaction: Option<prop::sample::Index>,
    /// The request's thinking mode: keep, strip, enabled.
    mode: usize,
    cache: bool,
}

fn returned() -> impl Strategy<Value = Returned> {
    prop::sample::select(vec![
        Returned::String,
        Returned::Text,
        Returned::Image,
        Returned::Document,
        Returned::SearchResult,
        Returned::Browser,
    ])
}

fn server() -> impl Strategy<Value = Server> {
    prop::sample::select(vec![
        Server::WebSearch,
        Server::WebFetch,
        Server::CodeExecution,
        Server::BashCodeExecution,
        Server::TextEditorCodeExecution,
        Server::ToolSearch,
        Server::Mcp,
        Server::Advisor,
    ])
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        2 => any::<bool>().prop_map(|citations| Step::Text { citations }),
        3 => prop::collection::vec(returned(), 1..=2).prop_map(Step::Tools),
        4 => server().prop_map(Step::Server),
        1 => Just(Step::Programmatic),
        1 => Just(Step::Fallback),
    ]
}

fn loop_spec() -> impl Strategy<Value = LoopSpec> {
    (
        prop::sample::subsequence(MEDIA.to_vec(), 0..=4),
        prop::collection::vec(step(), 1..=3),
    )
        .prop_map(|(media, steps)| LoopSpec { media, steps })
}

fn history_spec() -> impl Strategy<Value = HistorySpec> {
    (
        prop::collection::vec(loop_spec(), 1..=3),
        any::<bool>(),
        any::<bool>(),
        prop::option::weighted(0.3, any::<prop::sample::Index>()),
        0..3usize,
        any::<bool>(),
    )
        .prop_map(
            |(loops, thinking, split, compaction, mode, cache)| HistorySpec {
                loops,
                thinking,
                split,
                compaction,
                mode,
                cache,
            },
        )
}

fn mode(spec: &HistorySpec) -> ThinkingMode {
    [
        ThinkingMode::Keep,
        ThinkingMode::Strip,
        ThinkingMode::Enabled,
    ][spec.mode]
}

// ---------------------------------------------------------------------------------------------
// Building the stored entries

const B64: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

fn base64(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(B64[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// A 1×1 PNG (bytes after IEND make it unique, so each image can be found in the output).
fn png(n: u64) -> String {
    let mut bytes = decode_base64_prefix(PNG_1PX, 1 << 20).expect("PNG_1PX is base64");
    bytes.extend_from_slice(format!("loupe-{n}").as_bytes());
    base64(&bytes)
}

/// A minimal PDF, unique by a trailing comment.
fn pdf(n: u64) -> String {
    let mut bytes = decode_base64_prefix(PDF_STUB, 1 << 20).expect("PDF_STUB is base64");
    bytes.extend_from_slice(format!("%loupe-{n}\n").as_bytes());
    base64(&bytes)
}

#[derive(Default)]
struct Builder {
    n: u64,
    entries: Vec<Entry>,
    thinking: bool,
    split: bool,
}

impl Builder {
    fn next(&mut self) -> u64 {
        self.n += 1;
        self.n
    }

    /// A unique, model-readable string: `[prefix12] body`.
    fn text(&mut self, prefix: &str, body: &str) -> String {
        let n = self.next();
        format!("[{prefix}{n}] {body}")
    }

    fn url(&mut self, host: &str, file: &str) -> String {
        let n = self.next();
        format!("https://{host}.example.com/{n}/{file}")
    }

    fn id(&mut self, prefix: &str) -> String {
        let n = self.next();
        format!("{prefix}{n:020}")
    }

    fn entry(&mut self, kind: EntryKind, message: ApiMessage) -> Entry {
        let n = self.next();
        let mut e = Entry::new(kind);
        e.uuid = Some(format!("5e1d{n:04x}-7a2b-4c3d-8e4f-{n:012x}"));
        e.message = Some(message);
        e
    }

    fn user(&mut self, blocks: Vec<Value>) {
        let e = self.entry(
            EntryKind::User,
            ApiMessage::new(Role::User, Content::Blocks(blocks)),
        );
        self.entries.push(e);
    }

    /// One response: one entry, or one per block when streamed.
    fn respond(&mut self, blocks: Vec<Value>, stop: &str) {
        let id = self.id("msg_01");
        let parts: Vec<Vec<Value>> = if self.split {
            blocks.into_iter().map(|b| vec![b]).collect()
        } else {
            vec![blocks]
        };
        let last = parts.len() - 1;
        for (i, part) in parts.into_iter().enumerate() {
            let mut m = ApiMessage::new(Role::Assistant, Content::Blocks(part));
            m.id = Some(id.clone());
            m.model = Some(MODEL.to_string());
            m.stop_reason = (i == last).then(|| stop.to_string());
            let e = self.entry(EntryKind::Assistant, m);
            self.entries.push(e);
        }
    }

    fn thinking(&mut self, body: &str) -> Value {
        let t = self.text("th", body);
        let n = self.next();
        json!({"type": "thinking", "thinking": t, "signature": format!("EqQBCkYIBxgCKkD{n}sig")})
    }

    /// The signed thinking a response opens with, when the history thinks.
    fn opening(&mut self) -> Vec<Value> {
        if self.thinking {
            vec![self.thinking("Let me work out what is asked.")]
        } else {
            Vec::new()
        }
    }

    fn image(&mut self, how: Media) -> Value {
        let source = match how {
            Media::ImageUrl => json!({"type": "url", "url": self.url("img", "chart.png")}),
            Media::ImageFile => json!({"type": "file", "file_id": self.id("file_011")}),
            _ => {
                let n = self.next();
                json!({"type": "base64", "media_type": "image/png", "data": png(n)})
            }
        };
        json!({"type": "image", "source": source})
    }

    fn pdf_document(&mut self) -> Value {
        let n = self.next();
        let title = self.text("dt", "Quarterly report");
        json!({"type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": pdf(n)}, "title": title})
    }

    fn search_result(&mut self) -> Value {
        let title = self.text("st", "Configuring the runtime");
        let source = self.url("kb", "runtime");
        let body = self.text("sb", "Set worker_threads to the number of cores.");
        json!({"type": "search_result", "title": title, "source": source, "content": [{"type": "text", "text": body}], "citations": {"enabled": true}})
    }

    fn media(&mut self, m: Media) -> Value {
        match m {
            Media::ImageBase64 | Media::ImageUrl | Media::ImageFile => self.image(m),
            Media::PdfBase64 => self.pdf_document(),
            Media::TextDocument => {
                let data = self.text("dd", "The service listens on port 8080.");
                let title = self.text("dt", "README");
                let context = self.text("dc", "The project's readme");
                json!({"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": data}, "title": title, "context": context, "citations": {"enabled": true}})
            }
            Media::ContentDocument => {
                let a = self.text("dd", "Section one.");
                let b = self.text("dd", "Section two.");
                let title = self.text("dt", "Notes");
                json!({"type": "document", "source": {"type": "content", "content": [{"type": "text", "text": a}, {"type": "text", "text": b}]}, "title": title})
            }
            Media::PdfUrl => {
                json!({"type": "document", "source": {"type": "url", "url": self.url("docs", "spec.pdf")}})
            }
            Media::DocumentFile => {
                let title = self.text("dt", "Contract");
                json!({"type": "document", "source": {"type": "file", "file_id": self.id("file_011")}, "title": title})
            }
            Media::SearchResult => self.search_result(),
            Media::ContainerUpload => {
                json!({"type": "container_upload", "file_id": self.id("file_011")})
            }
        }
    }

    /// Citations of the prompt's documents and search results, as the API returns them.
    fn citations(&mut self, media: &[Media]) -> Vec<Value> {
        let mut out = Vec::new();
        let mut document = 0;
        for m in media {
            let cited = self.text("ct", "quoted words");
            match m {
                Media::TextDocument => out.push(json!({"type": "char_location", "cited_text": cited, "document_index": document, "document_title": null, "start_char_index": 0, "end_char_index": 12})),
                Media::PdfBase64 | Media::PdfUrl | Media::DocumentFile => out.push(json!({"type": "page_location", "cited_text": cited, "document_index": document, "document_title": null, "start_page_number": 1, "end_page_number": 2})),
                Media::ContentDocument => out.push(json!({"type": "content_block_location", "cited_text": cited, "document_index": document, "document_title": null, "start_block_index": 0, "end_block_index": 1})),
                Media::SearchResult => out.push(json!({"type": "search_result_location", "cited_text": cited, "search_result_index": 0, "source": "https://kb.example.com/cited", "title": null, "start_block_index": 0, "end_block_index": 1})),
                _ => {}
            }
            if matches!(
                m,
                Media::TextDocument
                    | Media::PdfBase64
                    | Media::PdfUrl
                    | Media::DocumentFile
                    | Media::ContentDocument
            ) {
                document += 1;
            }
        }
        out
    }

    fn tool_result(&mut self, id: &str, r: Returned) -> Value {
        let text = self.text("tr", "exit 0");
        let block = json!({"type": "text", "text": text});
        match r {
            Returned::String => json!({"type": "tool_result", "tool_use_id": id, "content": text}),
            Returned::Text => json!({"type": "tool_result", "tool_use_id": id, "content": [block]}),
            Returned::Image => {
                let image = self.image(Media::ImageBase64);
                json!({"type": "tool_result", "tool_use_id": id, "content": [block, image]})
            }
            Returned::Document => {
                let doc = self.pdf_document();
                json!({"type": "tool_result", "tool_use_id": id, "content": [block, doc]})
            }
            Returned::SearchResult => {
                let sr = self.search_result();
                json!({"type": "tool_result", "tool_use_id": id, "content": [sr]})
            }
            Returned::Browser => {
                let title = self.text("bt", "Dashboard");
                let url = self.url("app", "dashboard");
                let state = json!({"type": "browser_state", "tabs": [{"tab_id": "tab_1", "title": title, "url": url, "active": true}]});
                json!({"type": "tool_result", "tool_use_id": id, "toolset_name": "browser", "content": [block, state]})
            }
        }
    }

    fn tool_use(&mut self, r: Returned) -> Value {
        let id = self.id("toolu_01");
        if r == Returned::Browser {
            let url = self.url("app", "login");
            return json!({"type": "tool_use", "id": id, "name": "navigate", "toolset_name": "browser", "input": {"url": url}});
        }
        let command = self.text("in", "cargo test --quiet");
        json!({"type": "tool_use", "id": id, "name": "Bash", "input": {"command": command, "timeout": 120000}})
    }

    /// A server tool call and its result (the blocks of one response).
    fn server(&mut self, s: Server) -> Vec<Value> {
        let id = self.id("srvtoolu_01");
        match s {
            Server::WebSearch => {
                let query = self.text("q", "tokio runtime worker threads");
                let title = self.text("wt", "Tokio runtime docs");
                let url = self.url("docs", "tokio-runtime");
                let n = self.next();
                vec![
                    json!({"type": "server_tool_use", "id": id, "name": "web_search", "input": {"query": query}}),
                    json!({"type": "web_search_tool_result", "tool_use_id": id, "content": [{"type": "web_search_result", "title": title, "url": url, "encrypted_content": format!("EqgfCioIARgB{n}enc"), "page_age": "3 days ago"}]}),
                    json!({"type": "text", "text": self.text("a", "The runtime uses one worker per core."), "citations": [{"type": "web_search_result_location", "cited_text": self.text("ct", "one worker per core"), "url": url, "title": title, "encrypted_index": format!("Eo8BCioIAhgB{n}idx")}]}),
                ]
            }
            Server::WebFetch => {
                let url = self.url("blog", "post");
                let title = self.text("ft", "Release notes");
                let data = self.text("fd", "Version 2 removes the legacy API.");
                vec![
                    json!({"type": "server_tool_use", "id": id, "name": "web_fetch", "input": {"url": url}}),
                    json!({"type": "web_fetch_tool_result", "tool_use_id": id, "content": {"type": "web_fetch_result", "url": url, "retrieved_at": "2026-12-01T10:00:00Z", "content": {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": data}, "title": title, "citations": {"enabled": true}}}}),
                    json!({"type": "text", "text": self.text("a", "Version 2 drops the legacy API.")}),
                ]
            }
            Server::CodeExecution => {
                let code = self.text("code", "print(sum(range(10)))");
                let stdout = self.text("out", "45");
                let stderr = self.text("err", "DeprecationWarning: old API");
                vec![
                    json!({"type": "server_tool_use", "id": id, "name": "code_execution", "input": {"code": code}}),
                    json!({"type": "code_execution_tool_result", "tool_use_id": id, "content": {"type": "code_execution_result", "stdout": stdout, "stderr": stderr, "return_code": 0, "content": []}}),
                    json!({"type": "text", "text": self.text("a", "The sum is 45.")}),
                ]
            }
            Server::BashCodeExecution => {
                let command = self.text("cmd", "ls -la /tmp");
                let stdout = self.text("out", "total 0");
                vec![
                    json!({"type": "server_tool_use", "id": id, "name": "bash_code_execution", "input": {"command": command}}),
                    json!({"type": "bash_code_execution_tool_result", "tool_use_id": id, "content": {"type": "bash_code_execution_result", "stdout": stdout, "stderr": "", "return_code": 0, "content": []}}),
                    json!({"type": "text", "text": self.text("a", "The directory is empty.")}),
                ]
            }
            Server::TextEditorCodeExecution => {
                let path = format!("/tmp/{}.py", self.id("notes_"));
                let content = self.text("view", "def main(): pass");
                vec![
                    json!({"type": "server_tool_use", "id": id, "name": "text_editor_code_execution", "input": {"command": "view", "path": path}}),
                    json!({"type": "text_editor_code_execution_tool_result", "tool_use_id": id, "content": {"type": "text_editor_code_execution_view_result", "content": content, "file_type": "text", "num_lines": 1, "start_line": 1, "total_lines": 1}}),
                    json!({"type": "text", "text": self.text("a", "The file defines main.")}),
                ]
            }
            Server::ToolSearch => {
                let query = self.text("q", "create an issue");
                let found = format!("github_create_issue_{}_x", self.next());
                vec![
                    json!({"type": "server_tool_use", "id": id, "name": "tool_search_tool_regex", "input": {"query": query}}),
                    json!({"type": "tool_search_tool_result", "tool_use_id": id, "content": {"type": "tool_search_tool_search_result", "tool_references": [{"type": "tool_reference", "tool_name": found}]}}),
                    json!({"type": "text", "text": self.text("a", "A tool to create issues exists.")}),
                ]
            }
            Server::Mcp => {
                let id = self.id("mcptoolu_01");
                let name = format!("list_issues_{}_x", self.next());
                let server = format!("github_{}_x", self.next());
                let repo = self.text("in", "acme/loupe");
                let result = self.text("mr", "#12 Crash on empty history");
                vec![
                    json!({"type": "mcp_tool_use", "id": id, "name": name, "server_name": server, "input": {"repo": repo}}),
                    json!({"type": "mcp_tool_result", "tool_use_id": id, "is_error": false, "content": [{"type": "text", "text": result}]}),
                    json!({"type": "text", "text": self.text("a", "One open issue.")}),
                ]
            }
            Server::Advisor => {
                let advice = self.text("adv", "Check the error path before the happy path.");
                vec![
                    json!({"type": "server_tool_use", "id": id, "name": "advisor", "input": {}}),
                    json!({"type": "advisor_tool_result", "tool_use_id": id, "content": {"type": "advisor_result", "text": advice}}),
                    json!({"type": "text", "text": self.text("a", "Following the advice.")}),
                ]
            }
        }
    }

    fn history(spec: &HistorySpec) -> Vec<Entry> {
        let mut b = Builder {
            thinking: spec.thinking,
            split: spec.split,
            ..Builder::default()
        };
        let compacted = spec.compaction.map(|i| i.index(spec.loops.len()));
        for (li, l) in spec.loops.iter().enumerate() {
            let mut prompt =
                vec![json!({"type": "text", "text": b.text("u", "Please look into this.")})];
            for m in &l.media {
                prompt.push(b.media(*m));
            }
            b.user(prompt);
            let mut steps = l.steps.clone();
            if matches!(steps.last(), Some(Step::Tools(_))) {
                steps.push(Step::Text { citations: false });
            }
            for (si, s) in steps.iter().enumerate() {
                let mut blocks = Vec::new();
                if compacted == Some(li) && si == 0 {
                    let summary = b.text(
                        "cmp",
                        "Summary: the user asked to fix the build; tests pass now.",
                    );
                    let n = b.next();
                    blocks.push(json!({"type": "compaction", "content": summary, "signature": format!("EpcCCkgIChgC{n}cmp")}));
                }
                match s {
                    Step::Text { citations } => {
                        blocks.extend(b.opening());
                        let text = b.text("a", "Here is what I found.");
                        let cites = if *citations {
                            b.citations(&l.media)
                        } else {
                            Vec::new()
                        };
                        if cites.is_empty() {
                            blocks.push(json!({"type": "text", "text": text}));
                        } else {
                            blocks.push(json!({"type": "text", "text": text, "citations": cites}));
                        }
                        b.respond(blocks, "end_turn");
                    }
                    Step::Tools(returned) => {
                        blocks.extend(b.opening());
                        blocks.push(json!({"type": "text", "text": b.text("a", "Let me check.")}));
                        let uses: Vec<Value> = returned.iter().map(|r| b.tool_use(*r)).collect();
                        let results: Vec<Value> = uses
                            .iter()
                            .zip(returned)
                            .map(|(u, r)| b.tool_result(u["id"].as_str().unwrap_or_default(), *r))
                            .collect();
                        blocks.extend(uses);
                        b.respond(blocks, "tool_use");
                        b.user(results);
                    }
                    Step::Server(s) => {
                        blocks.extend(b.opening());
                        blocks.extend(b.server(*s));
                        b.respond(blocks, "end_turn");
                    }
                    Step::Programmatic => {
                        blocks.extend(b.opening());
                        let server = b.id("srvtoolu_01");
                        let code = b.text(
                            "code",
                            "rows = await query_db('select 1'); print(len(rows))",
                        );
                        let call = b.id("toolu_01");
                        let sql = b.text("in", "select count(*) from orders");
                        blocks.push(json!({"type": "text", "text": b.text("a", "I will script the queries.")}));
                        blocks.push(json!({"type": "server_tool_use", "id": server, "name": "code_execution", "input": {"code": code}}));
                        blocks.push(json!({"type": "tool_use", "id": call, "name": "query_db", "input": {"sql": sql}, "caller": {"type": "code_execution_20250825", "tool_id": server}}));
                        b.respond(blocks, "tool_use");
                        let rows = b.text("tr", "count = 3");
                        b.user(vec![
                            json!({"type": "tool_result", "tool_use_id": call, "content": rows}),
                        ]);
                        let stdout = b.text("out", "3");
                        let deferred = json!({"type": "code_execution_tool_result", "tool_use_id": server, "content": {"type": "code_execution_result", "stdout": stdout, "stderr": "", "return_code": 0, "content": []}});
                        let text =
                            json!({"type": "text", "text": b.text("a", "There are 3 orders.")});
                        b.respond(vec![deferred, text], "end_turn");
                    }
                    Step::Fallback => {
                        let first = b.thinking("The request looks risky; stepping back.");
                        let second = b.thinking("Answering with the fallback model.");
                        blocks.push(first);
                        blocks.push(json!({"type": "fallback", "from": {"model": MODEL}, "to": {"model": FALLBACK_MODEL}, "trigger": {"type": "refusal", "category": null}}));
                        blocks.push(second);
                        blocks.push(
                            json!({"type": "text", "text": b.text("a", "Here is a safer answer.")}),
                        );
                        b.respond(blocks, "end_turn");
                    }
                }
            }
        }
        for (i, e) in b.entries.iter_mut().enumerate() {
            e.seq = Some(i as i64);
        }
        b.entries
    }
}

// ---------------------------------------------------------------------------------------------
// The stored blocks, and what each must leave in the output

struct Item {
    seq: i64,
    /// `image(url)`, `tool_result>search_result`, `server_tool_use(web_fetch)`, …
    label: String,
    block: Value,
    /// The model-readable strings it carries.
    strings: Vec<String>,
}

fn str_of<'a>(v: &'a Value, key: &str) -> Option<&'a str> {
    v.get(key)
        .and_then(Value::as_str)
        .filter(|s| !s.trim().is_empty())
}

fn leaves(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::String(s) if !s.trim().is_empty() => out.push(s.clone()),
        Value::Array(a) => a.iter().for_each(|x| leaves(x, out)),
        Value::Object(o) => o.values().for_each(|x| leaves(x, out)),
        _ => {}
    }
}

fn texts_of(content: &Value, out: &mut Vec<String>) {
    match content {
        Value::String(s) => out.push(s.clone()),
        Value::Array(a) => {
            for b in a {
                out.extend(str_of(b, "text").map(str::to_string));
            }
        }
        _ => {}
    }
}

fn items_of(block: &Value, seq: i64, prefix: &str, out: &mut Vec<Item>) {
    let ty = block["type"].as_str().unwrap_or("?");
    let mut strings = Vec::new();
    let mut label = ty.to_string();
    match ty {
        "text" => {
            strings.extend(str_of(block, "text").map(str::to_string));
            if block.get("citations").is_some() {
                label = "text(citations)".into();
            }
        }
        "thinking" => strings.extend(str_of(block, "thinking").map(str::to_string)),
        "image" | "document" => {
            let source = &block["source"];
            let kind = source["type"].as_str().unwrap_or("?");
            label = match (ty, kind) {
                ("document", "base64") => "document(base64 pdf)".into(),
                ("document", "url") => "document(url pdf)".into(),
                _ => format!("{ty}({kind})"),
            };
            for key in ["title", "context"] {
                strings.extend(str_of(block, key).map(str::to_string));
            }
            match kind {
                "url" => strings.extend(str_of(source, "url").map(str::to_string)),
                "text" => strings.extend(str_of(source, "data").map(str::to_string)),
                "content" => texts_of(&source["content"], &mut strings),
                _ => {}
            }
        }
        "search_result" => {
            for key in ["title", "source"] {
                strings.extend(str_of(block, key).map(str::to_string));
            }
            texts_of(&block["content"], &mut strings);
        }
        "tool_use" | "server_tool_use" | "mcp_tool_use" => {
            for key in ["name", "server_name"] {
                strings.extend(str_of(block, key).map(str::to_string));
            }
            leaves(&block["input"], &mut strings);
            if ty == "server_tool_use" {
                label = format!("server_tool_use({})", block["name"].as_str().unwrap_or("?"));
            } else if block.get("caller").is_some() {
                label = "tool_use(caller)".into();
            } else if block.get("toolset_name").is_some() {
                label = "tool_use(browser)".into();
            }
        }
        "tool_result" => match &block["content"] {
            Value::String(s) => strings.push(s.clone()),
            Value::Array(a) => {
                for nested in a {
                    items_of(nested, seq, "tool_result>", out);
                }
            }
            _ => {}
        },
        "web_search_tool_result" => {
            for r in block["content"].as_array().into_iter().flatten() {
                for key in ["title", "url"] {
                    strings.extend(str_of(r, key).map(str::to_string));
                }
            }
        }
        "web_fetch_tool_result" => {
            let c = &block["content"];
            strings.extend(str_of(c, "url").map(str::to_string));
            strings.extend(str_of(&c["content"], "title").map(str::to_string));
            strings.extend(str_of(&c["content"]["source"], "data").map(str::to_string));
        }
        "code_execution_tool_result" | "bash_code_execution_tool_result" => {
            for key in ["stdout", "stderr"] {
                strings.extend(str_of(&block["content"], key).map(str::to_string));
            }
        }
        "text_editor_code_execution_tool_result" => {
            strings.extend(str_of(&block["content"], "content").map(str::to_string));
        }
        "tool_search_tool_result" => {
            for r in block["content"]["tool_references"]
                .as_array()
                .into_iter()
                .flatten()
            {
                strings.extend(str_of(r, "tool_name").map(str::to_string));
            }
        }
        "mcp_tool_result" => texts_of(&block["content"], &mut strings),
        "advisor_tool_result" => {
            strings.extend(str_of(&block["content"], "text").map(str::to_string))
        }
        "compaction" => strings.extend(str_of(block, "content").map(str::to_string)),
        "browser_state" => {
            for tab in block["tabs"].as_array().into_iter().flatten() {
                for key in ["title", "url"] {
                    strings.extend(str_of(tab, key).map(str::to_string));
                }
            }
        }
        // fallback, container_upload, redacted_thinking: nothing a model reads.
        _ => {}
    }
    out.push(Item {
        seq,
        label: format!("{prefix}{label}"),
        block: block.clone(),
        strings: strings.iter().map(|s| s.trim().to_string()).collect(),
    });
}

/// What a model reads of the history: everything from its last server-side `compaction` block
/// on (the block stands for what came before it, for every provider).
fn inventory(entries: &[Entry]) -> Vec<Item> {
    let is_compaction = |b: &Value| b["type"] == "compaction" && b["content"].is_string();
    let from = entries
        .iter()
        .rposition(|e| {
            e.message
                .as_ref()
                .is_some_and(|m| m.content.to_blocks().iter().any(is_compaction))
        })
        .unwrap_or(0);
    let mut out = Vec::new();
    for (i, e) in entries.iter().enumerate().skip(from) {
        let Some(m) = &e.message else { continue };
        let seq = e.seq.unwrap_or_default();
        let blocks = m.content.to_blocks();
        let first = if i == from {
            blocks.iter().rposition(is_compaction).unwrap_or(0)
        } else {
            0
        };
        for b in &blocks[first..] {
            items_of(b, seq, "", &mut out);
        }
    }
    out
}

// ---------------------------------------------------------------------------------------------
// The output, flattened

/// Every string value of the output, by key, by `parentKey.key` and by `type.key`
/// (`image_url.url`, `inlineData.data`, `function_call_output.call_id`, …), and every Anthropic
/// block (tool result content too) without `cache_control`.
#[derive(Default)]
struct Flat {
    pairs: std::collections::HashSet<(String, String)>,
    blocks: Vec<Value>,
    json: String,
}

impl Flat {
    fn has(&self, key: &str, value: &str) -> bool {
        self.pairs.contains(&(key.to_string(), value.to_string()))
    }
}

fn flatten(messages: &[Value], anthropic: bool) -> Flat {
    fn walk(v: &Value, parent: &str, flat: &mut Flat) {
        match v {
            Value::Array(a) => a.iter().for_each(|x| walk(x, parent, flat)),
            Value::Object(o) => {
                let ty = o.get("type").and_then(Value::as_str).unwrap_or("");
                for (k, x) in o {
                    if let Value::String(s) = x {
                        flat.pairs.insert((k.clone(), s.clone()));
                        if !parent.is_empty() {
                            flat.pairs.insert((format!("{parent}.{k}"), s.clone()));
                        }
                        if !ty.is_empty() {
                            flat.pairs.insert((format!("{ty}.{k}"), s.clone()));
                        }
                    }
                    walk(x, k, flat);
                }
            }
            _ => {}
        }
    }
    fn blocks(content: &Value, out: &mut Vec<Value>) {
        for b in content.as_array().into_iter().flatten() {
            let mut b = b.clone();
            if let Some(o) = b.as_object_mut() {
                o.remove("cache_control");
            }
            if b["type"] == "tool_result" {
                blocks(&b["content"], out);
            }
            out.push(b);
        }
    }
    let mut flat = Flat::default();
    for m in messages {
        walk(m, "", &mut flat);
        if anthropic {
            blocks(&m["content"], &mut flat.blocks);
        }
    }
    flat.json = serde_json::to_string(messages).unwrap_or_default();
    flat
}

fn data_url(block: &Value) -> Option<String> {
    let s = &block["source"];
    Some(format!(
        "data:{};base64,{}",
        s["media_type"].as_str()?,
        s["data"].as_str()?
    ))
}

/// Whether a stored block reaches the output in the provider's own form.
fn native(item: &Item, provider: &Provider, flat: &Flat) -> bool {
    let b = &item.block;
    let ty = b["type"].as_str().unwrap_or("");
    let source = &b["source"];
    let kind = source["type"].as_str().unwrap_or("");
    let id = b["id"].as_str().unwrap_or("");
    let use_id = b["tool_use_id"].as_str().unwrap_or("");
    if ty == "text" {
        return item.strings.iter().all(|s| flat.json.contains(&escaped(s)));
    }
    match provider {
        Provider::Anthropic => {
            let mut stored = b.clone();
            if let Some(o) = stored.as_object_mut() {
                o.remove("cache_control");
            }
            if ty == "tool_result" {
                return flat
                    .blocks
                    .iter()
                    .any(|o| o["type"] == "tool_result" && o["tool_use_id"] == use_id);
            }
            flat.blocks.contains(&stored)
        }
        Provider::Openai => match (ty, kind) {
            ("image", "base64") => data_url(b).is_some_and(|u| flat.has("image_url.url", &u)),
            ("image", "url") => flat.has("image_url.url", source["url"].as_str().unwrap_or("")),
            ("document", "base64") => data_url(b).is_some_and(|u| flat.has("file.file_data", &u)),
            ("tool_use", _) => {
                flat.has("function.name", b["name"].as_str().unwrap_or("")) && flat.has("id", id)
            }
            ("tool_result", _) => flat.has("tool_call_id", use_id),
            _ => false,
        },
        Provider::OpenaiResponses => match (ty, kind) {
            ("image", "base64") => {
                data_url(b).is_some_and(|u| flat.has("input_image.image_url", &u))
            }
            ("image", "url") => flat.has(
                "input_image.image_url",
                source["url"].as_str().unwrap_or(""),
            ),
            ("document", "base64") => {
                data_url(b).is_some_and(|u| flat.has("input_file.file_data", &u))
            }
            ("document", "url") => {
                flat.has("input_file.file_url", source["url"].as_str().unwrap_or(""))
            }
            ("tool_use", _) => flat.has("function_call.call_id", id),
            ("tool_result", _) => flat.has("function_call_output.call_id", use_id),
            _ => false,
        },
        Provider::Gemini => match (ty, kind) {
            ("image" | "document", "base64") => {
                flat.has("inlineData.data", source["data"].as_str().unwrap_or(""))
            }
            ("image" | "document", "url") => {
                flat.has("fileData.fileUri", source["url"].as_str().unwrap_or(""))
            }
            ("tool_use", _) => flat.has("functionCall.id", id),
            ("tool_result", _) => flat.has("functionResponse.id", use_id),
            _ => false,
        },
    }
}

fn escaped(s: &str) -> String {
    let quoted = serde_json::to_string(s).unwrap_or_default();
    quoted[1..quoted.len() - 1].to_string()
}

/// Repairs that change no content: a block they name may still have been lost unreported.
fn structural(kind: &RepairKind) -> bool {
    matches!(
        kind,
        RepairKind::FragmentsMerged
            | RepairKind::UserMessagesMerged
            | RepairKind::ToolResultHoisted
            | RepairKind::AttachmentMoved
            | RepairKind::ToolIdRewritten
            | RepairKind::ToolNameRewritten
            | RepairKind::LeadingUserInserted
            | RepairKind::PlaceholderTurnInserted
    )
}

/// Thinking may go where the request cannot take it: another provider, or `thinking=strip`.
fn may_drop(item: &Item, provider: &Provider, mode: &ThinkingMode) -> bool {
    let ty = item.block["type"].as_str().unwrap_or("");
    (ty == "thinking" || ty == "redacted_thinking")
        && (!matches!(provider, Provider::Anthropic) || matches!(mode, ThinkingMode::Strip))
}

// ---------------------------------------------------------------------------------------------
// Running the checks

/// One finding: (check, block, provider) → what was wrong.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Key {
    check: &'static str,
    block: String,
    provider: &'static str,
    detail: String,
}

fn options(spec: &HistorySpec, provider: Provider) -> NormalizeOptions {
    NormalizeOptions {
        provider,
        thinking: mode(spec),
        cache: spec.cache,
        advisor: true,
        ..NormalizeOptions::default()
    }
}

/// The findings of checks b and c for one history.
fn strings_and_drops(spec: &HistorySpec) -> Vec<Key> {
    let entries = Builder::history(spec);
    let items = inventory(&entries);
    let mut out = Vec::new();
    for (provider, name) in providers() {
        let opts = options(spec, provider);
        let res: Normalized = normalize(&entries, &opts);
        let flat = flatten(&res.messages, matches!(opts.provider, Provider::Anthropic));
        for item in &items {
            if may_drop(item, &opts.provider, &opts.thinking) {
                continue;
            }
            for s in &item.strings {
                if !flat.json.contains(&escaped(s)) {
                    out.push(Key {
                        check: "b: string lost",
                        block: item.label.clone(),
                        provider: name,
                        detail: field_of(&item.block, s),
                    });
                }
            }
            let reported = res
                .repairs
                .iter()
                .any(|r| !structural(&r.kind) && r.seqs.contains(&item.seq));
            if !reported && !native(item, &opts.provider, &flat) {
                out.push(Key {
                    check: "c: not native, no repair",
                    block: item.label.clone(),
                    provider: name,
                    detail: String::new(),
                });
            }
        }
    }
    out.sort();
    out.dedup();
    out
}

/// The path of the field holding `s` in a stored block (`source.url`, `content.stdout`).
fn field_of(v: &Value, s: &str) -> String {
    fn find(v: &Value, s: &str, path: &str) -> Option<String> {
        match v {
            Value::String(x) if x.trim() == s => Some(path.to_string()),
            Value::Array(a) => a.iter().find_map(|x| find(x, s, &format!("{path}[]"))),
            Value::Object(o) => o.iter().find_map(|(k, x)| {
                let p = if path.is_empty() {
                    k.clone()
                } else {
                    format!("{path}.{k}")
                };
                find(x, s, &p)
            }),
            _ => None,
        }
    }
    find(v, s, "").unwrap_or_default()
}

fn cases() -> usize {
    std::env::var("FIDELITY_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(DEFAULT_CASES)
}

fn runner() -> TestRunner {
    TestRunner::new_with_rng(
        Config::default(),
        TestRng::from_seed(RngAlgorithm::ChaCha, &[34; 32]),
    )
}

/// The generated histories, each with its value tree (to shrink by).
fn generated() -> Vec<Box<dyn ValueTree<Value = HistorySpec>>> {
    let mut runner = runner();
    let strategy = history_spec().boxed();
    (0..cases())
        .map(|_| strategy.new_tree(&mut runner).expect("a history"))
        .collect()
}

fn shrink<T: ValueTree<Value = HistorySpec>>(tree: &mut T, key: &Key) -> HistorySpec {
    let fails = |spec: &HistorySpec| strings_and_drops(spec).contains(key);
    let mut smallest = tree.current();
    let mut steps = 0;
    if tree.simplify() {
        while steps < SHRINK_STEPS {
            steps += 1;
            let spec = tree.current();
            if fails(&spec) {
                smallest = spec;
                if !tree.simplify() {
                    break;
                }
            } else if !tree.complicate() {
                break;
            }
        }
    }
    smallest
}

fn dump(spec: &HistorySpec) -> String {
    let entries = Builder::history(spec);
    let lines: Vec<String> = entries
        .iter()
        .map(|e| serde_json::to_string(e).unwrap_or_default())
        .collect();
    format!(
        "thinking={:?} cache={}\n{}",
        mode(spec),
        spec.cache,
        lines.join("\n")
    )
}

fn table(findings: &BTreeMap<Key, (usize, String)>, total: usize) -> String {
    let mut out = format!(
        "{} finding kinds over {total} generated histories × 4 providers:\n",
        findings.len()
    );
    for (k, (n, _)) in findings {
        out += &format!(
            "  {} | {} | {} | {} | {n} histories\n",
            k.check, k.block, k.provider, k.detail
        );
    }
    out += "\nSmallest example of each:\n";
    for (k, (_, example)) in findings {
        out += &format!(
            "--- {} | {} | {} | {}\n{example}\n",
            k.check, k.block, k.provider, k.detail
        );
    }
    out
}

/// Checks b and c over the generated histories; each finding shrunk to a small history.
fn run_strings_and_drops(only: &str) -> Result<(), String> {
    let trees = generated();
    let total = trees.len();
    let mut findings: BTreeMap<Key, (usize, String)> = BTreeMap::new();
    let mut first: BTreeMap<Key, usize> = BTreeMap::new();
    for (i, tree) in trees.iter().enumerate() {
        for key in strings_and_drops(&tree.current()) {
            if !key.check.starts_with(only) {
                continue;
            }
            first.entry(key.clone()).or_insert(i);
            findings.entry(key).or_insert((0, String::new())).0 += 1;
        }
    }
    for (key, i) in first {
        // A fresh tree each time: shrinking moves the one it works on.
        let mut tree = generated().swap_remove(i);
        let smallest = shrink(&mut tree, &key);
        findings.get_mut(&key).expect("found").1 = dump(&smallest);
    }
    if findings.is_empty() {
        Ok(())
    } else {
        Err(table(&findings, total))
    }
}

fn python() -> String {
    let out = Command::new(format!("{ROOT}/scripts/pyenv.sh"))
        .output()
        .expect("run scripts/pyenv.sh (needs python3 and PyPI)");
    assert!(
        out.status.success(),
        "scripts/pyenv.sh failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// Runs `scripts/sdk_check.py` on the cases; its JSON summary.
fn sdk_check(cases: &[Value]) -> Value {
    let mut child = Command::new(python())
        .arg(format!("{ROOT}/scripts/sdk_check.py"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run scripts/sdk_check.py");
    let input = serde_json::to_vec(cases).unwrap();
    let mut stdin = child.stdin.take().expect("stdin");
    let writer = std::thread::spawn(move || stdin.write_all(&input));
    let out = child.wait_with_output().expect("sdk_check.py ran");
    writer.join().expect("writer").expect("cases written");
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "sdk_check.py printed no summary ({e}):\n{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

/// An SDK error without what varies between cases (indices, the input shown).
fn error_kind(error: &str) -> String {
    let error = error.split(" (input ").next().unwrap_or(error);
    let mut out = String::new();
    let mut digits = false;
    for c in error.chars() {
        if c.is_ascii_digit() {
            if !digits {
                out.push('N');
            }
            digits = true;
        } else {
            digits = false;
            out.push(c);
        }
    }
    out
}

fn short(v: &Value) -> String {
    let s = serde_json::to_string(v).unwrap_or_default();
    if s.chars().count() > 1500 {
        format!("{}…", s.chars().take(1500).collect::<String>())
    } else {
        s
    }
}

// ---------------------------------------------------------------------------------------------
// Tests

/// The checker itself: an unknown key (nested three levels down too), a wrong shape and a Python
/// field name on Gemini's wire are refused; known-good messages of every provider pass.
#[test]
fn the_sdk_checker_refuses_what_it_must() {
    let out = Command::new(python())
        .arg(format!("{ROOT}/scripts/sdk_check.py"))
        .arg("--selftest")
        .output()
        .expect("run sdk_check.py --selftest");
    assert!(
        out.status.success(),
        "sdk_check.py --selftest:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The tools a context offers (`zoom` and `search`, and the normalize endpoint's zoom) validate
/// with each provider's SDK tool type: Responses' `FunctionToolParam` requires `strict`, which
/// Responses reads as true when absent, making `search`'s optional `limit` required.
#[test]
fn loupes_tools_validate_with_the_providers_sdk() {
    let cases: Vec<Value> = providers()
        .into_iter()
        .map(|(provider, name)| {
            let mut tools = loupe::tree::view::navigation_tools(provider);
            tools.push(loupe::tree::view::zoom_tool(provider));
            json!({"name": format!("tools/{name}"), "provider": name, "messages": [],
                "tools": tools})
        })
        .collect();
    let summary = sdk_check(&cases);
    assert_eq!(summary["failures"], json!([]), "{summary:#}");
    assert_eq!(summary["checked"], json!(11), "{summary:#}");
}

/// a. Every output message or item validates with the provider's SDK request type.
#[test]
fn every_output_validates_with_the_providers_sdk() {
    let trees = generated();
    let mut cases = Vec::new();
    let mut outputs = BTreeMap::new();
    for (i, tree) in trees.iter().enumerate() {
        let spec = tree.current();
        let entries = Builder::history(&spec);
        for (provider, name) in providers() {
            let res = normalize(&entries, &options(&spec, provider));
            let case = format!("h{i}/{name}");
            cases.push(json!({"name": case, "provider": name, "messages": res.messages}));
            outputs.insert(case, (name, res.messages, spec.clone()));
        }
    }
    let summary = sdk_check(&cases);
    let mut findings: BTreeMap<Key, (usize, String)> = BTreeMap::new();
    for f in summary["failures"].as_array().into_iter().flatten() {
        let case = f["name"].as_str().unwrap_or_default();
        let index = f["index"].as_u64().unwrap_or_default() as usize;
        let (provider, messages, spec) = &outputs[case];
        let first = f["errors"][0].as_str().unwrap_or_default();
        let key = Key {
            check: "a: SDK refuses",
            block: messages[index]["type"]
                .as_str()
                .or(messages[index]["role"].as_str())
                .unwrap_or("?")
                .to_string(),
            provider,
            detail: error_kind(first),
        };
        let example = format!(
            "output [{index}] of a {}-entry history: {}\nerrors: {}",
            Builder::history(spec).len(),
            short(&messages[index]),
            f["errors"]
        );
        let e = findings.entry(key).or_insert((0, example.clone()));
        e.0 += 1;
        if example.len() < e.1.len() {
            e.1 = example;
        }
    }
    assert!(
        findings.is_empty(),
        "{}",
        table(&findings, trees.len()).replace("histories\n", "messages\n")
    );
    assert!(summary["checked"].as_u64().unwrap_or_default() > 0);
}

/// b. Every model-readable string stored is in the output, natively or rendered as text.
#[test]
fn model_readable_strings_survive() {
    if let Err(table) = run_strings_and_drops("b") {
        panic!("{table}");
    }
}

/// c. A block that does not reach the output in native form is named by a repair.
#[test]
fn blocks_not_sent_natively_are_reported() {
    if let Err(table) = run_strings_and_drops("c") {
        panic!("{table}");
    }
}

// ---------------------------------------------------------------------------------------------
// The table of docs/NORMALIZATION.md § Block fidelity, row by row

/// One row's history: the entries, the seqs whose blocks the row is about, and the provider
/// whose own block it is (sent as stored there).
struct Row {
    entries: Vec<Entry>,
    seqs: Vec<i64>,
    own: Provider,
}

fn stored(seq: i64, role: &str, content: Value) -> Entry {
    let mut message = json!({"role": role, "content": content});
    if role == "assistant" {
        message["id"] = json!(format!("msg_{seq}"));
        message["model"] = json!(MODEL);
    }
    serde_json::from_value(json!({"seq": seq, "uuid": format!("u{seq}"), "type": role,
        "message": message}))
    .expect("an entry")
}

/// A prompt holding `block`, answered.
fn prompt_with(block: Value) -> Row {
    Row {
        entries: vec![
            stored(
                0,
                "user",
                json!([{"type": "text", "text": "Look at this."}, block]),
            ),
            stored(1, "assistant", json!([{"type": "text", "text": "Seen."}])),
            stored(2, "user", json!("next")),
        ],
        seqs: vec![0],
        own: Provider::Anthropic,
    }
}

/// A response made of `blocks` and a closing text.
fn response_with(mut blocks: Vec<Value>) -> Row {
    blocks.push(json!({"type": "text", "text": "Done."}));
    Row {
        entries: vec![
            stored(0, "user", json!("go")),
            stored(1, "assistant", Value::Array(blocks)),
            stored(2, "user", json!("next")),
        ],
        seqs: vec![1],
        own: Provider::Anthropic,
    }
}

/// A tool call answered by a result whose content is `content`.
fn tool_call_returning(content: Value) -> Row {
    Row {
        entries: vec![
            stored(0, "user", json!("go")),
            stored(
                1,
                "assistant",
                json!([{"type": "tool_use", "id": "toolu_1", "name": "Read", "input": {"path": "a.md"}}]),
            ),
            stored(
                2,
                "user",
                json!([{"type": "tool_result", "tool_use_id": "toolu_1", "content": content}]),
            ),
            stored(
                3,
                "assistant",
                json!([{"type": "text", "text": "Read it."}]),
            ),
            stored(4, "user", json!("next")),
        ],
        seqs: vec![1, 2],
        own: Provider::Anthropic,
    }
}

/// A response that opens with `compaction` after an earlier exchange.
fn compacted_by(compaction: Value, own: Provider) -> Row {
    Row {
        entries: vec![
            stored(0, "user", json!("go")),
            stored(
                1,
                "assistant",
                json!([{"type": "text", "text": "A long first answer."}]),
            ),
            stored(2, "user", json!("more")),
            stored(
                3,
                "assistant",
                json!([compaction, {"type": "text", "text": "Continuing."}]),
            ),
            stored(4, "user", json!("next")),
        ],
        seqs: vec![3],
        own,
    }
}

fn row(name: &str) -> Row {
    let png = PNG_1PX;
    let pdf = PDF_STUB;
    let signed = |text: &str| json!({"type": "thinking", "thinking": text, "signature": format!("sig-{text}")});
    match name {
        "text" => prompt_with(json!({"type": "text", "text": "More text."})),
        "image (base64)" => prompt_with(
            json!({"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": png}}),
        ),
        "image (url)" => prompt_with(
            json!({"type": "image", "source": {"type": "url", "url": "https://example.com/cat.png"}}),
        ),
        "image (file)" => prompt_with(
            json!({"type": "image", "source": {"type": "file", "file_id": "file_011CImage"}}),
        ),
        "document (base64 pdf)" => prompt_with(json!({"type": "document", "title": "Paper",
            "source": {"type": "base64", "media_type": "application/pdf", "data": pdf}})),
        "document (url pdf)" => prompt_with(
            json!({"type": "document", "source": {"type": "url", "url": "https://example.com/paper.pdf"}}),
        ),
        "document (text)" => prompt_with(json!({"type": "document", "title": "Notes",
            "source": {"type": "text", "media_type": "text/plain", "data": "The notes."}})),
        "document (content)" => prompt_with(json!({"type": "document", "title": "Parts",
            "source": {"type": "content", "content": [{"type": "text", "text": "Part one."}]}})),
        "document (file)" => prompt_with(
            json!({"type": "document", "source": {"type": "file", "file_id": "file_011CDoc"}}),
        ),
        "search_result" => prompt_with(json!({"type": "search_result", "title": "Result",
            "source": "https://example.com/r", "content": [{"type": "text", "text": "Found."}]})),
        "tool_use + tool_result" => tool_call_returning(json!("contents of a.md")),
        "tool_result with an image" => {
            tool_call_returning(json!([{"type": "text", "text": "A chart:"},
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": png}}]))
        }
        "tool_result with browser_state" => {
            tool_call_returning(json!([{"type": "text", "text": "Opened."},
            {"type": "browser_state", "tabs": [{"tab_id": "t1", "title": "Login", "url": "https://app.example.com/login", "active": true}]}]))
        }
        "server_tool_use + web_search_tool_result" => response_with(vec![
            json!({"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search", "input": {"query": "rust"}}),
            json!({"type": "web_search_tool_result", "tool_use_id": "srvtoolu_1", "content": [{"type": "web_search_result",
                "title": "Rust", "url": "https://www.rust-lang.org/", "encrypted_content": "ENC"}]}),
        ]),
        "server_tool_use + code_execution_tool_result" => response_with(vec![
            json!({"type": "server_tool_use", "id": "srvtoolu_1", "name": "code_execution", "input": {"code": "print(6*7)"}}),
            json!({"type": "code_execution_tool_result", "tool_use_id": "srvtoolu_1", "content": {"type": "code_execution_result",
                "stdout": "42\n", "stderr": "", "return_code": 0, "content": []}}),
        ]),
        "mcp_tool_use + mcp_tool_result" => response_with(vec![
            json!({"type": "mcp_tool_use", "id": "mcptoolu_1", "name": "get_issue", "server_name": "tracker", "input": {"id": 7}}),
            json!({"type": "mcp_tool_result", "tool_use_id": "mcptoolu_1", "is_error": false,
                "content": [{"type": "text", "text": "Issue 7: crash on start."}]}),
        ]),
        "advisor_tool_result" => response_with(vec![
            json!({"type": "server_tool_use", "id": "srvtoolu_1", "name": "advisor", "input": {}}),
            json!({"type": "advisor_tool_result", "tool_use_id": "srvtoolu_1",
                "content": {"type": "advisor_result", "text": "Check the lock order."}}),
        ]),
        "container_upload" => response_with(vec![
            json!({"type": "container_upload", "file_id": "file_011CUp"}),
        ]),
        "compaction (Anthropic)" => compacted_by(
            json!({"type": "compaction", "content": "Summary so far."}),
            Provider::Anthropic,
        ),
        "compaction (Responses)" => compacted_by(
            json!({"type": "compaction", "id": "cmp_1", "encrypted_content": "gAAAA"}),
            Provider::OpenaiResponses,
        ),
        "fallback" => response_with(vec![
            signed("first"),
            json!({"type": "fallback", "from": {"model": MODEL}, "to": {"model": FALLBACK_MODEL}}),
            signed("second"),
        ]),
        "web_search_call (Responses)" => Row {
            own: Provider::OpenaiResponses,
            ..response_with(vec![
                json!({"type": "web_search_call", "id": "ws_1", "status": "completed",
                "action": {"type": "search", "query": "tokio select"}}),
            ])
        },
        "custom_tool_call + custom_tool_call_output (Responses)" => Row {
            entries: vec![
                stored(0, "user", json!("patch it")),
                stored(
                    1,
                    "assistant",
                    json!([{"type": "custom_tool_call", "call_id": "call_1",
                    "name": "apply_diff", "input": "--- a/x\n+++ b/x"}]),
                ),
                stored(
                    2,
                    "user",
                    json!([{"type": "custom_tool_call_output", "call_id": "call_1",
                    "output": "applied"}]),
                ),
                stored(
                    3,
                    "assistant",
                    json!([{"type": "text", "text": "Patched."}]),
                ),
                stored(4, "user", json!("next")),
            ],
            seqs: vec![1, 2],
            own: Provider::OpenaiResponses,
        },
        "item_reference (Responses)" => Row {
            own: Provider::OpenaiResponses,
            ..response_with(vec![json!({"type": "item_reference", "id": "ws_0123"})])
        },
        "executable_code + code_execution_result (Gemini)" => Row {
            own: Provider::Gemini,
            ..response_with(vec![
                json!({"type": "executable_code", "language": "PYTHON", "code": "print(2**10)"}),
                json!({"type": "code_execution_result", "outcome": "OUTCOME_OK", "output": "1024\n"}),
            ])
        },
        other => panic!("no sample history for the table row {other:?}"),
    }
}

/// What the provider's output made of the row's blocks, in the table's words.
fn outcome(row: &Row, provider: Provider) -> &'static str {
    let n = normalize(
        &row.entries,
        &NormalizeOptions {
            provider,
            ..NormalizeOptions::default()
        },
    );
    let named = |kinds: &[RepairKind]| {
        n.repairs
            .iter()
            .any(|r| kinds.contains(&r.kind) && r.seqs.iter().any(|s| row.seqs.contains(s)))
    };
    if named(&[RepairKind::BlockRenderedAsText]) {
        return "rendered";
    }
    if named(&[
        RepairKind::UnsupportedBlockDropped,
        RepairKind::AdvisorStripped,
    ]) {
        return "dropped";
    }
    let sent = serde_json::to_string(&n.messages).unwrap();
    // The row's blocks other than plain text (which every provider has a form for) as stored.
    let verbatim = row
        .entries
        .iter()
        .filter(|e| row.seqs.contains(&e.seq.unwrap()))
        .flat_map(|e| e.message.as_ref().unwrap().content.to_blocks())
        .filter(|b| b["type"] != "text")
        .all(|b| sent.contains(&serde_json::to_string(&b).unwrap()));
    if provider == row.own && verbatim {
        "kept"
    } else {
        "native"
    }
}

/// docs/NORMALIZATION.md § Block fidelity says what each block becomes for each provider; every
/// row holds for a history made of that block.
#[test]
fn the_block_fidelity_table_is_what_normalization_does() {
    let doc = std::fs::read_to_string(format!("{ROOT}/docs/NORMALIZATION.md")).unwrap();
    let section = doc
        .split("## Block fidelity")
        .nth(1)
        .expect("the Block fidelity section")
        .split("\n## ")
        .next()
        .unwrap();
    let rows: Vec<Vec<&str>> = section
        .lines()
        .filter(|l| l.starts_with('|') && !l.starts_with("|---") && !l.starts_with("| block"))
        .map(|l| l.trim_matches('|').split('|').map(str::trim).collect())
        .collect();
    assert!(rows.len() >= 20, "the table: {rows:?}");
    let mut wrong = Vec::new();
    let mut cases = Vec::new();
    for cells in &rows {
        let sample = row(cells[0]);
        for ((provider, name), said) in providers().into_iter().zip(&cells[1..]) {
            let messages = normalize(
                &sample.entries,
                &NormalizeOptions {
                    provider,
                    ..NormalizeOptions::default()
                },
            )
            .messages;
            cases.push(
                json!({"name": format!("{} × {name}", cells[0]), "provider": name,
                "messages": messages}),
            );
            let did = outcome(&sample, provider);
            if did != *said {
                wrong.push(format!(
                    "{} × {name}: the table says {said}, normalization {did}",
                    cells[0]
                ));
            }
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    // And every row's output is a request the provider's SDK types accept.
    let checked = sdk_check(&cases);
    assert_eq!(checked["failures"], json!([]), "{checked:#}");
}

// ---------------------------------------------------------------------------------------------
// Edges an adversarial review found: repeated and missing ids, output-only fields, malformed
// native parts and metadata

/// A client call made by code execution call `srvtoolu_1`.
fn ptc_call(id: &str) -> Value {
    json!({"type": "tool_use", "id": id, "name": "query_db", "input": {},
        "caller": {"type": "code_execution_20250825", "tool_id": "srvtoolu_1"}})
}

/// Each history with the texts every provider must still carry.
fn edge_histories() -> Vec<(&'static str, Vec<Entry>, Vec<&'static str>)> {
    let call = |input: &str| json!({"type": "custom_tool_call", "id": "ctc_1", "call_id": "call_1", "name": "apply_diff", "input": input});
    let output = |text: &str| json!({"type": "custom_tool_call_output", "call_id": "call_1", "output": text});
    vec![
        (
            "a Responses call repeated, and answered twice",
            vec![
                stored(0, "user", json!("fix")),
                stored(1, "assistant", json!([call("first diff")])),
                stored(2, "user", json!([output("applied once")])),
                stored(3, "assistant", json!([call("second diff")])),
                stored(4, "user", json!([output("applied twice"), output("again")])),
            ],
            vec![
                "first diff",
                "applied once",
                "second diff",
                "applied twice",
                "again",
            ],
        ),
        (
            "a Responses call id that a tool_use has, and one with none",
            vec![
                stored(0, "user", json!("fix")),
                stored(
                    1,
                    "assistant",
                    json!([{"type": "tool_use", "id": "call_1", "name": "Read", "input": {"path": "a"}}]),
                ),
                stored(
                    2,
                    "user",
                    json!([{"type": "tool_result", "tool_use_id": "call_1", "content": "file a"}]),
                ),
                stored(3, "assistant", json!([call("clashing diff")])),
                stored(4, "user", json!([output("clash applied")])),
                stored(
                    5,
                    "assistant",
                    json!([{"type": "custom_tool_call", "name": "apply_diff", "input": "no id diff"}]),
                ),
                stored(
                    6,
                    "user",
                    json!([{"type": "custom_tool_call_output", "output": "no id applied"}]),
                ),
            ],
            vec![
                "file a",
                "clashing diff",
                "clash applied",
                "no id diff",
                "no id applied",
            ],
        ),
        (
            "Responses items as the API returned them, output-only fields included",
            vec![
                stored(0, "user", json!("patch it")),
                stored(
                    1,
                    "assistant",
                    json!([{"type": "web_search_call", "id": "ws_1", "status": "completed",
                        "action": {"type": "search", "query": "serde flatten"}, "created_by": "resp_1"},
                    {"type": "web_search_call", "id": "ws_1", "status": "completed",
                        "action": {"type": "search", "query": "repeated search"}},
                    {"type": "custom_tool_call", "id": "ctc_9", "call_id": "call_9",
                        "name": "apply_diff", "input": "patch body", "created_by": "resp_1"}]),
                ),
                stored(
                    2,
                    "user",
                    json!([{"type": "custom_tool_call_output", "id": "ctco_9", "call_id": "call_9",
                        "output": "patched", "status": "completed", "created_by": "user_1"}]),
                ),
            ],
            vec!["serde flatten", "repeated search", "patch body", "patched"],
        ),
        (
            "Gemini code parts with a field or a value their types do not have",
            vec![
                stored(0, "user", json!("compute")),
                stored(
                    1,
                    "assistant",
                    json!([{"type": "executable_code", "language": ["PYTHON"], "code": "print(6*7)"},
                    {"type": "code_execution_result", "outcome": "OUTCOME_OK", "output": "42",
                        "exit_status": 0},
                    {"type": "executable_code", "language": "PYTHON", "code": "print(7*8)"},
                    {"type": "code_execution_result", "outcome": "OUTCOME_OK", "output": "56"}]),
                ),
                stored(2, "user", json!("thanks")),
            ],
            vec!["print(6*7)", "42", "print(7*8)", "56"],
        ),
        (
            "a programmatic chain whose second call repeats the first's id",
            vec![
                stored(0, "user", json!("count")),
                stored(
                    1,
                    "assistant",
                    json!([{"type": "server_tool_use", "id": "srvtoolu_1",
                    "name": "code_execution", "input": {"code": "rows = await q()"}}, ptc_call("toolu_1")]),
                ),
                stored(
                    2,
                    "user",
                    json!([{"type": "tool_result", "tool_use_id": "toolu_1", "content": "[1,2]"}]),
                ),
                stored(3, "assistant", json!([ptc_call("toolu_1")])),
                stored(
                    4,
                    "user",
                    json!([{"type": "tool_result", "tool_use_id": "toolu_1", "content": "[1,2]"}]),
                ),
                stored(
                    5,
                    "assistant",
                    json!([{"type": "code_execution_tool_result", "tool_use_id": "srvtoolu_1",
                    "content": {"type": "code_execution_result", "stdout": "3 rows", "stderr": "",
                        "return_code": 0, "content": []}}, {"type": "text", "text": "Three rows."}]),
                ),
                stored(6, "user", json!("thanks")),
            ],
            // The chain is broken where pairing removes the repeat: the code call and its
            // result go, reported (`server_tool_use_removed`), and the rest stays valid.
            vec!["[1,2]", "Three rows."],
        ),
        (
            "calls made by an advisor call, answered as code, and callers in no form",
            vec![
                stored(0, "user", json!("go")),
                stored(
                    1,
                    "assistant",
                    json!([{"type": "server_tool_use", "id": "srvtoolu_1", "name": "advisor",
                    "input": {}}, ptc_call("toolu_1")]),
                ),
                stored(
                    2,
                    "user",
                    json!([{"type": "tool_result", "tool_use_id": "toolu_1", "content": "advised rows"}]),
                ),
                stored(
                    3,
                    "assistant",
                    json!([{"type": "server_tool_use", "id": "srvtoolu_2", "name": "advisor",
                    "input": {}}, {"type": "code_execution_tool_result", "tool_use_id": "srvtoolu_2",
                    "content": {"type": "code_execution_result", "stdout": "OUT", "stderr": "",
                        "return_code": 0, "content": []}},
                    {"type": "tool_use", "id": "toolu_2", "name": "q", "input": {},
                        "caller": {"type": "code_execution_20250825", "tool_id": 123}},
                    {"type": "tool_use", "id": "toolu_3", "name": "q", "input": {}, "caller": null}]),
                ),
                stored(
                    4,
                    "user",
                    json!([{"type": "tool_result", "tool_use_id": "toolu_2", "content": "second rows"},
                    {"type": "tool_result", "tool_use_id": "toolu_3", "content": "third rows"}]),
                ),
                stored(5, "assistant", json!([{"type": "text", "text": "Done."}])),
                stored(6, "user", json!("thanks")),
            ],
            vec!["advised rows", "second rows", "third rows"],
        ),
        (
            "Responses items whose fields are not of their input types",
            vec![
                stored(0, "user", json!("go")),
                stored(
                    1,
                    "assistant",
                    json!([
                    {"type": "web_search_call", "id": "ws_1", "status": "completed",
                        "action": {"type": "search", "query": 5}},
                    {"type": "custom_tool_call", "id": "ctc_1", "call_id": "call_1", "name": "apply_diff",
                        "input": {"diff": "object diff"}},
                    {"type": "custom_tool_call", "id": "ctc_2", "call_id": "call_2", "name": "apply_diff",
                        "input": "listed diff"},
                    {"type": "local_shell_call", "id": "lsc_1", "call_id": "call_3", "status": "completed",
                        "action": {"type": "exec", "command": ["ls"], "env": {}}}]),
                ),
                stored(
                    2,
                    "user",
                    json!([
                    {"type": "custom_tool_call_output", "call_id": "call_1", "output": "object applied"},
                    {"type": "custom_tool_call_output", "call_id": "call_2", "output": [
                        {"type": "input_text", "text": "listed applied"},
                        {"type": "input_image", "image_url": "https://example.com/shot.png"}]},
                    {"type": "local_shell_call_output", "id": "call_3", "call_id": "call_3",
                        "output": "shell listing"}]),
                ),
                stored(3, "assistant", json!([{"type": "text", "text": "Done."}])),
                stored(4, "user", json!("next")),
            ],
            vec![
                "object diff",
                "object applied",
                "listed diff",
                "listed applied",
                "shell listing",
            ],
        ),
        (
            "a search result in a tool result without a title, its source a list",
            vec![
                stored(0, "user", json!("go")),
                stored(
                    1,
                    "assistant",
                    json!([{"type": "tool_use", "id": "toolu_1", "name": "s", "input": {}}]),
                ),
                stored(
                    2,
                    "user",
                    json!([{"type": "tool_result", "tool_use_id": "toolu_1", "content": [
                    {"type": "search_result", "title": null, "source": ["runbook.md"],
                        "content": [{"type": "text", "text": "restart the pods"}]}]}]),
                ),
                stored(3, "assistant", json!([{"type": "text", "text": "ok"}])),
                stored(4, "user", json!("next")),
            ],
            vec!["runbook.md", "restart the pods"],
        ),
        (
            "a document whose title and context are not text",
            vec![
                stored(
                    0,
                    "user",
                    json!([{"type": "document", "title": {"name": "Q3 report"}, "context": 2024,
                        "source": {"type": "text", "media_type": "text/plain", "data": "revenue rose"}},
                    {"type": "search_result", "title": ["Runbook"], "source": 7,
                        "content": [{"type": "text", "text": "restart the pods"}]}]),
                ),
                stored(1, "assistant", json!([{"type": "text", "text": "Read."}])),
                stored(2, "user", json!("next")),
            ],
            vec!["Q3 report", "revenue rose", "Runbook", "restart the pods"],
        ),
    ]
}

/// The edge histories pass every provider's SDK types and its rules, and keep what a model reads.
#[test]
fn edge_histories_stay_valid_and_whole() {
    let mut cases = Vec::new();
    let mut lost = Vec::new();
    for (name, entries, texts) in edge_histories() {
        for (provider, key) in providers() {
            let opts = NormalizeOptions {
                provider,
                ..NormalizeOptions::default()
            };
            let out = normalize(&entries, &opts);
            let sent = serde_json::to_string(&out.messages).unwrap();
            for text in &texts {
                if !sent.contains(text) {
                    lost.push(format!("{name} / {key}: lost {text:?}: {sent}"));
                }
            }
            let violations = match provider {
                Provider::Anthropic => loupe_validate::anthropic::validate(
                    &out.messages,
                    &loupe_validate::AnthropicRules::default(),
                ),
                Provider::Openai => loupe_validate::openai::validate(&out.messages),
                Provider::OpenaiResponses => loupe_validate::responses::validate(&out.messages),
                Provider::Gemini => loupe_validate::gemini::validate(&out.messages),
            };
            if !violations.is_empty() {
                lost.push(format!("{name} / {key}: {violations:?}: {sent}"));
            }
            cases.push(json!({"name": format!("{name} / {key}"), "provider": key,
                "messages": out.messages}));
        }
    }
    let summary = sdk_check(&cases);
    assert_eq!(summary["failures"], json!([]), "{summary:#}");
    assert!(lost.is_empty(), "{}", lost.join("\n"));
}
