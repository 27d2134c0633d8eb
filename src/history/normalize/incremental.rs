//! Incremental normalization: a read goes on from a checkpoint of the window's normalized prefix
//! and runs the pipeline over the entries after it only (`docs/NORMALIZATION.md` § Incremental
//! reads).
//!
//! # The split
//! A checkpoint ends at a closed round: where the final messages go from a user turn (every
//! `tool_use` before it answered) to an assistant turn, every message before that point built
//! from entries before it and every message after from entries after. The entries from the
//! checkpoint's [`Checkpoint::resume_seq`] on are the *tail*; a read fetches only them. The
//! checkpoint holds
//! - the prefix's provider items, serialized once (`Box<RawValue>`), and its repairs, serialized
//!   and grouped by pass: the pipeline reports pass by pass, so the prefix's repairs and the
//!   tail's interleave stage by stage;
//! - what the passes over the whole request need to know of the prefix (`Facts`): the message
//!   ids and tool ids it used, the uuids its snips hide, its media counts and bytes, its calls of
//!   compactable tools, the assistant turn that opened its tool loop in progress, its token
//!   estimate.
//!
//! A read runs the same pipeline ([`pipeline::run`]) over the tail, behind a [`CheckpointSeam`]
//! (the pipeline's [`pipeline::Seam`]) that does two things. It hands the whole-request passes what
//! the prefix holds (the first turn is not the first; the image count, request size and loop opener
//! carry over). And it falls back, so the caller normalizes the whole window, whenever the tail
//! could change what the checkpoint holds: a new compact boundary; a snip naming an entry before
//! the tail (or an earlier snip naming one in it); a fragment of a response, or a tool id, the
//! prefix already used; a tail that does not start with a plain assistant entry (attachments and
//! media errors then stop inside the tail); a user turn at the front of the tail after any pass (it
//! would merge into the prefix's last); more than 100 media, a change of the many-images rule where
//! the prefix has large images, a request over 32 MB; fewer recent compactable calls than
//! micro-compaction keeps; nothing left after the prefix (the cache breakpoint would move onto it).
//! With clearing, the checkpoint ends before the first result left whole, so its prefix holds only
//! stubs, and carries the sizes of those the rule had still left whole at its end: the tail's run
//! goes on from them.
//!
//! # Moving the checkpoint
//! After a read, the checkpoint moves to the last closed round that leaves behind it enough to
//! keep its prefix final: at least one message (the cache breakpoint, Gemini's closing turn and
//! the loop closing touch only the end) and, with micro-compaction, its `keep_recent` latest
//! compactable calls (older results are cleared for good). Before it moves, the pipeline is run
//! again from the new cut, and the move is kept only if that run reproduces the read's tail
//! exactly: a checkpoint is never stored that its own tail would not confirm.

use std::collections::HashSet;

use serde::ser::{Serialize, SerializeSeq, SerializeStruct, Serializer};
use serde_json::value::RawValue;
use serde_json::Value;

use super::blocks::{
    caller_of, compaction, fnv1a, is_server_result, is_server_use, is_type, str_field,
};
use super::estimate::{ContextEstimate, Estimator};
use super::media::{self, RequestMedia, MANY_IMAGES, MAX_MEDIA_ITEMS, MAX_REQUEST_BYTES};
use super::native::native_block;
use super::thinking::{self, LoopOpener};
use super::tokens::estimate_tokens;
use super::{
    gemini, pipeline, view, Ctx, Fallback, MicrocompactOptions, Msg, NormalizeOptions, Normalized,
    PassEnd, Provider, Repair,
};
use crate::history::model::{Content, Entry, EntryKind};

/// [`TailRun::advance`]'s error when a run from the new cut ran but gave another tail: the split
/// is wrong somewhere, so the caller drops the checkpoint (the property tests look for this).
pub const NOT_REPRODUCED: Fallback = Fallback("a run from the new cut does not reproduce the tail");

/// What [`TailRun::advance`] did with the checkpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Advance {
    /// It moved to the run's cut.
    Moved,
    /// The tail holds no cut: it stays.
    NoCut,
    /// A run from the cut fell back: it stays, still usable.
    FellBack(Fallback),
    /// A run from the cut gave another tail ([`NOT_REPRODUCED`]): the split is wrong somewhere,
    /// so the caller drops the checkpoint.
    NotReproduced,
}

/// Ids are remembered by a 64-bit hash: a collision only makes a read fall back.
fn hash(s: &str) -> u64 {
    fnv1a(s.as_bytes())
}

/// What the passes over the whole request must know of a checkpointed prefix.
#[derive(Debug, Clone, Default)]
struct Facts {
    /// Uuids its snips hide (a later entry with one of them falls back).
    snipped: HashSet<u64>,
    /// Its assistant messages' `message.id`s: a later fragment of one would merge into it.
    response_ids: HashSet<u64>,
    /// Its tool ids, as stored and as sent: a later duplicate would be removed, and a minted id
    /// must not collide with it.
    tool_ids: HashSet<u64>,
    /// Images and documents at the media cap.
    media_items: usize,
    /// Images (large ones counted) and media bytes at the request limits, before refusals.
    request: RequestMedia,
    /// JSON bytes of its blocks at the request-size limit.
    block_bytes: usize,
    /// Whether the request held more than [`MANY_IMAGES`] images when its large ones were judged.
    many_images: bool,
    /// Calls of tools micro-compaction clears.
    compactable_calls: usize,
    /// The turn that opened the tool loop it ends in, if that loop has begun.
    loop_opener: Option<LoopOpener>,
    /// With clearing: the sizes of its results the rule had still left whole at its end (they
    /// are stubs in its output already: a later batch clears them without changing it).
    clearing_whole: Vec<u64>,
}

impl Facts {
    fn approx_bytes(&self) -> usize {
        16 * (self.snipped.len() + self.response_ids.len() + self.tool_ids.len())
            + 8 * self.clearing_whole.len()
            + 128
    }
}

/// A prefix as a run after it sees it.
#[derive(Debug, Clone)]
struct Prefix {
    /// The options it was normalized with; `None` before anything was.
    opts: Option<NormalizeOptions>,
    /// The seq of the first entry after it; `None` for the empty prefix of a run from scratch.
    resume_seq: Option<i64>,
    /// The compact boundary its view starts at.
    boundary: Option<i64>,
    /// The estimate's fold over its entries.
    context: Estimator,
    facts: Facts,
}

/// The prefix's output, serialized once.
#[derive(Debug, Clone, Default)]
struct Rendered {
    /// The provider items; Gemini contents unsigned.
    items: Vec<Box<RawValue>>,
    /// [`estimate_tokens`] of `items`.
    tokens: u64,
    /// Gemini: the index in `items` where the current turn starts, when no later user turn ends
    /// it, and the contents from there on that are sent signed then (index, signed content).
    gemini_turn: usize,
    gemini_signed: Vec<(usize, Box<RawValue>)>,
    /// Repairs, by pass.
    repairs: Vec<Vec<Box<RawValue>>>,
    /// What `items`, `gemini_signed` and `repairs` weigh.
    bytes: usize,
}

/// The normalized state of a window's stable prefix, from which the next read goes on. Holds no
/// identity of its thread: the caller keys it (tenant, thread, options) and checks the thread.
#[derive(Debug, Clone)]
pub struct Checkpoint {
    prefix: Prefix,
    rendered: Rendered,
}

