//! Steps e (strip) and f: view entries → working messages, plus Loupe's block hygiene.

use std::collections::HashMap;

use serde_json::{Map, Value};

use super::blocks::{
    block_type, is_server_result, is_supported_type, preview, str_field, text_block, Compaction,
    THOUGHT_SIGNATURE,
};
use super::media::strip_media_types;
use super::native::native_block;
use super::view::compaction_applies;
use super::{Block, Ctx, Msg, NormalizeOptions, Provider, RepairKind, ThinkingMode};
use crate::history::model::{subtype, Content, Entry, EntryKind, Role};

/// Steps e/f — converts the view into working messages.
///
/// - `progress` and `system` entries are dropped (not reported: they never reach the model), except
///   `local_command`, whose `content` becomes a non-meta user text message.
/// - Synthetic API error assistants (`is_api_error`) are dropped.
/// - `attachment` entries become meta user messages (their `message.content`).
/// - Media named by an API error (see [`super::media::build_strip_map`]) are stripped; a message
///   left empty is dropped (`media_stripped`).
/// - Block hygiene, see [`sanitize_blocks`]. A user message left empty is dropped; an assistant
///   left empty by hygiene is dropped, one *stored* empty is kept (fixed in cleanup).
pub fn to_messages(
    entries: &[Entry],
    view: &[usize],
    strip: &HashMap<usize, Vec<&'static str>>,
    opts: &NormalizeOptions,
    ctx: &mut Ctx,
) -> Vec<Msg> {
    let mut out = Vec::with_capacity(view.len());
    for &i in view {
        let e = &entries[i];
        let src = i as u32;
        let (role, content) = match e.kind {
            EntryKind::Progress | EntryKind::Other => continue,
            EntryKind::System => {
                if e.subtype.as_deref() != Some(subtype::LOCAL_COMMAND) {
                    continue;
                }
                let blocks = match &e.content {
                    Some(Value::String(s)) => vec![text_block(s)],
                    Some(Value::Array(items)) => items.clone(),
                    Some(Value::Null) | None => continue,
                    Some(other) => vec![text_block(&other.to_string())],
                };
                let blocks: Vec<Block> = blocks.into_iter().map(|v| Block { v, src }).collect();
                let mut blocks = blocks;
                sanitize_blocks(&mut blocks, Role::User, opts, ctx);
                if !blocks.is_empty() {
                    out.push(Msg::new(Role::User, blocks, src));
                }
                continue;
            }
            EntryKind::Assistant if e.is_api_error => continue,
            EntryKind::Assistant => (Role::Assistant, e.message.as_ref()),
            EntryKind::User | EntryKind::Attachment => (Role::User, e.message.as_ref()),
        };
        let Some(message) = content else { continue };
        let mut blocks: Vec<Block> = match &message.content {
            Content::Text(t) => vec![Block {
                v: text_block(t),
                src,
            }],
            Content::Blocks(items) => items.iter().map(|v| Block { v: v.clone(), src }).collect(),
        };
        let stored_empty = blocks.is_empty();
        if let Some(types) = strip.get(&i) {
            let n = strip_media_types(&mut blocks, types);
            if n > 0 {
                let dropped = if blocks.is_empty() {
                    "; message dropped"
                } else {
                    ""
                };
                ctx.report(
                    RepairKind::MediaStripped,
                    [src],
                    format!(
                        "removed {n} {} block(s) named by an API error{dropped}",
                        types.join("/")
                    ),
                );
                if blocks.is_empty() {
                    continue;
                }
            }
        }
        // A server-side compaction: the blocks before it are what it summarizes.
        let at = (role == Role::Assistant)
            .then(|| {
                blocks
                    .iter()
                    .rposition(|b| compaction_applies(&b.v, opts.provider))
            })
            .flatten();
        let compaction = at.map(|at| {
            let kept = blocks.split_off(at);
            let mut rest = kept.into_iter();
            let block = rest.next().expect("the compaction block");
            blocks = rest.collect();
            block
        });
        sanitize_blocks(&mut blocks, role, opts, ctx);
        if let Some(block) = compaction {
            match super::blocks::compaction(&block.v) {
                // Another provider reads the summary as Loupe's own is read: a user turn.
                Some(Compaction::Summary(summary)) if opts.provider != Provider::Anthropic => {
                    let mut turn = Msg::text(Role::User, summary, src);
                    turn.is_meta = true;
                    out.push(turn);
                    ctx.report(
                        RepairKind::BlockRenderedAsText,
                        [src],
                        "server-side compaction summary sent as a user turn".to_owned(),
                    );
                    if blocks.is_empty() {
                        continue;
                    }
                }
                // Its own provider takes it first, as it was sent.
                _ => blocks.insert(0, block),
            }
        }
        if blocks.is_empty() {
            match role {
                Role::User => {
                    let why = if stored_empty {
                        "stored with empty content"
                    } else {
                        "no valid block left"
                    };
                    ctx.report(
                        RepairKind::EmptyMessageDropped,
                        [src],
                        format!("user message dropped: {why}"),
                    );
                    continue;
                }
                Role::Assistant if !stored_empty => continue,
                Role::Assistant => {}
            }
        }
        let mut msg = Msg::new(role, blocks, src);
        msg.is_meta = e.is_meta || e.kind == EntryKind::Attachment;
        if role == Role::Assistant {
            msg.id = message.id.clone();
        }
        out.push(msg);
    }
    out
}

