//! `/v1/threads/{thread_id}/erasures`: erase entries for good, and list the receipts.

use super::consistency::Written;
use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::{router::OpenApiRouter, routes};

use super::answers::{MalformedJson, Overloaded, ThreadNotFound};
use super::guard::ExpensiveSlot;
use super::problem::{ApiError, ApiJson, ApiPath, ApiQuery, Problem};
use super::threads::ThreadPath;
use super::{AppState, Tenant};
use crate::history::ingest::MAX_UUID_LEN;
use crate::jobs::erasure::{erase, erase_in_forks, held_elsewhere, ErasureRequest};
use crate::store::{Erasure, ErasureArtifacts, ErasureTargets, ThreadId, MAX_ERASED_ENTRIES};

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(create_erasure, list_erasures))
}

/// Longest `reason`, in characters.
const MAX_REASON_CHARS: usize = 500;

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"uuids": ["m-0193"], "reason": "user request 2026-12-04"}))]
pub struct ErasureRequestBody {
    /// The entries to erase, by uuid. `uuids` and `seqs` (at most 1,000 each) name at least one
    /// entry between them (the union of both), each in the thread (409 `no-such-message` otherwise, and nothing changes).
    #[schema(max_items = 1000)]
    pub uuids: Option<Vec<String>>,
    /// The entries to erase, by seq.
    #[schema(max_items = 1000)]
    pub seqs: Option<Vec<i64>>,
    /// Why, kept in the receipt (at most 500 characters). Never the erased content.
    #[schema(max_length = 500, pattern = r"^[^\u0000]*$")]
    pub reason: Option<String>,
}

/// One list of the entries a request names (an erasure's or a snip's `uuids` or `seqs`), each
/// once, in the order first named: at most [`MAX_ERASED_ENTRIES`] as sent (the document's
/// `maxItems`), or 422 naming `field`, so the work a request asks for stays bounded.
pub(crate) fn named_once<T>(field: &str, names: Vec<T>) -> Result<Vec<T>, ApiError>
where
    T: Eq + std::hash::Hash + Clone,
{
    if names.len() > MAX_ERASED_ENTRIES {
        return Err(ApiError::invalid_field(
            field,
            format!(
                "name at most {MAX_ERASED_ENTRIES} entries in one list, not {}",
                names.len()
            ),
        ));
    }
    let mut seen = std::collections::HashSet::with_capacity(names.len());
    Ok(names
        .into_iter()
        .filter(|name| seen.insert(name.clone()))
        .collect())
}

/// How many copies of each kind an erasure took the text out of.
#[derive(Debug, Serialize, ToSchema)]
pub struct ErasureArtifactsResponse {
    /// Entries made tombstones (one already erased is not counted again).
    pub messages: u64,
    /// Summary-tree nodes, that is outline lines, emptied or rebuilt without a model.
    pub tree_nodes: u64,
    /// Compaction summaries derived again, without a model, from what remains.
    pub compaction_summaries: u64,
    /// Running jobs that read the thread before the erasure: they cannot write their output.
    pub jobs_fenced: u64,
    /// Cached normalized contexts (incremental checkpoints) dropped.
    pub cached_contexts: u64,
}

impl From<ErasureArtifacts> for ErasureArtifactsResponse {
    fn from(a: ErasureArtifacts) -> Self {
        ErasureArtifactsResponse {
            messages: a.messages,
            tree_nodes: a.tree_nodes,
            compaction_summaries: a.compaction_summaries,
            jobs_fenced: a.jobs_fenced,
            cached_contexts: a.cached_contexts,
        }
    }
}