impl Checkpoint {
    /// The empty prefix: [`Checkpoint::continue_with`] the whole window is a read from scratch.
    pub fn start() -> Checkpoint {
        Checkpoint {
            prefix: Prefix {
                opts: None,
                resume_seq: None,
                boundary: None,
                context: Estimator::default(),
                facts: Facts::default(),
            },
            rendered: Rendered::default(),
        }
    }

    /// The seq of the first entry a read must pass to [`Checkpoint::continue_with`]; `None` for
    /// [`Checkpoint::start`], which takes the whole window.
    pub fn resume_seq(&self) -> Option<i64> {
        self.prefix.resume_seq
    }

    /// How many provider items the prefix holds.
    pub fn prefix_len(&self) -> usize {
        self.rendered.items.len()
    }

    /// The prefix's item `index` as sent after a run whose [`TailRun::signs_prefix`] is
    /// `signed` (Gemini contents of the current turn then go signed); what [`TailRun::json`]
    /// writes there. For writing an answer a piece at a time.
    pub fn prefix_item(&self, index: usize, signed: bool) -> &RawValue {
        let rendered = &self.rendered;
        if signed {
            if let Ok(at) = rendered
                .gemini_signed
                .binary_search_by_key(&index, |(at, _)| *at)
            {
                return &rendered.gemini_signed[at].1;
            }
        }
        &rendered.items[index]
    }

    /// What the checkpoint weighs in memory, roughly.
    pub fn approx_bytes(&self) -> usize {
        self.rendered.bytes
            + self.prefix.facts.approx_bytes()
            + self.prefix.context.approx_bytes()
            + 256
    }

    /// Normalizes `tail`, the entries from [`Checkpoint::resume_seq`] on (the whole window for
    /// [`Checkpoint::start`]), after the checkpoint's prefix. Falls back when the tail could change
    /// what the prefix holds, or `opts` are not the checkpoint's: the caller then normalizes the
    /// whole window (from [`Checkpoint::start`]).
    pub fn continue_with(
        &self,
        tail: &[Entry],
        opts: &NormalizeOptions,
    ) -> Result<TailRun, Fallback> {
        let stages = self.prefix.resume_seq.map(|_| self.rendered.repairs.len());
        continue_after(&self.prefix, stages, tail, opts)
    }
}

/// A run over a tail: with its checkpoint, the whole context.
#[derive(Debug)]
pub struct TailRun {
    opts: NormalizeOptions,
    boundary: Option<i64>,
    /// The tail's provider items (Gemini: unsigned); the first `stable` move into the checkpoint
    /// when it advances.
    items: Vec<Value>,
    stable: usize,
    stable_tokens: u64,
    rest_tokens: u64,
    /// Gemini: where the current turn starts in `items`, when it starts in the tail; and the
    /// tail's contents that are sent signed (index, content).
    turn_start: Option<usize>,
    signed: Vec<(usize, Value)>,
    repairs: Vec<Repair>,
    stage_ends: Vec<usize>,
    /// The estimate's fold over the whole window.
    context: Estimator,
    /// The checkpoint after this run's stable part, if the tail holds a cut.
    next: Option<Next>,
}

/// Where the next checkpoint ends, and what it will know.
#[derive(Debug)]
struct Next {
    prefix: Prefix,
    /// The index in the tail of its first entry after the cut.
    entry: usize,
}

/// The run of the pipeline over `tail` after `prefix`; `stages`: the prefix's number of passes,
/// which the run must match.
fn continue_after(
    prefix: &Prefix,
    stages: Option<usize>,
    tail: &[Entry],
    opts: &NormalizeOptions,
) -> Result<TailRun, Fallback> {
    if prefix.opts.as_ref().is_some_and(|o| o != opts) {
        return Err(Fallback("the checkpoint was normalized with other options"));
    }
    let mut ctx = Ctx::new(tail);
    let mut seam = CheckpointSeam::after(prefix);
    let (mut msgs, boundary) = pipeline::run(tail, opts, &mut seam, &mut ctx)?;
    let boundary = if prefix.resume_seq.is_some() {
        prefix.boundary
    } else {
        boundary
    };
    let figures = seam.figures;
    // A request-wide limit that removed media depends on the whole window: no cut then.
    let cut = if figures.over_limits {
        None
    } else {
        choose_cut(prefix, tail, &msgs, opts)
    };
    let next = cut.as_ref().map(|cut| Next {
        prefix: next_prefix(prefix, tail, &msgs, cut, &figures, opts, boundary),
        entry: cut.entry,
    });
    let rest = msgs.split_off(cut.as_ref().map_or(0, |cut| cut.msg));
    let mut items = pipeline::render(msgs, opts, false, &mut ctx);
    let stable = items.len();
    let stable_tokens = estimate_tokens(&items);
    items.extend(pipeline::render(rest, opts, true, &mut ctx));
    ctx.end_stage();
    if stages.is_some_and(|n| n != ctx.stage_ends.len()) {
        return Err(Fallback("the pipeline's passes are not the checkpoint's"));
    }
    let rest_tokens = estimate_tokens(&items[stable..]);
    let (turn_start, signed) = if opts.provider == Provider::Gemini {
        let start = gemini::current_turn_start(&items);
        let signed = (start.unwrap_or(0)..items.len())
            .filter_map(|i| gemini::signed_in_current_turn(&items[i]).map(|s| (i, s)))
            .collect();
        (start, signed)
    } else {
        (None, Vec::new())
    };
    Ok(TailRun {
        opts: opts.clone(),
        boundary,
        items,
        stable,
        stable_tokens,
        rest_tokens,
        turn_start,
        signed,
        repairs: ctx.repairs,
        stage_ends: ctx.stage_ends,
        context: followed_by(&prefix.context, tail),
        next,
    })
}

/// The estimate's fold over a prefix, gone on over the entries after it.
fn followed_by(prefix: &Estimator, entries: &[Entry]) -> Estimator {
    let mut fold = prefix.clone();
    fold.extend(entries);
    fold
}

fn lowest_src(m: &Msg) -> u32 {
    let blocks = m.blocks.iter().map(|b| b.src);
    m.srcs
        .iter()
        .copied()
        .chain(blocks)
        .min()
        .unwrap_or(u32::MAX)
}

fn highest_src(m: &Msg) -> u32 {
    let blocks = m.blocks.iter().map(|b| b.src);
    m.srcs.iter().copied().chain(blocks).max().unwrap_or(0)
}

/// The ids of a message's use blocks (`tool_use`, `server_tool_use`, `mcp_tool_use`), as the
/// pairing pass reads them.
fn use_ids(m: &Msg) -> impl Iterator<Item = &str> {
    let calls = m
        .blocks
        .iter()
        .filter(|b| is_type(&b.v, "tool_use") || is_server_use(&b.v))
        .map(|b| str_field(&b.v, "id").unwrap_or(""));
    // A provider-native item's id and call id, and a reasoning item's id: a repeat of one the
    // prefix sent is sent as text, or not at all.
    let native = m
        .blocks
        .iter()
        .filter(|b| native_block(&b.v).is_some() || is_type(&b.v, "reasoning"))
        .flat_map(|b| [str_field(&b.v, "id"), str_field(&b.v, "call_id")])
        .flatten();
    calls.chain(native)
}

