//! Forks (issue 38): a thread made of a prefix of another, compared entry by entry with it; the
//! summary tree's lines it shares rather than summarizes again; an erasure in the parent that
//! reaches every fork that took the erased entries; a fork that outlives its parent.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use crate::common::{tool_rounds, user, TestApp};
use crate::erasure::{assert_gone_everywhere, planted_thread, stored_copies};
use crate::tree::{assert_valid, drain, exchange, outline_on, runner, zoom};
use async_trait::async_trait;
use axum::http::StatusCode;
use loupe::summarize::{SummarizeError, Summarizer, Summary, SummaryRequest};
use serde_json::{json, Value};
use sqlx::Row;

on_both_backends!(
    a_fork_holds_the_parents_prefix_entry_by_entry,
    a_fork_shares_the_tree_lines_of_its_prefix,
    an_erasure_in_the_parent_reaches_every_fork_that_took_it,
    a_fork_outlives_its_parent,
    bad_forks_are_refused,
    an_erasure_reaches_the_forks_of_a_deleted_fork,
    a_long_fork_is_copied_whole_in_chunks,
    a_receipt_names_the_threads_that_still_hold_the_erased_text,
);

async fn fork(app: &TestApp, parent: &str, body: Value) -> crate::common::TestResponse {
    app.post(&format!("/v1/threads/{parent}/fork"), body).await
}

/// Every stored entry of `thread`, as the messages API pages them.
async fn entries(app: &TestApp, thread: &str) -> Vec<Value> {
    let mut all = Vec::new();
    let mut after = String::new();
    loop {
        let page = app
            .get(&format!("/v1/threads/{thread}/messages?limit=1000{after}"))
            .await;
        assert_eq!(page.status, StatusCode::OK, "{}", page.body);
        all.extend(page.body["messages"].as_array().unwrap().iter().cloned());
        match page.body["next_after_seq"].as_i64() {
            Some(next) => after = format!("&after_seq={next}"),
            None => return all,
        }
    }
}

fn ids(list: &Value) -> Vec<&str> {
    list["threads"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["id"].as_str().unwrap())
        .collect()
}

async fn a_fork_holds_the_parents_prefix_entry_by_entry(app: TestApp) {
    let made = app
        .post(
            "/v1/threads",
            json!({"id": "p", "metadata": {"user": "ana"}}),
        )
        .await;
    assert_eq!(made.status, StatusCode::CREATED);
    app.append("p", tool_rounds("check the build", 0, 10, 3))
        .await;
    let parent = entries(&app, "p").await;
    let total = parent.len() as i64;
    assert!(total > 20, "{total}");
    let at = 17;

    let forked = fork(&app, "p", json!({"at_seq": at, "id": "f"})).await;
    assert_eq!(forked.status, StatusCode::CREATED, "{}", forked.body);
    assert_eq!(forked.body["message_count"], at);
    assert_eq!(
        forked.body["forked_from"],
        json!({"thread_id": "p", "at_seq": at})
    );
    // The parent's metadata, as none was given.
    assert_eq!(forked.body["metadata"], json!({"user": "ana"}));
    assert_eq!(entries(&app, "f").await, parent[..at as usize]);
    app.assert_stored_bytes_counted("f").await;
    // Found by metadata like any thread, and listed as the parent's fork.
    let by_user = app
        .get("/v1/threads?metadata=%7B%22user%22%3A%22ana%22%7D")
        .await;
    assert_eq!(ids(&by_user.body), ["p", "f"]);

    // A thread like any other: it takes appends from where it was cut, and reads as a valid
    // context for every provider (a cut inside a round is repaired as a crash's would be).
    app.append("f", vec![user("f-next", "and now the other branch")])
        .await;
    let after = entries(&app, "f").await;
    assert_eq!(after.len() as i64, at + 1);
    assert_eq!(after[at as usize]["seq"], at);
    for provider in ["anthropic", "openai", "openai_responses", "gemini"] {
        let context = app
            .get(&format!("/v1/threads/f/context?provider={provider}"))
            .await;
        assert_eq!(context.status, StatusCode::OK, "{}", context.body);
        assert_valid(&context.body, provider);
    }
    // The parent is untouched.
    assert_eq!(entries(&app, "p").await, parent);
    assert_eq!(app.get("/v1/threads/p").await.body["message_count"], total);

    // By default the whole thread; at 0 an empty one; a rewind is a fork of a fork.
    let whole = fork(
        &app,
        "p",
        json!({"id": "whole", "metadata": {"user": "bo"}}),
    )
    .await;
    assert_eq!(whole.body["message_count"], total);
    assert_eq!(whole.body["metadata"], json!({"user": "bo"}));
    assert_eq!(entries(&app, "whole").await, parent);
    let empty = fork(&app, "p", json!({"at_seq": 0, "id": "empty"})).await;
    assert_eq!(empty.body["message_count"], 0);
    let rewound = fork(&app, "f", json!({"at_seq": 5})).await;
    assert_eq!(rewound.status, StatusCode::CREATED, "{}", rewound.body);
    let rewound_id = rewound.body["id"].as_str().unwrap().to_owned();
    assert_eq!(
        rewound.body["forked_from"],
        json!({"thread_id": "f", "at_seq": 5})
    );
    assert_eq!(entries(&app, &rewound_id).await, parent[..5]);

    let of_p = app.get("/v1/threads?forked_from=p").await;
    assert_eq!(ids(&of_p.body), ["f", "whole", "empty"]);
    let of_f = app.get("/v1/threads?forked_from=f").await;
    assert_eq!(ids(&of_f.body), [rewound_id.as_str()]);
    app.finish().await;
}

