//! The pure plan of a group of appends: each append decided in memory, in queue order, against
//! its thread as the group's earlier appends left it (a write, a replay, or a refusal), and what
//! the writes trigger. No statement runs here; the paths that read and write a group share it.

use std::collections::HashMap;
use std::collections::HashSet;

use tokio::sync::oneshot;

use crate::history::model::Entry;
use crate::history::normalize::clearing::{StoredResults, MIN_CLEARED_BYTES};
use crate::history::normalize::tokens::context_block_tokens;
use crate::history::normalize::{context_entry_tokens, usage_tokens, ClearingOptions};
use crate::store::rows::{prepare, NewRow, Prepared};
use crate::store::{StoreError, TenantId, ThreadId, ThreadKey};

/// One append waiting for its group.
pub(in crate::store) struct QueuedAppend {
    pub tenant: TenantId,
    pub thread_id: ThreadId,
    pub batch: PreparedBatch,
    pub expected_next_seq: Option<i64>,
    /// Answered once the group's fate is known: the append's plan, with its batch given back.
    pub reply: oneshot::Sender<Result<(Planned, PreparedBatch), StoreError>>,
}

/// A whole batch, prepared before any statement runs (uuids, fingerprints, bodies, its token
/// estimate), so its group is decided in memory between the group's reads and writes.
pub(super) struct PreparedBatch {
    pub(super) entries: Vec<Prepared>,
    tokens: BatchTokens,
    /// The tool results the estimate counts (after the batch's last anchor or boundary): what a
    /// thread that clears them sends as stubs instead.
    clearable: Vec<Clearable>,
    /// The bytes of its bodies, as the thread's `stored_bytes` counts them.
    bytes: i64,
    now: chrono::DateTime<chrono::Utc>,
}

impl PreparedBatch {
    pub(super) fn new(
        entries: Vec<Entry>,
        now: chrono::DateTime<chrono::Utc>,
    ) -> Result<Self, StoreError> {
        let entries = entries
            .into_iter()
            .map(|entry| prepare(entry, now))
            .collect::<Result<Vec<_>, _>>()?;
        let mut uuids = HashSet::with_capacity(entries.len());
        if let Some(duplicate) = entries.iter().find(|p| !uuids.insert(p.uuid.as_str())) {
            return Err(StoreError::DuplicateUuid(duplicate.uuid.clone()));
        }
        let (tokens, clearable) = context_tokens_of(entries.iter().map(|p| &p.entry));
        let bytes = entries.iter().map(|p| p.body.len() as i64).sum();
        Ok(PreparedBatch {
            entries,
            tokens,
            clearable,
            bytes,
            now,
        })
    }

    /// What the batch moves the thread's estimate by, as the thread's context sends it: with
    /// clearing on, every result it may clear counts as its stub (the allowance for the results
    /// the rule leaves whole is added where the threshold is checked, [`CompactionTrigger::of`]).
    fn tokens_for(&self, clearing: Option<&ClearingOptions>) -> BatchTokens {
        sent_tokens(self.tokens, &self.clearable, clearing)
    }

    pub(super) fn len(&self) -> i64 {
        self.entries.len() as i64
    }

    /// Snips alone: what a thread at its byte limit may still take, within
    /// [`SNIP_HEADROOM_BYTES`] past it.
    fn is_snips(&self) -> bool {
        self.entries.iter().all(|p| p.entry.is_snip())
    }
}

/// Bytes past `--max-thread-bytes` a thread may take in snips alone, so that a thread at its limit
/// can still hide what it holds. A bound, not an exception: a snip can carry anything, so without
/// it snips would be a way around the limit.
pub const SNIP_HEADROOM_BYTES: i64 = 1024 * 1024;

/// What the group writer decided for one append.
pub(super) enum Planned {
    Write {
        first_seq: i64,
        /// The thread's estimate before this append, for its triggers.
        tokens_before: i64,
        auto_compaction_job: Option<String>,
        /// A job was created, so a worker should wake once the group commits.
        jobs_created: bool,
    },
    /// Every entry is stored already: an idempotent retry, nothing written.
    Replay {
        thread_key: ThreadKey,
        next_seq: i64,
    },
    Refused(StoreError),
}

impl Planned {
    pub(super) fn writes(&self) -> bool {
        matches!(self, Planned::Write { .. })
    }
}

