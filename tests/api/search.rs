//! Search (issue 35): literal and word queries on both backends' own engines, the hit's zoom
//! address, the `search` tool beside zoom, and derived rows that go with their source (a snip,
//! an erasure, a deleted thread) and never cross tenants.

use axum::http::StatusCode;
use serde_json::{json, Value};

use crate::common::{assistant, user, TestApp};

fn tool_call(uuid: &str, id: &str, command: &str) -> Value {
    json!({"uuid": uuid, "type": "assistant", "message": {"role": "assistant", "id": format!("msg_{uuid}"),
        "content": [{"type": "tool_use", "id": id, "name": "Bash", "input": {"command": command}}]}})
}

fn tool_result(uuid: &str, id: &str, output: &str) -> Value {
    json!({"uuid": uuid, "type": "user", "message": {"role": "user",
        "content": [{"type": "tool_result", "tool_use_id": id, "content": output}]}})
}

/// A short session with a path, an error code, a number and a decision planted in it.
fn session() -> Vec<Value> {
    vec![
        user("u0", "The build fails; look at the job store."),
        tool_call(
            "a1",
            "toolu_1",
            "cargo check --manifest-path src/store/jobs.rs",
        ),
        tool_result(
            "u2",
            "toolu_1",
            "error[E0282]: type annotations needed\n --> src/store/jobs.rs:41:9",
        ),
        assistant(
            "a3",
            "msg_3",
            "The code 7-4-1-9 is the door code. We decided to keep SQLite as the default.",
        ),
        user("u4", "Thanks. Any other errors in the job store?"),
        assistant("a5", "msg_5", "No other errors."),
    ]
}

async fn search(app: &TestApp, thread: &str, q: &str) -> Value {
    let q: String = q
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect();
    let found = app.get(&format!("/v1/threads/{thread}/search?q={q}")).await;
    assert_eq!(found.status, StatusCode::OK, "{}", found.body);
    found.body
}

fn seqs(found: &Value) -> Vec<i64> {
    found["hits"]
        .as_array()
        .unwrap()
        .iter()
        .map(|hit| hit["seq"].as_i64().unwrap())
        .collect()
}

async fn literal_and_word_queries_find_their_entries(app: TestApp) {
    let thread = app.thread("t").await;
    app.append(&thread, session()).await;
    let path = search(&app, &thread, "src/store/jobs.rs").await;
    let mut found = seqs(&path);
    found.sort();
    assert_eq!(found, [1, 2], "{path}");
    let hit = path["hits"]
        .as_array()
        .unwrap()
        .iter()
        .find(|hit| hit["seq"] == 2)
        .unwrap();
    assert_eq!(hit["type"], "user");
    assert_eq!(hit["role"], "user");
    assert_eq!(hit["zoom"], json!({"id": 2, "n": 1}));
    assert!(
        hit["snippet"]
            .as_str()
            .unwrap()
            .contains("«src/store/jobs.rs»"),
        "{hit}"
    );
    assert_eq!(
        path["index"],
        json!({"indexed_through_seq": 6, "pending": 0})
    );
    assert_eq!(seqs(&search(&app, &thread, "e0282").await), [2]);
    assert_eq!(seqs(&search(&app, &thread, "7-4-1-9").await), [3]);
    assert_eq!(seqs(&search(&app, &thread, "\"keep SQLite\"").await), [3]);
    // Words rank by how many match: the entry with both comes first.
    let words = search(&app, &thread, "errors store").await;
    assert_eq!(seqs(&words)[0], 4, "{words}");
    assert!(seqs(&words).contains(&5), "{words}");
    // A term shorter than the trigrams still matches, as a substring.
    assert_eq!(seqs(&search(&app, &thread, "41").await), [2]);
    assert!(seqs(&search(&app, &thread, "zebra quasar").await).is_empty());
    // Ids and signatures are not text a model reads.
    assert!(seqs(&search(&app, &thread, "toolu_1").await).is_empty());
    // What is appended later is found by the next search.
    app.append(&thread, vec![user("u6", "Now check /etc/loupe.toml")])
        .await;
    assert_eq!(seqs(&search(&app, &thread, "loupe.toml").await), [6]);
    app.finish().await;
}

