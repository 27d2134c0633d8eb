//! Step h — same-id fragment merge and `mergeUserMessages` (`docs/NORMALIZATION.md` § Pipeline).

use std::collections::HashMap;

use serde_json::Value;

use super::blocks::is_type;
use super::{Block, Ctx, Msg, RepairKind};

/// `mergeUserMessages(a, b)`: `joinTextAtSeam` (when a's last and b's first blocks are both text,
/// `"\n"` is appended to a's last text; blocks are not concatenated), then `hoistToolResults` (all
/// `tool_result` blocks first, in order). Other fields come from `a`.
pub fn merge_user(a: &mut Msg, b: Msg) {
    merge_user_run(a, vec![b]);
}

/// `a` merged with every message of `rest` in turn, exactly as repeated [`merge_user`] calls, in
/// time linear in the blocks involved: the tool results and the other blocks are gathered apart
/// and joined once, instead of hoisting the growing message again at every merge (a run of N
/// user messages would cost N² block moves).
pub fn merge_user_run(a: &mut Msg, rest: Vec<Msg>) {
    let mut rest = rest.into_iter();
    let Some(first) = rest.next() else {
        return;
    };
    // The first seam sees `a` as it is; after the first merge `a` is hoisted.
    join_text_at_seam(a.blocks.last_mut(), &first);
    let (mut results, mut others): (Vec<Block>, Vec<Block>) = std::mem::take(&mut a.blocks)
        .into_iter()
        .partition(|b| is_type(&b.v, "tool_result"));
    let absorb = |a: &mut Msg, results: &mut Vec<Block>, others: &mut Vec<Block>, b: Msg| {
        for block in b.blocks {
            if is_type(&block.v, "tool_result") {
                results.push(block);
            } else {
                others.push(block);
            }
        }
        a.srcs.extend(b.srcs);
    };
    absorb(a, &mut results, &mut others, first);
    for b in rest {
        let last = match others.last_mut() {
            Some(last) => Some(last),
            None => results.last_mut(),
        };
        join_text_at_seam(last, &b);
        absorb(a, &mut results, &mut others, b);
    }
    results.extend(others);
    a.blocks = results;
}

fn join_text_at_seam(last: Option<&mut Block>, b: &Msg) {
    if let (Some(last), Some(first)) = (last, b.blocks.first()) {
        if is_type(&last.v, "text") && is_type(&first.v, "text") {
            if let Some(Value::String(t)) = last.v.get_mut("text") {
                t.push('\n');
            }
        }
    }
}

/// User messages waiting to be merged into the message at `into` of the output (the last one),
/// so that a run is merged once ([`merge_user_run`]) rather than message by message.
#[derive(Default)]
struct PendingUsers {
    into: usize,
    msgs: Vec<Msg>,
}

impl PendingUsers {
    fn flush(&mut self, out: &mut [Msg]) {
        if !self.msgs.is_empty() {
            merge_user_run(&mut out[self.into], std::mem::take(&mut self.msgs));
        }
    }
}

/// Moves every `tool_result` block before the other blocks (stable). Returns whether the order
/// changed.
pub fn hoist_tool_results(m: &mut Msg) -> bool {
    let first_other = m.blocks.iter().position(|b| !is_type(&b.v, "tool_result"));
    let needs =
        first_other.is_some_and(|p| m.blocks[p..].iter().any(|b| is_type(&b.v, "tool_result")));
    if needs {
        let (results, others): (Vec<_>, Vec<_>) = std::mem::take(&mut m.blocks)
            .into_iter()
            .partition(|b| is_type(&b.v, "tool_result"));
        m.blocks = results;
        m.blocks.extend(others);
    }
    needs
}

/// Merges adjacent user messages (`mergeAdjacentUserMessages`), reporting `user_messages_merged`.
pub fn merge_adjacent_users(msgs: Vec<Msg>, ctx: &mut Ctx) -> Vec<Msg> {
    let mut out: Vec<Msg> = Vec::with_capacity(msgs.len());
    let mut merged: Vec<usize> = Vec::new();
    let mut pending = PendingUsers::default();
    for m in msgs {
        match out.last() {
            Some(last) if last.is_user() && m.is_user() => {
                let li = out.len() - 1;
                if merged.last() != Some(&li) {
                    merged.push(li);
                }
                pending.into = li;
                pending.msgs.push(m);
            }
            _ => {
                pending.flush(&mut out);
                out.push(m);
            }
        }
    }
    pending.flush(&mut out);
    for i in merged {
        report_users(&out[i], ctx);
    }
    out
}

fn report_users(m: &Msg, ctx: &mut Ctx) {
    ctx.report(
        RepairKind::UserMessagesMerged,
        m.srcs.iter().copied(),
        format!(
            "merged {} consecutive user messages into one turn",
            m.srcs.len()
        ),
    );
}