/// Types that only belong in assistant turns.
fn assistant_only(v: &Value) -> bool {
    matches!(
        block_type(v),
        Some(
            "tool_use"
                | "server_tool_use"
                | "mcp_tool_use"
                | "thinking"
                | "redacted_thinking"
                | "reasoning"
                | "fallback"
        )
    ) || is_server_result(v)
        || native_block(v).is_some_and(|(_, in_response)| in_response)
}

/// Types that only belong in user turns.
fn user_only(v: &Value) -> bool {
    matches!(
        block_type(v),
        Some("tool_result" | "image" | "document" | "search_result")
    ) || native_block(v).is_some_and(|(_, in_response)| !in_response)
}

fn valid_thinking(v: &Value) -> bool {
    let nonempty = |f: &str| str_field(v, f).is_some_and(|s| !s.is_empty());
    match block_type(v) {
        Some("thinking") => str_field(v, "thinking").is_some() && nonempty("signature"),
        Some("redacted_thinking") => nonempty("data"),
        // An OpenAI reasoning item needs its id and a summary array (`docs/PROVIDER-RULES.md` D.3).
        Some("reasoning") => nonempty("id") && v.get("summary").is_some_and(Value::is_array),
        _ => true,
    }
}

/// What reaches the provider of each kind of reasoning (see the module docs of `normalize`).
struct ReasoningPolicy<'e> {
    /// Anthropic thinking / redacted_thinking blocks.
    thinking: bool,
    /// OpenAI Responses reasoning items.
    reasoning: bool,
    /// Gemini thought signatures.
    signatures: bool,
    /// The request's model; reasoning of entries written by another model is foreign.
    model: Option<&'e str>,
    entries: &'e [Entry],
}

impl<'e> ReasoningPolicy<'e> {
    fn new(opts: &'e NormalizeOptions, entries: &'e [Entry]) -> Self {
        let on = opts.thinking != ThinkingMode::Strip;
        ReasoningPolicy {
            thinking: on && opts.provider == Provider::Anthropic,
            reasoning: on && opts.provider == Provider::OpenaiResponses,
            signatures: on && opts.provider == Provider::Gemini,
            model: opts.model.as_deref(),
            entries,
        }
    }

    /// The model that wrote the entry, when a request model is set and it is another one.
    fn foreign(&self, src: u32) -> Option<String> {
        let want = self.model?;
        let wrote = self
            .entries
            .get(src as usize)
            .and_then(|e| e.message.as_ref())
            .and_then(|m| m.model.as_deref());
        (wrote != Some(want)).then(|| wrote.unwrap_or("an unknown model").to_string())
    }
}

