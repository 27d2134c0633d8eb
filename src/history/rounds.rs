//! API-round grouping (the loop's `groupMessagesByApiRound`, `docs/NORMALIZATION.md` § Rounds).
//!
//! A round is the unit that compaction may drop or keep as a whole: compaction may cut only at a
//! round start. The rule is the issue's, applied literally: **a round starts at an assistant entry
//! whose `message.id` differs from the previous assistant's id**. The very first assistant has no
//! previous assistant, so it does *not* start a round: the leading user prompt (and anything else
//! before it) and the first response form round one. Every later round starts at an assistant
//! entry carrying a new response id and holds the tool results, attachments and the next user
//! prompt that follow it, up to the next response. The seed's example
//! (`[user, A1, tool_result, A1, user, B2]`) gives exactly two rounds, `[0..=4]` and `[5..=5]`.
//!
//! Differences from the reference code:
//! - The reference compares the first assistant's id with `undefined` (`"A1" !== undefined`), so it
//!   splits the preamble (everything before the first assistant) off as its own group 0. Loupe
//!   does not: the preamble belongs to the first round. This is the only difference for entries
//!   that carry a `message.id`; since rounds only tell compaction where it may cut, keeping the
//!   prompt with its first response just removes one cut point (between a prompt and its answer).
//! - An assistant entry **without** a `message.id` is treated as a distinct response: it starts a
//!   new round (unless it is the first assistant, see above). The reference compares
//!   `undefined !== undefined` (false), which would glue every id-less response of a thread into
//!   one round; Loupe accepts entries from clients that may omit the id, and two id-less assistant
//!   entries are two responses as far as Loupe can tell.

use std::collections::HashSet;

use serde::Serialize;
use serde_json::Value;
use utoipa::ToSchema;

use super::model::{Content, Entry, EntryKind};

/// One API round: a contiguous range of the input slice.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct Round {
    /// `seq` of the first entry (its index when the entry has no seq).
    pub first_seq: i64,
    /// `seq` of the last entry (its index when the entry has no seq).
    pub last_seq: i64,
    /// Index of the first entry in the input slice.
    pub first_index: usize,
    /// Index of the last entry in the input slice (inclusive).
    pub last_index: usize,
    /// Every `tool_use` in the round is answered by a `tool_result` in the round.
    pub closed: bool,
    /// The distinct provider response ids of the round's assistant entries, in order.
    pub response_ids: Vec<String>,
}

/// Groups entries into API rounds (reference `groupMessagesByApiRound`).
///
/// A new round starts only at an assistant entry whose `message.id` differs from the previous
/// assistant's (an id-less assistant counts as different); the first assistant has no previous
/// assistant and continues the first round (see the module docs). Split fragments sharing an id
/// stay in one round even with tool results between them. Unresolved `tool_use` blocks do not hold
/// a round open (they only make it `closed: false`).
pub fn group_rounds(entries: &[Entry]) -> Vec<Round> {
    let mut rounds = Vec::new();
    let mut start: Option<usize> = None;
    // `None` = no assistant seen yet; `Some(None)` = last assistant had no id.
    let mut last_assistant: Option<Option<&str>> = None;
    for (i, entry) in entries.iter().enumerate() {
        if entry.kind == EntryKind::Assistant {
            let id = entry.response_id();
            // The first assistant has no previous assistant: it continues the first round (the
            // issue's rule; the reference splits the preamble off). Id-less responses are
            // distinct (see module docs).
            let new_turn = match (last_assistant, id) {
                (None, _) => false,
                (Some(Some(prev)), Some(cur)) => prev != cur,
                (Some(_), _) => true,
            };
            if new_turn {
                if let Some(s) = start {
                    rounds.push(make_round(entries, s, i - 1));
                }
                start = Some(i);
            }
            last_assistant = Some(id);
        }
        if start.is_none() {
            start = Some(i);
        }
    }
    if let Some(s) = start {
        rounds.push(make_round(entries, s, entries.len() - 1));
    }
    rounds
}

/// What [`group_rounds`] reads of an entry, and nothing more: its kind, seq, response id, and the
/// ids of its `tool_use` and `tool_result` blocks. Rounds of a long window are grouped from these
/// as each entry is read, so no body is held beside the next.
pub fn round_skeleton(mut entry: Entry) -> Entry {
    entry.sent = None;
    entry.content = None;
    entry.compact_metadata = None;
    entry.snip_metadata = None;
    entry.extra = serde_json::Map::new();
    if let Some(message) = entry.message.as_mut() {
        message.usage = None;
        message.model = None;
        message.stop_reason = None;
        message.extra = serde_json::Map::new();
        let blocks = match &message.content {
            Content::Blocks(blocks) => blocks
                .iter()
                .filter_map(|block| {
                    let kind = block.get("type").and_then(Value::as_str)?;
                    let id_field = match kind {
                        "tool_use" => "id",
                        "tool_result" => "tool_use_id",
                        _ => return None,
                    };
                    let mut kept = serde_json::Map::new();
                    kept.insert("type".to_owned(), Value::from(kind));
                    if let Some(id) = block.get(id_field) {
                        kept.insert(id_field.to_owned(), id.clone());
                    }
                    Some(Value::Object(kept))
                })
                .collect(),
            Content::Text(_) => Vec::new(),
        };
        message.content = Content::Blocks(blocks);
    }
    entry
}

