//! Step m — `addCacheBreakpoints` (one message-level marker).

use serde_json::{json, Value};

use super::blocks::{is_thinking, is_type};
use super::Msg;

fn strip_marker(v: &mut Value) {
    if let Some(obj) = v.as_object_mut() {
        obj.shift_remove("cache_control");
    }
}

/// Removes every stored `cache_control` (top-level blocks and blocks nested in tool results, so the
/// request never exceeds the 4-marker limit), then with `cache` puts exactly one
/// `cache_control: {"type":"ephemeral"}` on the last block of the last message, unless that block
/// is `thinking`/`redacted_thinking` (it never is after cleanup). Not a repair: not reported.
pub fn add_cache_breakpoint(msgs: &mut [Msg], cache: bool) {
    for m in msgs.iter_mut() {
        for b in m.blocks.iter_mut() {
            strip_marker(&mut b.v);
            if is_type(&b.v, "tool_result") {
                if let Some(Value::Array(items)) = b.v.get_mut("content") {
                    items.iter_mut().for_each(strip_marker);
                }
            }
        }
    }
    if !cache {
        return;
    }
    if let Some(b) = msgs.last_mut().and_then(|m| m.blocks.last_mut()) {
        if !is_thinking(&b.v) {
            if let Some(obj) = b.v.as_object_mut() {
                obj.insert("cache_control".into(), json!({"type": "ephemeral"}));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::testutil::*;
    use super::*;
    use serde_json::json;

    #[test]
    fn exactly_one_marker_on_last_block() {
        let e = vec![
            user(
                0,
                json!([{"type": "text", "text": "a", "cache_control": {"type": "ephemeral"}}]),
            ),
            asst(1, "X", json!([text("b")])),
            user(2, json!("c")),
        ];
        let mut m = msgs(&e);
        add_cache_breakpoint(&mut m, true);
        let s = shape(&m);
        assert_eq!(s[0].1, vec![text("a")]);
        assert_eq!(
            s[2].1,
            vec![json!({"type": "text", "text": "c", "cache_control": {"type": "ephemeral"}})]
        );
        let mut m2 = msgs(&e);
        add_cache_breakpoint(&mut m2, false);
        assert!(shape(&m2)
            .iter()
            .all(|(_, b)| b.iter().all(|v| v.get("cache_control").is_none())));
    }
}
