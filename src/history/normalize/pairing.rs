//! Step j — `ensureToolResultPairing` (`docs/NORMALIZATION.md` § Pipeline), extended.

use std::collections::{HashMap, HashSet};

use serde_json::{json, Value};

use super::blocks::{
    block_type, caller_of, is_server_result, is_server_use, is_type, str_field, text_block,
    NO_CONTENT, ORPHANED_TOOL_RESULT, SYNTHETIC_TOOL_RESULT, TOOL_USE_INTERRUPTED,
};
use super::{Block, Ctx, Msg, RepairKind};
use crate::history::model::Role;

/// A synthetic error result for a `tool_use` without one.
pub fn synthetic_result(id: &str) -> serde_json::Value {
    json!({"type": "tool_result", "tool_use_id": id, "content": SYNTHETIC_TOOL_RESULT, "is_error": true})
}

/// One forward pass (reference `ensureToolResultPairing`):
/// - **user** not preceded by an assistant: all its `tool_result`s are orphans and removed; emptied
///   and first → `[Orphaned tool result removed due to conversation resume]`; emptied otherwise →
///   dropped;
/// - **assistant**: a `tool_use` whose id was already seen anywhere earlier (or earlier in the same
///   turn) is removed; Loupe applies the same request-wide check to `server_tool_use` /
///   `mcp_tool_use` ids (one namespace, D1.7). A `server_tool_use`/`mcp_tool_use` without a result
///   block in the same turn is removed; Loupe also removes server result blocks without an earlier
///   use in the turn, and a second result for the same use. Emptied → `[Tool use interrupted]`;
/// - the **next user** message is consumed: orphan results (ids not among this assistant's
///   `tool_use`s) and duplicates (first kept) are removed, missing ones get
///   `{type:'tool_result', tool_use_id, content:'[Tool result missing due to internal error]',
///   is_error:true}`; content = `[synthetic…, results…, other blocks…]` (Loupe hoists results
///   even in a message that was never merged); emptied → `(no content)`;
/// - no next user message (end of list or another assistant) and missing results → a new user
///   message with only the synthetic results is inserted.
pub fn ensure_tool_result_pairing(msgs: Vec<Msg>, ctx: &mut Ctx) -> Vec<Msg> {
    let deferred = deferred_server_results(&msgs);
    let none = HashSet::new();
    // Deferred server calls kept so far and not yet answered: the callers a client call may
    // name in a later turn of the chain.
    let mut open_calls: HashSet<String> = HashSet::new();
    let mut out: Vec<Msg> = Vec::with_capacity(msgs.len() + 1);
    let mut seen: HashSet<String> = HashSet::new();
    let mut iter = msgs.into_iter().peekable();
    while let Some(mut m) = iter.next() {
        if m.is_user() {
            let after_assistant = out.last().is_some_and(Msg::is_assistant);
            if after_assistant {
                fix_results(&mut m, &[], ctx);
                out.push(m);
            } else if remove_orphans(&mut m, out.is_empty(), ctx) {
                out.push(m);
            }
            continue;
        }
        let src = m.primary_src();
        let kept_open = deferred.opens.get(&src).unwrap_or(&none);
        // Only calls their own turn kept can be answered: one removed there (a duplicate) leaves
        // its later result an orphan.
        let answered_here: HashSet<String> = deferred
            .answers
            .get(&src)
            .map(|ids| ids.intersection(&open_calls).cloned().collect())
            .unwrap_or_default();
        fix_assistant(&mut m, &mut seen, kept_open, &answered_here, ctx);
        if !kept_open.is_empty()
            || !open_calls.is_empty()
            || m.blocks.iter().any(|b| caller_of(&b.v).is_some())
        {
            let mut live = open_calls.clone();
            for b in m.blocks.iter().filter(|b| is_server_use(&b.v)) {
                let id = str_field(&b.v, "id").unwrap_or("");
                live.insert(id.to_string());
                if kept_open.contains(id) {
                    open_calls.insert(id.to_string());
                }
            }
            drop_dangling_callers(&mut m, &live, ctx);
            for b in m.blocks.iter().filter(|b| is_server_result(&b.v)) {
                open_calls.remove(str_field(&b.v, "tool_use_id").unwrap_or(""));
            }
        }
        let uses: Vec<(String, u32)> = m
            .blocks
            .iter()
            .filter(|b| is_type(&b.v, "tool_use"))
            .map(|b| (str_field(&b.v, "id").unwrap_or("").to_string(), b.src))
            .collect();
        let asst_src = m.primary_src();
        out.push(m);
        if iter.peek().is_some_and(Msg::is_user) {
            let mut u = iter.next().expect("peeked");
            fix_results(&mut u, &uses, ctx);
            out.push(u);
        } else if !uses.is_empty() {
            let blocks: Vec<Block> = uses
                .iter()
                .map(|(id, src)| {
                    report_synthetic(ctx, id, *src);
                    Block {
                        v: synthetic_result(id),
                        src: *src,
                    }
                })
                .collect();
            let mut u = Msg::new(Role::User, blocks, asst_src);
            u.is_meta = true;
            out.push(u);
        }
    }
    out
}