/// The client `tool_use` ids of working messages, as sent.
fn sent_tool_ids(msgs: &[Msg]) -> impl Iterator<Item = &str> {
    msgs.iter()
        .filter(|m| m.is_assistant())
        .flat_map(|m| m.blocks.iter())
        .filter(|b| is_type(&b.v, "tool_use"))
        .map(|b| str_field(&b.v, "id").unwrap_or(""))
}

/// Calls of tools micro-compaction clears, in working messages.
fn compactable_calls(msgs: &[Msg], mc: &MicrocompactOptions) -> usize {
    msgs.iter()
        .filter(|m| m.is_assistant())
        .flat_map(|m| m.blocks.iter())
        .filter(|b| is_type(&b.v, "tool_use"))
        .filter(|b| {
            let name = str_field(&b.v, "name").unwrap_or("");
            mc.tools.iter().any(|t| t == name)
        })
        .count()
}

/// A cut in a run's final messages.
struct Cut {
    /// The index of the first message after it, and of the first tail entry after it.
    msg: usize,
    entry: usize,
    seq: i64,
}

/// The last closed round of `msgs` that can end a checkpoint: a user turn followed by an assistant
/// turn, with every message before it made of entries before the assistant's first entry (a
/// plain assistant entry after the view's boundary and preserved segment) and every message after
/// it of entries from there on; with micro-compaction, `keep_recent` compactable calls after it
/// unless none comes before.
fn choose_cut(
    prefix: &Prefix,
    tail: &[Entry],
    msgs: &[Msg],
    opts: &NormalizeOptions,
) -> Option<Cut> {
    let n = msgs.len();
    let mut lowest_after = vec![u32::MAX; n + 1];
    for j in (0..n).rev() {
        lowest_after[j] = lowest_after[j + 1].min(lowest_src(&msgs[j]));
    }
    let calls: Vec<usize> = match &opts.microcompact {
        Some(mc) => msgs
            .iter()
            .map(|m| compactable_calls(std::slice::from_ref(m), mc))
            .collect(),
        None => vec![0; n],
    };
    let mut calls_after = vec![0usize; n + 1];
    for j in (0..n).rev() {
        calls_after[j] = calls_after[j + 1] + calls[j];
    }
    // From the start, the tail must lie after the boundary, its summaries and its preserved
    // segment, which the view puts in front of everything else.
    let floor = if prefix.resume_seq.is_some() {
        None
    } else {
        tail.iter()
            .rposition(Entry::is_compact_boundary)
            .map(|b| (b, tail[b].preserved_segment().map(|(_, last)| last)))
    };
    let mut highest_before = vec![0u32; n + 1];
    for j in 0..n {
        highest_before[j + 1] = highest_before[j].max(highest_src(&msgs[j]));
    }
    let calls_total = calls_after[0];
    // With clearing, only stubs may end up in the prefix: a whole result there could be cleared
    // by a later batch.
    let first_whole = opts
        .clearing
        .as_ref()
        .and_then(|clearing| super::clearing::first_whole(msgs, clearing, tail));
    (1..n).rev().find_map(|j| {
        if !(msgs[j].is_assistant() && msgs[j - 1].is_user()) {
            return None;
        }
        let first = lowest_after[j];
        if highest_before[j] >= first {
            return None;
        }
        let entry = tail.get(first as usize)?;
        if entry.kind != EntryKind::Assistant || entry.is_api_error || entry.is_virtual {
            return None;
        }
        let seq = entry.seq?;
        if let Some((b, preserved_last)) = floor {
            if (first as usize) <= b || preserved_last.is_some_and(|last| seq <= last) {
                return None;
            }
        }
        if let Some(mc) = &opts.microcompact {
            let before = prefix.facts.compactable_calls + calls_total - calls_after[j];
            if before > 0 && calls_after[j] < mc.keep_recent {
                return None;
            }
        }
        if first_whole.is_some_and(|whole| j > whole) {
            return None;
        }
        Some(Cut {
            msg: j,
            entry: first as usize,
            seq,
        })
    })
}

/// What the checkpoint will know once it ends at `cut`: the prefix's facts and those of the
/// messages and entries before the cut.
fn next_prefix(
    prefix: &Prefix,
    tail: &[Entry],
    msgs: &[Msg],
    cut: &Cut,
    figures: &Figures,
    opts: &NormalizeOptions,
    boundary: Option<i64>,
) -> Prefix {
    let mut facts = prefix.facts.clone();
    let before = &tail[..cut.entry];
    for e in before {
        if e.is_snip() {
            if let Some(m) = &e.snip_metadata {
                facts
                    .snipped
                    .extend(m.removed_uuids.iter().map(|u| hash(u)));
            }
        }
    }
    let is_before = |src: u32| (src as usize) < cut.entry;
    let ids_before = |ids: &[(u32, u64)]| -> Vec<u64> {
        ids.iter()
            .filter(|(src, _)| is_before(*src))
            .map(|(_, id)| *id)
            .collect()
    };
    facts.response_ids.extend(ids_before(&figures.response_ids));
    facts.tool_ids.extend(ids_before(&figures.use_ids));
    let stable = &msgs[..cut.msg];
    facts.tool_ids.extend(sent_tool_ids(stable).map(hash));
    facts.media_items += figures
        .media_items
        .iter()
        .filter(|(src, _)| is_before(*src))
        .map(|(_, n)| n)
        .sum::<usize>();
    for (_, media) in figures.request.iter().filter(|(src, _)| is_before(*src)) {
        facts.request += *media;
    }
    facts.block_bytes += figures
        .block_bytes
        .iter()
        .filter(|(src, _)| is_before(*src))
        .map(|(_, n)| n)
        .sum::<usize>();
    facts.many_images = figures.many_images;
    if let Some(mc) = &opts.microcompact {
        facts.compactable_calls += compactable_calls(stable, mc);
    }
    if let Some(clearing) = &opts.clearing {
        let arrived = super::clearing::arrivals_before(msgs, cut.msg, clearing, tail);
        facts.clearing_whole =
            super::clearing::still_whole(&facts.clearing_whole, &arrived, clearing);
    }
    let opener_from = |from: usize| {
        stable[from..].iter().find(|m| m.is_assistant()).map(|m| {
            let e = &tail[m.primary_src() as usize];
            LoopOpener {
                starts_with_thinking: thinking::starts_with_thinking(m),
                seq: e.seq_or(m.primary_src() as usize),
                uuid: e.uuid.clone(),
            }
        })
    };
    facts.loop_opener = match thinking::loop_start(stable) {
        Some(start) => opener_from(start),
        None => facts.loop_opener.or_else(|| opener_from(0)),
    };
    Prefix {
        opts: Some(opts.clone()),
        resume_seq: Some(cut.seq),
        boundary,
        context: followed_by(&prefix.context, before),
        facts,
    }
}

impl TailRun {
    /// [`super::estimate_context`] of the whole window.
    pub fn context_estimate(&self) -> ContextEstimate {
        self.context.estimate()
    }

    /// Whether the run holds a cut the checkpoint can [`TailRun::advance`] to.
    pub fn can_advance(&self) -> bool {
        self.next.is_some()
    }

    fn estimated_tokens(&self, checkpoint: &Checkpoint) -> u64 {
        checkpoint.rendered.tokens + self.stable_tokens + self.rest_tokens
    }