fn blocks_of(entry: &Entry) -> &[Value] {
    match entry.message.as_ref().map(|m| &m.content) {
        Some(Content::Blocks(blocks)) => blocks,
        _ => &[],
    }
}

fn make_round(entries: &[Entry], first: usize, last: usize) -> Round {
    let members = &entries[first..=last];
    let mut uses: Vec<&str> = Vec::new();
    let mut results: HashSet<&str> = HashSet::new();
    let mut response_ids: Vec<String> = Vec::new();
    for entry in members {
        match entry.kind {
            EntryKind::Assistant => {
                if let Some(id) = entry.response_id() {
                    if !response_ids.iter().any(|r| r == id) {
                        response_ids.push(id.to_string());
                    }
                }
                for block in blocks_of(entry) {
                    if block.get("type").and_then(Value::as_str) == Some("tool_use") {
                        uses.push(block.get("id").and_then(Value::as_str).unwrap_or(""));
                    }
                }
            }
            EntryKind::User | EntryKind::Attachment => {
                for block in blocks_of(entry) {
                    if block.get("type").and_then(Value::as_str) == Some("tool_result") {
                        if let Some(id) = block.get("tool_use_id").and_then(Value::as_str) {
                            results.insert(id);
                        }
                    }
                }
            }
            _ => {}
        }
    }
    Round {
        first_seq: entries[first].seq_or(first),
        last_seq: entries[last].seq_or(last),
        first_index: first,
        last_index: last,
        closed: uses.iter().all(|id| results.contains(id)),
        response_ids,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn entry(v: Value) -> Entry {
        serde_json::from_value(v).unwrap()
    }

    fn user(seq: i64, content: Value) -> Entry {
        entry(json!({"seq": seq, "type": "user", "message": {"role": "user", "content": content}}))
    }

    fn asst(seq: i64, id: &str, content: Value) -> Entry {
        entry(json!({"seq": seq, "type": "assistant",
            "message": {"role": "assistant", "id": id, "content": content}}))
    }

    /// Rounds grouped from skeletons are the rounds of the whole entries.
    #[test]
    fn skeletons_group_as_the_entries_do() {
        let entries = vec![
            user(0, json!("hello ".repeat(1000))),
            asst(
                1,
                "A1",
                json!([{"type": "text", "text": "x".repeat(5000)},
                {"type": "tool_use", "id": "t1", "name": "Read", "input": {"path": "a"}}]),
            ),
            user(
                2,
                json!([{"type": "tool_result", "tool_use_id": "t1", "content": "y".repeat(9000)}]),
            ),
            asst(
                3,
                "A1",
                json!([{"type": "tool_use", "id": "t2", "name": "Read", "input": {}}]),
            ),
            user(4, json!("next")),
            asst(5, "B2", json!([{"type": "text", "text": "done"}])),
        ];
        let skeletons: Vec<Entry> = entries.iter().cloned().map(round_skeleton).collect();
        assert_eq!(group_rounds(&skeletons), group_rounds(&entries));
        assert!(!group_rounds(&skeletons)[0].closed, "t2 is unanswered");
        let size = |e: &[Entry]| serde_json::to_string(e).unwrap().len();
        assert!(size(&skeletons) * 5 < size(&entries));
    }

    /// The seed's six-message example: exactly two rounds, `[0..=4]` (the prompt, both A1
    /// fragments with the tool result between them, and the next prompt) and `[5..=5]` (B2).
    #[test]
    fn seed_example_gives_two_rounds() {
        let entries = vec![
            user(0, json!("Check the weather")),
            asst(
                1,
                "A1",
                json!([{"type": "text", "text": "Using weather tool..."}, {"type": "tool_use", "id": "tu_1", "name": "weather", "input": {}}]),
            ),
            user(
                2,
                json!([{"type": "tool_result", "tool_use_id": "tu_1", "content": "Sunny"}]),
            ),
            asst(3, "A1", json!([{"type": "text", "text": "It is sunny"}])),
            user(4, json!("Great, thanks")),
            asst(5, "B2", json!([{"type": "text", "text": "You're welcome"}])),
        ];
        let rounds = group_rounds(&entries);
        let r = |first: usize, last: usize, ids: &[&str]| Round {
            first_seq: first as i64,
            last_seq: last as i64,
            first_index: first,
            last_index: last,
            closed: true,
            response_ids: ids.iter().map(|s| s.to_string()).collect(),
        };
        assert_eq!(rounds, vec![r(0, 4, &["A1"]), r(5, 5, &["B2"])]);
    }

    #[test]
    fn empty_input_gives_no_rounds() {
        assert!(group_rounds(&[]).is_empty());
    }

    #[test]
    fn preamble_joins_the_first_response_and_new_ids_split() {
        let entries = vec![
            user(10, json!("hi")),
            asst(11, "X", json!([{"type": "text", "text": "a"}])),
            asst(12, "Y", json!([{"type": "text", "text": "b"}])),
        ];
        let rounds = group_rounds(&entries);
        assert_eq!(rounds.len(), 2);
        assert_eq!((rounds[0].first_seq, rounds[0].last_seq), (10, 11));
        assert_eq!(rounds[0].response_ids, vec!["X".to_string()]);
        assert_eq!((rounds[1].first_seq, rounds[1].last_seq), (12, 12));
    }

    #[test]
    fn first_entry_assistant_starts_first_round() {
        let entries = vec![
            asst(0, "X", json!([{"type": "text", "text": "a"}])),
            user(1, json!("q")),
        ];
        let rounds = group_rounds(&entries);
        assert_eq!(rounds.len(), 1);
        assert_eq!(rounds[0].last_index, 1);
    }

    #[test]
    fn split_fragments_stay_together_and_open_round_is_reported() {
        let entries = vec![
            user(0, json!("go")),
            asst(
                1,
                "X",
                json!([{"type": "tool_use", "id": "A", "name": "t", "input": {}}]),
            ),
            user(
                2,
                json!([{"type": "tool_result", "tool_use_id": "A", "content": "ok"}]),
            ),
            asst(
                3,
                "X",
                json!([{"type": "tool_use", "id": "B", "name": "t", "input": {}}]),
            ),
        ];
        let rounds = group_rounds(&entries);
        assert_eq!(rounds.len(), 1);
        assert_eq!((rounds[0].first_index, rounds[0].last_index), (0, 3));
        assert!(!rounds[0].closed);
        assert_eq!(rounds[0].response_ids, vec!["X".to_string()]);
    }

    #[test]
    fn missing_seq_uses_index_and_idless_assistants_are_distinct() {
        let mut a = asst(0, "X", json!([]));
        a.seq = None;
        a.message.as_mut().unwrap().id = None;
        let mut b = a.clone();
        b.message.as_mut().unwrap().content = Content::Text("x".into());
        let rounds = group_rounds(&[a, b]);
        assert_eq!(rounds.len(), 2);
        assert_eq!(rounds[1].first_seq, 1);
        assert!(rounds[1].response_ids.is_empty());
    }

    #[test]
    fn idless_first_assistant_continues_the_first_round_later_ones_split() {
        let idless = |seq: i64| {
            let mut a = asst(seq, "X", json!([{"type": "text", "text": "a"}]));
            a.message.as_mut().unwrap().id = None;
            a
        };
        let entries = vec![
            user(0, json!("q")),
            idless(1),
            user(2, json!("q2")),
            idless(3),
            asst(4, "Y", json!([{"type": "text", "text": "b"}])),
            idless(5),
        ];
        let spans: Vec<(i64, i64)> = group_rounds(&entries)
            .iter()
            .map(|r| (r.first_seq, r.last_seq))
            .collect();
        assert_eq!(spans, vec![(0, 2), (3, 3), (4, 4), (5, 5)]);
    }

    #[test]
    fn non_model_entries_join_the_current_round() {
        let entries = vec![
            user(0, json!("go")),
            entry(json!({"seq": 1, "type": "progress", "data": {}})),
            asst(2, "X", json!([{"type": "text", "text": "a"}])),
            entry(json!({"seq": 3, "type": "system", "subtype": "informational", "content": "x"})),
        ];
        let rounds = group_rounds(&entries);
        assert_eq!(rounds.len(), 1);
        assert_eq!((rounds[0].first_seq, rounds[0].last_seq), (0, 3));
        let more = vec![
            user(0, json!("go")),
            asst(1, "X", json!([{"type": "text", "text": "a"}])),
            entry(json!({"seq": 2, "type": "progress", "data": {}})),
            asst(3, "Y", json!([{"type": "text", "text": "b"}])),
        ];
        let spans: Vec<(i64, i64)> = group_rounds(&more)
            .iter()
            .map(|r| (r.first_seq, r.last_seq))
            .collect();
        assert_eq!(spans, vec![(0, 2), (3, 3)]);
    }
}