fn report_synthetic(ctx: &mut Ctx, id: &str, src: u32) {
    ctx.report(
        RepairKind::SyntheticToolResult,
        [src],
        format!("synthetic result for tool_use {id}"),
    );
}

/// Removes every tool_result of a user message that does not follow an assistant. Returns whether
/// the message is kept.
fn remove_orphans(m: &mut Msg, first: bool, ctx: &mut Ctx) -> bool {
    if !m.has_tool_result() {
        return true;
    }
    m.blocks.retain(|b| {
        if is_type(&b.v, "tool_result") {
            let id = str_field(&b.v, "tool_use_id").unwrap_or("");
            ctx.report(
                RepairKind::OrphanToolResultRemoved,
                [b.src],
                format!("removed tool_result {id}: no assistant turn before it"),
            );
            false
        } else {
            true
        }
    });
    if !m.blocks.is_empty() {
        return true;
    }
    if first {
        m.blocks.push(Block {
            v: text_block(ORPHANED_TOOL_RESULT),
            src: m.primary_src(),
        });
        ctx.report(
            RepairKind::PlaceholderContent,
            m.srcs.iter().copied(),
            format!("first message emptied of orphan results set to {ORPHANED_TOOL_RESULT}"),
        );
        return true;
    }
    false
}

/// Server calls whose result arrives in a later response, after the client's tool results
/// (programmatic tool calling, D1.10): code execution calls the client's tools, each call a
/// response of its own, and its result comes in the response after the last. A deferred call's
/// chain runs from the turn that makes it, through tool-result-only user turns that answer the
/// turn before exactly, and assistant turns whose client calls all name open calls as their
/// `caller`, to the assistant turn that answers it. Nearly every read has none: a turn without a
/// server use costs a scan of its blocks.
#[derive(Default)]
struct Deferred {
    /// Per assistant turn (by source): its server calls answered in a later turn.
    opens: HashMap<u32, HashSet<String>>,
    /// Per assistant turn: the server calls of earlier turns it answers.
    answers: HashMap<u32, HashSet<String>>,
}

