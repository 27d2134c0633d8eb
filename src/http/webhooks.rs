//! Webhooks: `/v1/webhooks` registers a tenant's endpoints for event kinds; their deliveries are
//! listed and replayed under `/v1/webhooks/{webhook_id}/deliveries` (`crate::webhooks` sends
//! them).

use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::{router::OpenApiRouter, routes};

use super::answers::MalformedJson;
use super::problem::{ApiError, ApiJson, ApiPath, ApiQuery, Problem};
use super::{page_limit, AppState, Tenant};
use crate::store::{
    now_millis, WebhookDelivery, WebhookEndpoint, MAX_WEBHOOKS_PER_TENANT, WEBHOOK_KINDS,
};
use crate::webhooks::{check_url, delivery_id, new_secret};

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(create_webhook, list_webhooks))
        .routes(routes!(get_webhook, delete_webhook))
        .routes(routes!(list_deliveries))
        .routes(routes!(replay_delivery))
}

const MAX_URL_CHARS: usize = 2_048;
const MAX_DESCRIPTION_CHARS: usize = 500;
const MAX_DELIVERIES_PAGE: u32 = 500;

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
pub struct WebhookPath {
    /// The endpoint's id (`wh_…`).
    #[param(max_length = 64)]
    pub webhook_id: String,
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
pub struct DeliveryPath {
    /// The endpoint's id (`wh_…`).
    #[param(max_length = 64)]
    pub webhook_id: String,
    /// The delivery's id (`whd_…`), as its `webhook-id` header named it.
    #[param(pattern = r"^whd_[0-9]{1,18}$")]
    pub delivery_id: String,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"url": "https://agents.example.com/loupe-events",
    "kinds": ["entries.appended", "thread.deleted"], "description": "search indexer"}))]
pub struct CreateWebhookRequest {
    /// Where deliveries are POSTed: an `http` or `https` URL without credentials. Loopback and
    /// private addresses are refused unless the operator allows them
    /// (`--webhooks-allow-private`).
    #[schema(max_length = 2048, pattern = r"^[Hh][Tt][Tt][Pp][Ss]?://")]
    pub url: String,
    /// The event kinds to deliver (at least one): `entries.appended`, `thread.created`,
    /// `thread.deleted`, `thread.erasure`, `thread.expired`, `thread.outline`, `thread.trimmed`.
    #[schema(min_items = 1, max_items = 7)]
    pub kinds: Vec<WebhookKind>,
    #[schema(max_length = 500)]
    pub description: Option<String>,
}

/// An event kind a webhook delivers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, ToSchema)]
pub enum WebhookKind {
    /// Entries were appended: `first_seq` to `next_seq - 1` (one delivery for a whole batch).
    #[serde(rename = "entries.appended")]
    EntriesAppended,
    /// A thread was created (a fork names `forked_from` and `forked_at_seq`).
    #[serde(rename = "thread.created")]
    ThreadCreated,
    #[serde(rename = "thread.deleted")]
    ThreadDeleted,
    /// Entries were erased: their `seqs`, and the summaries written again (`rewritten_seqs`).
    #[serde(rename = "thread.erasure")]
    ThreadErasure,
    /// A retention policy expired the thread; `thread.deleted` follows.
    #[serde(rename = "thread.expired")]
    ThreadExpired,
    /// The outline moved: a tree job saved it (`version`, and `boundary`, the first seq it
    /// leaves whole).
    #[serde(rename = "thread.outline")]
    ThreadOutline,
    /// A retention policy erased what came before the last compact boundary (`seqs`).
    #[serde(rename = "thread.trimmed")]
    ThreadTrimmed,
}

