//! The model-facing views of a thread: API rounds, the normalized context, snips, and the
//! stateless normalizer.

use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::{router::OpenApiRouter, routes};

use super::answers::{MalformedJson, Overloaded, PayloadTooLarge, ThreadNotFound, WindowTooLarge};
use super::context_cache::ContextCache;
use super::context_cache::{CachedContext, ContextKey};
use super::guard::{Holding, WINDOW_FLOOR_BYTES};
use super::problem::{ApiError, ApiJson, ApiPath, ApiQuery, Problem, ProblemKind};
use super::threads::ThreadPath;
use super::{AppState, ExpensiveSlot, Tenant};
use crate::history::ingest::{check_entry, MAX_UUID_LEN};
use crate::history::model::Entry;
use crate::history::normalize::ids::{is_valid_tool_name, TOOL_NAME_RULE};
use crate::history::normalize::incremental::{
    Checkpoint, NormalizedJson, PagedRead, TailRun, NOT_REPRODUCED,
};
use crate::history::normalize::{ContextEstimate, Fallback};
use crate::history::{
    group_rounds, normalize, round_skeleton, NormalizeOptions, Normalized, Provider, Round,
    ThinkingMode,
};
use crate::store::{
    AppendRequest, ContextHead, ContextTail, ContextWindow, TenantId, WindowBounds,
};

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(get_rounds))
        .routes(routes!(get_context))
        .routes(routes!(snip_messages))
        .routes(routes!(normalize_history))
}

/// How the caller will send the context.
#[derive(Debug, Default, Deserialize, IntoParams, ToSchema)]
#[into_params(parameter_in = Query)]
pub struct ContextOptions {
    /// `anthropic` (Messages API blocks, the default), `openai` (Chat Completions),
    /// `openai_responses` (the Responses `input` items) or `gemini` (generateContent `contents`).
    /// The response's `messages` holds that provider's list, ready to send.
    #[serde(default)]
    #[param(value_type = Option<Provider>)]
    pub provider: Provider,
    /// The names of the tools available now, comma-separated. `tool_reference` blocks naming
    /// other tools are stripped. Omitted: every tool is available. Each name is 1–64 characters
    /// of `[A-Za-z0-9_-]`; blanks around names and empty items are ignored.
    #[param(
        pattern = r"^[ \t]*([A-Za-z0-9_-]{1,64}[ \t]*)?(,[ \t]*([A-Za-z0-9_-]{1,64}[ \t]*)?)*$"
    )]
    pub tools: Option<String>,
    /// `keep` replays signed thinking blocks verbatim (the default); `strip` drops every thinking
    /// block (thinking turned off); `enabled` keeps them for a request with manual thinking
    /// (Anthropic `thinking.type: "enabled"`): a tool loop in progress opened without thinking is
    /// closed (`thinking_loop_closed`).
    #[serde(default)]
    #[param(value_type = Option<ThinkingMode>)]
    pub thinking: ThinkingMode,
    /// The model the request goes to (1–256 characters). Thinking blocks, OpenAI reasoning items
    /// and Gemini thought signatures written by another model (the stored `message.model`) are
    /// dropped and reported (`foreign_thinking_dropped`). Omitted: kept whatever model wrote them.
    #[param(
        min_length = 1,
        max_length = 256,
        pattern = r"^[^\u0000-\u001F\u007F-\u009F]*$"
    )]
    pub model: Option<String>,
    /// Place one `cache_control` breakpoint on the last block (Anthropic).
    #[serde(default)]
    pub cache: bool,
    /// The provider supports advisor blocks; when false (the default) they are stripped.
    #[serde(default)]
    pub advisor: bool,
    /// `full` (the default): the messages after the last compact boundary. `outline` (threads in
    /// outline mode): the old messages as summary lines, then the recent ones whole.
    #[serde(default)]
    #[param(value_type = Option<ContextView>)]
    pub view: ContextView,
}

/// Which context to build.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum ContextView {
    #[default]
    Full,
    Outline,
}

impl ContextOptions {
    pub(crate) fn normalize_options(&self) -> Result<NormalizeOptions, ApiError> {
        let tools = match &self.tools {
            None => None,
            Some(list) => {
                let names: Vec<String> = list
                    .split(',')
                    .map(str::trim)
                    .filter(|name| !name.is_empty())
                    .map(str::to_owned)
                    .collect();
                if let Some(bad) = first_invalid_tool(&names) {
                    return Err(ApiError::bad_request(format!(
                        "tools: {:?} is not a tool name ({TOOL_NAME_RULE})",
                        names[bad]
                    )));
                }
                Some(names)
            }
        };
        if let Some(model) = &self.model {
            if !valid_model(model) {
                return Err(ApiError::bad_request(format!(
                    "model: {model:?} is not a model id ({MODEL_RULE})"
                )));
            }
        }
        Ok(NormalizeOptions {
            provider: self.provider,
            tools,
            thinking: self.thinking,
            model: self.model.clone(),
            cache: self.cache,
            advisor: self.advisor,
            microcompact: None,
            clearing: None,
        })
    }
}

/// Model ids as Loupe accepts them.
const MODEL_RULE: &str = "1–256 characters, no control characters";

fn valid_model(model: &str) -> bool {
    (1..=256).contains(&model.chars().count()) && !model.chars().any(char::is_control)
}

