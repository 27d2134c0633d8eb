//! Incremental reads (`history::normalize::incremental`) against normalizing from scratch.
//!
//! A generated history is read at random points, as an agent appends and reads: the first read
//! normalizes from scratch and leaves a checkpoint; each later read goes on from the checkpoint
//! with the entries appended since (falling back to a read from scratch when the checkpoint cannot
//! be used), then moves the checkpoint. Every read must equal `normalize` of the same window, as a
//! whole `Normalized` value (messages, repairs with their seqs, boundary, token estimate), in both
//! of its forms (values, and the JSON written from the serialized prefix, also once the checkpoint
//! has moved), and its context-token
//! estimate must equal `estimate_context` of the window; for every provider and a spread of
//! options (thinking mode, request model, cache, advisor, available tools, micro-compaction).
//!
//! On chaotic histories (`chaos::chaotic_history`, `chaos::clean_history`) reads may fall back.
//! On well-formed agent loops (`chaos::agent_loop_history`) they must not: once a read left a
//! checkpoint, every later read goes on from it, so the incremental path is known to be taken.

use crate::chaos::{self, MODELS};
use loupe::history::normalize::incremental::{
    Advance, Checkpoint, PagedRead, TailRun, NOT_REPRODUCED,
};
use loupe::history::normalize::{estimate_context, ClearingOptions, Fallback};
use loupe::history::{
    normalize, Entry, MicrocompactOptions, NormalizeOptions, Provider, ThinkingMode,
};
use proptest::prelude::*;
use proptest::sample::Index;

fn providers() -> [Provider; 4] {
    [
        Provider::Anthropic,
        Provider::Openai,
        Provider::OpenaiResponses,
        Provider::Gemini,
    ]
}

/// The request options of a case, besides the provider.
#[derive(Debug, Clone)]
struct Knobs {
    thinking: ThinkingMode,
    cache: bool,
    advisor: bool,
    tools: Option<Vec<String>>,
    model: Option<usize>,
    microcompact: Option<MicrocompactOptions>,
    clearing: Option<ClearingOptions>,
}

fn knobs() -> impl Strategy<Value = Knobs> {
    let microcompact = prop::option::of((0usize..4, prop::sample::select(vec![0usize, 30])))
        .prop_map(|mc| {
            mc.map(|(keep_recent, min_bytes)| MicrocompactOptions {
                keep_recent,
                min_bytes,
                ..MicrocompactOptions::default()
            })
        });
    (
        prop::sample::select(vec![
            ThinkingMode::Keep,
            ThinkingMode::Strip,
            ThinkingMode::Enabled,
        ]),
        any::<bool>(),
        any::<bool>(),
        prop::option::of(prop::sample::subsequence(
            vec!["Bash", "Read", "Edit", "Grep", "Glob", "ToolSearch"],
            0..=6,
        )),
        prop::option::of(0..MODELS.len()),
        microcompact,
        prop::option::of((
            0u64..400,
            0u64..400,
            prop::sample::select(vec![0usize, 1, 300]),
        )),
    )
        .prop_map(
            |(thinking, cache, advisor, tools, model, microcompact, clearing)| Knobs {
                thinking,
                cache,
                advisor,
                tools: tools.map(|t| t.into_iter().map(str::to_string).collect()),
                model,
                microcompact,
                clearing: clearing.map(|(keep_tokens, batch_tokens, min_bytes)| ClearingOptions {
                    keep_tokens,
                    batch_tokens,
                    min_bytes,
                }),
            },
        )
}

fn options(provider: Provider, k: &Knobs) -> NormalizeOptions {
    NormalizeOptions {
        provider,
        tools: k.tools.clone(),
        thinking: k.thinking,
        model: k.model.map(|m| MODELS[m].to_string()),
        cache: k.cache,
        advisor: k.advisor,
        microcompact: k.microcompact.clone(),
        clearing: k.clearing.clone(),
    }
}

/// How the reads of one history went.
#[derive(Debug, Default)]
struct Reads {
    /// Reads that went on from a checkpoint.
    incremental: usize,
    /// Reads that had a checkpoint but fell back, with why.
    fallbacks: Vec<&'static str>,
    /// Reads (from scratch included) after which a checkpoint was kept.
    checkpoints: usize,
    /// Reads without a checkpoint although an earlier read had kept one.
    lost: usize,
}