/// Loupe block hygiene (beyond the reference), in place:
/// - blocks of a type the provider does not accept (unknown / future types, and the beta types
///   Loupe does not handle, see [`is_supported_type`]) are dropped for both providers
///   (`unsupported_block_dropped`; the stored entry keeps them verbatim), and so are the items of a
///   `tool_result`'s array content that a tool result cannot carry (A4.9);
/// - blocks that are not objects with a string `type`, and `tool_result`s without a string
///   `tool_use_id`, are dropped (`invalid_block_dropped`); a `tool_result` whose `content` is
///   neither a string nor an array gets its JSON text as content (reported with the same kind);
/// - assistant-only blocks in a user turn and user-only blocks in an assistant turn are dropped
///   (`misplaced_block_dropped`);
/// - reasoning reaches its own provider only: `thinking` / `redacted_thinking` Anthropic, `reasoning`
///   items OpenAI Responses, `thought_signature` fields Gemini; elsewhere, and in `strip` mode,
///   they are dropped silently. A `thinking` without a non-empty `signature` (or without `thinking`
///   text), a `redacted_thinking` without `data` and a `reasoning` without `id` or `summary` array
///   are dropped (`invalid_thinking_dropped`); with a request `model`, those written by another
///   model (the entry's `message.model`) are dropped (`foreign_thinking_dropped`);
/// - `tool_use.input` that is not an object: a string holding a JSON object is parsed, anything
///   else becomes `{}` (`invalid_tool_input_repaired`); a missing id becomes `""` (rewritten
///   later), a missing name becomes `unknown_tool`.
pub fn sanitize_blocks(
    blocks: &mut Vec<Block>,
    role: Role,
    opts: &NormalizeOptions,
    ctx: &mut Ctx,
) {
    let policy = ReasoningPolicy::new(opts, ctx.entries);
    blocks.retain_mut(|b| {
        if let Some(obj) = b.v.as_object_mut() {
            if obj.contains_key(THOUGHT_SIGNATURE) {
                if !policy.signatures {
                    obj.remove(THOUGHT_SIGNATURE);
                } else if let Some(model) = policy.foreign(b.src) {
                    obj.remove(THOUGHT_SIGNATURE);
                    ctx.report(
                        RepairKind::ForeignThinkingDropped,
                        [b.src],
                        format!("dropped a thought signature written by {model}"),
                    );
                }
            }
        }
        let Some(t) = block_type(&b.v).map(str::to_string) else {
            ctx.report(
                RepairKind::InvalidBlockDropped,
                [b.src],
                format!(
                    "dropped a block without a type: {}",
                    preview(&b.v.to_string())
                ),
            );
            return false;
        };
        if !is_supported_type(&t) && native_block(&b.v).is_none() {
            ctx.report(
                RepairKind::UnsupportedBlockDropped,
                [b.src],
                format!("dropped {t} block: not a block type the provider accepts"),
            );
            return false;
        }
        let misplaced = match role {
            Role::User => assistant_only(&b.v),
            Role::Assistant => user_only(&b.v),
        };
        if misplaced {
            let side = if role == Role::User {
                "a user"
            } else {
                "an assistant"
            };
            ctx.report(
                RepairKind::MisplacedBlockDropped,
                [b.src],
                format!("dropped {t} block from {side} turn"),
            );
            return false;
        }
        match t.as_str() {
            "thinking" | "redacted_thinking" | "reasoning" => {
                let kept = if t == "reasoning" {
                    policy.reasoning
                } else {
                    policy.thinking
                };
                if !kept {
                    return false;
                }
                if !valid_thinking(&b.v) {
                    ctx.report(
                        RepairKind::InvalidThinkingDropped,
                        [b.src],
                        format!("dropped unsigned or malformed {t} block"),
                    );
                    return false;
                }
                if let Some(model) = policy.foreign(b.src) {
                    ctx.report(
                        RepairKind::ForeignThinkingDropped,
                        [b.src],
                        format!("dropped {t} block written by {model}"),
                    );
                    return false;
                }
            }
            "tool_result" if str_field(&b.v, "tool_use_id").is_none() => {
                ctx.report(
                    RepairKind::InvalidBlockDropped,
                    [b.src],
                    "dropped tool_result without tool_use_id".into(),
                );
                return false;
            }
            "tool_use" => {
                repair_tool_use(b, ctx);
                repair_caller(b, ctx);
            }
            "tool_result" => {
                let bad = b.v.get("content").filter(|c| !matches!(c, Value::String(_) | Value::Array(_) | Value::Null));
                if let Some(c) = bad {
                    let text = c.to_string();
                    b.v["content"] = Value::String(text);
                    ctx.report(
                        RepairKind::InvalidBlockDropped,
                        [b.src],
                        "tool_result content that was neither a string nor an array replaced by its JSON text".into(),
                    );
                }
                drop_unsupported_nested(b, ctx);
                if let Some(items) = b.v.get_mut("content").and_then(Value::as_array_mut) {
                    for item in items {
                        text_metadata(item, b.src, ctx);
                    }
                }
            }
            _ => text_metadata(&mut b.v, b.src, ctx),
        }
        true
    });
}

