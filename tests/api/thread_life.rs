//! A thread's life beyond its messages (issue 38): its metadata updated, the tenant's threads
//! found by metadata and time in either order, and messages paged newest first.

use axum::http::{Method, StatusCode};
use serde_json::{json, Value};

use crate::common::{user, Backend, TestApp};

on_both_backends!(
    metadata_updates_merge_and_null_removes,
    threads_are_found_by_metadata_time_and_order,
    bad_thread_filters_are_the_callers_mistake,
    messages_page_newest_first,
    thread_lists_read_through_indexes,
    metadata_jsonb_cannot_hold_still_stores_and_lists,
    totals_are_counted_up_to_a_bound,
    updated_at_never_steps_back,
    metadata_updates_racing_appends_and_a_delete_never_fault,
);

/// A total reads every thread it counts: it stops at 10,000 ("at least").
async fn totals_are_counted_up_to_a_bound(app: TestApp) {
    seed_threads(&app, 10_050).await;
    let counted = app.get("/v1/threads?limit=1&include_total=true").await;
    assert_eq!(counted.status, StatusCode::OK, "{}", counted.body);
    assert_eq!(counted.body["total"], 10_000);
    let filtered = app
        .get(&format!(
            "/v1/threads?limit=1&include_total=true&{}",
            query(json!({"user": "u7"}))
        ))
        .await;
    assert_eq!(filtered.body["total"], 11);
    app.finish().await;
}

/// Metadata PostgreSQL's jsonb refuses (a `\u0000` in a string) is stored as on SQLite: the
/// index over the metadata must not refuse the thread, nor break the tenant's filtered lists.
async fn metadata_jsonb_cannot_hold_still_stores_and_lists(app: TestApp) {
    let made = app
        .post(
            "/v1/threads",
            json!({"id": "nul", "metadata": {"user": "ana", "note": "a\u{0}b"}}),
        )
        .await;
    assert_eq!(made.status, StatusCode::CREATED, "{}", made.body);
    assert_eq!(made.body["metadata"]["note"], "a\u{0}b");
    let plain = app
        .post(
            "/v1/threads",
            json!({"id": "plain", "metadata": {"user": "ana"}}),
        )
        .await;
    assert_eq!(plain.status, StatusCode::CREATED);
    let updated = patch(&app, "plain", json!({"metadata": {"other": "x\u{0}"}})).await;
    assert_eq!(updated.status, StatusCode::OK, "{}", updated.body);
    let listed = app
        .get(&format!("/v1/threads?{}", query(json!({"user": "ana"}))))
        .await;
    assert_eq!(listed.status, StatusCode::OK, "{}", listed.body);
    // SQLite reads every stored document; PostgreSQL's jsonb cannot hold these, so no filter
    // matches them there.
    let expected: Vec<&str> = match app.backend {
        Backend::Sqlite => vec!["nul", "plain"],
        Backend::Postgres => vec![],
    };
    assert_eq!(ids(&listed.body), expected);
    assert_eq!(ids(&app.get("/v1/threads").await.body), ["nul", "plain"]);
    app.finish().await;
}

async fn patch(app: &TestApp, thread: &str, body: Value) -> crate::common::TestResponse {
    app.request(Method::PATCH, &format!("/v1/threads/{thread}"), Some(body))
        .await
}

