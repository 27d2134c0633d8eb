//! `/v1/threads/{thread_id}/settings`: the auto-compaction threshold, micro-compaction and
//! clearing of the context view, outline mode.

use super::consistency::Written;
use axum::extract::State;
use axum::Json;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use utoipa_axum::{router::OpenApiRouter, routes};

use super::answers::{MalformedJson, ThreadNotFound};
use super::problem::{ApiError, ApiJson, ApiPath, Problem};
use super::threads::ThreadPath;
use super::{AppState, Tenant};
use crate::history::ingest::FieldError;
use crate::history::normalize::ids::{is_valid_tool_name, TOOL_NAME_RULE};
use crate::history::normalize::ClearingOptions;
use crate::history::MicrocompactOptions;
use crate::store::{ClearingSettings, MicrocompactSettings, ThreadSettings};
use crate::tree::OutlineOptions;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(get_settings, put_settings))
}

/// The bounds of the settings, which the refusals name: most compactable tool names and most
/// recent results kept in micro-compaction; an outline's line and total bytes and its tail's
/// tokens; the token and byte sizes of clearing and micro-compaction.
const MAX_TOOLS: usize = 256;
const MAX_KEEP_RECENT: u64 = 100_000;
const MAX_LINE_BYTES: usize = 16_384;
const MAX_OUTLINE_BYTES: usize = 10_000_000;
/// Fewest lines an outline's budget holds: `budget_bytes` is at least this many `line_bytes`.
const MIN_OUTLINE_LINES: usize = 4;
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
    /// 2,000; the newest result is always whole).
    #[schema(maximum = 10000000)]
    pub keep_tokens: Option<u64>,
    /// Tokens of whole results a batch waits for beyond `keep_tokens` before it clears them at
    /// once (default 10,000): larger batches are rarer, so fewer requests are rewritten. With
    /// the outline on too, `keep_tokens + batch_tokens` must stay under its `tail_tokens`.
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
/// One rule ties two members, which the schema cannot say: `budget_bytes` ≥ 4 × `line_bytes`
/// (with their defaults filled in).
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct OutlineBody {
    /// Off unless enabled. Turning it on builds the tree of what is already stored.
    pub enabled: bool,
    /// Target bytes of one line (default 512, at least 64).
    #[schema(minimum = 64, maximum = 16384)]
    pub line_bytes: Option<usize>,
    /// Bytes of all the outline's lines; past it, old lines merge in a batch down to half
    /// (default 64,000). Cross-field rule (422 `validation` otherwise): at least 4 lines,
    /// `budget_bytes` ≥ 4 × `line_bytes`, counting the line size in force (512 when
    /// `line_bytes` is not sent).
    #[schema(minimum = 256, maximum = 10000000)]
    pub budget_bytes: Option<usize>,
    /// Estimated tokens of the messages sent whole after the outline; past it, whole rounds move
    /// into the outline down to a quarter (default 16,000). With clearing on, cleared results
    /// count as their stubs.
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

/// A thread's settings. `null` (or absent) means the server default. Beside each member's own
/// bounds, two rules tie members (422 `validation` otherwise):
/// `outline.budget_bytes` ≥ 4 × `outline.line_bytes` (naming `outline.budget_bytes`), and, with
/// the outline and clearing both on,
/// `clearing.keep_tokens + clearing.batch_tokens` < `outline.tail_tokens` (naming
/// `clearing.batch_tokens`): clearing works within the outline's tail.
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

/// The settings a body asks for, checked: the one place their bounds are enforced. A refusal
/// names the first field that is wrong, in the order of the body's members.
impl TryFrom<ThreadSettingsBody> for ThreadSettings {
    type Error = FieldError;

    fn try_from(body: ThreadSettingsBody) -> Result<Self, FieldError> {
        if body.auto_compact_tokens.is_some_and(|n| n < 0) {
            return Err(refused("auto_compact_tokens", "must be 0 (off) or more"));
        }
        let microcompact = body
            .microcompact
            .map(MicrocompactSettings::try_from)
            .transpose()?;
        let outline = body
            .outline
            .as_ref()
            .map(OutlineBody::checked)
            .transpose()?;
        let clearing = body.clearing.map(ClearingSettings::try_from).transpose()?;
        // Outlined, the context clears within the tail only: results past the tail are lines.
        let tail = outline.filter(|o| o.enabled).map(|o| o.tail_tokens);
        let whole = clearing
            .as_ref()
            .filter(|c| c.enabled)
            .map(|c| c.options().most_whole_tokens());
        if let (Some(tail), Some(whole)) = (tail, whole) {
            if whole >= i64::try_from(tail).unwrap_or(i64::MAX) {
                return Err(refused(
                    "clearing.batch_tokens",
                    format!(
                        "keep_tokens + batch_tokens ({whole}) must be under outline.tail_tokens \
                         ({tail}) when both are on: the tail never holds more, so nothing would \
                         be cleared"
                    ),
                ));
            }
        }
        Ok(ThreadSettings {
            auto_compact_tokens: body.auto_compact_tokens,
            microcompact,
            outline,
            clearing,
        })
    }
}

impl TryFrom<MicrocompactBody> for MicrocompactSettings {
    type Error = FieldError;

    fn try_from(body: MicrocompactBody) -> Result<Self, FieldError> {
        if let Some(tools) = &body.tools {
            if tools.len() > MAX_TOOLS {
                return Err(refused(
                    "microcompact.tools",
                    format!("at most {MAX_TOOLS} tool names"),
                ));
            }
            if let Some(bad) = tools.iter().position(|t| !is_valid_tool_name(t)) {
                return Err(refused(
                    format!("microcompact.tools[{bad}]"),
                    format!("a tool name is {TOOL_NAME_RULE}"),
                ));
            }
        }
        at_most(
            "microcompact.keep_recent",
            body.keep_recent,
            MAX_KEEP_RECENT,
        )?;
        at_most("microcompact.min_bytes", body.min_bytes, MAX_MIN_BYTES)?;
        Ok(MicrocompactSettings {
            enabled: body.enabled,
            tools: body.tools,
            keep_recent: body.keep_recent,
            min_bytes: body.min_bytes,
        })
    }
}

impl TryFrom<ClearingBody> for ClearingSettings {
    type Error = FieldError;

    fn try_from(body: ClearingBody) -> Result<Self, FieldError> {
        at_most("clearing.keep_tokens", body.keep_tokens, MAX_TAIL_TOKENS)?;
        at_most("clearing.batch_tokens", body.batch_tokens, MAX_TAIL_TOKENS)?;
        at_most("clearing.min_bytes", body.min_bytes, MAX_MIN_BYTES)?;
        Ok(ClearingSettings {
            enabled: body.enabled,
            keep_tokens: body.keep_tokens,
            batch_tokens: body.batch_tokens,
            min_bytes: body.min_bytes,
        })
    }
}

impl OutlineBody {
    /// The options with the defaults filled in, checked as a whole: the budget's floor depends
    /// on the line size, sent or not.
    fn checked(&self) -> Result<OutlineOptions, FieldError> {
        let outline = self.options();
        let min_line = OutlineOptions::MIN_LINE_BYTES;
        if !(min_line..=MAX_LINE_BYTES).contains(&outline.line_bytes) {
            return Err(refused(
                "outline.line_bytes",
                format!("between {min_line} and {MAX_LINE_BYTES}"),
            ));
        }
        if outline.budget_bytes < MIN_OUTLINE_LINES * outline.line_bytes
            || outline.budget_bytes > MAX_OUTLINE_BYTES
        {
            return Err(refused(
                "outline.budget_bytes",
                format!(
                    "at least {MIN_OUTLINE_LINES} lines ({MIN_OUTLINE_LINES} × line_bytes) and at most {MAX_OUTLINE_BYTES}"
                ),
            ));
        }
        if !(1..=MAX_TAIL_TOKENS).contains(&outline.tail_tokens) {
            return Err(refused(
                "outline.tail_tokens",
                format!("between 1 and {MAX_TAIL_TOKENS}"),
            ));
        }
        Ok(outline)
    }
}

fn refused(path: impl Into<String>, problem: impl Into<String>) -> FieldError {
    FieldError {
        path: path.into(),
        problem: problem.into(),
    }
}

/// Refuses `value` above `max`, naming `path`.
fn at_most(path: &str, value: Option<u64>, max: u64) -> Result<(), FieldError> {
    match value {
        Some(n) if n > max => Err(refused(path, format!("at most {max}"))),
        _ => Ok(()),
    }
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
        lsn: None,
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
) -> Result<(Written, Json<ThreadSettingsResponse>), ApiError> {
    let settings = ThreadSettings::try_from(body).map_err(ApiError::field)?;
    state
        .store
        .put_thread_settings(&tenant, &path.thread_id, &settings)
        .await?;
    let written = Written::now(&state, &tenant, Some(&path.thread_id)).await;
    let answer = ThreadSettingsResponse {
        lsn: written.lsn(),
        ..response(settings, state.store.default_auto_compact_tokens())
    };
    Ok((written, Json(answer)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn body(value: serde_json::Value) -> ThreadSettingsBody {
        serde_json::from_value(value).expect("a settings body")
    }

    fn refusal(value: serde_json::Value) -> FieldError {
        ThreadSettings::try_from(body(value)).expect_err("refused")
    }

    #[test]
    fn a_body_becomes_the_settings_it_asks_for() {
        let settings = ThreadSettings::try_from(body(json!({
            "auto_compact_tokens": 0,
            "microcompact": {"enabled": true, "tools": ["Read"], "keep_recent": 3},
            "outline": {"enabled": true, "line_bytes": 64},
            "clearing": {"enabled": true, "min_bytes": 500},
        })))
        .unwrap();
        assert_eq!(settings.auto_compact_tokens, Some(0));
        let microcompact = settings.microcompact.unwrap();
        assert_eq!(
            microcompact.tools.as_deref(),
            Some(&["Read".to_owned()][..])
        );
        assert_eq!(microcompact.keep_recent, Some(3));
        let outline = settings.outline.unwrap();
        assert_eq!(outline.line_bytes, 64);
        assert_eq!(outline.budget_bytes, OutlineOptions::DEFAULT_BUDGET_BYTES);
        assert_eq!(settings.clearing.unwrap().min_bytes, Some(500));
        assert_eq!(
            ThreadSettings::try_from(ThreadSettingsBody::default()).unwrap(),
            ThreadSettings::default()
        );
    }

    /// Each refusal names its field and states the bound the constants set.
    #[test]
    fn refusals_name_the_field_and_the_bound_of_its_constant() {
        let tools = vec!["Read"; MAX_TOOLS + 1];
        let error = refusal(json!({"microcompact": {"enabled": true, "tools": tools}}));
        assert_eq!(error.path, "microcompact.tools");
        assert!(error.problem.contains(&MAX_TOOLS.to_string()), "{error}");
        let error = refusal(json!({"microcompact": {"enabled": true, "tools": ["Read", "a b"]}}));
        assert_eq!(error.path, "microcompact.tools[1]");
        assert!(error.problem.contains(TOOL_NAME_RULE), "{error}");
        let error =
            refusal(json!({"microcompact": {"enabled": true, "keep_recent": MAX_KEEP_RECENT + 1}}));
        assert_eq!(error.path, "microcompact.keep_recent");
        assert!(error.problem.contains(&MAX_KEEP_RECENT.to_string()));
        let error =
            refusal(json!({"outline": {"enabled": true, "line_bytes": MAX_LINE_BYTES + 1}}));
        assert_eq!(error.path, "outline.line_bytes");
        assert!(error.problem.contains(&MAX_LINE_BYTES.to_string()));
        assert!(error
            .problem
            .contains(&OutlineOptions::MIN_LINE_BYTES.to_string()));
        // The budget's floor counts the default line size when none is sent.
        let floor = MIN_OUTLINE_LINES * OutlineOptions::DEFAULT_LINE_BYTES;
        assert!(ThreadSettings::try_from(body(
            json!({"outline": {"enabled": true, "budget_bytes": floor}})
        ))
        .is_ok());
        let error = refusal(json!({"outline": {"enabled": true, "budget_bytes": floor - 1}}));
        assert_eq!(error.path, "outline.budget_bytes");
        assert!(error.problem.contains(&MAX_OUTLINE_BYTES.to_string()));
        assert!(error.problem.contains(&MIN_OUTLINE_LINES.to_string()));
        let error = refusal(json!({"outline": {"enabled": true, "tail_tokens": 0}}));
        assert_eq!(error.path, "outline.tail_tokens");
        assert!(error.problem.contains(&MAX_TAIL_TOKENS.to_string()));
        // Outlined and cleared, clearing must fit inside the tail, or it clears nothing.
        let both = |tail: u64, keep: u64, batch: u64| {
            json!({"outline": {"enabled": true, "tail_tokens": tail},
                "clearing": {"enabled": true, "keep_tokens": keep, "batch_tokens": batch}})
        };
        let error = refusal(both(12_000, 2_000, 10_000));
        assert_eq!(error.path, "clearing.batch_tokens");
        assert!(
            error.problem.contains("outline.tail_tokens (12000)"),
            "{error:?}"
        );
        assert!(ThreadSettings::try_from(body(both(12_001, 2_000, 10_000))).is_ok());
        // Either one off, the sizes are free.
        assert!(ThreadSettings::try_from(body(json!({
            "outline": {"enabled": false, "tail_tokens": 100},
            "clearing": {"enabled": true, "keep_tokens": 2_000, "batch_tokens": 10_000}})))
        .is_ok());
        let error =
            refusal(json!({"clearing": {"enabled": true, "batch_tokens": MAX_TAIL_TOKENS + 1}}));
        assert_eq!(error.path, "clearing.batch_tokens");
        let error = refusal(json!({"auto_compact_tokens": -1}));
        assert_eq!(error.path, "auto_compact_tokens");
    }

    /// The bounds the document states are the bounds the conversion enforces.
    #[test]
    fn the_document_states_the_constants() {
        let document = crate::http::openapi();
        let schema = |name: &str, field: &str| {
            document["components"]["schemas"][name]["properties"][field].clone()
        };
        assert_eq!(schema("MicrocompactBody", "tools")["maxItems"], MAX_TOOLS);
        assert_eq!(
            schema("MicrocompactBody", "keep_recent")["maximum"],
            MAX_KEEP_RECENT
        );
        assert_eq!(
            schema("MicrocompactBody", "min_bytes")["maximum"],
            MAX_MIN_BYTES
        );
        assert_eq!(
            schema("OutlineBody", "line_bytes")["maximum"],
            MAX_LINE_BYTES
        );
        assert_eq!(
            schema("OutlineBody", "line_bytes")["minimum"],
            OutlineOptions::MIN_LINE_BYTES
        );
        assert_eq!(
            schema("OutlineBody", "budget_bytes")["maximum"],
            MAX_OUTLINE_BYTES
        );
        assert_eq!(
            schema("OutlineBody", "budget_bytes")["minimum"],
            MIN_OUTLINE_LINES * OutlineOptions::MIN_LINE_BYTES
        );
        assert_eq!(
            schema("OutlineBody", "tail_tokens")["maximum"],
            MAX_TAIL_TOKENS
        );
        for field in ["keep_tokens", "batch_tokens"] {
            assert_eq!(schema("ClearingBody", field)["maximum"], MAX_TAIL_TOKENS);
        }
        assert_eq!(
            schema("ClearingBody", "min_bytes")["maximum"],
            MAX_MIN_BYTES
        );
    }
}