async fn the_search_tool_answers_in_the_outlines_form(app: TestApp) {
    let thread = app.thread("t").await;
    app.append(&thread, session()).await;
    let uri = format!("/v1/threads/{thread}/search");
    let found = app.post(&uri, json!({"query": "E0282"})).await;
    assert_eq!(found.status, StatusCode::OK, "{}", found.body);
    assert_eq!(found.body["is_error"], false);
    let content = found.body["content"].as_str().unwrap();
    assert!(content.starts_with("2+1|"), "{content}");
    assert!(content.contains("«E0282»"), "{content}");
    // The line's address opens the entry whole.
    let zoomed = app
        .post(
            &format!("/v1/threads/{thread}/zoom"),
            json!({"id": 2, "n": 1}),
        )
        .await;
    assert!(zoomed.body["content"].as_str().unwrap().contains("E0282"));
    let empty = app.post(&uri, json!({"query": "  "})).await;
    assert_eq!(empty.body["is_error"], true, "{}", empty.body);
    let none = app.post(&uri, json!({"query": "zzzq"})).await;
    assert!(none.body["content"]
        .as_str()
        .unwrap()
        .starts_with("Nothing"));
    // What the engine cannot take is the model's mistake or nothing at all, never a fault.
    let nul = app
        .post(&uri, json!({"query": "E02\u{0}82 abc\u{0}def"}))
        .await;
    assert_eq!(nul.status, StatusCode::OK, "{}", nul.body);
    let many: String = (0..1200).map(|i| format!("term{i} ")).collect();
    let many_terms = app
        .post(
            &uri,
            json!({"query": many.chars().take(500).collect::<String>()}),
        )
        .await;
    assert_eq!(many_terms.status, StatusCode::OK, "{}", many_terms.body);
    let long = app.post(&uri, json!({"query": many})).await;
    assert_eq!(long.body["is_error"], true, "{}", long.body);
    let long_get = app
        .get(&format!(
            "/v1/threads/{thread}/search?q={}",
            "x".repeat(501)
        ))
        .await;
    long_get.assert_problem(StatusCode::BAD_REQUEST, "bad-request");
    let short_terms: String = (0..600).map(|i| format!("{} ", i % 90 + 10)).collect();
    let scan = app
        .get(&format!(
            "/v1/search?q={}",
            short_terms
                .trim()
                .chars()
                .take(500)
                .collect::<String>()
                .replace(' ', "+")
        ))
        .await;
    assert_eq!(scan.status, StatusCode::OK, "{}", scan.body);
    // The model's mistakes still need a thread.
    let missing = app
        .post("/v1/threads/nope/search", json!({"query": "  "}))
        .await;
    missing.assert_problem(StatusCode::NOT_FOUND, "not-found");
    let refused = app.post(&uri, json!({"q": "E0282"})).await;
    refused.assert_problem(StatusCode::UNPROCESSABLE_ENTITY, "validation");
    // Wherever zoom is offered, search is too.
    let settings = app
        .request(
            axum::http::Method::PUT,
            &format!("/v1/threads/{thread}/settings"),
            Some(json!({"clearing": {"enabled": true}})),
        )
        .await;
    assert_eq!(settings.status, StatusCode::OK, "{}", settings.body);
    for provider in ["anthropic", "openai", "openai_responses", "gemini"] {
        let context = app
            .get(&format!("/v1/threads/{thread}/context?provider={provider}"))
            .await;
        let tools = context.body["tools"].to_string();
        assert!(
            tools.contains("\"zoom\"") && tools.contains("\"search\""),
            "{provider}: {tools}"
        );
    }
    app.finish().await;
}

