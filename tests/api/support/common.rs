//! Test support: the real service on a fresh real database, SQLite or PostgreSQL.
//!
//! PostgreSQL comes from `TEST_DATABASE_URL` (a URL of a role that may create databases); each
//! test gets a database of its own, dropped when the test ends. `scripts/test.sh` starts a
//! local PostgreSQL and sets the variable.

use axum::body::Body;
use axum::http::{header, HeaderMap, Method, Request, StatusCode};
use axum::Router;
use http_body_util::BodyExt;
use loupe::http::{AppState, AuthMode, Limits};
use loupe::store::{Store, StoreOptions};
use serde_json::Value;
use tower::ServiceExt;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Sqlite,
    Postgres,
}

/// A database that exists for one test.
enum Scratch {
    SqliteFile(std::path::PathBuf),
    PostgresDb { admin_url: String, name: String },
}

pub struct TestApp {
    pub router: Router,
    pub store: Store,
    pub backend: Backend,
    pub limits: Limits,
    /// The database's URL, for a second connection (a "restart").
    pub url: String,
    scratch: Option<Scratch>,
}

/// The admin key of keyed test apps.
pub const ADMIN_KEY: &str = "test-admin-key-0123456789abcdef";

pub fn postgres_admin_url() -> String {
    std::env::var("TEST_DATABASE_URL").expect(
        "TEST_DATABASE_URL is not set: run the suite with scripts/test.sh, which starts PostgreSQL",
    )
}

impl TestApp {
    /// An app with the default limits but no rate limit: tests that race many requests
    /// must not trip it; the guard-rail tests turn it on with their own limits.
    pub async fn new(backend: Backend) -> TestApp {
        let limits = Limits {
            rate_limit_per_sec: 0.0,
            ..Limits::default()
        };
        Self::with_limits(backend, limits).await
    }

    pub async fn with_limits(backend: Backend, limits: Limits) -> TestApp {
        let _ = tracing_subscriber::fmt()
            .with_test_writer()
            .with_env_filter(
                std::env::var("RUST_LOG").unwrap_or_else(|_| "warn,loupe=info".to_owned()),
            )
            .try_init();
        let (url, scratch) = match backend {
            Backend::Sqlite => {
                let path = std::env::temp_dir()
                    .join("loupe-tests")
                    .join(format!("{}.db", uuid::Uuid::new_v4().simple()));
                (
                    format!("sqlite://{}", path.display()),
                    Scratch::SqliteFile(path),
                )
            }
            Backend::Postgres => {
                let admin_url = postgres_admin_url();
                let (name, url) = create_test_database(&admin_url).await;
                (url, Scratch::PostgresDb { admin_url, name })
            }
        };
        let store = Store::connect(&StoreOptions::new(&url))
            .await
            .expect("connect");
        store.migrate().await.expect("migrate");
        let state = AppState::new(store.clone(), limits.clone(), AuthMode::Open);
        TestApp {
            router: loupe::http::router(state),
            store,
            backend,
            limits,
            url,
            scratch: Some(scratch),
        }
    }

    /// The same database behind a service configured anew.
    pub fn reconfigure(mut self, limits: Limits, auth: AuthMode) -> TestApp {
        let state = AppState::new(self.store.clone(), limits.clone(), auth);
        self.router = loupe::http::router(state);
        self.limits = limits;
        self
    }

    /// The same database behind a store opened with other options, as after a restart with
    /// other settings (open mode, the same limits).
    pub async fn with_store_options(
        mut self,
        configure: impl FnOnce(&mut StoreOptions),
    ) -> TestApp {
        let mut options = StoreOptions::new(&self.url);
        configure(&mut options);
        self.store.close().await;
        self.store = Store::connect(&options).await.expect("connect again");
        let limits = self.limits.clone();
        self.reconfigure(limits, AuthMode::Open)
    }

    /// Keyed mode: tenant requests need an API key, the admin API takes [`ADMIN_KEY`].
    pub fn keyed(self) -> TestApp {
        let limits = self.limits.clone();
        self.keyed_with(limits)
    }

