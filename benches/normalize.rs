//! Normalization cost against a plain serde_json round trip of the same 10,000-entry history.
//!
//! Run: `cargo bench --bench normalize`. The goal is parse + normalize + serialize under 2× the
//! parse + serialize baseline; the ratio of medians is printed after the run.
//!
//! `read_after_append_{1k,10k}` (`cargo bench --bench normalize -- read_after_append`): a context
//! read after 2 messages were appended to a 1,000- and a 10,000-message thread, the way the
//! service does it, minus the database: rows are parsed from their stored JSON, normalized and
//! the answer serialized. `incremental` goes on from the checkpoint the previous read left (it
//! parses only the rows from the checkpoint on, and moves the checkpoint); `from_scratch` parses
//! and normalizes every row; `raw` parses every row and serializes the entries back, the cost of
//! handing out the window with no normalization at all; `miss` is a read that finds no checkpoint
//! (from scratch, leaving one). `incremental_no_append` reads again with nothing appended. The
//! ratios of medians are printed after the run.

#[path = "support/history.rs"]
mod history;

use std::hint::black_box;
use std::time::Duration;

use criterion::BatchSize;
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use loupe::history::normalize::incremental::{Advance, Checkpoint};
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

/// The median criterion saved for benchmark `id` of `group` (`<target>/criterion/…/new/estimates.json`).
fn saved_median(group: &str, id: &str) -> Option<f64> {
    let path = criterion_root()
        .join(group)
        .join(id)
        .join("new/estimates.json");
    let json: serde_json::Value = serde_json::from_slice(&std::fs::read(path).ok()?).ok()?;
    json["median"]["point_estimate"].as_f64()
}