async fn snipped_erased_and_deleted_entries_are_never_found(app: TestApp) {
    let thread = app.thread("t").await;
    app.append(
        &thread,
        vec![
            user("p0", "my password is hunter2-canary"),
            user("p1", "the api key is sk-canary-9"),
            user("p2", "the other key is sk-canary-7"),
        ],
    )
    .await;
    assert_eq!(seqs(&search(&app, &thread, "hunter2-canary").await), [0]);
    let snip = app
        .post(
            &format!("/v1/threads/{thread}/snip"),
            json!({"uuids": ["p0"]}),
        )
        .await;
    assert_eq!(snip.status, StatusCode::CREATED, "{}", snip.body);
    assert!(seqs(&search(&app, &thread, "hunter2-canary").await).is_empty());
    let erased = app
        .post(
            &format!("/v1/threads/{thread}/erasures"),
            json!({"uuids": ["p1"]}),
        )
        .await;
    assert_eq!(erased.status, StatusCode::CREATED, "{}", erased.body);
    assert_eq!(seqs(&search(&app, &thread, "sk-canary").await), [2]);
    // Another thread of the tenant still finds its own; the tenant-wide search names it.
    let other = app.thread("o").await;
    app.append(&other, vec![user("q0", "sk-canary-5 lives here")])
        .await;
    let all = app.get("/v1/search?q=sk-canary").await;
    let threads: Vec<&str> = all.body["hits"]
        .as_array()
        .unwrap()
        .iter()
        .map(|hit| hit["thread_id"].as_str().unwrap())
        .collect();
    assert_eq!(threads.len(), 2, "{}", all.body);
    assert!(threads.contains(&thread.as_str()) && threads.contains(&other.as_str()));
    let deleted = app
        .request(
            axum::http::Method::DELETE,
            &format!("/v1/threads/{thread}"),
            None,
        )
        .await;
    assert_eq!(deleted.status, StatusCode::NO_CONTENT, "{}", deleted.body);
    let all = app.get("/v1/search?q=sk-canary").await;
    assert_eq!(
        all.body["hits"].as_array().unwrap().len(),
        1,
        "{}",
        all.body
    );
    sqlx::any::install_default_drivers();
    let mut conn = <sqlx::AnyConnection as sqlx::Connection>::connect(&app.url)
        .await
        .unwrap();
    let rows: i64 =
        sqlx::query_scalar("SELECT COUNT(*) FROM search_rows WHERE text LIKE '%canary%'")
            .fetch_one(&mut conn)
            .await
            .unwrap();
    assert_eq!(rows, 1, "only the other thread's row is left");
    <sqlx::AnyConnection as sqlx::Connection>::close(conn)
        .await
        .unwrap();
    app.finish().await;
}

async fn another_tenant_finds_nothing(app: TestApp) {
    let app = app.keyed();
    let key_a = app.create_key("tenant-a").await;
    let key_b = app.create_key("tenant-b").await;
    app.post_as(&key_b, "/v1/threads", json!({"id": "b"})).await;
    let appended = app
        .post_as(
            &key_b,
            "/v1/threads/b/messages",
            json!({"messages": [user("b-1", "tenant b secret-canary-3")]}),
        )
        .await;
    assert_eq!(appended.status, StatusCode::CREATED, "{}", appended.body);
    let own = app.get_as(&key_b, "/v1/search?q=secret-canary").await;
    assert_eq!(
        own.body["hits"].as_array().unwrap().len(),
        1,
        "{}",
        own.body
    );
    let other = app.get_as(&key_a, "/v1/search?q=secret-canary").await;
    assert_eq!(other.body["hits"], json!([]), "{}", other.body);
    let thread = app.get_as(&key_a, "/v1/threads/b/search?q=secret").await;
    thread.assert_problem(StatusCode::NOT_FOUND, "not-found");
    app.finish().await;
}

/// Thinking is searched only when asked for (when the caller's requests send it back), and a
/// hit says it matched there.
async fn thinking_is_searched_only_when_asked(app: TestApp) {
    let thread = app.thread("t").await;
    app.append(
        &thread,
        vec![
            user("u0", "Why does the build fail?"),
            json!({"uuid": "a1", "type": "assistant", "message": {"role": "assistant", "id": "msg_1",
                "content": [{"type": "thinking", "thinking": "the lockfile pins tokio 1.38",
                    "signature": "c2ln"}, {"type": "text", "text": "A pinned dependency."}]}}),
        ],
    )
    .await;
    assert!(seqs(&search(&app, &thread, "lockfile").await).is_empty());
    let found = app
        .get(&format!(
            "/v1/threads/{thread}/search?q=lockfile&thinking=true"
        ))
        .await;
    assert_eq!(seqs(&found.body), [1], "{}", found.body);
    assert_eq!(found.body["hits"][0]["in_thinking"], true);
    assert_eq!(seqs(&search(&app, &thread, "pinned").await), [1]);
    app.finish().await;
}

