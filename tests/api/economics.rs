//! A thread's economics (issue 36): one point per request of the history, Loupe's estimate held
//! out and equal to a context read of the thread as it stood, the sizes and costs responses
//! report, the modelled automatic compaction's cost, the markers, paging, tenant scoping, and
//! malformed `usage`. The real Claude Code session of `tests/fixtures/claude-code/` is the
//! history; what the answer must say is read from the fixture here, independently of the fold.

use std::sync::Arc;

use axum::http::{Method, StatusCode};
use loupe::summarize::ExtractiveSummarizer;
use serde_json::{json, Value};

use crate::common::{user, TestApp};
use crate::tree::{drain, exchange, outline_on, runner};

on_both_backends!(
    the_fixture_s_requests_sizes_costs_and_boundaries,
    each_estimate_is_the_context_read_of_the_thread_before_the_request,
    pages_join_into_the_whole_answer_and_bad_parameters_are_refused,
    another_tenant_s_thread_is_not_found,
    malformed_usage_is_clamped_and_labels_are_clipped,
    clearing_marks_are_where_the_context_read_starts_sending_stubs,
    the_outline_s_boundary_is_marked,
    preserved_segments_long_and_short_count_as_the_context_read_counts_them,
);

const SESSION: &str = include_str!("../fixtures/claude-code/session.jsonl");

fn lines() -> Vec<Value> {
    SESSION
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect()
}

async fn import(app: &TestApp, thread: &str, body: &str) {
    app.thread(thread).await;
    app.import(thread, body).await;
}

/// A point's estimate is the context read's `context_tokens`, less the overhead a content-only
/// read adds (which the economics leave out).
fn assert_estimate_is_the_read(point: &Value, read: &Value, seq: usize) {
    let overhead = read["overhead_tokens"].as_u64().unwrap_or(0);
    assert_eq!(
        point["estimate"]["tokens"].as_u64(),
        read["tokens"].as_u64().map(|tokens| tokens - overhead),
        "seq {seq}"
    );
}

async fn economics(app: &TestApp, thread: &str, query: &str) -> Value {
    let answer = app
        .get(&format!("/v1/threads/{thread}/economics{query}"))
        .await;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.body);
    answer.body
}

/// The requests of the fixture as its lines show them: assistant lines that are not synthetic
/// or API errors, at the first line of each `message.id` run.
fn fixture_requests(lines: &[Value]) -> Vec<usize> {
    let mut requests = Vec::new();
    let mut last_id: Option<Value> = None;
    for (seq, line) in lines.iter().enumerate() {
        let message = &line["message"];
        if line["type"] != "assistant"
            || line["isApiErrorMessage"] == true
            || message["model"] == "<synthetic>"
        {
            continue;
        }
        let id = message["id"].clone();
        if last_id.as_ref() != Some(&id) || id.is_null() {
            requests.push(seq);
        }
        last_id = Some(id);
    }
    requests
}

fn figure(usage: &Value, name: &str) -> u64 {
    usage[name].as_u64().unwrap_or(0)
}

fn points(answer: &Value) -> &Vec<Value> {
    answer["points"].as_array().unwrap()
}

