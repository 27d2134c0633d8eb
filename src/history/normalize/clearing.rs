//! Reversible clearing of old tool results (`docs/NORMALIZATION.md` § Clearing).
//!
//! A thread that turns it on sends its old tool results as a short stub naming the tool, the
//! size and the zoom address of the stored message (`zoom 412+1`): the model reads the result
//! whole again with one call of the zoom tool, which the context then offers. Storage is never
//! changed.
//!
//! Which results are old moves **in batches**, so the request stays byte-stable between them (a
//! provider caches the prefix it saw): results stay whole until those whole reach
//! `keep_tokens + batch_tokens`, and then the oldest are cleared until `keep_tokens` or less are
//! left. The rule runs over the results in the order they came, as if clearing had been decided
//! when each arrived ([`frontier`]), so it is a function of the history alone: every read of
//! the same window clears the same results, whenever and however often it is read, and a
//! result once cleared stays cleared as the thread grows. The results of the newest turn (all
//! of a parallel call's, which arrive together) are never cleared: the model has not read them.
//!
//! Only the content of a `tool_result` changes: its `tool_use_id`, its `is_error` and the turn
//! around it stay, so pairing holds for every provider. A stub counts as the result it replaced
//! (its size is in it), so normalizing the output again clears nothing more.

use std::collections::HashMap;

use serde_json::Value;

/// What every stub starts with (defined with the other fixed strings, named here by stub readers).
pub use super::blocks::STUB_PREFIX;
use super::blocks::{content_bytes, is_type, str_field, CLEARED_PREFIX};
use super::{Ctx, Msg, RepairKind};
use crate::history::model::Entry;

/// Results this short are never cleared, whatever `min_bytes` says: a stub is about as long
/// (a 64-character tool name makes one of about 130 bytes), and so is the placeholder a
/// provider's rendering gives an empty result, which must not count on a second pass.
pub const MIN_CLEARED_BYTES: usize = 160;

/// Reversible clearing, as a thread's settings size it (`clearing` in `/settings`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ClearingOptions {
    /// Estimated tokens (bytes / 4) of the newest results left whole after a batch.
    pub keep_tokens: u64,
    /// Tokens of whole results a batch waits for beyond `keep_tokens`, then clears at once: the
    /// larger, the rarer the batches that rewrite the request from the oldest result they clear.
    pub batch_tokens: u64,
    /// Results shorter than this many bytes are never cleared (a stub would save little); below
    /// [`MIN_CLEARED_BYTES`], that floor holds.
    pub min_bytes: usize,
}

impl Default for ClearingOptions {
    /// 2,000 tokens kept, batches of 10,000, results under 1,000 bytes kept: chosen by the cost
    /// curve of the tool-heavy replays (BENCHMARKS.md, "Cost curve"), and under the outline's
    /// default tail (16,000 tokens), so the two compose at their defaults.
    fn default() -> Self {
        ClearingOptions {
            keep_tokens: 2_000,
            batch_tokens: 10_000,
            min_bytes: 1_000,
        }
    }
}

impl ClearingOptions {
    /// The most tokens of results the rule leaves whole once a turn's results are in, the
    /// newest turn's aside: past `keep_tokens + batch_tokens` it clears down to `keep_tokens`.
    /// What an estimate that counts every clearable result as its stub adds back.
    pub fn most_whole_tokens(&self) -> i64 {
        i64::try_from(self.keep_tokens.saturating_add(self.batch_tokens)).unwrap_or(i64::MAX)
    }
}

/// The stub of a cleared result: the tool, the size, and the address zoom opens.
pub fn stub(tool: &str, bytes: usize, seq: i64) -> String {
    format!("{STUB_PREFIX}{tool}, {bytes} bytes; zoom {seq}+1 reads it whole]")
}