/// One thread of a group, as read under its lock and then moved on by each append written.
pub(super) struct GroupThread {
    pub(super) thread_key: ThreadKey,
    /// `next_seq` as read, before the group's appends moved it on.
    pub(super) read_next_seq: i64,
    pub(super) next_seq: i64,
    pub(super) visible_count: i64,
    pub(super) context_tokens: i64,
    /// `context_tokens` as read: a settings change counts it again without moving `next_seq`.
    pub(super) read_context_tokens: i64,
    pub(super) stored_bytes: i64,
    /// `stored_bytes` as read: an erasure changes it without moving `next_seq`.
    pub(super) read_stored_bytes: i64,
    pub(super) triggers: AppendTriggers,
    /// When an append of the group last wrote to it; `None` leaves the row as it was.
    pub(super) updated_at: Option<i64>,
    /// The uuids the group named that the thread holds, stored before the group or written by
    /// its earlier appends, with their seq and fingerprint.
    pub(super) known: HashMap<String, (i64, String)>,
}

impl GroupThread {
    /// The thread as its row was read: `[next_seq, visible_count, context_tokens,
    /// stored_bytes]`.
    pub(super) fn new(thread_key: ThreadKey, counters: [i64; 4], triggers: AppendTriggers) -> Self {
        let [next_seq, visible_count, context_tokens, stored_bytes] = counters;
        GroupThread {
            thread_key,
            read_next_seq: next_seq,
            next_seq,
            visible_count,
            context_tokens,
            read_context_tokens: context_tokens,
            stored_bytes,
            read_stored_bytes: stored_bytes,
            triggers,
            updated_at: None,
            known: HashMap::new(),
        }
    }
}

/// How a batch changes the running context-token estimate of its thread.
#[derive(Debug, Clone, Copy)]
enum BatchTokens {
    Add(i64),
    /// The batch holds a compact boundary: the context restarts at its last one.
    Reset(i64),
    /// The batch holds an assistant entry reporting `usage`: the estimate becomes its figures
    /// plus what follows it (`history::normalize::estimate_context` on a whole window).
    Anchor(i64),
}

impl BatchTokens {
    /// The same move, `saved` tokens lower (never below 0).
    fn lowered_by(self, saved: i64) -> Self {
        let lower = |tokens: i64| tokens.saturating_sub(saved).max(0);
        match self {
            BatchTokens::Add(tokens) => BatchTokens::Add(lower(tokens)),
            BatchTokens::Reset(tokens) => BatchTokens::Reset(lower(tokens)),
            BatchTokens::Anchor(tokens) => BatchTokens::Anchor(lower(tokens)),
        }
    }
}

/// `tokens`, lowered by what `clearing` (when on) sends as stubs of `clearable`.
fn sent_tokens(
    tokens: BatchTokens,
    clearable: &[Clearable],
    clearing: Option<&ClearingOptions>,
) -> BatchTokens {
    let Some(clearing) = clearing else {
        return tokens;
    };
    let saved: i64 = clearable
        .iter()
        .filter(|c| c.bytes >= clearing.min_bytes && c.bytes > MIN_CLEARED_BYTES)
        .map(|c| c.saved)
        .fold(0, i64::saturating_add);
    tokens.lowered_by(saved)
}

/// A thread's stored estimate after `entries` (a page of its window, in order) from `before`:
/// what its appends would have made of them, under the thread's `clearing`. Pages compose, so a
/// window is counted a page at a time.
pub(in crate::store) fn count_page(
    before: i64,
    entries: &[Entry],
    clearing: Option<&ClearingOptions>,
) -> i64 {
    let (tokens, clearable) = context_tokens_of(entries.iter());
    append_tokens(before, sent_tokens(tokens, &clearable, clearing))
}

/// A tool result the estimate counted whole: its bytes and the tokens its stub would save.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Clearable {
    bytes: usize,
    saved: i64,
}