async fn the_fixture_s_requests_sizes_costs_and_boundaries(app: TestApp) {
    import(&app, "session", SESSION).await;
    let lines = lines();
    let answer = economics(&app, "session", "").await;
    let requests = fixture_requests(&lines);
    assert!(requests.len() >= 8, "{requests:?}");
    let seqs: Vec<u64> = points(&answer)
        .iter()
        .map(|p| p["seq"].as_u64().unwrap())
        .collect();
    assert_eq!(seqs, requests.iter().map(|&s| s as u64).collect::<Vec<_>>());
    // The fixture's streamed fragments (two lines of one id) count once, and its synthetic API
    // error is no request.
    assert!(lines[5]["message"]["id"] == lines[6]["message"]["id"]);
    assert!(seqs.contains(&5) && !seqs.contains(&6));
    assert_eq!(lines[62]["message"]["model"], "<synthetic>");
    assert!(!seqs.contains(&62));

    let mut reported_cost = 0_u64;
    for point in points(&answer) {
        let line = &lines[point["seq"].as_u64().unwrap() as usize];
        let usage = &line["message"]["usage"];
        let (input, written, read) = (
            figure(usage, "input_tokens"),
            figure(usage, "cache_creation_input_tokens"),
            figure(usage, "cache_read_input_tokens"),
        );
        assert_eq!(
            point["reported"],
            json!({"prompt_tokens": input + written + read,
                   "output_tokens": figure(usage, "output_tokens")}),
            "{point}"
        );
        assert_eq!(point["timestamp"], line["timestamp"], "when it happened");
        assert_eq!(point["model"], line["message"]["model"]);
        reported_cost += input * 100 + written * 125 + read * 10;
        let cost = point["cost"]["reported"].as_f64().unwrap();
        assert_eq!((cost * 100.0).round() as u64, reported_cost, "{point}");
    }

    // The modelled compaction's first request is the first reported prompt: its fixed part
    // (beyond the content before it, which the estimate holds as no usage came before) read
    // from the cache, the content written to it. Then it only grows.
    let first = &points(&answer)[0];
    let first_prompt = first["reported"]["prompt_tokens"].as_u64().unwrap();
    assert_eq!(first["estimate"]["basis"], "content");
    let content = first["estimate"]["tokens"].as_u64().unwrap();
    assert_eq!(
        first["cost"]["auto_compaction"],
        json!(((first_prompt - content) * 10 + content * 125) as f64 / 100.0)
    );
    let modelled: Vec<f64> = points(&answer)
        .iter()
        .map(|p| p["cost"]["auto_compaction"].as_f64().unwrap())
        .collect();
    assert!(modelled.windows(2).all(|w| w[0] < w[1]), "{modelled:?}");

    let boundaries: Vec<Value> = lines
        .iter()
        .enumerate()
        .filter(|(_, l)| l["type"] == "system" && l["subtype"] == "compact_boundary")
        .map(|(seq, _)| json!({"seq": seq, "kind": "compaction"}))
        .collect();
    assert_eq!(boundaries.len(), 2);
    assert_eq!(answer["markers"], json!(boundaries));

    assert_eq!(answer["thread_id"], "session");
    assert_eq!(answer["next_seq"], lines.len());
    assert_eq!(answer["truncated"], false);
    assert!(answer.get("next_after_seq").is_none());
    assert_eq!(answer["mode"], "plain");
    assert_eq!(answer["window_tokens"], 200_000);
    assert_eq!(
        answer["auto_compact_tokens"],
        app.store.default_auto_compact_tokens()
    );

    // The thread's own threshold is the one in force. Just above the first prompt, the model
    // compacts once the context reaches it: the costs agree up to that request and differ from
    // it on.
    let threshold = first_prompt as i64 + 1_500;
    let put = app
        .request(
            Method::PUT,
            "/v1/threads/session/settings",
            Some(json!({"auto_compact_tokens": threshold})),
        )
        .await;
    assert_eq!(put.status, StatusCode::OK, "{}", put.body);
    let tight = economics(&app, "session", "?window_tokens=1000000").await;
    assert_eq!(tight["auto_compact_tokens"], threshold);
    assert_eq!(tight["window_tokens"], 1_000_000);
    let tight_costs: Vec<f64> = points(&tight)
        .iter()
        .map(|p| p["cost"]["auto_compaction"].as_f64().unwrap())
        .collect();
    let first_difference = tight_costs
        .iter()
        .zip(&modelled)
        .position(|(a, b)| a != b)
        .expect("the model compacts under the thread's threshold");
    assert!(first_difference > 0, "{tight_costs:?} vs {modelled:?}");
    app.finish().await;
}

async fn each_estimate_is_the_context_read_of_the_thread_before_the_request(app: TestApp) {
    import(&app, "session", SESSION).await;
    let answer = economics(&app, "session", "").await;
    let mut bases = Vec::new();
    for point in points(&answer) {
        let seq = point["seq"].as_u64().unwrap() as usize;
        // A thread holding only the entries before the response.
        let thread = format!("before-{seq}");
        let before: String = SESSION
            .lines()
            .take(seq)
            .map(|l| format!("{l}\n"))
            .collect();
        import(&app, &thread, &before).await;
        let context = app
            .get(&format!("/v1/threads/{thread}/context?provider=anthropic"))
            .await;
        assert_eq!(context.status, StatusCode::OK, "{}", context.body);
        let read = &context.body["context_tokens"];
        assert_estimate_is_the_read(point, read, seq);
        assert_eq!(point["estimate"]["basis"], read["basis"], "seq {seq}");
        bases.push(read["basis"].clone());
    }
    // Both bases occur: after each boundary the first request has no usage to anchor on (the
    // second boundary's preserved segment is part of its window).
    assert!(bases.contains(&json!("usage")) && bases.contains(&json!("content")));
    app.finish().await;
}

