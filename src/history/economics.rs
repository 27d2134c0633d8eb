//! A thread's economics, folded over its history in one pass (`GET
//! /v1/threads/{id}/economics`): for each request the history shows (an assistant response,
//! counted once at its first entry), the context size Loupe estimated before it, the size the
//! response reports, and the input cost so far, as reported and under a modelled automatic
//! compaction; and where the context was cut (compact boundaries) or cleared.
//!
//! The estimate is the context read's `context_tokens`: [`estimate_context`] of the window (from
//! the last compact boundary, or from the segment it preserved), held out: made of the entries
//! before the response only. Computing it for every response by calling [`estimate_context`] on
//! each prefix would cost `O(n²)`; [`EconomicsFold`] keeps the two running sums that function
//! reads (the window's content, and the last `usage` since the boundary plus what follows it),
//! so `n` entries cost `O(n)` and the fold holds counters, never entries.
//!
//! [`estimate_context`]: crate::history::normalize::estimate_context

use std::collections::VecDeque;

use serde_json::Value;

use super::model::{Content, Entry, EntryKind};
use super::normalize::blocks::content_bytes;
use super::normalize::clearing::{ClearingOptions, MIN_CLEARED_BYTES};
use super::normalize::estimate::{EstimateBasis, Estimator};
use super::normalize::tokens::Usage;
use super::visibility::is_sent_to_model;

/// Tokens of the summary a modelled automatic compaction leaves in place of the context.
pub const MODELLED_SUMMARY_TOKENS: u64 = 4_000;

/// Prompt-cache prices, in hundredths of a plain input token, so sums stay exact integers: a
/// plain input token 1×, a token written to the cache 1.25×, a token read from it 0.1×.
pub const PLAIN_INPUT: u64 = 100;
pub const CACHE_WRITE: u64 = 125;
pub const CACHE_READ: u64 = 10;

/// Characters of a response's `model` and `timestamp` a point keeps: a client's strings are
/// not bounded otherwise, and a point is held until the answer is written.
const MAX_LABEL_CHARS: usize = 100;

/// What a marker marks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MarkerKind {
    /// A compact boundary: the context restarts from a summary.
    Compaction,
    /// Reversible clearing's frontier moved: the request at the marker is the first to send the
    /// batch's results as stubs.
    Clearing,
    /// An outline merge: the outline's boundary moved at this seq.
    Outline,
}

/// A marker at a seq.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Marker {
    pub seq: i64,
    pub kind: MarkerKind,
}

/// What a response's `usage` reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reported {
    /// The whole prompt, cache reads and writes included, in any provider's form
    /// ([`Usage::read`]): Anthropic's `input_tokens + cache_read_input_tokens +
    /// cache_creation_input_tokens`, OpenAI's `input_tokens` or `prompt_tokens`, Gemini's
    /// `promptTokenCount`.
    pub prompt_tokens: u64,
    pub output_tokens: u64,
    /// The prompt's price in hundredths: input 1×, cache writes 1.25×, cache reads 0.1×.
    pub cost: u64,
}

/// One request of the history.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Point {
    /// The response's first entry.
    pub seq: i64,
    /// That entry's own `timestamp` field, when it has a string one (clipped).
    pub timestamp: Option<String>,
    /// `message.model` (clipped).
    pub model: Option<String>,
    /// The context estimate made of the entries before the response.
    pub estimate: u64,
    pub basis: EstimateBasis,
    pub reported: Option<Reported>,
    /// Cumulative input cost in hundredths of a token, of the responses that report `usage`;
    /// `None` at a response without one.
    pub cost_reported: Option<u64>,
    /// Cumulative input cost in hundredths of a token under the modelled automatic compaction.
    pub cost_auto_compaction: u64,
}

/// What one entry adds.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Pushed {
    pub point: Option<Point>,
    /// The entry's content tokens ([`super::normalize::estimate::context_entry_tokens`]).
    pub tokens: u64,
    /// Markers at this entry.
    pub markers: Vec<MarkerKind>,
}

