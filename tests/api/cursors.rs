//! Incremental cursors (issue 6) on both backends: the seed's bookmark scenario, every error case,
//! compare-and-set and lease races between concurrent consumers, and lease expiry under an
//! injected clock.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;

use crate::common::{assistant, user, TestApp};
use axum::http::StatusCode;
use loupe::store::{AdvanceRequest, StoreError, TenantId, ThreadId};
use serde_json::{json, Value};

on_both_backends!(
    the_seed_scenario_counts_two_new_then_none_and_a_failed_run_reads_them_again,
    only_user_and_assistant_entries_are_counted_but_every_entry_is_pending,
    compaction_and_snips_keep_the_bookmark_and_the_summary_is_counted,
    a_normalized_batch_is_ready_for_the_provider,
    advancing_to_the_current_position_is_idempotent,
    every_error_case_has_its_status_and_type,
    cursors_are_listed_and_deleted_with_their_thread,
    an_expired_lease_lets_another_worker_claim_the_same_batch,
    competing_cas_consumers_acknowledge_every_message_exactly_once,
    competing_lease_workers_acknowledge_every_message_exactly_once,
    crashing_and_slow_lease_workers_lose_nothing_and_acknowledge_nothing_twice,
);

/// `count` alternating user and assistant entries with uuids `m-0`, `m-1`, …
fn conversation(count: usize) -> Vec<Value> {
    (0..count)
        .map(|i| {
            let uuid = format!("m-{i}");
            if i.is_multiple_of(2) {
                user(&uuid, &format!("question {i}"))
            } else {
                assistant(&uuid, &format!("msg_{i}"), &format!("answer {i}"))
            }
        })
        .collect()
}

