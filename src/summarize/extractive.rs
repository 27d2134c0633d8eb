//! The default summarizer: deterministic, offline, no model.
//!
//! It picks, in this priority:
//! 1. the user's own words (non-meta user prompts, near verbatim: whitespace squashed,
//!    `<system-reminder>`s removed). Of these, the **first** prompt (the primary request) and then
//!    the **most recent** ones, going backwards, are kept longest when the budget is short;
//! 2. errors (tool results with `is_error`, error-looking lines of other results) and assistant
//!    sentences that record a decision or a cause ("instead", "because", "root cause", …);
//! 3. tool calls, described as `Read(src/main.rs) → 1.2 KB`.
//!
//! Allocation is in three passes over a byte budget: first every item gets a short form (so an
//! item is shortened before it is dropped), then items grow in priority order, then whatever is
//! left goes to the previous summary. Cuts land on word boundaries; the output never exceeds
//! `max_bytes`. Custom instructions are ignored (there is no model to follow them).
//!
//! Layout, [`Purpose::Compaction`]:
//! ```text
//! Earlier summary:
//! …
//!
//! User requests:
//! - …
//!
//! Decisions and errors:
//! - error: Bash(cargo test) failed: …
//! - assistant: …
//!
//! Tool activity:
//! - Read(src/main.rs) → 1.2 KB
//!
//! Where it stopped:
//! …
//! ```
//! [`Purpose::Line`]: `earlier: …; user: …; user: …; error: …; assistant: …; tool: Read(a), Bash(b)`.
//! A Line whose whole source fits `max_bytes` is the source itself (see
//! [`render::verbatim_line`]).
//!
//! [`Purpose::Merge`] (two summary-tree lines into their parent's): `left; right`. When that fits
//! `max_bytes` it is [`super::merge_verbatim`], both lines whole. Otherwise each line gets a share
//! of the budget (after the `; `): at least a fair half when both are long, so two long lines get
//! half each, and a line shorter than half is kept whole and its leftover goes to the other line.
//! Each is cut to its share on a word boundary (bytes a cut leaves unused go to the other line),
//! so the heads of both lines are kept, in order. Deterministic; never empty when a line is not.

use async_trait::async_trait;

use super::render::{self, Part, Speaker};
use super::text::{collapse_blank_lines, cut_words, human_bytes, squash};
use super::{Purpose, SummarizeError, Summarizer, Summary, SummaryRequest};

/// The deterministic summarizer; also the fallback of the model backends.
#[derive(Debug, Clone, Copy, Default)]
pub struct ExtractiveSummarizer;

impl ExtractiveSummarizer {
    pub fn new() -> Self {
        ExtractiveSummarizer
    }

    /// The summary, synchronously (it never fails and makes no calls). A `Merge` whose lines fit
    /// side by side is the free node, [`super::merge_verbatim`], named `verbatim` as from every
    /// backend.
    pub fn summarize_now(&self, req: &SummaryRequest) -> Summary {
        if req.purpose == Purpose::Merge {
            if let Some(line) = super::merge_free(req) {
                return Summary {
                    text: line,
                    summarizer: "verbatim".to_string(),
                    calls: 0,
                };
            }
        }
        Summary {
            text: extract(req),
            summarizer: "extractive".to_string(),
            calls: 0,
        }
    }
}

#[async_trait]
impl Summarizer for ExtractiveSummarizer {
    fn name(&self) -> String {
        "extractive".to_string()
    }

    async fn summarize(&self, req: &SummaryRequest) -> Result<Summary, SummarizeError> {
        crate::metrics::summarizer_call("extractive");
        Ok(self.summarize_now(req))
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Section {
    Earlier = 0,
    User = 1,
    Notes = 2,
    Tools = 3,
    Stopped = 4,
}

const SECTIONS: [Section; 5] = [
    Section::Earlier,
    Section::User,
    Section::Notes,
    Section::Tools,
    Section::Stopped,
];

/// How an item is labelled in a line, and in the notes of a compaction summary.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Tag {
    Earlier,
    User,
    Error,
    Assistant,
    Tool,
    Stopped,
}

impl Tag {
    fn as_str(self) -> &'static str {
        match self {
            Tag::Earlier => "earlier",
            Tag::User => "user",
            Tag::Error => "error",
            Tag::Assistant => "assistant",
            Tag::Tool => "tool",
            Tag::Stopped => "stopped",
        }
    }
}

