//! Normalization cost against a plain serde_json round trip of the same 10,000-entry history.
//!
//! Run: `cargo bench --bench normalize`. The goal is parse + normalize + serialize under 2× the
//! parse + serialize baseline; the ratio of medians is printed after the run.

#[path = "support/history.rs"]
mod history;

use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use loupe::history::{normalize, Entry, NormalizeOptions, Provider};

const ENTRIES: usize = 10_000;

fn options(provider: Provider) -> NormalizeOptions {
    NormalizeOptions {
        provider,
        // What a caller asking for an Anthropic request would set.
        cache: provider == Provider::Anthropic,
        ..Default::default()
    }
}

fn bench(c: &mut Criterion) {
    let bytes = history::history_json(ENTRIES, 42);
    let entries: Vec<Entry> = serde_json::from_slice(&bytes).expect("the history parses");
    describe(&bytes, &entries);

    let mut group = c.benchmark_group("normalize_10k");
    group
        .sample_size(20)
        .measurement_time(Duration::from_secs(5))
        .warm_up_time(Duration::from_secs(2))
        .throughput(Throughput::Bytes(bytes.len() as u64));

    group.bench_function("a_parse_serialize", |b| {
        b.iter(|| {
            let entries: Vec<Entry> = serde_json::from_slice(black_box(&bytes)).unwrap();
            serde_json::to_vec(&entries).unwrap()
        })
    });
    for (name, provider) in [
        ("anthropic", Provider::Anthropic),
        ("openai", Provider::Openai),
    ] {
        let opts = options(provider);
        group.bench_with_input(
            BenchmarkId::new("b_parse_normalize_serialize", name),
            &opts,
            |b, opts| {
                b.iter(|| {
                    let entries: Vec<Entry> = serde_json::from_slice(black_box(&bytes)).unwrap();
                    let normalized = normalize(&entries, opts);
                    serde_json::to_vec(&normalized).unwrap()
                })
            },
        );
        group.bench_with_input(
            BenchmarkId::new("c_normalize_only", name),
            &opts,
            |b, opts| b.iter(|| normalize(black_box(&entries), opts)),
        );
    }
    group.finish();
    report_ratios();
}

/// What the generated history holds, so the figures can be read against it.
fn describe(bytes: &[u8], entries: &[Entry]) {
    let mut kinds = std::collections::BTreeMap::new();
    for e in entries {
        *kinds.entry(e.kind.as_str()).or_insert(0usize) += 1;
    }
    println!(
        "history: {} entries, {} bytes ({:.2} MB), by type {kinds:?}",
        entries.len(),
        bytes.len(),
        bytes.len() as f64 / 1e6
    );
    for provider in [Provider::Anthropic, Provider::Openai] {
        let n = normalize(entries, &options(provider));
        let out = serde_json::to_vec(&n).unwrap();
        let mut repairs = std::collections::BTreeMap::new();
        for r in &n.repairs {
            *repairs.entry(format!("{:?}", r.kind)).or_insert(0usize) += 1;
        }
        println!(
            "{provider:?}: {} messages, {} repairs {repairs:?}, {} output bytes, ~{} tokens",
            n.messages.len(),
            n.repairs.len(),
            out.len(),
            n.estimated_tokens
        );
    }
}

/// Prints (b)/(a) from criterion's saved medians (`<target>/criterion/…/new/estimates.json`).
fn report_ratios() {
    let root = std::env::var_os("CRITERION_HOME")
        .map(std::path::PathBuf::from)
        .or_else(|| {
            std::env::var_os("CARGO_TARGET_DIR")
                .map(|d| std::path::PathBuf::from(d).join("criterion"))
        })
        .unwrap_or_else(|| "target/criterion".into());
    let median = |id: &str| -> Option<f64> {
        let path = root
            .join("normalize_10k")
            .join(id)
            .join("new/estimates.json");
        let json: serde_json::Value = serde_json::from_slice(&std::fs::read(path).ok()?).ok()?;
        json["median"]["point_estimate"].as_f64()
    };
    let Some(base) = median("a_parse_serialize") else {
        println!(
            "ratio: no saved estimates under {} (test mode?)",
            root.display()
        );
        return;
    };
    for name in ["anthropic", "openai"] {
        let full = median(&format!("b_parse_normalize_serialize/{name}"));
        let only = median(&format!("c_normalize_only/{name}"));
        if let (Some(full), Some(only)) = (full, only) {
            println!(
                "ratio {name}: (parse+normalize+serialize)/(parse+serialize) = {:.2}x \
                 (medians {:.1} ms / {:.1} ms); normalize alone {:.1} ms = {:.2}x the baseline",
                full / base,
                full / 1e6,
                base / 1e6,
                only / 1e6,
                only / base
            );
        }
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