fn deferred_server_results(msgs: &[Msg]) -> Deferred {
    let ids_of = |m: &Msg, keep: fn(&Value) -> bool, field: &str| -> HashSet<String> {
        m.blocks
            .iter()
            .filter(|b| keep(&b.v))
            .filter_map(|b| str_field(&b.v, field).map(String::from))
            .collect()
    };
    let calls_of = |m: &Msg| ids_of(m, |v| is_type(v, "tool_use"), "id");
    let mut out = Deferred::default();
    // Turns holding a use whose id an earlier use has (pairing removes it and its result, so
    // such a turn cannot carry a chain on): found only once a code execution call is.
    let mut repeats: Option<HashSet<usize>> = None;
    for (i, first) in msgs.iter().enumerate() {
        if !first.is_assistant() || !first.blocks.iter().any(|b| is_code_execution(&b.v)) {
            continue;
        }
        let repeats = repeats.get_or_insert_with(|| repeated_uses(msgs));
        // Only code execution calls tools and answers later; only its own result answers it.
        let answered_in_turn = ids_of(first, is_server_result, "tool_use_id");
        let mut open: HashSet<String> = ids_of(first, is_code_execution, "id")
            .into_iter()
            .filter(|id| !answered_in_turn.contains(id))
            .collect();
        let mut opened = HashSet::new();
        let mut at = i;
        while !open.is_empty() {
            let (Some(between), Some(then)) = (msgs.get(at + 1), msgs.get(at + 2)) else {
                break;
            };
            // The turn between holds the results of the client calls before it, and nothing
            // else: pairing leaves it as it is, as D1.10 needs it.
            let calls = calls_of(&msgs[at]);
            let answers_them = !repeats.contains(&at)
                && between.is_user()
                && then.is_assistant()
                && !calls.is_empty()
                && between.blocks.len() == calls.len()
                && between.blocks.iter().all(|b| is_type(&b.v, "tool_result"))
                && ids_of(between, |v| is_type(v, "tool_result"), "tool_use_id") == calls;
            if !answers_them {
                break;
            }
            let answered: HashSet<String> = ids_of(then, is_code_execution_result, "tool_use_id")
                .intersection(&open)
                .cloned()
                .collect();
            if !answered.is_empty() {
                open.retain(|id| !answered.contains(id));
                opened.extend(answered.iter().cloned());
                out.answers
                    .entry(then.primary_src())
                    .or_default()
                    .extend(answered);
            }
            let continues = then.blocks.iter().any(|b| is_type(&b.v, "tool_use"))
                && then
                    .blocks
                    .iter()
                    .filter(|b| is_type(&b.v, "tool_use"))
                    .all(|b| caller_of(&b.v).is_some_and(|c| open.contains(c)));
            if !continues {
                break;
            }
            at += 2;
        }
        if !opened.is_empty() {
            out.opens.insert(first.primary_src(), opened);
        }
    }
    out
}

/// The assistant turns holding a use (`tool_use`, server use) whose id an earlier use has.
fn repeated_uses(msgs: &[Msg]) -> HashSet<usize> {
    let mut seen: HashSet<&str> = HashSet::new();
    let mut repeats = HashSet::new();
    for (i, m) in msgs.iter().enumerate().filter(|(_, m)| m.is_assistant()) {
        for b in &m.blocks {
            let is_use = is_type(&b.v, "tool_use") || is_server_use(&b.v);
            if is_use && !seen.insert(str_field(&b.v, "id").unwrap_or("")) {
                repeats.insert(i);
            }
        }
    }
    repeats
}

/// A code execution server call (`code_execution`, `bash_code_execution`, …): the calls whose
/// result may come in a later response.
fn is_code_execution(v: &Value) -> bool {
    is_type(v, "server_tool_use")
        && str_field(v, "name").is_some_and(|n| n.contains("code_execution"))
}

/// A code execution call's result (`code_execution_tool_result`, `bash_code_execution_…`).
fn is_code_execution_result(v: &Value) -> bool {
    block_type(v).is_some_and(|t| t.ends_with("code_execution_tool_result"))
}

/// Drops the `caller` of each client call in `m` whose server call is not among `live`: the
/// call was removed, so the tool_use becomes a direct one rather than name a call that is gone.
fn drop_dangling_callers(m: &mut Msg, live: &HashSet<String>, ctx: &mut Ctx) {
    // A call whose result came earlier in the turn has finished: it calls nothing more.
    let mut finished: HashSet<String> = HashSet::new();
    for b in m.blocks.iter_mut() {
        if is_server_result(&b.v) {
            finished.extend(str_field(&b.v, "tool_use_id").map(String::from));
            continue;
        }
        if !is_type(&b.v, "tool_use") {
            continue;
        }
        let Some(caller) = caller_of(&b.v).map(String::from) else {
            continue;
        };
        if live.contains(&caller) && !finished.contains(&caller) {
            continue;
        }
        if let Some(fields) = b.v.as_object_mut() {
            fields.remove("caller");
        }
        let id = str_field(&b.v, "id").unwrap_or("");
        ctx.report(
            RepairKind::ServerToolUseRemoved,
            [b.src],
            format!("tool_use {id} no longer names {caller}, a server call removed or finished, as its caller"),
        );
    }
}