/// An erasure's receipt: what went, never what it said.
#[derive(Debug, Serialize, ToSchema)]
#[schema(example = json!({
    "erasure_id": "0193a1f0-7c2e-7d4a-9b61-2f0c1d7e8a90", "thread_id": "support-4711",
    "seqs": [4], "reason": "user request 2026-12-04",
    "artifacts": {"messages": 1, "tree_nodes": 3, "compaction_summaries": 1, "jobs_fenced": 0,
        "cached_contexts": 2},
    "created_at": "2026-12-04T10:00:00Z", "storage_scrubbed_at": null
}))]
pub struct ErasureReceipt {
    pub erasure_id: String,
    pub thread_id: String,
    /// The erased entries' seqs, ascending. Each is now a tombstone: the entry keeps its seq,
    /// uuid, `type` and role, its `message.content` is empty, and `erased` names this erasure.
    pub seqs: Vec<i64>,
    pub reason: Option<String>,
    pub artifacts: ErasureArtifactsResponse,
    pub created_at: DateTime<Utc>,
    /// When the scrub after the erasure was done: on SQLite, the write-ahead log emptied (the
    /// file's freed cells are zeroed as they go), so the files hold no copy; on PostgreSQL, the
    /// tables vacuumed and analyzed, so no row version or statistic holds it (the dead rows'
    /// bytes can stay in the tables' free space until reused, and in WAL archives and backups:
    /// the README's Forgetting section). `null` until then: it runs after the answer, and no
    /// read serves the text meanwhile.
    pub storage_scrubbed_at: Option<DateTime<Utc>>,
    /// The forks (and forks of forks) that had taken erased entries, each erased there too by an
    /// erasure of its own, which its receipts list. In the answer to the erasure only.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub forks: Vec<ForkErasure>,
    /// The tenant's other threads that still held copies of the erased entries when the erasure
    /// was answered: an erasure reaches the forks below its thread, not the thread it was forked
    /// from (whose entries below the fork's `forked_at_seq` it copied), that thread's ancestors,
    /// nor their other forks. Erase there too if the text must go everywhere: an erasure in the
    /// topmost of them reaches every fork that copied it. Ancestors first, nearest first; at
    /// most 1,000. Absent from the receipts of erasures made in forks by their parent's, of
    /// retention trims, and of erasures made before it was recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub still_held_by: Option<Vec<String>>,
    /// True when more threads held copies than the 1,000 `still_held_by` names.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub still_held_by_truncated: bool,
    /// The write's consistency token (also the `Loupe-LSN` header): send it back with a read
    /// (`Loupe-LSN` or `min_lsn`) to see this write on a read standby. Present only where the
    /// service reads from standbys.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(
        pattern = r"^[0-9A-Fa-f]{1,8}/[0-9A-Fa-f]{1,8}$",
        example = "0/3000148"
    )]
    pub lsn: Option<String>,
}

/// An erasure made in a fork because its parent's entries were erased.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ForkErasure {
    pub thread_id: String,
    pub erasure_id: String,
    /// The fork's erased seqs: those of the parent's erasure that the fork took.
    pub seqs: Vec<i64>,
}