async fn metadata_updates_merge_and_null_removes(app: TestApp) {
    let made = app
        .post(
            "/v1/threads",
            json!({"id": "t", "metadata": {"user": "ana", "draft": true, "tier": 1}}),
        )
        .await;
    assert_eq!(made.status, StatusCode::CREATED);
    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    let updated = patch(
        &app,
        "t",
        json!({"metadata": {"tier": 2, "draft": null, "status": {"open": false}}}),
    )
    .await;
    assert_eq!(updated.status, StatusCode::OK, "{}", updated.body);
    assert_eq!(
        updated.body["metadata"],
        json!({"user": "ana", "tier": 2, "status": {"open": false}})
    );
    assert!(updated.body["updated_at"].as_str() > made.body["updated_at"].as_str());
    let read = app.get("/v1/threads/t").await;
    assert_eq!(read.body["metadata"], updated.body["metadata"]);
    assert_eq!(read.body["updated_at"], updated.body["updated_at"]);
    // The filters follow the update: the new values match, the old and removed ones do not.
    assert_eq!(found(&app, json!({"tier": 2, "user": "ana"})).await, ["t"]);
    assert!(found(&app, json!({"tier": 1})).await.is_empty());
    assert!(found(&app, json!({"draft": true})).await.is_empty());
    patch(
        &app,
        "t",
        json!({"metadata": {"user": null, "tier": null, "status": null}}),
    )
    .await;
    assert!(found(&app, json!({"user": "ana"})).await.is_empty());
    patch(&app, "t", json!({"metadata": {"user": "bo"}})).await;
    assert_eq!(found(&app, json!({"user": "bo"})).await, ["t"]);

    // Past the metadata limit: refused, nothing changed.
    let max = app.limits.max_metadata_bytes;
    let big = patch(&app, "t", json!({"metadata": {"blob": "x".repeat(max)}})).await;
    assert_eq!(
        big.assert_problem(StatusCode::UNPROCESSABLE_ENTITY, "validation")["errors"][0]["field"],
        "metadata"
    );
    assert_eq!(
        app.get("/v1/threads/t").await.body["metadata"],
        json!({"user": "bo"})
    );
    patch(&app, "missing", json!({"metadata": {}}))
        .await
        .assert_problem(StatusCode::NOT_FOUND, "not-found");
    patch(&app, "t", json!({"metadata": {}, "id": "other"}))
        .await
        .assert_problem(StatusCode::UNPROCESSABLE_ENTITY, "validation");
    app.finish().await;
}

/// `updated_at` never steps back: an append whose batch took its time before a later write
/// committed (a PATCH racing it) keeps the later time. The race is set up by writing that later
/// time straight into the row.
async fn updated_at_never_steps_back(app: TestApp) {
    app.thread("t").await;
    let later = chrono::Utc::now().timestamp_millis() + 60_000;
    let pool = sqlx::AnyPool::connect(&app.url).await.unwrap();
    sqlx::query(&format!(
        "UPDATE threads SET updated_at = {later} WHERE thread_id = 't'"
    ))
    .execute(&pool)
    .await
    .unwrap();
    pool.close().await;
    app.append("t", vec![user("u1", "hello")]).await;
    let read = app.get("/v1/threads/t").await;
    let updated = chrono::DateTime::parse_from_rfc3339(read.body["updated_at"].as_str().unwrap())
        .unwrap()
        .timestamp_millis();
    assert_eq!(updated, later, "{}", read.body);
    app.finish().await;
}

/// The ids of the threads `filter` (a metadata filter) lists.
async fn found(app: &TestApp, filter: Value) -> Vec<String> {
    ids(&app
        .get(&format!("/v1/threads?{}", query(filter)))
        .await
        .body)
}

/// The ids of a list answer, in order.
fn ids(list: &Value) -> Vec<String> {
    list["threads"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["id"].as_str().unwrap().to_owned())
        .collect()
}

fn query(filter: Value) -> String {
    let text = filter.to_string();
    let encoded: String = text
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect();
    format!("metadata={encoded}")
}

async fn threads_are_found_by_metadata_time_and_order(app: TestApp) {
    found_by_metadata_time_and_order(&app).await;
    app.finish().await;
}

