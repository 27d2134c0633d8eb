//! Step i — thinking and empty-content cleanup (`docs/NORMALIZATION.md` § Pipeline, extended).

use std::collections::HashSet;

use serde_json::{json, Value};

use super::blocks::{
    is_blank_text, is_thinking, is_type, str_field, text_block, NO_CONTENT, NO_MESSAGE_CONTENT,
};
use super::merge::merge_adjacent_users;
use super::{Block, Ctx, Fallback, Msg, NoSeam, PassEnd, RepairKind};
use crate::history::model::Role;

/// Runs the cleanup steps in order: [`filter_orphaned_thinking_only`],
/// [`filter_whitespace_only_assistants`], [`remove_empty_text_blocks`],
/// [`filter_trailing_thinking`], adjacent users merged, [`ensure_non_empty_assistants`],
/// [`sanitize_error_tool_results`].
///
/// Deviation from the reference order (trailing thinking before whitespace filtering): empty text
/// blocks are removed first so that e.g. `[thinking, text " "]` cannot be left ending in thinking.
pub fn run(msgs: Vec<Msg>, ctx: &mut Ctx) -> Vec<Msg> {
    run_passes(msgs, ctx, &mut NoSeam).expect("a plain run never falls back")
}

/// [`run`], with `pass` ending each pass (see [`PassEnd`]).
pub fn run_passes(
    msgs: Vec<Msg>,
    ctx: &mut Ctx,
    pass: &mut dyn PassEnd,
) -> Result<Vec<Msg>, Fallback> {
    let msgs = filter_orphaned_thinking_only(msgs, ctx);
    pass.pass_done(&msgs, ctx)?;
    let msgs = filter_whitespace_only_assistants(msgs, ctx);
    pass.pass_done(&msgs, ctx)?;
    let mut msgs = remove_empty_text_blocks(msgs, ctx);
    pass.pass_done(&msgs, ctx)?;
    filter_trailing_thinking(&mut msgs, ctx);
    pass.pass_done(&msgs, ctx)?;
    let mut msgs = merge_adjacent_users(msgs, ctx);
    pass.pass_done(&msgs, ctx)?;
    ensure_non_empty_assistants(&mut msgs, ctx);
    pass.pass_done(&msgs, ctx)?;
    sanitize_error_tool_results(&mut msgs, ctx);
    pass.pass_done(&msgs, ctx)?;
    Ok(msgs)
}

/// `filterOrphanedThinkingOnlyMessages`: an assistant whose content is all thinking /
/// redacted_thinking is dropped unless another assistant with the same `message.id` has
/// non-thinking content. Empty assistants are kept.
pub fn filter_orphaned_thinking_only(msgs: Vec<Msg>, ctx: &mut Ctx) -> Vec<Msg> {
    let thinking_only = |m: &Msg| {
        m.is_assistant() && !m.blocks.is_empty() && m.blocks.iter().all(|b| is_thinking(&b.v))
    };
    if !msgs.iter().any(thinking_only) {
        return msgs;
    }
    let with_content: HashSet<&str> = msgs
        .iter()
        .filter(|m| m.is_assistant() && m.blocks.iter().any(|b| !is_thinking(&b.v)))
        .filter_map(|m| m.id.as_deref())
        .collect();
    let keep: Vec<bool> = msgs
        .iter()
        .map(|m| !thinking_only(m) || m.id.as_deref().is_some_and(|id| with_content.contains(id)))
        .collect();
    let mut out = Vec::with_capacity(msgs.len());
    for (m, k) in msgs.into_iter().zip(keep) {
        if k {
            out.push(m);
        } else {
            ctx.report(
                RepairKind::ThinkingOnlyDropped,
                m.srcs.iter().copied(),
                format!(
                    "dropped thinking-only fragment of response {}",
                    m.id.as_deref().unwrap_or("")
                ),
            );
        }
    }
    out
}

/// `filterWhitespaceOnlyAssistantMessages`: assistants whose blocks are all whitespace-only text
/// are dropped (empty ones are kept). Adjacent users are merged afterwards by [`run`].
pub fn filter_whitespace_only_assistants(msgs: Vec<Msg>, ctx: &mut Ctx) -> Vec<Msg> {
    let mut out = Vec::with_capacity(msgs.len());
    for m in msgs {
        if m.is_assistant() && !m.blocks.is_empty() && m.blocks.iter().all(|b| is_blank_text(&b.v))
        {
            ctx.report(
                RepairKind::WhitespaceAssistantDropped,
                m.srcs.iter().copied(),
                "dropped assistant message made only of whitespace text".into(),
            );
        } else {
            out.push(m);
        }
    }
    out
}

