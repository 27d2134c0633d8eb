//! Step h — same-id fragment merge and `mergeUserMessages` (`docs/NORMALIZATION.md` § Pipeline).

use std::collections::HashMap;

use serde_json::Value;

use super::blocks::is_type;
use super::{Ctx, Msg, RepairKind};

/// `mergeUserMessages(a, b)`: `joinTextAtSeam` (when a's last and b's first blocks are both text,
/// `"\n"` is appended to a's last text; blocks are not concatenated), then `hoistToolResults` (all
/// `tool_result` blocks first, in order). Other fields come from `a`.
pub fn merge_user(a: &mut Msg, b: Msg) {
    if let (Some(last), Some(first)) = (a.blocks.last_mut(), b.blocks.first()) {
        if is_type(&last.v, "text") && is_type(&first.v, "text") {
            if let Some(Value::String(t)) = last.v.get_mut("text") {
                t.push('\n');
            }
        }
    }
    a.blocks.extend(b.blocks);
    a.srcs.extend(b.srcs);
    hoist_tool_results(a);
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
    for m in msgs {
        match out.last_mut() {
            Some(last) if last.is_user() && m.is_user() => {
                merge_user(last, m);
                if merged.last() != Some(&(out.len() - 1)) {
                    merged.push(out.len() - 1);
                }
            }
            _ => out.push(m),
        }
    }
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
    for m in msgs {
        if m.is_user() {
            if let Some(last) = out.last_mut().filter(|l| l.is_user()) {
                merge_user(last, m);
                let li = out.len() - 1;
                if user_merged.last() != Some(&li) {
                    user_merged.push(li);
                }
                if barriers.last() == Some(&li) && out[li].has_tool_result() {
                    barriers.pop();
                }
            } else {
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
                if let Some(id) = &m.id {
                    by_id.insert(id.clone(), out.len());
                }
                out.push(m);
            }
        }
    }
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