async fn found_by_metadata_time_and_order(app: &TestApp) {
    let threads = [
        ("a", json!({"user": "ana", "tier": 1, "vip": true})),
        ("b", json!({"user": "bob", "tier": 2, "vip": false})),
        ("c", json!({"user": "ana", "tier": 2, "vip": 1})),
        (
            "d",
            json!({"user": "ana", "tier": "2", "nested": {"user": "bob"}}),
        ),
        ("e", json!({})),
        ("f", json!({"user": ["ana"], "tier": {"n": 2}})),
        ("g", json!({"user": "[\"ana\"]"})),
    ];
    for (id, metadata) in &threads {
        let made = app
            .post("/v1/threads", json!({"id": id, "metadata": metadata}))
            .await;
        assert_eq!(made.status, StatusCode::CREATED);
        tokio::time::sleep(std::time::Duration::from_millis(3)).await;
    }
    let list = |q: String| async move {
        let answer = app.get(&format!("/v1/threads?{q}")).await;
        assert_eq!(answer.status, StatusCode::OK, "{q}: {}", answer.body);
        answer.body
    };
    assert_eq!(
        ids(&list(query(json!({"user": "ana"}))).await),
        ["a", "c", "d"]
    );
    // A number matches the number only; a boolean the boolean only (not 1).
    assert_eq!(
        ids(&list(query(json!({"user": "ana", "tier": 2}))).await),
        ["c"]
    );
    assert_eq!(ids(&list(query(json!({"tier": "2"}))).await), ["d"]);
    assert_eq!(ids(&list(query(json!({"vip": true}))).await), ["a"]);
    assert_eq!(ids(&list(query(json!({"vip": 1}))).await), ["c"]);
    // A string never matches an array or an object, even one whose JSON text it equals.
    assert_eq!(ids(&list(query(json!({"user": "[\"ana\"]"}))).await), ["g"]);
    assert!(ids(&list(query(json!({"tier": "{\"n\":2}"}))).await).is_empty());
    // Only top-level members: d's nested user is not its user.
    assert_eq!(ids(&list(query(json!({"user": "bob"}))).await), ["b"]);
    assert!(ids(&list(query(json!({"user": "nobody"}))).await).is_empty());

    // Newest first, paged, with the total.
    let all_desc = ids(&list("order=desc".into()).await);
    assert_eq!(all_desc, ["g", "f", "e", "d", "c", "b", "a"]);
    let mut paged = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let mut q = "order=desc&limit=2&include_total=true".to_owned();
        if let Some(cursor) = &cursor {
            q.push_str(&format!("&cursor={}", cursor.replace(':', "%3A")));
        }
        let page = list(q).await;
        assert_eq!(page["total"], 7);
        paged.extend(ids(&page));
        match page["next_cursor"].as_str() {
            Some(next) => cursor = Some(next.to_owned()),
            None => break,
        }
    }
    assert_eq!(paged, all_desc);
    let filtered = list(format!(
        "{}&include_total=true&limit=1",
        query(json!({"user": "ana"}))
    ))
    .await;
    assert_eq!(
        (ids(&filtered), &filtered["total"]),
        (vec!["a".to_owned()], &json!(3))
    );
    assert!(list("limit=5".into()).await.get("total").is_none());

    // Updating a thread moves it in the update order, not in the creation order.
    let since = app.get("/v1/threads/g").await.body["updated_at"]
        .as_str()
        .unwrap()
        .to_owned();
    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    assert_eq!(
        app.request(
            Method::PATCH,
            "/v1/threads/b",
            Some(json!({"metadata": {"seen": true}}))
        )
        .await
        .status,
        StatusCode::OK
    );
    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    app.append("a", vec![user("m1", "hello")]).await;
    assert_eq!(
        ids(&list("order_by=updated_at&order=desc".into()).await),
        ["a", "b", "g", "f", "e", "d", "c"]
    );
    assert_eq!(
        ids(&list("order_by=created_at".into()).await),
        ["a", "b", "c", "d", "e", "f", "g"]
    );
    let since = since.replace('+', "%2B").replace(':', "%3A");
    assert_eq!(
        ids(&list(format!("updated_after={since}&order_by=updated_at")).await),
        ["b", "a"]
    );
    let created_c = app.get("/v1/threads/c").await.body["created_at"]
        .as_str()
        .unwrap()
        .replace('+', "%2B")
        .replace(':', "%3A");
    assert_eq!(
        ids(&list(format!("created_after={created_c}")).await),
        ["d", "e", "f", "g"]
    );
}

