//! The inspector page in a real browser: the release server (the binary named by `LOUPE_UI_BIN`)
//! in keyed mode on a fresh SQLite file, headless Chromium driven over WebDriver by chromedriver.
//!
//! Skipped, with the reason printed, when `LOUPE_UI_BIN` is not set or chromedriver is missing;
//! `.ci/run` sets the variable after the release build and installs Chromium. Screenshots are
//! saved under `target/ui-screenshots/` and their paths printed.

use std::future::Future;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::{json, Value};

/// How long a step may take before the test gives up: a bound for failing, not a measurement.
const PATIENCE: Duration = Duration::from_secs(30);
const ADMIN_KEY: &str = "ui-test-admin-key-0123456789";

/// A child process killed when the test ends, whatever happens.
pub(crate) struct Process(Child);

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

pub(crate) fn chromedriver() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("CHROMEDRIVER") {
        return Some(PathBuf::from(path));
    }
    std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
        .map(|dir| dir.join("chromedriver"))
        .find(|path| path.is_file())
}

/// Retries `check` until it answers `Some`, for at most [`PATIENCE`].
pub(crate) async fn eventually<T, F, Fut>(what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "gave up waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

struct Api {
    http: reqwest::Client,
    base: String,
    key: String,
}

impl Api {
    async fn send(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> Value {
        let mut request = self
            .http
            .request(method, format!("{}{path}", self.base))
            .bearer_auth(&self.key);
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request.send().await.expect("the server answers");
        let status = response.status();
        let body: Value = response.json().await.unwrap_or(Value::Null);
        assert!(status.is_success(), "{path}: {status} {body}");
        body
    }

    async fn get(&self, path: &str) -> Value {
        self.send(reqwest::Method::GET, path, None).await
    }

    async fn post(&self, path: &str, body: Value) -> Value {
        self.send(reqwest::Method::POST, path, Some(body)).await
    }

    async fn put(&self, path: &str, body: Value) -> Value {
        self.send(reqwest::Method::PUT, path, Some(body)).await
    }
}

fn user(uuid: &str, text: &str) -> Value {
    json!({"uuid": uuid, "type": "user", "message": {"role": "user", "content": text}})
}

fn assistant(uuid: &str, id: &str, text: &str) -> Value {
    json!({"uuid": uuid, "type": "assistant",
        "message": {"role": "assistant", "id": id, "content": [{"type": "text", "text": text}]}})
}

/// Starts the release server in keyed mode and waits until it is ready.
async fn start_server(binary: &str, dir: &Path) -> (Process, String) {
    let port = free_port();
    let log = std::fs::File::create(dir.join("loupe.log")).unwrap();
    let child = Command::new(binary)
        .arg("serve")
        .env(
            "DATABASE_URL",
            format!("sqlite://{}", dir.join("loupe.db").display()),
        )
        .env("LOUPE_ADDR", format!("127.0.0.1:{port}"))
        .env("LOUPE_ADMIN_KEY", ADMIN_KEY)
        .env("LOUPE_JOB_POLL_MS", "100")
        .env("LOUPE_LOG_FORMAT", "json")
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap_or_else(|error| panic!("start {binary}: {error}"));
    let server = Process(child);
    let base = format!("http://127.0.0.1:{port}");
    let http = reqwest::Client::new();
    eventually("the server to be ready", || async {
        let response = http.get(format!("{base}/readyz")).send().await.ok()?;
        response.status().is_success().then_some(())
    })
    .await;
    (server, base)
}

pub(crate) async fn start_browser(chromedriver: &Path, profile: &Path) -> (Process, Client) {
    let port = free_port();
    let child = Command::new(chromedriver)
        .arg(format!("--port={port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|error| panic!("start {}: {error}", chromedriver.display()));
    let driver = Process(child);
    let url = format!("http://127.0.0.1:{port}");
    let http = reqwest::Client::new();
    eventually("chromedriver to be ready", || async {
        let response = http.get(format!("{url}/status")).send().await.ok()?;
        let body: Value = response.json().await.ok()?;
        (body["value"]["ready"] == true).then_some(())
    })
    .await;
    let binary = std::env::var("CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".to_owned());
    let capabilities = json!({
        "browserName": "chrome",
        "goog:chromeOptions": {
            "binary": binary,
            "args": [
                "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                "--disable-background-networking", "--disable-component-update", "--disable-sync",
                "--disable-dev-shm-usage", "--window-size=1500,1100",
                format!("--user-data-dir={}", profile.display()),
            ],
        },
    });
    let capabilities = match capabilities {
        Value::Object(map) => map,
        _ => unreachable!(),
    };
    let connector = hyper_util::client::legacy::connect::HttpConnector::new();
    let client = ClientBuilder::new(connector)
        .capabilities(capabilities)
        .connect(&url)
        .await
        .expect("a WebDriver session in headless Chromium");
    (driver, client)
}

pub(crate) async fn screenshot(client: &Client, name: &str) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/ui-screenshots");
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(format!("{name}.png"));
    std::fs::write(&path, client.screenshot().await.unwrap()).unwrap();
    println!("ui screenshot: {}", path.display());
}

/// The text of the first element matching `css`, once it exists and `accept` likes it.
async fn text_of(client: &Client, css: &str, accept: impl Fn(&str) -> bool) -> String {
    eventually(css, || async {
        let element = client.find(Locator::Css(css)).await.ok()?;
        let text = element.text().await.ok()?;
        accept(&text).then_some(text)
    })
    .await
}

#[tokio::test]
async fn the_inspector_shows_repairs_zooms_the_outline_and_follows_appends() {
    let Some(binary) = std::env::var("LOUPE_UI_BIN").ok().filter(|b| !b.is_empty()) else {
        println!("SKIPPED the browser test: LOUPE_UI_BIN is not set (.ci/run sets it after the release build)");
        return;
    };
    let Some(chromedriver) = chromedriver() else {
        println!("SKIPPED the browser test: chromedriver is not installed (apt-get install chromium chromium-driver)");
        return;
    };
    let dir = std::env::temp_dir().join(format!("loupe-ui-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).unwrap();
    let (_server, base) = start_server(&binary, &dir).await;

    // A tenant key, through the admin API.
    let http = reqwest::Client::new();
    let created: Value = http
        .post(format!("{base}/v1/admin/keys"))
        .bearer_auth(ADMIN_KEY)
        .json(&json!({"tenant": "acme", "name": "ui test"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let key = created["key"].as_str().expect("a created key").to_owned();
    let api = Api {
        http,
        base: base.clone(),
        key: key.clone(),
    };

    // The seeded thread: exchanges summarized into an outline, a compaction (boundary and
    // summary), then a tool call the agent crashed after: its result was never stored.
    let thread = "inspect-me";
    api.post(
        "/v1/threads",
        json!({"id": thread, "metadata": {"agent": "ui-test"}}),
    )
    .await;
    api.put(
        &format!("/v1/threads/{thread}/settings"),
        json!({"outline": {"enabled": true, "line_bytes": 64, "budget_bytes": 4000, "tail_tokens": 60}}),
    )
    .await;
    let mut exchanges = Vec::new();
    for i in 0..6 {
        exchanges.push(user(
            &format!("u{i}"),
            &format!("Question {i}: what is the price plan for region {i}, and why that price?"),
        ));
        exchanges.push(assistant(
            &format!("a{i}"),
            &format!("msg_{i}"),
            &format!("Answer {i}: region {i} follows the launch price of 49."),
        ));
    }
    api.post(
        &format!("/v1/threads/{thread}/messages"),
        json!({"messages": exchanges}),
    )
    .await;
    let compaction_and_crash = json!([
        {"uuid": "boundary", "type": "system", "subtype": "compact_boundary",
         "content": "Conversation compacted", "compact_metadata": {"trigger": "manual", "pre_tokens": 900}},
        {"uuid": "summary", "type": "user", "is_compact_summary": true,
         "message": {"role": "user", "content": "Summary: every region follows the launch price of 49."}},
        {"uuid": "crash", "type": "assistant", "message": {"role": "assistant", "id": "msg_crash",
         "content": [{"type": "tool_use", "id": "toolu_crash", "name": "weather", "input": {"city": "Oslo"}}]}},
        user("after-crash", "Are you still there?"),
    ]);
    let appended = api
        .post(
            &format!("/v1/threads/{thread}/messages"),
            json!({"messages": compaction_and_crash}),
        )
        .await;
    let crash_seq = appended["messages"][2]["seq"].as_i64().unwrap();
    let summary_seq = appended["messages"][1]["seq"].as_i64().unwrap();
    let boundary_seq = appended["messages"][0]["seq"].as_i64().unwrap();

    // What the page must show, as the API says it.
    let context = api
        .get(&format!("/v1/threads/{thread}/context?provider=anthropic"))
        .await;
    let repair = context["repairs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|repair| {
            repair["seqs"]
                .as_array()
                .unwrap()
                .contains(&json!(crash_seq))
        })
        .unwrap_or_else(|| panic!("a repair of the crashed tool call: {context}"))
        .clone();
    let outline = eventually("the outline to have lines", || async {
        let outline = api.get(&format!("/v1/threads/{thread}/outline")).await;
        let built = outline["build"]["last_job_state"] == "succeeded";
        (built && !outline["lines"].as_array().unwrap().is_empty()).then_some(outline)
    })
    .await;
    let first_line = outline["lines"][0].clone();
    let zoom = api
        .post(
            &format!("/v1/threads/{thread}/zoom"),
            json!({"id": first_line["id"], "n": first_line["n"]}),
        )
        .await;
    assert_eq!(zoom["is_error"], false, "{zoom}");

    let seeded = Seeded {
        thread: thread.to_owned(),
        crash_seq,
        summary_seq,
        boundary_seq,
        repair,
        context,
        first_line,
        zoom,
    };
    let profile = dir.join("chromium-profile");
    let (_driver, client) = start_browser(&chromedriver, &profile).await;
    // The scenario runs in a task of its own so that the browser is closed even when it fails.
    let scenario = tokio::spawn(browse(client.clone(), api, base, key, seeded)).await;
    let _ = client.close().await;
    let _ = std::fs::remove_dir_all(&dir);
    if let Err(failure) = scenario {
        std::panic::resume_unwind(failure.into_panic());
    }
}

/// What the seeding wrote and what the API answers about it.
struct Seeded {
    thread: String,
    crash_seq: i64,
    summary_seq: i64,
    boundary_seq: i64,
    repair: Value,
    context: Value,
    first_line: Value,
    zoom: Value,
}

async fn browse(client: Client, api: Api, base: String, key: String, seeded: Seeded) {
    let Seeded {
        thread,
        crash_seq,
        summary_seq,
        boundary_seq,
        repair,
        context,
        first_line,
        zoom,
    } = seeded;
    let repair_kind = repair["kind"].as_str().unwrap().to_owned();
    {
        client.goto(&format!("{base}/ui")).await.unwrap();
        // Keyed mode: the page asks for a key and keeps it in this tab only.
        let input = client
            .wait()
            .at_most(PATIENCE)
            .for_element(Locator::Id("key-input"))
            .await
            .unwrap();
        input.send_keys(&key).await.unwrap();
        client
            .find(Locator::Css("#key-form button[type=submit]"))
            .await
            .unwrap()
            .click()
            .await
            .unwrap();
        let stored = client
            .execute("return sessionStorage.getItem('loupe.key')", vec![])
            .await
            .unwrap();
        assert_eq!(stored, json!(key));
        let local = client
            .execute("return localStorage.length", vec![])
            .await
            .unwrap();
        assert_eq!(local, json!(0), "the key is kept in sessionStorage only");

        // The thread list, searchable by metadata.
        let search = client.find(Locator::Id("thread-search")).await.unwrap();
        search.send_keys("ui-test").await.unwrap();
        let button = format!("button[data-thread='{thread}']");
        client
            .wait()
            .at_most(PATIENCE)
            .for_element(Locator::Css(&button))
            .await
            .unwrap()
            .click()
            .await
            .unwrap();

        // The crashed tool call is highlighted with its repair's kind and detail.
        let repaired = format!("#entries li.entry.repaired[data-seq='{crash_seq}']");
        let text = text_of(&client, &repaired, |text| text.contains(&repair_kind)).await;
        assert!(text.contains(repair["detail"].as_str().unwrap()), "{text}");
        assert!(text.contains("toolu_crash"), "{text}");
        let listed = text_of(&client, "#repairs", |text| text.contains(&repair_kind)).await;
        assert!(listed.contains(&format!("seq {crash_seq}")), "{listed}");
        // Only the entries a repair names are highlighted.
        let highlighted = client
            .find_all(Locator::Css("#entries li.entry.repaired"))
            .await
            .unwrap();
        let mut seqs = Vec::new();
        for entry in highlighted {
            seqs.push(
                entry
                    .attr("data-seq")
                    .await
                    .unwrap()
                    .unwrap()
                    .parse::<i64>()
                    .unwrap(),
            );
        }
        let named: Vec<i64> = context["repairs"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|repair| {
                repair["seqs"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|s| s.as_i64().unwrap())
            })
            .collect();
        assert!(
            seqs.iter().all(|seq| named.contains(seq)),
            "{seqs:?} vs {named:?}"
        );
        // The boundary and the summary after it are marked.
        text_of(
            &client,
            &format!("#entries li.boundary[data-seq='{boundary_seq}']"),
            |t| t.contains("compact boundary"),
        )
        .await;
        text_of(
            &client,
            &format!("#entries li.summary[data-seq='{summary_seq}']"),
            |t| t.contains("summary"),
        )
        .await;
        text_of(&client, "#context-messages li.summary", |t| {
            t.contains("Summary: every region")
        })
        .await;
        screenshot(&client, "1-thread-with-repair").await;

        // A click on an outline line zooms in place, with what the zoom API answers.
        let label = format!("{}+{}", first_line["id"], first_line["n"]);
        let line_button = format!("#outline-lines button.line[data-line='{label}']");
        client
            .wait()
            .at_most(PATIENCE)
            .for_element(Locator::Css(&line_button))
            .await
            .unwrap()
            .click()
            .await
            .unwrap();
        let zoomed_css = "#outline-lines > li:first-child > .zoomed";
        let expected: Vec<String> = match zoom["lines"].as_array() {
            Some(lines) if !lines.is_empty() => lines
                .iter()
                .map(|l| l["text"].as_str().unwrap().to_owned())
                .collect(),
            _ => vec![zoom["content"].as_str().unwrap().to_owned()],
        };
        let zoomed = text_of(&client, zoomed_css, |text| !text.is_empty()).await;
        for part in &expected {
            assert!(
                zoomed.contains(part.trim()),
                "zoomed {zoomed:?} lacks {part:?}"
            );
        }
        let expanded = client
            .find(Locator::Css(&line_button))
            .await
            .unwrap()
            .attr("aria-expanded")
            .await
            .unwrap();
        assert_eq!(expanded.as_deref(), Some("true"));
        screenshot(&client, "2-outline-zoomed").await;

        // An agent appends: the page shows the new entry without a reload.
        let next = api
            .post(
                &format!("/v1/threads/{thread}/messages"),
                json!({"messages": [user("live", "A live update from the agent")]}),
            )
            .await;
        let live_seq = next["messages"][0]["seq"].as_i64().unwrap();
        let live = format!("#entries li.entry[data-seq='{live_seq}']");
        text_of(&client, &live, |text| {
            text.contains("A live update from the agent")
        })
        .await;
        screenshot(&client, "3-live-append").await;
    }
}
