//! The tree job: writes the summary-tree nodes whose sources exist, then advances the outline.
//!
//! One job per thread at a time is pending (the key is dropped when a run starts, so appends
//! made during the run queue the next one). A run builds, in order, every missing level-0 line
//! and every parent whose two children exist; each node is its own write (write-once), so a
//! failed run is retried from where it stopped and a duplicate run writes nothing new. No
//! transaction is open across a summarizer call.
//!
//! Then the outline moves: when the tail is over its token budget, whole rounds move into the
//! outline (an epoch), and when the lines are over their byte budget, the most overdue sibling
//! pairs whose parent exists merge in one batch down to half the budget. The new state is
//! stored by compare-and-set, so a concurrent run cannot lose a change.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};

use serde_json::{json, Value};

use super::{Clock, JobError, Runner};
use crate::history::anchors::{anchors_in_text, anchors_of_entry, kept_in, Anchor};
use crate::history::group_rounds;
use crate::history::is_sent_to_model;
use crate::history::ledger::{add_counts, encode_counts};
use crate::history::model::Content;
use crate::history::model::{Entry, EntryKind};
use crate::history::normalize::clearing::{lower_to_cleared, StoredResults};
use crate::history::normalize::tokens::block_tokens;
use crate::history::normalize::{estimate_entry_tokens, ClearingOptions};
use crate::store::{ClaimedJob, LevelLine, NewNode, Store, StoreError, ThreadKey};
use crate::summarize::text::{cut_words, squash};
use crate::summarize::{merge_verbatim, render, Purpose, SummaryRequest};
use crate::tree::{advance, line_size, next_boundary, NodeId, Outline, OutlineOptions, Tail};

/// Entries read at a time while building level 0 or profiling the tail.
const CHUNK: u64 = 1024;

/// Lines of the outline before a node that its summarizer reads (at most, and within
/// [`CONTEXT_BYTES`]): what came just before, so the line does not repeat it. A hidden line
/// reaches as far ([`crate::store::LINE_CONTEXT_LINES`]).
const CONTEXT_LINES: u64 = crate::store::LINE_CONTEXT_LINES as u64;
const CONTEXT_BYTES: usize = 4096;

/// The lines of one level just before the node being written, oldest first: kept as the run
/// goes, and completed from the store (the lines before the run's first node) the first time a
/// summarizer needs them.
#[derive(Debug, Default)]
struct LineContext {
    lines: VecDeque<String>,
    loaded: bool,
}

impl LineContext {
    fn push(&mut self, text: &str) {
        if text.trim().is_empty() {
            return;
        }
        self.lines.push_back(text.to_owned());
        self.trim();
    }

    fn trim(&mut self) {
        while self.lines.len() as u64 > CONTEXT_LINES
            || self.lines.iter().map(String::len).sum::<usize>() > CONTEXT_BYTES
        {
            self.lines.pop_front();
        }
    }

    /// The context, after loading the lines of `level` before index `start` (the run's first)
    /// once.
    async fn lines(
        &mut self,
        runner: &Runner,
        thread_key: &ThreadKey,
        level: u32,
        start: u64,
    ) -> Result<Vec<String>, JobError> {
        if !self.loaded {
            self.loaded = true;
            let from = start.saturating_sub(CONTEXT_LINES);
            let mut before: Vec<(u64, String)> = runner
                .store
                .tree_level_texts(thread_key, level, from, start)
                .await?
                .into_iter()
                .collect();
            before.sort_unstable_by_key(|(index, _)| *index);
            let run = std::mem::take(&mut self.lines);
            for (_, text) in before {
                self.push(&text);
            }
            for text in run {
                self.push(&text);
            }
        }
        Ok(self.lines.iter().cloned().collect())
    }
}

/// Times a run starts over because a snip hid lines while it read, before it fails (and is
/// retried later).
const MAX_RESTARTS: u32 = 5;

/// What a run read before its sources: the thread's redaction epoch (checked again where nodes
/// are written) and the uuids its snips hide.
struct Sources {
    epoch: i64,
    snipped: HashSet<String>,
}