async fn pages_join_into_the_whole_answer_and_bad_parameters_are_refused(app: TestApp) {
    import(&app, "session", SESSION).await;
    let whole = economics(&app, "session", "").await;
    let total = points(&whole).len();
    let mut joined_points = Vec::new();
    let mut joined_markers = Vec::new();
    let mut query = "?limit=3".to_owned();
    let mut pages = 0;
    loop {
        let page = economics(&app, "session", &query).await;
        pages += 1;
        assert!(points(&page).len() <= 3, "{page}");
        joined_points.extend(points(&page).iter().cloned());
        joined_markers.extend(page["markers"].as_array().unwrap().iter().cloned());
        if page["truncated"] == false {
            assert!(page.get("next_after_seq").is_none());
            break;
        }
        let after = page["next_after_seq"].as_i64().unwrap();
        // Everything up to `after` is answered: the next point lies after it.
        assert!(points(&page).last().unwrap()["seq"].as_i64().unwrap() <= after);
        query = format!("?limit=3&after_seq={after}");
        assert!(pages < 10, "the pages end");
    }
    assert_eq!(pages, total.div_ceil(3));
    assert_eq!(
        &joined_points,
        points(&whole),
        "the figures stay cumulative"
    );
    assert_eq!(json!(joined_markers), whole["markers"]);

    for query in [
        "?limit=0",
        "?limit=10001",
        "?limit=many",
        "?window_tokens=999",
        "?window_tokens=10000001",
        "?after_seq=x",
    ] {
        let refused = app
            .get(&format!("/v1/threads/session/economics{query}"))
            .await;
        refused.assert_problem(StatusCode::BAD_REQUEST, "bad-request");
    }
    let missing = app.get("/v1/threads/nope/economics").await;
    missing.assert_problem(StatusCode::NOT_FOUND, "not-found");
    // Past the end: nothing to answer, nothing cut.
    let past = economics(&app, "session", "?after_seq=100000").await;
    assert_eq!(past["points"], json!([]));
    assert_eq!(past["truncated"], false);
    app.finish().await;
}

async fn another_tenant_s_thread_is_not_found(app: TestApp) {
    let app = app.keyed();
    let (key_a, key_b) = (
        app.create_key("tenant-a").await,
        app.create_key("tenant-b").await,
    );
    let created = app.post_as(&key_a, "/v1/threads", json!({"id": "a"})).await;
    assert_eq!(created.status, StatusCode::CREATED, "{}", created.body);
    let imported = app
        .raw_as(
            Some(&key_a),
            Method::POST,
            "/v1/threads/a/import",
            Some("application/x-ndjson"),
            SESSION.as_bytes().to_vec(),
        )
        .await;
    assert_eq!(imported.status, StatusCode::OK, "{}", imported.body);
    let own = app.get_as(&key_a, "/v1/threads/a/economics").await;
    assert_eq!(own.status, StatusCode::OK, "{}", own.body);
    assert!(!points(&own.body).is_empty());
    let other = app.get_as(&key_b, "/v1/threads/a/economics").await;
    other.assert_problem(StatusCode::NOT_FOUND, "not-found");
    let anonymous = app
        .request_as(None, Method::GET, "/v1/threads/a/economics", None)
        .await;
    assert_eq!(anonymous.status, StatusCode::UNAUTHORIZED);
    app.finish().await;
}

fn answer_with(uuid: &str, id: &str, usage: Value) -> Value {
    json!({"uuid": uuid, "type": "assistant", "timestamp": "2026-03-14T09:00:00.000Z",
        "message": {"role": "assistant", "id": id, "model": "claude-test", "usage": usage,
            "content": [{"type": "text", "text": format!("answer {uuid}")}]}})
}