/// Removes duplicate uses, duplicate or orphan server results, and server uses without results.
///
/// One request-wide id namespace covers `tool_use`, `server_tool_use` and `mcp_tool_use` (D1.7:
/// ids unique across the request), so a replayed server-tool fragment is a duplicate like a
/// replayed client call: the later use is removed (`duplicate_tool_use_removed`). A server result
/// needs its use earlier in the turn (`orphan_server_result_removed`) and answers it once (a second
/// result for the same use is `duplicate_tool_result_removed`); a server use left without a result
/// is then removed (`server_tool_use_removed`), unless a later turn answers it (`kept_open`, see
/// [`deferred_server_results`]); `answered_here`: the calls of an earlier turn this one answers.
fn fix_assistant(
    m: &mut Msg,
    seen: &mut HashSet<String>,
    kept_open: &HashSet<String>,
    answered_here: &HashSet<String>,
    ctx: &mut Ctx,
) {
    let had_blocks = !m.blocks.is_empty();
    let id_of = |b: &Block, f: &str| str_field(&b.v, f).unwrap_or("").to_string();
    // Server uses kept in this turn (and those of an earlier turn it answers), and those
    // already answered.
    let mut uses: HashSet<String> = answered_here.clone();
    let mut answered: HashSet<String> = HashSet::new();
    m.blocks.retain(|b| {
        let is_use = is_server_use(&b.v);
        if is_use || is_type(&b.v, "tool_use") {
            let id = id_of(b, "id");
            if seen.contains(&id) {
                ctx.report(
                    RepairKind::DuplicateToolUseRemoved,
                    [b.src],
                    format!(
                        "removed duplicate {} {id}",
                        block_type(&b.v).unwrap_or("tool_use")
                    ),
                );
                return false;
            }
            if is_use {
                uses.insert(id.clone());
            }
            seen.insert(id);
        } else if is_server_result(&b.v) {
            let id = id_of(b, "tool_use_id");
            let ty = block_type(&b.v).unwrap_or("");
            if !uses.contains(&id) {
                ctx.report(
                    RepairKind::OrphanServerResultRemoved,
                    [b.src],
                    format!("removed {ty} {id}: no server_tool_use before it"),
                );
                return false;
            }
            if !answered.insert(id.clone()) {
                ctx.report(
                    RepairKind::DuplicateToolResultRemoved,
                    [b.src],
                    format!("removed duplicate {ty} {id}"),
                );
                return false;
            }
        }
        true
    });
    if uses.len() != answered.len() {
        m.blocks.retain(|b| {
            if !is_server_use(&b.v) {
                return true;
            }
            let id = id_of(b, "id");
            if answered.contains(&id) || kept_open.contains(&id) {
                return true;
            }
            ctx.report(
                RepairKind::ServerToolUseRemoved,
                [b.src],
                format!(
                    "removed {} {id} without its result",
                    block_type(&b.v).unwrap_or("")
                ),
            );
            false
        });
    }
    if had_blocks && m.blocks.is_empty() {
        m.blocks.push(Block {
            v: text_block(TOOL_USE_INTERRUPTED),
            src: m.primary_src(),
        });
        ctx.report(
            RepairKind::PlaceholderContent,
            m.srcs.iter().copied(),
            format!("assistant emptied by pairing repair set to {TOOL_USE_INTERRUPTED}"),
        );
    }
}

