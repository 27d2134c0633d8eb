//! Group commit: concurrent appends share transactions, and the grouped path stores exactly what
//! one append at a time would, each append answered with its own outcome.

use std::collections::BTreeSet;

use crate::common::{assistant, user, TestApp};
use futures_util::future::join_all;
use loupe::history::Entry;
use loupe::store::{AppendOutcome, AppendRequest, StoreError, TenantId};

on_both_backends!(
    concurrent_appends_share_commits_and_store_what_single_appends_would,
    a_refused_or_replayed_member_leaves_the_rest_of_its_group_whole,
);

fn entries(values: Vec<serde_json::Value>) -> Vec<Entry> {
    values
        .into_iter()
        .map(|v| serde_json::from_value(v).unwrap())
        .collect()
}

/// A turn of two entries with uuids unique to `(thread, turn)`.
fn turn(thread: usize, turn: usize) -> Vec<Entry> {
    entries(vec![
        user(&format!("t{thread}-q{turn}"), &format!("question {turn}")),
        assistant(
            &format!("t{thread}-a{turn}"),
            &format!("msg_{thread}_{turn}"),
            &format!("answer {turn}"),
        ),
    ])
}

async fn append(
    app: &TestApp,
    thread: &str,
    batch: Vec<Entry>,
    expected_next_seq: Option<i64>,
) -> Result<AppendOutcome, StoreError> {
    app.store
        .append(
            &TenantId::default_tenant(),
            thread,
            AppendRequest {
                entries: batch,
                expected_next_seq,
            },
        )
        .await
}

/// Every stored `(seq, uuid)` of a thread, in seq order.
async fn stored(app: &TestApp, thread: &str) -> Vec<(i64, String)> {
    let page = app
        .store
        .list_messages(&TenantId::default_tenant(), thread, None, 10_000)
        .await
        .unwrap();
    assert_eq!(
        page.next_seq,
        page.messages.len() as i64,
        "no seq is skipped"
    );
    page.messages
        .into_iter()
        .map(|m| (m.seq.unwrap(), m.uuid.unwrap()))
        .collect()
}

async fn concurrent_appends_share_commits_and_store_what_single_appends_would(app: TestApp) {
    const THREADS: usize = 6;
    const TURNS: usize = 30;
    let mut threads = Vec::new();
    for t in 0..THREADS {
        threads.push(app.thread(&format!("grouped-{t}")).await);
    }
    let before = app.store.group_commit_stats();
    // Every turn of every thread at once: many appends wait while a group is written.
    let outcomes = join_all((0..THREADS).flat_map(|t| {
        let (app, threads) = (&app, &threads);
        (0..TURNS)
            .map(move |n| async move { (t, append(app, &threads[t], turn(t, n), None).await) })
    }))
    .await;
    let after = app.store.group_commit_stats();
    let (groups, appends) = (after.groups - before.groups, after.appends - before.appends);
    assert_eq!(appends, (THREADS * TURNS) as u64);
    assert!(groups < appends, "{appends} appends in {groups} commits");

    for (t, outcome) in &outcomes {
        let outcome = outcome.as_ref().unwrap();
        assert!(!outcome.replayed);
        let seqs: Vec<i64> = outcome.messages.iter().map(|m| m.seq.unwrap()).collect();
        assert_eq!(seqs.len(), 2);
        assert_eq!(seqs[1], seqs[0] + 1, "a batch's entries are contiguous");
        assert_eq!(outcome.next_seq, seqs[1] + 1, "thread {t}");
    }
    // The plain path: the same turns, one append at a time, into fresh threads.
    for (t, thread) in threads.iter().enumerate() {
        let plain = app.thread(&format!("plain-{t}")).await;
        for n in 0..TURNS {
            append(&app, &plain, turn(t, n), None).await.unwrap();
        }
        let grouped = stored(&app, thread).await;
        let single = stored(&app, &plain).await;
        // Concurrent appends may land in any order; each batch stays whole and in order.
        let uuids =
            |rows: &[(i64, String)]| rows.iter().map(|r| r.1.clone()).collect::<BTreeSet<_>>();
        assert_eq!(uuids(&grouped), uuids(&single));
        for pair in grouped.chunks(2) {
            assert_eq!(pair[0].1.replace("-q", "-a"), pair[1].1, "{pair:?}");
        }
    }
}

async fn a_refused_or_replayed_member_leaves_the_rest_of_its_group_whole(app: TestApp) {
    let good = app.thread("good").await;
    let busy = app.thread("busy").await;
    append(&app, &busy, turn(9, 0), None).await.unwrap();
    let conflicting = entries(vec![user("t9-q0", "the same uuid with other content")]);

    let before = app.store.group_commit_stats();
    for round in 0..5 {
        // Each kind of refusal, a replay and good appends, all at once.
        let results = join_all([
            Box::pin(append(&app, &good, turn(0, round), None))
                as std::pin::Pin<Box<dyn std::future::Future<Output = _> + Send>>,
            Box::pin(append(&app, "no-such-thread", turn(1, round), None)),
            Box::pin(append(&app, &busy, conflicting.clone(), None)),
            Box::pin(append(&app, &busy, turn(9, 0), None)),
            Box::pin(append(&app, &busy, turn(8, round), Some(-1))),
            Box::pin(append(&app, &good, turn(2, round), None)),
        ])
        .await;
        let mut results = results.into_iter();
        assert!(results.next().unwrap().is_ok(), "round {round}");
        assert!(matches!(
            results.next().unwrap(),
            Err(StoreError::ThreadNotFound)
        ));
        assert!(matches!(
            results.next().unwrap(),
            Err(StoreError::UuidConflict { .. })
        ));
        let replay = results.next().unwrap().unwrap();
        assert!(replay.replayed);
        assert_eq!(replay.messages.len(), 2);
        assert!(matches!(
            results.next().unwrap(),
            Err(StoreError::SeqConflict { expected: -1, .. })
        ));
        assert!(results.next().unwrap().is_ok());
    }
    // On SQLite (one runner) the members shared commits, so the savepoints did the separating.
    let after = app.store.group_commit_stats();
    let (groups, appends) = (after.groups - before.groups, after.appends - before.appends);
    assert_eq!(
        appends, 30,
        "every member was answered from a committed group"
    );
    if app.backend == crate::common::Backend::Sqlite {
        assert!(groups < appends, "{appends} appends in {groups} commits");
    }
    // The refused and replayed members left nothing behind, not even in the counters.
    assert_eq!(stored(&app, &busy).await.len(), 2);
    assert_eq!(stored(&app, &good).await.len(), 20);
    let context = app.get(&format!("/v1/threads/{busy}/context")).await;
    assert_eq!(context.body["next_seq"], 2);
}