/// Reversible clearing's rule (`normalize::clearing`), run as results arrive instead of over a
/// whole list: the same decisions, one turn at a time. Holds the sizes of the results still
/// whole, which the rule keeps near `keep_tokens + batch_tokens`.
#[derive(Debug, Clone)]
pub struct ClearingRun {
    opts: ClearingOptions,
    whole: VecDeque<u64>,
    whole_tokens: u64,
    /// Results of the open turn: the newest of `whole`, never cleared while it is open.
    open_turn: usize,
}

impl ClearingRun {
    pub fn new(opts: ClearingOptions) -> Self {
        ClearingRun {
            opts,
            whole: VecDeque::new(),
            whole_tokens: 0,
            open_turn: 0,
        }
    }

    /// A result the rule counts arrives in the open turn.
    pub fn arrive(&mut self, tokens: u64) {
        self.whole.push_back(tokens);
        self.whole_tokens = self.whole_tokens.saturating_add(tokens);
        self.open_turn += 1;
    }

    /// The open turn ends: returns how many results the rule clears now (a turn without results
    /// decides nothing, as in the rule).
    pub fn end_turn(&mut self) -> usize {
        if self.open_turn == 0 {
            return 0;
        }
        let clearable = self.whole.len() - self.open_turn;
        self.open_turn = 0;
        let mut cleared = 0;
        if self.whole_tokens > self.opts.keep_tokens.saturating_add(self.opts.batch_tokens) {
            while self.whole_tokens > self.opts.keep_tokens && cleared < clearable {
                let tokens = self.whole.pop_front().unwrap_or(0);
                self.whole_tokens -= tokens;
                cleared += 1;
            }
        }
        cleared
    }

    /// A compact boundary: the window, and so the rule's run, starts again.
    fn restart(&mut self) {
        self.whole.clear();
        self.whole_tokens = 0;
        self.open_turn = 0;
    }

    /// Counts the results of a stored user entry the rule counts (those of at least
    /// `min_bytes` and over [`MIN_CLEARED_BYTES`]), each at bytes / 4 rounded up.
    fn arrive_from(&mut self, entry: &Entry) {
        let Some(Content::Blocks(blocks)) = entry.message.as_ref().map(|m| &m.content) else {
            return;
        };
        for block in blocks {
            if block.get("type").and_then(Value::as_str) != Some("tool_result") {
                continue;
            }
            let bytes = content_bytes(block.get("content"));
            if bytes >= self.opts.min_bytes && bytes > MIN_CLEARED_BYTES {
                self.arrive((bytes as u64).div_ceil(4));
            }
        }
    }
}

/// The modelled automatic compaction: the context grows by the content estimate of each entry
/// (`context_entry_tokens`, compaction summaries of the history left out: the model writes its
/// own); before a request whose prompt reaches the threshold from below (Loupe's trigger: a
/// summary that leaves the prompt at or above it does not trigger again), it is replaced by a
/// summary of [`MODELLED_SUMMARY_TOKENS`]. A prompt is the fixed part (system prompt and tools:
/// what the first response reporting `usage` counts beyond the content before it, taken as
/// cached from the first request on) plus the context. Each request pays 0.1× for the prefix it
/// shares with the previous one and 1.25× for the rest; after a compaction only the fixed part is
/// shared. The summarizer's own request is not counted.
#[derive(Debug, Clone)]
struct Modelled {
    threshold: u64,
    fixed: Option<u64>,
    context: u64,
    previous_prompt: u64,
    /// Whether the last prompt was below the threshold.
    armed: bool,
    cost: u64,
}

