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

#[derive(Clone)]
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

/// A release server on a fresh SQLite file with a tenant key, and the chromedriver to browse it:
/// what both browser tests start from. `None`, the reason printed, when the binary or
/// chromedriver is missing.
struct Served {
    _server: Process,
    dir: PathBuf,
    base: String,
    key: String,
    api: Api,
    chromedriver: PathBuf,
}

impl Served {
    async fn start(key_name: &str) -> Option<Served> {
        let Some(binary) = std::env::var("LOUPE_UI_BIN").ok().filter(|b| !b.is_empty()) else {
            println!("SKIPPED the browser test: LOUPE_UI_BIN is not set (.ci/run sets it after the release build)");
            return None;
        };
        let Some(chromedriver) = chromedriver() else {
            println!("SKIPPED the browser test: chromedriver is not installed (apt-get install chromium chromium-driver)");
            return None;
        };
        let dir = std::env::temp_dir().join(format!("loupe-ui-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir).unwrap();
        let (server, base) = start_server(&binary, &dir).await;
        // A tenant key, through the admin API.
        let http = reqwest::Client::new();
        let created: Value = http
            .post(format!("{base}/v1/admin/keys"))
            .bearer_auth(ADMIN_KEY)
            .json(&json!({"tenant": "acme", "name": key_name}))
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
        Some(Served {
            _server: server,
            dir,
            base,
            key,
            api,
            chromedriver,
        })
    }

    /// Runs `scenario` against a headless browser, in a task of its own so that the browser is
    /// closed (and the files removed) even when it fails; its failure is the test's.
    async fn browse<F, Fut>(self, scenario: F)
    where
        F: FnOnce(Client) -> Fut,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let profile = self.dir.join("chromium-profile");
        let (_driver, client) = start_browser(&self.chromedriver, &profile).await;
        let outcome = tokio::spawn(scenario(client.clone())).await;
        let _ = client.close().await;
        let _ = std::fs::remove_dir_all(&self.dir);
        if let Err(failure) = outcome {
            std::panic::resume_unwind(failure.into_panic());
        }
    }
}

#[tokio::test]
async fn the_inspector_shows_repairs_zooms_the_outline_and_follows_appends() {
    let Some(served) = Served::start("ui test").await else {
        return;
    };
    let api = &served.api;

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
    let (api, base, key) = (api.clone(), served.base.clone(), served.key.clone());
    served
        .browse(|client| browse(client, api, base, key, seeded))
        .await;
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
        // Keyed mode: the page asks for a key and keeps it in this tab only.
        sign_in(&client, &base, &key).await;
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
        // It came through the thread's event stream, not a poll.
        let live_mode = client
            .execute("return document.body.dataset.live", vec![])
            .await
            .unwrap();
        assert_eq!(live_mode, json!("streaming"));
        screenshot(&client, "3-live-append").await;

        // A fork shows its lineage, and its parent lists it.
        let fork_id = format!("{thread}-retry");
        let fork = api
            .post(
                &format!("/v1/threads/{thread}/fork"),
                json!({"id": fork_id, "at_seq": crash_seq}),
            )
            .await;
        assert_eq!(fork["forked_from"]["at_seq"], crash_seq);
        client
            .goto(&format!("{base}/ui#thread={fork_id}"))
            .await
            .unwrap();
        let lineage = text_of(&client, "#thread-lineage", |text| {
            text.contains("Forked from")
        })
        .await;
        assert!(lineage.contains(&thread), "{lineage}");
        assert!(
            lineage.contains(&format!("at seq {crash_seq}")),
            "{lineage}"
        );
        client
            .find(Locator::Css(&format!(
                "#thread-lineage button[data-thread='{thread}']"
            )))
            .await
            .unwrap()
            .click()
            .await
            .unwrap();
        let forks = text_of(&client, "#thread-lineage", |text| text.contains("Forks:")).await;
        assert!(forks.contains(&fork_id), "{forks}");
        screenshot(&client, "4-fork-lineage").await;

        // The thread reported no usage: its cost chart holds the modelled points only, and
        // does not say it has no request.
        let modelled = eventually("the modelled cost points", || async {
            let points = client
                .find_all(Locator::Css("#cost-chart rect.pt-cost-modelled"))
                .await
                .ok()?;
            (!points.is_empty()).then_some(points.len())
        })
        .await;
        let empty = client
            .find_all(Locator::Css("#cost-chart text.empty"))
            .await
            .unwrap();
        assert!(empty.is_empty(), "{modelled} points under \"no request\"");
    }
}