/// How a run of entries moves the estimate, and the results it counted whole that clearing may
/// send as stubs.
fn context_tokens_of<'a>(
    entries: impl Iterator<Item = &'a Entry>,
) -> (BatchTokens, Vec<Clearable>) {
    let mut tokens = 0_i64;
    let mut reset = false;
    let mut anchored = false;
    let mut clearable = Vec::new();
    // Every result counts, whatever a thread's `min_bytes`: the floor is applied per thread.
    let every_result = ClearingOptions {
        min_bytes: 0,
        ..ClearingOptions::default()
    };
    for (index, entry) in entries.enumerate() {
        if entry.is_compact_boundary() {
            reset = true;
            anchored = false;
            tokens = 0;
            clearable.clear();
        }
        match usage_tokens(entry) {
            Some(reported) => {
                anchored = true;
                tokens = i64::try_from(reported).unwrap_or(i64::MAX);
                clearable.clear();
            }
            None => {
                let added = i64::try_from(context_entry_tokens(entry)).unwrap_or(i64::MAX);
                tokens = tokens.saturating_add(added);
                let mut results = StoredResults::default();
                results.push(index, entry, &every_result, context_block_tokens);
                clearable.extend(results.counted().iter().map(|r| Clearable {
                    bytes: r.bytes,
                    saved: i64::try_from(r.saved).unwrap_or(i64::MAX),
                }));
            }
        }
    }
    let tokens = if reset {
        BatchTokens::Reset(tokens)
    } else if anchored {
        BatchTokens::Anchor(tokens)
    } else {
        BatchTokens::Add(tokens)
    };
    (tokens, clearable)
}

/// What the server holds every thread's appends to, where the thread's settings say nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::store) struct AppendDefaults {
    /// The auto-compaction threshold, in estimated tokens; 0 disables it.
    pub(in crate::store) auto_compact_tokens: i64,
    /// Most bytes of bodies a thread may store (`--max-thread-bytes`); 0 for no limit.
    pub(in crate::store) max_thread_bytes: i64,
}

/// What an append may trigger, from the thread's settings: its auto-compaction threshold (its
/// own, else the server default) and whether it is outlined; and what it may not pass.
#[derive(Debug, Clone)]
pub(super) struct AppendTriggers {
    auto_compact_tokens: i64,
    pub(super) outlined: bool,
    /// The thread's clearing, when on: its estimate counts what the cleared view sends.
    clearing: Option<ClearingOptions>,
    /// Most bytes of bodies the thread may store; 0 for no limit.
    max_stored_bytes: i64,
    /// The columns they were read from, for a write that checks they did not change.
    pub(super) columns: SettingsColumns,
}

/// A thread's `thread_settings` columns that decide what its appends trigger (NULL when it has
/// no settings row, or the column is unset).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct SettingsColumns {
    pub(super) auto_compact_tokens: Option<i64>,
    pub(super) outline: Option<String>,
    pub(super) clearing: Option<String>,
}

impl AppendTriggers {
    /// From the thread's `thread_settings` columns (NULL when it has none).
    pub(super) fn from_settings(
        own_threshold: Option<i64>,
        outline: Option<String>,
        clearing: Option<String>,
        defaults: AppendDefaults,
    ) -> Result<Self, StoreError> {
        Ok(AppendTriggers {
            auto_compact_tokens: own_threshold.unwrap_or(defaults.auto_compact_tokens),
            outlined: crate::store::settings::outline_column(outline.clone())?
                .is_some_and(|options| options.enabled),
            clearing: crate::store::settings::clearing_column(clearing.clone())?,
            max_stored_bytes: defaults.max_thread_bytes,
            columns: SettingsColumns {
                auto_compact_tokens: own_threshold,
                outline,
                clearing,
            },
        })
    }
}

/// What one written append means for its thread's auto-compaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum CompactionTrigger {
    None,
    /// The estimate crossed the threshold: enqueue a compaction.
    Crossed,
    /// Still above the threshold after an attempt that failed or found nothing: enqueue again
    /// if the backoff allows it (a query).
    RetryIfDue,
}

