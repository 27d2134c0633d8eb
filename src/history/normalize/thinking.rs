//! Loupe — manual thinking (`thinking=enabled`, Anthropic): the assistant turn that opened the tool
//! loop in progress must start with a thinking block (`docs/PROVIDER-RULES.md` D.1.13).

use super::blocks::{is_type, text_block, LOOP_CLOSED};
use super::{Block, Ctx, Msg, RepairKind};

fn is_anthropic_thinking(b: &Block) -> bool {
    is_type(&b.v, "thinking") || is_type(&b.v, "redacted_thinking")
}

fn only_tool_results(m: &Msg) -> bool {
    m.is_user() && !m.blocks.is_empty() && m.blocks.iter().all(|b| is_type(&b.v, "tool_result"))
}

/// The assistant turn that opened the tool loop a checkpointed prefix ends in (`incremental`): a
/// run resumed after the prefix no longer holds it, but the loop may go on in the tail.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoopOpener {
    pub starts_with_thinking: bool,
    pub seq: i64,
    pub uuid: Option<String>,
}

/// Where the tool loop that `msgs` end in starts: just after the last user turn holding anything
/// but tool results; `None` when there is no such turn (the loop may have started earlier).
pub fn loop_start(msgs: &[Msg]) -> Option<usize> {
    msgs.iter()
        .rposition(|m| m.is_user() && !only_tool_results(m))
        .map(|i| i + 1)
}

/// Whether a turn opens a loop as manual thinking wants it: with a thinking block.
pub fn starts_with_thinking(m: &Msg) -> bool {
    // A server-side compaction block opening the turn stands for what came before: the turn
    // starts after it.
    m.blocks
        .iter()
        .find(|b| !is_type(&b.v, "compaction"))
        .is_some_and(is_anthropic_thinking)
}

/// A tool loop is in progress when the list ends with a user turn holding only tool results; it
/// was opened by the first assistant turn after the last user turn with anything else. When that
/// turn does not start with thinking (it never had any, or it was dropped: another model's,
/// unsigned), the provider rejects the request, and no signed thinking can be made up: the loop is
/// closed instead by a text block after the last tool results ([`LOOP_CLOSED`]), so the next
/// response starts a new turn (`thinking_loop_closed`). Runs on the final shape (after
/// `enforce`).
pub fn close_loop_without_thinking(msgs: &mut [Msg], ctx: &mut Ctx) {
    close_loop_after(msgs, None, ctx);
}

/// [`close_loop_without_thinking`] for messages that follow a checkpointed prefix whose own loop
/// was opened by `earlier`: when no user turn of `msgs` ends that loop, it is still in progress.
pub fn close_loop_after(msgs: &mut [Msg], earlier: Option<&LoopOpener>, ctx: &mut Ctx) {
    if !msgs.last().is_some_and(only_tool_results) {
        return;
    }
    let start = loop_start(msgs);
    let (thinks, opener_src, earlier) = match (start, earlier) {
        (None, Some(opener)) => (opener.starts_with_thinking, None, Some(opener)),
        _ => {
            let start = start.unwrap_or(0);
            let Some(opener) = msgs[start..].iter().find(|m| m.is_assistant()) else {
                return;
            };
            (
                starts_with_thinking(opener),
                Some(opener.primary_src()),
                None,
            )
        }
    };
    if thinks {
        return;
    }
    let Some(last) = msgs.last_mut() else { return };
    let last_src = last.primary_src();
    last.blocks.push(Block {
        v: text_block(LOOP_CLOSED),
        src: last_src,
    });
    let srcs = opener_src.into_iter().chain([last_src]);
    ctx.report_after(
        RepairKind::ThinkingLoopClosed,
        earlier.map(|o| (o.seq, o.uuid.as_deref())),
        srcs,
        "thinking is enabled but the tool loop in progress was opened without thinking: closed by a text block after its results".into(),
    );
}

#[cfg(test)]
mod tests {
    use super::super::testutil::*;
    use super::super::{normalize, NormalizeOptions, Provider, ThinkingMode};
    use super::*;
    use serde_json::json;