impl WebhookKind {
    fn as_str(self) -> &'static str {
        match self {
            WebhookKind::EntriesAppended => "entries.appended",
            WebhookKind::ThreadCreated => "thread.created",
            WebhookKind::ThreadDeleted => "thread.deleted",
            WebhookKind::ThreadErasure => "thread.erasure",
            WebhookKind::ThreadExpired => "thread.expired",
            WebhookKind::ThreadOutline => "thread.outline",
            WebhookKind::ThreadTrimmed => "thread.trimmed",
        }
    }
}

/// A registered endpoint.
#[derive(Debug, Serialize, ToSchema)]
pub struct WebhookResponse {
    pub id: String,
    pub url: String,
    pub kinds: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    pub created_at: DateTime<Utc>,
    /// The signing secret (`whsec_…`): shown once, in the answer that created the endpoint.
    /// Deliveries carry `webhook-id`, `webhook-timestamp` and `webhook-signature` (`v1,` and
    /// the base64 HMAC-SHA256 of `{id}.{timestamp}.{body}` keyed by the secret's base64 bytes),
    /// as the Standard Webhooks specification defines them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub secret: Option<String>,
}

impl WebhookResponse {
    fn of(endpoint: WebhookEndpoint, with_secret: bool) -> Self {
        WebhookResponse {
            id: endpoint.endpoint_id,
            url: endpoint.url,
            kinds: endpoint.kinds,
            description: endpoint.description,
            created_at: endpoint.created_at,
            secret: with_secret.then_some(endpoint.secret),
        }
    }
}

#[derive(Debug, Serialize, ToSchema)]
pub struct WebhookList {
    pub webhooks: Vec<WebhookResponse>,
}

/// One delivery of one event to one endpoint.
#[derive(Debug, Serialize, ToSchema)]
pub struct DeliveryResponse {
    /// `whd_…`: the `webhook-id` of every attempt, and the body's `id`.
    pub id: String,
    pub webhook_id: String,
    /// The event kind.
    #[serde(rename = "type")]
    pub kind: String,
    pub thread_id: String,
    /// The event's data: ids and seqs, never entry content.
    #[schema(value_type = Object)]
    pub data: Value,
    pub created_at: DateTime<Utc>,
    /// `pending`, `sending`, `delivered` or `failed` (after its last attempt; replay it).
    pub state: String,
    pub attempts: i64,
    /// While `pending`: the next attempt's time.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_attempt_at: Option<DateTime<Utc>>,
    /// The endpoint's last answer's status.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_status: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub delivered_at: Option<DateTime<Utc>>,
}

impl From<WebhookDelivery> for DeliveryResponse {
    fn from(delivery: WebhookDelivery) -> Self {
        DeliveryResponse {
            id: delivery_id(delivery.delivery_id),
            webhook_id: delivery.endpoint_id,
            kind: delivery.kind,
            thread_id: delivery.thread_id,
            data: delivery.data,
            created_at: delivery.created_at,
            state: delivery.state,
            attempts: delivery.attempts,
            next_attempt_at: delivery.next_attempt_at,
            last_status: delivery.last_status,
            last_error: delivery.last_error,
            delivered_at: delivery.delivered_at,
        }
    }
}

#[derive(Debug, Serialize, ToSchema)]
pub struct DeliveryPage {
    pub deliveries: Vec<DeliveryResponse>,
    /// Pass as `after` for the next page; absent on the last.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_after: Option<String>,
}

/// A delivery state to list.
#[derive(Debug, Clone, Copy, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum DeliveryState {
    Pending,
    Sending,
    Delivered,
    Failed,
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct DeliveryQuery {
    /// Only deliveries in this state.
    #[param(inline)]
    pub state: Option<DeliveryState>,
    /// Deliveries after this one (`whd_…`), oldest first.
    #[param(pattern = r"^whd_[0-9]{1,18}$")]
    pub after: Option<String>,
    /// At most this many (1–500, default 100).
    #[param(minimum = 1, maximum = 500)]
    pub limit: Option<u32>,
}