/// Step h — one forward pass building the result:
/// - a user message merges into a preceding user message ([`merge_user`]), else is pushed;
/// - an assistant message merges into the nearest earlier assistant with the same `message.id`,
///   walking back over different-id assistants and user messages holding a `tool_result`, and
///   stopping at anything else (the reference walk). The walk is O(1): an index by message id plus
///   a stack of "barrier" positions (messages that stop the walk). Assistants without an id never
///   merge.
///
/// `[asst X:tu_A][user tr_A][asst X:tu_B][user tr_B]` becomes `[asst X:tu_A,tu_B][user tr_A,tr_B]`.
/// Reports `fragments_merged` per merged response and `user_messages_merged` per merged turn.
pub fn merge_messages(msgs: Vec<Msg>, ctx: &mut Ctx) -> Vec<Msg> {
    let mut out: Vec<Msg> = Vec::with_capacity(msgs.len());
    let mut by_id: HashMap<String, usize> = HashMap::new();
    let mut barriers: Vec<usize> = Vec::new();
    let mut frag_merged: Vec<usize> = Vec::new();
    let mut user_merged: Vec<usize> = Vec::new();
    // Users merging into the last output message wait here: assistants merged meanwhile go to
    // earlier messages, so nothing reads the last one before the run is flushed.
    let mut pending = PendingUsers::default();
    for m in msgs {
        if m.is_user() {
            if out.last().is_some_and(|l| l.is_user()) {
                let li = out.len() - 1;
                if user_merged.last() != Some(&li) {
                    user_merged.push(li);
                }
                // A barrier user holds no tool_result so far: the merged turn holds one as soon
                // as this message does.
                if barriers.last() == Some(&li) && m.has_tool_result() {
                    barriers.pop();
                }
                pending.into = li;
                pending.msgs.push(m);
            } else {
                pending.flush(&mut out);
                if !m.has_tool_result() {
                    barriers.push(out.len());
                }
                out.push(m);
            }
            continue;
        }
        let floor = barriers.last().copied();
        let target =
            m.id.as_ref()
                .and_then(|id| by_id.get(id).copied())
                .filter(|&t| floor.is_none_or(|f| t > f));
        match target {
            Some(t) => {
                out[t].blocks.extend(m.blocks);
                out[t].srcs.extend(m.srcs);
                frag_merged.push(t);
            }
            None => {
                pending.flush(&mut out);
                if let Some(id) = &m.id {
                    by_id.insert(id.clone(), out.len());
                }
                out.push(m);
            }
        }
    }
    pending.flush(&mut out);
    frag_merged.sort_unstable();
    frag_merged.dedup();
    let mut events: Vec<(usize, bool)> = frag_merged.into_iter().map(|i| (i, true)).collect();
    events.extend(user_merged.into_iter().map(|i| (i, false)));
    events.sort_unstable();
    for (i, is_frag) in events {
        let m = &out[i];
        if is_frag {
            ctx.report(
                RepairKind::FragmentsMerged,
                m.srcs.iter().copied(),
                format!(
                    "merged {} fragments of response {} into one turn",
                    m.srcs.len(),
                    m.id.as_deref().unwrap_or("")
                ),
            );
        } else {
            report_users(m, ctx);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::super::testutil::*;
    use super::*;
    use crate::history::model::Role;
    use serde_json::json;

    #[test]
    fn interleaved_fragments_merge_across_tool_results() {
        let e = vec![
            asst(0, "X", json!([tu("A")])),
            user(1, json!([tr("A")])),
            asst(2, "X", json!([tu("B")])),
            user(3, json!([tr("B")])),
        ];
        let mut ctx = Ctx::new(&e);
        let m = merge_messages(msgs(&e), &mut ctx);
        assert_eq!(
            shape(&m),
            vec![
                (Role::Assistant, vec![tu("A"), tu("B")]),
                (Role::User, vec![tr("A"), tr("B")])
            ]
        );
        assert_eq!(
            kinds(&ctx),
            vec![RepairKind::FragmentsMerged, RepairKind::UserMessagesMerged]
        );
        assert_eq!(ctx.repairs[0].seqs, vec![0, 2]);
        assert_eq!(ctx.repairs[1].seqs, vec![1, 3]);
    }

    #[test]
    fn plain_user_prompt_stops_the_walk() {
        let e = vec![
            asst(0, "X", json!([text("a")])),
            user(1, json!("prompt")),
            asst(2, "X", json!([text("b")])),
        ];
        let mut ctx = Ctx::new(&e);
        let m = merge_messages(msgs(&e), &mut ctx);
        assert_eq!(m.len(), 3);
        assert!(ctx.repairs.is_empty());
    }

    #[test]
    fn walk_skips_other_ids_and_barrier_lifts_when_user_gains_tool_result() {
        // [X][Y][user "hi"][user tr] → user merges → has tool_result → no longer a barrier → X merges.
        let e = vec![
            asst(0, "X", json!([tu("A")])),
            asst(1, "Y", json!([text("y")])),
            user(2, json!("hi")),
            user(3, json!([tr("A")])),
            asst(4, "X", json!([text("more")])),
        ];
        let mut ctx = Ctx::new(&e);
        let m = merge_messages(msgs(&e), &mut ctx);
        assert_eq!(m.len(), 3);
        assert_eq!(m[0].blocks.len(), 2);
        // joinTextAtSeam is not applied (tool_result is not text) but results are hoisted.
        assert_eq!(shape(&m)[2].1, vec![tr("A"), text("hi")]);
    }

    #[test]
    fn join_text_at_seam_and_hoist() {
        let e = vec![
            user(0, json!([text("a")])),
            user(1, json!([text("b"), tr("x")])),
        ];
        let mut ctx = Ctx::new(&e);
        let m = merge_messages(msgs(&e), &mut ctx);
        assert_eq!(
            shape(&m),
            vec![(Role::User, vec![tr("x"), text("a\n"), text("b")])]
        );
    }

    #[test]
    fn idless_assistants_never_merge() {
        let mut a = asst(0, "X", json!([text("a")]));
        a.message.as_mut().unwrap().id = None;
        let b = a.clone();
        let e = vec![a, b];
        let mut ctx = Ctx::new(&e);
        assert_eq!(merge_messages(msgs(&e), &mut ctx).len(), 2);
    }

    #[test]
    fn merge_adjacent_users_reports_once_per_turn() {
        let e = vec![
            user(0, json!("a")),
            user(1, json!("b")),
            user(2, json!("c")),
        ];
        let mut ctx = Ctx::new(&e);
        let m = merge_adjacent_users(msgs(&e), &mut ctx);
        assert_eq!(
            shape(&m),
            vec![(Role::User, vec![text("a\n"), text("b\n"), text("c")])]
        );
        assert_eq!(ctx.repairs.len(), 1);
        assert_eq!(ctx.repairs[0].seqs, vec![0, 1, 2]);
    }
}

#[cfg(test)]
mod run_props {
    use super::*;
    use crate::history::model::Role;
    use proptest::prelude::*;
    use serde_json::json;

    /// The merge as first written: seam, append, hoist the whole message again.
    fn merge_user_plain(a: &mut Msg, b: Msg) {
        join_text_at_seam(a.blocks.last_mut(), &b);
        a.blocks.extend(b.blocks);
        a.srcs.extend(b.srcs);
        hoist_tool_results(a);
    }

    fn block(kind: u8, src: u32) -> Block {
        let v = match kind % 3 {
            0 => json!({"type": "text", "text": format!("t{src}")}),
            1 => json!({"type": "tool_result", "tool_use_id": format!("id{src}"), "content": "r"}),
            _ => json!({"type": "image", "source": {"type": "base64", "data": "x"}}),
        };
        Block { v, src }
    }

    fn user_msgs(shapes: &[Vec<u8>]) -> Vec<Msg> {
        shapes
            .iter()
            .enumerate()
            .map(|(i, kinds)| {
                let src = i as u32;
                Msg::new(
                    Role::User,
                    kinds.iter().map(|&k| block(k, src)).collect(),
                    src,
                )
            })
            .collect()
    }

    /// Block type checks made by a whole normalization of `n` consecutive user messages.
    fn checks_for_user_run(n: usize) -> u64 {
        let entries: Vec<crate::history::model::Entry> = (0..n)
            .map(|i| {
                serde_json::from_value(json!({"seq": i, "uuid": format!("u{i}"), "type": "user",
                    "message": {"role": "user", "content": [
                        {"type": "text", "text": format!("line {i}")},
                        {"type": "tool_result", "tool_use_id": format!("t{i}"), "content": "r"}]}}))
                .unwrap()
            })
            .collect();
        let before = super::super::blocks::TYPE_CHECKS.with(|count| count.get());
        let out = crate::history::normalize(&entries, &Default::default());
        assert_eq!(out.messages.len(), 1, "the run becomes one user turn");
        super::super::blocks::TYPE_CHECKS.with(|count| count.get()) - before
    }

    #[test]
    fn normalizing_a_run_of_user_messages_costs_linear_work() {
        // A ladder: four times the messages may cost at most about four times the work (a
        // quadratic merge costs sixteen times).
        let small = checks_for_user_run(500);
        let large = checks_for_user_run(2_000);
        assert!(
            large <= small * 5,
            "500 messages: {small} checks; 2,000 messages: {large} checks"
        );
    }

    proptest! {
        #[test]
        fn run_merge_equals_repeated_plain_merges(
            shapes in proptest::collection::vec(proptest::collection::vec(0u8..3, 0..5), 1..12)
        ) {
            let mut msgs = user_msgs(&shapes);
            let rest = msgs.split_off(1);
            let mut plain = msgs[0].clone();
            for b in rest.clone() {
                merge_user_plain(&mut plain, b);
            }
            let mut run = msgs.remove(0);
            merge_user_run(&mut run, rest);
            prop_assert_eq!(run, plain);
        }
    }
}