impl CompactionTrigger {
    pub(super) fn of(append: &QueuedAppend, thread: &GroupThread, tokens_before: i64) -> Self {
        let triggers = &thread.triggers;
        // An outlined thread is never auto-compacted: its outline keeps the context small, and a
        // compact boundary in its tail would cut the tail short.
        let threshold = triggers.auto_compact_tokens;
        // A batch that holds a compact boundary has just compacted the thread.
        let eligible = !matches!(append.batch.tokens, BatchTokens::Reset(_)) && !triggers.outlined;
        // The estimate right after this append (a later append of the group may move it on).
        // With clearing, results count as stubs in it, and the threshold is checked with the most
        // tokens of whole results the rule leaves: `keep_tokens + batch_tokens`.
        let allowance = triggers
            .clearing
            .as_ref()
            .map_or(0, ClearingOptions::most_whole_tokens);
        let batch = append.batch.tokens_for(triggers.clearing.as_ref());
        let tokens_before = tokens_before.saturating_add(allowance);
        let tokens_after = append_tokens(tokens_before, batch).saturating_add(match batch {
            BatchTokens::Add(_) => 0,
            BatchTokens::Reset(_) | BatchTokens::Anchor(_) => allowance,
        });
        if !eligible {
            CompactionTrigger::None
        } else if crosses_threshold(tokens_before, tokens_after, threshold) {
            CompactionTrigger::Crossed
        } else if threshold > 0 && tokens_after >= threshold {
            CompactionTrigger::RetryIfDue
        } else {
            CompactionTrigger::None
        }
    }
}

/// Whether any append the group writes may enqueue a job: a compaction, or an outlined
/// thread's tree job.
pub(super) fn group_needs_jobs(
    group: &[QueuedAppend],
    plans: &[Planned],
    threads: &HashMap<(&str, &str), GroupThread>,
) -> bool {
    group.iter().zip(plans).any(|(append, plan)| {
        let Planned::Write { tokens_before, .. } = plan else {
            return false;
        };
        let thread = &threads[&thread_of(append)];
        thread.triggers.outlined
            || CompactionTrigger::of(append, thread, *tokens_before) != CompactionTrigger::None
    })
}

/// Auto-compaction fires once, on the append that takes the estimate from below the threshold to
/// at or above it (0 = off).
fn crosses_threshold(before: i64, after: i64, threshold: i64) -> bool {
    threshold > 0 && before < threshold && after >= threshold
}

/// The estimate after a batch, from the one before it.
fn append_tokens(before: i64, tokens: BatchTokens) -> i64 {
    match tokens {
        BatchTokens::Add(added) => before.saturating_add(added),
        BatchTokens::Reset(tokens) | BatchTokens::Anchor(tokens) => tokens,
    }
}

/// The (tenant, thread id) an append goes to: how a group's threads are keyed.
pub(super) fn thread_of(append: &QueuedAppend) -> (&str, &str) {
    (append.tenant.0.as_str(), append.thread_id.as_str())
}

/// Whether a refusal decided without the stored uuids may be wrong: an append refused for its
/// `expected_next_seq` is a replay if its uuids are stored (a replay is decided before the seq,
/// [`plan_append`]), and one that is partly a replay of the group's earlier members is a whole
/// replay if its other uuids are stored, and one refused for the thread's byte limit is a replay
/// (never refused) if they are. Either way its uuids must be read first.
pub(super) fn may_be_replays(group: &[QueuedAppend], plans: &[Planned]) -> bool {
    group.iter().zip(plans).any(|(append, plan)| {
        matches!(
            plan,
            Planned::Refused(
                StoreError::SeqConflict { .. }
                    | StoreError::PartialReplay { .. }
                    | StoreError::ThreadTooLarge { .. }
            )
        ) && append.batch.entries.iter().any(|p| p.uuid_sent)
    })
}

/// Decides every append of the group, in queue order ([`plan_append`]); an append to a thread
/// the group's read did not find is refused.
pub(super) fn plan_group<'g>(
    group: &'g [QueuedAppend],
    threads: &mut HashMap<(&'g str, &'g str), GroupThread>,
    rows: &mut Vec<NewRow<'g>>,
) -> Vec<Planned> {
    group
        .iter()
        .map(|append| match threads.get_mut(&thread_of(append)) {
            Some(thread) => plan_append(thread, append, rows).unwrap_or_else(Planned::Refused),
            None => Planned::Refused(StoreError::ThreadNotFound),
        })
        .collect()
}