    /// Whether the prefix's contents from its current-turn start are sent signed: the tail
    /// starts no turn of its own (Gemini).
    pub fn signs_prefix(&self) -> bool {
        self.opts.provider == Provider::Gemini && self.turn_start.is_none()
    }

    /// The repairs of pass `stage`.
    fn stage(&self, stage: usize) -> &[Repair] {
        let from = stage.checked_sub(1).map_or(0, |s| self.stage_ends[s]);
        &self.repairs[from..self.stage_ends[stage]]
    }

    /// The whole context as a value: the checkpoint's prefix, parsed back, then the tail. For
    /// tests and callers that need values; [`TailRun::json`] writes it without parsing.
    pub fn normalized(&self, checkpoint: &Checkpoint) -> Normalized {
        let parse = |raw: &RawValue| -> Value {
            serde_json::from_str(raw.get()).expect("a checkpoint holds JSON it wrote")
        };
        let mut messages: Vec<Value> = prefix_items(checkpoint, self.signs_prefix())
            .map(parse)
            .collect();
        messages.extend(self.tail_items().cloned());
        let mut repairs = Vec::with_capacity(self.repairs.len());
        for stage in 0..self.stage_ends.len() {
            if let Some(raws) = checkpoint.rendered.repairs.get(stage) {
                repairs.extend(raws.iter().map(|raw| {
                    serde_json::from_str::<Repair>(raw.get())
                        .expect("a checkpoint holds repairs it wrote")
                }));
            }
            repairs.extend(self.stage(stage).iter().cloned());
        }
        Normalized {
            messages,
            repairs,
            boundary: self.boundary,
            estimated_tokens: self.estimated_tokens(checkpoint),
        }
    }

    /// The whole context in the JSON shape of [`Normalized`], written from the checkpoint's
    /// serialized prefix without parsing it.
    pub fn json<'a>(&'a self, checkpoint: &'a Checkpoint) -> NormalizedJson<'a> {
        NormalizedJson {
            run: self,
            checkpoint,
            prefix_items: true,
        }
    }

    /// [`TailRun::json`] without the checkpoint's items in `messages` (the tail's only): a
    /// writer that sends the prefix's items itself ([`Checkpoint::prefix_item`]) splices them in
    /// after `{"messages":[`.
    pub fn json_without_prefix_items<'a>(
        &'a self,
        checkpoint: &'a Checkpoint,
    ) -> NormalizedJson<'a> {
        NormalizedJson {
            run: self,
            checkpoint,
            prefix_items: false,
        }
    }

    /// The tail's items as sent (Gemini: signed in the current turn).
    fn tail_items(&self) -> impl Iterator<Item = &Value> {
        let mut signed = self.signed.iter().peekable();
        self.items.iter().enumerate().map(move |(i, item)| {
            match signed.next_if(|(at, _)| *at == i) {
                Some((_, s)) => s,
                None => item,
            }
        })
    }

    /// Whether the run's tail holds a cut the checkpoint could move to ([`TailRun::advance`]);
    /// without one, the run answers from the checkpoint as it is.
    pub fn has_cut(&self) -> bool {
        self.next.is_some()
    }

    /// Moves `checkpoint` (the one this run continued) to the run's cut, once a run from the cut
    /// reproduces this run's tail, and returns the run to answer the read with (the same context
    /// either way): after a move, that run from the cut, whose stable part the checkpoint now
    /// holds serialized, so nothing is serialized twice; else this run, the checkpoint as it was
    /// ([`Advance`] says why).
    pub fn advance(mut self, checkpoint: &mut Checkpoint, tail: &[Entry]) -> (TailRun, Advance) {
        match self.move_to_cut(checkpoint, tail) {
            Ok(Some(again)) => (again, Advance::Moved),
            Ok(None) => (self, Advance::NoCut),
            Err(NOT_REPRODUCED) => (self, Advance::NotReproduced),
            Err(fallback) => (self, Advance::FellBack(fallback)),
        }
    }

    /// [`TailRun::advance`]: the run from the new cut, once the checkpoint moved there.
    fn move_to_cut(
        &mut self,
        checkpoint: &mut Checkpoint,
        tail: &[Entry],
    ) -> Result<Option<TailRun>, Fallback> {
        let Some(next) = self.next.take() else {
            return Ok(None);
        };
        let cut_seq = next.prefix.resume_seq.unwrap_or(i64::MAX);
        let is_stable = |r: &Repair| !r.seqs.is_empty() && r.seqs.iter().all(|&s| s < cut_seq);
        let again = continue_after(
            &next.prefix,
            Some(self.stage_ends.len()),
            &tail[next.entry..],
            &self.opts,
        )?;
        let stages = self.stage_ends.len();
        let same_repairs = (0..stages).all(|s| {
            let rest: Vec<&Repair> = self.stage(s).iter().filter(|r| !is_stable(r)).collect();
            let again: Vec<&Repair> = again.stage(s).iter().collect();
            rest == again
        });
        let stable = self.stable;
        let same_turn =
            again.turn_start.map(|s| s + stable) == self.turn_start.filter(|&s| s > stable);
        let shifted: Vec<(usize, &Value)> =
            again.signed.iter().map(|(i, v)| (i + stable, v)).collect();
        let own: Vec<(usize, &Value)> = self
            .signed
            .iter()
            .filter(|(i, _)| *i >= stable)
            .map(|(i, v)| (*i, v))
            .collect();
        if again.items != self.items[stable..]
            || !same_repairs
            || again.context != self.context
            || again.stable_tokens + again.rest_tokens != self.rest_tokens
            || !same_turn
            || shifted != own
        {
            return Err(NOT_REPRODUCED);
        }
        let rendered = &mut checkpoint.rendered;
        if rendered.repairs.is_empty() {
            rendered.repairs = vec![Vec::new(); stages];
        }
        for (s, raws) in rendered.repairs.iter_mut().enumerate() {
            for r in self.stage(s).iter().filter(|r| is_stable(r)) {
                let raw = to_raw(r);
                rendered.bytes += raw.get().len() + 16;
                raws.push(raw);
            }
        }
        let base = rendered.items.len();
        let stable_items = &self.items[..stable];
        if self.opts.provider == Provider::Gemini {
            if let Some(start) = gemini::current_turn_start(stable_items) {
                rendered.gemini_turn = base + start;
                let stale: usize = rendered
                    .gemini_signed
                    .iter()
                    .map(|(_, r)| r.get().len() + 24)
                    .sum();
                rendered.bytes -= stale;
                rendered.gemini_signed.clear();
            }
            for (i, item) in stable_items.iter().enumerate() {
                if base + i < rendered.gemini_turn {
                    continue;
                }
                if let Some(signed) = gemini::signed_in_current_turn(item) {
                    let raw = to_raw(&signed);
                    rendered.bytes += raw.get().len() + 24;
                    rendered.gemini_signed.push((base + i, raw));
                }
            }
        }
        for item in stable_items {
            let raw = to_raw(item);
            rendered.bytes += raw.get().len() + 16;
            rendered.items.push(raw);
        }
        rendered.tokens += self.stable_tokens;
        checkpoint.prefix = next.prefix;
        Ok(Some(again))
    }
}