#[derive(Debug)]
struct Item {
    section: Section,
    tag: Tag,
    text: String,
    /// Order of the first pass (short forms).
    rank1: usize,
    /// Order of the second pass (growth up to `cap2`).
    rank2: usize,
    cap2: usize,
}

const DECISION_WORDS: &[&str] = &[
    "decid",
    "decision",
    "instead",
    "switch to",
    "switched to",
    "chose",
    "choose",
    "root cause",
    "because",
    "the fix",
    "fixed",
    "will use",
    "we'll use",
    "i'll use",
    "going with",
    "plan:",
    "must ",
    "should ",
    "won't",
    "will not",
    "do not",
    "don't",
    "never ",
    "agreed",
    "conclusion",
    "turns out",
    "the problem",
    "the issue",
    "caused by",
];

const ERROR_WORDS: &[&str] = &[
    "error",
    "failed",
    "failure",
    "panic",
    "exception",
    "traceback",
    "fatal",
    "not found",
    "denied",
    "cannot ",
    "can't ",
    "unable to",
    "refused",
    "timed out",
];

/// `0 failed`, `0 errors`, `no errors`: success lines that mention failure words.
fn is_zero_count(lower: &str) -> bool {
    for word in ["failed", "errors", "error", "failures"] {
        for pat in [format!(" 0 {word}"), format!("no {word}")] {
            if lower.contains(&pat) || lower.starts_with(pat.trim_start()) {
                return true;
            }
        }
    }
    lower.contains("without error")
}

pub(crate) fn looks_like_error(line: &str) -> bool {
    let lower = line.to_lowercase();
    ERROR_WORDS.iter().any(|w| lower.contains(w)) && !is_zero_count(&lower)
}

fn looks_like_decision(sentence: &str) -> bool {
    let lower = sentence.to_lowercase();
    DECISION_WORDS.iter().any(|w| lower.contains(w))
}

/// Splits text into sentences: at line breaks and after `.`, `!`, `?` followed by whitespace.
fn sentences(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for line in text.lines() {
        let mut start = 0;
        let mut chars = line.char_indices().peekable();
        while let Some((i, c)) = chars.next() {
            if matches!(c, '.' | '!' | '?') {
                if let Some(&(j, next)) = chars.peek() {
                    if next.is_whitespace() {
                        out.push(line[start..=i].trim().to_string());
                        start = j;
                    }
                }
            }
        }
        out.push(line[start..].trim().to_string());
    }
    out.retain(|s| s.len() >= 12);
    out
}

/// The decision and error sentences of an assistant text (at most 4).
fn notable_sentences(text: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for s in sentences(text) {
        let lower = s.to_lowercase();
        if is_narration(&lower) {
            continue;
        }
        if (looks_like_decision(&s) || looks_like_error(&s)) && !out.contains(&s) {
            out.push(cut_words(&squash(&s), 240));
        }
        if out.len() == 4 {
            break;
        }
    }
    out
}

/// An assistant reply without its "let me …" narration, on one line.
fn sentences_text(text: &str) -> String {
    let kept: Vec<String> = text
        .lines()
        .flat_map(|line| {
            let mut parts = Vec::new();
            let mut start = 0;
            for (i, c) in line.char_indices() {
                if matches!(c, '.' | '!' | '?') && line[i + 1..].starts_with(char::is_whitespace) {
                    parts.push(&line[start..=i]);
                    start = i + 1;
                }
            }
            parts.push(&line[start..]);
            parts
        })
        .map(str::trim)
        .filter(|s| !s.is_empty() && !is_narration(s))
        .map(str::to_string)
        .collect();
    squash(&kept.join(" "))
}