/// A summarizer that counts its calls (each line a model would write).
struct Counting(AtomicU32);

#[async_trait]
impl Summarizer for Counting {
    fn name(&self) -> String {
        "counting".to_owned()
    }

    async fn summarize(&self, req: &SummaryRequest) -> Result<Summary, SummarizeError> {
        let n = self.0.fetch_add(1, Ordering::SeqCst);
        let source = crate::tree::request_source(req);
        Ok(Summary {
            text: format!("line {n}: {}", source.chars().take(40).collect::<String>()),
            summarizer: self.name(),
            calls: 1,
        })
    }
}

/// The tree rows of `thread`: (level, idx, text, summarizer), in order.
async fn tree_rows(app: &TestApp, thread: &str) -> Vec<(i64, i64, String, String)> {
    sqlx::any::install_default_drivers();
    let pool = sqlx::AnyPool::connect(&app.url).await.unwrap();
    let rows = sqlx::query(
        "SELECT n.level, n.idx, n.text, n.summarizer FROM tree_nodes n \
         JOIN threads t ON t.thread_key = n.thread_key \
         WHERE t.thread_id = $1 ORDER BY n.level, n.idx",
    )
    .bind(thread)
    .fetch_all(&pool)
    .await
    .unwrap();
    pool.close().await;
    rows.iter()
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3)))
        .collect()
}

const LONG: &str = "a question long enough that a model writes its line, about the launch price \
    and the spreadsheet that still says the old one";

