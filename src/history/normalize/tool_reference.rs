//! Step g — `tool_reference` stripping (`docs/NORMALIZATION.md` § Pipeline).

use std::collections::HashSet;

use serde_json::Value;

use super::blocks::{is_type, str_field, text_block, TOOL_REFERENCES_REMOVED};
use super::{Ctx, Msg, RepairKind};

/// Removes `tool_reference` blocks (inside `tool_result` array content of user turns) that name a
/// tool not in `tools`. `tools == None` means every tool is available: nothing is removed. A result
/// emptied this way gets `[{type:'text', text:'[Tool references removed - tools no longer
/// available]'}]`. Reports `tool_reference_stripped` per result.
pub fn strip_tool_references(
    mut msgs: Vec<Msg>,
    tools: Option<&[String]>,
    ctx: &mut Ctx,
) -> Vec<Msg> {
    let Some(tools) = tools else { return msgs };
    let available: HashSet<&str> = tools.iter().map(String::as_str).collect();
    for m in msgs.iter_mut().filter(|m| m.is_user()) {
        for b in m.blocks.iter_mut() {
            if !is_type(&b.v, "tool_result") {
                continue;
            }
            let Some(Value::Array(items)) = b.v.get_mut("content") else {
                continue;
            };
            let mut removed: Vec<String> = Vec::new();
            items.retain(|x| {
                if is_type(x, "tool_reference") {
                    let name = str_field(x, "tool_name").unwrap_or("");
                    if !available.contains(name) {
                        removed.push(name.to_string());
                        return false;
                    }
                }
                true
            });
            if removed.is_empty() {
                continue;
            }
            if items.is_empty() {
                items.push(text_block(TOOL_REFERENCES_REMOVED));
            }
            let id = str_field(&b.v, "tool_use_id").unwrap_or("").to_string();
            ctx.report(
                RepairKind::ToolReferenceStripped,
                [b.src],
                format!(
                    "tool_result {id}: removed references to unavailable tools {}",
                    removed.join(", ")
                ),
            );
        }
    }
    msgs
}

#[cfg(test)]
mod tests {
    use super::super::testutil::*;
    use super::*;
    use serde_json::json;

    fn refs(names: &[&str]) -> Value {
        let items: Vec<Value> = names
            .iter()
            .map(|n| json!({"type": "tool_reference", "tool_name": n}))
            .collect();
        json!({"type": "tool_result", "tool_use_id": "ts", "content": items})
    }

    #[test]
    fn none_keeps_everything() {
        let e = vec![user(0, json!([refs(&["A"])]))];
        let mut ctx = Ctx::new(&e);
        let m = strip_tool_references(msgs(&e), None, &mut ctx);
        assert_eq!(m, msgs(&e));
        assert!(ctx.repairs.is_empty());
    }

    #[test]
    fn strips_unavailable_and_fills_emptied() {
        let e = vec![user(0, json!([refs(&["A", "B"]), refs(&["C"])]))];
        let mut ctx = Ctx::new(&e);
        let tools = vec!["A".to_string()];
        let m = strip_tool_references(msgs(&e), Some(&tools), &mut ctx);
        assert_eq!(
            m[0].blocks[0].v["content"],
            json!([{"type": "tool_reference", "tool_name": "A"}])
        );
        assert_eq!(
            m[0].blocks[1].v["content"],
            json!([text(TOOL_REFERENCES_REMOVED)])
        );
        assert_eq!(kinds(&ctx), vec![RepairKind::ToolReferenceStripped; 2]);
    }
}