    fn enabled(model: Option<&str>) -> NormalizeOptions {
        NormalizeOptions {
            thinking: ThinkingMode::Enabled,
            model: model.map(str::to_string),
            ..Default::default()
        }
    }

    fn with_model(mut e: crate::history::Entry, model: &str) -> crate::history::Entry {
        e.message.as_mut().unwrap().model = Some(model.into());
        e
    }

    #[test]
    fn loop_opened_with_thinking_is_left_alone() {
        let e = vec![
            user(0, json!("go")),
            asst(1, "X", json!([thinking("t"), tu("a")])),
            user(2, json!([tr("a")])),
            asst(3, "Y", json!([tu("b")])),
            user(4, json!([tr("b")])),
        ];
        let n = normalize(&e, &enabled(None));
        assert_eq!(n.messages.len(), 5);
        assert_eq!(n.messages[4]["content"], json!([tr("b")]));
        assert!(n.repairs.is_empty());
    }

    #[test]
    fn loop_without_thinking_is_closed_and_reported() {
        let e = vec![
            user(0, json!("go")),
            asst(1, "X", json!([text("running"), tu("a")])),
            user(2, json!([tr("a")])),
        ];
        let n = normalize(&e, &enabled(None));
        assert_eq!(
            n.messages[2]["content"],
            json!([tr("a"), text(LOOP_CLOSED)])
        );
        assert_eq!(n.repairs.len(), 1);
        assert_eq!(n.repairs[0].kind, RepairKind::ThinkingLoopClosed);
        assert_eq!(n.repairs[0].seqs, vec![1, 2]);
        // keep mode does not require it, and other providers never do.
        let keep = normalize(&e, &NormalizeOptions::default());
        assert_eq!(keep.messages[2]["content"], json!([tr("a")]));
        let openai = normalize(
            &e,
            &NormalizeOptions {
                provider: Provider::Openai,
                ..enabled(None)
            },
        );
        assert!(openai.repairs.is_empty());
    }

    #[test]
    fn thinking_of_another_model_is_dropped_then_the_loop_closed() {
        let e = vec![
            user(0, json!("go")),
            with_model(asst(1, "X", json!([thinking("t"), tu("a")])), "claude-a"),
            user(2, json!([tr("a")])),
        ];
        let same = normalize(&e, &enabled(Some("claude-a")));
        assert_eq!(same.messages[1]["content"][0], thinking("t"));
        assert!(same.repairs.is_empty());
        let other = normalize(&e, &enabled(Some("claude-b")));
        assert_eq!(other.messages[1]["content"], json!([tu("a")]));
        let kinds: Vec<RepairKind> = other.repairs.iter().map(|r| r.kind).collect();
        assert_eq!(
            kinds,
            vec![
                RepairKind::ForeignThinkingDropped,
                RepairKind::ThinkingLoopClosed
            ]
        );
        assert!(other.repairs[0].detail.contains("claude-a"));
    }

    #[test]
    fn a_user_prompt_ends_the_loop() {
        let e = vec![
            user(0, json!("go")),
            asst(1, "X", json!([tu("a")])),
            user(2, json!([tr("a"), text("and then?")])),
        ];
        assert!(normalize(&e, &enabled(None)).repairs.is_empty());
    }

    /// A turn that opens with a server-side compaction block and then thinks opened its loop
    /// with thinking: nothing is closed.
    #[test]
    fn a_compaction_before_the_thinking_opens_the_loop_with_thinking() {
        let e = vec![
            user(0, json!("go")),
            asst(
                1,
                "X",
                json!([{"type": "compaction", "content": "summary"}, thinking("t"), tu("c1")]),
            ),
            user(2, json!([tr("c1")])),
        ];
        let n = super::super::normalize(
            &e,
            &NormalizeOptions {
                thinking: ThinkingMode::Enabled,
                ..Default::default()
            },
        );
        assert!(
            !n.repairs
                .iter()
                .any(|r| r.kind == RepairKind::ThinkingLoopClosed),
            "{:?}",
            n.repairs
        );
    }
}