fn dump(entries: &[Entry]) -> String {
    serde_json::to_string_pretty(entries).unwrap_or_default()
}

/// Reads `entries` at each end of `ends` (ascending) as the service would, comparing each read
/// with `normalize` of the same window.
fn read_at(
    entries: &[Entry],
    ends: &[usize],
    opts: &NormalizeOptions,
) -> Result<Reads, TestCaseError> {
    let mut reads = Reads::default();
    let mut checkpoint: Option<Checkpoint> = None;
    for &end in ends {
        let window = &entries[..end];
        if checkpoint.is_none() && reads.checkpoints > 0 {
            reads.lost += 1;
        }
        let expected = serde_json::to_value(normalize(window, opts)).unwrap();
        let mut resumed = None;
        if let Some(cp) = checkpoint.take() {
            let resume = cp
                .resume_seq()
                .expect("a kept checkpoint has a resume point");
            let at = window
                .iter()
                .position(|e| e.seq == Some(resume))
                .expect("the resume point is in the window");
            match cp.continue_with(&window[at..], opts) {
                Ok(run) => resumed = Some((cp, run, at)),
                Err(Fallback(why)) => reads.fallbacks.push(why),
            }
        }
        let incremental = resumed.is_some();
        let (mut cp, run, at) = match resumed {
            Some(resumed) => resumed,
            None => {
                let cp = Checkpoint::start();
                let run = cp.continue_with(window, opts).map_err(|f| {
                    TestCaseError::fail(format!("a read from scratch fell back: {f:?}"))
                })?;
                (cp, run, 0)
            }
        };
        reads.incremental += usize::from(incremental);
        let got = serde_json::to_value(run.normalized(&cp)).unwrap();
        prop_assert_eq!(
            &got,
            &expected,
            "read of {} entries ({}) differs from normalize (options {:?})\nhistory:\n{}",
            end,
            if incremental {
                "incremental"
            } else {
                "from scratch"
            },
            opts,
            dump(window)
        );
        let written = serde_json::to_value(run.json(&cp)).unwrap();
        prop_assert_eq!(
            &written,
            &expected,
            "the JSON form differs (options {:?})",
            opts
        );
        prop_assert_eq!(run.context_estimate(), estimate_context(window));
        prop_assert_eq!(
            spliced(&cp, &run),
            serde_json::to_string(&run.json(&cp)).unwrap(),
            "the checkpoint's items spliced in (options {:?})",
            opts
        );
        // A cut a run from which falls back is only skipped (the checkpoint stays); one whose
        // run gives another tail means the split is wrong.
        let (moved, advanced) = run.advance(&mut cp, &window[at..]);
        prop_assert!(
            advanced != Advance::NotReproduced,
            "not reproduced at {} entries (options {:?})\nhistory:\n{}",
            end,
            opts,
            dump(window)
        );
        // The service answers from the moved checkpoint and the run from its cut.
        prop_assert_eq!(
            spliced(&cp, &moved),
            serde_json::to_string(&moved.json(&cp)).unwrap(),
            "spliced after the move (options {:?})",
            opts
        );
        let answer = serde_json::to_value(moved.json(&cp)).unwrap();
        prop_assert_eq!(
            &answer,
            &expected,
            "the answer after the move (options {:?})",
            opts
        );
        if cp.resume_seq().is_some() {
            reads.checkpoints += 1;
            checkpoint = Some(cp);
        }
    }
    Ok(reads)
}

/// The JSON of `run.json(cp)` as a writer that sends the checkpoint's items itself builds it:
/// the items one by one (`Checkpoint::prefix_item`), spliced into the JSON written without them.
fn spliced(cp: &Checkpoint, run: &TailRun) -> String {
    const OPEN: &str = r#"{"messages":["#;
    let rest = serde_json::to_string(&run.json_without_prefix_items(cp)).unwrap();
    let rest = rest.strip_prefix(OPEN).expect("the messages come first");
    let items: Vec<&str> = (0..cp.prefix_len())
        .map(|i| cp.prefix_item(i, run.signs_prefix()).get())
        .collect();
    let mut out = format!("{OPEN}{}", items.join(","));
    if !items.is_empty() && !rest.starts_with(']') {
        out.push(',');
    }
    out + rest
}

