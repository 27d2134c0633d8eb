//! OpenAI Chat Completions: the D2 invariants of `docs/PROVIDER-RULES.md` (with the B1 rows they
//! come from), on the exact JSON.

use std::collections::HashSet;

use serde_json::Value;

use super::{block_type, is_tool_id, OpenAiRules, Violation};

/// B1.7: `tool_calls[].id` is at most 40 characters.
pub const MAX_TOOL_CALL_ID: usize = 40;

pub const ROLES: &[&str] = &[
    "developer",
    "system",
    "user",
    "assistant",
    "tool",
    "function",
];
/// B1.3: content part types of a user message.
pub const USER_PART_TYPES: &[&str] = &["text", "image_url", "input_audio", "file"];
/// B1.4: content part types of an assistant message.
pub const ASSISTANT_PART_TYPES: &[&str] = &["text", "refusal"];
/// Message keys that carry another provider's reasoning; never sent (Loupe contract).
pub const THINKING_KEYS: &[&str] = &[
    "reasoning_content",
    "reasoning",
    "thinking",
    "thinking_blocks",
];

/// Validate a Chat Completions `messages` array with the default rules (an empty list is
/// accepted as "nothing to send yet").
pub fn validate(messages: &[Value]) -> Vec<Violation> {
    validate_with(messages, &OpenAiRules::default())
}

/// Validate a Chat Completions `messages` array.
pub fn validate_with(messages: &[Value], rules: &OpenAiRules) -> Vec<Violation> {
    let mut out = Vec::new();
    for check in CHECKS {
        check(messages, rules, &mut out);
    }
    out
}

type Check = fn(&[Value], &OpenAiRules, &mut Vec<Violation>);

const CHECKS: &[Check] = &[
    check_size_and_roles,
    check_content,
    check_assistant,
    check_tool_calls,
    check_results_follow_calls,
    check_no_orphan_tool_messages,
    check_no_thinking,
    check_images,
];

/// D1.16 for Chat Completions: base64 `image_url` parts (data URLs) pass the shared image rules.
fn check_images(msgs: &[Value], _: &OpenAiRules, out: &mut Vec<Violation>) {
    let mut images = Vec::new();
    for (i, m) in msgs.iter().enumerate() {
        let Some(parts) = m.get("content").and_then(Value::as_array) else {
            continue;
        };
        for (j, p) in parts.iter().enumerate() {
            let url = p
                .get("image_url")
                .and_then(|u| u.get("url"))
                .and_then(Value::as_str)
                .unwrap_or_default();
            if let Some((media, data)) = crate::media::data_url(url) {
                images.push((
                    i,
                    format!("content[{j}]"),
                    media.to_string(),
                    data.to_string(),
                ));
            }
        }
    }
    for (i, path, problem) in crate::media::check_images(&images) {
        out.push(Violation::at(
            "D1.16",
            i,
            format!("messages[{i}].{path}: {problem}"),
        ));
    }
}

fn role(m: &Value) -> Option<&str> {
    m.get("role").and_then(Value::as_str)
}

/// The non-empty `tool_calls` array of an assistant message.
fn tool_calls(m: &Value) -> &[Value] {
    if role(m) != Some("assistant") {
        return &[];
    }
    m.get("tool_calls")
        .and_then(Value::as_array)
        .map_or(&[], Vec::as_slice)
}

fn call_ids(m: &Value) -> Vec<String> {
    tool_calls(m)
        .iter()
        .map(|c| {
            c.get("id")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string()
        })
        .collect()
}

fn tool_call_id(m: &Value) -> String {
    m.get("tool_call_id")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string()
}

/// D2.1: 1 ≤ len (empty allowed with `allow_empty`); every message an object whose role ∈
/// {developer, system, user, assistant, tool, function}.
fn check_size_and_roles(msgs: &[Value], rules: &OpenAiRules, out: &mut Vec<Violation>) {
    if msgs.is_empty() && !rules.allow_empty {
        out.push(Violation::new(
            "D2.1",
            None,
            "Invalid 'messages': empty array. Expected an array with minimum length 1, but got an empty array instead.",
        ));
    }
    for (i, m) in msgs.iter().enumerate() {
        if !m.is_object() {
            out.push(Violation::at(
                "D2.1",
                i,
                format!("Invalid type for 'messages[{i}]': expected an object."),
            ));
            continue;
        }
        match role(m) {
            Some(r) if ROLES.contains(&r) => {}
            other => out.push(Violation::at(
                "D2.1",
                i,
                format!("Invalid value for 'messages[{i}].role': {other:?}. Supported values are: 'developer', 'system', 'user', 'assistant', 'tool' and 'function'."),
            )),
        }
    }
}