/// The position of the first name that is not a tool name the providers accept.
fn first_invalid_tool(names: &[String]) -> Option<usize> {
    names.iter().position(|name| !is_valid_tool_name(name))
}

#[derive(Debug, Serialize, ToSchema)]
pub struct RoundsResponse {
    /// API rounds in order: the only places compaction may cut.
    pub rounds: Vec<Round>,
    /// The seq the listing starts at (the last compact boundary, or `from_seq`).
    pub from_seq: i64,
    pub next_seq: i64,
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct RoundsQuery {
    /// Group from this seq on; by default from the last compact boundary (the current context).
    pub from_seq: Option<i64>,
}

/// The thread's messages grouped into API rounds.
///
/// A round starts at an assistant message whose provider message id differs from the previous
/// assistant's; split fragments of one response stay in one round, even with tool results between
/// them. `closed` says whether every `tool_use` in the round is answered.
#[utoipa::path(
    get, path = "/v1/threads/{thread_id}/rounds", tag = "context", operation_id = "getRounds",
    params(ThreadPath, RoundsQuery),
    responses(
        (status = 200, description = "The rounds", body = RoundsResponse),
        ThreadNotFound,
        WindowTooLarge,
        Overloaded,
    )
)]
pub async fn get_rounds(
    State(state): State<AppState>,
    slot: ExpensiveSlot,
    Tenant(tenant): Tenant,
    ApiPath(path): ApiPath<ThreadPath>,
    ApiQuery(query): ApiQuery<RoundsQuery>,
) -> Result<Json<RoundsResponse>, ApiError> {
    let bounds = state
        .store
        .window_bounds(&tenant, &path.thread_id, query.from_seq)
        .await?;
    // Rounds need kinds, response ids and tool ids: each entry is cut to those as it is read.
    let max_bytes = i64::try_from(state.limits.max_page_bytes).unwrap_or(i64::MAX);
    let skeletons = state
        .store
        .window_reduced(&bounds, max_bytes, round_skeleton)
        .await?;
    let from_seq = skeletons
        .first()
        .and_then(|e| e.seq)
        .unwrap_or(bounds.next_seq);
    let rounds = off_the_executor(&slot, move || group_rounds(&skeletons)).await?;
    Ok(Json(RoundsResponse {
        rounds,
        from_seq,
        next_seq: bounds.next_seq,
    }))
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ContextResponse {
    #[serde(flatten)]
    pub normalized: Normalized,
    /// The thread's next seq when the context was read.
    pub next_seq: i64,
    /// The context's size as the auto-compaction trigger sees it: `basis: usage` anchors on the
    /// `usage` the last assistant entry after the last boundary reports (input, cache and output
    /// tokens: the provider's own count, system prompt and tools included), plus the content
    /// after it; `basis: content` estimates the content alone at per-kind rates (code, JSON and
    /// tool output 2.5 characters a token, prose 3.5, CJK one token a character).
    /// `estimated_tokens` stays the reference's characters / 4 of the returned messages.
    pub context_tokens: crate::history::normalize::ContextEstimate,
    /// Tools Loupe adds to the request, in the provider's shape: the zoom tool, for an outlined
    /// thread whose outline has a line (and never before: see docs/TREE.md on its cache cost).
    #[schema(value_type = Vec<Object>)]
    pub tools: Vec<Value>,
    /// For `view=outline`: the outline's boundary and version (equal versions, equal prefix).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub outline: Option<OutlineRef>,
}

/// Where the outline ends and which state it was rendered from.
#[derive(Debug, Serialize, ToSchema)]
pub struct OutlineRef {
    /// The outline covers `[0, boundary)`; the messages from `boundary` on follow whole.
    pub boundary: u64,
    pub lines: usize,
    pub version: i64,
}

/// The API-ready context: the messages after the last compact boundary, repaired so the provider
/// accepts them, with every repair reported.
///
/// The list is what precedes the caller's next user turn. When it ends with a user turn (for
/// example synthetic tool results), merge the next user content into that turn after its
/// `tool_result` blocks. `estimated_tokens` is a rough estimate of the tokens
/// (characters / 4; images and documents 2,000 each). The thread's micro-compaction settings
/// (`/settings`) apply: old results of compactable tools may be replaced by a placeholder.
#[utoipa::path(
    get, path = "/v1/threads/{thread_id}/context", tag = "context", operation_id = "getContext",
    params(ThreadPath, ContextOptions),
    responses(
        (status = 200, description = "The normalized context", body = ContextResponse),
        (status = 400, description = "A bad option (`bad-request`)", body = Problem, content_type = "application/problem+json"),
        ThreadNotFound,
        (status = 409, description = "`view=outline` on a thread not in outline mode (`outline-disabled`)", body = Problem, content_type = "application/problem+json"),
        WindowTooLarge,
        Overloaded,
    )
)]
pub async fn get_context(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
    ApiPath(path): ApiPath<ThreadPath>,
    ApiQuery(options): ApiQuery<ContextOptions>,
) -> Result<Response, ApiError> {
    let view = options.view;
    let mut options = options.normalize_options()?;
    let head = state.store.context_head(&tenant, &path.thread_id).await?;
    options.microcompact = head.settings.microcompact_options();
    options.clearing = head.settings.clearing_options();
    // A large window waits for room in the process's window budget, held until the answer is
    // sent: concurrent reads of large threads take turns instead of holding them all at once.
    // The room comes before the slot, so reads waiting their turn hold no slot other requests
    // need.
    let window_bytes = state
        .store
        .window_bytes(&head, WINDOW_FLOOR_BYTES as i64)
        .await?;
    let room = state.guards.window_room(window_bytes).await;
    let slot = ExpensiveSlot::acquire(&state.guards, &tenant.0).await?;
    let answer =
        answer_context(&state, &slot, &tenant, &path.thread_id, head, view, options).await?;
    Ok(match room {
        Some(room) => answer.map(|body| Body::new(Holding::new(body, room))),
        None => answer,
    })
}