async fn a_fork_shares_the_tree_lines_of_its_prefix(app: TestApp) {
    let counting = Arc::new(Counting(AtomicU32::new(0)));
    let runner = runner(&app, counting.clone());
    app.thread("p").await;
    outline_on(
        &app,
        "p",
        json!({"enabled": true, "line_bytes": 64, "budget_bytes": 2000, "tail_tokens": 60}),
    )
    .await;
    for i in 0..20 {
        app.append("p", exchange(i, &format!("{i}: {LONG}"), "ok"))
            .await;
    }
    drain(&runner).await;
    let parent_calls = counting.0.load(Ordering::SeqCst);
    let parent_nodes = tree_rows(&app, "p").await;
    let at: i64 = 24;
    let inside: Vec<_> = parent_nodes
        .iter()
        .filter(|(level, idx, _, _)| (idx + 1) << level <= at)
        .cloned()
        .collect();
    assert!(
        inside.iter().any(|(_, _, _, by)| by == "counting"),
        "{inside:?}"
    );

    let forked = fork(&app, "p", json!({"at_seq": at, "id": "f"})).await;
    assert_eq!(forked.status, StatusCode::CREATED, "{}", forked.body);
    // The lines covering only the prefix came with it, word for word, and no other.
    assert_eq!(tree_rows(&app, "f").await, inside);
    // Its tree job writes what the prefix's lines do not cover; the shared ones cost nothing.
    counting.0.store(0, Ordering::SeqCst);
    drain(&runner).await;
    let fork_calls = counting.0.load(Ordering::SeqCst);
    let model_lines = inside
        .iter()
        .filter(|(_, _, _, by)| by == "counting")
        .count() as u32;
    assert!(
        fork_calls + model_lines <= parent_calls && model_lines > 0,
        "the fork made {fork_calls} calls, the parent {parent_calls}, {model_lines} shared"
    );
    let outline = app.get("/v1/threads/f/context?view=outline").await;
    assert_eq!(outline.status, StatusCode::OK, "{}", outline.body);
    assert_valid(&outline.body, "anthropic");
    let opened = zoom(&app, "f", 0, 16).await;
    assert!(opened.to_string().contains("0: a question"), "{opened}");

    // A snip in the parent after the cut hid prefix entries from its tree: a fork made then
    // takes no line, and its own tree shows the hidden entry again.
    let snip = app
        .post("/v1/threads/p/snip", json!({"uuids": ["u3"]}))
        .await;
    assert!(snip.status.is_success(), "{}", snip.body);
    drain(&runner).await;
    let later = fork(&app, "p", json!({"at_seq": at, "id": "g"})).await;
    assert_eq!(later.status, StatusCode::CREATED, "{}", later.body);
    assert!(tree_rows(&app, "g").await.is_empty());
    drain(&runner).await;
    let g_line = zoom(&app, "g", 6, 1).await;
    assert!(g_line.to_string().contains("3: a question"), "{g_line}");
    app.finish().await;
}

async fn an_erasure_in_the_parent_reaches_every_fork_that_took_it(app: TestApp) {
    let (names, erased) = planted_thread(&app, "p", false).await;
    let secrets: Vec<&str> = names.iter().map(String::as_str).collect();
    let runner = runner(&app, Arc::new(crate::erasure::Leaky));
    let count = app.get("/v1/threads/p").await.body["message_count"]
        .as_i64()
        .unwrap();
    // A fork of everything, a fork of that fork, and one cut before the canaries.
    assert_eq!(
        fork(&app, "p", json!({"id": "a"})).await.status,
        StatusCode::CREATED
    );
    assert_eq!(
        fork(&app, "a", json!({"id": "b"})).await.status,
        StatusCode::CREATED
    );
    assert_eq!(
        fork(&app, "p", json!({"id": "c", "at_seq": 2}))
            .await
            .status,
        StatusCode::CREATED
    );
    drain(&runner).await;
    for thread in ["a", "b"] {
        let found = app
            .get(&format!("/v1/threads/{thread}/search?q={}", names[0]))
            .await;
        assert!(
            found.body["hits"].as_array().is_some_and(|h| !h.is_empty()),
            "{thread}: {}",
            found.body
        );
    }
    let receipt = app
        .post("/v1/threads/p/erasures", json!({"uuids": erased}))
        .await;
    assert_eq!(receipt.status, StatusCode::CREATED, "{}", receipt.body);
    let seqs = receipt.body["seqs"].clone();
    let forks = receipt.body["forks"].as_array().unwrap();
    let reached: Vec<&str> = forks
        .iter()
        .map(|f| f["thread_id"].as_str().unwrap())
        .collect();
    assert_eq!(reached.len(), 2, "{}", receipt.body);
    assert!(
        reached.contains(&"a") && reached.contains(&"b"),
        "{reached:?}"
    );
    for f in forks {
        assert_eq!(f["seqs"], seqs);
    }
    drain(&runner).await;
    for thread in ["p", "a", "b"] {
        assert_gone_everywhere(&app, thread, &secrets).await;
    }
    let listed = app.get("/v1/threads/a/erasures").await;
    assert_eq!(listed.body["erasures"].as_array().unwrap().len(), 1);
    assert_eq!(
        app.get("/v1/threads/a").await.body["message_count"],
        count,
        "a tombstone keeps its seq"
    );
    let copies = stored_copies(&app, &["p", "a", "b"], &names).await;
    assert!(copies.is_empty(), "{copies:?}");
    app.finish().await;
}