/// The read points: distinct ends in `1..=len`, ascending, the whole history last (an empty
/// history is read once, empty).
fn ends(len: usize, points: &[Index]) -> Vec<usize> {
    if len == 0 {
        return vec![0];
    }
    let mut ends: Vec<usize> = points.iter().map(|p| 1 + p.index(len)).collect();
    ends.push(len);
    ends.sort_unstable();
    ends.dedup();
    ends
}

/// Reads the whole of `entries` a page at a time, the pages ending at `ends` (ascending, the last
/// at the end), as a read that finds no checkpoint does: equal to `normalize`, or a fallback
/// (returned, for the caller to judge). The checkpoint it leaves must hold its tail exactly.
fn read_in_pages(
    entries: &[Entry],
    ends: &[usize],
    opts: &NormalizeOptions,
    max_pending: usize,
) -> Result<Option<Fallback>, TestCaseError> {
    let mut read = PagedRead::new(opts.clone(), max_pending);
    let mut start = 0;
    for &end in &ends[..ends.len() - 1] {
        if let Err(fallback) = read.feed(entries[start..end].to_vec()) {
            prop_assert!(
                fallback != NOT_REPRODUCED,
                "not reproduced (options {:?})",
                opts
            );
            return Ok(Some(fallback));
        }
        start = end;
    }
    let (checkpoint, run, moved) = match read.finish(entries[start..].to_vec()) {
        Ok(done) => done,
        Err(fallback) => return Ok(Some(fallback)),
    };
    prop_assert!(
        moved != Advance::NotReproduced,
        "not reproduced (options {:?})",
        opts
    );
    let expected = serde_json::to_value(normalize(entries, opts)).unwrap();
    prop_assert_eq!(
        &serde_json::to_value(run.json(&checkpoint)).unwrap(),
        &expected,
        "read in pages ending at {:?} (options {:?})\nhistory:\n{}",
        ends,
        opts,
        dump(entries)
    );
    prop_assert_eq!(run.context_estimate(), estimate_context(entries));
    Ok(None)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, max_shrink_iters: 2048, ..ProptestConfig::default() })]

    #[test]
    fn incremental_reads_of_chaotic_histories_equal_normalize(
        entries in chaos::chaotic_history(),
        points in prop::collection::vec(any::<Index>(), 1..6),
        k in knobs(),
    ) {
        let ends = ends(entries.len(), &points);
        for provider in providers() {
            read_at(&entries, &ends, &options(provider, &k))?;
        }
    }

    #[test]
    fn incremental_reads_of_clean_histories_equal_normalize(
        entries in chaos::clean_history(),
        points in prop::collection::vec(any::<Index>(), 1..6),
        k in knobs(),
    ) {
        let ends = ends(entries.len(), &points);
        for provider in providers() {
            read_at(&entries, &ends, &options(provider, &k))?;
        }
    }

    /// Agent loops read after every few appends: equal to normalize, and never falling back once
    /// a checkpoint exists.
    #[test]
    fn incremental_reads_of_agent_loops_never_fall_back(
        entries in chaos::agent_loop_history(),
        points in prop::collection::vec(any::<Index>(), 2..12),
        k in knobs(),
    ) {
        let ends = ends(entries.len(), &points);
        for provider in providers() {
            let opts = options(provider, &k);
            let reads = read_at(&entries, &ends, &opts)?;
            prop_assert!(
                reads.fallbacks.is_empty(),
                "fell back: {:?} (options {:?})\nhistory:\n{}",
                reads.fallbacks,
                opts,
                dump(&entries)
            );
            // A checkpoint is kept, and every read after the first that kept one goes on from it.
            prop_assert!(reads.checkpoints > 0, "no checkpoint kept (options {:?})", opts);
            prop_assert_eq!(reads.lost, 0, "a checkpoint was lost (options {:?})", opts);
        }
    }

    /// A window read a page at a time equals `normalize` of it whole, whatever the pages.
    #[test]
    fn reads_in_pages_equal_normalize(
        entries in prop_oneof![chaos::chaotic_history(), chaos::clean_history()],
        points in prop::collection::vec(any::<Index>(), 0..6),
        k in knobs(),
    ) {
        let ends = ends(entries.len(), &points);
        for provider in providers() {
            read_in_pages(&entries, &ends, &options(provider, &k), usize::MAX)?;
        }
    }

    /// An agent loop read in pages never falls back: every page goes on from the one before.
    #[test]
    fn agent_loops_read_in_pages_never_fall_back(
        entries in chaos::agent_loop_history(),
        points in prop::collection::vec(any::<Index>(), 1..12),
        k in knobs(),
    ) {
        let ends = ends(entries.len(), &points);
        for provider in providers() {
            let opts = options(provider, &k);
            let fallback = read_in_pages(&entries, &ends, &opts, usize::MAX)?;
            prop_assert_eq!(fallback, None, "options {:?}\nhistory:\n{}", opts, dump(&entries));
        }
    }
}