/// A client call's `caller` in a form Anthropic takes: `{"type":"direct"}`, or a code execution
/// call's type with its `tool_id`; another one is removed (the call reads as a direct one).
fn repair_caller(b: &mut Block, ctx: &mut Ctx) {
    let Some(caller) = b.v.get("caller") else {
        return;
    };
    let fields = caller.as_object();
    let ok = match fields.and_then(|f| f.get("type")).and_then(Value::as_str) {
        Some("direct") => fields.is_some_and(|f| f.len() == 1),
        Some("code_execution_20250825" | "code_execution_20260120") => {
            fields.is_some_and(|f| f.len() == 2 && f.get("tool_id").is_some_and(Value::is_string))
        }
        _ => false,
    };
    if ok {
        return;
    }
    if let Some(block) = b.v.as_object_mut() {
        block.remove("caller");
    }
    ctx.report(
        RepairKind::InvalidBlockDropped,
        [b.src],
        "a tool_use caller in no form the provider takes removed".into(),
    );
}

/// A document's or search result's `title`, `context` and `source` are text for every
/// provider: another JSON value there is replaced by its JSON text, so it is still read.
fn text_metadata(v: &mut Value, src: u32, ctx: &mut Ctx) {
    // A search result's title and source are required text; a document's may be absent.
    let (fields, required): (&[&str], bool) = match block_type(v) {
        Some("document") => (&["title", "context"], false),
        Some("search_result") => (&["title", "source"], true),
        _ => return,
    };
    for field in fields {
        if required && v.get(*field).is_none_or(Value::is_null) {
            v[*field] = Value::String(String::new());
            ctx.report(
                RepairKind::InvalidBlockDropped,
                [src],
                format!("a search result without a {field} given an empty one"),
            );
            continue;
        }
        let Some(value) = v.get_mut(*field) else {
            continue;
        };
        if value.is_string() || value.is_null() {
            continue;
        }
        *value = Value::String(value.to_string());
        ctx.report(
            RepairKind::InvalidBlockDropped,
            [src],
            format!("a {field} that was not text replaced by its JSON text"),
        );
    }
}

/// Items of a `tool_result`'s array content that are not blocks of a type a tool result may carry
/// (A4.9: text, image, document, search_result, tool_reference) are dropped
/// (`unsupported_block_dropped`), like unsupported top-level blocks.
fn drop_unsupported_nested(b: &mut Block, ctx: &mut Ctx) {
    let Some(Value::Array(items)) = b.v.get_mut("content") else {
        return;
    };
    let before = items.len();
    items.retain(|x| {
        matches!(
            block_type(x),
            Some(
                "text"
                    | "image"
                    | "document"
                    | "search_result"
                    | "tool_reference"
                    | "browser_state"
            )
        )
    });
    let n = before - items.len();
    if n > 0 {
        let id = str_field(&b.v, "tool_use_id").unwrap_or("").to_string();
        ctx.report(
            RepairKind::UnsupportedBlockDropped,
            [b.src],
            format!("tool_result {id}: dropped {n} content item(s) of a type a tool result cannot carry"),
        );
    }
}

fn repair_tool_use(b: &mut Block, ctx: &mut Ctx) {
    let src = b.src;
    let Some(obj) = b.v.as_object_mut() else {
        return;
    };
    if !obj.get("id").is_some_and(Value::is_string) {
        obj.insert("id".into(), Value::String(String::new()));
    }
    let has_name = matches!(obj.get("name"), Some(Value::String(n)) if !n.is_empty());
    if !has_name {
        obj.insert("name".into(), Value::String("unknown_tool".into()));
        ctx.report(
            RepairKind::ToolNameRewritten,
            [src],
            "tool_use without a name named unknown_tool".into(),
        );
    }
    let id = obj
        .get("id")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    let fixed = match obj.get("input") {
        Some(Value::Object(_)) => return,
        Some(Value::String(s)) => match serde_json::from_str::<Value>(s) {
            Ok(Value::Object(m)) => Value::Object(m),
            _ => Value::Object(Map::new()),
        },
        _ => Value::Object(Map::new()),
    };
    let was = obj
        .get("input")
        .map_or("missing".to_string(), |v| preview(&v.to_string()));
    obj.insert("input".into(), fixed);
    ctx.report(
        RepairKind::InvalidToolInputRepaired,
        [src],
        format!("tool_use {id}: input was not a JSON object ({was})"),
    );
}