/// The size a stub names, if `content` is one.
fn stub_bytes(content: Option<&Value>) -> Option<usize> {
    let rest = content?.as_str()?.strip_prefix(STUB_PREFIX)?;
    let (_, after_tool) = rest.rsplit_once(", ")?;
    let (bytes, _) = after_tool.split_once(" bytes; zoom ")?;
    bytes.parse().ok()
}

fn tokens_of(bytes: usize) -> u64 {
    (bytes as u64).div_ceil(4)
}

/// One result as the rule sees it: its estimated tokens and the turn it came in (the message
/// that holds it: the results of one turn arrive together).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Arrival {
    pub tokens: u64,
    pub turn: usize,
}

/// How many of the results, oldest first (`tokens` each, one a turn), are cleared: after each
/// turn's results arrive, once the whole results since the last one cleared pass `keep_tokens +
/// batch_tokens`, the oldest of them are cleared until `keep_tokens` or less are left, never
/// those that just arrived.
pub fn frontier(tokens: &[u64], opts: &ClearingOptions) -> usize {
    let arrivals: Vec<Arrival> = tokens
        .iter()
        .enumerate()
        .map(|(turn, &tokens)| Arrival { tokens, turn })
        .collect();
    run_rule(&[], &arrivals, opts)
}

/// The rule over `carried` (results that had arrived before, all of them still whole: how it
/// goes on from a checkpoint, `incremental`) and then `arrived`, turn by turn: how many of all
/// of them, oldest first, are cleared.
fn run_rule(carried: &[u64], arrived: &[Arrival], opts: &ClearingOptions) -> usize {
    let tokens = all_tokens(carried, arrived);
    let high = opts.keep_tokens.saturating_add(opts.batch_tokens);
    let mut whole: u64 = carried.iter().sum();
    let mut cleared = 0usize;
    let mut turn_start = carried.len();
    for (i, arrival) in arrived.iter().enumerate() {
        let index = carried.len() + i;
        if i > 0 && arrived[i - 1].turn != arrival.turn {
            turn_start = index;
        }
        whole += arrival.tokens;
        let turn_ends = arrived
            .get(i + 1)
            .is_none_or(|next| next.turn != arrival.turn);
        if turn_ends && whole > high {
            while whole > opts.keep_tokens && cleared < turn_start {
                whole -= tokens[cleared];
                cleared += 1;
            }
        }
    }
    cleared
}

/// The results the rule leaves whole once those of `carried` (whole before, in order) and then
/// `arrived` have come: what a checkpoint carries for the run that goes on after it.
pub fn still_whole(carried: &[u64], arrived: &[Arrival], opts: &ClearingOptions) -> Vec<u64> {
    let cleared = run_rule(carried, arrived, opts);
    all_tokens(carried, arrived).split_off(cleared)
}

/// The tokens of `carried` and then of `arrived`, oldest first.
fn all_tokens(carried: &[u64], arrived: &[Arrival]) -> Vec<u64> {
    carried
        .iter()
        .copied()
        .chain(arrived.iter().map(|a| a.tokens))
        .collect()
}

/// What a counted result is sent as so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Sent {
    Whole,
    /// A stub of this module's.
    Stub,
    /// Micro-compaction's placeholder (it runs after this pass, so only on a second pass): its
    /// size counts, and it is left as it is.
    Microcompacted,
}

/// One result the rule counts: where it is, its size, and how it is sent so far.
struct Counted {
    msg: usize,
    block: usize,
    bytes: usize,
    sent: Sent,
}

impl Counted {
    fn arrival(&self) -> Arrival {
        Arrival {
            tokens: tokens_of(self.bytes),
            turn: self.msg,
        }
    }
}

/// The size micro-compaction's placeholder names, if `content` is one.
fn microcompacted_bytes(content: Option<&Value>) -> Option<usize> {
    let rest = content?.as_str()?.strip_prefix(CLEARED_PREFIX)?;
    let (_, after_tool) = rest.rsplit_once(", ")?;
    after_tool.strip_suffix(" bytes]")?.parse().ok()
}