/// A read of a whole window a page at a time, so that only the entries after the last closed
/// round are ever held parsed: each page goes on from the checkpoint the pages before it left,
/// exactly as a read goes on after appends, and the checkpoint then moves to the page's last cut.
/// What a read holds then grows with the window's normalized output, not with its parsed entries.
/// Any fallback means the pages cannot be read this way: the caller reads the whole window.
#[derive(Debug)]
pub struct PagedRead {
    opts: NormalizeOptions,
    checkpoint: Checkpoint,
    /// The entries from the checkpoint's resume seq on: the tail of the next run.
    pending: Vec<Entry>,
    /// Most entries `pending` may hold after a page: past that no cut comes, and each page would
    /// normalize them all again.
    max_pending: usize,
}

/// [`PagedRead::feed`]'s fallback when no cut came for `max_pending` entries.
pub const NO_CUT: Fallback = Fallback("no closed round to page at");

impl PagedRead {
    /// A read from the window's start; `max_pending` bounds the entries kept between pages.
    pub fn new(opts: NormalizeOptions, max_pending: usize) -> PagedRead {
        PagedRead {
            opts,
            checkpoint: Checkpoint::start(),
            pending: Vec::new(),
            max_pending,
        }
    }

    /// Normalizes `page` (the window's next entries, in seq order) after what was read, and
    /// moves the checkpoint to the last cut, so that only the entries after it stay.
    pub fn feed(&mut self, page: Vec<Entry>) -> Result<(), Fallback> {
        let moved = self.run(page)?.1;
        match moved {
            Advance::NotReproduced => return Err(NOT_REPRODUCED),
            // No cut, or none a run could go on from: the entries wait for the next page.
            Advance::NoCut | Advance::FellBack(_) => {}
            Advance::Moved => {
                let resume = self.checkpoint.resume_seq();
                let at = self
                    .pending
                    .iter()
                    .position(|e| e.seq == resume)
                    .unwrap_or(self.pending.len());
                self.pending.drain(..at);
            }
        }
        if self.pending.len() > self.max_pending {
            return Err(NO_CUT);
        }
        Ok(())
    }

    /// Normalizes the last page: the run that answers the read, with the checkpoint it goes on
    /// from, moved to the run's cut when it could ([`TailRun::advance`]'s result).
    pub fn finish(mut self, last: Vec<Entry>) -> Result<(Checkpoint, TailRun, Advance), Fallback> {
        let (run, moved) = self.run(last)?;
        Ok((self.checkpoint, run, moved))
    }

    fn run(&mut self, page: Vec<Entry>) -> Result<(TailRun, Advance), Fallback> {
        self.pending.extend(page);
        let run = self.checkpoint.continue_with(&self.pending, &self.opts)?;
        Ok(run.advance(&mut self.checkpoint, &self.pending))
    }
}

fn to_raw<T: Serialize>(value: &T) -> Box<RawValue> {
    serde_json::value::to_raw_value(value).expect("values serialize")
}

/// The checkpoint's items as sent: from the current-turn start on, Gemini contents signed when
/// the turn goes on into the tail (`signs_prefix`).
fn prefix_items(checkpoint: &Checkpoint, signs_prefix: bool) -> impl Iterator<Item = &RawValue> {
    let rendered = &checkpoint.rendered;
    let mut signed = rendered.gemini_signed.iter().peekable();
    rendered.items.iter().enumerate().map(move |(i, raw)| {
        let alt = signed.next_if(|(at, _)| *at == i);
        match alt {
            Some((_, s)) if signs_prefix => &**s,
            _ => &**raw,
        }
    })
}

/// The JSON of a [`Normalized`] made of a checkpoint and a [`TailRun`] (see [`TailRun::json`]).
pub struct NormalizedJson<'a> {
    run: &'a TailRun,
    checkpoint: &'a Checkpoint,
    /// Whether `messages` holds the checkpoint's items before the tail's.
    prefix_items: bool,
}

struct MessagesJson<'a>(&'a NormalizedJson<'a>);
struct RepairsJson<'a>(&'a NormalizedJson<'a>);

impl Serialize for NormalizedJson<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        // The fields of `Normalized`, in its order.
        let mut out = serializer.serialize_struct("Normalized", 4)?;
        out.serialize_field("messages", &MessagesJson(self))?;
        out.serialize_field("repairs", &RepairsJson(self))?;
        out.serialize_field("boundary", &self.run.boundary)?;
        out.serialize_field(
            "estimated_tokens",
            &self.run.estimated_tokens(self.checkpoint),
        )?;
        out.end()
    }
}

impl Serialize for MessagesJson<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let NormalizedJson {
            run,
            checkpoint,
            prefix_items: with_prefix,
        } = self.0;
        let prefix_len = if *with_prefix {
            checkpoint.rendered.items.len()
        } else {
            0
        };
        let mut seq = serializer.serialize_seq(Some(prefix_len + run.items.len()))?;
        for raw in prefix_items(checkpoint, run.signs_prefix()).take(prefix_len) {
            seq.serialize_element(raw)?;
        }
        for item in run.tail_items() {
            seq.serialize_element(item)?;
        }
        seq.end()
    }
}

impl Serialize for RepairsJson<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let NormalizedJson {
            run, checkpoint, ..
        } = self.0;
        let before: usize = checkpoint.rendered.repairs.iter().map(Vec::len).sum();
        let mut seq = serializer.serialize_seq(Some(before + run.repairs.len()))?;
        for stage in 0..run.stage_ends.len() {
            for raw in checkpoint.rendered.repairs.get(stage).into_iter().flatten() {
                seq.serialize_element(&**raw)?;
            }
            for repair in run.stage(stage) {
                seq.serialize_element(repair)?;
            }
        }
        seq.end()
    }
}

/// Per-message media figures of a run (by primary source), kept so the next checkpoint can add
/// those of its stable part to its facts.
#[derive(Debug, Default)]
struct Figures {
    /// Hashes of the converted assistant messages' ids and of their use blocks' ids.
    response_ids: Vec<(u32, u64)>,
    use_ids: Vec<(u32, u64)>,
    media_items: Vec<(u32, usize)>,
    request: Vec<(u32, RequestMedia)>,
    block_bytes: Vec<(u32, usize)>,
    /// The run's own images and media bytes, before refusals.
    own_media: RequestMedia,
    many_images: bool,
    /// A request-wide limit removed media in a run from the start.
    over_limits: bool,
}

/// Where a pipeline run starts: at the start of the view, or after a checkpointed prefix. In the
/// latter case it checks, pass by pass, that nothing of the tail reaches into the prefix, and
/// gives the passes over the whole request what the prefix holds (see the module docs).
pub struct CheckpointSeam<'p> {
    /// `None`: the run starts at the start of the view.
    prefix: Option<&'p Prefix>,
    /// Keep the per-message figures a checkpoint needs.
    record: bool,
    figures: Figures,
}

impl CheckpointSeam<'static> {
    /// A plain run from the start of the view ([`super::normalize`]).
    pub fn start() -> CheckpointSeam<'static> {
        CheckpointSeam {
            prefix: None,
            record: false,
            figures: Figures::default(),
        }
    }
}