/// Checks the parts of an array content against the allowed part types.
fn check_parts(i: usize, parts: &[Value], allowed: &[&str], out: &mut Vec<Violation>) {
    for (j, p) in parts.iter().enumerate() {
        match block_type(p) {
            Some(t) if allowed.contains(&t) => {
                if t == "text" && !p.get("text").is_some_and(Value::is_string) {
                    out.push(Violation::at(
                        "D2.2",
                        i,
                        format!("Missing required parameter: 'messages[{i}].content[{j}].text'."),
                    ));
                }
            }
            t => out.push(Violation::at(
                "D2.2",
                i,
                format!(
                    "Invalid value: {:?}. Supported values for 'messages[{i}].content[{j}].type' are: {}.",
                    t.unwrap_or("(none)"),
                    allowed.join(", ")
                ),
            )),
        }
    }
}

/// D2.2: content non-null for developer/system/user/tool (and function); a string or an array of
/// allowed parts: only text for tool/system/developer, text/image_url/input_audio/file for user,
/// text/refusal for assistant.
fn check_content(msgs: &[Value], _: &OpenAiRules, out: &mut Vec<Violation>) {
    for (i, m) in msgs.iter().enumerate() {
        let Some(r) = role(m) else { continue };
        let allowed: &[&str] = match r {
            "user" => USER_PART_TYPES,
            "assistant" => ASSISTANT_PART_TYPES,
            _ => &["text"],
        };
        match m.get("content") {
            Some(Value::String(_)) => {}
            Some(Value::Array(parts)) => check_parts(i, parts, allowed, out),
            None | Some(Value::Null) if r == "assistant" => {} // D2.3
            None | Some(Value::Null) => out.push(Violation::at(
                "D2.2",
                i,
                format!("Invalid value for 'messages[{i}].content': expected a string, got null."),
            )),
            Some(_) => out.push(Violation::at(
                "D2.2",
                i,
                format!("Invalid type for 'messages[{i}].content': expected one of a string or array of objects."),
            )),
        }
    }
}

/// D2.3: an assistant's content may be null / absent only with `tool_calls` or `function_call`;
/// `tool_calls`, when present, is a non-empty array.
fn check_assistant(msgs: &[Value], _: &OpenAiRules, out: &mut Vec<Violation>) {
    for (i, m) in msgs.iter().enumerate() {
        if role(m) != Some("assistant") {
            continue;
        }
        match m.get("tool_calls") {
            None | Some(Value::Null) => {}
            Some(Value::Array(a)) if a.is_empty() => out.push(Violation::at(
                "D2.3",
                i,
                format!("Invalid 'messages[{i}].tool_calls': empty array. Expected an array with minimum length 1, but got an empty array instead."),
            )),
            Some(Value::Array(_)) => {}
            Some(_) => out.push(Violation::at(
                "D2.3",
                i,
                format!("Invalid type for 'messages[{i}].tool_calls': expected an array of objects."),
            )),
        }
        let no_content = matches!(m.get("content"), None | Some(Value::Null));
        let has_calls =
            !tool_calls(m).is_empty() || m.get("function_call").is_some_and(|f| !f.is_null());
        if no_content && !has_calls {
            out.push(Violation::at(
                "D2.3",
                i,
                format!("Invalid value for 'messages[{i}].content': expected a string, got null."),
            ));
        }
    }
}