const SESSION: &str = include_str!("../fixtures/claude-code/session.jsonl");

/// The fixture's lines, as JSON.
fn session_lines() -> Vec<Value> {
    SESSION
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect()
}

#[tokio::test]
async fn the_inspector_draws_a_thread_s_economics_from_its_data() {
    let Some(served) = Served::start("ui economics test").await else {
        return;
    };
    let (api, base, key) = (&served.api, served.base.clone(), served.key.clone());

    // The real Claude Code session, imported as a client would.
    api.post(
        "/v1/threads",
        json!({"id": "session", "metadata": {"agent": "economics"}}),
    )
    .await;
    let imported = api
        .http
        .post(format!("{base}/v1/threads/session/import"))
        .bearer_auth(&key)
        .header("content-type", "application/x-ndjson")
        .body(SESSION)
        .send()
        .await
        .unwrap();
    assert!(
        imported.status().is_success(),
        "{:?}",
        imported.text().await
    );
    let economics = api.get("/v1/threads/session/economics").await;
    assert!(economics["points"].as_array().unwrap().len() >= 8);

    served
        .browse(|client| browse_economics(client, base, key, economics))
        .await;
}

/// A number attribute of an element.
async fn number_attr(element: &fantoccini::elements::Element, name: &str) -> f64 {
    element
        .attr(name)
        .await
        .unwrap()
        .unwrap_or_else(|| panic!("no {name} attribute"))
        .parse()
        .unwrap_or_else(|_| panic!("{name} is not a number"))
}

/// A chart's scale, as it states it on its `svg`.
struct Scale {
    x_min: f64,
    x_max: f64,
    y_max: f64,
    left: f64,
    top: f64,
    width: f64,
    height: f64,
}

impl Scale {
    async fn of(chart: &fantoccini::elements::Element) -> Scale {
        Scale {
            x_min: number_attr(chart, "data-x-min").await,
            x_max: number_attr(chart, "data-x-max").await,
            y_max: number_attr(chart, "data-y-max").await,
            left: number_attr(chart, "data-plot-left").await,
            top: number_attr(chart, "data-plot-top").await,
            width: number_attr(chart, "data-plot-width").await,
            height: number_attr(chart, "data-plot-height").await,
        }
    }

    fn x(&self, seq: f64) -> f64 {
        self.left + (seq - self.x_min) / (self.x_max - self.x_min) * self.width
    }

    fn y(&self, value: f64) -> f64 {
        self.top + self.height - value / self.y_max * self.height
    }
}