/// What a run did.
#[derive(Debug, Default)]
struct Progress {
    written: u64,
    calls: u64,
}

/// A level-0 line's text when it needs no summarizer (a free node): the rendered turn when it
/// fits `line_bytes`; a gist of the thinking for a thinking-only response; nothing (an empty
/// text: no line of its own) for an entry the model never sees. `None` otherwise.
pub fn free_leaf_text(entry: &Entry, line_bytes: usize) -> Option<String> {
    if !is_sent_to_model(entry) {
        return Some(String::new());
    }
    let source = squash(&render::transcript_items(std::slice::from_ref(entry)).join("; "));
    if source.is_empty() {
        return Some(
            thinking_gist(entry, line_bytes)
                .unwrap_or_else(|| format!("({}: no content)", entry.kind.as_str())),
        );
    }
    (source.len() <= line_bytes).then_some(source)
}

/// `assistant (thinking): …`, the head of a response's thinking cut at a word boundary to a
/// quarter of the line: what the response was about, not the reasoning (zoom has it whole).
fn thinking_gist(entry: &Entry, line_bytes: usize) -> Option<String> {
    let Content::Blocks(blocks) = &entry.message.as_ref()?.content else {
        return None;
    };
    let mut thinking = String::new();
    let mut redacted = false;
    for block in blocks {
        match block.get("type").and_then(Value::as_str) {
            Some("thinking") => {
                let text = block.get("thinking").and_then(Value::as_str).unwrap_or("");
                thinking.push_str(text);
                thinking.push(' ');
            }
            Some("redacted_thinking") => redacted = true,
            _ => {}
        }
    }
    let thinking = squash(&thinking);
    if thinking.is_empty() {
        return redacted.then(|| "assistant: [redacted thinking]".to_owned());
    }
    const TAG: &str = "assistant (thinking): ";
    let room = (line_bytes / 4).max(TAG.len() + 16) - TAG.len();
    Some(format!("{TAG}{}", cut_words(&thinking, room)))
}

/// Hides the level-0 lines at `seqs` and rebuilds the lines above them without a model.
async fn hide_leaves(
    store: &Store,
    thread_key: &ThreadKey,
    seqs: &[u64],
    options: &OutlineOptions,
) -> Result<u64, StoreError> {
    store
        .hide_in_tree(thread_key, seqs, &LineStandIns::new(options))
        .await
}

/// Lines rebuilt without a model, `line_bytes` long at most.
pub struct LineStandIns {
    line_bytes: usize,
}

impl LineStandIns {
    pub fn new(options: &OutlineOptions) -> Self {
        LineStandIns {
            line_bytes: options.line_bytes.max(OutlineOptions::MIN_LINE_BYTES),
        }
    }
}

impl crate::store::StandIns for LineStandIns {
    fn merge(&self, left: &str, right: &str) -> String {
        stand_in_line(left, right, self.line_bytes)
    }

    fn leaf(&self, entry: &Entry) -> String {
        free_leaf_text(entry, self.line_bytes).unwrap_or_else(|| {
            crate::summarize::extract_without_model(&SummaryRequest::new(
                vec![entry.clone()],
                Purpose::Line,
                self.line_bytes,
            ))
        })
    }
}

/// A parent's line built without a model from its children's: both word for word when they
/// fit the line, else the extractive summarizer's merge of the two.
pub fn stand_in_line(left: &str, right: &str, line_bytes: usize) -> String {
    merge_verbatim(left, right, line_bytes).unwrap_or_else(|| {
        crate::summarize::extract_without_model(&SummaryRequest::merge(
            left.to_owned(),
            right.to_owned(),
            line_bytes,
        ))
    })
}

/// Finds where rounds start in a run of entries read chunk by chunk: each chunk is grouped with
/// the last assistant seen before it in front, so a round spanning chunks is seen whole. The
/// run's first entry is taken as a round start by the caller.
#[derive(Debug, Default)]
pub struct RoundScanner {
    last_assistant: Option<Entry>,
}

