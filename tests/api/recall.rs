//! The recall harness (issue 35): facts planted in the project's real Claude Code transcript and
//! in generated tool-heavy sessions, the threads outlined or compacted by the extractive
//! summarizer, then a scripted agent that sees only what Loupe sends and uses only its two
//! tools: it searches one keyword of the question, zooms the top hits, and must reach the entry
//! holding the fact within 3 tool calls. Goal: at least 95% of planted facts, on both backends.
//! It also measures the ledger on the same threads: the kept rate of each anchor kind under the
//! extractive summarizer, and the ledger's size beside the thread's (goal: at most 5%).

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::http::StatusCode;
use loupe::store::{TenantId, ThreadId};
use loupe::summarize::ExtractiveSummarizer;
use serde_json::{json, Value};

use crate::common::{assistant, user, TestApp};
use crate::tree::{drain, outline_on, runner};

on_both_backends!(a_scripted_agent_reaches_planted_facts_with_search_and_zoom);

const SESSION: &str = include_str!("../fixtures/claude-code/session.jsonl");

/// A fact: what the agent is asked about (one keyword of the question), and the text that
/// answers it.
struct Fact {
    keyword: String,
    text: String,
}

/// The `k`th fact (k from 10 to 99, so no keyword is a substring of another), of one of four
/// kinds: a path, a command, a number, a decision.
fn fact(k: usize) -> Fact {
    let (keyword, text) = match k % 4 {
        0 => (
            format!("vault_{k}"),
            format!("The signing key for vault_{k} lives at /srv/keys/vault_{k}/signing.pem."),
        ),
        1 => (
            format!("ring{k}x"),
            format!("To roll back, run `deployctl rollback --ring ring{k}x --keep-logs`."),
        ),
        2 => (
            format!("canary-{k}"),
            format!("On canary-{k} the p99 latency was 4{k}7 ms under 1{k}0 req/s."),
        ),
        _ => (
            format!("Heron{k}"),
            format!("We decided to call the release Heron{k} and to ship it on a Thursday."),
        ),
    };
    Fact { keyword, text }
}

/// The real transcript, copy `copy`: every id made unique to the copy, so copies are new
/// entries and new tool calls. `client_compactions: false` leaves out the client's own compact
/// boundaries and summaries, for a thread that Loupe compacts instead.
fn session_copy(copy: usize, client_compactions: bool) -> Vec<Value> {
    fn suffix(value: &mut Value, copy: usize) {
        match value {
            Value::Object(map) => {
                for (key, v) in map.iter_mut() {
                    let is_id = matches!(
                        key.as_str(),
                        "uuid"
                            | "parentUuid"
                            | "logicalParentUuid"
                            | "id"
                            | "tool_use_id"
                            | "leafUuid"
                    );
                    match v {
                        Value::String(s) if is_id => *s = format!("{s}-{copy}"),
                        other => suffix(other, copy),
                    }
                }
            }
            Value::Array(items) => items.iter_mut().for_each(|item| suffix(item, copy)),
            _ => {}
        }
    }
    SESSION
        .lines()
        .map(|line| {
            let mut entry: Value = serde_json::from_str(line).unwrap();
            suffix(&mut entry, copy);
            entry
        })
        .filter(|entry| {
            client_compactions
                || !(entry["subtype"] == "compact_boundary" || entry["isCompactSummary"] == true)
        })
        .collect()
}

/// A planted exchange: the user tells the fact, the assistant acknowledges it.
fn planted(k: usize) -> Vec<Value> {
    vec![
        user(&format!("fact-{k}"), &fact(k).text),
        assistant(&format!("fact-{k}-a"), &format!("msg_fact_{k}"), "Noted."),
    ]
}