impl Modelled {
    /// One request; returns the cumulative cost.
    fn request(&mut self, reported_prompt: Option<u64>) -> u64 {
        if self.fixed.is_none() {
            self.fixed = reported_prompt.map(|prompt| prompt.saturating_sub(self.context));
            // The fixed part opens every request, this thread's and its neighbours': it is
            // taken as cached already, as providers report it from the first request on.
            self.previous_prompt = self.previous_prompt.max(self.fixed.unwrap_or(0));
        }
        let fixed = self.fixed.unwrap_or(0);
        let reaches =
            |context: u64| self.threshold > 0 && fixed.saturating_add(context) >= self.threshold;
        if self.armed && reaches(self.context) {
            self.context = MODELLED_SUMMARY_TOKENS;
            self.previous_prompt = self.previous_prompt.min(fixed);
        }
        self.armed = !reaches(self.context);
        let prompt = fixed.saturating_add(self.context);
        let shared = self.previous_prompt.min(prompt);
        self.cost = self
            .cost
            .saturating_add(shared.saturating_mul(CACHE_READ))
            .saturating_add((prompt - shared).saturating_mul(CACHE_WRITE));
        self.previous_prompt = prompt;
        self.cost
    }
}

/// The one-pass fold over a thread's entries in seq order.
#[derive(Debug, Clone)]
pub struct EconomicsFold {
    /// The context read's estimate, over the window so far: from its start (the last boundary,
    /// or the start of the segment it preserved).
    estimator: Estimator,
    /// The id of the last response counted (`Some(None)`: it had none).
    last_response: Option<Option<String>>,
    reported_cost: u64,
    modelled: Modelled,
    clearing: Option<ClearingRun>,
}

impl EconomicsFold {
    /// A fold for a thread whose automatic compaction starts at `auto_compact_tokens` (0: off)
    /// and whose context clears old results by `clearing` (None: off).
    pub fn new(auto_compact_tokens: u64, clearing: Option<ClearingOptions>) -> Self {
        EconomicsFold {
            estimator: Estimator::default(),
            last_response: None,
            reported_cost: 0,
            modelled: Modelled {
                threshold: auto_compact_tokens,
                fixed: None,
                context: 0,
                previous_prompt: 0,
                armed: true,
                cost: 0,
            },
            clearing: clearing.map(ClearingRun::new),
        }
    }

    /// The context estimate of the entries pushed so far, as a context read of a thread holding
    /// just them answers it, less the overhead a content-only read adds: what the tenant had
    /// learned then is not stored, and what it has learned since would flatter the past.
    pub fn estimate(&self) -> (u64, EstimateBasis) {
        let estimate = self.estimator.estimate();
        (estimate.tokens, estimate.basis)
    }

    /// Folds the next entry in; a response's first entry gives a point, made before the entry
    /// itself counts.
    pub fn push(&mut self, entry: &Entry) -> Pushed {
        let mut pushed = Pushed::default();
        if self.starts_response(entry) {
            if self.clearing.as_mut().is_some_and(|run| run.end_turn() > 0) {
                pushed.markers.push(MarkerKind::Clearing);
            }
            pushed.point = Some(self.point(entry));
        }
        if entry.is_compact_boundary() {
            self.estimator.restart_window();
            if let Some(run) = self.clearing.as_mut() {
                run.restart();
            }
            pushed.markers.push(MarkerKind::Compaction);
        }
        let tokens = self.estimator.push(entry).at_default_rates();
        pushed.tokens = tokens;
        if !entry.is_compact_summary {
            self.modelled.context = self.modelled.context.saturating_add(tokens);
        }
        if entry.kind == EntryKind::User && is_sent_to_model(entry) {
            if let Some(run) = self.clearing.as_mut() {
                run.arrive_from(entry);
            }
        }
        pushed
    }

    /// After a compact boundary was pushed: the content tokens of the entries before it that its
    /// preserved segment brings back (from the segment's first seq up to the boundary), which
    /// the window, and so a content-only estimate, starts with.
    pub fn preserve(&mut self, tokens: u64) {
        self.estimator.preserve(tokens);
    }