impl RoundScanner {
    /// The seqs of the rounds that start in `chunk` (not counting the run's first entry).
    pub fn scan(&mut self, chunk: Vec<Entry>) -> Vec<u64> {
        let carried = usize::from(self.last_assistant.is_some());
        let mut grouped: Vec<Entry> = self.last_assistant.clone().into_iter().collect();
        grouped.extend(chunk);
        // The round at index 0 is never new here: it is the carried assistant's, or, before any
        // assistant, the round the run started with (the first assistant continues it).
        let starts = group_rounds(&grouped)
            .into_iter()
            .filter(|round| round.first_index >= 1)
            .map(|round| round.first_seq as u64)
            .collect();
        // A chunk without an assistant keeps the one carried from before.
        if let Some(latest) = grouped
            .into_iter()
            .skip(carried)
            .rev()
            .find(|entry| entry.kind == EntryKind::Assistant)
        {
            self.last_assistant = Some(latest);
        }
        starts
    }
}

impl Runner {
    pub(super) async fn run_tree(
        &self,
        claimed: &ClaimedJob,
        clock: Clock,
    ) -> Result<Value, JobError> {
        let thread_key = claimed
            .job
            .thread_key
            .clone()
            .ok_or_else(|| JobError::Invalid("a tree job names no thread".to_owned()))?;
        let mut progress = Progress::default();
        let mut next_seq = None;
        let mut outline_version = 0;
        let mut restarts = 0;
        loop {
            let options = self
                .store
                .outline_options_of(&thread_key)
                .await?
                .unwrap_or_default();
            if !options.enabled {
                break;
            }
            let t = self.store.next_seq_by_key(&thread_key).await?.max(0) as u64;
            if next_seq == Some(t) {
                break;
            }
            // What the run may show: read before its sources, and checked again where it writes.
            let sources = Sources {
                epoch: self.store.redaction_epoch(&thread_key).await?,
                snipped: self.store.thread_snipped_uuids(&thread_key).await?,
            };
            // A snip whose redaction never ran (the process stopped after its append) is
            // applied here: its lines go before anything else is built.
            let named: Vec<String> = sources.snipped.iter().cloned().collect();
            let seqs = self.store.seqs_of_uuids(&thread_key, &named).await?;
            let shown = self.store.shown_leaves(&thread_key, &seqs).await?;
            if !shown.is_empty() {
                hide_leaves(&self.store, &thread_key, &shown, &options).await?;
                next_seq = None;
                continue;
            }
            let built = match self
                .build_nodes(&thread_key, t, &options, &sources, &mut progress)
                .await
            {
                Ok(()) => {
                    self.replace_stand_ins(&thread_key, &options, &sources, &mut progress)
                        .await
                }
                error => error,
            };
            match built {
                // A snip hid lines while the run read: it reads again, hiding them too.
                Err(JobError::Store(StoreError::SourcesChanged)) if restarts < MAX_RESTARTS => {
                    restarts += 1;
                    next_seq = None;
                    continue;
                }
                other => other?,
            }
            outline_version = self.advance_outline(&thread_key, t, &options).await?;
            // Appends made during the run are built before the job reports done.
            next_seq = Some(t);
        }
        let result = json!({
            "nodes_written": progress.written,
            "summarizer_calls": progress.calls,
            "next_seq": next_seq,
            "outline_version": outline_version,
        });
        // The job keeps its dedup key while it runs (one run per thread at a time); an append
        // made since its last pass marked it, and then it runs again instead of completing.
        if self
            .store
            .complete_or_rerun(claimed, &result, clock.now_ms())
            .await?
        {
            self.store
                .prune_succeeded_jobs(&thread_key, super::KIND_TREE, &claimed.job.id)
                .await?;
        }
        Ok(result)
    }