fn is_narration(sentence: &str) -> bool {
    let lower = sentence.to_lowercase();
    [
        "let me ",
        "now let me ",
        "i'll now ",
        "let's look",
        "let's check",
    ]
    .iter()
    .any(|p| lower.starts_with(p))
}

const CONTINUATION_PREAMBLE: &str = "This session is being continued from a previous conversation that ran out of context. The summary below covers the earlier portion of the conversation.";

fn earlier_text(text: &str, purpose: Purpose) -> String {
    let text = text.trim();
    let text = text.strip_prefix(CONTINUATION_PREAMBLE).unwrap_or(text);
    match purpose {
        Purpose::Compaction => collapse_blank_lines(text),
        Purpose::Line | Purpose::Merge => squash(text),
    }
}

/// What the entries say, sorted by kind, before any ranking.
#[derive(Default)]
struct Gathered {
    /// Earlier summaries: the request's previous one, then any in the entries.
    earlier: Vec<String>,
    /// The user's words, in order.
    users: Vec<String>,
    /// Errors and the assistant's decisions, in order.
    notes: Vec<Note>,
    /// Tool calls, deduplicated with a count, in order of first appearance.
    tools: Vec<(String, usize)>,
    /// The assistant's last words.
    stopped: Option<String>,
}

struct Note {
    tag: Tag,
    text: String,
    /// An assistant reply kept only for a line, with no decision or other notable sentence in
    /// it: the first thing to give up.
    weak: bool,
}

fn gather(req: &SummaryRequest) -> Gathered {
    let purpose = req.purpose;
    let turns = render::turns(&req.entries);
    let mut gathered = Gathered::default();
    let mut orphan_results: Vec<String> = Vec::new();

    let push_earlier = |earlier: &mut Vec<String>, text: &str| {
        let t = earlier_text(text, purpose);
        if !t.is_empty() {
            earlier.push(t);
        }
    };
    if let Some(prev) = &req.previous_summary {
        push_earlier(&mut gathered.earlier, prev);
    }
    for turn in &turns.turns {
        match turn.speaker {
            Speaker::EarlierSummary => push_earlier(&mut gathered.earlier, &turn.text()),
            Speaker::User => {
                let t = squash(&turn.text());
                if !t.is_empty() {
                    gathered.users.push(t);
                }
                for part in &turn.parts {
                    let Part::ToolResult {
                        tool,
                        is_error,
                        text,
                    } = part
                    else {
                        continue;
                    };
                    let desc = tool
                        .map(|i| turns.tools[i].description.clone())
                        .unwrap_or_else(|| "tool".to_string());
                    let line = if *is_error {
                        let head: Vec<&str> = text
                            .lines()
                            .filter(|l| !l.trim().is_empty())
                            .take(3)
                            .collect();
                        Some(format!("{desc} failed: {}", squash(&head.join(" "))))
                    } else {
                        text.lines()
                            .find(|l| looks_like_error(l))
                            .map(|l| format!("{desc}: {}", squash(l)))
                    };
                    if tool.is_none() && !*is_error && line.is_none() {
                        // The call is not among the entries: describe the result itself.
                        let head = cut_words(&squash(text), 60);
                        orphan_results.push(if head.is_empty() {
                            "tool result (empty)".to_string()
                        } else {
                            format!("tool result ({}): {head}", human_bytes(text.len()))
                        });
                    }
                    if let Some(line) = line {
                        gathered.notes.push(Note {
                            tag: Tag::Error,
                            text: cut_words(&line, 300),
                            weak: false,
                        });
                    }
                }
            }
            Speaker::Assistant => {
                let text = turn.text();
                if text.trim().is_empty() {
                    continue;
                }
                let notable = notable_sentences(&text);
                if !notable.is_empty() {
                    gathered.notes.push(Note {
                        tag: Tag::Assistant,
                        text: notable.join(" "),
                        weak: false,
                    });
                } else if purpose == Purpose::Line {
                    let reply = sentences_text(&text);
                    if !reply.is_empty() {
                        gathered.notes.push(Note {
                            tag: Tag::Assistant,
                            text: reply,
                            weak: true,
                        });
                    }
                }
                gathered.stopped = Some(collapse_blank_lines(&text));
            }
            Speaker::Context | Speaker::Attachment | Speaker::CommandOutput => {}
        }
    }

    gathered.tools = orphan_results.into_iter().map(|r| (r, 1)).collect();
    for call in &turns.tools {
        let d = match (purpose, call.is_error, call.result_bytes) {
            (_, true, _) if purpose == Purpose::Line => format!("{} failed", call.description),
            (_, true, _) => format!("{} → error", call.description),
            (Purpose::Compaction, false, Some(n)) => {
                format!("{} → {}", call.description, human_bytes(n))
            }
            _ => call.description.clone(),
        };
        match gathered.tools.iter_mut().find(|(t, _)| *t == d) {
            Some((_, n)) => *n += 1,
            None => gathered.tools.push((d, 1)),
        }
    }
    gathered
}