    /// Whether `entry` is the first entry of a response: an assistant entry that reached a
    /// provider (not synthetic, not an API error, not display-only) whose `message.id` differs
    /// from the previous response's (one without an id is a response of its own).
    fn starts_response(&mut self, entry: &Entry) -> bool {
        let Some(message) = entry.message.as_ref() else {
            return false;
        };
        if entry.kind != EntryKind::Assistant
            || entry.is_api_error
            || entry.is_virtual
            || message.model.as_deref() == Some("<synthetic>")
        {
            return false;
        }
        let id = message.id.as_deref();
        let new = match &self.last_response {
            Some(Some(previous)) => id != Some(previous.as_str()),
            _ => true,
        };
        if new {
            self.last_response = Some(id.map(str::to_owned));
        }
        new
    }

    fn point(&mut self, entry: &Entry) -> Point {
        let message = entry.message.as_ref();
        let reported = message
            .and_then(|m| m.usage.as_ref())
            .filter(|usage| usage.is_object())
            .map(|usage| {
                let usage = Usage::read(usage);
                Reported {
                    prompt_tokens: usage.prompt(),
                    output_tokens: usage.output,
                    cost: usage.input * PLAIN_INPUT
                        + usage.cache_write * CACHE_WRITE
                        + usage.cache_read * CACHE_READ,
                }
            });
        if let Some(reported) = reported {
            self.reported_cost = self.reported_cost.saturating_add(reported.cost);
        }
        let (estimate, basis) = self.estimate();
        Point {
            seq: entry.seq.unwrap_or(-1),
            timestamp: entry
                .extra
                .get("timestamp")
                .and_then(Value::as_str)
                .map(clip),
            model: message.and_then(|m| m.model.as_deref()).map(clip),
            estimate,
            basis,
            cost_reported: reported.map(|_| self.reported_cost),
            cost_auto_compaction: self.modelled.request(reported.map(|r| r.prompt_tokens)),
            reported,
        }
    }
}

fn clip(text: &str) -> String {
    text.chars().take(MAX_LABEL_CHARS).collect()
}