/// [`get_context`]'s answer, by view and by the cache's strategies.
async fn answer_context(
    state: &AppState,
    slot: &ExpensiveSlot,
    tenant: &TenantId,
    thread_id: &str,
    head: ContextHead,
    view: ContextView,
    options: NormalizeOptions,
) -> Result<Response, ApiError> {
    if view == ContextView::Outline {
        let outline = head.settings.outline.unwrap_or_default();
        return outline_context(state, slot, tenant, thread_id, &outline, &options)
            .await
            .map(IntoResponse::into_response);
    }
    let cache = state.context_cache.clone();
    // With the cache off, the plain pipeline, kept apart from the checkpoint's path on purpose:
    // it is the reference the cached answers are tested against (tests/api/context_cache.rs).
    if !cache.is_enabled() {
        let bounds = state.store.context_bounds(&head).await?;
        let window = state.store.window_entries(bounds).await?;
        let context_tokens = crate::history::normalize::estimate_context(&window.entries);
        let entries = window.entries;
        let tools = offered_tools(&options, 0);
        let normalized = off_the_executor(slot, move || normalize(&entries, &options)).await?;
        return Ok(Json(ContextResponse {
            normalized,
            next_seq: window.next_seq,
            context_tokens,
            tools,
            outline: None,
        })
        .into_response());
    }
    let key = ContextKey::new(tenant, thread_id, &options);
    if let Some(answer) = cached_read(state, slot, &head, &cache, &key, &options).await? {
        return Ok(answer);
    }
    // No checkpoint. Of concurrent reads of one key, one reads the window; the others wait for
    // it, then go on from the checkpoint it left, from the thread's head as it is now. So a
    // burst of first reads reads the window once. A read that waited and still finds none (the
    // window leaves no checkpoint) reads the window itself, without waiting again.
    let turn = cache.first_read_turn(&key).await;
    let head = match turn {
        Some(_) => head,
        None => {
            let head = state.store.context_head(tenant, thread_id).await?;
            if let Some(answer) = cached_read(state, slot, &head, &cache, &key, &options).await? {
                return Ok(answer);
            }
            head
        }
    };
    let answer = paged_read(state, slot, tenant, thread_id, &head, options, cache, key).await;
    drop(turn);
    answer
}

/// A read that goes on from the key's checkpoint, if the cache holds one that can answer.
async fn cached_read(
    state: &AppState,
    slot: &ExpensiveSlot,
    head: &ContextHead,
    cache: &Arc<ContextCache>,
    key: &ContextKey,
    options: &NormalizeOptions,
) -> Result<Option<Response>, ApiError> {
    let Some(cached) = cache.get(key) else {
        return Ok(None);
    };
    let tail = match cached.checkpoint.resume_seq() {
        Some(resume) => Some(
            state
                .store
                .context_tail(head, resume, cached.window_start)
                .await?,
        ),
        None => None,
    };
    if let Some(tail) = tail.filter(|tail| tail.thread_key == cached.thread_key) {
        let (shared, key, options) = (cache.clone(), key.clone(), options.clone());
        let read = off_the_executor(slot, move || {
            continue_read(cached, tail, &options, &shared, key)
        })
        .await??;
        match read {
            Ok(answer) => {
                cache.record_hit();
                return Ok(Some(answer.into_response()));
            }
            Err(Fallback(reason)) => crate::metrics::context_fallback("incremental", reason),
        }
    }
    // The checkpoint could not answer (another thread of that id, or a tail that changes it):
    // no later read should try it again. The full read after this leaves a new one when it can.
    drop(cache.take(key));
    Ok(None)
}

/// Most pages' worth of entries a paged read keeps waiting for a cut before it reads the whole
/// window instead: each page normalizes the waiting entries again, so a window without cuts
/// costs 1 + 2 + … pages of work before it gives up.
const MAX_PENDING_PAGES: usize = 2;

