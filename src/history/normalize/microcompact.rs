//! Optional client-side micro-compaction of old tool results (see [`MicrocompactOptions`]).

use std::collections::{HashMap, HashSet};

use serde_json::Value;

use super::blocks::{content_bytes, is_type, str_field, CLEARED_PREFIX, STUB_PREFIX};
use super::{Ctx, MicrocompactOptions, Msg, RepairKind};

/// Its own placeholder, or a stub of reversible clearing (which runs before it).
fn already_cleared(content: Option<&Value>) -> bool {
    matches!(content, Some(Value::String(s))
        if s.starts_with(CLEARED_PREFIX) || s.starts_with(STUB_PREFIX))
}

/// Clears the content of results of compactable tools older than the last `keep_recent`
/// compactable calls (call order = `tool_use` order), when at least `min_bytes` long:
/// `[Old tool result content cleared: <tool>, <bytes> bytes]`. `tool_use_id` and `is_error` are kept.
/// Already-cleared results are left alone (so the step is idempotent). Reports `microcompacted`.
pub fn microcompact(msgs: &mut [Msg], opts: &MicrocompactOptions, ctx: &mut Ctx) {
    let tools: HashSet<&str> = opts.tools.iter().map(String::as_str).collect();
    let mut calls: Vec<(&str, String)> = Vec::new();
    for m in msgs.iter().filter(|m| m.is_assistant()) {
        for b in m.blocks.iter().filter(|b| is_type(&b.v, "tool_use")) {
            let name = str_field(&b.v, "name").unwrap_or("");
            if let Some(&t) = tools.get(name) {
                calls.push((t, str_field(&b.v, "id").unwrap_or("").to_string()));
            }
        }
    }
    let old = calls.len().saturating_sub(opts.keep_recent);
    if old == 0 {
        return;
    }
    let clear: HashMap<String, String> = calls[..old]
        .iter()
        .map(|(t, id)| (id.clone(), t.to_string()))
        .collect();
    for m in msgs.iter_mut().filter(|m| m.is_user()) {
        for b in m.blocks.iter_mut().filter(|b| is_type(&b.v, "tool_result")) {
            let Some(tool) = str_field(&b.v, "tool_use_id").and_then(|id| clear.get(id)) else {
                continue;
            };
            let content = b.v.get("content");
            if already_cleared(content) {
                continue;
            }
            let bytes = content_bytes(content);
            if bytes < opts.min_bytes || bytes == 0 {
                continue;
            }
            let id = str_field(&b.v, "tool_use_id").unwrap_or("").to_string();
            b.v["content"] = Value::String(format!("{CLEARED_PREFIX}: {tool}, {bytes} bytes]"));
            ctx.report(
                RepairKind::Microcompacted,
                [b.src],
                format!("cleared {bytes} bytes of old {tool} result {id}"),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::testutil::*;
    use super::*;
    use serde_json::json;

    fn call(id: &str, name: &str) -> Value {
        json!({"type": "tool_use", "id": id, "name": name, "input": {}})
    }

    fn res(id: &str, content: &str) -> Value {
        json!({"type": "tool_result", "tool_use_id": id, "content": content, "is_error": false})
    }

    #[test]
    fn clears_old_large_results_of_compactable_tools_only() {
        let big = "x".repeat(3000);
        let e = vec![
            asst(
                0,
                "A",
                json!([call("a", "Read"), call("b", "Task"), call("c", "Bash")]),
            ),
            user(
                1,
                json!([res("a", &big), res("b", &big), res("c", "small")]),
            ),
            asst(2, "B", json!([call("d", "Grep")])),
            user(3, json!([res("d", &big)])),
        ];
        let mut m = msgs(&e);
        let mut ctx = Ctx::new(&e);
        let opts = MicrocompactOptions {
            keep_recent: 1,
            min_bytes: 10,
            ..Default::default()
        };
        microcompact(&mut m, &opts, &mut ctx);
        let s = shape(&m);
        assert_eq!(
            s[1].1[0],
            res("a", "[Old tool result content cleared: Read, 3000 bytes]")
        );
        assert_eq!(s[1].1[1], res("b", &big)); // not compactable
        assert_eq!(s[1].1[2], res("c", "small")); // below min_bytes
        assert_eq!(s[3].1[0], res("d", &big)); // recent
        assert_eq!(kinds(&ctx), vec![RepairKind::Microcompacted]);
        // idempotent
        let before = m.clone();
        microcompact(&mut m, &opts, &mut ctx);
        assert_eq!(m, before);
    }

    #[test]
    fn defaults() {
        let d = MicrocompactOptions::default();
        assert_eq!(d.tools.len(), 9);
        assert_eq!((d.keep_recent, d.min_bytes), (5, 2000));
        assert_eq!(
            content_bytes(Some(&json!([{"type": "text", "text": "abc"}]))),
            3
        );
    }
}