/// The results the rule counts, in order: each `tool_result` of a stored user entry (a seq to
/// zoom to) longer than `min_bytes` and [`MIN_CLEARED_BYTES`], and every stub, and every
/// placeholder that names such a size, by the size it names, so a second pass counts what the
/// first did. (A placeholder of a shorter result was never counted: counting it would keep
/// every later result whole in the eyes of [`first_whole`].)
fn counted(msgs: &[Msg], opts: &ClearingOptions, entries: &[Entry]) -> Vec<Counted> {
    let mut results = Vec::new();
    for (m, msg) in msgs.iter().enumerate().filter(|(_, m)| m.is_user()) {
        for (k, b) in msg.blocks.iter().enumerate() {
            if !is_type(&b.v, "tool_result") {
                continue;
            }
            let stored = entries.get(b.src as usize);
            if stored.is_none_or(|e| e.seq.is_none()) {
                continue;
            }
            let content = b.v.get("content");
            let (bytes, sent) = if let Some(bytes) = stub_bytes(content) {
                (bytes, Sent::Stub)
            } else if let Some(bytes) = microcompacted_bytes(content) {
                (bytes, Sent::Microcompacted)
            } else {
                (content_bytes(content), Sent::Whole)
            };
            if sent == Sent::Stub || (bytes >= opts.min_bytes && bytes > MIN_CLEARED_BYTES) {
                results.push(Counted {
                    msg: m,
                    block: k,
                    bytes,
                    sent,
                });
            }
        }
    }
    results
}

/// Clears the results [`frontier`] says are old, each reported as `tool_result_cleared` naming
/// the entry that holds it. `carried`: the sizes of results before these messages that the rule
/// had left whole (a run that goes on from a checkpoint); they are stubs in the prefix already
/// (the checkpoint ends before the first result left whole), so clearing them changes nothing
/// here. Returns how many of these messages' results are stubs; `None`, with nothing changed,
/// when the rule does not clear every carried result: the prefix then sends stubs this window
/// would send whole (the checkpoint was made from a longer window than this one).
pub fn clear_old_results(
    msgs: &mut [Msg],
    opts: &ClearingOptions,
    carried: &[u64],
    ctx: &mut Ctx,
) -> Option<usize> {
    let results = counted(msgs, opts, ctx.entries);
    let arrivals: Vec<Arrival> = results.iter().map(Counted::arrival).collect();
    let cleared = run_rule(carried, &arrivals, opts);
    if cleared < carried.len() {
        return None;
    }
    let old = cleared - carried.len();
    if old == 0 {
        return Some(0);
    }
    let tools: HashMap<String, String> = msgs
        .iter()
        .filter(|m| m.is_assistant())
        .flat_map(|m| m.blocks.iter())
        .filter(|b| is_type(&b.v, "tool_use"))
        .map(|b| {
            (
                str_field(&b.v, "id").unwrap_or("").to_owned(),
                str_field(&b.v, "name").unwrap_or("tool").to_owned(),
            )
        })
        .collect();
    for result in results.iter().take(old) {
        if result.sent != Sent::Whole {
            continue;
        }
        let block = &mut msgs[result.msg].blocks[result.block];
        let src = block.src;
        let Some(seq) = ctx.entries.get(src as usize).and_then(|e| e.seq) else {
            continue;
        };
        let id = str_field(&block.v, "tool_use_id").unwrap_or("").to_owned();
        let tool = tools.get(&id).map_or("tool", String::as_str);
        block.v["content"] = Value::String(stub(tool, result.bytes, seq));
        ctx.report(
            RepairKind::ToolResultCleared,
            [src],
            format!(
                "cleared {} bytes of the {tool} result {id}; zoom {seq}+1 reads it",
                result.bytes
            ),
        );
    }
    Some(old)
}

