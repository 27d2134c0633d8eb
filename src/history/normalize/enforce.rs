//! Loupe's final guarantees (beyond the reference), after pairing, advisor and media steps.

use std::collections::HashMap;

use serde_json::json;

use super::blocks::{
    compaction, completed_with_no_output, is_type, str_field, tool_result_is_empty, NO_CONTENT,
};
use super::cleanup::{ensure_non_empty_assistants, fill_empty_turns, filter_trailing_thinking};
use super::ids::{report_rewrites, rewrite_ids};
use super::merge::merge_user;
use super::{Ctx, Fallback, Msg, PassEnd, Provider, RepairKind};
use crate::history::model::Role;

/// Runs, in order: [`super::ids::sanitize_ids`] (its rewrites, then their reports), [`fill_empty_error_results`],
/// trailing thinking removed and empty assistants filled again (pairing, advisor and media steps
/// can leave them), [`fill_empty_users`], [`enforce_shape_after`]. `after_user`: the messages
/// follow a user turn of a checkpointed prefix (`incremental`), so the first is not the first turn.
/// `pass` ends each pass (see [`PassEnd`]).
pub fn run(
    mut msgs: Vec<Msg>,
    provider: Provider,
    after_user: bool,
    ctx: &mut Ctx,
    pass: &mut dyn PassEnd,
) -> Result<Vec<Msg>, Fallback> {
    let rewrites = rewrite_ids(&mut msgs, provider, ctx);
    pass.pass_done(&msgs, ctx)?;
    report_rewrites(rewrites, ctx);
    pass.pass_done(&msgs, ctx)?;
    fill_empty_error_results(&mut msgs, ctx);
    pass.pass_done(&msgs, ctx)?;
    filter_trailing_thinking(&mut msgs, ctx);
    pass.pass_done(&msgs, ctx)?;
    ensure_non_empty_assistants(&mut msgs, ctx);
    pass.pass_done(&msgs, ctx)?;
    fill_empty_users(&mut msgs, ctx);
    pass.pass_done(&msgs, ctx)?;
    let msgs = enforce_shape_after(msgs, after_user, ctx);
    pass.pass_done(&msgs, ctx)?;
    Ok(msgs)
}

/// An `is_error` tool result must not have empty content: it gets
/// `(<ToolName> completed with no output)` (reference placeholder for empty results).
pub fn fill_empty_error_results(msgs: &mut [Msg], ctx: &mut Ctx) {
    let mut names: HashMap<String, String> = HashMap::new();
    for m in msgs.iter_mut() {
        if m.is_assistant() {
            names.clear();
            for b in m.blocks.iter().filter(|b| is_type(&b.v, "tool_use")) {
                let id = str_field(&b.v, "id").unwrap_or("").to_string();
                names.insert(id, str_field(&b.v, "name").unwrap_or("tool").to_string());
            }
            continue;
        }
        for b in m.blocks.iter_mut().filter(|b| is_type(&b.v, "tool_result")) {
            if b.v.get("is_error") != Some(&json!(true)) || !tool_result_is_empty(&b.v) {
                continue;
            }
            let id = str_field(&b.v, "tool_use_id").unwrap_or("").to_string();
            let name = names.get(&id).map_or("tool", String::as_str);
            let text = completed_with_no_output(name);
            b.v["content"] = json!(text);
            ctx.report(
                RepairKind::PlaceholderContent,
                [b.src],
                format!("empty is_error tool_result {id} set to {text}"),
            );
        }
    }
}

/// A user turn left empty (e.g. all its media capped) gets `(no content)`.
pub fn fill_empty_users(msgs: &mut [Msg], ctx: &mut Ctx) {
    fill_empty_turns(msgs, Role::User, ctx);
}