async fn bad_thread_filters_are_the_callers_mistake(app: TestApp) {
    for q in [
        "metadata=%5B1%5D".to_owned(),
        "metadata=not-json".to_owned(),
        query(json!({"user": {"name": "ana"}})),
        query(json!({"user": null})),
        query(json!({"us\"er": "ana"})),
        query(json!({"": "ana"})),
        // At most 8 members, and 4,096 bytes.
        query(json!({"a": 1, "b": 1, "c": 1, "d": 1, "e": 1, "f": 1, "g": 1, "h": 1, "i": 1})),
        query(json!({"user": "x".repeat(4100)})),
        "order=sideways".to_owned(),
        "order_by=name".to_owned(),
        "created_after=yesterday".to_owned(),
    ] {
        app.get(&format!("/v1/threads?{q}"))
            .await
            .assert_problem(StatusCode::BAD_REQUEST, "bad-request");
    }
    app.finish().await;
}

async fn messages_page_newest_first(app: TestApp) {
    app.thread("m").await;
    let batch: Vec<Value> = (0..25)
        .map(|i| user(&format!("u{i}"), &format!("message {i}")))
        .collect();
    app.append("m", batch).await;
    let mut seqs = Vec::new();
    let mut before: Option<i64> = None;
    loop {
        let uri = match before {
            Some(seq) => format!("/v1/threads/m/messages?order=desc&limit=7&before_seq={seq}"),
            None => "/v1/threads/m/messages?order=desc&limit=7".to_owned(),
        };
        let page = app.get(&uri).await;
        assert_eq!(page.status, StatusCode::OK, "{}", page.body);
        assert!(page.body.get("next_after_seq").is_none());
        seqs.extend(
            page.body["messages"]
                .as_array()
                .unwrap()
                .iter()
                .map(|m| m["seq"].as_i64().unwrap()),
        );
        match page.body["next_before_seq"].as_i64() {
            Some(seq) => before = Some(seq),
            None => break,
        }
    }
    assert_eq!(seqs, (0..25).rev().collect::<Vec<i64>>());
    let past_end = app
        .get("/v1/threads/m/messages?order=desc&limit=3&before_seq=1000")
        .await;
    assert_eq!(past_end.body["messages"][0]["seq"], 24);
    // Both bounds give a window, paged either way to its end.
    for order in ["asc", "desc"] {
        let mut seqs = Vec::new();
        let mut uri =
            format!("/v1/threads/m/messages?order={order}&limit=4&after_seq=5&before_seq=17");
        loop {
            let page = app.get(&uri).await;
            assert_eq!(page.status, StatusCode::OK, "{}", page.body);
            seqs.extend(
                page.body["messages"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|m| m["seq"].as_i64().unwrap()),
            );
            uri = match (
                page.body["next_after_seq"].as_i64(),
                page.body["next_before_seq"].as_i64(),
            ) {
                (Some(after), None) if order == "asc" => {
                    format!("/v1/threads/m/messages?limit=4&after_seq={after}&before_seq=17")
                }
                (None, Some(before)) if order == "desc" => format!(
                    "/v1/threads/m/messages?order=desc&limit=4&after_seq=5&before_seq={before}"
                ),
                (None, None) => break,
                other => panic!("{order}: a cursor the other way: {other:?}"),
            };
        }
        let mut window: Vec<i64> = (6..17).collect();
        if order == "desc" {
            window.reverse();
        }
        assert_eq!(seqs, window, "{order}");
    }
    // A bound below the first seq is the first seq.
    let below = app
        .get("/v1/threads/m/messages?order=desc&after_seq=-5&before_seq=2")
        .await;
    assert_eq!(below.body["messages"][0]["seq"], 1, "{}", below.body);
    assert_eq!(below.body["messages"][1]["seq"], 0, "{}", below.body);
    assert!(
        below.body.get("next_before_seq").is_none(),
        "{}",
        below.body
    );
    // An empty window is an empty page, not a mistake.
    for uri in [
        "/v1/threads/m/messages?after_seq=-9223372036854775808&before_seq=-9223372036854775808",
        "/v1/threads/m/messages?order=desc&after_seq=9&before_seq=10",
        "/v1/threads/m/messages?after_seq=9223372036854775807",
    ] {
        let page = app.get(uri).await;
        assert_eq!(page.status, StatusCode::OK, "{uri}: {}", page.body);
        assert_eq!(page.body["messages"], json!([]), "{uri}");
        assert!(page.body.get("next_after_seq").is_none(), "{uri}");
        assert!(page.body.get("next_before_seq").is_none(), "{uri}");
    }
    app.finish().await;
}