fn uuids(batch: &Value) -> Vec<String> {
    batch["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["uuid"].as_str().unwrap().to_owned())
        .collect()
}

async fn the_seed_scenario_counts_two_new_then_none_and_a_failed_run_reads_them_again(
    app: TestApp,
) {
    let thread = app.thread("seed").await;
    app.append(&thread, conversation(50)).await;
    let cursor = format!("/v1/threads/{thread}/cursors/memory");

    let fresh = app.get(&cursor).await;
    assert_eq!(fresh.status, StatusCode::OK, "{}", fresh.body);
    assert_eq!(fresh.body["bookmark"], Value::Null);
    assert_eq!(fresh.body["new_count"], 50);

    // The bookmark at the 48th message.
    let placed = app
        .post(
            &format!("{cursor}/advance"),
            json!({"to": "m-47", "expected": null}),
        )
        .await;
    assert_eq!(placed.status, StatusCode::OK, "{}", placed.body);
    assert_eq!(placed.body["moved"], true);
    let at_48 = app.get(&cursor).await;
    assert_eq!(at_48.body["new_count"], 2, "{}", at_48.body);
    assert_eq!(at_48.body["bookmark"]["uuid"], "m-47");
    assert_eq!(at_48.body["bookmark"]["seq"], 47);
    assert!(at_48.body["bookmark"]["advanced_at"].is_string());

    // A failed run reads the batch and does not advance: the same messages come back.
    let first_try = app.get(&format!("{cursor}/pending")).await;
    assert_eq!(first_try.status, StatusCode::OK, "{}", first_try.body);
    assert_eq!(uuids(&first_try.body), ["m-48", "m-49"]);
    assert_eq!(first_try.body["advance_to"], "m-49");
    assert_eq!(first_try.body["cursor"]["new_count"], 2);
    assert_eq!(first_try.body["has_more"], false);
    let retry = app.get(&format!("{cursor}/pending")).await;
    assert_eq!(uuids(&retry.body), ["m-48", "m-49"]);
    assert_eq!(app.get(&cursor).await.body["new_count"], 2);

    // A successful run advances to the batch's last entry: nothing is new any more.
    let done = app
        .post(
            &format!("{cursor}/advance"),
            json!({"to": first_try.body["advance_to"], "expected": "m-47"}),
        )
        .await;
    assert_eq!(done.status, StatusCode::OK, "{}", done.body);
    assert_eq!(done.body["cursor"]["new_count"], 0);
    assert_eq!(app.get(&cursor).await.body["new_count"], 0);
    let empty = app.get(&format!("{cursor}/pending")).await;
    assert_eq!(empty.body["entry_count"], 0);
    assert_eq!(empty.body["advance_to"], Value::Null);

    // The next turn is counted from the advanced bookmark.
    app.append(&thread, vec![user("m-50", "one more")]).await;
    assert_eq!(app.get(&cursor).await.body["new_count"], 1);
    app.finish().await;
}

async fn only_user_and_assistant_entries_are_counted_but_every_entry_is_pending(app: TestApp) {
    let thread = app.thread("kinds").await;
    app.append(
        &thread,
        vec![
            user("k0", "hi"),
            json!({"uuid": "k1", "type": "progress", "data": {"step": 1}}),
            assistant("k2", "msg_k2", "hello"),
            json!({"uuid": "k3", "type": "system", "subtype": "informational", "content": "note"}),
            json!({"uuid": "k4", "type": "attachment",
                "message": {"role": "user", "content": "file contents"}}),
            json!({"uuid": "k5", "type": "user", "is_meta": true,
                "message": {"role": "user", "content": "reminder"}}),
        ],
    )
    .await;
    let cursor = format!("/v1/threads/{thread}/cursors/index");
    let state = app.get(&cursor).await;
    // k0, k2 and the meta user k5: raw records count, as in the reference.
    assert_eq!(state.body["new_count"], 3, "{}", state.body);
    assert_eq!(state.body["pending_entries"], 6);

    // A batch bounded by `limit` holds entries of every kind so the bookmark can pass them.
    let page = app.get(&format!("{cursor}/pending?limit=2")).await;
    assert_eq!(uuids(&page.body), ["k0", "k1"]);
    assert_eq!(page.body["has_more"], true);
    assert_eq!(page.body["first_seq"], 0);
    assert_eq!(page.body["last_seq"], 1);
    let moved = app
        .post(&format!("{cursor}/advance"), json!({"to": "k1"}))
        .await;
    assert_eq!(moved.body["cursor"]["new_count"], 2, "{}", moved.body);
    assert_eq!(moved.body["cursor"]["pending_entries"], 4);
    let rest = app.get(&format!("{cursor}/pending")).await;
    assert_eq!(uuids(&rest.body), ["k2", "k3", "k4", "k5"]);
    app.finish().await;
}

async fn compaction_and_snips_keep_the_bookmark_and_the_summary_is_counted(app: TestApp) {
    let thread = app.thread("compacted").await;
    app.append(&thread, conversation(6)).await;
    let cursor = format!("/v1/threads/{thread}/cursors/memory");
    let placed = app
        .post(&format!("{cursor}/advance"), json!({"to": "m-3"}))
        .await;
    assert_eq!(placed.status, StatusCode::OK, "{}", placed.body);
    app.append(
        &thread,
        vec![
            json!({"uuid": "cb", "type": "system", "subtype": "compact_boundary",
                "content": "Conversation compacted", "compact_metadata": {"trigger": "auto"}}),
            json!({"uuid": "cs", "type": "user", "is_compact_summary": true,
                "message": {"role": "user", "content": "Summary of m-0 … m-5."}}),
        ],
    )
    .await;
    let snip = app
        .post(
            &format!("/v1/threads/{thread}/snip"),
            json!({"uuids": ["m-4"], "uuid": "sn"}),
        )
        .await;
    assert_eq!(snip.status, StatusCode::CREATED, "{}", snip.body);
    app.append(&thread, vec![user("m-6", "after the compaction")])
        .await;

    // The bookmark (before the boundary) still stands. After it: m-4, m-5 (stored, unread), the
    // summary and m-6 are counted; the boundary and the snip are system entries and are not.
    let state = app.get(&cursor).await;
    assert_eq!(state.body["bookmark"]["uuid"], "m-3");
    assert_eq!(state.body["new_count"], 4, "{}", state.body);
    let pending = app.get(&format!("{cursor}/pending")).await;
    assert_eq!(
        uuids(&pending.body),
        ["m-4", "m-5", "cb", "cs", "sn", "m-6"]
    );

    // A bookmark after the boundary counts only what follows it.
    let moved = app
        .post(&format!("{cursor}/advance"), json!({"to": "cs"}))
        .await;
    assert_eq!(moved.body["cursor"]["new_count"], 1, "{}", moved.body);
    app.finish().await;
}

async fn a_normalized_batch_is_ready_for_the_provider(app: TestApp) {
    let thread = app.thread("normalized").await;
    app.append(&thread, conversation(4)).await;
    app.append(
        &thread,
        vec![
            json!({"uuid": "cb", "type": "system", "subtype": "compact_boundary",
                "content": "Conversation compacted", "compact_metadata": {"trigger": "auto"}}),
            json!({"uuid": "cs", "type": "user", "is_compact_summary": true,
                "message": {"role": "user", "content": "Summary."}}),
            assistant("a", "msg_a", "ok"),
        ],
    )
    .await;
    let cursor = format!("/v1/threads/{thread}/cursors/memory");
    app.post(&format!("{cursor}/advance"), json!({"to": "m-1"}))
        .await;
    let batch = app
        .get(&format!(
            "{cursor}/pending?format=normalized&provider=openai"
        ))
        .await;
    assert_eq!(batch.status, StatusCode::OK, "{}", batch.body);
    assert_eq!(batch.body["format"], "normalized");
    assert!(batch.body.get("messages").is_none());
    assert_eq!(batch.body["advance_to"], "a");
    // The boundary inside the batch does not cut it: m-2 and m-3 are new to the consumer too.
    let messages = batch.body["normalized"]["messages"].as_array().unwrap();
    let text: Vec<String> = messages.iter().map(|m| m["content"].to_string()).collect();
    assert!(text[0].contains("question 2"), "{text:?}");
    assert!(text.iter().any(|t| t.contains("Summary.")), "{text:?}");
    assert_eq!(messages.last().unwrap()["role"], "assistant");

    let raw = app.get(&format!("{cursor}/pending?format=raw")).await;
    assert_eq!(uuids(&raw.body), ["m-2", "m-3", "cb", "cs", "a"]);
    app.finish().await;
}

async fn advancing_to_the_current_position_is_idempotent(app: TestApp) {
    let thread = app.thread("idem").await;
    app.append(&thread, conversation(4)).await;
    let advance = format!("/v1/threads/{thread}/cursors/memory/advance");
    let first = app.post(&advance, json!({"to": "m-1"})).await;
    assert_eq!(first.body["moved"], true, "{}", first.body);
    let again = app.post(&advance, json!({"to": "m-1"})).await;
    assert_eq!(again.status, StatusCode::OK, "{}", again.body);
    assert_eq!(again.body["moved"], false);
    assert_eq!(again.body["cursor"]["bookmark"]["uuid"], "m-1");
    let with_expected = app
        .post(&advance, json!({"to": "m-1", "expected": "m-1"}))
        .await;
    assert_eq!(with_expected.status, StatusCode::OK);
    assert_eq!(with_expected.body["moved"], false);
    app.finish().await;
}

async fn every_error_case_has_its_status_and_type(app: TestApp) {
    let thread = app.thread("errors").await;
    app.append(&thread, conversation(6)).await;
    let base = format!("/v1/threads/{thread}/cursors");

    // Unknown thread: 404 on every route.
    for uri in [
        "/v1/threads/nope/cursors",
        "/v1/threads/nope/cursors/memory",
        "/v1/threads/nope/cursors/memory/pending",
    ] {
        app.get(uri)
            .await
            .assert_problem(StatusCode::NOT_FOUND, "not-found");
    }
    app.post("/v1/threads/nope/cursors/memory/claim", json!({}))
        .await
        .assert_problem(StatusCode::NOT_FOUND, "not-found");
    app.post(
        "/v1/threads/nope/cursors/memory/advance",
        json!({"to": "m-1"}),
    )
    .await
    .assert_problem(StatusCode::NOT_FOUND, "not-found");

    // Bad names: 400.
    let long = "x".repeat(65);
    for name in ["bad%20name", "%C3%BC", long.as_str()] {
        app.get(&format!("{base}/{name}"))
            .await
            .assert_problem(StatusCode::BAD_REQUEST, "bad-request");
        app.post(&format!("{base}/{name}/advance"), json!({"to": "m-1"}))
            .await
            .assert_problem(StatusCode::BAD_REQUEST, "bad-request");
    }

    // Bad limits and options.
    app.get(&format!("{base}/memory/pending?limit=0"))
        .await
        .assert_problem(StatusCode::BAD_REQUEST, "bad-request");
    app.get(&format!("{base}/memory/pending?format=xml"))
        .await
        .assert_problem(StatusCode::BAD_REQUEST, "bad-request");
    app.get(&format!(
        "{base}/memory/pending?format=normalized&tools=no%20spaces"
    ))
    .await
    .assert_problem(StatusCode::BAD_REQUEST, "bad-request");
    app.post(&format!("{base}/memory/claim"), json!({"limit": 0}))
        .await
        .assert_problem(StatusCode::UNPROCESSABLE_ENTITY, "validation");
    app.post(
        &format!("{base}/memory/claim"),
        json!({"lease_seconds": 86_400}),
    )
    .await
    .assert_problem(StatusCode::UNPROCESSABLE_ENTITY, "validation");
    app.post(&format!("{base}/memory/claim"), json!({"lease_seconds": 0}))
        .await
        .assert_problem(StatusCode::UNPROCESSABLE_ENTITY, "validation");
    app.post(&format!("{base}/memory/advance"), json!({"from": "m-1"}))
        .await
        .assert_problem(StatusCode::UNPROCESSABLE_ENTITY, "validation");

    // Unknown uuid: 409 `no-such-message` naming `to`.
    let unknown = app
        .post(&format!("{base}/memory/advance"), json!({"to": "ghost"}))
        .await;
    let body = unknown.assert_problem(StatusCode::CONFLICT, "no-such-message");
    assert_eq!(body["errors"][0]["field"], "to");

    // Backward: 422 `cursor-backward`, nothing changes.
    app.post(&format!("{base}/memory/advance"), json!({"to": "m-3"}))
        .await;
    let backward = app
        .post(&format!("{base}/memory/advance"), json!({"to": "m-1"}))
        .await;
    let body = backward.assert_problem(StatusCode::UNPROCESSABLE_ENTITY, "cursor-backward");
    assert_eq!(body["current_seq"], 3);
    assert_eq!(body["target_seq"], 1);

    // Compare-and-set conflict: 409 `cursor-conflict`, naming where the bookmark is.
    let stale = app
        .post(
            &format!("{base}/memory/advance"),
            json!({"to": "m-5", "expected": "m-1"}),
        )
        .await;
    let body = stale.assert_problem(StatusCode::CONFLICT, "cursor-conflict");
    assert_eq!(body["current"], json!({"seq": 3, "uuid": "m-3"}));
    let expected_none = app
        .post(
            &format!("{base}/memory/advance"),
            json!({"to": "m-5", "expected": null}),
        )
        .await;
    expected_none.assert_problem(StatusCode::CONFLICT, "cursor-conflict");
    assert_eq!(
        app.get(&format!("{base}/memory")).await.body["bookmark"]["uuid"],
        "m-3"
    );

    // Lease conflicts: a second claim, and an advance without or with a wrong token.
    let claim = app
        .post(&format!("{base}/memory/claim"), json!({"limit": 1}))
        .await;
    assert_eq!(claim.status, StatusCode::OK, "{}", claim.body);
    let token = claim.body["lease"]["token"].as_str().unwrap().to_owned();
    let second = app.post(&format!("{base}/memory/claim"), json!({})).await;
    let body = second.assert_problem(StatusCode::CONFLICT, "cursor-leased");
    assert_eq!(body["lease_expires_at"], claim.body["lease"]["expires_at"]);
    app.post(&format!("{base}/memory/advance"), json!({"to": "m-4"}))
        .await
        .assert_problem(StatusCode::CONFLICT, "cursor-leased");
    app.post(
        &format!("{base}/memory/advance"),
        json!({"to": "m-4", "lease": "not-the-token"}),
    )
    .await
    .assert_problem(StatusCode::CONFLICT, "cursor-leased");
    let held = app.get(&format!("{base}/memory")).await;
    assert_eq!(
        held.body["lease_expires_at"],
        claim.body["lease"]["expires_at"]
    );
    let released = app
        .post(
            &format!("{base}/memory/advance"),
            json!({"to": "m-4", "lease": token}),
        )
        .await;
    assert_eq!(released.status, StatusCode::OK, "{}", released.body);
    assert_eq!(released.body["cursor"]["lease_expires_at"], Value::Null);
    // The holder's retry is idempotent; a plain consumer may advance again.
    let retried = app
        .post(
            &format!("{base}/memory/advance"),
            json!({"to": "m-4", "lease": token}),
        )
        .await;
    assert_eq!(retried.status, StatusCode::OK, "{}", retried.body);
    assert_eq!(retried.body["moved"], false);
    app.finish().await;
}

async fn cursors_are_listed_and_deleted_with_their_thread(app: TestApp) {
    let thread = app.thread("listed").await;
    app.append(&thread, conversation(4)).await;
    let base = format!("/v1/threads/{thread}/cursors");
    assert_eq!(app.get(&base).await.body["cursors"], json!([]));
    app.post(&format!("{base}/memory/advance"), json!({"to": "m-1"}))
        .await;
    app.post(&format!("{base}/analytics/claim"), json!({"limit": 2}))
        .await;
    let listed = app.get(&base).await;
    assert_eq!(listed.status, StatusCode::OK, "{}", listed.body);
    let cursors = listed.body["cursors"].as_array().unwrap();
    let names: Vec<&str> = cursors
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["analytics", "memory"]);
    assert_eq!(cursors[0]["new_count"], 4);
    assert!(cursors[0]["lease_expires_at"].is_string());
    assert_eq!(cursors[1]["new_count"], 2);

    let deleted = app.delete(&format!("/v1/threads/{thread}")).await;
    assert_eq!(deleted.status, StatusCode::NO_CONTENT);
    app.get(&base)
        .await
        .assert_problem(StatusCode::NOT_FOUND, "not-found");
    app.thread(&thread).await;
    assert_eq!(app.get(&base).await.body["cursors"], json!([]));
    app.finish().await;
}