/// Removes empty and whitespace-only text blocks everywhere (top level, and inside `tool_result`
/// array content). A user message left empty is dropped; an assistant left empty is fixed later.
/// Reports `empty_text_removed` per message.
pub fn remove_empty_text_blocks(msgs: Vec<Msg>, ctx: &mut Ctx) -> Vec<Msg> {
    let mut out = Vec::with_capacity(msgs.len());
    for mut m in msgs {
        let mut srcs: Vec<u32> = Vec::new();
        m.blocks.retain_mut(|b| {
            if is_blank_text(&b.v) {
                srcs.push(b.src);
                return false;
            }
            if is_type(&b.v, "tool_result") {
                if let Some(Value::Array(items)) = b.v.get_mut("content") {
                    let before = items.len();
                    items.retain(|x| !is_blank_text(x));
                    if items.len() != before {
                        srcs.push(b.src);
                    }
                }
            }
            true
        });
        if srcs.is_empty() {
            out.push(m);
            continue;
        }
        let dropped = m.is_user() && m.blocks.is_empty();
        let n = srcs.len();
        if dropped {
            srcs.extend(m.srcs.iter().copied());
        }
        ctx.report(
            RepairKind::EmptyTextRemoved,
            srcs,
            format!(
                "removed {n} empty or whitespace-only text block(s){}",
                if dropped {
                    "; user message dropped"
                } else {
                    ""
                }
            ),
        );
        if !dropped {
            out.push(m);
        }
    }
    out
}

/// `filterTrailingThinkingFromLastAssistant`, applied to **every** assistant (an assistant turn may
/// never end with thinking): trailing thinking / redacted_thinking blocks are popped; an emptied
/// assistant gets `[No message content]`.
pub fn filter_trailing_thinking(msgs: &mut [Msg], ctx: &mut Ctx) {
    for m in msgs.iter_mut().filter(|m| m.is_assistant()) {
        let mut srcs = Vec::new();
        while m.blocks.last().is_some_and(|b| is_thinking(&b.v)) {
            srcs.push(m.blocks.pop().map_or(0, |b| b.src));
        }
        if srcs.is_empty() {
            continue;
        }
        let mut detail = format!("removed {} trailing thinking block(s)", srcs.len());
        if m.blocks.is_empty() {
            m.blocks.push(Block {
                v: text_block(NO_MESSAGE_CONTENT),
                src: m.primary_src(),
            });
            detail.push_str(&format!("; content set to {NO_MESSAGE_CONTENT}"));
        }
        ctx.report(RepairKind::TrailingThinkingRemoved, srcs, detail);
    }
}

/// `ensureNonEmptyAssistantContent`, applied to every assistant (the last one is not final in the
/// request: the caller appends a user turn): empty content becomes `(no content)`.
pub fn ensure_non_empty_assistants(msgs: &mut [Msg], ctx: &mut Ctx) {
    fill_empty_turns(msgs, Role::Assistant, ctx);
}

/// Gives every turn of `role` with no content block a `(no content)` text block, reported as
/// `placeholder_content`. The assistant's step is [`ensure_non_empty_assistants`]; the user's
/// comes last, in `enforce`, for turns the later steps emptied.
pub(super) fn fill_empty_turns(msgs: &mut [Msg], role: Role, ctx: &mut Ctx) {
    let what = match role {
        Role::User => "user turn",
        Role::Assistant => "assistant content",
    };
    for m in msgs
        .iter_mut()
        .filter(|m| m.role == role && m.blocks.is_empty())
    {
        m.blocks.push(Block {
            v: text_block(NO_CONTENT),
            src: m.primary_src(),
        });
        ctx.report(
            RepairKind::PlaceholderContent,
            m.srcs.iter().copied(),
            format!("empty {what} set to {NO_CONTENT}"),
        );
    }
}

