//! `/v1/threads/{thread_id}/settings`: the auto-compaction threshold, micro-compaction and
//! clearing of the context view, outline mode.

use axum::extract::State;
use axum::Json;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use utoipa_axum::{router::OpenApiRouter, routes};

use super::answers::{MalformedJson, ThreadNotFound};
use super::problem::{ApiError, ApiJson, ApiPath, Problem};
use super::threads::ThreadPath;
use super::{AppState, Tenant};
use crate::history::normalize::ids::is_valid_tool_name;
use crate::history::normalize::ClearingOptions;
use crate::history::MicrocompactOptions;
use crate::store::{ClearingSettings, MicrocompactSettings, ThreadSettings};
use crate::tree::OutlineOptions;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(get_settings, put_settings))
}

/// Most compactable tool names, and most recent results kept, in micro-compaction settings.
const MAX_TOOLS: usize = 256;
const MAX_KEEP_RECENT: u64 = 100_000;
const MAX_LINE_BYTES: usize = 16_384;
const MAX_OUTLINE_BYTES: usize = 10_000_000;
const MAX_TAIL_TOKENS: u64 = 10_000_000;
const MAX_MIN_BYTES: u64 = 1_000_000_000;

/// Micro-compaction of the context view: results of `tools` older than the last `keep_recent`
/// compactable calls, at least `min_bytes` long, are replaced by
/// `[Old tool result content cleared: <tool>, <bytes> bytes]`. Storage is never changed.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct MicrocompactBody {
    /// Off unless enabled.
    pub enabled: bool,
    /// Compactable tool names, at most 256 (default: Read, Bash, PowerShell, Grep, Glob,
    /// WebSearch, WebFetch, Edit, Write).
    #[schema(max_items = 256)]
    pub tools: Option<Vec<String>>,
    /// Most recent compactable calls whose results are kept (default 5).
    #[schema(maximum = 100000)]
    pub keep_recent: Option<u64>,
    /// Results shorter than this many bytes are kept (default 2000).
    #[schema(maximum = 1000000000)]
    pub min_bytes: Option<u64>,
}

/// Reversible clearing of old tool results in the context view (both views): an old result is
/// sent as `[Old tool result cleared: <tool>, <bytes> bytes; zoom <seq>+1 reads it whole]`, and
/// the context's `tools` offers zoom, which reads the stored message whole. Results stay whole
/// until those whole pass `keep_tokens + batch_tokens`; then the oldest are cleared, at once,
/// down to `keep_tokens`: between batches the request only grows at its end. The newest turn's
/// results are never cleared. Storage is never changed. Unset sizes take the defaults. A batch
/// rewrites the request from the oldest result it clears: on models that bind each thinking
/// block to everything before it, send `thinking=strip` (or have the provider drop such
/// blocks).
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ClearingBody {
    /// Off unless enabled.
    pub enabled: bool,
    /// Estimated tokens (bytes / 4) of the newest results left whole after a batch (default
    /// 5,000; the newest result is always whole).
    #[schema(maximum = 10000000)]
    pub keep_tokens: Option<u64>,
    /// Tokens of whole results a batch waits for beyond `keep_tokens` before it clears them at
    /// once (default 20,000): larger batches are rarer, so fewer requests are rewritten.
    #[schema(maximum = 10000000)]
    pub batch_tokens: Option<u64>,
    /// Results shorter than this many bytes are never cleared (default 1,000; never under 161,
    /// about a stub's own length).
    #[schema(maximum = 1000000000)]
    pub min_bytes: Option<u64>,
}

impl ClearingBody {
    fn of(stored: &ClearingSettings) -> Self {
        ClearingBody {
            enabled: stored.enabled,
            keep_tokens: stored.keep_tokens,
            batch_tokens: stored.batch_tokens,
            min_bytes: stored.min_bytes,
        }
    }

    fn effective(stored: Option<&ClearingSettings>) -> Self {
        let options = stored.map_or_else(ClearingOptions::default, ClearingSettings::options);
        ClearingBody {
            enabled: stored.is_some_and(|c| c.enabled),
            keep_tokens: Some(options.keep_tokens),
            batch_tokens: Some(options.batch_tokens),
            min_bytes: Some(options.min_bytes as u64),
        }
    }
}