/// A read that finds no checkpoint: the window a page at a time ([`PagedRead`]), so what it
/// holds parsed is a page, not the window. The pages are read up to the end `head` saw, so an
/// append meanwhile does not land in the answer without its `next_seq`. When the pages cannot be
/// read so (a later page changes what an earlier one normalized), the whole window within the
/// same bounds is read at once; when the thread went meanwhile, it is read again from its head. Either way the read leaves a checkpoint when it can.
#[allow(clippy::too_many_arguments)]
async fn paged_read(
    state: &AppState,
    slot: &ExpensiveSlot,
    tenant: &TenantId,
    thread_id: &str,
    head: &ContextHead,
    options: NormalizeOptions,
    cache: Arc<ContextCache>,
    key: ContextKey,
) -> Result<Response, ApiError> {
    let bounds = state.store.context_bounds(head).await?;
    let page_entries = state.limits.context_page_entries.max(1);
    let mut read = PagedRead::new(options.clone(), page_entries * MAX_PENDING_PAGES);
    let mut from = bounds.start_seq;
    // The first page reaches the boundary: a segment the boundary preserves lies before it, and
    // a boundary in a later page would make the pages fall back.
    let first_end = bounds.boundary_seq().map_or(0, |seq| seq.saturating_add(1));
    let mut pages = 0;
    loop {
        pages += 1;
        let mut to = from.saturating_add(page_entries as i64);
        if pages == 1 {
            to = to.max(first_end);
        }
        let to = to.min(bounds.next_seq);
        let page = state.store.window_page(&bounds, from, to).await?;
        if page.len() as i64 != to - from {
            // Seqs are dense: a page short of entries means the thread went (deleted, or deleted
            // and made again) while it was read. The whole read answers what is there now.
            crate::metrics::context_fallback("paged", "the thread changed between pages");
            let window = state.store.context_window(tenant, thread_id, None).await?;
            let answer =
                off_the_executor(slot, move || full_read(window, &options, &cache, key)).await??;
            return Ok(answer.into_response());
        }
        if to >= bounds.next_seq {
            let (cache, key, bounds) = (cache.clone(), key.clone(), bounds.clone());
            let answer = off_the_executor(slot, move || {
                finish_read(read, page, &bounds, pages, &cache, key)
            })
            .await??;
            if let Ok(answer) = answer {
                return Ok(answer.into_response());
            }
            break;
        }
        let fed = off_the_executor(slot, move || {
            let fed = read.feed(page);
            fed.map(|()| read)
        })
        .await?;
        match fed {
            Ok(fed) => read = fed,
            Err(Fallback(reason)) => {
                crate::metrics::context_fallback("paged", reason);
                break;
            }
        }
        from = to;
    }
    let window = state.store.window_entries(bounds).await?;
    let answer = off_the_executor(slot, move || full_read(window, &options, &cache, key)).await??;
    Ok(answer.into_response())
}

/// [`paged_read`]'s last page: the answer, and the checkpoint left in the cache; `Ok(Err(_))`
/// when the pages cannot answer.
fn finish_read(
    read: PagedRead,
    last: Vec<Entry>,
    bounds: &WindowBounds,
    pages: usize,
    cache: &Arc<ContextCache>,
    key: ContextKey,
) -> Result<Result<ContextAnswer, Fallback>, ApiError> {
    let (checkpoint, run, moved) = match read.finish(last) {
        Ok(done) => done,
        Err(fallback) => {
            crate::metrics::context_fallback("paged", fallback.0);
            return Ok(Err(fallback));
        }
    };
    if moved == Err(NOT_REPRODUCED) {
        tracing::warn!(
            thread_key = %bounds.thread_key,
            "a paged read's last cut did not reproduce its tail; not cached"
        );
    }
    crate::metrics::context_read(if pages > 1 { "paged" } else { "full" });
    let cached = Arc::new(CachedContext {
        thread_key: bounds.thread_key.clone(),
        window_start: bounds.start_seq,
        checkpoint,
    });
    let answer = ContextAnswer::new(
        &run,
        cached.clone(),
        bounds.next_seq,
        offered_tools(key.options(), 0),
    )?;
    // An earlier page may have moved it even when the last did not.
    if cached.checkpoint.resume_seq().is_some() && moved != Err(NOT_REPRODUCED) {
        cache.put(key, cached);
    }
    Ok(Ok(answer))
}

/// The body of a context answer, written from a checkpoint's serialized prefix and the run over
/// its tail: the JSON of [`ContextResponse`] (without `outline`), not parsed again.
#[derive(Serialize)]
struct ContextBody<'a> {
    #[serde(flatten)]
    normalized: NormalizedJson<'a>,
    next_seq: i64,
    context_tokens: ContextEstimate,
    tools: Vec<Value>,
}

/// How a context body starts: its first field is the messages, the checkpoint's items first.
const MESSAGES_OPEN: &[u8] = br#"{"messages":["#;

/// Bytes of the checkpoint's items per piece of a body: large enough that a long answer goes
/// out in few writes, small beside the answer itself.
const BODY_CHUNK: usize = 256 * 1024;

/// A context answer ready to send. The checkpoint's items, most of a long thread's answer, are
/// copied from the shared checkpoint piece by piece as the body goes out, so the answer is never
/// held whole beside the checkpoint; only the rest (the tail's items and the other fields) is
/// written ahead.
struct ContextAnswer {
    cached: Arc<CachedContext>,
    /// Whether the checkpoint's items go out as [`TailRun::signs_prefix`] says.
    signed: bool,
    /// The body after the checkpoint's items: from the tail's first item (or the `]` closing the
    /// messages) to the end.
    rest: Vec<u8>,
}