// Ranks order the two passes of `allocate` (lower goes first). Pass 1 gives short forms in
// sequence order (1, 2, 3, ...); these tiers put whole groups after that sequence.
/// Pass 2: the users' words grow early (only a compaction's earlier summary, at 0, comes
/// before them), the first request then the latest backwards.
const USER_GROWTH: usize = 10;
/// Pass 2: where a compaction stopped grows right after the users' words.
const STOPPED_GROWTH: usize = 500;
/// Pass 2: a line's previous summary grows after where it stopped.
const EARLIER_LINE_GROWTH: usize = 900;
/// Pass 2: errors and decisions grow after that, in their pass-1 order.
const NOTE_GROWTH: usize = 1_000;
/// Both passes: tool activity comes after every note.
const TOOL_TIER: usize = 10_000;
/// Pass 1: where a compaction stopped gets its short form after the tools.
const STOPPED_SHORT: usize = 50_000;
/// Both passes: weak notes (a line's plain replies) come last.
const WEAK_NOTE_TIER: usize = 100_000;

/// Orders what was gathered for `allocate`. Pass-1 ranks: earlier (compaction) → first user →
/// latest users backwards → errors (latest first) → decisions (latest first) → tools → where
/// it stopped.
fn rank(gathered: Gathered, purpose: Purpose, budget: usize) -> Vec<Item> {
    let line = purpose == Purpose::Line;
    let mut items: Vec<Item> = Vec::new();
    let mut rank = 0usize;
    let mut next = || {
        rank += 1;
        rank
    };
    let earlier_first = items.len();
    for e in gathered.earlier {
        items.push(Item {
            section: Section::Earlier,
            tag: Tag::Earlier,
            text: e,
            rank1: 0,
            rank2: if line { EARLIER_LINE_GROWTH } else { 0 },
            cap2: if line { budget / 4 } else { budget * 2 / 5 },
        });
    }
    let n_users = gathered.users.len();
    let user_order: Vec<usize> = (0..n_users).take(1).chain((1..n_users).rev()).collect();
    let first_user_item = items.len();
    for u in gathered.users {
        items.push(Item {
            section: Section::User,
            tag: Tag::User,
            text: u,
            rank1: 0,
            rank2: 0,
            cap2: usize::MAX,
        });
    }
    for (k, &u) in user_order.iter().enumerate() {
        let r = next();
        items[first_user_item + u].rank1 = r;
        items[first_user_item + u].rank2 = USER_GROWTH + k;
    }
    // A line gives the previous summary a short form right after the user's words.
    if line {
        let r = next();
        for item in &mut items[earlier_first..first_user_item] {
            item.rank1 = r;
        }
    }
    // Notes, chronological; ranks latest first, errors before decisions.
    let first_note = items.len();
    let weak: Vec<bool> = gathered.notes.iter().map(|note| note.weak).collect();
    for note in gathered.notes {
        items.push(Item {
            section: Section::Notes,
            tag: note.tag,
            text: note.text,
            rank1: 0,
            rank2: 0,
            cap2: usize::MAX,
        });
    }
    let note_items: Vec<usize> = (first_note..items.len()).collect();
    let is_weak = |i: usize| weak[i - first_note];
    for pass_errors in [true, false] {
        for &i in note_items.iter().rev() {
            if (items[i].tag == Tag::Error) == pass_errors && !is_weak(i) {
                items[i].rank1 = next();
                items[i].rank2 = NOTE_GROWTH + items[i].rank1;
            }
        }
    }
    for &i in note_items.iter().rev() {
        if is_weak(i) {
            items[i].rank1 = next() + WEAK_NOTE_TIER;
            items[i].rank2 = WEAK_NOTE_TIER + items[i].rank1;
        }
    }
    for (t, n) in gathered.tools {
        let text = if n > 1 { format!("{t} ×{n}") } else { t };
        let r = next();
        items.push(Item {
            section: Section::Tools,
            tag: Tag::Tool,
            text,
            rank1: TOOL_TIER + r,
            rank2: TOOL_TIER + r,
            cap2: usize::MAX,
        });
    }
    if !line {
        if let Some(s) = gathered.stopped {
            items.push(Item {
                section: Section::Stopped,
                tag: Tag::Stopped,
                text: s,
                rank1: STOPPED_SHORT,
                rank2: STOPPED_GROWTH,
                cap2: 800,
            });
        }
    }
    items
}

