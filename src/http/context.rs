//! The model-facing views of a thread: API rounds, the normalized context (read by
//! `crate::context`), snips, and the stateless normalizer.

use super::consistency::{on_standby, ReadToken, Written};
use crate::store::{TenantId, ThreadId};
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::{router::OpenApiRouter, routes};

use super::answers::{MalformedJson, Overloaded, PayloadTooLarge, ThreadNotFound, WindowTooLarge};
use super::budget::read_within_room;
use super::options::{tool_list, SendOptions};
use super::problem::{ApiError, ApiJson, ApiPath, ApiQuery, Problem, ProblemKind};
use super::settings::ClearingBody;
use super::threads::ThreadPath;
use super::{AppState, ExpensiveSlot, Tenant};
use crate::context::{
    ContextAnswer, ContextRead, ContextReader, ContextResponse, Offload, ReadError, View,
};
use crate::history::ingest::{check_entry, MAX_UUID_LEN};
use crate::history::model::Entry;
use crate::history::{
    group_rounds, normalize, round_skeleton, NormalizeOptions, Normalized, Provider, Round,
    ThinkingMode,
};
use crate::store::{AppendRequest, ClearingSettings, Seq};

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
    /// The normalizer's options, checked by the parser `/normalize` shares; a bad one is 400
    /// `bad-request`, as for every query parameter.
    pub(crate) fn normalize_options(&self) -> Result<NormalizeOptions, ApiError> {
        SendOptions {
            provider: self.provider,
            tools: self.tools.as_deref().map(tool_list),
            thinking: self.thinking,
            model: self.model.clone(),
            cache: self.cache,
            advisor: self.advisor,
        }
        .parse()
        .map_err(|error| ApiError::bad_request(error.to_string()))
    }
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
    token: ReadToken,
) -> Result<Json<RoundsResponse>, ApiError> {
    let (tenant, thread_id, from_seq) = (&tenant, &path.thread_id, query.from_seq.map(Seq::new));
    // Rounds need kinds, response ids and tool ids: each entry is cut to those as it is read,
    // a page at a time within room of the answer budget.
    let max_bytes = state.limits.max_page_bytes as u64;
    let guards = &*state.guards;
    let (bounds, skeletons) =
        on_standby(&state, tenant, Some(thread_id), token, |store| async move {
            let bounds = store.window_bounds(tenant, thread_id, from_seq).await?;
            let (skeletons, _room) = read_within_room(guards, tenant, max_bytes, |bytes| {
                let (store, bounds) = (store.clone(), bounds.clone());
                async move { store.window_reduced(&bounds, bytes, round_skeleton).await }
            })
            .await?;
            Ok((bounds, skeletons))
        })
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

/// The API-ready context: the messages after the last compact boundary, repaired so the provider
/// accepts them, with every repair reported.
///
/// The list is what precedes the caller's next user turn. When it ends with a user turn (for
/// example synthetic tool results), merge the next user content into that turn after its
/// `tool_result` blocks. The thread's micro-compaction settings (`/settings`) apply: old results
/// of compactable tools may be replaced by a placeholder.
///
/// Two token counts come back. `context_tokens` is the thread's context size close to the
/// provider's count (anchored on the `usage` the provider last reported): budget by it, against
/// the model's window and the compaction threshold. `estimated_tokens` is characters / 4 of
/// `messages` alone (images and documents 2,000 each), 2–3 times lower on real sessions: use it
/// only to compare answers with each other.
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
    token: ReadToken,
) -> Result<Response, ApiError> {
    let view = options.view;
    let options = options.normalize_options()?;
    let (state, tenant, thread_id, options) = (&state, &tenant, &path.thread_id, &options);
    on_standby(state, tenant, Some(thread_id), token, |store| async move {
        read_context(state, &store, tenant, thread_id, view, options.clone()).await
    })
    .await
}