impl ContextAnswer {
    fn new(
        run: &TailRun,
        cached: Arc<CachedContext>,
        next_seq: i64,
        tools: Vec<Value>,
    ) -> Result<ContextAnswer, ApiError> {
        let body = ContextBody {
            normalized: run.json_without_prefix_items(&cached.checkpoint),
            next_seq,
            context_tokens: run.context_estimate(),
            tools,
        };
        let internal = |why: String| ApiError::new(ProblemKind::Internal, why);
        let mut written = serde_json::to_vec(&body)
            .map_err(|error| internal(format!("the context did not serialize: {error}")))?;
        if !written.starts_with(MESSAGES_OPEN) {
            return Err(internal("a context body starts with its messages".into()));
        }
        written.drain(..MESSAGES_OPEN.len());
        Ok(ContextAnswer {
            signed: run.signs_prefix(),
            cached,
            rest: written,
        })
    }

    /// The body's pieces, in order: the opening with the checkpoint's items a chunk at a time,
    /// then the rest.
    fn pieces(self) -> impl Iterator<Item = Bytes> {
        let ContextAnswer {
            cached,
            signed,
            mut rest,
        } = self;
        let items = cached.checkpoint.prefix_len();
        if items > 0 && !rest.starts_with(b"]") {
            // The tail's first item follows the checkpoint's last.
            rest.insert(0, b',');
        }
        let (mut next, mut opened) = (0, false);
        let chunks = std::iter::from_fn(move || {
            if opened && next >= items {
                return None;
            }
            let mut chunk = Vec::with_capacity(BODY_CHUNK + 4096);
            if !opened {
                chunk.extend_from_slice(MESSAGES_OPEN);
                opened = true;
            }
            while next < items && chunk.len() < BODY_CHUNK {
                if next > 0 {
                    chunk.push(b',');
                }
                let item = cached.checkpoint.prefix_item(next, signed);
                chunk.extend_from_slice(item.get().as_bytes());
                next += 1;
            }
            Some(Bytes::from(chunk))
        });
        chunks.chain(std::iter::once(Bytes::from(rest)))
    }

    /// The body's length in bytes: the opening, the items with the commas between them (and
    /// before the tail's first), the rest.
    fn len(&self) -> usize {
        let checkpoint = &self.cached.checkpoint;
        let items = checkpoint.prefix_len();
        let item_bytes: usize = (0..items)
            .map(|i| checkpoint.prefix_item(i, self.signed).get().len())
            .sum();
        let joins =
            items.saturating_sub(1) + usize::from(items > 0 && !self.rest.starts_with(b"]"));
        MESSAGES_OPEN.len() + item_bytes + joins + self.rest.len()
    }

    fn into_response(self) -> Response {
        // A known length spares the client chunked framing.
        let length = self.len();
        let pieces = self.pieces().map(Ok::<_, std::convert::Infallible>);
        (
            [
                (header::CONTENT_TYPE, "application/json".to_owned()),
                (header::CONTENT_LENGTH, length.to_string()),
            ],
            Body::from_stream(futures_util::stream::iter(pieces)),
        )
            .into_response()
    }
}

/// A read that goes on from the thread's cached checkpoint: only `tail` (the entries after it) is
/// normalized. When the tail holds a new cut, the checkpoint moves on and goes back into the
/// cache; otherwise the read answers from the shared checkpoint as it is, so concurrent reads of a
/// thread never wait for each other. `Ok(Err(_))`: the tail could change what the checkpoint
/// holds, so the caller reads the whole window.
fn continue_read(
    cached: Arc<CachedContext>,
    tail: ContextTail,
    options: &NormalizeOptions,
    cache: &Arc<ContextCache>,
    key: ContextKey,
) -> Result<Result<ContextAnswer, Fallback>, ApiError> {
    let run = match cached.checkpoint.continue_with(&tail.entries, options) {
        Ok(run) => run,
        Err(fallback) => return Ok(Err(fallback)),
    };
    crate::metrics::context_read("incremental");
    if !run.has_cut() {
        return ContextAnswer::new(&run, cached, tail.next_seq, offered_tools(options, 0)).map(Ok);
    }
    // Moving needs a checkpoint of its own: taken out of the cache, and copied only when another
    // read holds it at this moment.
    drop(cache.take(&key));
    let mut owned = Arc::unwrap_or_clone(cached);
    let (run, moved) = run.advance(&mut owned.checkpoint, &tail.entries);
    let owned = Arc::new(owned);
    let answer = ContextAnswer::new(
        &run,
        owned.clone(),
        tail.next_seq,
        offered_tools(options, 0),
    )?;
    match moved {
        Err(NOT_REPRODUCED) => {
            tracing::warn!(
                thread_key = %owned.thread_key,
                "a context checkpoint did not reproduce its tail; dropped"
            );
        }
        // Moved on, or kept where it was: either way it serves the next read.
        Ok(_) | Err(_) => cache.put(key, owned),
    }
    Ok(Ok(answer))
}