/// Makes the user message after an assistant answer exactly `uses`.
fn fix_results(u: &mut Msg, uses: &[(String, u32)], ctx: &mut Ctx) {
    let use_ids: HashSet<&str> = uses.iter().map(|(id, _)| id.as_str()).collect();
    let mut present: HashSet<String> = HashSet::new();
    let mut results: Vec<Block> = Vec::new();
    let mut others: Vec<Block> = Vec::new();
    let mut hoisted = false;
    for b in std::mem::take(&mut u.blocks) {
        if !is_type(&b.v, "tool_result") {
            others.push(b);
            continue;
        }
        let id = str_field(&b.v, "tool_use_id").unwrap_or("").to_string();
        if !use_ids.contains(id.as_str()) {
            ctx.report(
                RepairKind::OrphanToolResultRemoved,
                [b.src],
                format!("removed tool_result {id}: no matching tool_use in the previous turn"),
            );
        } else if present.contains(&id) {
            ctx.report(
                RepairKind::DuplicateToolResultRemoved,
                [b.src],
                format!("removed duplicate tool_result {id}"),
            );
        } else {
            hoisted |= !others.is_empty();
            present.insert(id);
            results.push(b);
        }
    }
    let mut blocks: Vec<Block> = Vec::with_capacity(uses.len() + others.len());
    for (id, src) in uses {
        if !present.contains(id) {
            report_synthetic(ctx, id, *src);
            blocks.push(Block {
                v: synthetic_result(id),
                src: *src,
            });
        }
    }
    blocks.extend(results);
    if hoisted {
        ctx.report(
            RepairKind::ToolResultHoisted,
            u.srcs.iter().copied(),
            "moved tool_result blocks before the other blocks of the turn".into(),
        );
    }
    blocks.extend(others);
    if blocks.is_empty() {
        blocks.push(Block {
            v: text_block(NO_CONTENT),
            src: u.primary_src(),
        });
        u.is_meta = true;
        ctx.report(
            RepairKind::PlaceholderContent,
            u.srcs.iter().copied(),
            format!("user message emptied by pairing repair set to {NO_CONTENT}"),
        );
    }
    u.blocks = blocks;
}

#[cfg(test)]
mod tests {
    use super::super::testutil::*;
    use super::*;
    use serde_json::{json, Value};

    fn run(e: &[crate::history::Entry]) -> (Vec<(Role, Vec<Value>)>, Ctx<'_>) {
        let mut ctx = Ctx::new(e);
        let m = ensure_tool_result_pairing(msgs(e), &mut ctx);
        (shape(&m), ctx)
    }

    #[test]
    fn crash_mid_tool_call_gets_synthetic_result() {
        let e = vec![
            user(0, json!("go")),
            asst(1, "X", json!([text("run"), tu("toolu_A")])),
        ];
        let (s, ctx) = run(&e);
        assert_eq!(s.len(), 3);
        assert_eq!(s[2], (Role::User, vec![synthetic_result("toolu_A")]));
        assert_eq!(kinds(&ctx), vec![RepairKind::SyntheticToolResult]);
        assert_eq!(ctx.repairs[0].seqs, vec![1]);
        assert_eq!(
            ctx.repairs[0].detail,
            "synthetic result for tool_use toolu_A"
        );
    }

    #[test]
    fn missing_result_is_added_first_to_next_user() {
        let e = vec![
            asst(0, "X", json!([tu("A"), tu("B")])),
            user(1, json!([tr("B"), text("hi")])),
        ];
        let (s, _) = run(&e);
        assert_eq!(s[1].1, vec![synthetic_result("A"), tr("B"), text("hi")]);
    }

    #[test]
    fn orphan_and_duplicate_results_removed() {
        let e = vec![
            asst(0, "X", json!([tu("A")])),
            user(1, json!([tr("A"), tr("A"), tr("Z")])),
        ];
        let (s, ctx) = run(&e);
        assert_eq!(s[1].1, vec![tr("A")]);
        assert_eq!(
            kinds(&ctx),
            vec![
                RepairKind::DuplicateToolResultRemoved,
                RepairKind::OrphanToolResultRemoved
            ]
        );
    }

    #[test]
    fn orphan_results_in_user_without_assistant() {
        let e = vec![
            user(0, json!([tr("A")])),
            asst(1, "X", json!([text("a")])),
            user(2, json!("x")),
        ];
        let (s, ctx) = run(&e);
        assert_eq!(s[0].1, vec![text(ORPHANED_TOOL_RESULT)]);
        assert_eq!(
            kinds(&ctx),
            vec![
                RepairKind::OrphanToolResultRemoved,
                RepairKind::PlaceholderContent
            ]
        );
        // a result-only user emptied after an assistant without tool_use gets (no content)
        let e2 = vec![
            user(0, json!("q")),
            asst(1, "X", json!([text("a")])),
            user(2, json!([tr("Q")])),
        ];
        let (s2, _) = run(&e2);
        assert_eq!(s2[2].1, vec![text(NO_CONTENT)]);
    }