/// Prints (b)/(a) from criterion's saved medians (`<target>/criterion/…/new/estimates.json`).
fn report_ratios() {
    let median = |id: &str| saved_median("normalize_10k", id);
    let Some(base) = median("a_parse_serialize") else {
        println!(
            "ratio: no saved estimates under {} (test mode?)",
            criterion_root().display()
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

/// The rows of a thread as the store returns them: each entry's JSON.
fn rows(n: usize, seed: u64) -> Vec<String> {
    history::history_values(n, seed)
        .iter()
        .map(|v| serde_json::to_string(v).unwrap())
        .collect()
}

fn parse(rows: &[String]) -> Vec<Entry> {
    rows.iter()
        .map(|r| serde_json::from_str(r).unwrap())
        .collect()
}

/// The checkpoint a read of `rows` leaves, and the index of the first row after it.
fn checkpoint_after(rows: &[String], opts: &NormalizeOptions) -> (Checkpoint, usize) {
    let entries = parse(rows);
    let mut checkpoint = Checkpoint::start();
    let run = checkpoint.continue_with(&entries, opts).unwrap();
    assert_eq!(
        run.advance(&mut checkpoint, &entries).1,
        Advance::Moved,
        "a cut"
    );
    let resume = checkpoint.resume_seq().unwrap();
    let at = entries.iter().position(|e| e.seq == Some(resume)).unwrap();
    (checkpoint, at)
}

/// One incremental read: parse the rows from the checkpoint on, normalize them after it, write
/// the answer, move the checkpoint.
fn incremental_read(
    checkpoint: &mut Checkpoint,
    tail_rows: &[String],
    opts: &NormalizeOptions,
) -> Vec<u8> {
    let tail = parse(tail_rows);
    let run = checkpoint.continue_with(&tail, opts).expect("no fallback");
    let (run, moved) = run.advance(checkpoint, &tail);
    assert!(
        matches!(moved, Advance::Moved | Advance::NoCut),
        "the checkpoint moves or stays: {moved:?}"
    );
    serde_json::to_vec(&run.json(checkpoint)).unwrap()
}

/// A read that finds no checkpoint, as the service does it: every row parsed and normalized from
/// the start, the answer written, a checkpoint left.
fn first_read(rows: &[String], opts: &NormalizeOptions) -> (Vec<u8>, Checkpoint) {
    let entries = parse(rows);
    let mut checkpoint = Checkpoint::start();
    let run = checkpoint.continue_with(&entries, opts).unwrap();
    let (run, _) = run.advance(&mut checkpoint, &entries);
    (
        serde_json::to_vec(&run.json(&checkpoint)).unwrap(),
        checkpoint,
    )
}

fn read_after_append(c: &mut Criterion) {
    let opts = options(Provider::Anthropic);
    for (name, n) in [
        ("read_after_append_1k", 1_000usize),
        ("read_after_append_10k", 10_000),
    ] {
        let all = rows(n + 2, 7);
        let (before, appended) = all.split_at(n);
        let (checkpoint, at) = checkpoint_after(before, &opts);
        let kinds: Vec<String> = parse(appended)
            .iter()
            .map(|e| e.kind.as_str().to_owned())
            .collect();
        println!(
            "{name}: {n} rows + {kinds:?}; the checkpoint ends at row {at}: the read parses {} rows",
            all.len() - at
        );
        // The incremental answer is the whole context.
        let mut check = checkpoint.clone();
        let body = incremental_read(&mut check, &all[at..], &opts);
        let expected = serde_json::to_vec(&normalize(&parse(&all), &opts)).unwrap();
        assert_eq!(
            serde_json::from_slice::<serde_json::Value>(&body).unwrap(),
            serde_json::from_slice::<serde_json::Value>(&expected).unwrap()
        );
        let (after, at_after) = checkpoint_after(&all, &opts);

        let mut group = c.benchmark_group(name);
        group.sample_size(20);
        group.bench_function("raw", |b| {
            b.iter(|| serde_json::to_vec(&parse(black_box(&all))).unwrap())
        });
        group.bench_function("from_scratch", |b| {
            b.iter(|| {
                let entries = parse(black_box(&all));
                serde_json::to_vec(&normalize(&entries, &opts)).unwrap()
            })
        });
        group.bench_function("miss", |b| b.iter(|| first_read(black_box(&all), &opts)));
        group.bench_function("incremental", |b| {
            b.iter_batched(
                || checkpoint.clone(),
                |mut cp| incremental_read(&mut cp, black_box(&all[at..]), &opts),
                BatchSize::LargeInput,
            )
        });
        group.bench_function("incremental_no_append", |b| {
            b.iter_batched(
                || after.clone(),
                |mut cp| incremental_read(&mut cp, black_box(&all[at_after..]), &opts),
                BatchSize::LargeInput,
            )
        });
        group.finish();
        report_read_ratios(name);
    }
}

/// Prints the ratios of the read_after_append medians.
fn report_read_ratios(group: &str) {
    let median = |id: &str| saved_median(group, id);
    let (Some(raw), Some(full), Some(miss), Some(inc), Some(again)) = (
        median("raw"),
        median("from_scratch"),
        median("miss"),
        median("incremental"),
        median("incremental_no_append"),
    ) else {
        println!("{group}: no saved estimates (test mode?)");
        return;
    };
    println!(
        "{group}: medians raw {:.3} ms, from scratch {:.3} ms, miss {:.3} ms, incremental {:.3} ms, \
         no append {:.3} ms; from scratch / raw = {:.2}x, miss / from scratch = {:.2}x, \
         incremental / raw = {:.3}x, from scratch / incremental = {:.1}x, no append / raw = {:.3}x",
        raw / 1e6,
        full / 1e6,
        miss / 1e6,
        inc / 1e6,
        again / 1e6,
        full / raw,
        miss / full,
        inc / raw,
        full / inc,
        again / raw
    );
}

fn criterion_root() -> std::path::PathBuf {
    std::env::var_os("CRITERION_HOME")
        .map(std::path::PathBuf::from)
        .or_else(|| {
            std::env::var_os("CARGO_TARGET_DIR")
                .map(|d| std::path::PathBuf::from(d).join("criterion"))
        })
        .unwrap_or_else(|| "target/criterion".into())
}

criterion_group!(benches, bench, read_after_append);
criterion_main!(benches);