/// A read of the whole window at once, from scratch, when [`paged_read`] cannot page it; it
/// leaves a checkpoint in the cache when the window holds a closed round to end one at.
fn full_read(
    window: ContextWindow,
    options: &NormalizeOptions,
    cache: &Arc<ContextCache>,
    key: ContextKey,
) -> Result<ContextAnswer, ApiError> {
    crate::metrics::context_read("full");
    let mut checkpoint = Checkpoint::start();
    let run = checkpoint
        .continue_with(&window.entries, options)
        .map_err(|Fallback(reason)| {
            ApiError::new(
                ProblemKind::Internal,
                format!("a read from scratch fell back: {reason}"),
            )
        })?;
    let (run, moved) = run.advance(&mut checkpoint, &window.entries);
    let cached = Arc::new(CachedContext {
        thread_key: window.thread_key,
        window_start: window.start_seq,
        checkpoint,
    });
    let answer = ContextAnswer::new(
        &run,
        cached.clone(),
        window.next_seq,
        offered_tools(options, 0),
    )?;
    if moved == Ok(true) {
        cache.put(key, cached);
    }
    Ok(answer)
}

/// The tools Loupe adds to a context: zoom, once the outline has a line (`outline_lines`) or
/// whenever the thread clears old results (their stubs name zoom addresses). Offered from the
/// start of clearing rather than at its first batch, so the request's tools, which providers
/// render first, do not change when the first result is cleared.
fn offered_tools(options: &NormalizeOptions, outline_lines: usize) -> Vec<Value> {
    if outline_lines > 0 || options.clearing.is_some() {
        vec![crate::tree::view::zoom_tool(options.provider)]
    } else {
        Vec::new()
    }
}

/// The outlined context: the stored outline's lines, then the messages from its boundary on.
async fn outline_context(
    state: &AppState,
    slot: &ExpensiveSlot,
    tenant: &crate::store::TenantId,
    thread_id: &str,
    outline: &crate::tree::OutlineOptions,
    options: &NormalizeOptions,
) -> Result<Json<ContextResponse>, ApiError> {
    if !outline.enabled {
        return Err(ApiError::new(
            ProblemKind::OutlineDisabled,
            "view=outline needs outline mode: set `outline.enabled` in the thread's settings",
        ));
    }
    let snapshot = state.store.outline_snapshot(tenant, thread_id).await?;
    let boundary = snapshot.outline.boundary();
    let window = state
        .store
        .context_window(tenant, thread_id, Some(boundary as i64))
        .await?;
    let context_tokens = crate::history::normalize::estimate_context(&window.entries);
    let (version, line_count) = (snapshot.version, snapshot.lines.len());
    let (lines, render_options) = (snapshot.lines, options.clone());
    let normalized = off_the_executor(slot, move || {
        crate::tree::view::outlined_context(&lines, window.entries, &render_options)
    })
    .await?;
    let tools = offered_tools(options, line_count);
    Ok(Json(ContextResponse {
        normalized,
        next_seq: window.next_seq,
        context_tokens,
        tools,
        outline: Some(OutlineRef {
            boundary,
            lines: line_count,
            version,
        }),
    }))
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"seqs": [4, 5], "uuid": "snip-7f3a"}))]
pub struct SnipRequest {
    /// The messages to hide, by seq.
    #[serde(default)]
    pub seqs: Vec<i64>,
    /// The messages to hide, by uuid.
    #[serde(default)]
    pub uuids: Vec<String>,
    /// The snip entry's own uuid, so a retried snip is idempotent.
    pub uuid: Option<String>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct SnipResponse {
    /// The stored snip entry (a `system` entry with subtype `snip`).
    pub snip: Entry,
    pub next_seq: i64,
}

/// Hide messages from every later context. Nothing is deleted: the messages stay readable through
/// the messages API, and the snip is itself an appended entry.
#[utoipa::path(
    post, path = "/v1/threads/{thread_id}/snip", tag = "context", operation_id = "snipMessages",
    params(ThreadPath),
    request_body = SnipRequest,
    responses(
        (status = 201, description = "The snip entry was appended", body = SnipResponse),
        (status = 200, description = "The same snip was already stored (idempotent retry)", body = SnipResponse),
        ThreadNotFound,
        (status = 409, description = "The snip uuid is used by another entry (`uuid-conflict`)", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Nothing named, or a named message does not exist (`validation`)", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn snip_messages(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
    ApiPath(path): ApiPath<ThreadPath>,
    ApiJson(request): ApiJson<SnipRequest>,
) -> Result<(StatusCode, Json<SnipResponse>), ApiError> {
    for (index, uuid) in request.uuids.iter().enumerate() {
        super::check_key_field(&format!("uuids[{index}]"), uuid, MAX_UUID_LEN)?;
    }
    if let Some(uuid) = &request.uuid {
        super::check_key_field("uuid", uuid, MAX_UUID_LEN)?;
    }
    if request.seqs.is_empty() && request.uuids.is_empty() {
        return Err(ApiError::invalid_field(
            "seqs",
            "name at least one message by seq or uuid",
        ));
    }
    let named = state
        .store
        .resolve_messages(&tenant, &path.thread_id, &request.seqs, &request.uuids)
        .await?;
    let snip = Entry {
        uuid: request.uuid,
        ..Entry::snip(named.into_iter().map(|(_, uuid)| uuid).collect())
    };
    check_entry(&snip, "snip").map_err(ApiError::field)?;
    let outcome = state
        .store
        .append(
            &tenant,
            &path.thread_id,
            AppendRequest {
                entries: vec![snip],
                expected_next_seq: None,
            },
        )
        .await?;
    let status = if outcome.replayed {
        StatusCode::OK
    } else {
        StatusCode::CREATED
    };
    let snip = outcome.messages.into_iter().next().ok_or_else(|| {
        ApiError::new(
            super::problem::ProblemKind::Internal,
            "the snip was not stored",
        )
    })?;
    Ok((
        status,
        Json(SnipResponse {
            snip,
            next_seq: outcome.next_seq,
        }),
    ))
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({
    "provider": "anthropic",
    "messages": [
        {"type": "user", "message": {"role": "user", "content": "List the files."}},
        {"type": "assistant", "message": {"role": "assistant", "id": "msg_1",
            "content": [{"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": {"command": "ls"}}]}}
    ]
}))]
pub struct NormalizeRequest {
    /// A history in the stored-entry format, oldest first.
    pub messages: Vec<Entry>,
    #[serde(default)]
    pub provider: Provider,
    /// The names of the tools available now; omitted: every tool.
    pub tools: Option<Vec<String>>,
    #[serde(default)]
    pub thinking: ThinkingMode,
    /// The model the request goes to (1–256 characters): thinking, reasoning items and thought
    /// signatures written by another model are dropped.
    #[schema(
        min_length = 1,
        max_length = 256,
        pattern = r"^[^\u0000-\u001F\u007F-\u009F]*$"
    )]
    pub model: Option<String>,
    #[serde(default)]
    pub cache: bool,
    #[serde(default)]
    pub advisor: bool,
}