    /// Writes every missing node below `t`, level by level, in index order. A snipped entry's
    /// line is empty (it takes no line, and no parent repeats it).
    async fn build_nodes(
        &self,
        thread_key: &ThreadKey,
        t: u64,
        options: &OutlineOptions,
        sources: &Sources,
        progress: &mut Progress,
    ) -> Result<(), JobError> {
        if t == 0 {
            return Ok(());
        }
        let max_level = t.ilog2();
        let frontier = self.store.tree_frontier(thread_key, max_level).await?;
        let line_bytes = options.line_bytes.max(OutlineOptions::MIN_LINE_BYTES);
        let mut next = frontier[0];
        let mut context = LineContext::default();
        let first_leaf = next;
        while next < t {
            let end = (next + CHUNK).min(t);
            let mut batch = Vec::new();
            for entry in self.store.entries_between(thread_key, next, end).await? {
                let seq = entry.seq.unwrap_or_default() as u64;
                let snipped = entry
                    .uuid
                    .as_ref()
                    .is_some_and(|uuid| sources.snipped.contains(uuid));
                let leaf_text = if snipped {
                    Some(String::new())
                } else {
                    free_leaf_text(&entry, line_bytes)
                };
                let node = match leaf_text {
                    Some(text) => NewNode::verbatim(NodeId::leaf(seq), text),
                    None => {
                        let anchors = anchors_of_entry(&entry);
                        let mut request =
                            SummaryRequest::new(vec![entry], Purpose::Line, line_bytes);
                        request.context = context.lines(self, thread_key, 0, first_leaf).await?;
                        match self.summarizer.summarize(&request).await {
                            Ok(summary) => summarized(NodeId::leaf(seq), summary, &anchors, &[]),
                            Err(error) => {
                                // What was built before the failure is kept: the retry goes on
                                // from there.
                                self.write_nodes(thread_key, sources.epoch, &batch, progress)
                                    .await?;
                                return Err(error.into());
                            }
                        }
                    }
                };
                context.push(&node.text);
                batch.push(node);
            }
            self.write_nodes(thread_key, sources.epoch, &batch, progress)
                .await?;
            next = end;
        }
        for level in 1..=max_level {
            let count = t >> level;
            let mut index = frontier[level as usize];
            let mut context = LineContext::default();
            let first_child = index * 2;
            while index < count {
                let end = (index + CHUNK).min(count);
                let children = self
                    .store
                    .tree_level_lines(thread_key, level - 1, index * 2, end * 2)
                    .await?;
                let mut batch = Vec::new();
                for i in index..end {
                    let node = NodeId::new(level, i);
                    let (Some(left), Some(right)) =
                        (children.get(&(2 * i)), children.get(&(2 * i + 1)))
                    else {
                        self.write_nodes(thread_key, sources.epoch, &batch, progress)
                            .await?;
                        return Err(JobError::Invalid(format!(
                            "the children of node {node} are not built"
                        )));
                    };
                    let new = match merge_verbatim(&left.text, &right.text, line_bytes) {
                        Some(text) => joined(node, text, left, right),
                        None => {
                            let mut request = SummaryRequest::merge(
                                left.text.clone(),
                                right.text.clone(),
                                line_bytes,
                            );
                            request.context = context
                                .lines(self, thread_key, level - 1, first_child)
                                .await?;
                            match self.summarizer.summarize(&request).await {
                                Ok(summary) => merged(node, summary, left, right),
                                Err(error) => {
                                    self.write_nodes(thread_key, sources.epoch, &batch, progress)
                                        .await?;
                                    return Err(error.into());
                                }
                            }
                        }
                    };
                    context.push(&left.text);
                    context.push(&right.text);
                    batch.push(new);
                }
                self.write_nodes(thread_key, sources.epoch, &batch, progress)
                    .await?;
                index = end;
            }
        }
        Ok(())
    }

    /// The line of the message at leaf `node`, written again as a tree job writes it.
    async fn leaf_again(
        &self,
        thread_key: &ThreadKey,
        node: NodeId,
        sources: &Sources,
        line_bytes: usize,
    ) -> Result<NewNode, JobError> {
        let entries = self
            .store
            .entries_between(thread_key, node.index, node.index + 1)
            .await?;
        let Some(entry) = entries.into_iter().next() else {
            return Err(JobError::Store(StoreError::ThreadNotFound));
        };
        let snipped = entry
            .uuid
            .as_ref()
            .is_some_and(|uuid| sources.snipped.contains(uuid));
        if snipped {
            return Ok(NewNode::verbatim(node, String::new()));
        }
        Ok(match free_leaf_text(&entry, line_bytes) {
            Some(text) => NewNode::verbatim(node, text),
            None => {
                let anchors = anchors_of_entry(&entry);
                let request = SummaryRequest::new(vec![entry], Purpose::Line, line_bytes);
                summarized(
                    node,
                    self.summarizer.summarize(&request).await?,
                    &anchors,
                    &[],
                )
            }
        })
    }