    pub fn keyed_with(self, limits: Limits) -> TestApp {
        self.reconfigure(
            limits,
            AuthMode::Keyed {
                admin_key: Some(ADMIN_KEY.to_owned()),
            },
        )
    }

    /// Creates an API key for `tenant` through the admin API; returns the key.
    pub async fn create_key(&self, tenant: &str) -> String {
        self.create_key_record(tenant).await["key"]
            .as_str()
            .unwrap()
            .to_owned()
    }

    /// Creates an API key for `tenant` through the admin API; returns the whole response body.
    pub async fn create_key_record(&self, tenant: &str) -> Value {
        let response = self
            .post_as(
                ADMIN_KEY,
                "/v1/admin/keys",
                serde_json::json!({"tenant": tenant, "name": "test"}),
            )
            .await;
        assert_eq!(response.status, StatusCode::CREATED, "{}", response.body);
        response.body
    }

    /// A request with `Authorization: Bearer <key>` (no header when `key` is `None`).
    pub async fn request_as(
        &self,
        key: Option<&str>,
        method: Method,
        uri: &str,
        body: Option<Value>,
    ) -> TestResponse {
        let bytes = body.map(|json| serde_json::to_vec(&json).unwrap());
        let content_type = bytes.as_ref().map(|_| "application/json");
        self.raw_as(key, method, uri, content_type, bytes.unwrap_or_default())
            .await
    }

    /// A request with raw body bytes, for malformed input.
    pub async fn raw_as(
        &self,
        key: Option<&str>,
        method: Method,
        uri: &str,
        content_type: Option<&str>,
        body: Vec<u8>,
    ) -> TestResponse {
        let mut builder = Request::builder().method(method).uri(uri);
        if let Some(key) = key {
            builder = builder.header(header::AUTHORIZATION, format!("Bearer {key}"));
        }
        if let Some(content_type) = content_type {
            builder = builder.header(header::CONTENT_TYPE, content_type);
        }
        self.send(builder.body(Body::from(body)).unwrap()).await
    }

    pub async fn get_as(&self, key: &str, uri: &str) -> TestResponse {
        self.request_as(Some(key), Method::GET, uri, None).await
    }

    pub async fn post_as(&self, key: &str, uri: &str, body: Value) -> TestResponse {
        self.request_as(Some(key), Method::POST, uri, Some(body))
            .await
    }

    pub async fn delete_as(&self, key: &str, uri: &str) -> TestResponse {
        self.request_as(Some(key), Method::DELETE, uri, None).await
    }

    pub async fn request(&self, method: Method, uri: &str, body: Option<Value>) -> TestResponse {
        let mut builder = Request::builder().method(method).uri(uri);
        let body = match body {
            Some(json) => {
                builder = builder.header(header::CONTENT_TYPE, "application/json");
                Body::from(serde_json::to_vec(&json).unwrap())
            }
            None => Body::empty(),
        };
        self.send(builder.body(body).unwrap()).await
    }

    pub async fn send(&self, request: Request<Body>) -> TestResponse {
        send_to(&self.router, request).await
    }

    pub async fn get(&self, uri: &str) -> TestResponse {
        self.request(Method::GET, uri, None).await
    }

    pub async fn post(&self, uri: &str, body: Value) -> TestResponse {
        self.request(Method::POST, uri, Some(body)).await
    }

    pub async fn delete(&self, uri: &str) -> TestResponse {
        self.request(Method::DELETE, uri, None).await
    }

    /// Appends a batch (anything that serializes to a JSON array of entries) and asserts it was
    /// stored.
    pub async fn append(&self, thread: &str, messages: impl serde::Serialize) {
        let response = self
            .post(
                &format!("/v1/threads/{thread}/messages"),
                serde_json::json!({ "messages": messages }),
            )
            .await;
        assert_eq!(response.status, StatusCode::CREATED, "{}", response.body);
    }