impl<'p> CheckpointSeam<'p> {
    fn after(prefix: &'p Prefix) -> CheckpointSeam<'p> {
        CheckpointSeam {
            prefix: prefix.resume_seq.map(|_| prefix),
            record: true,
            figures: Figures::default(),
        }
    }

    /// Whether the run counts the prefix's figures or records its own (a plain run does neither).
    fn counts(&self) -> bool {
        self.record || self.prefix.is_some()
    }
}

impl pipeline::Seam for CheckpointSeam<'_> {
    /// The view's entries: from the start, the last boundary's slice (step a); after a
    /// checkpoint, every tail entry, once the tail is checked against the prefix.
    fn view(&self, entries: &[Entry]) -> Result<(Vec<usize>, Option<i64>), Fallback> {
        let Some(prefix) = self.prefix else {
            return Ok(view::slice_after_boundary(entries));
        };
        check_tail(prefix, entries)?;
        Ok(((0..entries.len()).collect(), prefix.boundary))
    }

    /// After a checkpoint, the view (snips applied) must start with the tail's first entry, a
    /// plain assistant entry: attachments moving up and media errors looking back stop there.
    fn check_view(&self, entries: &[Entry], view: &[usize]) -> Result<(), Fallback> {
        if self.prefix.is_none() {
            return Ok(());
        }
        let plain_assistant =
            |e: &Entry| e.kind == EntryKind::Assistant && !e.is_api_error && !e.is_virtual;
        // A server-side compaction in the tail stands for the prefix too.
        if entries.iter().any(holds_compaction) {
            return Err(Fallback("a server-side compaction in the tail"));
        }
        match view.first() {
            Some(&0) if plain_assistant(&entries[0]) => Ok(()),
            _ => Err(Fallback("the tail does not start with a response")),
        }
    }

    /// After conversion: fragments merge by `message.id`, and pairing removes a repeated tool id,
    /// across the whole request; after a checkpoint, neither may be one of the prefix's.
    fn converted(&mut self, msgs: &[Msg]) -> Result<(), Fallback> {
        // A server result answering a call of the prefix (a deferred result) decides whether
        // the prefix keeps that call.
        if self.prefix.is_some() && answers_an_earlier_call(msgs) {
            return Err(Fallback("a server result answers a call before the tail"));
        }
        if !self.counts() {
            return Ok(());
        }
        for m in msgs.iter().filter(|m| m.is_assistant()) {
            let src = m.primary_src();
            if let Some(id) = &m.id {
                self.figures.response_ids.push((src, hash(id)));
            }
            let ids = use_ids(m).map(|id| (src, hash(id)));
            self.figures.use_ids.extend(ids);
        }
        if let Some(prefix) = self.prefix {
            let facts = &prefix.facts;
            let figures = &self.figures;
            if figures
                .response_ids
                .iter()
                .any(|(_, id)| facts.response_ids.contains(id))
            {
                return Err(Fallback("a fragment of a response the checkpoint holds"));
            }
            if figures
                .use_ids
                .iter()
                .any(|(_, id)| facts.tool_ids.contains(id))
            {
                return Err(Fallback("a tool id the checkpoint holds"));
            }
        }
        Ok(())
    }

    /// Before the media cap: the prefix's media count, and this run's per message.
    fn count_media_items(&mut self, msgs: &[Msg]) -> Result<(), Fallback> {
        if !self.counts() {
            return Ok(());
        }
        let per: Vec<(u32, usize)> = msgs
            .iter()
            .map(|m| (m.primary_src(), media::media_items(m)))
            .filter(|&(_, n)| n > 0)
            .collect();
        let before = self.prefix.map_or(0, |p| p.facts.media_items);
        if before + per.iter().map(|(_, n)| n).sum::<usize>() > MAX_MEDIA_ITEMS {
            if self.prefix.is_some() {
                return Err(Fallback("over 100 media items"));
            }
            self.figures.over_limits = true;
        }
        self.figures.media_items = per;
        Ok(())
    }

    /// Whether the request holds more than [`MANY_IMAGES`] images, the prefix's included. A
    /// prefix with large images judged the other way falls back.
    fn many_images(&mut self, msgs: &[Msg]) -> Result<bool, Fallback> {
        if !self.counts() {
            let own = media::request_media(msgs);
            self.figures.own_media = own;
            return Ok(own.images > MANY_IMAGES);
        }
        let per: Vec<(u32, RequestMedia)> = msgs
            .iter()
            .map(|m| {
                let media = media::request_media_with_sizes(std::slice::from_ref(m));
                (m.primary_src(), media)
            })
            .filter(|(_, media)| *media != RequestMedia::default())
            .collect();
        let mut own = RequestMedia::default();
        for (_, media) in &per {
            own += *media;
        }
        self.figures.own_media = own;
        let before = self
            .prefix
            .map_or(RequestMedia::default(), |p| p.facts.request);
        let many = before.images + own.images > MANY_IMAGES;
        if let Some(prefix) = self.prefix {
            if before.large_images > 0 && many != prefix.facts.many_images {
                return Err(Fallback("the image count crossed the many-images limit"));
            }
        }
        self.figures.request = per;
        self.figures.many_images = many;
        Ok(many)
    }

    /// The request's size, when it is over [`MAX_REQUEST_BYTES`] with media to refuse (only from
    /// the start: after a checkpoint, the prefix's media would go first, so the run falls back).
    fn oversized_request(&mut self, msgs: &[Msg]) -> Result<Option<usize>, Fallback> {
        let media_bytes = self.figures.own_media.media_bytes
            + self.prefix.map_or(0, |p| p.facts.request.media_bytes);
        if !self.counts() {
            if media_bytes == 0 {
                return Ok(None);
            }
            let total: usize = msgs.iter().map(media::block_bytes).sum();
            return Ok((total > MAX_REQUEST_BYTES).then_some(total));
        }
        let per: Vec<(u32, usize)> = msgs
            .iter()
            .map(|m| (m.primary_src(), media::block_bytes(m)))
            .collect();
        let total = self.prefix.map_or(0, |p| p.facts.block_bytes)
            + per.iter().map(|(_, n)| n).sum::<usize>();
        self.figures.block_bytes = per;
        if media_bytes == 0 || total <= MAX_REQUEST_BYTES {
            return Ok(None);
        }
        if self.prefix.is_some() {
            return Err(Fallback("the request is over 32 MB"));
        }
        self.figures.over_limits = true;
        Ok(Some(total))
    }

    /// With clearing, the sizes of the prefix's results the rule had left whole.
    fn clearing_carried(&self) -> &[u64] {
        self.prefix
            .map_or(&[], |p| p.facts.clearing_whole.as_slice())
    }

    /// Whether the messages follow a user turn (the prefix's last), so the first is not the first.
    fn after_user_turn(&self) -> bool {
        self.prefix.is_some()
    }

    /// The turn that opened the prefix's tool loop in progress.
    fn loop_opener(&self) -> Option<&LoopOpener> {
        self.prefix.and_then(|p| p.facts.loop_opener.as_ref())
    }

    /// After the last pass: something follows the prefix (the cache breakpoint and Gemini's
    /// closing turn stay off it), no tool id sent is one of the prefix's, and with
    /// micro-compaction the prefix's compactable calls stay beyond the `keep_recent` latest.
    fn check_end(&self, msgs: &[Msg], opts: &NormalizeOptions) -> Result<(), Fallback> {
        let Some(prefix) = self.prefix else {
            return Ok(());
        };
        if msgs.is_empty() {
            return Err(Fallback("nothing follows the checkpoint"));
        }
        if sent_tool_ids(msgs).any(|id| prefix.facts.tool_ids.contains(&hash(id))) {
            return Err(Fallback("a tool id the checkpoint sent"));
        }
        if let Some(mc) = &opts.microcompact {
            if prefix.facts.compactable_calls > 0 && compactable_calls(msgs, mc) < mc.keep_recent {
                return Err(Fallback("fewer recent calls than micro-compaction keeps"));
            }
        }
        Ok(())
    }
}

