//! OpenAI Responses: the §D.3 invariants of `docs/PROVIDER-RULES.md` (with the §B.2 rows), on the exact
//! `input` item list, plus the shared image rules.

use std::collections::HashMap;

use serde_json::Value;

use super::media::{check_images, data_url, s};
use super::{ResponsesRules, Violation};

/// B2.1: roles of a `message` item.
pub const ROLES: &[&str] = &["user", "assistant", "system", "developer"];
/// Content part types of a user / system message, and of an assistant message.
pub const INPUT_PARTS: &[&str] = &["input_text", "input_image", "input_file", "input_audio"];
pub const OUTPUT_PARTS: &[&str] = &["output_text", "refusal", "input_text"];

/// Validate a Responses `input` list with the default rules.
pub fn validate(items: &[Value]) -> Vec<Violation> {
    validate_with(items, &ResponsesRules::default())
}

fn ty(item: &Value) -> &str {
    s(item.get("type"))
}

/// Calls and outputs pair by `call_id`.
fn pair_kind(t: &str) -> Option<(&'static str, bool)> {
    match t {
        "function_call" => Some(("function", false)),
        "function_call_output" => Some(("function", true)),
        "custom_tool_call" => Some(("custom", false)),
        "custom_tool_call_output" => Some(("custom", true)),
        "computer_call" => Some(("computer", false)),
        "computer_call_output" => Some(("computer", true)),
        "local_shell_call" => Some(("local_shell", false)),
        "local_shell_call_output" => Some(("local_shell", true)),
        "shell_call" => Some(("shell", false)),
        "shell_call_output" => Some(("shell", true)),
        "apply_patch_call" => Some(("apply_patch", false)),
        "apply_patch_call_output" => Some(("apply_patch", true)),
        _ => None,
    }
}

/// Items a response holds that nothing the client sends answers.
const SELF_CONTAINED: &[&str] = &[
    "web_search_call",
    "file_search_call",
    "code_interpreter_call",
    "image_generation_call",
    "mcp_call",
    "mcp_list_tools",
    "item_reference",
    "compaction",
];

