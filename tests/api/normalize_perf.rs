//! Performance smoke check (run with `cargo test --release --test api normalize_perf -- --ignored --nocapture`):
//! normalizing a 10,000-entry (~5 MB) history must cost less than 2× a plain serde_json
//! parse + serialize of the same bytes.

use std::time::Instant;

use loupe::history::{normalize, Entry, NormalizeOptions, Provider};
use serde_json::json;

fn history(n: usize) -> String {
    let filler = "lorem ipsum dolor sit amet ".repeat(16); // ~430 bytes
    let mut v = Vec::with_capacity(n);
    let mut i = 0;
    while v.len() < n {
        let id = format!("msg_{i}");
        let tu = format!("toolu_{i}");
        v.push(
            json!({"seq": v.len(), "uuid": format!("u{}", v.len()), "type": "user",
            "message": {"role": "user", "content": format!("prompt {i} {filler}")}}),
        );
        v.push(
            json!({"seq": v.len(), "uuid": format!("u{}", v.len()), "type": "assistant",
            "message": {"role": "assistant", "id": id, "content": [
                {"type": "thinking", "thinking": filler, "signature": "c2lnbmF0dXJl"}]}}),
        );
        v.push(
            json!({"seq": v.len(), "uuid": format!("u{}", v.len()), "type": "assistant",
            "message": {"role": "assistant", "id": id, "content": [
                {"type": "tool_use", "id": tu, "name": "Bash", "input": {"command": filler}}]}}),
        );
        v.push(
            json!({"seq": v.len(), "uuid": format!("u{}", v.len()), "type": "user",
            "message": {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": tu, "content": filler}]}}),
        );
        v.push(json!({"seq": v.len(), "uuid": format!("u{}", v.len()), "type": "assistant",
            "message": {"role": "assistant", "id": id, "content": [{"type": "text", "text": filler}]}}));
        i += 1;
    }
    v.truncate(n);
    serde_json::to_string(&v).unwrap()
}

fn best<F: FnMut()>(mut f: F) -> f64 {
    (0..5)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64()
        })
        .fold(f64::INFINITY, f64::min)
}

#[test]
#[ignore]
fn normalize_costs_less_than_twice_a_parse_and_serialize() {
    let text = history(10_000);
    println!("history: {} bytes", text.len());
    let baseline = best(|| {
        let entries: Vec<Entry> = serde_json::from_str(&text).unwrap();
        std::hint::black_box(serde_json::to_string(&entries).unwrap());
    });
    let entries: Vec<Entry> = serde_json::from_str(&text).unwrap();
    for provider in [Provider::Anthropic, Provider::Openai] {
        let opts = NormalizeOptions {
            provider,
            cache: true,
            ..Default::default()
        };
        let t = best(|| {
            std::hint::black_box(normalize(&entries, &opts));
        });
        println!(
            "{provider:?}: parse+serialize {baseline:.4}s, normalize {t:.4}s, ratio {:.2}",
            t / baseline
        );
        assert!(t < 2.0 * baseline, "normalize too slow: {t} vs {baseline}");
    }
}

/// The cost ladder of a run of consecutive user messages (the hostile case of a quadratic
/// merge): run with `cargo test --release --test api user_run_ladder -- --ignored --nocapture`.
/// Prints each size's time and its ratio to the previous size; the figures go in BENCHMARKS.md.
#[test]
#[ignore]
fn user_run_ladder() {
    let mut previous: Option<f64> = None;
    for n in [5_000, 10_000, 20_000, 40_000] {
        let entries: Vec<Entry> = (0..n)
            .map(|i| {
                serde_json::from_value(json!({"seq": i, "uuid": format!("u{i}"), "type": "user",
                    "message": {"role": "user", "content": format!("message {i} of the run")}}))
                .unwrap()
            })
            .collect();
        let opts = NormalizeOptions::default();
        let t = best(|| {
            let out = normalize(&entries, &opts);
            assert_eq!(out.messages.len(), 1);
        });
        let ratio = previous.map(|p| t / p).unwrap_or(1.0);
        println!("{n} user entries: {t:.4}s (x{ratio:.2} the previous size)");
        previous = Some(t);
    }
}