/// The first of `msgs` (final, cleared) that holds a result the rule counts and left whole: a
/// checkpoint must end before it, since a later batch may clear that result (`incremental`).
/// Before it every counted result is a stub, which no later batch changes.
pub fn first_whole(msgs: &[Msg], opts: &ClearingOptions, entries: &[Entry]) -> Option<usize> {
    // A placeholder micro-compaction wrote counts as whole here: a full run would have sent this
    // module's stub for it, had the rule cleared it first.
    counted(msgs, opts, entries)
        .into_iter()
        .find(|r| r.sent != Sent::Stub)
        .map(|r| r.msg)
}

/// The counted results of `msgs[..end]`, oldest first.
pub fn arrivals_before(
    msgs: &[Msg],
    end: usize,
    opts: &ClearingOptions,
    entries: &[Entry],
) -> Vec<Arrival> {
    counted(msgs, opts, entries)
        .into_iter()
        .filter(|r| r.msg < end)
        .map(|r| r.arrival())
        .collect()
}

/// One tool result of a stored entry that the rule counts, for a count made over stored entries
/// (an outline's tail, a thread's stored estimate) rather than over normalized messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StoredResult {
    /// Its entry's index in the run.
    pub entry: usize,
    /// Its turn: results between two assistant entries arrive together.
    pub turn: usize,
    pub bytes: usize,
    /// The tokens its stub sends fewer than it, by the caller's count.
    pub saved: u64,
}

/// The results of a run of stored entries that clearing counts, collected entry by entry, and
/// which of them the rule clears: what the cleared view sends, without normalizing. It follows
/// [`clear_old_results`] but for one approximation: a turn is the results between two assistant
/// entries, where the view's turn is a user message after merging (the same on agent loops).
#[derive(Debug, Default, Clone)]
pub struct StoredResults {
    results: Vec<StoredResult>,
    turn: usize,
    turn_has_results: bool,
}

impl StoredResults {
    /// Notes the counted results of `entry`, the run's `index`th; `count` gives a block's tokens
    /// (the caller's estimate), used for the result and for its stub alike.
    pub fn push(
        &mut self,
        index: usize,
        entry: &Entry,
        opts: &ClearingOptions,
        count: impl Fn(&Value) -> u64,
    ) {
        use crate::history::model::{Content, EntryKind};
        match entry.kind {
            EntryKind::Assistant if self.turn_has_results => {
                self.turn += 1;
                self.turn_has_results = false;
            }
            EntryKind::User if !entry.is_virtual => {
                let Some(Content::Blocks(blocks)) = entry.message.as_ref().map(|m| &m.content)
                else {
                    return;
                };
                for block in blocks.iter().filter(|b| is_type(b, "tool_result")) {
                    let content = block.get("content");
                    if stub_bytes(content).is_some() {
                        continue;
                    }
                    let bytes = content_bytes(content);
                    if bytes < opts.min_bytes || bytes <= MIN_CLEARED_BYTES {
                        continue;
                    }
                    let seq = entry.seq.unwrap_or(index as i64);
                    let stubbed = serde_json::json!({"type": "tool_result",
                        "content": stub("tool", bytes, seq)});
                    self.results.push(StoredResult {
                        entry: index,
                        turn: self.turn,
                        bytes,
                        saved: count(block).saturating_sub(count(&stubbed)),
                    });
                    self.turn_has_results = true;
                }
            }
            _ => {}
        }
    }

    /// The results counted, oldest first.
    pub fn counted(&self) -> &[StoredResult] {
        &self.results
    }

    /// The results the rule clears, oldest first.
    pub fn cleared(&self, opts: &ClearingOptions) -> &[StoredResult] {
        let arrivals: Vec<Arrival> = self
            .results
            .iter()
            .map(|r| Arrival {
                tokens: tokens_of(r.bytes),
                turn: r.turn,
            })
            .collect();
        &self.results[..run_rule(&[], &arrivals, opts)]
    }