#[cfg(test)]
mod tests {
    use super::super::testutil::*;
    use super::*;
    use serde_json::json;

    fn run(entries: &[Entry], opts: &NormalizeOptions) -> (Vec<Msg>, Vec<RepairKind>) {
        let mut ctx = Ctx::new(entries);
        let idx: Vec<usize> = (0..entries.len()).collect();
        let m = to_messages(entries, &idx, &HashMap::new(), opts, &mut ctx);
        let k = kinds(&ctx);
        (m, k)
    }

    #[test]
    fn drops_progress_system_and_api_errors_keeps_local_command() {
        let mut err = asst(3, "e", json!([text("Prompt is too long")]));
        err.is_api_error = true;
        let e = vec![
            entry(json!({"seq": 0, "type": "progress", "data": {}})),
            system(1, "informational", json!("hidden")),
            system(
                2,
                "local_command",
                json!("<local-command-stdout>hi</local-command-stdout>"),
            ),
            err,
            asst(4, "ok", json!([text("kept synthetic")])),
        ];
        let (m, k) = run(&e, &NormalizeOptions::default());
        assert!(k.is_empty());
        assert_eq!(
            shape(&m),
            vec![
                (
                    Role::User,
                    vec![text("<local-command-stdout>hi</local-command-stdout>")]
                ),
                (Role::Assistant, vec![text("kept synthetic")]),
            ]
        );
        assert!(!m[0].is_meta);
    }

    #[test]
    fn attachments_become_meta_users_and_strings_become_blocks() {
        let e = vec![attachment(0, json!([text("file")])), user(1, json!("hi"))];
        let (m, _) = run(&e, &NormalizeOptions::default());
        assert!(m[0].is_meta && !m[1].is_meta);
        assert_eq!(m[1].blocks[0].v, text("hi"));
    }