async fn malformed_usage_is_clamped_and_labels_are_clipped(app: TestApp) {
    let thread = app.thread("odd").await;
    let max = 1_000_000_000_u64;
    let mut long = answer_with("a4", "m4", json!({"input_tokens": 5}));
    long["timestamp"] = json!("7".repeat(5_000));
    long["message"]["model"] = json!("m".repeat(5_000));
    let entries = vec![
        user("u1", "first"),
        answer_with(
            "a1",
            "m1",
            json!({"input_tokens": "12", "cache_creation_input_tokens": -5,
            "cache_read_input_tokens": 2.5, "output_tokens": "lots"}),
        ),
        user("u2", "second"),
        answer_with(
            "a2",
            "m2",
            json!({"input_tokens": u64::MAX, "cache_creation_input_tokens": u64::MAX,
            "cache_read_input_tokens": 1e300, "output_tokens": u64::MAX}),
        ),
        user("u3", "third"),
        json!({"uuid": "a3", "type": "assistant", "message": {"role": "assistant", "id": "m3",
            "content": [{"type": "text", "text": "no usage"}]}}),
        user("u4", "fourth"),
        long,
    ];
    app.append(&thread, &entries).await;
    let answer = economics(&app, &thread, "").await;
    let points = points(&answer);
    assert_eq!(points.len(), 4, "{answer}");
    assert_eq!(
        points[0]["reported"],
        json!({"prompt_tokens": 0, "output_tokens": 0})
    );
    assert_eq!(
        points[1]["reported"],
        json!({"prompt_tokens": 2 * max, "output_tokens": max})
    );
    assert_eq!(points[2]["reported"], Value::Null);
    assert_eq!(points[2]["cost"]["reported"], Value::Null);
    assert_eq!(
        points[1]["cost"]["reported"],
        json!((max * 100 + max * 125) as f64 / 100.0)
    );
    assert_eq!(points[3]["timestamp"].as_str().unwrap().len(), 100);
    assert_eq!(points[3]["model"].as_str().unwrap().len(), 100);
    // The estimate after the huge usage is the clamped one a context read makes.
    let entries_list = entries;
    for (point, entries) in [(&points[2], 5), (&points[3], 7)] {
        let cut = format!("odd-{entries}");
        app.thread(&cut).await;
        app.append(&cut, &entries_list[..entries]).await;
        let context = app
            .get(&format!("/v1/threads/{cut}/context?provider=anthropic"))
            .await;
        assert_eq!(
            point["estimate"]["tokens"], context.body["context_tokens"]["tokens"],
            "{}",
            context.body
        );
    }
    assert!(points[2]["estimate"]["tokens"].as_u64().unwrap() >= 3 * max);
    app.finish().await;
}

/// A tool call answered by a 2,000-byte result (500 tokens by clearing's count).
fn tool_round(i: usize) -> Vec<Value> {
    vec![
        json!({"uuid": format!("call{i}"), "type": "assistant", "message": {"role": "assistant",
            "id": format!("msg_{i}"), "usage": {"input_tokens": 10 + i, "output_tokens": 5},
            "content": [{"type": "tool_use", "id": format!("toolu_{i}"), "name": "Read",
                "input": {"path": format!("src/f{i}.rs")}}]}}),
        json!({"uuid": format!("result{i}"), "type": "user", "message": {"role": "user",
            "content": [{"type": "tool_result", "tool_use_id": format!("toolu_{i}"),
                "content": format!("{i:>4} line of file\n").repeat(100)}]}}),
    ]
}

async fn clearing_marks_are_where_the_context_read_starts_sending_stubs(app: TestApp) {
    let settings = json!({"clearing": {"enabled": true, "keep_tokens": 500, "batch_tokens": 1000,
        "min_bytes": 1000}});
    let thread = app.thread("cleared").await;
    let put = app
        .request(
            Method::PUT,
            &format!("/v1/threads/{thread}/settings"),
            Some(settings.clone()),
        )
        .await;
    assert_eq!(put.status, StatusCode::OK, "{}", put.body);
    let mut entries = vec![user("go", "Read the files one by one.")];
    for i in 0..10 {
        entries.extend(tool_round(i));
    }
    entries.push(
        json!({"uuid": "done", "type": "assistant", "message": {"role": "assistant",
        "id": "msg_done", "content": [{"type": "text", "text": "Read them all."}]}}),
    );
    app.append(&thread, &entries).await;
    let answer = economics(&app, &thread, "").await;
    assert_eq!(answer["mode"], "clearing");
    let marked: Vec<i64> = answer["markers"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["kind"] == "clearing")
        .map(|m| m["seq"].as_i64().unwrap())
        .collect();
    // Where the context read of the thread as it stood before each request sends more stubs
    // than before the previous request: the batches, as the normalizer itself decides them.
    let mut expected = Vec::new();
    let mut stubs_before = 0;
    for point in points(&answer) {
        let seq = point["seq"].as_u64().unwrap() as usize;
        let cut = format!("cleared-{seq}");
        app.thread(&cut).await;
        let put = app
            .request(
                Method::PUT,
                &format!("/v1/threads/{cut}/settings"),
                Some(settings.clone()),
            )
            .await;
        assert_eq!(put.status, StatusCode::OK);
        if seq > 0 {
            app.append(&cut, &entries[..seq]).await;
        }
        let context = app
            .get(&format!("/v1/threads/{cut}/context?provider=anthropic"))
            .await;
        let stubs = context.body["repairs"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|r| r["kind"] == "tool_result_cleared")
            .count();
        if stubs > stubs_before {
            expected.push(seq as i64);
        }
        stubs_before = stubs;
    }
    assert!(expected.len() >= 2, "the history clears more than once");
    assert_eq!(marked, expected);
    app.finish().await;
}