/// D2.4: each tool call has a non-empty id ≤ 40 chars, unique request-wide; `type` function or
/// custom; `function.name` non-empty =~ `^[a-zA-Z0-9_-]+$`; `function.arguments` a string that
/// parses as JSON (custom: `custom.name` likewise, `custom.input` a string).
fn check_tool_calls(msgs: &[Value], _: &OpenAiRules, out: &mut Vec<Violation>) {
    let mut seen: HashSet<&str> = HashSet::new();
    for (i, m) in msgs.iter().enumerate() {
        for (j, call) in tool_calls(m).iter().enumerate() {
            let at = |what: &str| format!("'messages[{i}].tool_calls[{j}]{what}'");
            let mut bad = |msg: String| out.push(Violation::at("D2.4", i, msg));
            match call.get("id").and_then(Value::as_str) {
                None => bad(format!("Missing required parameter: {}.", at(".id"))),
                Some("") => bad(format!("Invalid {}: empty string. Expected a string with minimum length 1, but got an empty string instead.", at(".id"))),
                Some(id) => {
                    let n = id.chars().count();
                    if n > MAX_TOOL_CALL_ID {
                        bad(format!("Invalid {}: string too long. Expected a string with maximum length {MAX_TOOL_CALL_ID}, but got a string with length {n} instead.", at(".id")));
                    }
                    if !seen.insert(id) {
                        bad(format!("Invalid {}: duplicate tool call id {id:?}.", at(".id")));
                    }
                }
            }
            let ty = call.get("type").and_then(Value::as_str).unwrap_or("");
            let key = match ty {
                "function" => "function",
                "custom" => "custom",
                _ => {
                    bad(format!("Invalid value: {ty:?}. Supported values for {} are: 'function' and 'custom'.", at(".type")));
                    continue;
                }
            };
            let body = call.get(key);
            match body.and_then(|b| b.get("name")).and_then(Value::as_str) {
                None => bad(format!("Missing required parameter: {}.", at(&format!(".{key}.name")))),
                Some("") => bad(format!("Invalid {}: empty string. Expected a string with minimum length 1, but got an empty string instead.", at(&format!(".{key}.name")))),
                Some(name) if !is_tool_id(name) => bad(format!("Invalid {}: string does not match pattern. Expected a string that matches the pattern '^[a-zA-Z0-9_-]+$'.", at(&format!(".{key}.name")))),
                Some(_) => {}
            }
            let payload = if key == "function" {
                "arguments"
            } else {
                "input"
            };
            match body.and_then(|b| b.get(payload)) {
                Some(Value::String(s)) => {
                    if key == "function" && serde_json::from_str::<Value>(s).is_err() {
                        bad(format!(
                            "Invalid {}: not valid JSON: {s:?}.",
                            at(".function.arguments")
                        ));
                    }
                }
                _ => bad(format!(
                    "Invalid type for {}: expected a string.",
                    at(&format!(".{key}.{payload}"))
                )),
            }
        }
    }
}

/// D2.5: after an assistant with tool calls C, the next |C| messages are `tool` messages answering
/// exactly ids(C), any order, no duplicates, nothing interleaved (a trailing assistant with tool
/// calls fails: the caller's next message would interleave).
fn check_results_follow_calls(msgs: &[Value], _: &OpenAiRules, out: &mut Vec<Violation>) {
    for (i, m) in msgs.iter().enumerate() {
        let ids = call_ids(m);
        if ids.is_empty() {
            continue;
        }
        let answers: Vec<String> = msgs[i + 1..]
            .iter()
            .take_while(|n| role(n) == Some("tool"))
            .map(tool_call_id)
            .collect();
        let missing: Vec<&str> = ids
            .iter()
            .filter(|id| !answers.contains(id))
            .map(String::as_str)
            .collect();
        if !missing.is_empty() {
            out.push(Violation::at(
                "D2.5",
                i,
                format!("An assistant message with 'tool_calls' must be followed by tool messages responding to each 'tool_call_id'. The following tool_call_ids did not have response messages: {}", missing.join(", ")),
            ));
        }
        let mut seen = HashSet::new();
        for (k, a) in answers.iter().enumerate() {
            if ids.contains(a) && !seen.insert(a) {
                out.push(Violation::at(
                    "D2.5",
                    i + 1 + k,
                    format!(
                        "Invalid 'messages[{}]': duplicate tool message for tool_call_id {a:?}.",
                        i + 1 + k
                    ),
                ));
            }
        }
    }
}