async fn an_expired_lease_lets_another_worker_claim_the_same_batch(app: TestApp) {
    let thread = app.thread("expiry").await;
    app.append(&thread, conversation(10)).await;
    let thread_id = ThreadId::new(thread.as_str());
    let store = &app.store;
    let tenant = TenantId::default_tenant();
    let t0 = 1_700_000_000_000;

    let first = store
        .claim_cursor(&tenant, &thread_id, "w", 4, 60_000, t0)
        .await
        .unwrap();
    let first_lease = first.lease.clone().unwrap();
    assert_eq!(first_lease.expires_at, t0 + 60_000);
    assert_eq!(first.batch.advance_to(), Some("m-3"));
    assert!(matches!(
        store.claim_cursor(&tenant, &thread_id, "w", 4, 60_000, t0 + 59_999).await,
        Err(StoreError::CursorLeased { expires_at }) if expires_at == t0 + 60_000
    ));
    let state = store
        .cursor(&tenant, &thread_id, "w", t0 + 1)
        .await
        .unwrap();
    assert_eq!(state.lease_expires_at, Some(t0 + 60_000));

    // The first worker fails silently; once its lease expires the same batch is claimed again.
    let second = store
        .claim_cursor(&tenant, &thread_id, "w", 4, 60_000, t0 + 60_000)
        .await
        .unwrap();
    let second_lease = second.lease.clone().unwrap();
    assert_ne!(second_lease.token, first_lease.token);
    let seqs = |batch: &loupe::store::PendingBatch| -> Vec<i64> {
        batch.entries.iter().map(|e| e.seq.unwrap()).collect()
    };
    assert_eq!(seqs(&second.batch), seqs(&first.batch));
    let state = store
        .cursor(&tenant, &thread_id, "w", t0 + 60_001)
        .await
        .unwrap();
    assert_eq!(state.new_count, 10);

    // The late first worker's acknowledgement is refused; the new holder's counts.
    let advance = |lease: &str| AdvanceRequest {
        to: "m-3".to_owned(),
        expected: None,
        lease: Some(lease.to_owned()),
    };
    assert!(matches!(
        store
            .advance_cursor(
                &tenant,
                &thread_id,
                "w",
                advance(&first_lease.token),
                t0 + 61_000
            )
            .await,
        Err(StoreError::CursorLeased { .. })
    ));
    let done = store
        .advance_cursor(
            &tenant,
            &thread_id,
            "w",
            advance(&second_lease.token),
            t0 + 61_000,
        )
        .await
        .unwrap();
    assert!(done.moved);
    assert_eq!(done.cursor.new_count, 6);
    assert_eq!(done.cursor.lease_expires_at, None);
    // Even after the release, the lost lease cannot acknowledge anything.
    assert!(matches!(
        store
            .advance_cursor(
                &tenant,
                &thread_id,
                "w",
                advance(&first_lease.token),
                t0 + 62_000
            )
            .await,
        Err(StoreError::CursorConflict { .. })
    ));

    // An expired lease nobody claimed again still lets its late holder acknowledge.
    let third = store
        .claim_cursor(&tenant, &thread_id, "w", 100, 1_000, t0 + 70_000)
        .await
        .unwrap();
    let late = AdvanceRequest {
        to: third.batch.advance_to().unwrap().to_owned(),
        expected: None,
        lease: Some(third.lease.unwrap().token),
    };
    let late = store
        .advance_cursor(&tenant, &thread_id, "w", late, t0 + 90_000)
        .await
        .unwrap();
    assert_eq!(late.cursor.new_count, 0);

    // Nothing pending: an empty batch and no lease, so nobody waits on it.
    let idle = store
        .claim_cursor(&tenant, &thread_id, "w", 4, 60_000, t0 + 90_000)
        .await
        .unwrap();
    assert!(idle.lease.is_none());
    assert!(idle.batch.entries.is_empty());
    assert!(store
        .claim_cursor(&tenant, &thread_id, "w", 4, 60_000, t0 + 90_000)
        .await
        .is_ok());
    app.finish().await;
}