fn parse_delivery_id(field: &str, id: &str) -> Result<i64, ApiError> {
    id.strip_prefix("whd_")
        .filter(|n| (1..=18).contains(&n.len()) && n.bytes().all(|b| b.is_ascii_digit()))
        .and_then(|n| n.parse::<i64>().ok())
        .ok_or_else(|| ApiError::bad_request(format!("{field} must be a delivery id (whd_…)")))
}

/// Register a webhook endpoint for event kinds.
///
/// Every change of the kinds named, in any of the tenant's threads, is delivered to `url` at
/// least once, from an outbox written in the change's own transaction: a POST of
/// `{"id", "type", "timestamp", "data"}`, signed with the secret this answer holds (and no
/// other ever will). A delivery without a 2xx answer within 10 s is retried with exponential
/// backoff, 8 attempts in all, the endpoint waiting meanwhile (its deliveries go in order);
/// redirects are not followed. Past 10,000 unsent deliveries, an endpoint's oldest fail as
/// dropped (listed, and replayable).
#[utoipa::path(
    post, path = "/v1/webhooks", tag = "webhooks", operation_id = "createWebhook",
    request_body = CreateWebhookRequest,
    responses(
        (status = 201, description = "The endpoint was registered; `secret` is shown this once", body = WebhookResponse),
        MalformedJson,
        (status = 422, description = "An invalid field (`validation`): a URL the service may not send to (not http(s), credentials, a loopback or private address), no kinds, or the tenant's 16 endpoints reached", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn create_webhook(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
    ApiJson(request): ApiJson<CreateWebhookRequest>,
) -> Result<(StatusCode, Json<WebhookResponse>), ApiError> {
    if request.url.chars().count() > MAX_URL_CHARS {
        return Err(ApiError::invalid_field(
            "url",
            format!("must be at most {MAX_URL_CHARS} characters"),
        ));
    }
    let url = check_url(&request.url, state.limits.webhooks_allow_private)
        .map_err(|reason| ApiError::invalid_field("url", reason))?;
    if request.kinds.is_empty() || request.kinds.len() > WEBHOOK_KINDS.len() {
        return Err(ApiError::invalid_field(
            "kinds",
            format!("must name 1 to {} kinds", WEBHOOK_KINDS.len()),
        ));
    }
    if let Some(description) = &request.description {
        super::check_key_field("description", description, MAX_DESCRIPTION_CHARS)?;
    }
    let mut kinds: Vec<String> = Vec::new();
    for kind in request.kinds {
        let kind = kind.as_str().to_owned();
        debug_assert!(WEBHOOK_KINDS.contains(&kind.as_str()));
        if !kinds.contains(&kind) {
            kinds.push(kind);
        }
    }
    let endpoint = state
        .store
        .create_webhook(
            &tenant,
            url.as_str(),
            &kinds,
            request.description.as_deref(),
            &new_secret(),
        )
        .await?
        .ok_or_else(|| {
            ApiError::invalid_field(
                "url",
                format!("the tenant has {MAX_WEBHOOKS_PER_TENANT} endpoints, the most it may have"),
            )
        })?;
    Ok((
        StatusCode::CREATED,
        Json(WebhookResponse::of(endpoint, true)),
    ))
}

/// List the tenant's webhook endpoints (without their secrets).
#[utoipa::path(
    get, path = "/v1/webhooks", tag = "webhooks", operation_id = "listWebhooks",
    responses((status = 200, description = "The tenant's endpoints", body = WebhookList))
)]
pub async fn list_webhooks(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
) -> Result<Json<WebhookList>, ApiError> {
    let webhooks = state.store.list_webhooks(&tenant).await?;
    Ok(Json(WebhookList {
        webhooks: webhooks
            .into_iter()
            .map(|endpoint| WebhookResponse::of(endpoint, false))
            .collect(),
    }))
}