/// Decides one append against its thread as the group has left it so far; a write queues its
/// rows and moves the thread on. A replay is recognised, and a conflict refused, against what is
/// stored and what the group's earlier appends wrote alike.
pub(super) fn plan_append<'g>(
    thread: &mut GroupThread,
    append: &'g QueuedAppend,
    rows: &mut Vec<NewRow<'g>>,
) -> Result<Planned, StoreError> {
    let batch = &append.batch;
    let mut found = 0;
    for p in batch.entries.iter().filter(|p| p.uuid_sent) {
        if let Some((seq, hash)) = thread.known.get(&p.uuid) {
            if *hash != p.content_hash {
                return Err(StoreError::UuidConflict {
                    uuid: p.uuid.clone(),
                    seq: *seq,
                });
            }
            found += 1;
        }
    }
    if found > 0 {
        if found < batch.entries.len() {
            return Err(StoreError::PartialReplay {
                stored: found,
                total: batch.entries.len(),
            });
        }
        return Ok(Planned::Replay {
            thread_key: thread.thread_key.clone(),
            next_seq: thread.next_seq,
        });
    }
    if let Some(expected) = append.expected_next_seq {
        if expected != thread.next_seq {
            return Err(StoreError::SeqConflict {
                expected,
                actual: thread.next_seq,
            });
        }
    }
    let stored_bytes = thread.stored_bytes.saturating_add(batch.bytes);
    let limit = thread.triggers.max_stored_bytes;
    let room = if batch.is_snips() {
        limit.saturating_add(SNIP_HEADROOM_BYTES)
    } else {
        limit
    };
    if limit > 0 && stored_bytes > room {
        return Err(StoreError::ThreadTooLarge {
            stored: thread.stored_bytes,
            adding: batch.bytes,
            limit,
        });
    }
    thread.stored_bytes = stored_bytes;
    let first_seq = thread.next_seq;
    let created_at = batch.now.timestamp_millis();
    for (p, seq) in batch.entries.iter().zip(first_seq..) {
        if p.entry.kind.is_model_visible() {
            thread.visible_count += 1;
        }
        thread
            .known
            .insert(p.uuid.clone(), (seq, p.content_hash.clone()));
        rows.push(NewRow {
            thread_key: thread.thread_key.clone(),
            seq,
            prepared: p,
            visible_rank: thread.visible_count,
            created_at,
        });
    }
    let tokens_before = thread.context_tokens;
    thread.context_tokens = append_tokens(
        tokens_before,
        batch.tokens_for(thread.triggers.clearing.as_ref()),
    );
    thread.next_seq += batch.len();
    // `None` orders before any time.
    thread.updated_at = thread.updated_at.max(Some(created_at));
    Ok(Planned::Write {
        first_seq,
        tokens_before,
        auto_compaction_job: None,
        jobs_created: false,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn entry(value: serde_json::Value) -> Entry {
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn the_threshold_fires_once_when_crossed() {
        assert!(crosses_threshold(90, 100, 100));
        assert!(crosses_threshold(0, 500, 100));
        assert!(!crosses_threshold(100, 150, 100));
        assert!(!crosses_threshold(10, 50, 100));
        assert!(!crosses_threshold(0, 500, 0));
    }

    #[test]
    fn a_boundary_in_a_batch_restarts_the_estimate() {
        let e = |v: serde_json::Value| entry(v);
        let batch = [
            e(json!({"type": "user", "message": {"role": "user", "content": "abcdefgh"}})),
            e(json!({"type": "system", "subtype": "compact_boundary", "content": "x"})),
            e(json!({"type": "user", "message": {"role": "user", "content": "abcd"}})),
        ];
        assert!(matches!(
            context_tokens_of(batch.iter()).0,
            BatchTokens::Reset(1)
        ));
        assert!(matches!(
            context_tokens_of(batch[..1].iter()).0,
            BatchTokens::Add(2)
        ));
    }

    #[test]
    fn usage_in_a_batch_anchors_the_estimate() {
        let batch = [
            entry(json!({"type": "user", "message": {"role": "user", "content": "abcdefgh"}})),
            entry(
                json!({"type": "assistant", "message": {"role": "assistant", "id": "m",
                "usage": {"input_tokens": 5, "cache_read_input_tokens": 30000, "output_tokens": 20},
                "content": [{"type": "text", "text": "hi"}]}}),
            ),
            entry(json!({"type": "user", "message": {"role": "user", "content": "abcdefgh"}})),
        ];
        assert!(matches!(
            context_tokens_of(batch.iter()).0,
            BatchTokens::Anchor(30027)
        ));
    }

    #[test]
    fn with_clearing_on_results_count_as_their_stubs_and_pages_compose() {
        let result = |i: usize, bytes: usize| {
            entry(
                json!({"type": "user", "message": {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": format!("t{i}"),
                 "content": "x".repeat(bytes)}]}}),
            )
        };
        let call = |i: usize| {
            entry(json!({"type": "assistant", "message": {"role": "assistant",
                "id": format!("m{i}"), "content": [{"type": "tool_use", "id": format!("t{i}"),
                "name": "Read", "input": {}}]}}))
        };
        let mut window = Vec::new();
        for i in 0..12 {
            window.push(call(i));
            // Every third result is under the thread's floor and stays whole.
            window.push(result(i, if i % 3 == 0 { 400 } else { 8_000 }));
        }
        let clearing = ClearingOptions::default();
        let whole = count_page(0, &window, None);
        let cleared = count_page(0, &window, Some(&clearing));
        let stubbed: i64 = window
            .iter()
            .map(|e| {
                let mut results = StoredResults::default();
                results.push(0, e, &clearing, context_block_tokens);
                let saved: u64 = results.counted().iter().map(|r| r.saved).sum();
                context_entry_tokens(e) as i64 - saved as i64
            })
            .sum();
        assert_eq!(cleared, stubbed);
        // Eight results of 8,000 bytes (2,285 tokens of prose each) become stubs of about 30.
        assert!(whole - cleared > 8 * 2_200, "{whole} against {cleared}");
        // Counted a page at a time, the window counts the same, whatever the pages.
        for cut in [1, 5, 11, 23] {
            let first = count_page(0, &window[..cut], Some(&clearing));
            assert_eq!(count_page(first, &window[cut..], Some(&clearing)), cleared);
        }
        // Usage anchors the count: only what follows it is counted, stubs included.
        let mut anchored = window.clone();
        anchored.insert(
            10,
            entry(
                json!({"type": "assistant", "message": {"role": "assistant", "id": "mu",
                "usage": {"input_tokens": 5, "cache_read_input_tokens": 40_000,
                "output_tokens": 10}, "content": [{"type": "text", "text": "ok"}]}}),
            ),
        );
        let after = count_page(0, &anchored[11..], Some(&clearing));
        assert_eq!(count_page(0, &anchored, Some(&clearing)), 40_015 + after);
    }

    fn user(uuid: &str, text: &str) -> serde_json::Value {
        json!({"uuid": uuid, "type": "user", "message": {"role": "user", "content": text}})
    }

    fn queued(
        thread_id: &str,
        entries: &[serde_json::Value],
        expected: Option<i64>,
    ) -> QueuedAppend {
        let entries = entries.iter().cloned().map(entry).collect();
        let batch = PreparedBatch::new(entries, chrono::Utc::now()).unwrap();
        QueuedAppend {
            tenant: TenantId("t".into()),
            thread_id: thread_id.into(),
            batch,
            expected_next_seq: expected,
            reply: oneshot::channel().0,
        }
    }

    /// A thread read with `next_seq` and the byte limit `limit` (0 for none).
    fn thread(next_seq: i64, stored_bytes: i64, limit: i64) -> GroupThread {
        let defaults = AppendDefaults {
            auto_compact_tokens: 0,
            max_thread_bytes: limit,
        };
        let triggers = AppendTriggers::from_settings(None, None, None, defaults).unwrap();
        GroupThread::new(
            ThreadKey::from_stored("k".into()),
            [next_seq, 0, 0, stored_bytes],
            triggers,
        )
    }

    fn plan_one(thread: &mut GroupThread, append: &QueuedAppend) -> Result<Planned, StoreError> {
        plan_append(thread, append, &mut Vec::new())
    }

    #[test]
    fn a_write_numbers_its_rows_from_the_threads_next_seq_and_moves_it_on() {
        let mut t = thread(5, 100, 0);
        let append = queued("a", &[user("u1", "hi"), user("u2", "there")], None);
        let mut rows = Vec::new();
        let plan = plan_append(&mut t, &append, &mut rows).unwrap();
        assert!(matches!(plan, Planned::Write { first_seq: 5, .. }));
        assert_eq!(rows.iter().map(|r| r.seq).collect::<Vec<_>>(), [5, 6]);
        assert_eq!(
            rows.iter().map(|r| r.visible_rank).collect::<Vec<_>>(),
            [1, 2]
        );
        assert_eq!((t.next_seq, t.read_next_seq, t.visible_count), (7, 5, 2));
        assert_eq!(t.stored_bytes, 100 + append.batch.bytes);
        assert!(t.updated_at.is_some());
    }

    #[test]
    fn later_appends_of_a_group_see_the_earlier_ones() {
        let group = [
            queued("a", &[user("u1", "hi")], None),
            queued("a", &[user("u1", "hi")], None),
            queued("a", &[user("u1", "other")], None),
            queued("a", &[user("u1", "hi"), user("u9", "new")], None),
            queued("a", &[user("u2", "next")], Some(6)),
            queued("b", &[user("u3", "elsewhere")], None),
        ];
        let mut threads = HashMap::from([(("t", "a"), thread(5, 0, 0))]);
        let mut rows = Vec::new();
        let plans = plan_group(&group, &mut threads, &mut rows);
        assert!(matches!(plans[0], Planned::Write { first_seq: 5, .. }));
        assert!(matches!(plans[1], Planned::Replay { next_seq: 6, .. }));
        assert!(matches!(
            plans[2],
            Planned::Refused(StoreError::UuidConflict { seq: 5, .. })
        ));
        assert!(matches!(
            plans[3],
            Planned::Refused(StoreError::PartialReplay {
                stored: 1,
                total: 2
            })
        ));
        assert!(matches!(plans[4], Planned::Write { first_seq: 6, .. }));
        assert!(matches!(
            plans[5],
            Planned::Refused(StoreError::ThreadNotFound)
        ));
        assert_eq!(rows.len(), 2);
        assert_eq!(threads[&("t", "a")].next_seq, 7);
    }

    #[test]
    fn a_compare_and_append_is_refused_unless_the_seq_is_next() {
        let mut t = thread(3, 0, 0);
        let refused = plan_one(&mut t, &queued("a", &[user("u1", "hi")], Some(2)));
        assert!(matches!(
            refused,
            Err(StoreError::SeqConflict {
                expected: 2,
                actual: 3
            })
        ));
        assert_eq!(t.next_seq, 3, "a refusal moves nothing");
        let written = plan_one(&mut t, &queued("a", &[user("u1", "hi")], Some(3)));
        assert!(matches!(written, Ok(Planned::Write { first_seq: 3, .. })));
    }

    #[test]
    fn the_byte_limit_refuses_a_batch_but_leaves_snips_their_headroom() {
        let big = queued("a", &[user("u1", &"x".repeat(1_000))], None);
        let limit = big.batch.bytes + 10;
        let mut t = thread(0, 11, limit);
        let refused = plan_one(&mut t, &big);
        assert!(matches!(
            refused,
            Err(StoreError::ThreadTooLarge { stored: 11, .. })
        ));
        assert_eq!(t.stored_bytes, 11);
        let snip = json!({"uuid": "s1", "type": "system", "subtype": "snip",
            "snip_metadata": {"removed_uuids": ["u0"]}, "pad": "p".repeat(1_000)});
        let snip = queued("a", &[snip], None);
        assert!(matches!(plan_one(&mut t, &snip), Ok(Planned::Write { .. })));
        let mut full = thread(0, limit + SNIP_HEADROOM_BYTES, limit);
        assert!(matches!(
            plan_one(&mut full, &snip),
            Err(StoreError::ThreadTooLarge { .. })
        ));
    }

    #[test]
    fn refusals_that_may_be_replays_are_the_ones_with_named_uuids() {
        let named = [queued("a", &[user("u1", "hi")], Some(9))];
        let unnamed = [queued(
            "a",
            &[json!({"type": "user", "message": {"role": "user", "content": "hi"}})],
            Some(9),
        )];
        let seq_conflict = || {
            vec![Planned::Refused(StoreError::SeqConflict {
                expected: 9,
                actual: 0,
            })]
        };
        assert!(may_be_replays(&named, &seq_conflict()));
        assert!(!may_be_replays(&unnamed, &seq_conflict()));
        let not_found = vec![Planned::Refused(StoreError::ThreadNotFound)];
        assert!(!may_be_replays(&named, &not_found));
    }
}