/// Opens the inspector and gives it the tenant's key.
async fn sign_in(client: &Client, base: &str, key: &str) {
    client.goto(&format!("{base}/ui")).await.unwrap();
    let input = client
        .wait()
        .at_most(PATIENCE)
        .for_element(Locator::Id("key-input"))
        .await
        .unwrap();
    input.send_keys(key).await.unwrap();
    client
        .find(Locator::Css("#key-form button[type=submit]"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
}

async fn browse_economics(client: Client, base: String, key: String, economics: Value) {
    let lines = session_lines();
    let points = economics["points"].as_array().unwrap().clone();
    sign_in(&client, &base, &key).await;
    client
        .wait()
        .at_most(PATIENCE)
        .for_element(Locator::Css("button[data-thread='session']"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();

    // The size chart, drawn from the thread's data: one circle per point of the endpoint.
    let expected_points = points.len().to_string();
    let chart = eventually("the size chart", || async {
        let chart = client
            .find(Locator::Css("#size-chart svg.chart-size"))
            .await
            .ok()?;
        (chart.attr("data-points").await.ok()?? == expected_points).then_some(chart)
    })
    .await;
    let scale = Scale::of(&chart).await;
    assert_eq!(scale.x_max, economics["next_seq"].as_f64().unwrap());
    let circles = client
        .find_all(Locator::Css("#size-chart circle.pt-estimate"))
        .await
        .unwrap();
    assert_eq!(circles.len(), points.len());
    for (circle, point) in circles.iter().zip(&points) {
        let seq = number_attr(circle, "data-seq").await;
        let value = number_attr(circle, "data-value").await;
        assert_eq!(seq, point["seq"].as_f64().unwrap());
        assert_eq!(value, point["estimate"]["tokens"].as_f64().unwrap());
        // Its position is its value on the chart's own scale.
        assert!((number_attr(circle, "cx").await - scale.x(seq)).abs() < 0.01);
        assert!((number_attr(circle, "cy").await - scale.y(value)).abs() < 0.01);
    }
    let reported: Vec<&Value> = points.iter().filter(|p| !p["reported"].is_null()).collect();
    let squares = client
        .find_all(Locator::Css("#size-chart rect.pt-reported"))
        .await
        .unwrap();
    assert_eq!(squares.len(), reported.len());
    for (square, point) in squares.iter().zip(&reported) {
        let value = number_attr(square, "data-value").await;
        assert_eq!(value, point["reported"]["prompt_tokens"].as_f64().unwrap());
        // A 6-unit square centred on its value.
        assert!((number_attr(square, "y").await + 3.0 - scale.y(value)).abs() < 0.01);
    }
    // The window and the threshold in force, as horizontal lines at their values.
    for (css, tokens) in [
        (
            "#size-chart g.ref-window",
            economics["window_tokens"].as_f64().unwrap(),
        ),
        (
            "#size-chart g.ref-threshold",
            economics["auto_compact_tokens"].as_f64().unwrap(),
        ),
    ] {
        let line = client.find(Locator::Css(css)).await.unwrap();
        assert_eq!(number_attr(&line, "data-tokens").await, tokens);
        let drawn = line.find(Locator::Css("line")).await.unwrap();
        assert!((number_attr(&drawn, "y1").await - scale.y(tokens)).abs() < 0.01);
    }
    // Compaction marks at the fixture's compact boundaries.
    let boundaries: Vec<f64> = lines
        .iter()
        .enumerate()
        .filter(|(_, l)| l["type"] == "system" && l["subtype"] == "compact_boundary")
        .map(|(seq, _)| seq as f64)
        .collect();
    assert_eq!(boundaries.len(), 2);
    let marks = client
        .find_all(Locator::Css("#size-chart line.mark-compaction"))
        .await
        .unwrap();
    let mut marked = Vec::new();
    for mark in &marks {
        let seq = number_attr(mark, "data-seq").await;
        assert!((number_attr(mark, "x1").await - scale.x(seq)).abs() < 0.01);
        marked.push(seq);
    }
    assert_eq!(marked, boundaries);
    let legend = text_of(&client, "#size-legend", |t| t.contains("compact boundary")).await;
    assert!(legend.contains("compact boundary (2)"), "{legend}");
    assert!(legend.contains("model window"), "{legend}");

    // The cost chart: the reported cost and the modelled automatic compaction's, point by point.
    let cost_chart = client
        .find(Locator::Css("#cost-chart svg.chart-cost"))
        .await
        .unwrap();
    let cost_scale = Scale::of(&cost_chart).await;
    let reported_costs = client
        .find_all(Locator::Css("#cost-chart circle.pt-cost-reported"))
        .await
        .unwrap();
    assert_eq!(reported_costs.len(), reported.len());
    let modelled = client
        .find_all(Locator::Css("#cost-chart rect.pt-cost-modelled"))
        .await
        .unwrap();
    assert_eq!(modelled.len(), points.len());
    for (square, point) in modelled.iter().zip(&points) {
        let value = number_attr(square, "data-value").await;
        assert_eq!(value, point["cost"]["auto_compaction"].as_f64().unwrap());
        assert!((number_attr(square, "y").await + 3.0 - cost_scale.y(value)).abs() < 0.01);
    }
    let summary = text_of(&client, "#economics-summary", |t| t.contains("requests")).await;
    assert!(
        summary.contains(&format!("{} requests", points.len())),
        "{summary}"
    );

    // The chart as a person sees it: a PNG that is not blank.
    let panel = client.find(Locator::Id("economics")).await.unwrap();
    let png = panel.screenshot().await.unwrap();
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n", "a PNG");
    let (width, height) = (
        u32::from_be_bytes(png[16..20].try_into().unwrap()),
        u32::from_be_bytes(png[20..24].try_into().unwrap()),
    );
    assert!(width >= 600 && height >= 300, "{width}×{height}");
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/ui-screenshots");
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("4-economics.png");
    std::fs::write(&path, &png).unwrap();
    println!("ui screenshot: {}", path.display());
    // Decoded by the browser: the share of pixels that are not the background, and how many
    // colours the image holds (lines, points, text).
    let decoded = client
        .execute_async(
            "const [bytes, done] = arguments;
             createImageBitmap(new Blob([new Uint8Array(bytes)], {type: 'image/png'})).then((bitmap) => {
               const canvas = document.createElement('canvas');
               canvas.width = bitmap.width; canvas.height = bitmap.height;
               const context = canvas.getContext('2d');
               context.drawImage(bitmap, 0, 0);
               const data = context.getImageData(0, 0, bitmap.width, bitmap.height).data;
               const colours = new Set();
               let inked = 0;
               for (let i = 0; i < data.length; i += 4) {
                 colours.add((data[i] << 16) | (data[i + 1] << 8) | data[i + 2]);
                 if (data[i] < 200 || data[i + 1] < 200 || data[i + 2] < 200) inked += 1;
               }
               done({colours: colours.size, inked: inked / (data.length / 4)});
             }, (error) => done({error: String(error)}));",
            vec![json!(png)],
        )
        .await
        .unwrap();
    assert!(decoded["colours"].as_u64().unwrap_or(0) > 16, "{decoded}");
    let inked = decoded["inked"].as_f64().unwrap_or(0.0);
    assert!(inked > 0.01 && inked < 0.5, "{decoded}");

    // Each entry shows when it happened: the fixture's own timestamp, not the import's time.
    let last_seq = lines.len() - 1;
    let happened = lines[last_seq]["timestamp"].as_str().unwrap().to_owned();
    let time = eventually("the last entry's time", || async {
        client
            .find(Locator::Css(&format!(
                "#entries li[data-seq='{last_seq}'] time.entry-time"
            )))
            .await
            .ok()
    })
    .await;
    assert_eq!(
        time.attr("datetime").await.unwrap().as_deref(),
        Some(happened.as_str())
    );
    let shown = time.text().await.unwrap();
    assert!(
        shown.starts_with(&happened[..19].replace('T', " ")),
        "{shown}"
    );

    // What no model sees is hidden by default, counted, and shown again on request.
    let progress: Vec<usize> = lines
        .iter()
        .enumerate()
        .filter(|(seq, l)| *seq + 100 > last_seq && l["type"] == "progress")
        .map(|(seq, _)| seq)
        .collect();
    assert!(progress.len() > 30, "{progress:?}");
    let unsent = client
        .find_all(Locator::Css("#entries li.entry.unsent"))
        .await
        .unwrap();
    assert!(unsent.len() >= progress.len());
    let label = client
        .find(Locator::Id("hide-unsent-label"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        label.contains(&format!("({} of 100 entries", unsent.len())),
        "{label}"
    );
    let toggle = client.find(Locator::Id("hide-unsent")).await.unwrap();
    assert_eq!(
        toggle.prop("checked").await.unwrap().as_deref(),
        Some("true")
    );
    let displayed = |seq: usize| {
        let client = client.clone();
        async move {
            client
                .find(Locator::Css(&format!("#entries li[data-seq='{seq}']")))
                .await
                .unwrap()
                .is_displayed()
                .await
                .unwrap()
        }
    };
    for &seq in &progress {
        assert!(!displayed(seq).await, "progress {seq} is hidden");
    }
    assert!(displayed(last_seq).await, "the model's entries stay");
    screenshot(&client, "5-economics-page").await;
    toggle.click().await.unwrap();
    for &seq in &progress {
        assert!(displayed(seq).await, "progress {seq} is shown again");
    }
    toggle.click().await.unwrap();
    assert!(!displayed(progress[0]).await);

    // Scaled to the requests: the same points over the whole height, the window above the scale
    // named instead of drawn.
    let window = economics["window_tokens"].as_f64().unwrap();
    client
        .find(Locator::Id("economics-fit"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    let fitted = eventually("the chart scaled to the requests", || async {
        let chart = client
            .find(Locator::Css("#size-chart svg.chart-size"))
            .await
            .ok()?;
        let y_max: f64 = chart.attr("data-y-max").await.ok()??.parse().ok()?;
        (y_max < window).then_some(chart)
    })
    .await;
    let scale = Scale::of(&fitted).await;
    let circles = client
        .find_all(Locator::Css("#size-chart circle.pt-estimate"))
        .await
        .unwrap();
    assert_eq!(circles.len(), points.len());
    for (circle, point) in circles.iter().zip(&points) {
        let value = point["estimate"]["tokens"].as_f64().unwrap();
        assert!((number_attr(circle, "cy").await - scale.y(value)).abs() < 0.01);
    }
    assert!(client
        .find_all(Locator::Css("#size-chart g.ref-window"))
        .await
        .unwrap()
        .is_empty());
    let named = text_of(&client, "#size-chart text.off-scale", |t| {
        t.contains("model window")
    })
    .await;
    assert!(named.starts_with('↑'), "{named}");
    let png = client
        .find(Locator::Id("economics"))
        .await
        .unwrap()
        .screenshot()
        .await
        .unwrap();
    let path = dir.join("6-economics-fitted.png");
    std::fs::write(&path, &png).unwrap();
    println!("ui screenshot: {}", path.display());
}