/// The lists read through indexes, as the query planner of each engine chooses them on a
/// tenant's threads: by creation and update time, and on PostgreSQL the metadata's GIN index.
async fn thread_lists_read_through_indexes(app: TestApp) {
    use sqlx::Row;
    let plan = |sql: &'static str, ordered: bool| {
        let url = app.url.clone();
        let backend = app.backend;
        async move {
            let pool = sqlx::AnyPool::connect(&url).await.unwrap();
            let mut conn = pool.acquire().await.unwrap();
            let explain = match backend {
                Backend::Sqlite => format!("EXPLAIN QUERY PLAN {sql}"),
                Backend::Postgres => {
                    // Few rows: the planner would scan; the question is whether it can use one.
                    sqlx::query("SET enable_seqscan = off")
                        .execute(&mut *conn)
                        .await
                        .unwrap();
                    // An ordered list reads its index in order; GIN is read as a bitmap only.
                    if ordered {
                        sqlx::query("SET enable_bitmapscan = off")
                            .execute(&mut *conn)
                            .await
                            .unwrap();
                    }
                    format!("EXPLAIN {sql}")
                }
            };
            let rows = sqlx::query(&explain).fetch_all(&mut *conn).await.unwrap();
            let text: Vec<String> = rows
                .iter()
                .map(|row| {
                    row.try_get::<String, _>(if backend == Backend::Sqlite { 3 } else { 0 })
                        .unwrap()
                })
                .collect();
            text.join("\n")
        }
    };
    let by_updated = plan(
        "SELECT thread_id FROM threads WHERE tenant_id = 'default' \
         ORDER BY updated_at DESC, thread_key DESC LIMIT 10",
        true,
    )
    .await;
    assert!(
        by_updated.contains("threads_by_tenant_updated"),
        "{by_updated}"
    );
    let by_created = plan(
        "SELECT thread_id FROM threads WHERE tenant_id = 'default' \
         ORDER BY created_at, thread_key LIMIT 10",
        true,
    )
    .await;
    assert!(
        by_created.contains("threads_by_tenant_created"),
        "{by_created}"
    );
    if app.backend == Backend::Postgres {
        let by_metadata = plan(
            // The filter's own expression, alone: the GIN index is the one that can serve it
            // (the planner picks between it and the tenant's by their selectivity).
            "SELECT thread_id FROM threads WHERE EXISTS (SELECT 1 FROM thread_metadata m \
             WHERE m.thread_key = threads.thread_key AND m.members @> '{\"default\": {\"user\": \"ana\"}}'::jsonb)",
            false,
        )
        .await;
        assert!(
            by_metadata.contains("thread_metadata_by_members"),
            "{by_metadata}"
        );
    }
    app.finish().await;
}