/// A search indexes a bounded batch of its thread first and says what is left; later searches
/// take the rest, and the sweep takes threads nobody searched.
async fn the_index_lag_shows_and_closes(app: TestApp) {
    let thread = app.thread("long").await;
    let count = loupe::store::INDEX_BATCH as usize * 8 + 300;
    let entries: Vec<Value> = (0..count)
        .map(|i| user(&format!("u{i}"), &format!("line {i} of the log")))
        .collect();
    for chunk in entries.chunks(1000) {
        app.append(&thread, chunk.to_vec()).await;
    }
    app.append(&thread, vec![user("last", "the needle-7731 is here")])
        .await;
    let first = search(&app, &thread, "needle-7731").await;
    assert!(first["index"]["pending"].as_i64().unwrap() > 0, "{first}");
    assert!(seqs(&first).is_empty(), "not indexed yet: {first}");
    let second = search(&app, &thread, "needle-7731").await;
    assert_eq!(second["index"]["pending"], 0, "{second}");
    assert_eq!(seqs(&second), [count as i64]);
    // Threads no search has read are brought up by the sweep.
    let other = app.thread("other").await;
    app.append(&other, vec![user("o0", "the haystack-2209 is here")])
        .await;
    assert!(app.store.index_behind(16).await.unwrap() >= 1);
    let all = app.get("/v1/search?q=haystack-2209").await;
    assert_eq!(all.body["pending"], 0, "{}", all.body);
    assert_eq!(all.body["hits"][0]["thread_id"], other.as_str());
    assert_eq!(app.store.index_behind(16).await.unwrap(), 0);
    app.finish().await;
}

/// An entry rewritten in place (as an erasure or a summary derived again rewrites one) loses
/// its old text from search, and its new text is indexed.
async fn a_rewritten_entry_is_indexed_again(app: TestApp) {
    let thread = app.thread("t").await;
    app.append(
        &thread,
        vec![
            user("r0", "the old-wording-41 stands here"),
            user("r1", "later"),
        ],
    )
    .await;
    assert_eq!(seqs(&search(&app, &thread, "old-wording-41").await), [0]);
    let rewritten = serde_json::to_string(&user("r0", "the new-wording-42 stands here")).unwrap();
    sqlx::any::install_default_drivers();
    let mut conn = <sqlx::AnyConnection as sqlx::Connection>::connect(&app.url)
        .await
        .unwrap();
    sqlx::query("UPDATE messages SET body = $1 WHERE seq = 0")
        .bind(rewritten)
        .execute(&mut conn)
        .await
        .unwrap();
    <sqlx::AnyConnection as sqlx::Connection>::close(conn)
        .await
        .unwrap();
    assert!(seqs(&search(&app, &thread, "old-wording-41").await).is_empty());
    assert_eq!(seqs(&search(&app, &thread, "new-wording-42").await), [0]);
    app.finish().await;
}

crate::on_both_backends!(
    thinking_is_searched_only_when_asked,
    the_index_lag_shows_and_closes,
    a_rewritten_entry_is_indexed_again,
    literal_and_word_queries_find_their_entries,
    the_search_tool_answers_in_the_outlines_form,
    snipped_erased_and_deleted_entries_are_never_found,
    another_tenant_finds_nothing,
    summary_lines_are_found_and_go_with_what_they_summarize,
    another_tenant_never_finds_a_line,
);

/// Writes each line as a model would: its own words (`digest`), then the needles of its
/// source, so a line says what no entry does and carries what it summarizes.
struct Digest;

#[async_trait::async_trait]
impl loupe::summarize::Summarizer for Digest {
    fn name(&self) -> String {
        "digest".to_owned()
    }

    async fn summarize(
        &self,
        req: &loupe::summarize::SummaryRequest,
    ) -> Result<loupe::summarize::Summary, loupe::summarize::SummarizeError> {
        let source = crate::tree::request_source(req);
        Ok(loupe::summarize::Summary {
            text: format!(
                "digest: {}",
                crate::tree::keep_needles(&source, req.max_bytes - 8)
            ),
            summarizer: self.name(),
            calls: 1,
        })
    }
}

const FILLER: &str = "the weather report and other chatter about nothing in particular";