    /// Summarizes again the lines a snip left as stand-ins (built without a model), lowest level
    /// first, so that a parent reads its children's new lines. Each is written on its own,
    /// fenced like any node.
    async fn replace_stand_ins(
        &self,
        thread_key: &ThreadKey,
        options: &OutlineOptions,
        sources: &Sources,
        progress: &mut Progress,
    ) -> Result<(), JobError> {
        let line_bytes = options.line_bytes.max(OutlineOptions::MIN_LINE_BYTES);
        loop {
            let stand_ins = self.store.stand_in_nodes(thread_key, CHUNK as i64).await?;
            if stand_ins.is_empty() {
                return Ok(());
            }
            for node in stand_ins {
                if node.level == 0 {
                    // A message's own line (an erasure rebuilt it, or one beside it).
                    let new = self
                        .leaf_again(thread_key, node, sources, line_bytes)
                        .await?;
                    progress.calls += u64::from(new.calls);
                    progress.written += self
                        .store
                        .replace_stand_ins(thread_key, sources.epoch, std::slice::from_ref(&new))
                        .await?;
                    continue;
                }
                let children = self
                    .store
                    .tree_level_lines(
                        thread_key,
                        node.level - 1,
                        node.index * 2,
                        node.index * 2 + 2,
                    )
                    .await?;
                let (Some(left), Some(right)) = (
                    children.get(&(node.index * 2)),
                    children.get(&(node.index * 2 + 1)),
                ) else {
                    return Err(JobError::Invalid(format!(
                        "the children of stand-in node {node} are missing"
                    )));
                };
                let new = match merge_verbatim(&left.text, &right.text, line_bytes) {
                    Some(text) => joined(node, text, left, right),
                    None => {
                        let request = SummaryRequest::merge(
                            left.text.clone(),
                            right.text.clone(),
                            line_bytes,
                        );
                        merged(
                            node,
                            self.summarizer.summarize(&request).await?,
                            left,
                            right,
                        )
                    }
                };
                progress.calls += u64::from(new.calls);
                progress.written += self
                    .store
                    .replace_stand_ins(thread_key, sources.epoch, std::slice::from_ref(&new))
                    .await?;
            }
        }
    }

    /// Writes a batch of nodes (write-once: nodes another run wrote first are left as they are).
    async fn write_nodes(
        &self,
        thread_key: &ThreadKey,
        epoch: i64,
        batch: &[NewNode],
        progress: &mut Progress,
    ) -> Result<(), JobError> {
        if batch.is_empty() {
            return Ok(());
        }
        progress.written += self.store.put_tree_nodes(thread_key, epoch, batch).await?;
        progress.calls += batch.iter().map(|node| u64::from(node.calls)).sum::<u64>();
        Ok(())
    }