/// One webhook endpoint (without its secret).
#[utoipa::path(
    get, path = "/v1/webhooks/{webhook_id}", tag = "webhooks", operation_id = "getWebhook",
    params(WebhookPath),
    responses(
        (status = 200, description = "The endpoint", body = WebhookResponse),
        (status = 404, description = "No such endpoint in this tenant (`not-found`)", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn get_webhook(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
    ApiPath(path): ApiPath<WebhookPath>,
) -> Result<Json<WebhookResponse>, ApiError> {
    let endpoint = state.store.get_webhook(&tenant, &path.webhook_id).await?;
    Ok(Json(WebhookResponse::of(endpoint, false)))
}

/// Remove a webhook endpoint and its deliveries, sent or not.
#[utoipa::path(
    delete, path = "/v1/webhooks/{webhook_id}", tag = "webhooks", operation_id = "deleteWebhook",
    params(WebhookPath),
    responses(
        (status = 204, description = "The endpoint and its deliveries are gone"),
        (status = 404, description = "No such endpoint in this tenant (`not-found`)", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn delete_webhook(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
    ApiPath(path): ApiPath<WebhookPath>,
) -> Result<StatusCode, ApiError> {
    state
        .store
        .delete_webhook(&tenant, &path.webhook_id)
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

/// An endpoint's deliveries, oldest first: what was sent, what is waiting, what failed and why.
///
/// Ended deliveries are kept for 7 days, an endpoint's newest 10,000 at most.
#[utoipa::path(
    get, path = "/v1/webhooks/{webhook_id}/deliveries", tag = "webhooks",
    operation_id = "listWebhookDeliveries",
    params(WebhookPath, DeliveryQuery),
    responses(
        (status = 200, description = "A page of deliveries", body = DeliveryPage),
        (status = 400, description = "A bad `after` or `limit` (`bad-request`)", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such endpoint in this tenant (`not-found`)", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn list_deliveries(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
    ApiPath(path): ApiPath<WebhookPath>,
    ApiQuery(query): ApiQuery<DeliveryQuery>,
) -> Result<Json<DeliveryPage>, ApiError> {
    let limit = page_limit(query.limit, 100, MAX_DELIVERIES_PAGE)?;
    let after = match &query.after {
        Some(after) => parse_delivery_id("after", after)?,
        None => 0,
    };
    let state_name = query.state.map(|s| match s {
        DeliveryState::Pending => "pending",
        DeliveryState::Sending => "sending",
        DeliveryState::Delivered => "delivered",
        DeliveryState::Failed => "failed",
    });
    let deliveries = state
        .store
        .webhook_deliveries(&tenant, &path.webhook_id, state_name, after, limit)
        .await?;
    let next_after = (deliveries.len() == limit as usize)
        .then(|| deliveries.last().map(|d| delivery_id(d.delivery_id)))
        .flatten();
    Ok(Json(DeliveryPage {
        deliveries: deliveries.into_iter().map(Into::into).collect(),
        next_after,
    }))
}

/// Send a delivery again: pending now, with its attempts counted anew, whatever its state.
///
/// It keeps its id, so a receiver that processed it already can tell.
#[utoipa::path(
    post, path = "/v1/webhooks/{webhook_id}/deliveries/{delivery_id}/replay", tag = "webhooks",
    operation_id = "replayWebhookDelivery",
    params(DeliveryPath),
    responses(
        (status = 202, description = "The delivery is pending again", body = DeliveryResponse),
        (status = 400, description = "A malformed delivery id (`bad-request`)", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such endpoint or delivery in this tenant (`not-found`)", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn replay_delivery(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
    ApiPath(path): ApiPath<DeliveryPath>,
) -> Result<(StatusCode, Json<DeliveryResponse>), ApiError> {
    let id = parse_delivery_id("delivery_id", &path.delivery_id)?;
    let delivery = state
        .store
        .replay_delivery(&tenant, &path.webhook_id, id, now_millis())
        .await?;
    Ok((StatusCode::ACCEPTED, Json(delivery.into())))
}
