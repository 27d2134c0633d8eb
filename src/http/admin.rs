//! `/v1/admin`: tenants and API keys. Guarded by the admin key (`LOUPE_ADMIN_KEY`, see
//! `http::guard`); a tenant's key gets 403 `forbidden`.

use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::{router::OpenApiRouter, routes};

use super::answers::{InvalidField, MalformedJson};
use super::problem::{ApiError, ApiJson, ApiPath, ApiQuery, Problem};
use super::AppState;
use crate::auth::check_tenant_id;
use crate::store::{ApiKeyRecord, StoreError, TenantId, TenantRecord};

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(create_tenant, list_tenants))
        .routes(routes!(create_key, list_keys))
        .routes(routes!(revoke_key))
}

/// Longest tenant or key name.
const MAX_NAME_LEN: usize = 200;

fn checked_tenant(field: &str, id: &str) -> Result<TenantId, ApiError> {
    check_tenant_id(id).map_err(|problem| ApiError::invalid_field(field, problem))?;
    Ok(TenantId(id.to_owned()))
}

fn check_name(name: Option<&str>) -> Result<(), ApiError> {
    match name {
        Some(name) if name.chars().count() > MAX_NAME_LEN || name.contains('\0') => {
            Err(ApiError::invalid_field(
                "name",
                format!("at most {MAX_NAME_LEN} characters, without NUL"),
            ))
        }
        _ => Ok(()),
    }
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"id": "acme", "name": "ACME Corp."}))]
pub struct CreateTenantRequest {
    /// 1–64 characters of `[A-Za-z0-9._:-]`.
    pub id: String,
    /// A display name (defaults to the id).
    pub name: Option<String>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct TenantResponse {
    pub id: String,
    pub name: String,
    pub created_at: DateTime<Utc>,
}

impl From<TenantRecord> for TenantResponse {
    fn from(tenant: TenantRecord) -> Self {
        TenantResponse {
            id: tenant.id,
            name: tenant.name,
            created_at: tenant.created_at,
        }
    }
}

#[derive(Debug, Serialize, ToSchema)]
pub struct TenantListResponse {
    pub tenants: Vec<TenantResponse>,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"tenant": "acme", "name": "ci pipeline"}))]
pub struct CreateKeyRequest {
    /// The tenant the key acts for; created when it does not exist yet.
    pub tenant: String,
    /// What the key is for.
    pub name: Option<String>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct KeyResponse {
    /// The key's id, for revoking it.
    pub id: String,
    pub tenant: String,
    pub name: String,
    /// The public part of the key: `lp_<prefix>_…`.
    pub prefix: String,
    pub created_at: DateTime<Utc>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub revoked_at: Option<DateTime<Utc>>,
}

impl From<ApiKeyRecord> for KeyResponse {
    fn from(key: ApiKeyRecord) -> Self {
        KeyResponse {
            id: key.id,
            tenant: key.tenant,
            name: key.name,
            prefix: key.prefix,
            created_at: key.created_at,
            revoked_at: key.revoked_at,
        }
    }
}

#[derive(Debug, Serialize, ToSchema)]
pub struct CreatedKeyResponse {
    #[serde(flatten)]
    pub record: KeyResponse,
    /// The key itself. Shown only now: Loupe stores only its hash.
    pub key: String,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct KeyListResponse {
    pub keys: Vec<KeyResponse>,
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ListKeysQuery {
    /// Only this tenant's keys.
    pub tenant: Option<String>,
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
pub struct KeyPath {
    /// The key's id (`key_…`).
    pub key_id: String,
}

/// Create a tenant.
#[utoipa::path(
    post, path = "/v1/admin/tenants", tag = "admin", operation_id = "createTenant",
    request_body = CreateTenantRequest,
    responses(
        (status = 201, description = "The tenant was created", body = TenantResponse),
        MalformedJson,
        (status = 409, description = "The id is taken (`tenant-exists`)", body = Problem, content_type = "application/problem+json"),
        InvalidField,
    )
)]
pub async fn create_tenant(
    State(state): State<AppState>,
    ApiJson(request): ApiJson<CreateTenantRequest>,
) -> Result<(StatusCode, Json<TenantResponse>), ApiError> {
    let tenant = checked_tenant("id", &request.id)?;
    check_name(request.name.as_deref())?;
    let created = state
        .store
        .create_tenant(&tenant, request.name.as_deref())
        .await?;
    Ok((StatusCode::CREATED, Json(created.into())))
}

/// List tenants.
#[utoipa::path(
    get, path = "/v1/admin/tenants", tag = "admin", operation_id = "listTenants",
    responses((status = 200, description = "Every tenant", body = TenantListResponse))
)]
pub async fn list_tenants(
    State(state): State<AppState>,
) -> Result<Json<TenantListResponse>, ApiError> {
    let tenants = state.store.list_tenants().await?;
    Ok(Json(TenantListResponse {
        tenants: tenants.into_iter().map(Into::into).collect(),
    }))
}