    /// Moves the tail into the outline and folds it, as the policy says; returns the outline's
    /// version after the run.
    async fn advance_outline(
        &self,
        thread_key: &ThreadKey,
        t: u64,
        options: &OutlineOptions,
    ) -> Result<i64, JobError> {
        // Compare-and-set: a concurrent run that changed the outline first makes this one read
        // again (a handful of tries; the loser's change is recomputed from the winner's state).
        for _ in 0..5 {
            let (outline, version) = self.store.outline_state(thread_key).await?;
            let start = outline.boundary();
            let clearing = self.store.clearing_options_of(thread_key).await?;
            let (tokens, round_starts) = self
                .tail_profile(thread_key, start, t, clearing.as_ref())
                .await?;
            let tail = Tail {
                start,
                tokens: &tokens,
                round_starts: &round_starts,
            };
            // The run has just built every level-0 line below `t`.
            let boundary = next_boundary(tail, options.tail_tokens, t);
            // Most appends move nothing: no epoch, and lines within budget (the fold only starts
            // past it). Then the tiles' own texts settle it, without their ancestors'.
            if boundary == start && self.lines_fit(thread_key, &outline, options).await? {
                return Ok(version);
            }
            let mut extended = outline.clone();
            extended.extend_to(boundary);
            // Each line's rendered size, measured once: the fold asks for sizes many times.
            let sizes: HashMap<NodeId, usize> = self
                .candidate_texts(thread_key, &extended)
                .await?
                .into_iter()
                .map(|(node, text)| (node, line_size(node, &text)))
                .collect();
            let bytes = |node: NodeId| sizes.get(&node).copied();
            let next = advance(&outline, t, boundary, options, &bytes);
            if next == outline {
                return Ok(version);
            }
            if self.store.save_outline(thread_key, &next, version).await? {
                return Ok(version + 1);
            }
        }
        Err(JobError::Invalid(
            "the outline kept changing under this run".to_owned(),
        ))
    }

    /// Estimated tokens of each entry in `[start, t)` as the context sends it (with `clearing`
    /// on, the results it clears as their stubs, so the tail holds cleared rounds and clearing
    /// works inside it) and the seqs where rounds start, read in chunks. Each chunk after the
    /// first is grouped with the previous chunk's last assistant in front, so a round spanning
    /// chunks is seen whole.
    async fn tail_profile(
        &self,
        thread_key: &ThreadKey,
        start: u64,
        t: u64,
        clearing: Option<&ClearingOptions>,
    ) -> Result<(Vec<u64>, Vec<u64>), JobError> {
        let mut tokens = Vec::with_capacity((t - start) as usize);
        let mut round_starts = vec![start];
        let mut scanner = RoundScanner::default();
        let mut results = StoredResults::default();
        let mut at = start;
        while at < t {
            let end = (at + CHUNK).min(t);
            let entries = self.store.entries_between(thread_key, at, end).await?;
            for entry in &entries {
                if let Some(clearing) = clearing {
                    results.push(tokens.len(), entry, clearing, block_tokens);
                }
                tokens.push(estimate_entry_tokens(entry));
            }
            round_starts.extend(scanner.scan(entries));
            at = end;
        }
        if let Some(clearing) = clearing {
            lower_to_cleared(&mut tokens, &results, clearing);
        }
        round_starts.dedup();
        Ok((tokens, round_starts))
    }

    /// Whether the outline's lines fit their byte budget.
    async fn lines_fit(
        &self,
        thread_key: &ThreadKey,
        outline: &Outline,
        options: &OutlineOptions,
    ) -> Result<bool, JobError> {
        let texts = self
            .store
            .tree_node_texts(thread_key, &outline.tiles)
            .await?;
        let bytes: usize = texts
            .iter()
            .map(|(node, text)| line_size(*node, text))
            .sum();
        Ok(bytes <= options.budget_bytes)
    }

    /// The texts of the outline's tiles and of every ancestor a fold could merge them into.
    async fn candidate_texts(
        &self,
        thread_key: &ThreadKey,
        outline: &Outline,
    ) -> Result<HashMap<NodeId, String>, JobError> {
        let boundary = outline.boundary();
        let mut wanted: HashSet<NodeId> = HashSet::new();
        for tile in &outline.tiles {
            let mut node = *tile;
            wanted.insert(node);
            while node.level < 62 {
                node = node.parent();
                if node.end() > boundary || !wanted.insert(node) {
                    break;
                }
            }
        }
        let nodes: Vec<NodeId> = wanted.into_iter().collect();
        Ok(self.store.tree_node_texts(thread_key, &nodes).await?)
    }
}

