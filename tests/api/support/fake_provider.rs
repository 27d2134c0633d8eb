//! Test helpers: history builders and a scriptable fake of the Anthropic and OpenAI HTTP APIs.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use loupe::history::model::Entry;
use serde_json::{json, Value};

// ---------------------------------------------------------------------------------------------
// History builders

pub fn entry(v: Value) -> Entry {
    serde_json::from_value(v).expect("valid entry")
}

pub fn user(text: &str) -> Entry {
    entry(json!({"type": "user", "uuid": format!("uuid-{text:.8}"),
        "message": {"role": "user", "content": text}}))
}

pub fn user_blocks(blocks: Value) -> Entry {
    entry(json!({"type": "user", "message": {"role": "user", "content": blocks}}))
}

pub fn meta(text: &str) -> Entry {
    entry(json!({"type": "user", "is_meta": true, "message": {"role": "user", "content": text}}))
}

pub fn assistant(text: &str) -> Entry {
    entry(
        json!({"type": "assistant", "message": {"role": "assistant", "id": "msg_0001",
        "content": [{"type": "text", "text": text}]}}),
    )
}

pub fn assistant_blocks(blocks: Value) -> Entry {
    entry(
        json!({"type": "assistant", "message": {"role": "assistant", "id": "msg_0002",
        "content": blocks}}),
    )
}

pub fn tool_use(id: &str, name: &str, input: Value) -> Entry {
    assistant_blocks(json!([{"type": "tool_use", "id": id, "name": name, "input": input}]))
}

pub fn tool_result(id: &str, content: &str, is_error: bool) -> Entry {
    user_blocks(
        json!([{"type": "tool_result", "tool_use_id": id, "content": content,
        "is_error": is_error}]),
    )
}

/// A realistic little session: prompts, thinking, tool calls, an error, an image, a decision.
pub fn session() -> Vec<Entry> {
    vec![
        user("Please fix the failing parser test in src/parser.rs, and keep the public API unchanged."),
        assistant_blocks(json!([
            {"type": "thinking", "thinking": "SECRET-THOUGHT about the parser", "signature": "sig"},
            {"type": "text", "text": "Let me read the file."},
            {"type": "tool_use", "id": "toolu_01ABC", "name": "Read", "input": {"file_path": "src/parser.rs"}}
        ])),
        tool_result("toolu_01ABC", &"fn parse() {}\n".repeat(40), false),
        tool_use("toolu_02DEF", "Bash", json!({"command": "cargo test parser", "description": "run tests"})),
        tool_result(
            "toolu_02DEF",
            "running 3 tests\nerror[E0308]: mismatched types in src/parser.rs:42\ntest result: FAILED",
            true,
        ),
        assistant("The root cause is the tokenizer returning a &str instead of a String. I will change the tokenizer instead of the parser because the API must stay the same."),
        meta("<system-reminder>REMINDER-META do not show</system-reminder>"),
        user_blocks(json!([
            {"type": "text", "text": "Here is a screenshot of the failure; use thiserror for the new error type."},
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgoAAAANSUhEUgAAAAE"}}
        ])),
        tool_use("toolu_03GHI", "Edit", json!({"file_path": "src/tokenizer.rs", "old_string": "a", "new_string": "b"})),
        tool_result("toolu_03GHI", "ok", false),
        assistant("Done editing; the tokenizer now returns String."),
    ]
}

// ---------------------------------------------------------------------------------------------
// The fake provider server