/// The incremental path is taken on a plain agent loop read after each round (a deterministic
/// counterpart of the property above, so a regression that always falls back fails loudly).
#[test]
fn a_long_agent_loop_is_read_incrementally() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;
    let mut runner = TestRunner::deterministic();
    let mut longest = Vec::new();
    for _ in 0..32 {
        let entries = chaos::agent_loop_history()
            .new_tree(&mut runner)
            .unwrap()
            .current();
        if entries.len() > longest.len() {
            longest = entries;
        }
    }
    assert!(longest.len() >= 20, "a long history: {}", longest.len());
    let ends: Vec<usize> = (1..=longest.len()).collect();
    for provider in providers() {
        let opts = NormalizeOptions {
            provider,
            cache: true,
            ..NormalizeOptions::default()
        };
        let reads = read_at(&longest, &ends, &opts).unwrap();
        assert!(reads.fallbacks.is_empty(), "{:?}", reads.fallbacks);
        assert!(
            reads.incremental * 10 >= ends.len() * 9,
            "{provider:?}: {} of {} reads incremental",
            reads.incremental,
            ends.len()
        );
        // Read in pages of 4, it never holds more than three pages' entries: the checkpoint
        // keeps moving as the pages come.
        let pages: Vec<usize> = (4..longest.len())
            .step_by(4)
            .chain([longest.len()])
            .collect();
        let paged = read_in_pages(&longest, &pages, &opts, 12).unwrap();
        assert_eq!(paged, None, "{provider:?}");
    }
}

/// Prints how often reads go on from a checkpoint, and why the others fall back, on each
/// generator: `cargo test --test api how_often -- --ignored --nocapture`.
#[test]
#[ignore]
fn how_often_reads_go_on_from_a_checkpoint() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;
    let mut runner = TestRunner::deterministic();
    let mut why: std::collections::BTreeMap<&'static str, usize> = Default::default();
    for (name, strategy) in [
        ("chaos", chaos::chaotic_history().boxed()),
        ("clean", chaos::clean_history().boxed()),
        ("agent", chaos::agent_loop_history().boxed()),
    ] {
        let (mut inc, mut total, mut kept) = (0, 0, 0);
        for _ in 0..200 {
            let entries = strategy.new_tree(&mut runner).unwrap().current();
            let k = knobs().new_tree(&mut runner).unwrap().current();
            let points = prop::collection::vec(any::<Index>(), 1..6)
                .new_tree(&mut runner)
                .unwrap()
                .current();
            let ends = ends(entries.len(), &points);
            for provider in providers() {
                let reads = read_at(&entries, &ends, &options(provider, &k)).unwrap();
                inc += reads.incremental;
                total += ends.len();
                kept += reads.checkpoints;
                for f in reads.fallbacks {
                    *why.entry(f).or_default() += 1;
                }
            }
        }
        println!("{name}: {inc} incremental of {total} reads, {kept} checkpoints kept");
    }
    println!("{why:#?}");
}