/// Fixed bytes of a section (header and separators), charged when its first item is included.
fn section_cost(purpose: Purpose, section: Section) -> usize {
    match purpose {
        Purpose::Compaction => header(section).len() + 1 + 2,
        Purpose::Line | Purpose::Merge => match section {
            Section::Tools => "tool: ".len() + 2,
            _ => 0,
        },
    }
}

/// Fixed bytes per included item.
fn item_cost(purpose: Purpose, item: &Item) -> usize {
    match (purpose, item.section) {
        (Purpose::Compaction, Section::Earlier | Section::Stopped) => 1,
        (Purpose::Compaction, Section::User | Section::Tools) => 3,
        (Purpose::Compaction, _) => 3 + item.tag.as_str().len() + 2,
        (Purpose::Line | Purpose::Merge, Section::Tools) => 2,
        (Purpose::Line | Purpose::Merge, _) => item.tag.as_str().len() + 2 + 2,
    }
}

fn header(section: Section) -> &'static str {
    match section {
        Section::Earlier => "Earlier summary:",
        Section::User => "User requests:",
        Section::Notes => "Decisions and errors:",
        Section::Tools => "Tool activity:",
        Section::Stopped => "Where it stopped:",
    }
}

/// Bytes per item in the first pass.
fn short_len(purpose: Purpose) -> usize {
    match purpose {
        Purpose::Compaction => 120,
        Purpose::Line | Purpose::Merge => 48,
    }
}

/// Items smaller than this are not worth including cut.
const MIN_ITEM: usize = 12;

fn allocate(purpose: Purpose, items: &[Item], budget: usize) -> Vec<usize> {
    let n = items.len();
    let mut alloc = vec![0usize; n];
    let mut open = [false; 5];
    let mut remaining = budget;
    let mut grow = |i: usize, target: usize, alloc: &mut Vec<usize>| {
        let item = &items[i];
        let full = item.text.len();
        // A tool description is kept whole or not at all (`Edit(src/tok` helps nobody).
        let atomic = item.section == Section::Tools;
        let target = if atomic { full } else { target.min(full) };
        if alloc[i] >= target {
            return;
        }
        let fixed = if alloc[i] == 0 {
            item_cost(purpose, item)
                + if open[item.section as usize] {
                    0
                } else {
                    section_cost(purpose, item.section)
                }
        } else {
            0
        };
        if remaining <= fixed {
            return;
        }
        let give = (target - alloc[i]).min(remaining - fixed);
        if atomic && give < target - alloc[i] {
            return;
        }
        if alloc[i] == 0 && give < MIN_ITEM.min(full) {
            return;
        }
        open[item.section as usize] = true;
        remaining -= fixed + give;
        alloc[i] += give;
    };
    let mut order1: Vec<usize> = (0..n).collect();
    order1.sort_by_key(|&i| (items[i].rank1, i));
    let mut order2: Vec<usize> = (0..n).collect();
    order2.sort_by_key(|&i| (items[i].rank2, i));
    // Short forms shrink when there are many items, so that more of them are kept.
    let short = (budget / n.max(1)).clamp(2 * MIN_ITEM, short_len(purpose));
    for &i in &order1 {
        grow(i, short, &mut alloc);
    }
    for &i in &order2 {
        grow(i, items[i].cap2, &mut alloc);
    }
    for &i in &order2 {
        grow(i, usize::MAX, &mut alloc);
    }
    alloc
}