/// Normalize a history sent in the request (for callers that keep their own history). Nothing is
/// stored.
#[utoipa::path(
    post, path = "/v1/normalize", tag = "context", operation_id = "normalizeHistory",
    request_body = NormalizeRequest,
    responses(
        (status = 200, description = "The normalized context", body = Normalized),
        MalformedJson,
        PayloadTooLarge,
        (status = 422, description = "An invalid entry or option (`validation`)", body = Problem, content_type = "application/problem+json"),
        Overloaded,
    )
)]
pub async fn normalize_history(
    slot: ExpensiveSlot,
    ApiJson(request): ApiJson<NormalizeRequest>,
) -> Result<Json<Normalized>, ApiError> {
    for (index, entry) in request.messages.iter().enumerate() {
        check_entry(entry, &format!("messages[{index}]")).map_err(ApiError::field)?;
    }
    if let Some(bad) = request.tools.as_deref().and_then(first_invalid_tool) {
        return Err(ApiError::invalid_field(
            format!("tools[{bad}]"),
            format!("a tool name is {TOOL_NAME_RULE}"),
        ));
    }
    if let Some(model) = request.model.as_deref().filter(|m| !valid_model(m)) {
        return Err(ApiError::invalid_field(
            "model",
            format!("{model:?} is not a model id ({MODEL_RULE})"),
        ));
    }
    let options = NormalizeOptions {
        provider: request.provider,
        tools: request.tools,
        thinking: request.thinking,
        model: request.model,
        cache: request.cache,
        advisor: request.advisor,
        microcompact: None,
        // A stub names a stored message to zoom to; this history is not stored.
        clearing: None,
    };
    // Entries without a seq are numbered by position so repairs can name them.
    let mut entries = request.messages;
    for (index, entry) in entries.iter_mut().enumerate() {
        entry.seq = Some(index as i64);
    }
    Ok(Json(
        off_the_executor(&slot, move || normalize(&entries, &options)).await?,
    ))
}