/// What the fake does with one request.
#[derive(Debug, Clone)]
pub enum Step {
    /// A successful reply with this text.
    Reply(String),
    /// 429, with this `retry-after` header value when given.
    RateLimited(Option<&'static str>),
    /// 429 with `retry-after-ms`.
    RateLimitedMs(&'static str),
    /// This status with a provider-shaped error body.
    Status(u16),
    /// Sleep this long, then the default reply.
    Sleep(Duration),
    /// 200 with a body that is not JSON.
    Malformed,
    /// 200, well-formed, with no text (Anthropic: no text block; OpenAI: null content).
    NoText,
}

#[derive(Debug, Clone)]
pub struct Recorded {
    pub path: String,
    pub headers: HeaderMap,
    pub body: Value,
}

impl Recorded {
    /// The user message text sent (both providers).
    pub fn user_text(&self) -> String {
        let messages = self.body["messages"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        messages
            .iter()
            .filter(|m| m["role"] == "user")
            .filter_map(|m| m["content"].as_str().map(str::to_string))
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// The system prompt (Anthropic `system`, OpenAI the system message).
    pub fn system_text(&self) -> String {
        if let Some(s) = self.body["system"].as_str() {
            return s.to_string();
        }
        let messages = self.body["messages"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        messages
            .iter()
            .filter(|m| m["role"] == "system")
            .filter_map(|m| m["content"].as_str().map(str::to_string))
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// The transcript between `<transcript>` tags.
    pub fn transcript(&self) -> String {
        let text = self.user_text();
        let start = text.find("<transcript>\n").map(|i| i + 13).unwrap_or(0);
        let end = text.find("\n</transcript>").unwrap_or(text.len());
        text[start..end].to_string()
    }
}

#[derive(Default)]
struct FakeState {
    script: Mutex<VecDeque<Step>>,
    requests: Mutex<Vec<Recorded>>,
    violations: Mutex<Vec<String>>,
    api_key: Option<String>,
}

/// A fake provider on 127.0.0.1:<random port>, serving `/v1/messages` (Anthropic) and
/// `/v1/chat/completions` (OpenAI). With an empty script it replies
/// `<analysis>…</analysis><summary>SUMMARY-<n></summary>`, n = the request's number from 1.
pub struct Fake {
    pub base_url: String,
    state: Arc<FakeState>,
}

impl Fake {
    pub async fn start(api_key: Option<&str>, script: Vec<Step>) -> Fake {
        let state = Arc::new(FakeState {
            script: Mutex::new(script.into()),
            api_key: api_key.map(str::to_string),
            ..Default::default()
        });
        let app = Router::new()
            .route("/v1/messages", post(anthropic))
            .route("/v1/chat/completions", post(openai))
            .with_state(state.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            axum::serve(listener, app).await.unwrap();
        });
        Fake {
            base_url: format!("http://{addr}"),
            state,
        }
    }

    pub fn requests(&self) -> Vec<Recorded> {
        self.state.requests.lock().unwrap().clone()
    }

    pub fn violations(&self) -> Vec<String> {
        self.state.violations.lock().unwrap().clone()
    }
}

fn default_reply(n: usize) -> String {
    format!("<analysis>\nWent through it.\n</analysis>\n\n<summary>\nSUMMARY-{n}\n</summary>")
}

enum Provider {
    Anthropic,
    OpenAi,
}

fn record(state: &FakeState, path: &str, headers: &HeaderMap, body: &Bytes) -> (usize, Value) {
    let parsed: Value = serde_json::from_slice(body).unwrap_or_else(|e| {
        state
            .violations
            .lock()
            .unwrap()
            .push(format!("{path}: body is not JSON: {e}"));
        Value::Null
    });
    let mut requests = state.requests.lock().unwrap();
    requests.push(Recorded {
        path: path.to_string(),
        headers: headers.clone(),
        body: parsed.clone(),
    });
    (requests.len(), parsed)
}

fn header<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

fn validate_anthropic(state: &FakeState, headers: &HeaderMap, body: &Value) -> Vec<String> {
    let mut v = Vec::new();
    if header(headers, "x-api-key") != state.api_key.as_deref() {
        v.push(format!("x-api-key is {:?}", header(headers, "x-api-key")));
    }
    if header(headers, "anthropic-version") != Some("2023-06-01") {
        v.push("anthropic-version missing or wrong".into());
    }
    if !header(headers, "content-type").is_some_and(|c| c.starts_with("application/json")) {
        v.push("content-type is not JSON".into());
    }
    if body["model"].as_str().is_none_or(str::is_empty) {
        v.push("model missing".into());
    }
    if body["max_tokens"].as_u64().is_none_or(|n| n == 0) {
        v.push("max_tokens missing".into());
    }
    if !body["system"].is_string() {
        v.push("system is not a string".into());
    }
    match body["messages"].as_array() {
        Some(m) if !m.is_empty() => {
            if m[0]["role"] != "user" {
                v.push("first message is not user".into());
            }
            for msg in m {
                if !matches!(msg["role"].as_str(), Some("user" | "assistant")) {
                    v.push(format!("bad role {}", msg["role"]));
                }
                if !(msg["content"].is_string() || msg["content"].is_array()) {
                    v.push("bad content".into());
                }
            }
        }
        _ => v.push("messages missing or empty".into()),
    }
    for key in body
        .as_object()
        .map(|o| o.keys().cloned().collect::<Vec<_>>())
        .unwrap_or_default()
    {
        if !matches!(
            key.as_str(),
            "model" | "max_tokens" | "system" | "messages" | "temperature" | "metadata"
        ) {
            v.push(format!("unexpected field {key}"));
        }
    }
    v
}

fn validate_openai(state: &FakeState, headers: &HeaderMap, body: &Value) -> Vec<String> {
    let mut v = Vec::new();
    let expected = state.api_key.as_ref().map(|k| format!("Bearer {k}"));
    if header(headers, "authorization") != expected.as_deref() {
        v.push(format!(
            "authorization is {:?}",
            header(headers, "authorization")
        ));
    }
    if !header(headers, "content-type").is_some_and(|c| c.starts_with("application/json")) {
        v.push("content-type is not JSON".into());
    }
    if body["model"].as_str().is_none_or(str::is_empty) {
        v.push("model missing".into());
    }
    if body.get("max_tokens").is_some_and(|n| n.as_u64().is_none()) {
        v.push("max_tokens is not an integer".into());
    }
    match body["messages"].as_array() {
        Some(m) if !m.is_empty() => {
            for msg in m {
                if !matches!(msg["role"].as_str(), Some("system" | "user" | "assistant")) {
                    v.push(format!("bad role {}", msg["role"]));
                }
                if !msg["content"].is_string() {
                    v.push("content is not a string".into());
                }
            }
        }
        _ => v.push("messages missing or empty".into()),
    }
    v
}

fn json_response(status: StatusCode, body: Value) -> Response {
    (
        status,
        [("content-type", "application/json")],
        body.to_string(),
    )
        .into_response()
}

fn anthropic_ok(text: &str, model: &str) -> Value {
    json!({
        "id": "msg_01FAKE", "type": "message", "role": "assistant",
        "content": [{"type": "text", "text": text}],
        "model": model, "stop_reason": "end_turn", "stop_sequence": null,
        "usage": {"input_tokens": 1200, "output_tokens": 80}
    })
}

fn openai_ok(text: Option<&str>, model: &str) -> Value {
    json!({
        "id": "chatcmpl-FAKE", "object": "chat.completion", "created": 1_700_000_000, "model": model,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text, "refusal": null},
            "logprobs": null, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 1200, "completion_tokens": 80, "total_tokens": 1280}
    })
}

fn error_body(provider: &Provider, status: u16, message: &str) -> Value {
    match provider {
        Provider::Anthropic => {
            json!({"type": "error", "error": {"type": "api_error", "message": message}})
        }
        Provider::OpenAi => {
            json!({"error": {"message": message, "type": "server_error", "code": status}})
        }
    }
}

async fn handle(
    state: Arc<FakeState>,
    provider: Provider,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let path = match provider {
        Provider::Anthropic => "/v1/messages",
        Provider::OpenAi => "/v1/chat/completions",
    };
    let (n, parsed) = record(&state, path, &headers, &body);
    let problems = match provider {
        Provider::Anthropic => validate_anthropic(&state, &headers, &parsed),
        Provider::OpenAi => validate_openai(&state, &headers, &parsed),
    };
    if !problems.is_empty() {
        state
            .violations
            .lock()
            .unwrap()
            .extend(problems.iter().cloned());
        return json_response(
            StatusCode::BAD_REQUEST,
            error_body(&provider, 400, &problems.join("; ")),
        );
    }
    let model = parsed["model"].as_str().unwrap_or("").to_string();
    let step = state.script.lock().unwrap().pop_front();
    let ok = |text: &str| match provider {
        Provider::Anthropic => json_response(StatusCode::OK, anthropic_ok(text, &model)),
        Provider::OpenAi => json_response(StatusCode::OK, openai_ok(Some(text), &model)),
    };
    match step {
        None => ok(&default_reply(n)),
        Some(Step::Reply(text)) => ok(&text),
        Some(Step::Sleep(d)) => {
            tokio::time::sleep(d).await;
            ok(&default_reply(n))
        }
        Some(Step::RateLimited(after)) => {
            let mut r = json_response(
                StatusCode::TOO_MANY_REQUESTS,
                error_body(&provider, 429, "rate limited"),
            );
            if let Some(a) = after {
                r.headers_mut().insert("retry-after", a.parse().unwrap());
            }
            r
        }
        Some(Step::RateLimitedMs(ms)) => {
            let mut r = json_response(
                StatusCode::TOO_MANY_REQUESTS,
                error_body(&provider, 429, "rate limited"),
            );
            r.headers_mut()
                .insert("retry-after-ms", ms.parse().unwrap());
            r
        }
        Some(Step::Status(code)) => json_response(
            StatusCode::from_u16(code).unwrap(),
            error_body(&provider, code, &format!("scripted failure {code}")),
        ),
        Some(Step::Malformed) => (
            StatusCode::OK,
            [("content-type", "application/json")],
            "{\"id\": \"msg_01\", \"content\": [",
        )
            .into_response(),
        Some(Step::NoText) => match provider {
            Provider::Anthropic => {
                let mut body = anthropic_ok("", &model);
                body["content"] = json!([]);
                json_response(StatusCode::OK, body)
            }
            Provider::OpenAi => json_response(StatusCode::OK, openai_ok(None, &model)),
        },
    }
}

async fn anthropic(
    State(state): State<Arc<FakeState>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    handle(state, Provider::Anthropic, headers, body).await
}

async fn openai(State(state): State<Arc<FakeState>>, headers: HeaderMap, body: Bytes) -> Response {
    handle(state, Provider::OpenAi, headers, body).await
}