impl ErasureReceipt {
    fn new(thread_id: ThreadId, mut erasure: Erasure) -> Self {
        let still_held_by = erasure.artifacts.still_held_by.take();
        let still_held_by_truncated = erasure.artifacts.still_held_by_truncated;
        ErasureReceipt {
            erasure_id: erasure.erasure_id,
            thread_id: thread_id.into_string(),
            seqs: erasure.seqs,
            reason: erasure.reason,
            artifacts: erasure.artifacts.into(),
            created_at: erasure.created_at,
            storage_scrubbed_at: erasure.scrubbed_at,
            still_held_by,
            still_held_by_truncated,
            forks: Vec::new(),
            lsn: None,
        }
    }
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ErasureList {
    /// A page of the thread's erasures, oldest first.
    pub erasures: Vec<ErasureReceipt>,
    /// Where the next page starts (`after`), when there is one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_after: Option<String>,
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ListErasuresQuery {
    /// Return the erasures after this one (from the first when omitted).
    #[param(max_length = 64, pattern = r"^[^\u0000]*$")]
    pub after: Option<String>,
    /// Page size, 1–1000 (default 100).
    #[param(minimum = 1, maximum = 1000)]
    pub limit: Option<u32>,
}

/// Erase entries: their content goes from the record and from every copy derived from it, for
/// good. Unlike a snip, which only hides, an erasure leaves a tombstone in the raw record too
/// (the messages API, export, cursors).
///
/// In one transaction, each entry becomes a tombstone (seq, uuid, `type` and role kept, content
/// and any hash of it gone); the outline lines that may hold it are rebuilt without a model
/// (a tree job summarizes them again later); each compaction summary that covered it is derived
/// again, without a model, from what remains; and any job that read the thread before can no
/// longer write. Cached contexts are dropped. From the answer on, no read serves the erased
/// text, and every context stays valid: an erased `tool_use` or `tool_result` is repaired as a
/// missing one is, and reported with the repair `erased`. The database files are scrubbed
/// after the answer (`storage_scrubbed_at` in the receipt says when).
#[utoipa::path(
    post, path = "/v1/threads/{thread_id}/erasures", tag = "context", operation_id = "createErasure",
    params(ThreadPath),
    request_body = ErasureRequestBody,
    responses(
        (status = 201, description = "Erased; the receipt", body = ErasureReceipt),
        MalformedJson,
        ThreadNotFound,
        (status = 409, description = "The thread holds no entry with a uuid or seq the request names (`no-such-message`; `errors[0].field` is `uuids` or `seqs`); nothing was erased", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Nothing named, more than 1,000 in one list, or an invalid uuid or reason (`validation`; `errors[0].field` names it)", body = Problem, content_type = "application/problem+json"),
        Overloaded,
    )
)]
pub async fn create_erasure(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
    ApiPath(path): ApiPath<ThreadPath>,
    ApiJson(body): ApiJson<ErasureRequestBody>,
) -> Result<(StatusCode, Written, Json<ErasureReceipt>), ApiError> {
    let uuids = body.uuids.unwrap_or_default();
    for (index, uuid) in uuids.iter().enumerate() {
        // An empty uuid names no entry: 409 `no-such-message`, as any uuid the thread lacks.
        super::check_key_field(&format!("uuids[{index}]"), uuid, MAX_UUID_LEN)?;
    }
    let targets = ErasureTargets {
        uuids: named_once("uuids", uuids)?,
        seqs: named_once("seqs", body.seqs.unwrap_or_default())?,
    };
    if targets.is_empty() {
        return Err(ApiError::invalid_field(
            "uuids",
            "name at least one entry, by uuids, seqs or both",
        ));
    }
    if let Some(reason) = &body.reason {
        super::check_key_field("reason", reason, MAX_REASON_CHARS)?;
    }
    // Rebuilding summaries reads what they covered: one of the tenant's expensive slots.
    let slot = ExpensiveSlot::acquire(&state.guards, &tenant.0).await?;
    let thread_id = path.thread_id.clone();
    let request = ErasureRequest {
        targets,
        reason: body.reason,
    };
    // On a task of its own, holding the slot: a client that goes away after the commit does not
    // stop what follows it (the cache dropped, the files scrubbed, the tree job enqueued).
    let (spawned_state, spawned_tenant) = (state.clone(), tenant.clone());
    let erasure = tokio::spawn(async move {
        let (state, tenant) = (spawned_state, spawned_tenant);
        let _slot = slot;
        // Dropped before and after: a read that started before the erasure may put its
        // checkpoint back meanwhile (never served: the epoch in its key is an old one).
        let dropped = state.context_cache.forget_thread(&tenant, &thread_id) as u64;
        let thread_key = state
            .store
            .thread_head(&tenant, &thread_id)
            .await?
            .thread_key;
        let mut erasure = erase(&state.store, &tenant, &thread_id, request, dropped).await?;
        state.context_cache.forget_thread(&tenant, &thread_id);
        // Remembered at once, and here rather than in the handler: this process's reads must
        // wait for the erasure on a standby even if the fan-out below fails or the client is
        // gone before its answer.
        let mut position = Written::remembered(&state, &tenant, Some(&thread_id)).await;
        // Then every copy made of what it erased: the forks. The answer waits for them, so an
        // answered erasure has reached every fork; one cut short is retried whole by the client.
        let reason = format!(
            "erased in {thread_id}, which this thread was forked from ({})",
            erasure.erasure_id
        );
        let forks =
            erase_in_forks(&state.store, &tenant, &thread_key, &erasure.seqs, &reason).await?;
        for (fork, fork_erasure) in &forks {
            state.context_cache.forget_thread(&tenant, fork);
            state.store.queue_scrub(fork_erasure.erasure_id.clone());
            if fork_erasure.artifacts.tree_nodes > 0 {
                state.store.enqueue_tree(&tenant, fork).await?;
            }
        }
        // Not the threads it was forked from, nor their other forks: the receipt names those
        // still holding copies (kept with it), for the caller to erase there too.
        let held = held_elsewhere(&state.store, &tenant, &thread_key, &erasure.seqs).await?;
        erasure.artifacts.still_held_by = Some(
            held.thread_ids
                .into_iter()
                .map(ThreadId::into_string)
                .collect(),
        );
        erasure.artifacts.still_held_by_truncated = held.truncated;
        state
            .store
            .record_artifacts(&erasure.erasure_id, &erasure.artifacts)
            .await?;
        // And each fork it reached, past the forks' commits: a read of one must not find a
        // standby's copy of its text. The answer's token covers them (and the receipt) too.
        position = Written::remembered(&state, &tenant, Some(&thread_id))
            .await
            .or(position);
        if let Some(lsn) = position {
            for (fork, _) in &forks {
                state.store.remember_write(&tenant, fork, lsn);
            }
        }
        state.store.queue_scrub(erasure.erasure_id.clone());
        // A tree job summarizes the stand-ins again with the thread's summarizer.
        if erasure.artifacts.tree_nodes > 0 {
            state.store.enqueue_tree(&tenant, &thread_id).await?;
        }
        Ok::<_, crate::store::StoreError>((erasure, forks, position))
    })
    .await
    .map_err(|_| ApiError::new(super::problem::ProblemKind::Internal, "the erasure stopped"))??;
    let (erasure, forks, position) = erasure;
    let written = Written(position.map(|lsn| lsn.to_string()));
    let receipt = ErasureReceipt {
        lsn: written.lsn(),
        forks: forks
            .into_iter()
            .map(|(thread_id, erasure)| ForkErasure {
                thread_id: thread_id.into_string(),
                erasure_id: erasure.erasure_id,
                seqs: erasure.seqs,
            })
            .collect(),
        ..ErasureReceipt::new(path.thread_id, erasure)
    };
    Ok((StatusCode::CREATED, written, Json(receipt)))
}

/// List a thread's erasures: their receipts, oldest first, without content.
#[utoipa::path(
    get, path = "/v1/threads/{thread_id}/erasures", tag = "context", operation_id = "listErasures",
    params(ThreadPath, ListErasuresQuery),
    responses(
        (status = 200, description = "A page of receipts; go on from `next_after`", body = ErasureList),
        ThreadNotFound,
    )
)]
pub async fn list_erasures(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
    ApiPath(path): ApiPath<ThreadPath>,
    ApiQuery(query): ApiQuery<ListErasuresQuery>,
) -> Result<Json<ErasureList>, ApiError> {
    let limit = super::page_limit(query.limit, 100, 1_000)?;
    if query
        .after
        .as_ref()
        .is_some_and(|after| after.len() > 64 || after.contains('\0'))
    {
        return Err(ApiError::bad_request("after must be an erasure id"));
    }
    let mut erasures = state
        .store
        .erasures(&tenant, &path.thread_id, query.after.as_deref(), limit + 1)
        .await?;
    let more = erasures.len() > limit as usize;
    erasures.truncate(limit as usize);
    let next_after = more
        .then(|| erasures.last().map(|erasure| erasure.erasure_id.clone()))
        .flatten();
    Ok(Json(ErasureList {
        erasures: erasures
            .into_iter()
            .map(|erasure| ErasureReceipt::new(path.thread_id.clone(), erasure))
            .collect(),
        next_after,
    }))
}