/// Outline mode: the context's `view=outline` sends the old messages as summary lines, coarser
/// with age, and the tree of lines is built in the background. Unset sizes take the defaults.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct OutlineBody {
    /// Off unless enabled. Turning it on builds the tree of what is already stored.
    pub enabled: bool,
    /// Target bytes of one line (default 512, at least 64).
    #[schema(minimum = 64, maximum = 16384)]
    pub line_bytes: Option<usize>,
    /// Bytes of all the outline's lines, at least 4 lines (4 × `line_bytes`); past it, old lines
    /// merge in a batch down to half (default 128,000).
    #[schema(minimum = 256, maximum = 10000000)]
    pub budget_bytes: Option<usize>,
    /// Estimated tokens of the messages sent whole after the outline; past it, whole rounds move
    /// into the outline down to a quarter (default 32,000).
    #[schema(minimum = 1, maximum = 10000000)]
    pub tail_tokens: Option<u64>,
}

impl OutlineBody {
    fn options(&self) -> OutlineOptions {
        let defaults = OutlineOptions::default();
        OutlineOptions {
            enabled: self.enabled,
            line_bytes: self.line_bytes.unwrap_or(defaults.line_bytes),
            budget_bytes: self.budget_bytes.unwrap_or(defaults.budget_bytes),
            tail_tokens: self.tail_tokens.unwrap_or(defaults.tail_tokens),
        }
    }

    pub(crate) fn from_options(options: OutlineOptions) -> Self {
        OutlineBody {
            enabled: options.enabled,
            line_bytes: Some(options.line_bytes),
            budget_bytes: Some(options.budget_bytes),
            tail_tokens: Some(options.tail_tokens),
        }
    }
}

/// A thread's settings. `null` (or absent) means the server default.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"auto_compact_tokens": 100000,
    "microcompact": {"enabled": true, "tools": ["Read", "Bash", "Grep"], "keep_recent": 3, "min_bytes": 1000}}))]
pub struct ThreadSettingsBody {
    /// Auto-compaction threshold in estimated context tokens; 0 turns auto-compaction off for
    /// the thread. Default: the server's `LOUPE_AUTO_COMPACT_TOKENS` (167,000).
    #[schema(minimum = 0)]
    pub auto_compact_tokens: Option<i64>,
    pub microcompact: Option<MicrocompactBody>,
    pub outline: Option<OutlineBody>,
    pub clearing: Option<ClearingBody>,
}

/// The values in force, defaults filled in.
#[derive(Debug, Serialize, ToSchema)]
pub struct EffectiveSettings {
    /// 0 = off.
    pub auto_compact_tokens: i64,
    pub microcompact: MicrocompactBody,
    pub outline: OutlineBody,
    pub clearing: ClearingBody,
}

/// The settings as set for the thread (`null`: the server default), and in force. The stored
/// fields are spelled out rather than flattened from [`ThreadSettingsBody`], whose schema refuses
/// unknown members such as `effective`.
#[derive(Debug, Serialize, ToSchema)]
pub struct ThreadSettingsResponse {
    pub auto_compact_tokens: Option<i64>,
    pub microcompact: Option<MicrocompactBody>,
    pub outline: Option<OutlineBody>,
    pub clearing: Option<ClearingBody>,
    pub effective: EffectiveSettings,
}

fn response(settings: ThreadSettings, default_threshold: i64) -> ThreadSettingsResponse {
    let defaults = MicrocompactOptions::default();
    let stored_mc = settings.microcompact.clone();
    let effective_mc = MicrocompactBody {
        enabled: stored_mc.as_ref().is_some_and(|m| m.enabled),
        tools: Some(
            stored_mc
                .as_ref()
                .and_then(|m| m.tools.clone())
                .unwrap_or(defaults.tools),
        ),
        keep_recent: Some(
            stored_mc
                .as_ref()
                .and_then(|m| m.keep_recent)
                .unwrap_or(defaults.keep_recent as u64),
        ),
        min_bytes: Some(
            stored_mc
                .as_ref()
                .and_then(|m| m.min_bytes)
                .unwrap_or(defaults.min_bytes as u64),
        ),
    };
    ThreadSettingsResponse {
        effective: EffectiveSettings {
            auto_compact_tokens: settings.auto_compact_tokens.unwrap_or(default_threshold),
            microcompact: effective_mc,
            outline: OutlineBody::from_options(settings.outline.unwrap_or_default()),
            clearing: ClearingBody::effective(settings.clearing.as_ref()),
        },
        clearing: settings.clearing.as_ref().map(ClearingBody::of),
        outline: settings.outline.map(OutlineBody::from_options),
        auto_compact_tokens: settings.auto_compact_tokens,
        microcompact: stored_mc.map(|m| MicrocompactBody {
            enabled: m.enabled,
            tools: m.tools,
            keep_recent: m.keep_recent,
            min_bytes: m.min_bytes,
        }),
    }
}