impl PassEnd for CheckpointSeam<'_> {
    /// Closes the pass's stage; after a checkpoint, the tail must still start with an assistant
    /// turn, or a pass of the whole window would have merged its first user turn into the
    /// prefix's last (or paired it with the prefix's last assistant turn).
    fn pass_done(&mut self, msgs: &[Msg], ctx: &mut Ctx) -> Result<(), Fallback> {
        ctx.end_stage();
        if self.prefix.is_some() && msgs.first().is_some_and(Msg::is_user) {
            return Err(Fallback(
                "a user turn would join the checkpoint's last turn",
            ));
        }
        Ok(())
    }
}

/// The checks of a tail against its prefix, entry by entry.
fn check_tail(prefix: &Prefix, tail: &[Entry]) -> Result<(), Fallback> {
    if tail.first().and_then(|e| e.seq) != prefix.resume_seq {
        return Err(Fallback(
            "the entries do not start where the checkpoint ends",
        ));
    }
    let facts = &prefix.facts;
    let uuids: HashSet<&str> = tail.iter().filter_map(|e| e.uuid.as_deref()).collect();
    let mut last_seq = None;
    for e in tail {
        let Some(seq) = e.seq else {
            return Err(Fallback("an entry without a seq"));
        };
        if last_seq.is_some_and(|last| seq <= last) {
            return Err(Fallback("entries out of seq order"));
        }
        last_seq = Some(seq);
        if e.is_compact_boundary() {
            return Err(Fallback("a new compact boundary"));
        }
        if e.uuid
            .as_deref()
            .is_some_and(|u| facts.snipped.contains(&hash(u)))
        {
            return Err(Fallback("an earlier snip hides a new entry"));
        }
        if e.is_snip() {
            let removed = e.snip_metadata.iter().flat_map(|m| m.removed_uuids.iter());
            if removed.into_iter().any(|u| !uuids.contains(u.as_str())) {
                return Err(Fallback("a snip hides an entry before the tail"));
            }
        }
    }
    Ok(())
}

/// Whether a server result, or the output of a provider-native call, among `msgs` answers a
/// call that is not among them, or a client call names one as its `caller`: the prefix sent
/// that call as it was then, unanswered.
fn answers_an_earlier_call(msgs: &[Msg]) -> bool {
    let blocks = || msgs.iter().flat_map(|m| m.blocks.iter());
    let calls: HashSet<&str> = blocks()
        .filter(|b| is_server_use(&b.v))
        .filter_map(|b| str_field(&b.v, "id"))
        .collect();
    let native_calls: HashSet<&str> = blocks()
        .filter(|b| native_block(&b.v).is_some_and(|(_, in_response)| in_response))
        .filter_map(|b| str_field(&b.v, "call_id"))
        .collect();
    blocks().any(|b| {
        (is_server_result(&b.v)
            && str_field(&b.v, "tool_use_id").is_none_or(|id| !calls.contains(id)))
            || caller_of(&b.v).is_some_and(|id| !calls.contains(id))
            || (native_block(&b.v).is_some_and(|(_, in_response)| !in_response)
                && str_field(&b.v, "call_id").is_none_or(|id| !native_calls.contains(id)))
    })
}

/// Whether an entry holds a `compaction` block (of any provider: conservative).
fn holds_compaction(e: &Entry) -> bool {
    matches!(
        e.message.as_ref().map(|m| &m.content),
        Some(Content::Blocks(blocks)) if blocks.iter().any(|b| compaction(b).is_some())
    )
}

#[cfg(test)]
mod tests {
    use super::super::ids::mint;
    use super::super::testutil::*;
    use super::super::{normalize, Provider};
    use super::*;
    use serde_json::json;

    /// Reads `entries[..first]`, keeps the checkpoint, then reads all of `entries` from it: the
    /// incremental answer, or `None` when it fell back. Either way the read must not disagree with
    /// `normalize`.
    fn read_after(entries: &[Entry], first: usize, opts: &NormalizeOptions) -> Option<Value> {
        let mut cp = Checkpoint::start();
        let run = cp.continue_with(&entries[..first], opts).unwrap();
        assert_eq!(
            run.advance(&mut cp, &entries[..first]).1,
            Advance::Moved,
            "a cut"
        );
        let resume = cp.resume_seq().unwrap();
        let at = entries.iter().position(|e| e.seq == Some(resume)).unwrap();
        let got = cp
            .continue_with(&entries[at..], opts)
            .ok()
            .map(|run| serde_json::to_value(run.normalized(&cp)).unwrap());
        if let Some(got) = &got {
            assert_eq!(
                got,
                &serde_json::to_value(normalize(entries, opts)).unwrap()
            );
        }
        got
    }

    fn snip(seq: i64, uuids: &[&str]) -> Entry {
        let mut e = system(seq, "snip", json!(""));
        e.snip_metadata = Some(crate::history::SnipMetadata {
            removed_uuids: uuids.iter().map(|u| u.to_string()).collect(),
        });
        e
    }

    #[test]
    fn appended_rounds_are_read_from_the_checkpoint() {
        let e = vec![
            user(0, json!("go")),
            asst(1, "A", json!([tu("t1")])),
            user(2, json!([tr("t1")])),
            asst(3, "B", json!([tu("t2")])),
            user(4, json!([tr("t2")])),
            asst(5, "C", json!([text("done")])),
        ];
        for provider in [
            Provider::Anthropic,
            Provider::Openai,
            Provider::OpenaiResponses,
            Provider::Gemini,
        ] {
            let opts = NormalizeOptions {
                provider,
                cache: true,
                ..Default::default()
            };
            assert!(read_after(&e, 3, &opts).is_some(), "{provider:?}");
        }
    }

    /// A server-side compaction stands for everything before it: wherever a checkpoint is cut,
    /// before or after it, a read from the checkpoint equals the plain read, which starts at it.
    #[test]
    fn reads_around_a_server_side_compaction_equal_the_plain_read() {
        let e = vec![
            user(0, json!("go")),
            asst(1, "A", json!([text("long answer")])),
            user(2, json!("more")),
            asst(
                3,
                "B",
                json!([{"type": "compaction", "content": "summary"}, text("on")]),
            ),
            user(4, json!("next")),
            asst(5, "C", json!([text("fine")])),
            user(6, json!("last")),
        ];
        every_cut_reads_as_the_plain_read(&e, "long answer");
    }