/// One context read on `store` (a standby's or the primary's).
async fn read_context(
    state: &AppState,
    store: &crate::store::Store,
    tenant: &TenantId,
    thread_id: &ThreadId,
    view: ContextView,
    mut options: NormalizeOptions,
) -> Result<Response, ApiError> {
    let head = store.context_head(tenant, thread_id).await?;
    options.microcompact = head.settings.microcompact_options();
    options.clearing = head.settings.clearing_options();
    // A large window waits for room in the process's window budget, held until the answer is
    // sent: concurrent reads of large threads take turns instead of holding them all at once.
    // The room comes before the slot, so reads waiting their turn hold no slot other requests
    // need.
    let window_bytes = store
        .window_bytes(&head, state.guards.window_exact_above())
        .await?;
    let room = state.guards.window_room(&tenant.0, window_bytes).await;
    let slot = ExpensiveSlot::acquire(&state.guards, &tenant.0).await?;
    // Only a window with no `usage` yet is estimated from content alone, and needs them.
    let overheads = if head.context_anchored {
        crate::history::normalize::LearnedOverheads::default()
    } else {
        store.learned_overheads(tenant).await?
    };
    let reader = ContextReader {
        store,
        cache: &state.context_cache,
        page_entries: state.limits.context_page_entries,
        offload: &slot,
        overheads,
    };
    let view = match view {
        ContextView::Full => View::Window,
        ContextView::Outline => View::Outline,
    };
    let answer = match reader.read(tenant, thread_id, head, view, options).await? {
        ContextRead::Streamed(answer) => streamed(answer),
        ContextRead::Whole(response) => Json(response).into_response(),
    };
    Ok(super::budget::hold_until_sent(state, answer, room))
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"seqs": [4, 5], "uuid": "snip-7f3a"}))]
pub struct SnipRequest {
    /// The messages to hide, by seq. A snip names at least one message: `seqs`, `uuids` or
    /// both hold one (422 `validation` otherwise), at most 1,000 each (422 otherwise; one named
    /// twice is hidden once), and each must be in the thread (409 `no-such-message` otherwise).
    #[serde(default)]
    #[schema(max_items = 1000)]
    pub seqs: Vec<i64>,
    /// The messages to hide, by uuid.
    #[serde(default)]
    #[schema(max_items = 1000)]
    pub uuids: Vec<String>,
    /// The snip entry's own uuid, so a retried snip is idempotent: 1–200 characters, no NUL, as
    /// every entry's uuid.
    #[schema(min_length = 1, max_length = 200, pattern = r"^[^\u0000]*$")]
    pub uuid: Option<String>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct SnipResponse {
    /// The stored snip entry (a `system` entry with subtype `snip`).
    pub snip: Entry,
    pub next_seq: i64,
    /// The write's consistency token (also the `Loupe-LSN` header): send it back with a read
    /// (`Loupe-LSN` or `min_lsn`) to see this write on a read standby. Present only where the
    /// service reads from standbys.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(
        pattern = r"^[0-9A-Fa-f]{1,8}/[0-9A-Fa-f]{1,8}$",
        example = "0/3000148"
    )]
    pub lsn: Option<String>,
}