/// A rare metadata filter on PostgreSQL reads its matches through the GIN index and sorts them,
/// rather than walk the tenant's 10,000 threads in list order probing each (the planner's own
/// choice, with its statistics, on the list's statement: `Store::list_threads`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rare_metadata_filter_reads_its_matches_first() {
    use sqlx::Row;
    let app = TestApp::new(Backend::Postgres).await;
    seed_threads(&app, 10_000).await;
    let pool = sqlx::AnyPool::connect(&app.url).await.unwrap();
    let statement = |order: &str| {
        // The list's statement, its sort key written as the store writes it with a filter.
        format!(
            "EXPLAIN SELECT thread_id FROM threads WHERE tenant_id = 'default' AND EXISTS \
             (SELECT 1 FROM thread_metadata m WHERE m.thread_key = threads.thread_key \
             AND m.members @> '{{\"default\": {{\"user\": \"u7\"}}}}'::jsonb) \
             ORDER BY {order}, thread_key LIMIT 51"
        )
    };
    let plan_of = |sql: String| {
        let pool = pool.clone();
        async move {
            let rows = sqlx::query(&sql).fetch_all(&pool).await.unwrap();
            rows.iter()
                .map(|row| row.try_get::<String, _>(0).unwrap())
                .collect::<Vec<_>>()
                .join("\n")
        }
    };
    let listed = plan_of(statement("created_at + 0")).await;
    assert!(listed.contains("thread_metadata_by_members"), "{listed}");
    assert!(!listed.contains("threads_by_tenant_created"), "{listed}");
    pool.close().await;
    // And the list itself finds the user's ten.
    let found = app
        .get(&format!(
            "/v1/threads?limit=50&{}",
            query(json!({"user": "u7"}))
        ))
        .await;
    assert_eq!(ids(&found.body).len(), 10, "{}", found.body);
    app.finish().await;
}

ignored_on_both_backends!(
    "a measurement for BENCHMARKS.md: cargo test --test api thread_life::filtered_list_figures -- --ignored --nocapture":
    filtered_list_figures,
);

/// BENCHMARKS.md: lists over 100,000 threads of one tenant (seeded by SQL, metadata
/// `{"user": "u<i mod 1000>", "tier": <i mod 3>}`): a page of 50 unfiltered, filtered to one
/// user (100 threads), with the total, newest updated first; medians of 20.
async fn filtered_list_figures(app: TestApp) {
    seed_threads(&app, 100_000).await;
    let filter = query(json!({"user": "u7"}));
    for (name, uri) in [
        ("page of 50", "/v1/threads?limit=50".to_owned()),
        (
            "page of 50, newest updated first",
            "/v1/threads?limit=50&order_by=updated_at&order=desc".to_owned(),
        ),
        (
            "one user (100 of 100,000), page of 50",
            format!("/v1/threads?limit=50&{filter}"),
        ),
        (
            "one user, with the total",
            format!("/v1/threads?limit=50&include_total=true&{filter}"),
        ),
        (
            "one user and tier, newest first",
            format!(
                "/v1/threads?limit=50&order=desc&{}",
                query(json!({"user": "u7", "tier": 1}))
            ),
        ),
    ] {
        let mut times = Vec::new();
        for _ in 0..20 {
            let started = std::time::Instant::now();
            let answer = app.get(&uri).await;
            times.push(started.elapsed());
            assert_eq!(answer.status, StatusCode::OK, "{}", answer.body);
            assert!(!ids(&answer.body).is_empty());
        }
        times.sort();
        println!(
            "{:?} {name}: median {:.2} ms, max {:.2} ms",
            app.backend,
            times[10].as_secs_f64() * 1e3,
            times[19].as_secs_f64() * 1e3
        );
    }
    app.finish().await;
}