    /// Programmatic tool calling: whether the prefix keeps a code-execution call depends on the
    /// next response, which answers it; a read from any checkpoint equals the plain read.
    #[test]
    fn reads_around_a_deferred_server_result_equal_the_plain_read() {
        let e = vec![
            user(0, json!("count the rows")),
            asst(
                1,
                "A",
                json!([{"type": "server_tool_use", "id": "srvtoolu_1", "name": "code_execution",
                    "input": {"code": "rows = await query_db()"}},
                {"type": "tool_use", "id": "toolu_1", "name": "query_db", "input": {},
                    "caller": {"type": "code_execution_20250825", "tool_id": "srvtoolu_1"}}]),
            ),
            user(
                2,
                json!([{"type": "tool_result", "tool_use_id": "toolu_1", "content": "[1,2,3]"}]),
            ),
            asst(
                3,
                "B",
                json!([{"type": "code_execution_tool_result", "tool_use_id": "srvtoolu_1",
                    "content": {"type": "code_execution_result", "stdout": "3 rows", "stderr": "",
                        "return_code": 0, "content": []}}, text("There are 3 rows.")]),
            ),
            user(4, json!("thanks")),
            asst(5, "C", json!([text("You are welcome.")])),
            user(6, json!("bye")),
        ];
        every_cut_reads_as_the_plain_read(&e, "no such text");
    }

    /// A Responses custom tool call answered in the next turn: whether it is sent as it was
    /// returned depends on that answer; a read from any checkpoint equals the plain read.
    #[test]
    fn reads_around_a_native_call_and_its_output_equal_the_plain_read() {
        let e = vec![
            user(0, json!("patch it")),
            asst(
                1,
                "resp_1",
                json!([{"type": "custom_tool_call", "call_id": "call_1", "name": "apply", "input": "diff"}]),
            ),
            user(
                2,
                json!([{"type": "custom_tool_call_output", "call_id": "call_1", "output": "ok"}]),
            ),
            asst(3, "resp_2", json!([text("Patched.")])),
            user(4, json!("thanks")),
            asst(5, "resp_3", json!([text("Welcome.")])),
            user(6, json!("bye")),
        ];
        every_cut_reads_as_the_plain_read(&e, "no such text");
    }

    /// For every provider and every place a checkpoint can be cut in `e`, a read resumed from
    /// it equals the plain read, which never holds `absent`.
    fn every_cut_reads_as_the_plain_read(e: &[Entry], absent: &str) {
        for provider in [
            Provider::Anthropic,
            Provider::Openai,
            Provider::OpenaiResponses,
            Provider::Gemini,
        ] {
            let opts = NormalizeOptions {
                provider,
                ..Default::default()
            };
            let plain = serde_json::to_value(normalize(e, &opts)).unwrap();
            assert!(!plain.to_string().contains(absent), "{plain}");
            for first in 1..e.len() {
                let mut cp = Checkpoint::start();
                let run = cp.continue_with(&e[..first], &opts).unwrap();
                if run.advance(&mut cp, &e[..first]).1 != Advance::Moved {
                    continue;
                }
                let at = e.iter().position(|x| x.seq == cp.resume_seq()).unwrap();
                if let Ok(run) = cp.continue_with(&e[at..], &opts) {
                    let read = serde_json::to_value(run.normalized(&cp)).unwrap();
                    assert_eq!(read, plain, "{provider:?}, cut after {first}");
                }
            }
        }
    }

    #[test]
    fn a_tail_whose_first_turn_drops_falls_back() {
        // Snipping the content fragment leaves the first response thinking-only: it is dropped,
        // and the next prompt would join the prefix's last user turn.
        let e = vec![
            user(0, json!("go")),
            asst(1, "X", json!([thinking("t")])),
            asst(2, "X", json!([text("a")])),
            user(3, json!("next")),
            snip(4, &["u2"]),
        ];
        assert_eq!(read_after(&e, 3, &NormalizeOptions::default()), None);
    }

    #[test]
    fn a_minted_id_equal_to_a_stored_one_falls_back() {
        let minted = mint("functions.Bash:0", "toolu_", &HashSet::new());
        let e = vec![
            user(0, json!("go")),
            asst(1, "A", json!([tu(&minted)])),
            user(2, json!([tr(&minted)])),
            asst(3, "B", json!([text("b")])),
            user(4, json!("more")),
            asst(5, "C", json!([tu("functions.Bash:0")])),
            user(6, json!([tr("functions.Bash:0")])),
        ];
        let e2 = vec![
            user(0, json!("go")),
            asst(1, "A", json!([text("a")])),
            user(2, json!("more")),
            asst(3, "B", json!([tu("functions.Bash:0")])),
            user(4, json!([tr("functions.Bash:0")])),
            asst(5, "C", json!([text("c")])),
            user(6, json!("again")),
            asst(7, "D", json!([tu(&minted)])),
            user(8, json!([tr(&minted)])),
        ];
        // The checkpoint ends before the last response: `e` keeps the stored id and the tail mints
        // it; `e2` keeps the minted id and the tail stores it.
        assert_eq!(read_after(&e, 4, &NormalizeOptions::default()), None);
        assert_eq!(read_after(&e2, 6, &NormalizeOptions::default()), None);
    }

    #[test]
    fn a_media_error_after_a_snipped_first_entry_falls_back() {
        // The error's walk back skips the snipped response and strips the prefix's image.
        let mut meta = user(
            2,
            json!([text("m"), {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG}}]),
        );
        meta.is_meta = true;
        let mut error = asst(4, "E", json!([text("Image was too large. Double press esc to go back and try again with a smaller image.")]));
        error.is_api_error = true;
        let e = vec![
            user(0, json!("q")),
            asst(1, "A", json!([text("a")])),
            meta,
            asst(3, "B", json!([text("b")])),
            error,
            snip(5, &["u3"]),
            asst(6, "C", json!([text("c")])),
        ];
        assert_eq!(read_after(&e, 4, &NormalizeOptions::default()), None);
    }

    #[test]
    fn crossing_twenty_images_with_a_large_one_before_falls_back() {
        const PNG_3000: &str = "iVBORw0KGgoAAAANSUhEUgAAC7gAAAu4CAYAAAAAAAAA";
        let image = |data: &str| json!({"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": data}});
        let mut many = vec![text("twenty more")];
        many.extend((0..20).map(|_| image(PNG)));
        let e = vec![
            user(0, json!([text("look"), image(PNG_3000)])),
            asst(1, "A", json!([text("a")])),
            user(2, json!("more")),
            asst(3, "B", json!([text("b")])),
            user(4, Value::Array(many)),
            asst(5, "C", json!([text("c")])),
        ];
        assert_eq!(read_after(&e, 4, &NormalizeOptions::default()), None);
    }

    #[test]
    fn pages_without_a_cut_give_up_once_too_many_wait() {
        // One long assistant response streamed in fragments: no closed round to page at.
        let e: Vec<Entry> = std::iter::once(user(0, json!("go")))
            .chain((1..12).map(|i| asst(i, "A", json!([text(&format!("part {i}"))]))))
            .collect();
        let mut read = PagedRead::new(NormalizeOptions::default(), 6);
        assert_eq!(read.feed(e[..4].to_vec()), Ok(()));
        assert_eq!(read.feed(e[4..8].to_vec()), Err(NO_CUT), "8 entries wait");
        // With room enough the same pages answer, equal to the whole read.
        let mut read = PagedRead::new(NormalizeOptions::default(), usize::MAX);
        read.feed(e[..4].to_vec()).unwrap();
        read.feed(e[4..8].to_vec()).unwrap();
        let (checkpoint, run, _) = read.finish(e[8..].to_vec()).unwrap();
        assert_eq!(
            serde_json::to_value(run.json(&checkpoint)).unwrap(),
            serde_json::to_value(normalize(&e, &NormalizeOptions::default())).unwrap()
        );
    }
}