/// D2.6: every `tool` message (with a `tool_call_id`) answers a call of the assistant that opens
/// its run of tool messages; none at index 0.
fn check_no_orphan_tool_messages(msgs: &[Value], _: &OpenAiRules, out: &mut Vec<Violation>) {
    let mut owner: Option<usize> = None;
    for (i, m) in msgs.iter().enumerate() {
        if role(m) != Some("tool") {
            owner = (!tool_calls(m).is_empty()).then_some(i);
            continue;
        }
        if !m.get("tool_call_id").is_some_and(Value::is_string) {
            out.push(Violation::at(
                "D2.6",
                i,
                format!("Missing required parameter: 'messages[{i}].tool_call_id'."),
            ));
        }
        let id = tool_call_id(m);
        if !owner.is_some_and(|o| call_ids(&msgs[o]).contains(&id)) {
            out.push(Violation::at(
                "D2.6",
                i,
                format!("Invalid parameter: messages with role 'tool' must be a response to a preceeding message with 'tool_calls'. (messages.[{i}].role, tool_call_id {id:?})"),
            ));
        }
    }
}

/// D2.7 (Loupe contract): no thinking anywhere: no thinking / reasoning content parts, no
/// reasoning fields on messages.
fn check_no_thinking(msgs: &[Value], _: &OpenAiRules, out: &mut Vec<Violation>) {
    for (i, m) in msgs.iter().enumerate() {
        for key in THINKING_KEYS {
            if m.get(*key).is_some() {
                out.push(Violation::at(
                    "D2.7",
                    i,
                    format!("'messages[{i}].{key}': thinking must not be sent"),
                ));
            }
        }
        if let Some(Value::Array(parts)) = m.get("content") {
            for (j, p) in parts.iter().enumerate() {
                let t = block_type(p).unwrap_or_default();
                if t.contains("thinking") || t == "reasoning" {
                    out.push(Violation::at(
                        "D2.7",
                        i,
                        format!(
                            "'messages[{i}].content[{j}]': thinking part {t:?} must not be sent"
                        ),
                    ));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn run(check: Check, list: Value) -> Vec<Violation> {
        let list = list.as_array().expect("array").clone();
        let mut out = Vec::new();
        check(&list, &OpenAiRules::default(), &mut out);
        out
    }

    fn rules_of(v: &[Violation]) -> Vec<&'static str> {
        v.iter().map(|v| v.rule).collect()
    }

    fn call(id: &str) -> Value {
        json!({"id": id, "type": "function", "function": {"name": "Bash", "arguments": "{\"command\":\"ls\"}"}})
    }

    fn good() -> Value {
        json!([
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": [{"type": "text", "text": "hi"}, {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="}}]},
            {"role": "assistant", "content": null, "tool_calls": [call("call_1"), call("call_2")]},
            {"role": "tool", "tool_call_id": "call_2", "content": "b"},
            {"role": "tool", "tool_call_id": "call_1", "content": [{"type": "text", "text": "a"}]},
            {"role": "assistant", "content": "done"},
            {"role": "user", "content": "more"},
            {"role": "assistant", "content": [{"type": "text", "text": "ok"}]}
        ])
    }

    #[test]
    fn good_list_passes_every_check() {
        let list = good().as_array().unwrap().clone();
        assert_eq!(validate(&list), vec![]);
        assert_eq!(validate(&[]), vec![]);
    }

    #[test]
    fn size_and_roles() {
        let strict = OpenAiRules { allow_empty: false };
        let v = validate_with(&[], &strict);
        assert_eq!(rules_of(&v), ["D2.1"]);
        assert!(v[0].message.starts_with("Invalid 'messages': empty array."));
        let bad = json!([{"role": "model", "content": "x"}, 3, {"content": "x"}]);
        assert_eq!(rules_of(&run(check_size_and_roles, bad)), ["D2.1"; 3]);
        assert!(run(check_size_and_roles, good()).is_empty());
    }

    #[test]
    fn content() {
        let bad = json!([
            {"role": "user", "content": null},
            {"role": "tool", "tool_call_id": "x"},
            {"role": "system", "content": [{"type": "image_url", "image_url": {"url": "u"}}]},
            {"role": "user", "content": [{"type": "image", "source": {}}, {"type": "text"}]},
            {"role": "developer", "content": 5},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "x"}]}
        ]);
        let v = run(check_content, bad);
        assert_eq!(rules_of(&v), ["D2.2"; 7], "{v:#?}");
        assert_eq!(
            v[0].message,
            "Invalid value for 'messages[0].content': expected a string, got null."
        );
        assert!(run(check_content, good()).is_empty());
    }

    #[test]
    fn assistant() {
        let bad = json!([
            {"role": "assistant", "content": null},
            {"role": "assistant", "content": "x", "tool_calls": []},
            {"role": "assistant"}
        ]);
        let v = run(check_assistant, bad);
        assert_eq!(rules_of(&v), ["D2.3"; 3]);
        assert!(v[1]
            .message
            .starts_with("Invalid 'messages[1].tool_calls': empty array."));
        let fc = json!([{"role": "assistant", "content": null, "function_call": {"name": "f", "arguments": "{}"}}]);
        assert!(run(check_assistant, fc).is_empty());
        assert!(run(check_assistant, good()).is_empty());
    }

    #[test]
    fn tool_calls_shape() {
        let long = "fc_".to_string() + &"a".repeat(50);
        let bad = json!([
            {"role": "assistant", "content": null, "tool_calls": [
                call(""),
                call(&long),
                {"id": "call_3", "type": "function", "function": {"name": "functions.Bash:0", "arguments": "{}"}},
                {"id": "call_4", "type": "function", "function": {"name": "Bash", "arguments": "{\"partial"}},
                {"id": "call_5", "type": "function", "function": {"name": "Bash", "arguments": {"a": 1}}},
                {"id": "call_6", "type": "tool", "function": {"name": "Bash", "arguments": "{}"}},
                call("call_3")
            ]}
        ]);
        let v = run(check_tool_calls, bad);
        assert_eq!(v.len(), 7, "{v:#?}");
        assert!(v[1].message.contains("string too long. Expected a string with maximum length 40, but got a string with length 53 instead."));
        assert!(v[2].message.contains("does not match pattern"));
        assert!(v[3].message.contains("not valid JSON"));
        assert!(v[6].message.contains("duplicate"));
        let custom = json!([{"role": "assistant", "content": null, "tool_calls": [
            {"id": "c1", "type": "custom", "custom": {"name": "apply_patch", "input": "*** patch"}}]}]);
        assert!(run(check_tool_calls, custom).is_empty());
        assert!(run(check_tool_calls, good()).is_empty());
    }

    #[test]
    fn results_follow_calls() {
        let asst =
            json!({"role": "assistant", "content": null, "tool_calls": [call("a"), call("b")]});
        let tool = |id: &str| json!({"role": "tool", "tool_call_id": id, "content": "r"});
        let user = json!({"role": "user", "content": "x"});
        // Missing b, interleaved user.
        let v = run(
            check_results_follow_calls,
            json!([user, asst, tool("a"), user, tool("b")]),
        );
        assert_eq!(rules_of(&v), ["D2.5"]);
        assert!(v[0].message.ends_with("did not have response messages: b"));
        // Trailing.
        assert_eq!(
            rules_of(&run(check_results_follow_calls, json!([user, asst]))),
            ["D2.5"]
        );
        // Duplicate answer.
        let v = run(
            check_results_follow_calls,
            json!([user, asst, tool("a"), tool("b"), tool("a")]),
        );
        assert_eq!(rules_of(&v), ["D2.5"]);
        assert_eq!(v[0].index, Some(4));
        assert!(run(check_results_follow_calls, good()).is_empty());
    }

    #[test]
    fn no_orphan_tool_messages() {
        let tool = |id: &str| json!({"role": "tool", "tool_call_id": id, "content": "r"});
        let v = run(
            check_no_orphan_tool_messages,
            json!([
                tool("a"),
                {"role": "assistant", "content": null, "tool_calls": [call("b")]},
                tool("b"), tool("c"),
                {"role": "user", "content": "x"},
                tool("b"),
                {"role": "tool", "content": "no id"}
            ]),
        );
        assert_eq!(rules_of(&v), ["D2.6"; 5], "{v:#?}");
        assert!(v[0].message.starts_with("Invalid parameter: messages with role 'tool' must be a response to a preceeding message with 'tool_calls'."));
        assert!(run(check_no_orphan_tool_messages, good()).is_empty());
    }

    #[test]
    fn no_thinking() {
        let v = run(
            check_no_thinking,
            json!([
                {"role": "assistant", "content": [{"type": "thinking", "thinking": "t", "signature": "s"}]},
                {"role": "assistant", "content": "x", "reasoning_content": "hmm"}
            ]),
        );
        assert_eq!(rules_of(&v), ["D2.7", "D2.7"]);
        assert!(run(check_no_thinking, good()).is_empty());
    }
}