const RACE_MESSAGES: usize = 60;
const RACE_WORKERS: usize = 4;

/// Asserts that the acknowledged seqs are exactly `0..total`, each once.
fn assert_each_acknowledged_once(acknowledged: &[i64], total: usize) {
    let mut times: BTreeMap<i64, usize> = BTreeMap::new();
    for seq in acknowledged {
        *times.entry(*seq).or_default() += 1;
    }
    let twice: Vec<_> = times.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "acknowledged more than once: {twice:?}");
    let all: Vec<i64> = (0..total as i64).collect();
    assert_eq!(times.keys().copied().collect::<Vec<_>>(), all, "lost seqs");
}

/// A batch's seqs, from a `pending` or `claim` body.
fn batch_seqs(body: &Value) -> Vec<i64> {
    let (first, last) = (
        body["first_seq"].as_i64().unwrap(),
        body["last_seq"].as_i64().unwrap(),
    );
    (first..=last).collect()
}

async fn competing_cas_consumers_acknowledge_every_message_exactly_once(app: TestApp) {
    let thread = app.thread("cas-race").await;
    app.append(&thread, conversation(RACE_MESSAGES)).await;
    let app = Arc::new(app);
    let base = format!("/v1/threads/{thread}/cursors/memory");
    let mut workers = Vec::new();
    for worker in 0..RACE_WORKERS {
        let (app, base) = (app.clone(), base.clone());
        workers.push(tokio::spawn(async move {
            let (mut acknowledged, mut conflicts, mut round) = (Vec::new(), 0, 0);
            loop {
                round += 1;
                let batch = app.get(&format!("{base}/pending?limit=7")).await;
                assert_eq!(batch.status, StatusCode::OK, "{}", batch.body);
                if batch.body["entry_count"] == 0 {
                    break;
                }
                // Every third run of a worker fails: it does not advance.
                if (round + worker) % 3 == 0 {
                    continue;
                }
                let expected = batch.body["cursor"]["bookmark"]["uuid"].clone();
                let advanced = app
                    .post(
                        &format!("{base}/advance"),
                        json!({"to": batch.body["advance_to"], "expected": expected}),
                    )
                    .await;
                match advanced.status {
                    StatusCode::OK => {
                        assert_eq!(advanced.body["moved"], true);
                        acknowledged.extend(batch_seqs(&batch.body));
                    }
                    StatusCode::CONFLICT => {
                        advanced.assert_problem(StatusCode::CONFLICT, "cursor-conflict");
                        conflicts += 1;
                    }
                    other => panic!("unexpected {other}: {}", advanced.body),
                }
            }
            (acknowledged, conflicts)
        }));
    }
    let mut acknowledged = Vec::new();
    for worker in workers {
        let (seqs, conflicts) = worker.await.unwrap();
        eprintln!(
            "cas worker: {} acknowledged, {conflicts} conflicts",
            seqs.len()
        );
        acknowledged.extend(seqs);
    }
    assert_each_acknowledged_once(&acknowledged, RACE_MESSAGES);
    let app = Arc::into_inner(app).unwrap();
    assert_eq!(app.get(&base).await.body["new_count"], 0);
    app.finish().await;
}