async fn the_outline_s_boundary_is_marked(app: TestApp) {
    let thread = app.thread("outlined").await;
    outline_on(
        &app,
        &thread,
        json!({"enabled": true, "line_bytes": 64, "budget_bytes": 600, "tail_tokens": 60}),
    )
    .await;
    let runner = runner(&app, Arc::new(ExtractiveSummarizer::new()));
    // Where each merge happened: the thread's next seq when the outline's boundary moved.
    let (mut merges, mut boundary) = (Vec::new(), 0);
    for i in 0..12 {
        let turns = exchange(
            i,
            &format!("Question {i}: what does the parser do with the rounding of {i}.005?"),
            &format!("Answer {i}: it rounds half up, so {i}.005 becomes {i}.01 in the report."),
        );
        app.append(&thread, turns).await;
        drain(&runner).await;
        let outline = app.get(&format!("/v1/threads/{thread}/outline")).await;
        let now = outline.body["boundary"].as_i64().unwrap();
        if now != boundary {
            let messages = app.get(&format!("/v1/threads/{thread}/messages")).await;
            merges.push(json!({"seq": messages.body["next_seq"], "kind": "outline"}));
            boundary = now;
        }
    }
    assert!(boundary > 0 && merges.len() >= 2, "{merges:?}");
    let answer = economics(&app, &thread, "").await;
    assert_eq!(answer["mode"], "outline");
    let outline_marks: Vec<&Value> = answer["markers"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["kind"] == "outline")
        .collect();
    assert_eq!(outline_marks, merges.iter().collect::<Vec<_>>());
    // A read that starts after them does not answer them.
    let last = merges.last().unwrap()["seq"].as_i64().unwrap();
    let later = economics(&app, &thread, &format!("?after_seq={last}")).await;
    assert!(later["markers"]
        .as_array()
        .unwrap()
        .iter()
        .all(|m| m["kind"] != "outline"));
    app.finish().await;
}

/// A boundary preserving more entries than the read keeps totals of (4,096) has its segment read
/// again; one preserving a few recent entries is summed from the totals. Both answer what a
/// context read of the thread before the next request answers.
async fn preserved_segments_long_and_short_count_as_the_context_read_counts_them(app: TestApp) {
    let thread = app.thread("preserving").await;
    let mut entries = vec![
        user("first", "The long task starts."),
        answer_with(
            "a0",
            "m0",
            json!({"input_tokens": 10, "cache_read_input_tokens": 4_000}),
        ),
    ];
    for i in 0..4_998 {
        entries.push(user(
            &format!("note{i}"),
            &format!("Note {i}: step {i} of the plan is done."),
        ));
    }
    let boundary = |uuid: &str, first: usize, last: usize| {
        json!({"uuid": uuid, "type": "system", "subtype": "compact_boundary",
            "content": "Conversation compacted", "compact_metadata": {"trigger": "manual",
            "preserved_segment": {"first_seq": first, "last_seq": last}}})
    };
    let summary = |uuid: &str| {
        json!({"uuid": uuid, "type": "user", "is_compact_summary": true,
            "message": {"role": "user", "content": "Summary: the plan's steps are done."}})
    };
    // Seq 5000: a boundary keeping seqs 1 to 4999, past the recent totals.
    entries.push(boundary("long", 1, 4_999));
    entries.push(summary("long-summary"));
    entries.push(user("next", "Go on."));
    let first_point = entries.len();
    entries.push(answer_with("a1", "m1", json!({"input_tokens": 5})));
    entries.push(user("more", "And the last part."));
    // A boundary keeping the last three entries: within the recent totals.
    let kept_from = entries.len() - 3;
    entries.push(boundary("short", kept_from, entries.len() - 1));
    entries.push(summary("short-summary"));
    let second_point = entries.len();
    entries.push(answer_with("a2", "m2", json!({"input_tokens": 6})));
    for chunk in entries.chunks(2_000) {
        app.append(&thread, chunk).await;
    }
    let answer = economics(&app, &thread, "").await;
    let seqs: Vec<usize> = points(&answer)
        .iter()
        .map(|p| p["seq"].as_u64().unwrap() as usize)
        .collect();
    assert_eq!(seqs, vec![1, first_point, second_point]);
    for point in &points(&answer)[1..] {
        let seq = point["seq"].as_u64().unwrap() as usize;
        let cut = format!("preserving-{seq}");
        app.thread(&cut).await;
        for chunk in entries[..seq].chunks(2_000) {
            app.append(&cut, chunk).await;
        }
        let context = app
            .get(&format!("/v1/threads/{cut}/context?provider=anthropic"))
            .await;
        assert_eq!(context.status, StatusCode::OK, "{}", context.body);
        assert_eq!(point["estimate"]["basis"], "content", "{point}");
        assert_estimate_is_the_read(point, &context.body["context_tokens"], seq);
    }
    // The long segment's content is in the estimate: far more than the boundary's own tail.
    assert!(points(&answer)[1]["estimate"]["tokens"].as_u64().unwrap() > 40_000);
    app.finish().await;
}