    /// Imports a Claude Code transcript (JSON Lines) into an existing thread, asserts it was
    /// taken, and returns the import's report.
    pub async fn import(&self, thread: &str, transcript: &str) -> Value {
        let response = self
            .raw_as(
                None,
                Method::POST,
                &format!("/v1/threads/{thread}/import"),
                Some("application/x-ndjson"),
                transcript.as_bytes().to_vec(),
            )
            .await;
        assert_eq!(response.status, StatusCode::OK, "{}", response.body);
        response.body
    }

    /// Creates a thread and returns its id.
    pub async fn thread(&self, id: &str) -> String {
        let response = self
            .post("/v1/threads", serde_json::json!({"id": id}))
            .await;
        assert_eq!(response.status, StatusCode::CREATED, "{:?}", response.body);
        id.to_owned()
    }

    /// The bytes of each line of the thread's export: its stored bodies, byte for byte.
    pub async fn export_line_bytes(&self, thread: &str) -> Vec<usize> {
        let request = Request::builder()
            .uri(format!("/v1/threads/{thread}/export"))
            .body(Body::empty())
            .unwrap();
        let response = self.router.clone().oneshot(request).await.unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        let bytes = response.into_body().collect().await.unwrap().to_bytes();
        bytes
            .split(|&b| b == b'\n')
            .filter(|line| !line.is_empty())
            .map(<[u8]>::len)
            .collect()
    }

    /// Checks the thread's `stored_bytes` against its stored bodies.
    pub async fn assert_stored_bytes_counted(&self, thread: &str) {
        let stored: usize = self.export_line_bytes(thread).await.iter().sum();
        let info = self.get(&format!("/v1/threads/{thread}")).await;
        assert_eq!(info.body["stored_bytes"], stored, "{}", info.body);
    }

    /// A router over a new connection to the same database, as after a restart (open mode).
    pub async fn restarted_router(&self) -> Router {
        let store = Store::connect(&StoreOptions::new(&self.url))
            .await
            .expect("connect again");
        loupe::http::router(AppState::new(store, self.limits.clone(), AuthMode::Open))
    }

    /// Drops the test's database. Call at the end of a test; a failed test leaves it behind
    /// (scripts/test.sh sweeps those).
    pub async fn finish(mut self) {
        self.store.close().await;
        match self.scratch.take() {
            Some(Scratch::SqliteFile(path)) => {
                for suffix in ["", "-wal", "-shm"] {
                    let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
                }
            }
            Some(Scratch::PostgresDb { admin_url, name }) => {
                drop_test_database(&admin_url, &name).await;
            }
            None => {}
        }
    }
}

/// A new PostgreSQL database for one test, made through the role of `admin_url` (which
/// [`drop_test_database`] drops, and `scripts/test.sh` sweeps when a failed test leaves it):
/// its name and URL.
pub async fn create_test_database(admin_url: &str) -> (String, String) {
    let name = format!("loupe_test_{}", uuid::Uuid::new_v4().simple());
    let admin = Store::connect(&StoreOptions::new(admin_url))
        .await
        .expect("connect to the admin URL");
    admin.create_database(&name).await.unwrap();
    admin.close().await;
    let url = loupe::store::database_url(admin_url, &name);
    (name, url)
}

/// Drops a test's PostgreSQL database `name` through the role of `admin_url`.
pub async fn drop_test_database(admin_url: &str, name: &str) {
    let admin = Store::connect(&StoreOptions::new(admin_url)).await.unwrap();
    // A non-superuser cannot end an autovacuum worker that happens to be in the database, so
    // FORCE can fail for a moment: try again until it has moved on.
    let mut attempts = 0;
    while let Err(error) = admin.drop_database(name).await {
        attempts += 1;
        assert!(attempts < 20, "drop the test database: {error:?}");
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
    }
    admin.close().await;
}