    #[test]
    fn duplicate_tool_use_removed_across_and_within_turns() {
        let e = vec![
            asst(0, "X", json!([tu("A"), tu("A")])),
            user(1, json!([tr("A")])),
            asst(2, "Y", json!([tu("A")])),
            user(3, json!([tr("A")])),
        ];
        let (s, ctx) = run(&e);
        assert_eq!(s[0].1, vec![tu("A")]);
        assert_eq!(s[2].1, vec![text(TOOL_USE_INTERRUPTED)]);
        assert_eq!(s[3].1, vec![text(NO_CONTENT)]);
        assert_eq!(
            kinds(&ctx),
            vec![
                RepairKind::DuplicateToolUseRemoved,
                RepairKind::DuplicateToolUseRemoved,
                RepairKind::PlaceholderContent,
                RepairKind::OrphanToolResultRemoved,
                RepairKind::PlaceholderContent,
            ]
        );
    }

    #[test]
    fn server_tool_use_without_result_removed_and_orphan_server_result() {
        let srv = json!({"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search", "input": {}});
        let res =
            json!({"type": "web_search_tool_result", "tool_use_id": "srvtoolu_1", "content": []});
        let orphan =
            json!({"type": "advisor_tool_result", "tool_use_id": "srvtoolu_9", "content": {}});
        let srv2 = json!({"type": "server_tool_use", "id": "srvtoolu_2", "name": "web_search", "input": {}});
        let e = vec![
            asst(0, "X", json!([srv.clone(), res.clone(), text("a")])),
            user(1, json!("q")),
            asst(2, "Y", json!([text("b"), srv2])),
            user(3, json!("q")),
            asst(4, "Z", json!([orphan, text("c")])),
        ];
        let (s, ctx) = run(&e);
        assert_eq!(s[0].1, vec![srv, res, text("a")]);
        assert_eq!(s[2].1, vec![text("b")]);
        assert_eq!(s[4].1, vec![text("c")]);
        assert_eq!(
            kinds(&ctx),
            vec![
                RepairKind::ServerToolUseRemoved,
                RepairKind::OrphanServerResultRemoved
            ]
        );
    }

    /// Proptest minimal case: a replayed (duplicated) `server_tool_use` fragment of a streamed
    /// response merged into one turn holding the same server id twice (D1.7: ids unique
    /// request-wide). The later use is removed like a duplicate `tool_use`; a replayed result is
    /// removed too, and a reused server id in a later turn is a duplicate as well.
    #[test]
    fn duplicate_server_tool_use_ids_removed() {
        let srv = json!({"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search", "input": {}});
        let res =
            json!({"type": "web_search_tool_result", "tool_use_id": "srvtoolu_1", "content": []});
        let e = vec![
            user(0, json!("q")),
            asst(1, "X", json!([srv.clone()])),
            asst(2, "X", json!([srv.clone()])),
            asst(3, "X", json!([res.clone()])),
            asst(4, "X", json!([res.clone(), text("a")])),
            user(5, json!("again")),
            asst(6, "Y", json!([srv.clone(), res.clone(), text("b")])),
        ];
        let mut ctx = Ctx::new(&e);
        let merged = super::super::merge::merge_messages(msgs(&e), &mut ctx);
        ctx.repairs.clear();
        let m = ensure_tool_result_pairing(merged, &mut ctx);
        let s = shape(&m);
        assert_eq!(s[1].1, vec![srv, res, text("a")]);
        assert_eq!(s[3].1, vec![text("b")]);
        assert_eq!(
            kinds(&ctx),
            vec![
                RepairKind::DuplicateToolUseRemoved,
                RepairKind::DuplicateToolResultRemoved,
                RepairKind::DuplicateToolUseRemoved,
                RepairKind::OrphanServerResultRemoved,
            ]
        );
        assert_eq!(ctx.repairs[0].seqs, vec![2]);
        assert_eq!(ctx.repairs[1].seqs, vec![4]);
    }

    #[test]
    fn assistant_followed_by_assistant_gets_inserted_results() {
        let e = vec![
            asst(0, "X", json!([tu("A")])),
            asst(1, "Y", json!([text("b")])),
        ];
        let (s, _) = run(&e);
        assert_eq!(s.len(), 3);
        assert_eq!(s[1], (Role::User, vec![synthetic_result("A")]));
    }