/// Hide messages from every model-facing view: the context in both views, the outline's lines
/// (lines that summarized them become stand-ins built without a model, before the answer), zoom
/// (which shows such a message only as snipped) and normalized cursor batches. A snip is not an
/// erasure: the raw record keeps the messages (the messages API, raw cursor batches, export),
/// and the snip is itself an appended entry.
///
/// The request names at least one message, by `seqs` or `uuids` (both may be given); every one
/// named must be in the thread, or nothing is stored and the answer is 409 `no-such-message`.
#[utoipa::path(
    post, path = "/v1/threads/{thread_id}/snip", tag = "context", operation_id = "snipMessages",
    params(ThreadPath),
    request_body = SnipRequest,
    responses(
        (status = 201, description = "The snip entry was appended", body = SnipResponse),
        (status = 200, description = "The same snip was already stored (idempotent retry)", body = SnipResponse),
        ThreadNotFound,
        (status = 409, description = "The thread holds no message with a seq or uuid the request names (`no-such-message`; `errors[0].field` is `seqs` or `uuids`, `detail` names the message), or the snip uuid is used by another entry (`uuid-conflict`)", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Nothing named, more than 1,000 in one list, or an invalid uuid (`validation`; `errors[0].field` names it)", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn snip_messages(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
    ApiPath(path): ApiPath<ThreadPath>,
    ApiJson(request): ApiJson<SnipRequest>,
) -> Result<(StatusCode, Written, Json<SnipResponse>), ApiError> {
    let SnipRequest { seqs, uuids, uuid } = request;
    for (index, uuid) in uuids.iter().enumerate() {
        super::check_key_field(&format!("uuids[{index}]"), uuid, MAX_UUID_LEN)?;
    }
    if let Some(uuid) = &uuid {
        // The snip's own uuid is an entry's: never empty.
        if uuid.is_empty() {
            return Err(ApiError::invalid_field(
                "uuid",
                format!("must be 1 to {MAX_UUID_LEN} characters, without NUL characters"),
            ));
        }
        super::check_key_field("uuid", uuid, MAX_UUID_LEN)?;
    }
    // Bounded and each named once, as an erasure's lists are.
    let seqs = super::erasures::named_once("seqs", seqs)?;
    let uuids = super::erasures::named_once("uuids", uuids)?;
    if seqs.is_empty() && uuids.is_empty() {
        return Err(ApiError::invalid_field(
            "seqs",
            "name at least one message by seq or uuid",
        ));
    }
    let named = state
        .store
        .resolve_messages(&tenant, &path.thread_id, &seqs, &uuids)
        .await?;
    let snip = Entry {
        uuid,
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
    // Before the answer: from then on no outline line or zoom shows the snipped messages.
    crate::jobs::erasure::hide_snipped(&state.store, &tenant, &path.thread_id, &outcome.messages)
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
    let written = Written::now(&state, &tenant, Some(&path.thread_id)).await;
    Ok((
        status,
        written.clone(),
        Json(SnipResponse {
            snip,
            next_seq: outcome.next_seq,
            lsn: written.lsn(),
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
    /// Reversible clearing of old tool results, as a thread's settings size it: an old result
    /// is sent as a stub naming `zoom N+1`, where `N` is the result's index in `messages`, and
    /// the answer's `tools` then holds the zoom tool. A caller that keeps its own history answers
    /// the model's `zoom(N, 1)` with `messages[N]` whole.
    pub clearing: Option<ClearingBody>,
}

/// A normalized history, and the tools the model reads it with.
#[derive(Debug, Serialize, ToSchema)]
pub struct NormalizeResponse {
    #[serde(flatten)]
    pub normalized: Normalized,
    /// Tools Loupe adds to the request, in the provider's shape: the zoom tool when `clearing`
    /// is on (its stubs name zoom addresses), else none.
    #[schema(value_type = Vec<Object>)]
    pub tools: Vec<serde_json::Value>,
}

/// Normalize a history sent in the request (for callers that keep their own history). Nothing is
/// stored.
#[utoipa::path(
    post, path = "/v1/normalize", tag = "context", operation_id = "normalizeHistory",
    request_body = NormalizeRequest,
    responses(
        (status = 200, description = "The normalized context", body = NormalizeResponse),
        MalformedJson,
        PayloadTooLarge,
        (status = 422, description = "An invalid entry or option (`validation`)", body = Problem, content_type = "application/problem+json"),
        Overloaded,
    )
)]
pub async fn normalize_history(
    slot: ExpensiveSlot,
    ApiJson(request): ApiJson<NormalizeRequest>,
) -> Result<Json<NormalizeResponse>, ApiError> {
    for (index, entry) in request.messages.iter().enumerate() {
        check_entry(entry, &format!("messages[{index}]")).map_err(ApiError::field)?;
    }
    let mut options = SendOptions {
        provider: request.provider,
        tools: request.tools,
        thinking: request.thinking,
        model: request.model,
        cache: request.cache,
        advisor: request.advisor,
    }
    .parse()
    .map_err(ApiError::field)?;
    options.clearing = request
        .clearing
        .map(ClearingSettings::try_from)
        .transpose()
        .map_err(ApiError::field)?
        .filter(|clearing| clearing.enabled)
        .map(|clearing| clearing.options());
    let tools = if options.clearing.is_some() {
        vec![crate::tree::view::zoom_tool(options.provider)]
    } else {
        Vec::new()
    };
    // Entries without a seq are numbered by position so repairs can name them.
    let mut entries = request.messages;
    for (index, entry) in entries.iter_mut().enumerate() {
        entry.seq = Some(index as i64);
    }
    let normalized = off_the_executor(&slot, move || normalize(&entries, &options)).await?;
    Ok(Json(NormalizeResponse { normalized, tools }))
}

/// A context answer sent from its checkpoint, piece by piece, its length announced (which spares
/// the client chunked framing).
fn streamed(answer: ContextAnswer) -> Response {
    let length = answer.body_len();
    let pieces = answer
        .pieces()
        .map(|piece| Ok::<_, std::convert::Infallible>(Bytes::from(piece)));
    (
        [
            (header::CONTENT_TYPE, "application/json".to_owned()),
            (header::CONTENT_LENGTH, length.to_string()),
        ],
        Body::from_stream(futures_util::stream::iter(pieces)),
    )
        .into_response()
}

impl Offload for ExpensiveSlot {
    async fn offload<T: Send + 'static>(
        &self,
        work: impl FnOnce() -> T + Send + 'static,
    ) -> Result<T, ReadError> {
        run_holding(self, work)
            .await
            .map_err(|error| ReadError::Internal(format!("CPU work failed: {error}")))
    }
}

impl From<ReadError> for ApiError {
    fn from(error: ReadError) -> Self {
        match error {
            ReadError::Store(error) => error.into(),
            ReadError::OutlineDisabled => {
                ApiError::new(ProblemKind::OutlineDisabled, error.to_string())
            }
            ReadError::Internal(why) => ApiError::new(ProblemKind::Internal, why),
        }
    }
}

/// Runs CPU-heavy work (normalizing, grouping rounds, rendering an outline) on the blocking pool,
/// so that a large history never stalls the async threads serving everyone else. Callers hold an
/// [`ExpensiveSlot`], which bounds how many run at once and how many one tenant may run, and
/// pass it here so the work keeps it until it ends.
pub(crate) async fn off_the_executor<T: Send + 'static>(
    slot: &ExpensiveSlot,
    work: impl FnOnce() -> T + Send + 'static,
) -> Result<T, ApiError> {
    run_holding(slot, work)
        .await
        .map_err(|error| ApiError::new(ProblemKind::Internal, format!("CPU work failed: {error}")))
}

/// [`off_the_executor`]'s work, on the blocking pool, holding a clone of the slot.
async fn run_holding<T: Send + 'static>(
    slot: &ExpensiveSlot,
    work: impl FnOnce() -> T + Send + 'static,
) -> Result<T, tokio::task::JoinError> {
    let slot = slot.clone();
    tokio::task::spawn_blocking(move || {
        // The slot is given back when the work ends, not when the request does (a request
        // answered by its timeout leaves this running).
        let _slot = slot;
        work()
    })
    .await
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