async fn a_fork_outlives_its_parent(app: TestApp) {
    app.thread("p").await;
    app.append("p", tool_rounds("deploy it", 0, 4, 2)).await;
    assert_eq!(
        fork(&app, "p", json!({"id": "f"})).await.status,
        StatusCode::CREATED
    );
    let before = entries(&app, "f").await;
    assert_eq!(
        app.delete("/v1/threads/p").await.status,
        StatusCode::NO_CONTENT
    );
    assert_eq!(entries(&app, "f").await, before);
    let read = app.get("/v1/threads/f").await;
    assert_eq!(read.body["forked_from"]["thread_id"], "p");
    let context = app.get("/v1/threads/f/context").await;
    assert_eq!(context.status, StatusCode::OK, "{}", context.body);
    assert_valid(&context.body, "anthropic");
    // The deleted parent has no forks to list, nor does a new thread of its name.
    assert!(ids(&app.get("/v1/threads?forked_from=p").await.body).is_empty());
    app.thread("p").await;
    assert!(ids(&app.get("/v1/threads?forked_from=p").await.body).is_empty());
    // And the fork's own erasure works with its parent gone.
    let uuid = before[0]["uuid"].as_str().unwrap();
    let erased = app
        .post("/v1/threads/f/erasures", json!({"uuids": [uuid]}))
        .await;
    assert_eq!(erased.status, StatusCode::CREATED, "{}", erased.body);
    app.finish().await;
}

async fn bad_forks_are_refused(app: TestApp) {
    let app = app.keyed();
    let a = app.create_key("tenant-a").await;
    let b = app.create_key("tenant-b").await;
    assert_eq!(
        app.post_as(&a, "/v1/threads", json!({"id": "p"}))
            .await
            .status,
        StatusCode::CREATED
    );
    let post = |body: Value| app.post_as(&a, "/v1/threads/p/fork", body);
    for (body, field) in [
        (json!({"at_seq": 1}), "at_seq"),
        (json!({"at_seq": -1}), "at_seq"),
        (json!({"id": "has space"}), "id"),
    ] {
        let refused = post(body.clone()).await;
        let problem = refused.assert_problem(StatusCode::UNPROCESSABLE_ENTITY, "validation");
        assert_eq!(problem["errors"][0]["field"], field, "{body}");
    }
    post(json!({"id": "p"}))
        .await
        .assert_problem(StatusCode::CONFLICT, "thread-exists");
    for body in [json!({}), json!({"id": "p"})] {
        // Missing is 404, whatever the id asked for.
        app.post_as(&a, "/v1/threads/missing/fork", body)
            .await
            .assert_problem(StatusCode::NOT_FOUND, "not-found");
    }
    for bad in ["a%2Fb", "", &"x".repeat(129)] {
        app.get_as(&a, &format!("/v1/threads?forked_from={bad}"))
            .await
            .assert_problem(StatusCode::BAD_REQUEST, "bad-request");
    }
    // Another tenant's thread is not there for it, and its forks are not listed.
    app.post_as(&b, "/v1/threads/p/fork", json!({"id": "stolen"}))
        .await
        .assert_problem(StatusCode::NOT_FOUND, "not-found");
    assert_eq!(
        post(json!({"id": "mine"})).await.status,
        StatusCode::CREATED
    );
    let listed = app.get_as(&b, "/v1/threads?forked_from=p").await;
    assert!(ids(&listed.body).is_empty(), "{}", listed.body);
    // Nothing was written for the refused forks.
    let all = app.get_as(&a, "/v1/threads").await;
    assert_eq!(ids(&all.body), ["p", "mine"]);
    app.finish().await;
}