/// One request to `router`, its answer read whole (JSON, or the text as a JSON string).
pub async fn send_to(router: &Router, request: Request<Body>) -> TestResponse {
    let response = router.clone().oneshot(request).await.unwrap();
    let status = response.status();
    let headers = response.headers().clone();
    // An event stream does not end while its thread lives: its body is left unread (and the
    // stream dropped). tests/api/events.rs reads streams.
    if headers
        .get(axum::http::header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"text/event-stream"))
    {
        return TestResponse {
            status,
            headers,
            body: Value::Null,
        };
    }
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    let body = if bytes.is_empty() {
        Value::Null
    } else {
        serde_json::from_slice(&bytes)
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned()))
    };
    TestResponse {
        status,
        headers,
        body,
    }
}

#[derive(Debug)]
pub struct TestResponse {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Value,
}

impl TestResponse {
    /// Asserts a problem response of the given kind and returns its body.
    pub fn assert_problem(&self, status: StatusCode, kind: &str) -> &Value {
        assert_eq!(self.status, status, "body: {}", self.body);
        assert_eq!(
            self.headers.get(header::CONTENT_TYPE).unwrap(),
            "application/problem+json"
        );
        assert_eq!(
            self.body["type"],
            format!("urn:loupe:problem:{kind}"),
            "body: {}",
            self.body
        );
        assert_eq!(self.body["status"], status.as_u16());
        &self.body
    }
}

/// Runs each named `async fn(TestApp)` as a test on SQLite and on PostgreSQL.
#[macro_export]
macro_rules! on_both_backends {
    ($($name:ident),* $(,)?) => {
        $(
            mod $name {
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn sqlite() {
                    let app = $crate::common::TestApp::new($crate::common::Backend::Sqlite).await;
                    super::$name(app).await;
                }
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn postgres() {
                    let app = $crate::common::TestApp::new($crate::common::Backend::Postgres).await;
                    super::$name(app).await;
                }
            }
        )*
    };
}

/// `on_both_backends!` for tests run on purpose only, each with the reason.
#[macro_export]
macro_rules! ignored_on_both_backends {
    ($reason:literal: $($name:ident),* $(,)?) => {
        $(
            mod $name {
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                #[ignore = $reason]
                async fn sqlite() {
                    let app = $crate::common::TestApp::new($crate::common::Backend::Sqlite).await;
                    super::$name(app).await;
                }
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                #[ignore = $reason]
                async fn postgres() {
                    let app = $crate::common::TestApp::new($crate::common::Backend::Postgres).await;
                    super::$name(app).await;
                }
            }
        )*
    };
}

/// A user text entry.
pub fn user(uuid: &str, text: &str) -> Value {
    serde_json::json!({"uuid": uuid, "type": "user", "message": {"role": "user", "content": text}})
}

/// An assistant text entry of response `id`.
pub fn assistant(uuid: &str, id: &str, text: &str) -> Value {
    serde_json::json!({"uuid": uuid, "type": "assistant",
        "message": {"role": "assistant", "id": id, "content": [{"type": "text", "text": text}]}})
}

/// `n` API rounds numbered from `from`, worth compacting: a prompt (uuid `{prompt}{i}`), a tool
/// call, its result (`fn f() {}` repeated `result_lines` times) and the answer.
pub fn tool_rounds(prompt: &str, from: usize, n: usize, result_lines: usize) -> Vec<Value> {
    let mut messages = Vec::new();
    for i in from..from + n {
        messages.push(user(&format!("{prompt}{i}"), &format!("Question {i}?")));
        messages.push(
            serde_json::json!({"uuid": format!("t{i}"), "type": "assistant", "message": {
            "role": "assistant", "id": format!("msg_{i}"), "content": [{"type": "tool_use",
            "id": format!("toolu_{i}"), "name": "Read", "input": {"path": "f"}}]}}),
        );
        messages.push(
            serde_json::json!({"uuid": format!("r{i}"), "type": "user", "message": {
            "role": "user", "content": [{"type": "tool_result",
            "tool_use_id": format!("toolu_{i}"), "content": "fn f() {}\n".repeat(result_lines)}]}}),
        );
        messages.push(assistant(
            &format!("a{i}"),
            &format!("msg_{i}"),
            &format!("Answer {i}."),
        ));
    }
    messages
}