/// The thread's settings, as stored and in force.
#[utoipa::path(
    get, path = "/v1/threads/{thread_id}/settings", tag = "threads", operation_id = "getThreadSettings",
    params(ThreadPath),
    responses(
        (status = 200, description = "The settings", body = ThreadSettingsResponse),
        ThreadNotFound,
    )
)]
pub async fn get_settings(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
    ApiPath(path): ApiPath<ThreadPath>,
) -> Result<Json<ThreadSettingsResponse>, ApiError> {
    let settings = state
        .store
        .thread_settings(&tenant, &path.thread_id)
        .await?;
    Ok(Json(response(
        settings,
        state.store.default_auto_compact_tokens(),
    )))
}

/// Replace the thread's settings (fields left out go back to the server defaults).
#[utoipa::path(
    put, path = "/v1/threads/{thread_id}/settings", tag = "threads", operation_id = "putThreadSettings",
    params(ThreadPath),
    request_body = ThreadSettingsBody,
    responses(
        (status = 200, description = "The settings now in force", body = ThreadSettingsResponse),
        MalformedJson,
        ThreadNotFound,
        (status = 422, description = "A bad value (`validation`)", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn put_settings(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
    ApiPath(path): ApiPath<ThreadPath>,
    ApiJson(body): ApiJson<ThreadSettingsBody>,
) -> Result<Json<ThreadSettingsResponse>, ApiError> {
    if body.auto_compact_tokens.is_some_and(|n| n < 0) {
        return Err(ApiError::invalid_field(
            "auto_compact_tokens",
            "must be 0 (off) or more",
        ));
    }
    if let Some(mc) = &body.microcompact {
        if let Some(tools) = &mc.tools {
            if tools.len() > MAX_TOOLS {
                return Err(ApiError::invalid_field(
                    "microcompact.tools",
                    "at most 256 tool names",
                ));
            }
            if let Some(bad) = tools.iter().position(|t| !is_valid_tool_name(t)) {
                return Err(ApiError::invalid_field(
                    format!("microcompact.tools[{bad}]"),
                    "a tool name is 1–64 characters of [a-zA-Z0-9_-]",
                ));
            }
        }
        if mc.keep_recent.is_some_and(|n| n > MAX_KEEP_RECENT) {
            return Err(ApiError::invalid_field(
                "microcompact.keep_recent",
                "at most 100000",
            ));
        }
        if mc.min_bytes.is_some_and(|n| n > MAX_MIN_BYTES) {
            return Err(ApiError::invalid_field(
                "microcompact.min_bytes",
                "at most 1,000,000,000",
            ));
        }
    }
    let outline = body.outline.as_ref().map(OutlineBody::options);
    if let Some(outline) = &outline {
        if !(OutlineOptions::MIN_LINE_BYTES..=MAX_LINE_BYTES).contains(&outline.line_bytes) {
            return Err(ApiError::invalid_field(
                "outline.line_bytes",
                "between 64 and 16384",
            ));
        }
        if outline.budget_bytes < 4 * outline.line_bytes || outline.budget_bytes > MAX_OUTLINE_BYTES
        {
            return Err(ApiError::invalid_field(
                "outline.budget_bytes",
                "at least 4 lines (4 × line_bytes) and at most 10,000,000",
            ));
        }
        if !(1..=MAX_TAIL_TOKENS).contains(&outline.tail_tokens) {
            return Err(ApiError::invalid_field(
                "outline.tail_tokens",
                "between 1 and 10,000,000",
            ));
        }
    }
    if let Some(clearing) = &body.clearing {
        let bounded = [
            (
                "clearing.keep_tokens",
                clearing.keep_tokens,
                MAX_TAIL_TOKENS,
            ),
            (
                "clearing.batch_tokens",
                clearing.batch_tokens,
                MAX_TAIL_TOKENS,
            ),
            ("clearing.min_bytes", clearing.min_bytes, MAX_MIN_BYTES),
        ];
        for (field, value, max) in bounded {
            if value.is_some_and(|n| n > max) {
                return Err(ApiError::invalid_field(field, format!("at most {max}")));
            }
        }
    }
    let settings = ThreadSettings {
        clearing: body.clearing.map(|c| ClearingSettings {
            enabled: c.enabled,
            keep_tokens: c.keep_tokens,
            batch_tokens: c.batch_tokens,
            min_bytes: c.min_bytes,
        }),
        outline,
        auto_compact_tokens: body.auto_compact_tokens,
        microcompact: body.microcompact.map(|m| MicrocompactSettings {
            enabled: m.enabled,
            tools: m.tools,
            keep_recent: m.keep_recent,
            min_bytes: m.min_bytes,
        }),
    };
    state
        .store
        .put_thread_settings(&tenant, &path.thread_id, &settings)
        .await?;
    Ok(Json(response(
        settings,
        state.store.default_auto_compact_tokens(),
    )))
}