/// `sanitizeErrorToolResultContent`: an `is_error` tool result whose array content holds non-text
/// items keeps only its texts, joined by `"\n\n"` (one text block, or `[]` with none).
pub fn sanitize_error_tool_results(msgs: &mut [Msg], ctx: &mut Ctx) {
    for m in msgs.iter_mut().filter(|m| m.is_user()) {
        for b in m.blocks.iter_mut() {
            if !is_type(&b.v, "tool_result") || b.v.get("is_error") != Some(&Value::Bool(true)) {
                continue;
            }
            let Some(Value::Array(items)) = b.v.get("content") else {
                continue;
            };
            if items.iter().all(|x| is_type(x, "text")) {
                continue;
            }
            let texts: Vec<&str> = items
                .iter()
                .filter(|x| is_type(x, "text"))
                .filter_map(|x| str_field(x, "text"))
                .collect();
            let content = if texts.is_empty() {
                json!([])
            } else {
                json!([text_block(&texts.join("\n\n"))])
            };
            let id = str_field(&b.v, "tool_use_id").unwrap_or("").to_string();
            b.v["content"] = content;
            ctx.report(
                RepairKind::ErrorToolResultSanitized,
                [b.src],
                format!("is_error tool_result {id}: non-text content removed"),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::testutil::*;
    use super::*;
    use crate::history::model::Role;
    use serde_json::json;

    #[test]
    fn orphaned_thinking_only_dropped_unless_sibling_has_content() {
        let e = vec![
            asst(0, "X", json!([thinking("a")])),
            user(1, json!("p")),
            asst(2, "X", json!([text("x")])),
            asst(3, "Y", json!([thinking("b")])),
            asst(4, "Z", json!([])),
        ];
        let mut ctx = Ctx::new(&e);
        let m = filter_orphaned_thinking_only(msgs(&e), &mut ctx);
        assert_eq!(m.len(), 4);
        assert_eq!(kinds(&ctx), vec![RepairKind::ThinkingOnlyDropped]);
        assert_eq!(ctx.repairs[0].seqs, vec![3]);
    }

    #[test]
    fn whitespace_only_assistants_dropped() {
        let e = vec![
            asst(0, "X", json!([text(" "), text("\n")])),
            asst(1, "Y", json!([text(" "), tu("a")])),
        ];
        let mut ctx = Ctx::new(&e);
        let m = filter_whitespace_only_assistants(msgs(&e), &mut ctx);
        assert_eq!(m.len(), 1);
        assert_eq!(kinds(&ctx), vec![RepairKind::WhitespaceAssistantDropped]);
    }

    #[test]
    fn empty_text_blocks_removed_and_emptied_user_dropped() {
        let e = vec![
            user(
                0,
                json!([text(""), text("real"), {"type": "tool_result", "tool_use_id": "a", "content": [text(" "), text("r")]}]),
            ),
            user(1, json!("   ")),
        ];
        let mut ctx = Ctx::new(&e);
        let m = remove_empty_text_blocks(msgs(&e), &mut ctx);
        assert_eq!(
            shape(&m),
            vec![(
                Role::User,
                vec![
                    text("real"),
                    json!({"type": "tool_result", "tool_use_id": "a", "content": [text("r")]})
                ]
            )]
        );
        assert_eq!(kinds(&ctx), vec![RepairKind::EmptyTextRemoved; 2]);
    }

    #[test]
    fn trailing_thinking_removed_from_every_assistant() {
        let e = vec![
            asst(0, "X", json!([text("a"), thinking("t")])),
            user(1, json!("p")),
            asst(2, "Y", json!([thinking("t")])),
            asst(3, "Z", json!([thinking("t"), text("ok")])),
        ];
        let mut m = msgs(&e);
        let mut ctx = Ctx::new(&e);
        filter_trailing_thinking(&mut m, &mut ctx);
        assert_eq!(shape(&m)[0].1, vec![text("a")]);
        assert_eq!(shape(&m)[2].1, vec![text(NO_MESSAGE_CONTENT)]);
        assert_eq!(shape(&m)[3].1, vec![thinking("t"), text("ok")]);
        assert_eq!(ctx.repairs.len(), 2);
    }

    #[test]
    fn empty_assistants_get_placeholder() {
        let e = vec![asst(0, "X", json!([]))];
        let mut m = msgs(&e);
        let mut ctx = Ctx::new(&e);
        ensure_non_empty_assistants(&mut m, &mut ctx);
        assert_eq!(shape(&m)[0].1, vec![text(NO_CONTENT)]);
        assert_eq!(kinds(&ctx), vec![RepairKind::PlaceholderContent]);
    }

    #[test]
    fn error_results_keep_only_text() {
        let img = json!({"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "A"}});
        let e = vec![user(
            0,
            json!([
                {"type": "tool_result", "tool_use_id": "a", "is_error": true, "content": [text("x"), img.clone(), text("y")]},
                {"type": "tool_result", "tool_use_id": "b", "is_error": true, "content": [img.clone()]},
                {"type": "tool_result", "tool_use_id": "c", "content": [img]},
            ]),
        )];
        let mut m = msgs(&e);
        let mut ctx = Ctx::new(&e);
        sanitize_error_tool_results(&mut m, &mut ctx);
        assert_eq!(m[0].blocks[0].v["content"], json!([text("x\n\ny")]));
        assert_eq!(m[0].blocks[1].v["content"], json!([]));
        assert_eq!(m[0].blocks[2].v["content"].as_array().unwrap().len(), 1);
        assert_eq!(ctx.repairs.len(), 2);
    }

    #[test]
    fn run_thinking_then_blank_never_ends_in_thinking() {
        let e = vec![
            user(0, json!("q")),
            asst(1, "X", json!([thinking("t"), text(" ")])),
        ];
        let mut ctx = Ctx::new(&e);
        let m = run(msgs(&e), &mut ctx);
        assert_eq!(shape(&m)[1].1, vec![text(NO_MESSAGE_CONTENT)]);
    }
}