async fn competing_lease_workers_acknowledge_every_message_exactly_once(app: TestApp) {
    let thread = app.thread("lease-race").await;
    app.append(&thread, conversation(RACE_MESSAGES)).await;
    let app = Arc::new(app);
    let base = format!("/v1/threads/{thread}/cursors/indexer");
    let mut workers = Vec::new();
    for _ in 0..RACE_WORKERS {
        let (app, base) = (app.clone(), base.clone());
        workers.push(tokio::spawn(async move {
            let mut acknowledged = Vec::new();
            loop {
                let claim = app
                    .post(
                        &format!("{base}/claim"),
                        json!({"limit": 5, "lease_seconds": 600}),
                    )
                    .await;
                if claim.status == StatusCode::CONFLICT {
                    claim.assert_problem(StatusCode::CONFLICT, "cursor-leased");
                    tokio::task::yield_now().await;
                    continue;
                }
                assert_eq!(claim.status, StatusCode::OK, "{}", claim.body);
                if claim.body["lease"].is_null() {
                    assert_eq!(claim.body["entry_count"], 0);
                    break;
                }
                let advanced = app
                    .post(
                        &format!("{base}/advance"),
                        json!({"to": claim.body["advance_to"], "lease": claim.body["lease"]["token"]}),
                    )
                    .await;
                // The holder of a live lease always succeeds.
                assert_eq!(advanced.status, StatusCode::OK, "{}", advanced.body);
                assert_eq!(advanced.body["moved"], true);
                acknowledged.extend(batch_seqs(&claim.body));
            }
            acknowledged
        }));
    }
    let mut acknowledged = Vec::new();
    for worker in workers {
        acknowledged.extend(worker.await.unwrap());
    }
    assert_each_acknowledged_once(&acknowledged, RACE_MESSAGES);
    let app = Arc::into_inner(app).unwrap();
    assert_eq!(app.get(&base).await.body["new_count"], 0);
    app.finish().await;
}

