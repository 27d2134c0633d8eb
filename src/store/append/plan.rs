//! The pure plan of a group of appends: each append decided in memory, in queue order, against
//! its thread as the group's earlier appends left it (a write, a replay, or a refusal), and what
//! the writes trigger. No statement runs here; the paths that read and write a group share it.

use std::collections::HashMap;
use std::collections::HashSet;

use tokio::sync::oneshot;

use super::window_content::{brings_back_a_segment, WindowContent};
use crate::history::model::Entry;
use crate::history::normalize::clearing::{StoredResults, MIN_CLEARED_BYTES};
use crate::history::normalize::estimate::{
    block_features, entry_features, model_digest, prompt_tokens,
};
use crate::history::normalize::{usage_tokens, ClearingOptions};
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
    /// Whether it ends with a response that reported `usage` after its last boundary.
    anchored: bool,
    /// Its content after its last anchor or boundary at the default rates (`None` when its last
    /// boundary brings back a preserved segment, whose content the batch does not hold).
    content: Option<i64>,
    /// The first response of its last window that reported `usage`, when the batch or its
    /// thread holds none before it in that window.
    first_call: Option<FirstCall>,
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
        let counted = context_tokens_of(entries.iter().map(|p| &p.entry));
        let bytes = entries.iter().map(|p| p.body.len() as i64).sum();
        Ok(PreparedBatch {
            entries,
            tokens: counted.tokens,
            clearable: counted.clearable,
            anchored: counted.anchored,
            content: counted.content,
            first_call: counted.first_call,
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

    /// Whether a boundary of the batch brings back a segment of entries stored before it, which
    /// the batch's own count cannot hold.
    pub(super) fn brings_back_a_segment(&self) -> bool {
        self.entries
            .iter()
            .any(|p| p.entry.is_compact_boundary() && brings_back_a_segment(&p.entry))
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
        /// What the append's first call taught of its model's overhead.
        overhead: Option<OverheadSample>,
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

/// A thread row's counters, as [`COUNTER_COLUMNS`] names them.
pub(super) type Counters = [i64; 6];

/// The `threads` columns every write path reads into a [`GroupThread`] and writes back from
/// [`GroupThread::counters`], in that order.
pub(super) const COUNTER_COLUMNS: [&str; 6] = [
    "next_seq",
    "visible_count",
    "context_tokens",
    "stored_bytes",
    "context_anchored",
    "window_content_tokens",
];

/// `column = v.columnN, ...` for the counters, their values from `v.column{first}` on.
pub(super) fn set_counters_sql(first: usize) -> String {
    COUNTER_COLUMNS
        .iter()
        .zip(first..)
        .map(|(column, n)| format!("{column} = v.column{n}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// One thread of a group, as read under its lock and then moved on by each append written.
pub(super) struct GroupThread {
    pub(super) thread_key: ThreadKey,
    /// Its counters as read: a write that must find the row as it was read checks them all (an
    /// erasure or a settings change moves some without moving `next_seq`).
    pub(super) read: Counters,
    pub(super) next_seq: i64,
    pub(super) visible_count: i64,
    pub(super) context_tokens: i64,
    /// Whether its window holds a response that reported `usage` (`context_anchored`).
    pub(super) anchored: bool,
    /// Its window's content at the default rates while no response of it reported `usage`
    /// (`window_content_tokens`): what a first call's prompt is compared with.
    pub(super) window_content: WindowContent,
    pub(super) stored_bytes: i64,
    pub(super) triggers: AppendTriggers,
    /// When an append of the group last wrote to it; `None` leaves the row as it was.
    pub(super) updated_at: Option<i64>,
    /// The uuids the group named that the thread holds, stored before the group or written by
    /// its earlier appends, with their seq and fingerprint.
    pub(super) known: HashMap<String, (i64, String)>,
}

impl GroupThread {
    /// Its counters as [`GroupThread::new`] takes them, as the group left them.
    pub(super) fn counters(&self) -> Counters {
        [
            self.next_seq,
            self.visible_count,
            self.context_tokens,
            self.stored_bytes,
            i64::from(self.anchored),
            self.window_content.column(),
        ]
    }

    /// The thread as its row was read (its [`COUNTER_COLUMNS`]).
    pub(super) fn new(thread_key: ThreadKey, counters: Counters, triggers: AppendTriggers) -> Self {
        let [next_seq, visible_count, context_tokens, stored_bytes, anchored, content] = counters;
        GroupThread {
            thread_key,
            read: counters,
            next_seq,
            visible_count,
            context_tokens,
            anchored: anchored != 0,
            window_content: WindowContent::from_column(content),
            stored_bytes,
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

/// A thread's stored estimate (`context_tokens`), whether its window holds a response that
/// reported `usage` (`context_anchored`), and the window's content before one did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(in crate::store) struct StoredCount {
    pub(in crate::store) tokens: i64,
    pub(in crate::store) anchored: bool,
    pub(in crate::store) content: WindowContent,
}

/// A thread's stored count after `entries` (a page of its window, in order) from `before`: what
/// its appends would have made of them, under the thread's `clearing`. Pages compose, so a
/// window is counted a page at a time.
pub(in crate::store) fn count_page(
    before: StoredCount,
    entries: &[Entry],
    clearing: Option<&ClearingOptions>,
) -> StoredCount {
    let counted = context_tokens_of(entries.iter());
    let tokens = sent_tokens(counted.tokens, &counted.clearable, clearing);
    StoredCount {
        tokens: append_tokens(before.tokens, tokens),
        anchored: anchored_after(before.anchored, tokens, counted.anchored),
        content: content_after(before.content, tokens, counted.content),
    }
}

/// A window's content before its first `usage`, after a batch that moved its estimate by
/// `tokens` and holds `content` after its last anchor or boundary.
fn content_after(
    before: WindowContent,
    tokens: BatchTokens,
    content: Option<i64>,
) -> WindowContent {
    match tokens {
        BatchTokens::Add(_) => before.plus(content),
        // Once anchored the content is not asked for; what follows the anchor is kept anyway.
        BatchTokens::Reset(_) | BatchTokens::Anchor(_) => WindowContent(content),
    }
}

/// Whether a thread's window holds a response with `usage` after a batch that moved its
/// estimate by `tokens` and ends `anchored` (after its last boundary).
fn anchored_after(before: bool, tokens: BatchTokens, anchored: bool) -> bool {
    match tokens {
        BatchTokens::Add(_) => before,
        BatchTokens::Reset(_) | BatchTokens::Anchor(_) => anchored,
    }
}

/// A tool result the estimate counted whole: its bytes and the tokens its stub would save.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Clearable {
    bytes: usize,
    saved: i64,
}

/// The first response of a window that reported `usage`: its prompt, less the content before it
/// in the window, is what its model's requests carry that no entry holds.
#[derive(Debug, Clone, PartialEq, Eq)]
struct FirstCall {
    model: String,
    prompt: i64,
    /// The window's content before it in its batch, at the default rates (what a content-only
    /// read counts); `None` when its window opened at a boundary that brings back a segment.
    content_before: Option<i64>,
    /// Whether its window opens in the batch (after a boundary the batch holds).
    window_in_batch: bool,
}

/// What one first call taught of a model's overhead: written to `model_overheads` with the
/// append, the model by its digest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct OverheadSample {
    pub(super) model_digest: String,
    pub(super) tokens: i64,
}

/// The largest prompt a first call teaches an overhead from: past every provider's context
/// window, so a `usage` no provider could report (found by the hostile-tenant attack: one such
/// call made every content-only read of the tenant answer half a billion tokens) teaches nothing.
const MAX_OVERHEAD_PROMPT_TOKENS: i64 = 2_000_000;

/// Longest model name an overhead is learned for: no provider's is near it, and a longer one is
/// the caller's text rather than a model.
const MAX_MODEL_NAME_CHARS: usize = 200;

impl FirstCall {
    /// The overhead it shows after `thread_before` (the window's content before the batch, when
    /// the window began before it), if its content is known and small beside its prompt: only
    /// then is the residual mostly overhead, not the estimate's error on the content. Content is
    /// counted at the default rates, as the content-only read it is added to counts it.
    fn sample(&self, thread_before: WindowContent) -> Option<OverheadSample> {
        let before = if self.window_in_batch {
            self.content_before?
        } else {
            thread_before.plus(self.content_before).0?
        };
        let plausible = self.prompt > 0 && self.prompt <= MAX_OVERHEAD_PROMPT_TOKENS;
        (plausible && before.saturating_mul(2) <= self.prompt).then(|| OverheadSample {
            model_digest: model_digest(&self.model),
            tokens: self.prompt - before,
        })
    }
}

/// How a run of entries moves the stored count.
struct Counted {
    tokens: BatchTokens,
    /// The results it counted whole that clearing may send as stubs.
    clearable: Vec<Clearable>,
    anchored: bool,
    /// Its content after its last anchor or boundary, at the default rates.
    content: Option<i64>,
    first_call: Option<FirstCall>,
}

/// How a run of entries moves the estimate: content at the upper bound of the default rates (what
/// automatic compaction counts), a response's `usage` replacing what came before.
fn context_tokens_of<'a>(entries: impl Iterator<Item = &'a Entry>) -> Counted {
    let mut tokens = 0_i64;
    let mut reset = false;
    let mut anchored = false;
    let mut content = Some(0_i64);
    let mut clearable = Vec::new();
    let mut first_call = None;
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
            content = (!brings_back_a_segment(entry)).then_some(0);
            clearable.clear();
        }
        match usage_tokens(entry) {
            Some(reported) => {
                if !anchored {
                    first_call = first_call_of(entry, content, reset);
                }
                anchored = true;
                content = Some(0);
                tokens = i64::try_from(reported).unwrap_or(i64::MAX);
                clearable.clear();
            }
            None => {
                let features = entry_features(entry);
                let [upper, at_default] = [
                    features.upper_at_default_rates(),
                    features.at_default_rates(),
                ]
                .map(|n| i64::try_from(n).unwrap_or(i64::MAX));
                tokens = tokens.saturating_add(upper);
                // Media counted flat may be far from the provider's count: a first call after
                // them would learn the error as overhead.
                content = content
                    .filter(|_| !features.has_flat_counts())
                    .map(|c| c.saturating_add(at_default));
                // A result and its stub counted alike, so a cleared result counts as its stub.
                let mut results = StoredResults::default();
                results.push(index, entry, &every_result, |block| {
                    block_features(block).upper_at_default_rates()
                });
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
    Counted {
        tokens,
        clearable,
        anchored,
        content,
        first_call,
    }
}

fn first_call_of(
    entry: &Entry,
    content_before: Option<i64>,
    window_in_batch: bool,
) -> Option<FirstCall> {
    let model = entry.message.as_ref()?.model.as_deref()?;
    if model.is_empty() || model.chars().count() > MAX_MODEL_NAME_CHARS {
        return None;
    }
    Some(FirstCall {
        model: model.to_owned(),
        prompt: i64::try_from(prompt_tokens(entry)?).ok()?,
        content_before,
        window_in_batch,
    })
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

/// Whether any append the group writes may enqueue a job (a compaction, or an outlined thread's
/// tree job) or teaches a model's overhead: what only the locked group writes.
pub(super) fn group_needs_jobs(
    group: &[QueuedAppend],
    plans: &[Planned],
    threads: &HashMap<(&str, &str), GroupThread>,
) -> bool {
    group.iter().zip(plans).any(|(append, plan)| {
        let Planned::Write {
            tokens_before,
            overhead,
            ..
        } = plan
        else {
            return false;
        };
        let thread = &threads[&thread_of(append)];
        overhead.is_some()
            || thread.triggers.outlined
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
    let moved = batch.tokens_for(thread.triggers.clearing.as_ref());
    let overhead = batch
        .first_call
        .as_ref()
        .filter(|call| call.window_in_batch || !thread.anchored)
        .and_then(|call| call.sample(thread.window_content));
    thread.context_tokens = append_tokens(tokens_before, moved);
    thread.anchored = anchored_after(thread.anchored, moved, batch.anchored);
    thread.window_content = content_after(thread.window_content, moved, batch.content);
    thread.next_seq += batch.len();
    // `None` orders before any time.
    thread.updated_at = thread.updated_at.max(Some(created_at));
    Ok(Planned::Write {
        first_seq,
        tokens_before,
        auto_compaction_job: None,
        jobs_created: false,
        overhead,
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
        let upper = |e: &Entry| entry_features(e).upper_at_default_rates() as i64;
        let reset = upper(&batch[2]);
        assert!(matches!(
            context_tokens_of(batch.iter()).tokens,
            BatchTokens::Reset(tokens) if tokens == reset
        ));
        let added = upper(&batch[0]);
        assert!(matches!(
            context_tokens_of(batch[..1].iter()).tokens,
            BatchTokens::Add(tokens) if tokens == added
        ));
        // The upper bound: a quarter more than the default rates, and framing.
        assert_eq!(added, (2 * 125_u64).div_ceil(100) as i64 + 8);
    }

    #[test]
    fn usage_in_a_batch_anchors_the_estimate() {
        let batch = [
            entry(json!({"type": "user", "message": {"role": "user", "content": "abcdefgh"}})),
            entry(
                json!({"type": "assistant", "message": {"role": "assistant", "id": "m",
                "model": "claude-sonnet-4-5",
                "usage": {"input_tokens": 5, "cache_read_input_tokens": 30000, "output_tokens": 20},
                "content": [{"type": "text", "text": "hi"}]}}),
            ),
            entry(json!({"type": "user", "message": {"role": "user", "content": "abcdefgh"}})),
        ];
        let after = entry_features(&batch[2]).upper_at_default_rates() as i64;
        let counted = context_tokens_of(batch.iter());
        assert!(matches!(
            counted.tokens,
            BatchTokens::Anchor(tokens) if tokens == 30025 + after
        ));
        assert!(counted.anchored);
        // Its first call, after content worth `upper(batch[0])` of the window.
        let call = counted.first_call.unwrap();
        assert_eq!((call.prompt, call.window_in_batch), (30005, false));
        // Counted at the default rates, as a content-only read counts it.
        let content_before = entry_features(&batch[0]).at_default_rates() as i64;
        assert_eq!(call.content_before, Some(content_before));
        let sample = call.sample(WindowContent(Some(100))).unwrap();
        assert_eq!(sample.tokens, 30005 - 100 - content_before);
        // Content larger than half the prompt teaches nothing: its error would be the lesson.
        assert_eq!(call.sample(WindowContent(Some(20_000))), None);
        // Nor does a window whose content is not known.
        assert_eq!(call.sample(WindowContent::UNKNOWN), None);
    }

    #[test]
    fn a_window_holding_media_teaches_no_overhead() {
        let batch = [
            entry(
                json!({"type": "user", "message": {"role": "user", "content": [
                {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                 "data": "iVBORw0KGgo="}},
                {"type": "text", "text": "What is in it?"}]}}),
            ),
            entry(
                json!({"type": "assistant", "message": {"role": "assistant", "id": "m",
                "model": "claude-sonnet-4-5", "usage": {"input_tokens": 21_000, "output_tokens": 9},
                "content": [{"type": "text", "text": "A cat."}]}}),
            ),
        ];
        let counted = context_tokens_of(batch.iter());
        let call = counted.first_call.unwrap();
        // The image counts 2,000 flat: the provider's figure may be far from it either way.
        assert_eq!(call.content_before, None);
        assert_eq!(call.sample(WindowContent::EMPTY), None);
        // The same question without the image teaches.
        let plain = [batch[1].clone()];
        let call = context_tokens_of(plain.iter()).first_call.unwrap();
        assert!(call.sample(WindowContent::EMPTY).is_some());
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
        let zero = StoredCount::default();
        let whole = count_page(zero, &window, None).tokens;
        let cleared = count_page(zero, &window, Some(&clearing)).tokens;
        let stubbed: i64 = window
            .iter()
            .map(|e| {
                let mut results = StoredResults::default();
                results.push(0, e, &clearing, |b| {
                    block_features(b).upper_at_default_rates()
                });
                let saved: u64 = results.counted().iter().map(|r| r.saved).sum();
                entry_features(e).upper_at_default_rates() as i64 - saved as i64
            })
            .sum();
        assert_eq!(cleared, stubbed);
        // Eight results of 8,000 bytes (2,285 tokens of prose each) become stubs of about 30.
        assert!(whole - cleared > 8 * 2_200, "{whole} against {cleared}");
        // Counted a page at a time, the window counts the same, whatever the pages.
        for cut in [1, 5, 11, 23] {
            let first = count_page(zero, &window[..cut], Some(&clearing));
            let then = count_page(first, &window[cut..], Some(&clearing));
            assert_eq!(then.tokens, cleared);
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
        let after = count_page(zero, &anchored[11..], Some(&clearing));
        let counted = count_page(zero, &anchored, Some(&clearing));
        assert_eq!(counted.tokens, 40_015 + after.tokens);
        assert!(counted.anchored && !after.anchored);
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
            [next_seq, 0, 0, stored_bytes, 0, 0],
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
        // `next_seq` as read stays 5.
        assert_eq!((t.next_seq, t.read[0], t.visible_count), (7, 5, 2));
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