/// Validate a Responses `input` list.
pub fn validate_with(items: &[Value], rules: &ResponsesRules) -> Vec<Violation> {
    let mut out = Vec::new();
    if items.is_empty() && !rules.allow_empty {
        out.push(Violation::new("D3.0", None, "input must not be empty"));
    }
    let mut images = Vec::new();
    // D3.1 and the item shapes.
    for (i, item) in items.iter().enumerate() {
        match ty(item) {
            "message" => {
                let role = s(item.get("role"));
                if !ROLES.contains(&role) {
                    out.push(Violation::at("D3.1", i, format!("Invalid value: '{role}'. Supported values are: 'assistant', 'system', 'developer', and 'user'.")));
                }
                let allowed = if role == "assistant" {
                    OUTPUT_PARTS
                } else {
                    INPUT_PARTS
                };
                match item.get("content") {
                    Some(Value::String(_)) => {}
                    Some(Value::Array(parts)) if !parts.is_empty() => {
                        for (j, p) in parts.iter().enumerate() {
                            let pt = ty(p);
                            if !allowed.contains(&pt) {
                                out.push(Violation::at("D3.0", i, format!("input[{i}].content[{j}].type: '{pt}' is not valid in a {role} message")));
                            }
                            if pt.ends_with("_text")
                                && p.get("text").and_then(Value::as_str).is_none()
                            {
                                out.push(Violation::at(
                                    "D3.0",
                                    i,
                                    format!("input[{i}].content[{j}].text: missing"),
                                ));
                            }
                            if pt == "input_image" {
                                if let Some((media, data)) = data_url(s(p.get("image_url"))) {
                                    images.push((
                                        i,
                                        format!("content[{j}]"),
                                        media.to_string(),
                                        data.to_string(),
                                    ));
                                }
                            }
                        }
                    }
                    _ => out.push(Violation::at(
                        "D3.0",
                        i,
                        format!("input[{i}].content: expected a string or a non-empty array"),
                    )),
                }
            }
            "function_call" => {
                if s(item.get("call_id")).is_empty() || s(item.get("name")).is_empty() {
                    out.push(Violation::at(
                        "D3.0",
                        i,
                        format!("input[{i}]: function_call needs call_id and name"),
                    ));
                }
                if !item.get("arguments").is_some_and(Value::is_string) {
                    out.push(Violation::at(
                        "D3.0",
                        i,
                        format!("input[{i}].arguments: expected a string"),
                    ));
                }
            }
            "function_call_output" => {
                if s(item.get("call_id")).is_empty() || item.get("output").is_none() {
                    out.push(Violation::at(
                        "D3.0",
                        i,
                        format!("input[{i}]: function_call_output needs call_id and output"),
                    ));
                }
            }
            "reasoning" => {
                let id = s(item.get("id"));
                if id.is_empty() || !item.get("summary").is_some_and(Value::is_array) {
                    out.push(Violation::at(
                        "D3.5",
                        i,
                        format!("input[{i}]: a reasoning item needs id and summary"),
                    ));
                }
                if rules.foreign_reasoning.iter().any(|f| f == id) {
                    out.push(Violation::at(
                        "D3.4",
                        i,
                        format!("Item '{id}' of type 'reasoning' was produced by another model"),
                    ));
                }
            }
            t if SELF_CONTAINED.contains(&t) => {}
            t if pair_kind(t).is_some() => {
                if s(item.get("call_id")).is_empty() {
                    out.push(Violation::at(
                        "D3.0",
                        i,
                        format!("input[{i}]: {t} needs a call_id"),
                    ));
                }
            }
            other => out.push(Violation::at(
                "D3.0",
                i,
                format!("input[{i}].type: unknown item type '{other}'"),
            )),
        }
    }
    // An item id names one item.
    let mut ids: HashMap<&str, usize> = HashMap::new();
    for (i, item) in items.iter().enumerate() {
        let id = s(item.get("id"));
        if !id.is_empty() && ids.insert(id, i).is_some() {
            out.push(Violation::at(
                "D3.0",
                i,
                format!("Duplicate item found with id {id}."),
            ));
        }
    }
    // D3.2 / D3.3: every call answered once, every output after its call and before the next
    // message item.
    let mut open: HashMap<String, usize> = HashMap::new();
    let mut answered: HashMap<String, usize> = HashMap::new();
    for (i, item) in items.iter().enumerate() {
        let t = ty(item);
        if t == "message" {
            for (id, at) in open.drain() {
                out.push(Violation::at(
                    "D3.3",
                    at,
                    format!("No tool output found for function call {id}."),
                ));
            }
            continue;
        }
        let Some((kind, is_output)) = pair_kind(t) else {
            continue;
        };
        let id = format!("{kind}:{}", s(item.get("call_id")));
        if is_output {
            if open.remove(&id).is_none() {
                let shown = s(item.get("call_id"));
                if answered.contains_key(&id) {
                    out.push(Violation::at(
                        "D3.2",
                        i,
                        format!("Duplicate output for call_id {shown}."),
                    ));
                } else {
                    out.push(Violation::at(
                        "D3.2",
                        i,
                        format!(
                            "No tool call found for function call output with call_id {shown}."
                        ),
                    ));
                }
            }
            answered.insert(id, i);
        } else if open.insert(id.clone(), i).is_some() || answered.contains_key(&id) {
            out.push(Violation::at(
                "D3.2",
                i,
                format!("Duplicate function call {}.", s(item.get("call_id"))),
            ));
        }
    }
    let mut left: Vec<(usize, String)> = open.into_iter().map(|(id, at)| (at, id)).collect();
    left.sort();
    for (at, id) in left {
        out.push(Violation::at(
            "D3.3",
            at,
            format!("No tool output found for function call {id}."),
        ));
    }
    // D3.4: a reasoning item is immediately followed by a non-reasoning output item.
    for (i, item) in items.iter().enumerate() {
        if ty(item) != "reasoning" {
            continue;
        }
        let next = items.get(i + 1);
        let ok = next.is_some_and(|n| {
            let t = ty(n);
            t == "function_call"
                || t == "custom_tool_call"
                || (t == "message" && s(n.get("role")) == "assistant")
        });
        if !ok {
            out.push(Violation::at("D3.4", i, format!("Item '{}' of type 'reasoning' was provided without its required following item.", s(item.get("id")))));
        }
    }
    for (i, path, problem) in check_images(&images) {
        out.push(Violation::at(
            "D1.16",
            i,
            format!("input[{i}].{path}: {problem}"),
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn user(t: &str) -> Value {
        json!({"type": "message", "role": "user", "content": [{"type": "input_text", "text": t}]})
    }
    fn call(id: &str) -> Value {
        json!({"type": "function_call", "call_id": id, "name": "f", "arguments": "{}"})
    }
    fn output(id: &str) -> Value {
        json!({"type": "function_call_output", "call_id": id, "output": "ok"})
    }
    fn rules(v: &[Violation]) -> Vec<&str> {
        v.iter().map(|v| v.rule).collect()
    }

    #[test]
    fn valid_list() {
        let items = vec![
            user("go"),
            json!({"type": "reasoning", "id": "rs_1", "summary": []}),
            call("a"),
            call("b"),
            output("b"),
            output("a"),
            user("next"),
        ];
        assert!(validate(&items).is_empty(), "{:?}", validate(&items));
    }

    /// Provider-native calls pair like function calls, and an item id is used once.
    #[test]
    fn native_items_pair_and_ids_are_unique() {
        let search = json!({"type": "web_search_call", "id": "ws_1", "status": "completed",
            "action": {"type": "search", "query": "q"}});
        let shell = json!({"type": "shell_call", "call_id": "c1", "action": {"commands": ["ls"]}});
        let shell_out = json!({"type": "shell_call_output", "call_id": "c1", "output": []});
        let fine = vec![user("go"), search.clone(), shell.clone(), shell_out.clone()];
        assert!(validate(&fine).is_empty(), "{:?}", validate(&fine));
        let broken = vec![
            user("go"),
            search.clone(),
            search,
            shell.clone(),
            user("interrupts"),
            shell_out.clone(),
            json!({"type": "computer_call", "action": {"type": "screenshot"}}),
        ];
        let v = validate(&broken);
        assert_eq!(rules(&v), ["D3.0", "D3.0", "D3.3", "D3.2", "D3.3"], "{v:?}");
    }

    #[test]
    fn broken_lists() {
        assert_eq!(
            rules(&validate(&[user("go"), call("a"), user("x")])),
            vec!["D3.3"]
        );
        assert_eq!(rules(&validate(&[user("go"), output("a")])), vec!["D3.2"]);
        assert_eq!(
            rules(&validate(&[
                user("go"),
                json!({"type": "reasoning", "id": "rs_1", "summary": []}),
                user("x")
            ])),
            vec!["D3.4"]
        );
        assert_eq!(
            rules(&validate(&[
                json!({"type": "message", "role": "tool", "content": "x"})
            ])),
            vec!["D3.1"]
        );
        let r = ResponsesRules {
            foreign_reasoning: vec!["rs_1".into()],
            ..ResponsesRules::default()
        };
        let items = [
            json!({"type": "reasoning", "id": "rs_1", "summary": []}),
            call("a"),
            output("a"),
        ];
        assert_eq!(rules(&validate_with(&items, &r)), vec!["D3.4"]);
        let bmp = json!({"type": "message", "role": "user", "content": [{"type": "input_image", "image_url": "data:image/bmp;base64,Qk02", "detail": "auto"}]});
        assert_eq!(rules(&validate(&[bmp])), vec!["D1.16"]);
    }
}