/// The node a summarizer wrote.
/// A line a summarizer wrote from sources holding `anchors`, over lines below that had dropped
/// `below` already: it records what it dropped for the ledger's footer.
fn summarized(
    node: NodeId,
    summary: crate::summarize::Summary,
    anchors: &[Anchor],
    below: &[&str],
) -> NewNode {
    let mut counts = BTreeMap::new();
    for stored in below {
        add_counts(stored, &mut counts);
    }
    for anchor in anchors {
        if !kept_in(&summary.text, &anchor.text) {
            *counts.entry(anchor.kind).or_default() += 1;
        }
    }
    NewNode {
        node,
        dropped: encode_counts(&counts),
        text: summary.text,
        summarizer: summary.summarizer,
        calls: summary.calls,
    }
}

/// A parent a summarizer merged from two lines: the anchors they held and it does not, with
/// what they had dropped.
fn merged(
    node: NodeId,
    summary: crate::summarize::Summary,
    left: &LevelLine,
    right: &LevelLine,
) -> NewNode {
    let anchors = anchors_in_text(&format!("{}\n{}", left.text, right.text));
    summarized(node, summary, &anchors, &[&left.dropped, &right.dropped])
}

/// A parent that is its two lines joined word for word: it drops only what they had.
fn joined(node: NodeId, text: String, left: &LevelLine, right: &LevelLine) -> NewNode {
    let mut counts = BTreeMap::new();
    add_counts(&left.dropped, &mut counts);
    add_counts(&right.dropped, &mut counts);
    NewNode {
        dropped: encode_counts(&counts),
        ..NewNode::verbatim(node, text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn entries(kinds: &str) -> Vec<Entry> {
        // `u` a user turn, `a<x>` an assistant fragment of response x.
        let mut out = Vec::new();
        for (seq, token) in kinds.split(' ').enumerate() {
            let value = match token.strip_prefix('a') {
                Some(id) => {
                    json!({"seq": seq, "type": "assistant", "message": {"role": "assistant",
                    "id": format!("msg_{id}"), "content": [{"type": "text", "text": "x"}]}})
                }
                None => {
                    json!({"seq": seq, "type": "user", "message": {"role": "user", "content": "q"}})
                }
            };
            out.push(serde_json::from_value(value).unwrap());
        }
        out
    }

    #[test]
    fn a_leaf_that_fits_is_its_source_word_for_word() {
        let short = entries("u").remove(0);
        assert_eq!(free_leaf_text(&short, 64).as_deref(), Some("user: q"));
        // Too long for the line: the summarizer writes it.
        assert_eq!(free_leaf_text(&short, 4), None);
        // What the model never sees takes no line: an empty text.
        let note: Entry = serde_json::from_value(json!({"type": "progress"})).unwrap();
        assert_eq!(free_leaf_text(&note, 4).as_deref(), Some(""));
    }

    #[test]
    fn a_thinking_only_response_is_a_gist_of_its_thinking() {
        let thought = "The parser fails on nested brackets because the depth counter is reset \
                       too early; check the loop in parse_group before touching the lexer at all";
        let entry: Entry = serde_json::from_value(json!({"type": "assistant", "message": {
            "role": "assistant", "content": [
                {"type": "thinking", "thinking": thought, "signature": "sig"}]}}))
        .unwrap();
        let line = free_leaf_text(&entry, 512).unwrap();
        assert!(
            line.starts_with("assistant (thinking): The parser fails"),
            "{line}"
        );
        assert!(line.len() <= 128, "a gist, not the reasoning: {line}");
        assert!(line.ends_with('…'), "{line}");
        let words: Vec<&str> = line.trim_end_matches('…').split(' ').collect();
        let last = words.last().unwrap();
        assert!(
            thought.split(' ').any(|w| w == *last),
            "cut at a word: {line}"
        );
    }

    #[test]
    fn scanning_in_chunks_finds_the_rounds_of_the_whole() {
        let all = entries("u a1 u a1 u a2 u u u a3 u a3 a4 u a5 u");
        let whole: Vec<u64> = group_rounds(&all)
            .into_iter()
            .skip(1)
            .map(|round| round.first_seq as u64)
            .collect();
        for size in 1..all.len() {
            let mut scanner = RoundScanner::default();
            let found: Vec<u64> = all
                .chunks(size)
                .flat_map(|chunk| scanner.scan(chunk.to_vec()))
                .collect();
            assert_eq!(found, whole, "chunks of {size}");
        }
    }
}