/// A thread of 100,000 entries (a request every ten, progress between), read whole by the real
/// binary (`LOUPE_DRILL_BIN`, else the test build's) in a process of its own: the read's peak
/// resident memory (`VmHWM`, reset before it) must stay well below the thread's bodies, which
/// it reads every one of, and a read of 10 points must stop early.
/// `cargo test --test api economics_of_a_long_thread -- --ignored --nocapture`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "builds a 100,000-entry thread and starts the binary; run on purpose"]
async fn economics_of_a_long_thread_is_bounded_by_its_page_and_limit() {
    use crate::memory_bounds::{get, memory, reset_peak, Server};

    let app = TestApp::new(crate::common::Backend::Sqlite).await;
    let thread = app.thread("long").await;
    let filler = "x".repeat(800);
    for batch in 0..10 {
        let mut entries = Vec::with_capacity(10_000);
        for i in 0..1_000 {
            let n = batch * 1_000 + i;
            entries.push(user(&format!("u{n}"), &format!("step {n}")));
            for p in 0..8 {
                entries.push(json!({"uuid": format!("p{n}-{p}"), "type": "progress", "data": {"out": filler}}));
            }
            entries.push(answer_with(
                &format!("a{n}"),
                &format!("m{n}"),
                json!({"input_tokens": 1, "cache_read_input_tokens": 100 + n, "output_tokens": 3}),
            ));
        }
        app.append(&thread, entries).await;
    }
    let stored = app.export_line_bytes(&thread).await.iter().sum::<usize>() as f64 / 1_048_576.0;
    let server = Server::start(&app.url).await;
    let pid = server.pid();
    // The first read of each kind warms the connections and caches up; each measured read
    // starts its peak from the memory as it is then.
    let measure = |path: String| {
        let port = server.port;
        async move {
            reset_peak(pid);
            let (before, _) = memory(pid);
            let started = std::time::Instant::now();
            let (status, bytes) = get(port, &path).await;
            let elapsed = started.elapsed();
            let (_, peak) = memory(pid);
            assert_eq!(status, 200, "{path}");
            (peak - before, elapsed, bytes)
        }
    };
    get(server.port, "/v1/threads/long/economics?limit=10").await;
    let (_, short_time, _) = measure("/v1/threads/long/economics?limit=10".to_owned()).await;
    let (rise, full_time, bytes) =
        measure("/v1/threads/long/economics?limit=10000".to_owned()).await;
    println!(
        "economics of 100,000 entries ({stored:.0} MiB stored): 10 points in {short_time:?}; \
         10,000 points ({} KB) in {full_time:?}, peak RSS rise {rise:.1} MiB",
        bytes / 1000
    );
    assert!(stored > 60.0, "{stored} MiB");
    // Every entry is read (10,000 points, the last at the end), yet what is held is a page (4
    // MiB of bodies) parsed one entry at a time, and the points and their JSON.
    assert!(rise < 32.0, "the read's peak rose {rise:.1} MiB");
    assert!(
        short_time * 5 < full_time,
        "{short_time:?} vs {full_time:?}"
    );
    drop(server);
    app.finish().await;
}