/// A fork of a fork whose middle is deleted still holds the parent's entries: an erasure in the
/// parent reaches it (the attack: the secret stayed, in the files too). A retried erasure adds
/// no erasure to forks already erased.
async fn an_erasure_reaches_the_forks_of_a_deleted_fork(app: TestApp) {
    app.thread("p").await;
    outline_on(
        &app,
        "p",
        json!({"enabled": true, "line_bytes": 96, "budget_bytes": 900, "tail_tokens": 20}),
    )
    .await;
    let runner = runner(&app, Arc::new(crate::erasure::Leaky));
    let secret = "NEEDLE-middle-fork";
    let mut batch: Vec<Value> = (0..10)
        .map(|i| user(&format!("m{i}"), &format!("message {i}")))
        .collect();
    batch[4] = user("m4", &format!("the password is {secret}"));
    app.append("p", batch).await;
    assert_eq!(
        fork(&app, "p", json!({"id": "f1", "at_seq": 8}))
            .await
            .status,
        StatusCode::CREATED
    );
    assert_eq!(
        fork(&app, "f1", json!({"id": "f2", "at_seq": 6}))
            .await
            .status,
        StatusCode::CREATED
    );
    assert_eq!(
        fork(&app, "f1", json!({"id": "f3", "at_seq": 3}))
            .await
            .status,
        StatusCode::CREATED
    );
    assert_eq!(
        app.delete("/v1/threads/f1").await.status,
        StatusCode::NO_CONTENT
    );
    // The lineage shown is what it was made from.
    assert_eq!(
        app.get("/v1/threads/f2").await.body["forked_from"],
        json!({"thread_id": "f1", "at_seq": 6})
    );
    let receipt = app
        .post("/v1/threads/p/erasures", json!({"seqs": [4]}))
        .await;
    assert_eq!(receipt.status, StatusCode::CREATED, "{}", receipt.body);
    let reached: Vec<&str> = receipt.body["forks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["thread_id"].as_str().unwrap())
        .collect();
    assert_eq!(reached, ["f2"], "{}", receipt.body);
    drain(&runner).await;
    for uri in [
        "/v1/threads/f2/messages?limit=100".to_owned(),
        "/v1/threads/f2/export".to_owned(),
        "/v1/threads/f2/context".to_owned(),
        "/v1/threads/f2/outline".to_owned(),
        format!("/v1/threads/f2/search?q={secret}"),
        format!("/v1/search?q={secret}"),
    ] {
        let response = app.get(&uri).await;
        assert_eq!(response.status, StatusCode::OK, "{uri}: {}", response.body);
        assert!(
            !response.body.to_string().contains(secret),
            "{uri}: {}",
            response.body
        );
    }
    let copies = stored_copies(&app, &["p", "f2"], &[secret.to_owned()]).await;
    assert!(copies.is_empty(), "{copies:?}");
    // f3 took entries below 3 only: untouched.
    assert!(app.get("/v1/threads/f3/erasures").await.body["erasures"]
        .as_array()
        .unwrap()
        .is_empty());

    let again = app
        .post("/v1/threads/p/erasures", json!({"seqs": [4]}))
        .await;
    assert_eq!(again.status, StatusCode::CREATED, "{}", again.body);
    assert!(again.body.get("forks").is_none(), "{}", again.body);
    let listed = app.get("/v1/threads/f2/erasures").await;
    assert_eq!(listed.body["erasures"].as_array().unwrap().len(), 1);
    app.finish().await;
}

/// Past a chunk of rows (SQLite copies a chunk a statement, before the fork's transaction),
/// the copy is still the prefix, entry by entry, and its search rows come with it.
async fn a_long_fork_is_copied_whole_in_chunks(app: TestApp) {
    app.thread("p").await;
    for batch in 0..12 {
        let entries: Vec<Value> = (0..1_000)
            .map(|i| {
                let n = batch * 1_000 + i;
                user(&format!("m{n}"), &format!("message number {n}"))
            })
            .collect();
        app.append("p", entries).await;
    }
    // Indexed for search (a batch a request), so its rows are copied too.
    searched_through(&app, "p", "11999").await;
    let at = 11_001;
    let forked = fork(&app, "p", json!({"id": "f", "at_seq": at})).await;
    assert_eq!(forked.status, StatusCode::CREATED, "{}", forked.body);
    let parent = entries(&app, "p").await;
    assert_eq!(entries(&app, "f").await, parent[..at as usize]);
    app.assert_stored_bytes_counted("f").await;
    let hit = searched_through(&app, "f", "11000").await;
    assert_eq!(hit.body["hits"][0]["seq"], 11_000, "{}", hit.body);
    let miss = app.get("/v1/threads/f/search?q=11001").await;
    assert_eq!(miss.body["hits"], json!([]), "{}", miss.body);
    app.finish().await;
}

/// The answer of a search once the thread's index has caught up.
async fn searched_through(app: &TestApp, thread: &str, q: &str) -> crate::common::TestResponse {
    for _ in 0..100 {
        let found = app.get(&format!("/v1/threads/{thread}/search?q={q}")).await;
        assert_eq!(found.status, StatusCode::OK, "{}", found.body);
        if found.body["index"]["pending"] == 0 {
            return found;
        }
    }
    panic!("the index of {thread} never caught up");
}

/// The threads a receipt says still hold copies of what it erased.
fn still_held_by(receipt: &Value) -> Vec<&str> {
    receipt["still_held_by"]
        .as_array()
        .unwrap_or_else(|| panic!("no still_held_by: {receipt}"))
        .iter()
        .map(|id| id.as_str().unwrap())
        .collect()
}

/// Issue 53, finding 11: an erasure reaches the forks below the thread it is made in, not its
/// parent nor the parent's other forks. Its receipt names those that still hold the text (at
/// its answer, and when listed later), so the caller can erase there too; one made in the root
/// reaches every fork that took the entries, as before, and names none.
async fn a_receipt_names_the_threads_that_still_hold_the_erased_text(app: TestApp) {
    app.thread("p").await;
    let secrets: Vec<String> = (0..4).map(|i| format!("lineage secret {i}.")).collect();
    let planted: Vec<Value> = (0..4)
        .map(|i| user(&format!("m{i}"), &secrets[i]))
        .collect();
    app.append("p", planted).await;
    // p ─┬─ a ── a2
    //    ├─ b
    //    └─ c (cut before seq 2)
    for (parent, body) in [
        ("p", json!({"id": "a"})),
        ("p", json!({"id": "b"})),
        ("p", json!({"id": "c", "at_seq": 2})),
        ("a", json!({"id": "a2"})),
    ] {
        let made = fork(&app, parent, body).await;
        assert_eq!(made.status, StatusCode::CREATED, "{}", made.body);
    }

    // In a sibling: the parent and the other branch still hold it (c took no seq 2).
    let in_b = app
        .post("/v1/threads/b/erasures", json!({"seqs": [2]}))
        .await;
    assert_eq!(in_b.status, StatusCode::CREATED, "{}", in_b.body);
    assert_eq!(still_held_by(&in_b.body), ["p", "a", "a2"]);
    assert!(in_b.body.get("forks").is_none(), "{}", in_b.body);

    // In a fork of a fork: its parent, its grandparent; b has erased its copy already.
    let in_a2 = app
        .post("/v1/threads/a2/erasures", json!({"seqs": [2]}))
        .await;
    assert_eq!(in_a2.status, StatusCode::CREATED, "{}", in_a2.body);
    assert_eq!(still_held_by(&in_a2.body), ["a", "p"]);
    // The stored receipt says the same.
    let listed = app.get("/v1/threads/a2/erasures").await;
    assert_eq!(listed.status, StatusCode::OK, "{}", listed.body);
    assert_eq!(still_held_by(&listed.body["erasures"][0]), ["a", "p"]);

    // In the root: every fork that still held it is reached (a; a2 and b were erased), and no
    // copy is left anywhere.
    let in_p = app
        .post("/v1/threads/p/erasures", json!({"seqs": [2]}))
        .await;
    assert_eq!(in_p.status, StatusCode::CREATED, "{}", in_p.body);
    let reached: Vec<&str> = in_p.body["forks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["thread_id"].as_str().unwrap())
        .collect();
    assert_eq!(reached, ["a"], "{}", in_p.body);
    assert_eq!(still_held_by(&in_p.body), Vec::<&str>::new());
    for thread in ["p", "a", "a2", "b", "c"] {
        let all = entries(&app, thread).await;
        let text = Value::from(all).to_string();
        assert!(!text.contains(&secrets[2]), "{thread} holds it");
        assert!(text.contains(&secrets[1]), "{thread} lost another entry");
    }
    app.finish().await;
}