    #[test]
    fn media_strip_and_drop_when_emptied() {
        let doc = json!({"type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": "A"}});
        let e = vec![
            meta_user(0, json!([doc.clone()])),
            meta_user(1, json!([doc, text("keep")])),
        ];
        let mut ctx = Ctx::new(&e);
        let strip: HashMap<usize, Vec<&'static str>> =
            [(0, vec!["document"]), (1, vec!["document"])].into();
        let m = to_messages(&e, &[0, 1], &strip, &NormalizeOptions::default(), &mut ctx);
        assert_eq!(shape(&m), vec![(Role::User, vec![text("keep")])]);
        assert_eq!(
            kinds(&ctx),
            vec![RepairKind::MediaStripped, RepairKind::MediaStripped]
        );
    }

    #[test]
    fn hygiene_invalid_misplaced_thinking_and_tool_input() {
        let e = vec![
            user(0, json!([42, {"no": "type"}, tu("x"), text("q")])),
            asst(
                1,
                "A",
                json!([
                    {"type": "thinking", "thinking": "unsigned"},
                    thinking("signed"),
                    {"type": "redacted_thinking", "data": "abc"},
                    tr("x"),
                    {"type": "tool_use", "id": "t1", "name": "Bash", "input": "{\"a\":1}"},
                    {"type": "tool_use", "id": "t2", "name": "Bash", "input": "{partial"},
                    {"type": "tool_use", "id": "t3", "name": "Bash", "input": {"ok": true}},
                ]),
            ),
            user(
                2,
                json!([{"type": "tool_result", "tool_use_id": "t3", "content": {"odd": 1}}]),
            ),
        ];
        let (m, k) = run(&e, &NormalizeOptions::default());
        assert_eq!(m[0].blocks.len(), 1);
        let a: Vec<Value> = m[1].blocks.iter().map(|b| b.v.clone()).collect();
        assert_eq!(a.len(), 5);
        assert_eq!(a[2]["input"], json!({"a": 1}));
        assert_eq!(a[3]["input"], json!({}));
        assert_eq!(a[4]["input"], json!({"ok": true}));
        assert_eq!(
            k,
            vec![
                RepairKind::InvalidBlockDropped,
                RepairKind::InvalidBlockDropped,
                RepairKind::MisplacedBlockDropped,
                RepairKind::InvalidThinkingDropped,
                RepairKind::MisplacedBlockDropped,
                RepairKind::InvalidToolInputRepaired,
                RepairKind::InvalidToolInputRepaired,
                RepairKind::InvalidBlockDropped,
            ]
        );
        assert_eq!(m[2].blocks[0].v["content"], json!("{\"odd\":1}"));
    }

    #[test]
    fn strip_mode_drops_thinking_and_thinking_only_fragments_silently() {
        let e = vec![
            asst(0, "A", json!([thinking("t")])),
            asst(1, "A", json!([thinking("t"), text("x")])),
        ];
        let opts = NormalizeOptions {
            thinking: ThinkingMode::Strip,
            ..Default::default()
        };
        let (m, k) = run(&e, &opts);
        assert!(k.is_empty());
        assert_eq!(shape(&m), vec![(Role::Assistant, vec![text("x")])]);
    }

    /// Proptest minimal case: a user entry `[text, {"type":"future_block","x":1}]` sent the
    /// unknown block to Anthropic (A2.5). Unknown and unhandled beta types are dropped for both
    /// providers and reported naming the entry; the rest of the message is kept.
    #[test]
    fn unknown_and_unhandled_beta_blocks_dropped_for_both_providers() {
        let e = vec![
            user(
                0,
                json!([text("[u6] what is this block?"), {"type": "future_block", "x": 1}]),
            ),
            asst(
                1,
                "A",
                json!([{"type": "tool_addition", "tool_name": "Bash"}, text("a")]),
            ),
            user(2, json!([{"type": "future_block"}])),
        ];
        for provider in [Provider::Anthropic, Provider::Openai] {
            let opts = NormalizeOptions {
                provider,
                ..Default::default()
            };
            let (m, k) = run(&e, &opts);
            assert_eq!(
                shape(&m),
                vec![
                    (Role::User, vec![text("[u6] what is this block?")]),
                    (Role::Assistant, vec![text("a")]),
                ]
            );
            assert_eq!(
                k,
                vec![
                    RepairKind::UnsupportedBlockDropped,
                    RepairKind::UnsupportedBlockDropped,
                    RepairKind::UnsupportedBlockDropped,
                    RepairKind::EmptyMessageDropped,
                ]
            );
        }
    }

    #[test]
    fn unsupported_items_in_tool_result_content_dropped() {
        let e = vec![user(
            0,
            json!([{"type": "tool_result", "tool_use_id": "t", "content": [text("r"), {"type": "future_block"}, 7]}]),
        )];
        let (m, k) = run(&e, &NormalizeOptions::default());
        assert_eq!(m[0].blocks[0].v["content"], json!([text("r")]));
        assert_eq!(k, vec![RepairKind::UnsupportedBlockDropped]);
    }

    #[test]
    fn empty_user_dropped_empty_assistant_kept() {
        let e = vec![user(0, json!([])), asst(1, "A", json!([]))];
        let (m, k) = run(&e, &NormalizeOptions::default());
        assert_eq!(shape(&m), vec![(Role::Assistant, vec![])]);
        assert_eq!(k, vec![RepairKind::EmptyMessageDropped]);
    }

    /// A `fallback` block marks a model hop between two thinking runs: Anthropic gets it where
    /// it stood (dropping it merges the runs into one span the API refuses). It is never
    /// rendered into the prompt, so another provider loses nothing a model reads without it,
    /// and the drop is reported.
    #[test]
    fn a_fallback_stays_between_its_thinking_runs() {
        let fallback = json!({"type": "fallback", "from": {"model": "claude-opus-5"},
            "to": {"model": "claude-sonnet-5"}});
        let e = vec![
            user(0, json!("go")),
            asst(
                1,
                "A",
                json!([
                    thinking("first"),
                    fallback.clone(),
                    thinking("second"),
                    text("done")
                ]),
            ),
            user(2, json!("next")),
        ];
        let n = super::super::normalize(&e, &NormalizeOptions::default());
        assert_eq!(
            n.messages[1]["content"],
            json!([
                thinking("first"),
                fallback,
                thinking("second"),
                text("done")
            ])
        );
        let chat = super::super::normalize(
            &e,
            &NormalizeOptions {
                provider: Provider::Openai,
                ..Default::default()
            },
        );
        assert_eq!(chat.messages[1]["content"], "done");
        assert!(chat
            .repairs
            .iter()
            .any(|r| r.kind == RepairKind::UnsupportedBlockDropped && r.seqs == [1]));
    }
}
