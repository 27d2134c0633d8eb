//! HTTP plumbing shared by the model backends: the client, status classification, `Retry-After`.

use std::time::Duration;

use reqwest::header::HeaderMap;
use reqwest::{RequestBuilder, StatusCode};
use serde_json::Value;

use super::text::cut_words;
use super::{SummarizeError, SummarizerConfig};

/// A client with the configured per-request timeout.
pub(crate) fn client(config: &SummarizerConfig) -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(config.timeout)
        .connect_timeout(config.timeout.min(Duration::from_secs(10)))
        .build()
        .unwrap_or_else(|_| reqwest::Client::new())
}

/// `{base}/v1/{path}`; a base that already ends in `/v1` is not doubled.
pub(crate) fn endpoint(base_url: &str, path: &str) -> String {
    let base = base_url.trim_end_matches('/');
    if base.ends_with("/v1") {
        format!("{base}/{path}")
    } else {
        format!("{base}/v1/{path}")
    }
}

/// The server's wait hint: `retry-after-ms` (milliseconds), else `retry-after` (seconds).
/// HTTP-date values are ignored (the backoff applies).
pub(crate) fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    let get = |name: &str| headers.get(name)?.to_str().ok()?.trim().parse::<f64>().ok();
    let valid = |v: f64| v.is_finite() && v >= 0.0;
    if let Some(ms) = get("retry-after-ms").filter(|v| valid(*v)) {
        return Some(Duration::from_secs_f64(ms / 1000.0));
    }
    get("retry-after")
        .filter(|v| valid(*v))
        .map(|s| Duration::from_secs_f64(s.min(86_400.0)))
}

fn send_error(e: reqwest::Error, config: &SummarizerConfig) -> SummarizeError {
    if e.is_timeout() {
        SummarizeError::Timeout(config.timeout)
    } else if e.is_builder() {
        SummarizeError::Config(format!("cannot build the request: {e}"))
    } else {
        SummarizeError::Transport(e.to_string())
    }
}

/// The provider's error message from an error body (`{"error":{"message":…}}` for both
/// Anthropic and OpenAI), else the body's start.
fn error_message(body: &str) -> String {
    let parsed: Option<Value> = serde_json::from_str(body).ok();
    let msg = parsed
        .as_ref()
        .and_then(|v| v.get("error"))
        .and_then(|e| e.get("message").or(Some(e)))
        .map(|m| {
            m.as_str()
                .map(str::to_string)
                .unwrap_or_else(|| m.to_string())
        })
        .unwrap_or_else(|| body.to_string());
    cut_words(&msg, 200)
}

/// Sends a request and returns the parsed JSON body of a 2xx reply; classifies everything else.
pub(crate) async fn send_json(
    request: RequestBuilder,
    config: &SummarizerConfig,
) -> Result<Value, SummarizeError> {
    let response = request.send().await.map_err(|e| send_error(e, config))?;
    let status = response.status();
    let hint = retry_after(response.headers());
    let body = response.text().await.map_err(|e| send_error(e, config))?;
    if status == StatusCode::TOO_MANY_REQUESTS {
        return Err(SummarizeError::RateLimited { retry_after: hint });
    }
    if status.is_server_error() {
        return Err(SummarizeError::Server {
            status: status.as_u16(),
            message: error_message(&body),
        });
    }
    if !status.is_success() {
        return Err(SummarizeError::Rejected {
            status: status.as_u16(),
            message: error_message(&body),
        });
    }
    serde_json::from_str(&body).map_err(|e| {
        SummarizeError::Malformed(format!("invalid JSON ({e}): {}", cut_words(&body, 120)))
    })
}