/// First turn `user` (a `(no content)` user turn is prepended: `leading_user_inserted`), strict
/// alternation (two assistant turns are separated by a `(no content)` user turn:
/// `placeholder_turn_inserted`; two user turns are merged).
pub fn enforce_shape(msgs: Vec<Msg>, ctx: &mut Ctx) -> Vec<Msg> {
    enforce_shape_after(msgs, false, ctx)
}

/// [`enforce_shape`] for messages that follow a user turn (`after_user`, the last turn of a
/// checkpointed prefix): a first assistant turn then needs no leading user turn.
pub fn enforce_shape_after(msgs: Vec<Msg>, after_user: bool, ctx: &mut Ctx) -> Vec<Msg> {
    let mut out: Vec<Msg> = Vec::with_capacity(msgs.len() + 1);
    for m in msgs {
        let src = m.primary_src();
        match out.last_mut() {
            // A server-side compaction block stands for everything before it: it goes first.
            None if m.is_assistant()
                && !after_user
                && m.blocks.first().is_none_or(|b| compaction(&b.v).is_none()) =>
            {
                let mut u = Msg::text(Role::User, NO_CONTENT, src);
                u.is_meta = true;
                out.push(u);
                ctx.report(
                    RepairKind::LeadingUserInserted,
                    [src],
                    format!(
                        "history starts with an assistant turn: {NO_CONTENT} user turn prepended"
                    ),
                );
            }
            Some(last) if last.role == m.role && m.is_user() => {
                let srcs: Vec<u32> = last.srcs.iter().chain(m.srcs.iter()).copied().collect();
                merge_user(last, m);
                ctx.report(
                    RepairKind::UserMessagesMerged,
                    srcs,
                    "merged consecutive user turns".into(),
                );
                continue;
            }
            Some(last) if last.role == m.role => {
                let mut u = Msg::text(Role::User, NO_CONTENT, src);
                u.is_meta = true;
                out.push(u);
                ctx.report(
                    RepairKind::PlaceholderTurnInserted,
                    [last_src(&out), src],
                    format!("{NO_CONTENT} user turn inserted between two assistant turns"),
                );
            }
            _ => {}
        }
        out.push(m);
    }
    out
}

fn last_src(out: &[Msg]) -> u32 {
    out.len().checked_sub(2).map_or(0, |i| out[i].primary_src())
}

#[cfg(test)]
mod tests {
    use super::super::testutil::*;
    use super::*;
    use serde_json::json;

    #[test]
    fn leading_assistant_gets_user_and_assistants_are_separated() {
        let e = vec![
            asst(0, "X", json!([text("a")])),
            asst(1, "Y", json!([text("b")])),
        ];
        let mut ctx = Ctx::new(&e);
        let m = enforce_shape(msgs(&e), &mut ctx);
        let roles: Vec<Role> = m.iter().map(|m| m.role).collect();
        assert_eq!(
            roles,
            vec![Role::User, Role::Assistant, Role::User, Role::Assistant]
        );
        assert_eq!(
            kinds(&ctx),
            vec![
                RepairKind::LeadingUserInserted,
                RepairKind::PlaceholderTurnInserted
            ]
        );
        assert_eq!(ctx.repairs[1].seqs, vec![0, 1]);
    }

    #[test]
    fn empty_error_results_and_users_filled() {
        let e = vec![
            asst(0, "X", json!([tu("a")])),
            user(
                1,
                json!([{"type": "tool_result", "tool_use_id": "a", "is_error": true, "content": []}]),
            ),
        ];
        let mut m = msgs(&e);
        let mut ctx = Ctx::new(&e);
        fill_empty_error_results(&mut m, &mut ctx);
        assert_eq!(
            m[1].blocks[0].v["content"],
            json!("(Bash completed with no output)")
        );
        m[1].blocks.clear();
        fill_empty_users(&mut m, &mut ctx);
        assert_eq!(m[1].blocks[0].v, text(NO_CONTENT));
        assert_eq!(ctx.repairs.len(), 2);
    }
}