fn fit(text: &str, alloc: usize) -> String {
    if text.len() <= alloc {
        text.to_string()
    } else {
        cut_words(text, alloc)
    }
}

/// Splits `budget` bytes between items of lengths `lens`: in order of length, shortest first,
/// each gets at most its fair share of what is left (what is left over the items still to serve),
/// so an item shorter than its share is kept whole and its leftover goes to the longer ones.
/// For two items: a line shorter than half the budget is kept whole, the other gets the rest; two
/// long lines get half each.
fn fair_shares(lens: &[usize], budget: usize) -> Vec<usize> {
    let mut order: Vec<usize> = (0..lens.len()).collect();
    order.sort_by_key(|&i| (lens[i], i));
    let mut shares = vec![0; lens.len()];
    let mut remaining = budget;
    for (served, &i) in order.iter().enumerate() {
        let fair = remaining / (lens.len() - served);
        shares[i] = lens[i].min(fair);
        remaining -= shares[i];
    }
    shares
}

/// The extractive answer to a `Merge` request: one line, never longer than `req.max_bytes`,
/// never empty when a line is not (and `max_bytes` holds a character).
fn merge(req: &SummaryRequest) -> String {
    if let Some(line) = super::merge_free(req) {
        return line;
    }
    const SEP: &str = "; ";
    let max = req.max_bytes;
    let lines: Vec<String> = super::merge_lines(req)
        .into_iter()
        .filter(|l| !l.is_empty())
        .collect();
    let Some(first) = lines.first() else {
        return String::new();
    };
    let seps = SEP.len() * (lines.len() - 1);
    let out = if max <= seps + lines.len() * MIN_ITEM {
        // No room for a share each: the head of the first line (or of the join).
        cut_words(&lines.join(SEP), max)
    } else {
        let budget = max - seps;
        let lens: Vec<usize> = lines.iter().map(String::len).collect();
        let shares = fair_shares(&lens, budget);
        let mut cut: Vec<String> = lines
            .iter()
            .zip(&shares)
            .map(|(l, &share)| fit(l, share))
            .collect();
        // A cut on a word boundary can leave bytes unused: give them, in order, to the lines
        // that were cut.
        for i in 0..lines.len() {
            if cut[i].len() < lines[i].len() {
                let others: usize = (0..lines.len())
                    .filter(|&j| j != i)
                    .map(|j| cut[j].len())
                    .sum();
                let more = fit(&lines[i], budget - others);
                if more.len() > cut[i].len() {
                    cut[i] = more;
                }
            }
        }
        cut.retain(|c| !c.is_empty());
        cut.join(SEP)
    };
    if out.len() > max {
        // Not expected (the shares add up to the budget), but the bound is a promise.
        tracing::warn!(len = out.len(), max, "extractive merge over budget");
        return cut_words(&out, max);
    }
    if out.is_empty() {
        // A budget smaller than a word: whatever bytes fit.
        return super::text::cut_bytes(first, max).to_string();
    }
    out
}