/// Runs CPU-heavy work (normalizing, grouping rounds, rendering an outline) on the blocking pool,
/// so that a large history never stalls the async threads serving everyone else. Callers hold an
/// [`ExpensiveSlot`], which bounds how many run at once and how many one tenant may run, and
/// pass it here so the work keeps it until it ends.
pub(crate) async fn off_the_executor<T: Send + 'static>(
    slot: &ExpensiveSlot,
    work: impl FnOnce() -> T + Send + 'static,
) -> Result<T, ApiError> {
    let slot = slot.clone();
    tokio::task::spawn_blocking(move || {
        // The slot is given back when the work ends, not when the request does (a request
        // answered by its timeout leaves this running).
        let _slot = slot;
        work()
    })
    .await
    .map_err(|error| ApiError::new(ProblemKind::Internal, format!("CPU work failed: {error}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A request answered by its timeout while its CPU work runs keeps its slot until the work
    /// ends: the bound on concurrent expensive work holds however requests end.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_slot_is_held_until_the_work_off_the_executor_ends() {
        let limits = crate::http::Limits::default();
        let guards = crate::http::Guards::new(crate::http::AuthMode::Open, &limits);
        let all = ExpensiveSlot::available(&guards);
        let slot = ExpensiveSlot::acquire(&guards, "t").await.unwrap();
        let (started, start) = std::sync::mpsc::channel();
        let (finish, finished) = std::sync::mpsc::channel::<()>();
        let work = off_the_executor(&slot, move || {
            started.send(()).unwrap();
            finished.recv().unwrap();
        });
        let timed_out = tokio::time::timeout(std::time::Duration::from_millis(50), work).await;
        assert!(timed_out.is_err(), "the request is answered by its timeout");
        start.recv().unwrap();
        drop(slot);
        assert_eq!(
            ExpensiveSlot::available(&guards),
            all - 1,
            "the work still runs"
        );
        finish.send(()).unwrap();
        for _ in 0..200 {
            if ExpensiveSlot::available(&guards) == all {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        panic!("the slot was not given back when the work ended");
    }

    /// The body a [`ContextAnswer`] sends, its pieces joined.
    fn sent(run: &TailRun, checkpoint: &Checkpoint, next_seq: i64) -> String {
        let cached = Arc::new(CachedContext {
            thread_key: "k".into(),
            window_start: 0,
            checkpoint: checkpoint.clone(),
        });
        let answer = ContextAnswer::new(run, cached, next_seq, Vec::new()).unwrap();
        let length = answer.len();
        let bytes: Vec<u8> = answer.pieces().flat_map(|piece| piece.to_vec()).collect();
        assert_eq!(bytes.len(), length, "the announced length");
        String::from_utf8(bytes).unwrap()
    }

    /// Reads `entries` from scratch, from the checkpoint the read moved to, and after it: each
    /// answer sent must be the JSON of the plain pipeline's `ContextResponse`.
    fn check_sent_bodies(entries: &[Entry], options: &NormalizeOptions) {
        let next_seq = entries.len() as i64;
        let expected = serde_json::to_string(&ContextResponse {
            normalized: normalize(entries, options),
            next_seq,
            context_tokens: crate::history::normalize::estimate_context(entries),
            tools: Vec::new(),
            outline: None,
        })
        .unwrap();
        let mut checkpoint = Checkpoint::start();
        let run = checkpoint.continue_with(entries, options).unwrap();
        assert_eq!(sent(&run, &checkpoint, next_seq), expected, "from scratch");
        let (moved, advanced) = run.advance(&mut checkpoint, entries);
        assert!(advanced.unwrap(), "a cut");
        assert!(checkpoint.prefix_len() > 0);
        assert_eq!(sent(&moved, &checkpoint, next_seq), expected, "moved");
        let tail = &entries[checkpoint.resume_seq().unwrap() as usize..];
        let run = checkpoint.continue_with(tail, options).unwrap();
        assert_eq!(sent(&run, &checkpoint, next_seq), expected, "after");
    }

    #[test]
    fn the_sent_body_is_the_context_response() {
        let entries: Vec<Entry> = serde_json::from_value(serde_json::json!([
            {"seq": 0, "uuid": "a", "type": "user", "message": {"role": "user", "content": "go"}},
            {"seq": 1, "uuid": "b", "type": "assistant", "message": {"role": "assistant", "id": "m1",
                "content": [{"type": "tool_use", "id": "t1", "name": "Bash", "input": {}}]}},
            {"seq": 2, "uuid": "c", "type": "user", "message": {"role": "user",
                "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "ok"}]}},
            {"seq": 3, "uuid": "d", "type": "assistant", "message": {"role": "assistant", "id": "m2",
                "content": [{"type": "text", "text": " "}, {"type": "tool_use", "id": "t2", "name": "Bash", "input": {}}]}},
        ]))
        .unwrap();
        for provider in [
            Provider::Anthropic,
            Provider::Openai,
            Provider::OpenaiResponses,
            Provider::Gemini,
        ] {
            let options = NormalizeOptions {
                provider,
                cache: true,
                ..NormalizeOptions::default()
            };
            check_sent_bodies(&entries, &options);
        }
    }

    #[test]
    fn a_long_prefix_is_sent_in_several_pieces() {
        let text = "The parser reads the amount and rounds half to even. ".repeat(6);
        let entries: Vec<Entry> = (0..3_000)
            .map(|i| {
                let entry = if i % 2 == 0 {
                    serde_json::json!({"seq": i, "uuid": format!("u{i}"), "type": "user",
                        "message": {"role": "user", "content": text}})
                } else {
                    serde_json::json!({"seq": i, "uuid": format!("a{i}"), "type": "assistant",
                        "message": {"role": "assistant", "id": format!("m{i}"),
                            "content": [{"type": "text", "text": text}]}})
                };
                serde_json::from_value(entry).unwrap()
            })
            .collect();
        let options = NormalizeOptions::default();
        let mut checkpoint = Checkpoint::start();
        let run = checkpoint.continue_with(&entries, &options).unwrap();
        let (run, _) = run.advance(&mut checkpoint, &entries);
        let cached = Arc::new(CachedContext {
            thread_key: "k".into(),
            window_start: 0,
            checkpoint: checkpoint.clone(),
        });
        let pieces: Vec<Bytes> = ContextAnswer::new(&run, cached, 3_000, Vec::new())
            .unwrap()
            .pieces()
            .collect();
        assert!(pieces.len() > 3, "{} pieces", pieces.len());
        assert!(pieces.iter().all(|p| p.len() < BODY_CHUNK + 4096));
        check_sent_bodies(&entries, &options);
    }

    #[test]
    fn tool_lists_are_parsed_and_checked() {
        let options = ContextOptions {
            tools: Some("Bash, Read,,Edit".to_owned()),
            ..ContextOptions::default()
        };
        assert_eq!(
            options.normalize_options().unwrap().tools.unwrap(),
            ["Bash", "Read", "Edit"]
        );
        let bad = ContextOptions {
            tools: Some("Bash,no spaces".to_owned()),
            ..ContextOptions::default()
        };
        assert!(bad.normalize_options().is_err());
        assert!(ContextOptions::default()
            .normalize_options()
            .unwrap()
            .tools
            .is_none());
    }
}