/// The first seq of the context window a compact boundary at `boundary_seq` opens: the first seq
/// of its preserved segment (clamped to `[0, boundary_seq]`), else the boundary itself: the
/// store's window bounds, which the estimate's content is summed from.
pub fn window_start(boundary: &Entry, boundary_seq: i64) -> i64 {
    boundary
        .preserved_segment()
        .map_or(boundary_seq, |(first, _)| first.clamp(0, boundary_seq))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::normalize::clearing::{still_whole, Arrival};
    use crate::history::normalize::estimate::context_entry_tokens;
    use crate::history::normalize::estimate_context;
    use serde_json::json;

    fn entry(seq: usize, value: Value) -> Entry {
        let mut entry: Entry = serde_json::from_value(value).unwrap();
        entry.seq = Some(seq as i64);
        entry
    }

    fn user(text: &str) -> Value {
        json!({"type": "user", "message": {"role": "user", "content": text}})
    }

    fn answer(id: Option<&str>, text: &str, usage: Option<Value>) -> Value {
        let mut message = json!({"role": "assistant", "model": "claude-test",
            "content": [{"type": "text", "text": text}]});
        if let Some(id) = id {
            message["id"] = json!(id);
        }
        if let Some(usage) = usage {
            message["usage"] = usage;
        }
        json!({"type": "assistant", "message": message, "timestamp": "2026-03-14T09:00:00Z"})
    }

    fn usage(input: u64, written: u64, read: u64, output: u64) -> Value {
        json!({"input_tokens": input, "cache_creation_input_tokens": written,
            "cache_read_input_tokens": read, "output_tokens": output})
    }

    fn result(id: &str, bytes: usize) -> Value {
        json!({"type": "user", "message": {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": id, "content": "r".repeat(bytes)}]}})
    }

    /// A history with every kind of entry the estimate treats apart: usage, fragments of one
    /// response, synthetic and API-error entries, progress, meta, a local command, a boundary
    /// without and one with a preserved segment, entries between them without usage.
    fn varied() -> Vec<Entry> {
        let values = vec![
            json!({"type": "file-history-snapshot", "snapshot": {}}),
            user("Fix the rounding of the parser, it rounds half down."),
            json!({"type": "user", "isMeta": true, "message": {"role": "user", "content": "<reminder>"}}),
            answer(Some("m1"), "Looking.", Some(usage(3, 6_000, 14_000, 9))),
            answer(
                Some("m1"),
                "Reading the parser now.",
                Some(usage(3, 6_000, 14_000, 200)),
            ),
            json!({"type": "progress", "data": {"tick": 1}}),
            result("t1", 4_000),
            answer(None, "No id here.", None),
            json!({"type": "assistant", "isApiErrorMessage": true, "message": {"role": "assistant",
                "id": "err", "model": "<synthetic>", "content": [{"type": "text", "text": "API Error"}]}}),
            answer(Some("m2"), "Fixed.", Some(usage(1, 500, 20_000, 40))),
            json!({"type": "system", "subtype": "local_command", "content": "<stdout>ok</stdout>"}),
            user("Now the report."),
            json!({"type": "system", "subtype": "compact_boundary", "content": "Conversation compacted"}),
            json!({"type": "user", "isCompactSummary": true, "message": {"role": "user",
                "content": "Summary: the parser rounds half up now."}}),
            user("And the CSV writer?"),
            json!({"type": "progress", "data": {"tick": 2}}),
            answer(
                Some("m3"),
                "Checking the writer.",
                Some(usage(2, 900, 3_000, 30)),
            ),
            result("t2", 2_500),
            answer(
                Some("m4"),
                "It calls toFixed.",
                Some(usage(1, 700, 4_100, 25)),
            ),
            user("Keep that part."),
            json!({"type": "system", "subtype": "compact_boundary", "compact_metadata":
                {"trigger": "manual", "preserved_segment": {"first_seq": 17, "last_seq": 18}}}),
            json!({"type": "user", "isCompactSummary": true, "message": {"role": "user",
                "content": "Summary 2."}}),
            user("Open the PR."),
            answer(Some("m5"), "Opened.", Some(usage(2, 220, 14_020, 12))),
        ];
        values
            .into_iter()
            .enumerate()
            .map(|(seq, value)| entry(seq, value))
            .collect()
    }

    /// The window a context read of `entries` reads: from the last boundary, or from the start
    /// of the segment it preserved (the store's bounds, written out independently of the fold).
    fn window(entries: &[Entry]) -> &[Entry] {
        match entries.iter().rposition(Entry::is_compact_boundary) {
            Some(at) => {
                let start = match entries[at].preserved_segment() {
                    Some((first, _)) => (first.max(0) as usize).min(at),
                    None => at,
                };
                &entries[start..]
            }
            None => entries,
        }
    }

    /// Pushes `entries` through a fold the way the store does (a boundary followed by the
    /// content of what it preserves); returns the estimate after each entry and the points.
    fn fold(
        entries: &[Entry],
        fold: &mut EconomicsFold,
    ) -> (Vec<(u64, EstimateBasis)>, Vec<Pushed>) {
        let mut estimates = vec![fold.estimate()];
        let mut pushed = Vec::new();
        for (i, entry) in entries.iter().enumerate() {
            pushed.push(fold.push(entry));
            if entry.is_compact_boundary() {
                let start = window_start(entry, i as i64) as usize;
                fold.preserve(entries[start..i].iter().map(context_entry_tokens).sum());
            }
            estimates.push(fold.estimate());
        }
        (estimates, pushed)
    }

    #[test]
    fn the_fold_equals_the_context_estimate_at_every_cut() {
        let entries = varied();
        let (estimates, _) = fold(&entries, &mut EconomicsFold::new(0, None));
        let mut bases = Vec::new();
        for (cut, folded) in estimates.iter().enumerate() {
            let expected = estimate_context(window(&entries[..cut]));
            assert_eq!(*folded, (expected.tokens, expected.basis), "cut {cut}");
            if !bases.contains(&expected.basis) {
                bases.push(expected.basis);
            }
        }
        assert_eq!(bases.len(), 2, "both bases are exercised");
        // Before the first boundary the window is the whole prefix: the estimate is
        // `estimate_context` of the prefix itself.
        for (cut, folded) in estimates.iter().enumerate().take(12 + 1) {
            let expected = estimate_context(&entries[..cut]);
            assert_eq!(*folded, (expected.tokens, expected.basis), "cut {cut}");
        }
        // The preserved segment counts: after the second boundary, before any usage, the
        // estimate holds the kept entries' content.
        let kept: u64 = entries[17..20].iter().map(context_entry_tokens).sum();
        assert!(kept > 0);
        assert_eq!(estimates[22].1, EstimateBasis::Content);
        assert!(estimates[22].0 >= kept);
    }

    #[test]
    fn the_fold_holds_on_chaotic_histories_too() {
        // Many short histories from a fixed generator: the same equality at every cut.
        let kinds = 9;
        for seed in 0..200_u64 {
            let mut state = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
            let mut next = || {
                state = state
                    .wrapping_mul(6_364_136_223_846_793_005)
                    .wrapping_add(1_442_695_040_888_963_407);
                (state >> 33) as usize
            };
            let len = 5 + next() % 40;
            let entries: Vec<Entry> = (0..len)
                .map(|seq| {
                    let value = match next() % kinds {
                        0 => user(&"w ".repeat(next() % 50)),
                        1 => answer(Some(&format!("m{}", next() % 3)), "ok", Some(usage(1, 10, next() as u64 % 5_000, 3))),
                        2 => answer(None, "no usage", None),
                        3 => json!({"type": "progress", "data": {}}),
                        4 => json!({"type": "system", "subtype": "compact_boundary"}),
                        5 => {
                            let first = next() % (seq + 1);
                            json!({"type": "system", "subtype": "compact_boundary", "compact_metadata":
                                {"preserved_segment": {"first_seq": first, "last_seq": seq}}})
                        }
                        6 => result("t", next() % 3_000),
                        7 => json!({"type": "assistant", "isApiErrorMessage": true, "message":
                            {"role": "assistant", "model": "<synthetic>", "usage": usage(5, 5, 5, 5),
                             "content": [{"type": "text", "text": "API Error"}]}}),
                        _ => answer(Some("m9"), "zero usage", Some(usage(0, 0, 0, 0))),
                    };
                    entry(seq, value)
                })
                .collect();
            let (estimates, _) = fold(&entries, &mut EconomicsFold::new(0, None));
            for (cut, folded) in estimates.iter().enumerate() {
                let expected = estimate_context(window(&entries[..cut]));
                assert_eq!(
                    *folded,
                    (expected.tokens, expected.basis),
                    "seed {seed} cut {cut}"
                );
            }
        }
    }

    #[test]
    fn each_response_is_one_point_at_its_first_entry_with_the_estimate_before_it() {
        let entries = varied();
        let mut economics = EconomicsFold::new(0, None);
        let (estimates, pushed) = fold(&entries, &mut economics);
        let points: Vec<&Point> = pushed.iter().filter_map(|p| p.point.as_ref()).collect();
        let seqs: Vec<i64> = points.iter().map(|p| p.seq).collect();
        // m1 twice (fragments), the id-less answer, m2 (the synthetic error is skipped), m3,
        // m4, m5.
        assert_eq!(seqs, vec![3, 7, 9, 16, 18, 23]);
        for point in &points {
            assert_eq!(
                (point.estimate, point.basis),
                estimates[point.seq as usize],
                "held out: the estimate before seq {}",
                point.seq
            );
        }
        let first = points[0];
        assert_eq!(first.model.as_deref(), Some("claude-test"));
        assert_eq!(first.timestamp.as_deref(), Some("2026-03-14T09:00:00Z"));
        assert_eq!(
            first.reported,
            Some(Reported {
                prompt_tokens: 3 + 6_000 + 14_000,
                output_tokens: 9,
                cost: 3 * 100 + 6_000 * 125 + 14_000 * 10,
            })
        );
        assert_eq!(points[1].reported, None);
        assert_eq!(points[1].cost_reported, None);
        // Cumulative: m1's and m2's prompts.
        let m2 = 100 + 500 * 125 + 20_000 * 10;
        assert_eq!(
            points[2].cost_reported,
            Some(first.reported.unwrap().cost + m2)
        );
        let compactions: Vec<usize> = pushed
            .iter()
            .enumerate()
            .filter(|(_, p)| p.markers.contains(&MarkerKind::Compaction))
            .map(|(seq, _)| seq)
            .collect();
        assert_eq!(compactions, vec![12, 20]);
    }

    #[test]
    fn malformed_usage_counts_as_nothing_or_is_clamped() {
        let max = crate::history::normalize::tokens::MAX_USAGE_TOKENS;
        let bad = json!({"input_tokens": "12", "cache_creation_input_tokens": -5,
            "cache_read_input_tokens": 1.5e300, "output_tokens": u64::MAX});
        let huge = usage(u64::MAX, u64::MAX, u64::MAX, u64::MAX);
        let entries = [
            entry(0, user("hi")),
            entry(1, answer(Some("a"), "x", Some(bad))),
            entry(2, answer(Some("b"), "y", Some(huge))),
            entry(3, answer(Some("c"), "z", Some(json!("not an object")))),
        ];
        let mut economics = EconomicsFold::new(167_000, None);
        let points: Vec<Point> = entries
            .iter()
            .filter_map(|e| economics.push(e).point)
            .collect();
        assert_eq!(
            points[0].reported,
            Some(Reported {
                prompt_tokens: 0,
                output_tokens: max,
                cost: 0
            })
        );
        let huge = points[1].reported.unwrap();
        assert_eq!(huge.prompt_tokens, 3 * max);
        assert_eq!(huge.cost, max * (100 + 125 + 10));
        assert_eq!(points[2].reported, None);
        // The estimate after the huge usage is clamped too, and the modelled cost saturates
        // rather than wrapping.
        assert_eq!(points[2].estimate, 4 * max);
        assert!(points[2].cost_auto_compaction >= points[1].cost_auto_compaction);
    }

    #[test]
    fn the_modelled_compaction_replaces_the_context_with_a_summary_and_prices_the_prefix() {
        // Three exchanges of 10,000 content tokens each (code at 2.5 characters a token), the
        // first response reporting a fixed part of 1,000 tokens; threshold 25,000.
        let big = "{}".repeat(12_500);
        let content = context_entry_tokens(&entry(0, user(&big)));
        assert_eq!(content, 10_000);
        let reply = |id: &str, usage: Option<Value>| answer(Some(id), "", usage);
        let entries = [
            entry(0, user(&big)),
            entry(1, reply("a", Some(usage(1_000 + content, 0, 0, 1)))),
            entry(2, user(&big)),
            entry(3, reply("b", None)),
            entry(4, user(&big)),
            entry(5, reply("c", None)),
        ];
        assert_eq!(
            context_entry_tokens(&entries[1]),
            0,
            "an empty answer adds nothing"
        );
        let mut economics = EconomicsFold::new(25_000, None);
        let costs: Vec<u64> = entries
            .iter()
            .filter_map(|e| economics.push(e).point)
            .map(|p| p.cost_auto_compaction)
            .collect();
        // Request 1: 11,000 tokens, the fixed 1,000 cached. Request 2: 21,000 tokens, 11,000
        // shared. Request 3 would be 31,000 ≥ 25,000: the context becomes the summary, only the
        // fixed part is shared.
        let first = 1_000 * 10 + 10_000 * 125;
        let second = first + 11_000 * 10 + 10_000 * 125;
        let third = second + 1_000 * 10 + MODELLED_SUMMARY_TOKENS * 125;
        assert_eq!(costs, vec![first, second, third]);

        // A threshold the summary itself reaches compacts once, then no more until the prompt
        // has been below it again: as Loupe's trigger, which fires on crossing.
        let mut tight = EconomicsFold::new(2_000, None);
        let costs: Vec<u64> = entries
            .iter()
            .filter_map(|e| tight.push(e).point)
            .map(|p| p.cost_auto_compaction)
            .collect();
        let summary = 1_000 + MODELLED_SUMMARY_TOKENS;
        let first = 1_000 * 10 + MODELLED_SUMMARY_TOKENS * 125;
        let second = first + summary * 10 + 10_000 * 125;
        let third = second + (summary + 10_000) * 10 + 10_000 * 125;
        assert_eq!(costs, vec![first, second, third]);
    }

    #[test]
    fn the_clearing_run_decides_what_the_rule_does() {
        let opts = ClearingOptions {
            keep_tokens: 30,
            batch_tokens: 50,
            min_bytes: 10,
        };
        for seed in 0..50_usize {
            let arrivals: Vec<Arrival> = (0..150)
                .map(|i| Arrival {
                    tokens: ((i * 37 + seed * 11) % 23) as u64 + 1,
                    turn: (i * (seed % 4 + 1)) / 5,
                })
                .collect();
            let mut run = ClearingRun::new(opts.clone());
            let mut cleared = 0;
            for (i, arrival) in arrivals.iter().enumerate() {
                run.arrive(arrival.tokens);
                if arrivals
                    .get(i + 1)
                    .is_none_or(|next| next.turn != arrival.turn)
                {
                    cleared += run.end_turn();
                }
                let so_far = &arrivals[..=i];
                let whole = still_whole(&[], so_far, &opts);
                if arrivals
                    .get(i + 1)
                    .is_none_or(|next| next.turn != arrival.turn)
                {
                    assert_eq!(cleared, so_far.len() - whole.len(), "seed {seed} at {i}");
                    assert_eq!(run.whole.iter().copied().collect::<Vec<_>>(), whole);
                }
            }
            assert_eq!(run.end_turn(), 0, "an empty turn decides nothing");
        }
    }

    #[test]
    fn clearing_marks_the_request_that_first_sends_a_batch_as_stubs() {
        // 1,000-byte results are 250 tokens; keep 250, batch 500: the fourth result takes the
        // whole ones to 1,000 > 750, and the request after it clears the three before it.
        let opts = ClearingOptions {
            keep_tokens: 250,
            batch_tokens: 500,
            min_bytes: 200,
        };
        let mut values = vec![user("go")];
        for i in 0..6 {
            values.push(answer(Some(&format!("m{i}")), "call", None));
            values.push(result(&format!("t{i}"), 1_000));
        }
        values.push(answer(Some("m6"), "done", None));
        let entries: Vec<Entry> = values
            .into_iter()
            .enumerate()
            .map(|(seq, v)| entry(seq, v))
            .collect();
        let mut economics = EconomicsFold::new(0, Some(opts));
        let marked: Vec<usize> = entries
            .iter()
            .enumerate()
            .filter(|(_, e)| economics.push(e).markers.contains(&MarkerKind::Clearing))
            .map(|(seq, _)| seq)
            .collect();
        // Results at seqs 2, 4, 6, 8, 10, 12; the fourth (seq 8) passes 750; the next
        // response is at seq 9. Then 1,000 again only at the seventh: none.
        assert_eq!(marked, vec![9]);
        let mut off = EconomicsFold::new(0, None);
        assert!(entries.iter().all(|e| off.push(e).markers.is_empty()));
    }

    #[test]
    fn labels_are_clipped() {
        let mut long = answer(Some("a"), "x", None);
        long["timestamp"] = json!("9".repeat(10_000));
        long["message"]["model"] = json!("m".repeat(10_000));
        let point = EconomicsFold::new(0, None)
            .push(&entry(0, long))
            .point
            .unwrap();
        assert_eq!(point.timestamp.unwrap().len(), MAX_LABEL_CHARS);
        assert_eq!(point.model.unwrap().len(), MAX_LABEL_CHARS);
    }
}