/// A small deterministic generator, so a failing interleaving of choices can be replayed.
fn xorshift(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}

async fn crashing_and_slow_lease_workers_lose_nothing_and_acknowledge_nothing_twice(app: TestApp) {
    let thread = app.thread("lease-chaos").await;
    app.append(&thread, conversation(RACE_MESSAGES)).await;
    // A shared simulated clock: waiting workers move it on instead of sleeping.
    let clock = Arc::new(AtomicI64::new(1_700_000_000_000));
    let lease_ms = 1_000;
    let app = Arc::new(app);
    let mut workers = Vec::new();
    for worker in 0..RACE_WORKERS as u64 {
        let (app, clock, thread) = (app.clone(), clock.clone(), thread.clone());
        workers.push(tokio::spawn(async move {
            let tenant = TenantId::default_tenant();
            let thread_id = ThreadId::new(thread.as_str());
            let mut rng = 0x9E37_79B9_7F4A_7C15 ^ (worker + 1);
            let (mut acknowledged, mut lost, mut crashed) = (Vec::new(), 0, 0);
            loop {
                let now = clock.load(Ordering::SeqCst);
                let claim = match app
                    .store
                    .claim_cursor(&tenant, &thread_id, "chaos", 4, lease_ms, now)
                    .await
                {
                    Ok(claim) => claim,
                    Err(StoreError::CursorLeased { .. }) => {
                        clock.fetch_add(100, Ordering::SeqCst);
                        tokio::task::yield_now().await;
                        continue;
                    }
                    Err(other) => panic!("claim: {other}"),
                };
                let Some(lease) = claim.lease else {
                    assert!(claim.batch.entries.is_empty());
                    break;
                };
                match xorshift(&mut rng) % 4 {
                    // Crash: the lease is abandoned and must expire.
                    0 => {
                        crashed += 1;
                        continue;
                    }
                    // Slow: the lease expires while the batch is processed.
                    1 => {
                        clock.fetch_add(lease_ms + 500, Ordering::SeqCst);
                        tokio::task::yield_now().await;
                    }
                    _ => {}
                }
                let request = AdvanceRequest {
                    to: claim.batch.advance_to().unwrap().to_owned(),
                    expected: None,
                    lease: Some(lease.token),
                };
                let now = clock.load(Ordering::SeqCst);
                match app
                    .store
                    .advance_cursor(&tenant, &thread_id, "chaos", request, now)
                    .await
                {
                    Ok(outcome) => {
                        assert!(outcome.moved);
                        acknowledged.extend(claim.batch.entries.iter().map(|e| e.seq.unwrap()));
                    }
                    Err(StoreError::CursorConflict { .. } | StoreError::CursorLeased { .. }) => {
                        lost += 1;
                    }
                    Err(other) => panic!("advance: {other}"),
                }
            }
            (acknowledged, lost, crashed)
        }));
    }
    let (mut acknowledged, mut crashed) = (Vec::new(), 0);
    for worker in workers {
        let (seqs, lost, crashes) = worker.await.unwrap();
        eprintln!(
            "lease worker: {} acknowledged, {lost} lost leases, {crashes} crashes",
            seqs.len()
        );
        acknowledged.extend(seqs);
        crashed += crashes;
    }
    assert!(crashed > 0, "the run exercised no crash");
    assert_each_acknowledged_once(&acknowledged, RACE_MESSAGES);
    let app = Arc::into_inner(app).unwrap();
    let state = app
        .store
        .cursor(
            &TenantId::default_tenant(),
            &ThreadId::new(thread.as_str()),
            "chaos",
            clock.load(Ordering::SeqCst),
        )
        .await
        .unwrap();
    assert_eq!(state.new_count, 0);
    app.finish().await;
}