/// Round `i` of a generated tool-heavy session: a read of a file and its result (a code
/// listing of a few hundred bytes to a few KB), with fact `k` in the result when planted.
fn tool_round(i: usize, fact_k: Option<usize>) -> Vec<Value> {
    let lines = 8 + (i * 7) % 60;
    let mut result: Vec<String> = (0..lines)
        .map(|l| {
            format!("    let value_{l} = compute(input_{l}, {l}); // src/gen/module_{i}.rs:{l}")
        })
        .collect();
    if let Some(k) = fact_k {
        result.insert(lines / 2, format!("// NOTE: {}", fact(k).text));
    }
    vec![
        user(
            &format!("q{i}"),
            &format!("Step {i}: read the next module and check it."),
        ),
        json!({"uuid": format!("t{i}"), "type": "assistant", "message": {"role": "assistant",
            "id": format!("msg_t{i}"), "content": [{"type": "tool_use", "id": format!("toolu_g{i}"),
            "name": "Read", "input": {"file_path": format!("src/gen/module_{i}.rs")}}]}}),
        json!({"uuid": format!("r{i}"), "type": "user", "message": {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": format!("toolu_g{i}"), "content": result.join("\n")}]}}),
        assistant(
            &format!("a{i}"),
            &format!("msg_a{i}"),
            &format!("Module {i} reads fine."),
        ),
    ]
}

/// Builds one thread and returns the facts planted in it.
async fn build(
    app: &TestApp,
    thread: &str,
    real: bool,
    compact: bool,
    facts: std::ops::Range<usize>,
) -> Vec<usize> {
    let mut planted_facts = Vec::new();
    let mut ks = facts;
    if real {
        // Three copies of the real session, facts between stretches of it.
        for copy in 0..3 {
            let entries = session_copy(copy, !compact);
            for chunk in entries.chunks(23) {
                app.append(thread, chunk.to_vec()).await;
                if let Some(k) = ks.next() {
                    app.append(thread, planted(k)).await;
                    planted_facts.push(k);
                }
            }
        }
    } else {
        for i in 0..120 {
            let k = if i % 10 == 3 { ks.next() } else { None };
            app.append(thread, tool_round(i, k)).await;
            planted_facts.extend(k);
        }
    }
    planted_facts
}

/// The scripted agent: `search(keyword)`, then `zoom(id, 1)` on the top hits, until an entry
/// holds the fact or 3 calls are spent. Returns the calls it took, or `None`.
async fn recall(app: &TestApp, thread: &str, fact: &Fact) -> Option<usize> {
    let found = app
        .post(
            &format!("/v1/threads/{thread}/search"),
            json!({"query": fact.keyword}),
        )
        .await;
    assert_eq!(found.status, StatusCode::OK, "{}", found.body);
    let mut calls = 1;
    // The answer's lines read `id+n|snippet`: the model's next call is zoom(id, n).
    let content = found.body["content"].as_str().unwrap().to_owned();
    for line in content.lines() {
        if calls == 3 {
            break;
        }
        let Some((address, _)) = line.split_once('|') else {
            continue;
        };
        let Some((id, n)) = address.split_once('+') else {
            continue;
        };
        let (Ok(id), Ok(n)) = (id.parse::<i64>(), n.parse::<i64>()) else {
            continue;
        };
        let opened = app
            .post(
                &format!("/v1/threads/{thread}/zoom"),
                json!({"id": id, "n": n}),
            )
            .await;
        calls += 1;
        assert_eq!(opened.status, StatusCode::OK, "{}", opened.body);
        let text = opened.body["content"].as_str().unwrap_or_default();
        if n == 1 && text.contains(&fact.text) {
            return Some(calls);
        }
    }
    None
}

async fn a_scripted_agent_reaches_planted_facts_with_search_and_zoom(app: TestApp) {
    let runner = runner(&app, Arc::new(ExtractiveSummarizer::new()));
    let mut reached = 0;
    let mut planted_total = 0;
    let mut kept: BTreeMap<(bool, String), (u64, u64)> = BTreeMap::new();
    let mut sizes = Vec::new();
    let plans = [
        ("real-outlined", true, false, 10..30),
        ("real-compacted", true, true, 30..50),
        ("tools-outlined", false, false, 50..70),
        ("tools-compacted", false, true, 70..90),
    ];
    for (name, real, compact, facts) in plans {
        let thread = app.thread(name).await;
        if !compact {
            outline_on(
                &app,
                &thread,
                json!({"enabled": true, "line_bytes": 120, "budget_bytes": 2400, "tail_tokens": 2000}),
            )
            .await;
        }
        let planted_facts = build(&app, &thread, real, compact, facts).await;
        if compact {
            crate::tree::compact(&app, &thread, 2).await;
        }
        drain(&runner).await;
        // The agent sees what Loupe sends: the summary in place of the facts, and the tools.
        let view = if compact { "" } else { "?view=outline" };
        let context = app
            .get(&format!("/v1/threads/{thread}/context{view}"))
            .await;
        assert_eq!(context.status, StatusCode::OK, "{}", context.body);
        if !compact {
            let tools: Vec<&str> = context.body["tools"]
                .as_array()
                .unwrap()
                .iter()
                .filter_map(|t| t["name"].as_str())
                .collect();
            assert_eq!(tools, ["zoom", "search"], "{}", context.body["tools"]);
        }
        for k in &planted_facts {
            planted_total += 1;
            match recall(&app, &thread, &fact(*k)).await {
                Some(calls) => {
                    assert!(calls <= 3);
                    reached += 1;
                }
                None => eprintln!("{name}: fact {k} ({}) not reached", fact(*k).keyword),
            }
        }
        let ledger = app
            .get(&format!("/v1/threads/{thread}/ledger?limit=200"))
            .await;
        assert_eq!(ledger.status, StatusCode::OK, "{}", ledger.body);
        assert_eq!(ledger.body["index"]["pending"], 0);
        let summaries = ledger.body["summaries"].as_array().unwrap();
        assert!(!summaries.is_empty(), "{name}: {}", ledger.body);
        for summary in summaries {
            for (kind, counts) in summary["counts"].as_object().unwrap() {
                let entry = kept.entry((real, kind.clone())).or_default();
                entry.0 += counts["kept"].as_u64().unwrap();
                entry.1 += counts["dropped"].as_u64().unwrap();
            }
        }
        let (anchor_bytes, thread_bytes) = app
            .store
            .ledger_size(&TenantId::default_tenant(), &ThreadId::new(thread.as_str()))
            .await
            .unwrap();
        sizes.push((name, anchor_bytes, thread_bytes));
    }
    let rate = reached as f64 / planted_total as f64;
    eprintln!(
        "recall: {reached}/{planted_total} planted facts reached ({:.1}%)",
        100.0 * rate
    );
    for ((real, kind), (k, d)) in &kept {
        let source = if *real {
            "real transcript"
        } else {
            "generated tool-heavy"
        };
        eprintln!(
            "ledger kept rate, {source}, {kind}: {k}/{} ({:.1}%)",
            k + d,
            100.0 * *k as f64 / (k + d).max(1) as f64
        );
    }
    for (name, anchors, stored) in &sizes {
        eprintln!(
            "ledger size, {name}: {anchors} B of anchors for {stored} B stored ({:.2}%)",
            100.0 * *anchors as f64 / *stored as f64
        );
        assert!(
            *anchors as f64 <= 0.05 * *stored as f64,
            "{name}: the ledger takes {anchors} B beside {stored} B"
        );
    }
    assert!(planted_total >= 40, "{planted_total} facts planted");
    assert!(rate >= 0.95, "recall {reached}/{planted_total}");
    app.finish().await;
}