/// `count` threads of the default tenant, inserted by SQL: metadata
/// `{"user": "u<i mod 1000>", "tier": <i mod 3>}`, update times shuffled against creation.
async fn seed_threads(app: &TestApp, count: i64) {
    let pool = sqlx::AnyPool::connect(&app.url).await.unwrap();
    let last = count - 1;
    let series = match app.backend {
        Backend::Postgres => format!("SELECT i FROM generate_series(0, {last}) AS s(i)"),
        Backend::Sqlite => format!(
            "WITH RECURSIVE s(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM s WHERE i < {last}) \
             SELECT i FROM s"
        ),
    };
    // `||` concatenates on both engines.
    let key = "'k-' || CAST(i AS TEXT)";
    let id = "'t-' || CAST(i AS TEXT)";
    let metadata = "'{\"user\": \"u' || CAST(i % 1000 AS TEXT) || '\", \"tier\": ' \
                    || CAST(i % 3 AS TEXT) || '}'";
    sqlx::query(&format!(
        "INSERT INTO threads (thread_key, tenant_id, thread_id, metadata, next_seq, visible_count, \
         created_at, updated_at) SELECT {key}, 'default', {id}, {metadata}, 0, 0, \
         1700000000000 + i, 1700000000000 + ((i * 7919) % {count}) FROM ({series}) AS s"
    ))
    .execute(&pool)
    .await
    .unwrap();
    sqlx::query(&format!(
        "INSERT INTO thread_names (tenant_id, thread_id, thread_key) \
         SELECT 'default', {id}, {key} FROM ({series}) AS s"
    ))
    .execute(&pool)
    .await
    .unwrap();
    if app.backend == Backend::Postgres {
        // What the store writes beside a thread's metadata, for its filters (migration 0020).
        sqlx::query(
            "INSERT INTO thread_metadata (thread_key, members) \
             SELECT thread_key, jsonb_build_object(tenant_id, metadata::jsonb) FROM threads \
             WHERE thread_key LIKE 'k-%'",
        )
        .execute(&pool)
        .await
        .unwrap();
        sqlx::query("ANALYZE threads").execute(&pool).await.unwrap();
        sqlx::query("ANALYZE thread_metadata")
            .execute(&pool)
            .await
            .unwrap();
    }
    pool.close().await;
}

/// PATCHes racing appends (the group writer) and then a delete answer 200 or 404, never a
/// fault (the attack: on SQLite a PATCH read in a transaction that another writer then moved,
/// and got 503).
async fn metadata_updates_racing_appends_and_a_delete_never_fault(app: TestApp) {
    use axum::body::Body;
    use axum::http::Request;
    let request = |method: Method, uri: String, body: Value| {
        Request::builder()
            .method(method)
            .uri(uri)
            .header("content-type", "application/json")
            .body(Body::from(body.to_string()))
            .unwrap()
    };
    for round in 0..5 {
        let thread = format!("r{round}");
        app.thread(&thread).await;
        let mut tasks = Vec::new();
        for worker in 0..4 {
            let (router, thread) = (app.router.clone(), thread.clone());
            tasks.push(tokio::spawn(async move {
                let mut statuses = Vec::new();
                for i in 0..25 {
                    let patched = crate::common::send_to(
                        &router,
                        request(
                            Method::PATCH,
                            format!("/v1/threads/{thread}"),
                            json!({"metadata": {"n": i, "w": worker}}),
                        ),
                    )
                    .await;
                    statuses.push(patched.status);
                    let uuid = format!("{thread}-{worker}-{i}");
                    let appended = crate::common::send_to(
                        &router,
                        request(
                            Method::POST,
                            format!("/v1/threads/{thread}/messages"),
                            json!({"messages": [user(&uuid, "hello")]}),
                        ),
                    )
                    .await;
                    statuses.push(appended.status);
                }
                statuses
            }));
        }
        let deleted = app.delete(&format!("/v1/threads/{thread}")).await.status;
        assert_eq!(deleted, StatusCode::NO_CONTENT);
        for task in tasks {
            for status in task.await.unwrap() {
                assert!(
                    status.is_success() || status == StatusCode::NOT_FOUND,
                    "round {round}: {status}"
                );
            }
        }
    }
    app.finish().await;
}