/// Create an API key. The response holds the key itself, shown only this once.
#[utoipa::path(
    post, path = "/v1/admin/keys", tag = "admin", operation_id = "createKey",
    request_body = CreateKeyRequest,
    responses(
        (status = 201, description = "The key was created", body = CreatedKeyResponse),
        MalformedJson,
        InvalidField,
    )
)]
pub async fn create_key(
    State(state): State<AppState>,
    ApiJson(request): ApiJson<CreateKeyRequest>,
) -> Result<(StatusCode, Json<CreatedKeyResponse>), ApiError> {
    let tenant = checked_tenant("tenant", &request.tenant)?;
    check_name(request.name.as_deref())?;
    let created = create_key_retrying(&state, &tenant, request.name.as_deref()).await?;
    Ok((
        StatusCode::CREATED,
        Json(CreatedKeyResponse {
            record: created.record.into(),
            key: created.plaintext,
        }),
    ))
}

/// Creates a key, retrying once on the (unlikely) collision of random prefixes.
async fn create_key_retrying(
    state: &AppState,
    tenant: &TenantId,
    name: Option<&str>,
) -> Result<crate::store::CreatedKey, StoreError> {
    match state.store.create_api_key(tenant, name).await {
        Err(StoreError::Database(_)) => state.store.create_api_key(tenant, name).await,
        other => other,
    }
}

/// List API keys (their prefixes, never the keys).
#[utoipa::path(
    get, path = "/v1/admin/keys", tag = "admin", operation_id = "listKeys",
    params(ListKeysQuery),
    responses(
        (status = 200, description = "The keys, oldest first", body = KeyListResponse),
        (status = 422, description = "An invalid tenant id (`validation`)", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn list_keys(
    State(state): State<AppState>,
    ApiQuery(query): ApiQuery<ListKeysQuery>,
) -> Result<Json<KeyListResponse>, ApiError> {
    let tenant = match &query.tenant {
        Some(id) => Some(checked_tenant("tenant", id)?),
        None => None,
    };
    let keys = state.store.list_api_keys(tenant.as_ref()).await?;
    Ok(Json(KeyListResponse {
        keys: keys.into_iter().map(Into::into).collect(),
    }))
}

/// Revoke an API key: it is refused from now on. Revoking a revoked key changes nothing.
#[utoipa::path(
    delete, path = "/v1/admin/keys/{key_id}", tag = "admin", operation_id = "revokeKey",
    params(KeyPath),
    responses(
        (status = 204, description = "The key is revoked"),
        (status = 404, description = "No such key (`not-found`)", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn revoke_key(
    State(state): State<AppState>,
    ApiPath(path): ApiPath<KeyPath>,
) -> Result<StatusCode, ApiError> {
    state.store.revoke_api_key(&path.key_id).await?;
    Ok(StatusCode::NO_CONTENT)
}