    /// Tokens of the results counted and left whole.
    pub fn whole_tokens(&self, opts: &ClearingOptions) -> u64 {
        let cleared = self.cleared(opts).len();
        self.results[cleared..]
            .iter()
            .map(|r| tokens_of(r.bytes))
            .sum()
    }
}

/// Per-entry token counts (`tokens[i]` for the run's `i`th entry) lowered to what the cleared view
/// sends: each result the rule clears counts as its stub.
pub fn lower_to_cleared(tokens: &mut [u64], results: &StoredResults, opts: &ClearingOptions) {
    for result in results.cleared(opts) {
        if let Some(count) = tokens.get_mut(result.entry) {
            *count = count.saturating_sub(result.saved);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::testutil::*;
    use super::*;
    use serde_json::json;

    fn opts(keep: u64, batch: u64) -> ClearingOptions {
        ClearingOptions {
            keep_tokens: keep,
            batch_tokens: batch,
            min_bytes: 10,
        }
    }

    #[test]
    fn the_frontier_moves_in_batches_and_keeps_the_newest() {
        let o = opts(10, 20);
        // Whole results reach 40 > 30 at the fourth: the oldest go until 10 or less are left.
        assert_eq!(frontier(&[10, 10, 10], &o), 0);
        assert_eq!(frontier(&[10, 10, 10, 10], &o), 3);
        // Between batches nothing moves.
        assert_eq!(frontier(&[10, 10, 10, 10, 10], &o), 3);
        assert_eq!(frontier(&[10, 10, 10, 10, 10, 10], &o), 3);
        assert_eq!(frontier(&[10, 10, 10, 10, 10, 10, 10], &o), 6);
        // A result larger than the whole budget is still sent whole while it is the newest.
        assert_eq!(frontier(&[100], &o), 0);
        assert_eq!(frontier(&[100, 1], &o), 1);
    }

    #[test]
    fn the_rule_goes_on_from_what_it_left_whole() {
        let o = opts(30, 50);
        let sizes: Vec<u64> = (0..120).map(|i| (i * 37 % 23) as u64 + 1).collect();
        // Turns of one to three results.
        let arrivals: Vec<Arrival> = sizes
            .iter()
            .enumerate()
            .map(|(i, &tokens)| Arrival {
                tokens,
                turn: i * 2 / 5,
            })
            .collect();
        let turn_starts = (0..arrivals.len())
            .filter(|&i| i == 0 || arrivals[i - 1].turn != arrivals[i].turn)
            .chain([arrivals.len()]);
        for cut in turn_starts {
            let carried = still_whole(&[], &arrivals[..cut], &o);
            let before = cut - carried.len();
            let goes_on = still_whole(&carried, &arrivals[cut..], &o);
            assert_eq!(goes_on, still_whole(&[], &arrivals, &o), "cut at {cut}");
            assert_eq!(
                before + run_rule(&carried, &arrivals[cut..], &o),
                run_rule(&[], &arrivals, &o),
                "cut at {cut}"
            );
        }
    }

    #[test]
    fn a_cleared_result_stays_cleared_as_the_thread_grows() {
        let o = opts(30, 50);
        let sizes: Vec<u64> = (0..200).map(|i| (i * 37 % 23) as u64 + 1).collect();
        let mut last = 0;
        for n in 0..=sizes.len() {
            let f = frontier(&sizes[..n], &o);
            assert!(f >= last, "at {n}: {f} after {last}");
            assert!(n == 0 || f < n, "the newest of {n} is whole");
            last = f;
        }
    }

    fn call(id: &str) -> serde_json::Value {
        json!({"type": "tool_use", "id": id, "name": "Read", "input": {}})
    }

    fn res(id: &str, content: &str) -> serde_json::Value {
        json!({"type": "tool_result", "tool_use_id": id, "content": content})
    }

    #[test]
    fn old_results_become_stubs_with_their_zoom_address_and_a_second_pass_changes_nothing() {
        let big = "x".repeat(400);
        let e = vec![
            user(0, json!("go")),
            asst(1, "A", json!([call("a")])),
            user(2, json!([res("a", &big)])),
            asst(3, "B", json!([call("b")])),
            user(4, json!([res("b", &big)])),
            asst(5, "C", json!([call("c")])),
            user(
                6,
                json!([res("c", &big), {"type": "text", "text": "small"}]),
            ),
        ];
        let mut m = msgs(&e);
        let mut ctx = Ctx::new(&e);
        // 100 tokens each: the third takes the whole results to 300 > 250, down to 100.
        let o = ClearingOptions {
            keep_tokens: 100,
            batch_tokens: 150,
            min_bytes: 10,
        };
        assert_eq!(clear_old_results(&mut m, &o, &[], &mut ctx), Some(2));
        let s = shape(&m);
        assert_eq!(
            s[2].1[0]["content"],
            "[Old tool result cleared: Read, 400 bytes; zoom 2+1 reads it whole]"
        );
        assert_eq!(s[4].1[0]["content"], json!(stub("Read", 400, 4)));
        assert_eq!(s[4].1[0]["tool_use_id"], "b");
        assert_eq!(s[6].1[0]["content"], json!(big));
        assert_eq!(
            kinds(&ctx),
            vec![RepairKind::ToolResultCleared, RepairKind::ToolResultCleared]
        );
        let before = m.clone();
        let mut again = Ctx::new(&e);
        assert_eq!(clear_old_results(&mut m, &o, &[], &mut again), Some(2));
        assert_eq!(m, before);
        assert!(kinds(&again).is_empty());
    }

    #[test]
    fn the_results_of_the_newest_turn_stay_whole_together() {
        // Four parallel results of 100 tokens each pass 250 at once: none of them is cleared
        // while they are the newest turn's; the next turn's arrival clears them.
        let o = opts(100, 150);
        let turn = |turn: usize, n: usize| vec![Arrival { tokens: 100, turn }; n];
        assert_eq!(run_rule(&[], &turn(0, 4), &o), 0);
        let two_turns: Vec<Arrival> = [turn(0, 4), turn(1, 1)].concat();
        assert_eq!(run_rule(&[], &two_turns, &o), 4);
        // One result a turn, the same sizes: the third passes 250 and the two before it go.
        assert_eq!(frontier(&[100; 4], &o), 2);
    }

    #[test]
    fn a_placeholder_of_a_result_too_short_to_clear_is_not_counted() {
        let small = "y".repeat(500);
        let big = "x".repeat(2_000);
        let placeholder = format!("{CLEARED_PREFIX}Read, 500 bytes]");
        let e = vec![
            user(0, json!("go")),
            asst(1, "A", json!([call("a")])),
            user(2, json!([res("a", &placeholder)])),
            asst(3, "B", json!([call("b")])),
            user(4, json!([res("b", &big)])),
            asst(5, "C", json!([call("c")])),
            user(6, json!([res("c", &small)])),
        ];
        let m = msgs(&e);
        let o = ClearingOptions {
            keep_tokens: 100,
            batch_tokens: 150,
            min_bytes: 1_000,
        };
        // The placeholder stood for 500 bytes, under `min_bytes`: the first result the rule
        // counts and leaves whole is the 2,000-byte one.
        assert_eq!(first_whole(&m, &o, &e), Some(4));
        let arrivals = arrivals_before(&m, m.len(), &o, &e);
        assert_eq!(
            arrivals,
            vec![Arrival {
                tokens: 500,
                turn: 4
            }]
        );
    }

    #[test]
    fn a_stub_names_its_size() {
        let s = Value::String(stub("Bash", 1234, 7));
        assert_eq!(stub_bytes(Some(&s)), Some(1234));
        assert_eq!(
            stub_bytes(Some(&json!("[Old tool result cleared: x"))),
            None
        );
        assert_eq!(stub_bytes(Some(&json!("plain"))), None);
    }
}