/// The extractive summary text; never longer than `req.max_bytes`.
pub fn extract(req: &SummaryRequest) -> String {
    if req.purpose == Purpose::Merge {
        return merge(req);
    }
    if req.purpose == Purpose::Line && req.previous_summary.is_none() {
        if let Some(line) = render::verbatim_line(&req.entries, req.max_bytes) {
            return line;
        }
    }
    let items = rank(gather(req), req.purpose, req.max_bytes);
    let alloc = allocate(req.purpose, &items, req.max_bytes);
    let kept = |section: Section| {
        items
            .iter()
            .zip(&alloc)
            .filter(move |(item, &a)| item.section == section && a > 0)
            .map(|(item, &a)| (item, fit(&item.text, a)))
            .filter(|(_, t)| !t.is_empty())
    };
    let out = match req.purpose {
        Purpose::Compaction => {
            let mut sections: Vec<String> = Vec::new();
            for section in SECTIONS {
                let body: Vec<String> = kept(section)
                    .map(|(item, t)| match section {
                        Section::Earlier | Section::Stopped => t,
                        Section::User | Section::Tools => format!("- {t}"),
                        _ => format!("- {}: {t}", item.tag.as_str()),
                    })
                    .collect();
                if !body.is_empty() {
                    sections.push(format!("{}\n{}", header(section), body.join("\n")));
                }
            }
            sections.join("\n\n")
        }
        Purpose::Line | Purpose::Merge => {
            let mut parts: Vec<String> = Vec::new();
            for section in SECTIONS {
                if section == Section::Tools {
                    let tools: Vec<String> = kept(section).map(|(_, t)| t).collect();
                    if !tools.is_empty() {
                        parts.push(format!("tool: {}", tools.join(", ")));
                    }
                } else {
                    parts.extend(
                        kept(section).map(|(item, t)| format!("{}: {t}", item.tag.as_str())),
                    );
                }
            }
            parts.join("; ")
        }
    };
    if out.len() > req.max_bytes {
        // Not expected (allocation counts every byte), but the bound is a promise.
        tracing::warn!(
            len = out.len(),
            max = req.max_bytes,
            "extractive summary over budget"
        );
        return cut_words(&out, req.max_bytes);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fair_shares_keep_a_short_line_whole_and_halve_two_long_ones() {
        assert_eq!(fair_shares(&[10, 500], 100), vec![10, 90]);
        assert_eq!(fair_shares(&[500, 10], 100), vec![90, 10]);
        assert_eq!(fair_shares(&[300, 500], 100), vec![50, 50]);
        assert_eq!(fair_shares(&[60, 500], 100), vec![50, 50]);
        assert_eq!(fair_shares(&[60, 500], 101), vec![50, 51]);
        assert_eq!(fair_shares(&[5, 10, 500], 99), vec![5, 10, 84]);
        for budget in 0..200 {
            let s = fair_shares(&[70, 130], budget);
            assert!(s.iter().sum::<usize>() <= budget);
        }
    }

    fn merged(left: &str, right: &str, max: usize) -> String {
        merge(&SummaryRequest::merge(left.into(), right.into(), max))
    }

    #[test]
    fn merge_fits_the_budget_on_one_line() {
        let left = "user: fix the failing parser test in src/parser.rs and keep the public API \
                    unchanged; error: cargo test failed with mismatched types";
        let right = "assistant: the root cause is the tokenizer returning a &str instead of a \
                     String\nso it now returns an owned String; tool: Edit(src/tokenizer.rs)";
        for max in 0..=left.len() + right.len() + 4 {
            let out = merged(left, right, max);
            assert!(out.len() <= max, "{max}: {out:?}");
            assert!(!out.contains('\n'), "{max}: {out:?}");
            if max > 0 {
                assert!(!out.is_empty(), "{max}");
            }
            assert_eq!(out, merged(left, right, max), "deterministic");
        }
        let out = merged(left, right, 100);
        assert!(out.starts_with("user: fix the failing"), "{out}");
        assert!(out.contains("; assistant: the root cause"), "{out}");
    }

    #[test]
    fn merge_gives_a_short_line_whole_and_the_rest_to_the_long_one() {
        let long = "word ".repeat(100);
        let out = merged("user: price stays at 49", &long, 80);
        assert!(
            out.starts_with("user: price stays at 49; word word"),
            "{out}"
        );
        assert!(out.len() <= 80 && out.len() >= 70, "{} {out}", out.len());
        let out = merged(&long, "user: price stays at 49", 80);
        assert!(out.ends_with("; user: price stays at 49"), "{out}");
    }
}