/// An outlined thread of `exchanges`, its lines written by [`Digest`], with `needle` in the
/// question of exchange `planted`; `each` runs after every exchange's tree job. Returns the
/// runner, for what the test appends later.
async fn digested(
    app: &TestApp,
    thread: &str,
    exchanges: usize,
    (planted, needle): (usize, &str),
    each: impl AsyncFn(),
) -> loupe::jobs::Runner {
    crate::tree::outline_on(
        app,
        thread,
        json!({"enabled": true, "line_bytes": 64, "budget_bytes": 600, "tail_tokens": 60}),
    )
    .await;
    let runner = crate::tree::runner(app, std::sync::Arc::new(Digest));
    for i in 0..exchanges {
        let question = if i == planted {
            format!("Remember {needle} for later. {FILLER}")
        } else {
            format!("Question {i}: {FILLER}")
        };
        let answer = format!("Answer {i}: {FILLER}");
        app.append(thread, crate::tree::exchange(i, &question, &answer))
            .await;
        crate::tree::drain(&runner).await;
        each().await;
    }
    runner
}

async fn summary_lines_are_found_and_go_with_what_they_summarize(app: TestApp) {
    let thread = app.thread("lines").await;
    let runner = digested(&app, &thread, 16, (3, "NEEDLE-LINE"), async || {}).await;
    // "digest" is in no entry: only the lines a summarizer wrote hold it.
    let found = search(&app, &thread, "digest").await;
    let hits = found["hits"].as_array().unwrap();
    assert!(!hits.is_empty(), "{found}");
    for hit in hits {
        assert_eq!(hit["type"], "line", "{hit}");
        assert!(hit.get("role").is_none(), "{hit}");
        let (id, n) = (
            hit["zoom"]["id"].as_i64().unwrap(),
            hit["zoom"]["n"].as_i64().unwrap(),
        );
        assert_eq!(hit["seq"], id);
        assert!(
            n >= 1 && (n as u64).is_power_of_two() && id % n == 0,
            "{hit}"
        );
        // The address opens with zoom.
        let opened = crate::tree::zoom(&app, &thread, id, n).await;
        assert_eq!(opened["is_error"], false, "{opened}");
    }
    // The tool answers a line by its own address.
    let tool = app
        .post(
            &format!("/v1/threads/{thread}/search"),
            json!({"query": "digest", "limit": 50}),
        )
        .await;
    let content = tool.body["content"].as_str().unwrap();
    for hit in hits {
        let address = format!("{}+{}|", hit["zoom"]["id"], hit["zoom"]["n"]);
        assert!(
            content.lines().any(|l| l.starts_with(&address)),
            "{address} in {content}"
        );
    }
    // Lines quote it; a line within a listed entry is not listed again, so they show where
    // the query matches no entry ("digest" is in none).
    let quoting = |found: &Value| {
        found["hits"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|hit| hit["snippet"].as_str().unwrap().contains("NEEDLE-LINE"))
            .count()
    };
    let lines = app
        .get(&format!("/v1/threads/{thread}/search?q=digest&limit=50"))
        .await
        .body;
    assert!(quoting(&lines) > 0, "{lines}");
    // A word every entry holds lists entries: they come first, lines fill what room is left.
    let common = search(&app, &thread, "weather").await;
    assert!(
        common["hits"]
            .as_array()
            .unwrap()
            .iter()
            .all(|hit| hit["type"] != "line"),
        "{common}"
    );
    let needle = search(&app, &thread, "NEEDLE-LINE").await;
    assert!(
        needle["hits"]
            .as_array()
            .unwrap()
            .iter()
            .all(|hit| hit["type"] != "line"),
        "the entry is listed, not the lines within it: {needle}"
    );
    // A snip takes the lines that held it out of search, with its entry.
    let snip = app
        .post(
            &format!("/v1/threads/{thread}/snip"),
            json!({"uuids": ["u3"]}),
        )
        .await;
    assert_eq!(snip.status, StatusCode::CREATED, "{}", snip.body);
    crate::tree::drain(&runner).await;
    let after = search(&app, &thread, "NEEDLE-LINE").await;
    assert!(seqs(&after).is_empty(), "{after}");
    let lines = app
        .get(&format!("/v1/threads/{thread}/search?q=digest&limit=50"))
        .await
        .body;
    assert_eq!(quoting(&lines), 0, "{lines}");
    app.finish().await;
}

