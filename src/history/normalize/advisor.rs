//! Step k — `stripAdvisorBlocks` (`docs/NORMALIZATION.md` § Pipeline), when the advisor is not available.

use std::collections::HashSet;

use super::blocks::{
    caller_of, is_blank_text, is_server_result, is_thinking, is_type, str_field, text_block,
    ADVISOR_RESPONSE,
};
use super::{Block, Ctx, Msg, RepairKind};

fn is_advisor(v: &serde_json::Value) -> bool {
    is_type(v, "advisor_tool_result")
        || (is_type(v, "server_tool_use") && str_field(v, "name") == Some("advisor"))
}

/// Removes `advisor_tool_result` blocks and `server_tool_use` blocks named `advisor` from
/// assistant turns. If what remains is empty or only thinking and blank text, a
/// `[Advisor response]` text block is appended. Reports `advisor_stripped` per turn.
pub fn strip_advisor_blocks(msgs: &mut [Msg], ctx: &mut Ctx) {
    // The advisor calls removed: any result answering one, and any client call naming one as its
    // caller, would be left pointing at nothing.
    let calls: HashSet<String> = msgs
        .iter()
        .flat_map(|m| &m.blocks)
        .filter(|b| is_advisor(&b.v) && is_type(&b.v, "server_tool_use"))
        .filter_map(|b| str_field(&b.v, "id").map(String::from))
        .collect();
    for m in msgs.iter_mut().filter(|m| m.is_assistant()) {
        let mut srcs = Vec::new();
        m.blocks.retain_mut(|b| {
            let answers_advisor = is_server_result(&b.v)
                && str_field(&b.v, "tool_use_id").is_some_and(|id| calls.contains(id));
            if is_advisor(&b.v) || answers_advisor {
                srcs.push(b.src);
                return false;
            }
            if caller_of(&b.v).is_some_and(|id| calls.contains(id)) {
                if let Some(fields) = b.v.as_object_mut() {
                    fields.remove("caller");
                }
                srcs.push(b.src);
            }
            true
        });
        if srcs.is_empty() {
            continue;
        }
        let n = srcs.len();
        if m.blocks
            .iter()
            .all(|b| is_thinking(&b.v) || is_blank_text(&b.v))
        {
            m.blocks.push(Block {
                v: text_block(ADVISOR_RESPONSE),
                src: m.primary_src(),
            });
        }
        ctx.report(
            RepairKind::AdvisorStripped,
            srcs,
            format!("removed {n} advisor block(s)"),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::super::testutil::*;
    use super::*;
    use serde_json::json;

    #[test]
    fn strips_advisor_and_fills_remainder() {
        let use_ =
            json!({"type": "server_tool_use", "id": "srvtoolu_1", "name": "advisor", "input": {}});
        let res =
            json!({"type": "advisor_tool_result", "tool_use_id": "srvtoolu_1", "content": {}});
        let web = json!({"type": "server_tool_use", "id": "srvtoolu_2", "name": "web_search", "input": {}});
        let e = vec![
            asst(0, "X", json!([thinking("t"), use_.clone(), res.clone()])),
            asst(1, "Y", json!([text("a"), use_, res, web.clone()])),
            asst(2, "Z", json!([text("plain")])),
        ];
        let mut m = msgs(&e);
        let mut ctx = Ctx::new(&e);
        strip_advisor_blocks(&mut m, &mut ctx);
        let s = shape(&m);
        assert_eq!(s[0].1, vec![thinking("t"), text(ADVISOR_RESPONSE)]);
        assert_eq!(s[1].1, vec![text("a"), web]);
        assert_eq!(s[2].1, vec![text("plain")]);
        assert_eq!(kinds(&ctx), vec![RepairKind::AdvisorStripped; 2]);
    }
}