    #[test]
    fn text_before_results_is_hoisted_and_reported() {
        let e = vec![
            asst(0, "X", json!([tu("A")])),
            user(1, json!([text("hi"), tr("A")])),
        ];
        let (s, ctx) = run(&e);
        assert_eq!(s[1].1, vec![tr("A"), text("hi")]);
        assert_eq!(kinds(&ctx), vec![RepairKind::ToolResultHoisted]);
    }

    /// Programmatic tool calling: a code-execution call makes a client tool call, and its own
    /// result arrives in the next response, after the client's result (D1.10). Both stay, and
    /// the `caller` of the client call still names a call that is sent.
    #[test]
    fn a_deferred_server_result_keeps_its_call() {
        let call = json!({"type": "server_tool_use", "id": "srvtoolu_1", "name": "code_execution",
            "input": {"code": "rows = await query_db()"}});
        let client = json!({"type": "tool_use", "id": "toolu_1", "name": "query_db", "input": {},
            "caller": {"type": "code_execution_20250825", "tool_id": "srvtoolu_1"}});
        let result = json!({"type": "code_execution_tool_result", "tool_use_id": "srvtoolu_1",
            "content": {"type": "code_execution_result", "stdout": "3 rows", "stderr": "",
                "return_code": 0, "content": []}});
        let e = vec![
            user(0, json!("count the rows")),
            asst(1, "A", json!([call.clone(), client.clone()])),
            user(
                2,
                json!([{"type": "tool_result", "tool_use_id": "toolu_1", "content": "[1,2,3]"}]),
            ),
            asst(3, "B", json!([result.clone(), text("There are 3 rows.")])),
            user(4, json!("thanks")),
        ];
        let (m, ctx) = run(&e);
        assert!(kinds(&ctx).is_empty(), "{:?}", kinds(&ctx));
        assert_eq!(m[1].1, [call, client]);
        assert_eq!(m[3].1[0], result);
        for provider in [
            super::super::Provider::Anthropic,
            super::super::Provider::Openai,
            super::super::Provider::Gemini,
        ] {
            let opts = super::super::NormalizeOptions {
                provider,
                ..Default::default()
            };
            let sent = serde_json::to_string(&super::super::normalize(&e, &opts).messages).unwrap();
            for read in ["rows = await query_db()", "3 rows", "There are 3 rows."] {
                assert!(sent.contains(read), "{provider:?} lost {read:?}: {sent}");
            }
        }
    }

    /// A chain whose later turn holds another call's result under the same id (an advisor's,
    /// which the advisor step then strips): only a code execution result answers a code
    /// execution call, so the chain's call is not kept waiting for it.
    #[test]
    fn only_a_code_execution_result_answers_a_deferred_call() {
        let call = json!({"type": "server_tool_use", "id": "srvtoolu_9", "name": "code_execution",
            "input": {"code": "await q()"}});
        let client = json!({"type": "tool_use", "id": "toolu_1", "name": "q", "input": {},
            "caller": {"type": "code_execution_20250825", "tool_id": "srvtoolu_9"}});
        let e = vec![
            user(0, json!("go")),
            asst(1, "A", json!([call, client])),
            user(
                2,
                json!([{"type": "tool_result", "tool_use_id": "toolu_1", "content": "rows"}]),
            ),
            asst(
                3,
                "B",
                json!([{"type": "server_tool_use", "id": "srvtoolu_9", "name": "advisor",
                "input": {}}, {"type": "advisor_tool_result", "tool_use_id": "srvtoolu_9",
                "content": {"type": "advisor_result", "text": "advice"}}, text("done")]),
            ),
            user(4, json!("next")),
        ];
        let out = super::super::normalize(&e, &super::super::NormalizeOptions::default());
        let sent = serde_json::to_string(&out.messages).unwrap();
        assert!(!sent.contains("srvtoolu_9"), "{sent}");
        assert!(sent.contains("rows") && sent.contains("done"), "{sent}");
        assert!(out
            .repairs
            .iter()
            .any(|r| r.kind == RepairKind::ServerToolUseRemoved));
    }
}