async fn another_tenant_never_finds_a_line(app: TestApp) {
    let app = app.keyed();
    let (key_a, key_b) = (
        app.create_key("tenant-a").await,
        app.create_key("tenant-b").await,
    );
    app.post_as(&key_a, "/v1/threads", json!({"id": "a"})).await;
    let settings = app
        .request_as(
            Some(&key_a),
            axum::http::Method::PUT,
            "/v1/threads/a/settings",
            Some(json!({"outline":
                {"enabled": true, "line_bytes": 64, "budget_bytes": 600, "tail_tokens": 60}})),
        )
        .await;
    assert_eq!(settings.status, StatusCode::OK, "{}", settings.body);
    let runner = crate::tree::runner(&app, std::sync::Arc::new(Digest));
    for i in 0..12 {
        let appended = app
            .post_as(
                &key_a,
                "/v1/threads/a/messages",
                json!({"messages": crate::tree::exchange(i, &format!("Question {i}: {FILLER}"), FILLER)}),
            )
            .await;
        assert_eq!(appended.status, StatusCode::CREATED, "{}", appended.body);
        crate::tree::drain(&runner).await;
    }
    let own = app.get_as(&key_a, "/v1/search?q=digest").await;
    assert!(
        own.body["hits"]
            .as_array()
            .unwrap()
            .iter()
            .any(|hit| hit["type"] == "line"),
        "{}",
        own.body
    );
    let other = app.get_as(&key_b, "/v1/search?q=digest").await;
    assert_eq!(other.status, StatusCode::OK, "{}", other.body);
    assert_eq!(other.body["hits"], json!([]), "{}", other.body);
    app.finish().await;
}

/// A deleted thread leaves nothing of its text in the search indexes' pages: FTS5 deletes its
/// tokens at once (`secure-delete`), entries' and summary lines' alike. Before, the trigrams
/// stayed in old index segments of the SQLite file until some erasure's scrub merged them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_threads_trigrams_leave_the_sqlite_file() {
    let app = TestApp::new(crate::common::Backend::Sqlite).await;
    let thread = app.thread("gone").await;
    // Each search indexes what came since: a segment of its own in the index.
    digested(&app, &thread, 40, (2, "NEEDLE-QX7ZV"), async || {
        search(&app, &thread, "weather").await;
    })
    .await;
    // Indexed: the entry, and the lines that quote it.
    assert!(!seqs(&search(&app, &thread, "qx7zv").await).is_empty());
    let path = app
        .url
        .strip_prefix("sqlite://")
        .unwrap()
        .split('?')
        .next()
        .unwrap()
        .to_owned();
    // The trigram tokenizer folds case: its tokens are the canary lower-cased.
    let residue = |path: &str| {
        [path.to_owned(), format!("{path}-wal")].iter().any(|file| {
            std::fs::read(file).is_ok_and(|bytes| bytes.windows(3).any(|w| w == b"7zv"))
        })
    };
    assert!(residue(&path), "the index holds the canary's trigrams");
    assert_eq!(
        app.delete(&format!("/v1/threads/{thread}")).await.status,
        StatusCode::NO_CONTENT
    );
    // The WAL is emptied after the answer: wait for it (a bound on waiting, not a timing).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while residue(&path) {
        assert!(
            std::time::Instant::now() < deadline,
            "the deleted thread's trigrams stay in the file"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    // Whether old segments merged away by chance or not, both indexes delete at once: the
    // attack's thread left 6 index blocks holding its canary without this.
    sqlx::any::install_default_drivers();
    let mut conn = <sqlx::AnyConnection as sqlx::Connection>::connect(&app.url)
        .await
        .unwrap();
    for index in ["search_index", "line_index"] {
        let secure: Option<i64> = sqlx::query_scalar(&format!(
            "SELECT CAST(v AS INTEGER) FROM {index}_config WHERE k = 'secure-delete'"
        ))
        .fetch_optional(&mut conn)
        .await
        .unwrap();
        assert_eq!(secure, Some(1), "{index}");
    }
    <sqlx::AnyConnection as sqlx::Connection>::close(conn)
        .await
        .unwrap();
    app.finish().await;
}
