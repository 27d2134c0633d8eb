//! Gemini generateContent: the §D.4 invariants of `docs/PROVIDER-RULES.md` (with the §C rows), on the
//! exact `contents` list, plus the shared image rules.

use serde_json::Value;

use super::media::{check_images, s};
use super::{GeminiRules, Violation};

/// C3: the data fields of a part; exactly one per part.
pub const DATA_FIELDS: &[&str] = &[
    "text",
    "inlineData",
    "fileData",
    "functionCall",
    "functionResponse",
    "executableCode",
    "codeExecutionResult",
];

/// C11: the dummy signature accepted in place of a real one.
pub const DUMMY_SIGNATURES: &[&str] = &[
    "skip_thought_signature_validator",
    "context_engineering_is_the_way_to_go",
];

/// Validate a Gemini `contents` list with the default rules.
pub fn validate(contents: &[Value]) -> Vec<Violation> {
    validate_with(contents, &GeminiRules::default())
}

fn role(c: &Value) -> &str {
    s(c.get("role"))
}

fn parts(c: &Value) -> &[Value] {
    c.get("parts")
        .and_then(Value::as_array)
        .map_or(&[], Vec::as_slice)
}

fn calls(c: &Value) -> Vec<&Value> {
    parts(c)
        .iter()
        .filter_map(|p| p.get("functionCall"))
        .collect()
}

fn responses(c: &Value) -> Vec<&Value> {
    parts(c)
        .iter()
        .filter_map(|p| p.get("functionResponse"))
        .collect()
}

/// Validate a Gemini `contents` list.
pub fn validate_with(contents: &[Value], rules: &GeminiRules) -> Vec<Violation> {
    let mut out = Vec::new();
    if contents.is_empty() {
        if !rules.allow_empty {
            out.push(Violation::new("D4.1", None, "contents must not be empty"));
        }
        return out;
    }
    let mut images = Vec::new();
    // D4.1: roles, parts, one data field each, no blank text.
    for (i, c) in contents.iter().enumerate() {
        let r = role(c);
        if r != "user" && r != "model" {
            out.push(Violation::at(
                "D4.1",
                i,
                format!("Please use a valid role: user, model. (got {r:?})"),
            ));
        }
        if parts(c).is_empty() {
            out.push(Violation::at("D4.1", i, format!("* GenerateContentRequest.contents[{i}].parts: contents.parts must not be empty.")));
        }
        for (j, p) in parts(c).iter().enumerate() {
            let n = DATA_FIELDS.iter().filter(|f| p.get(**f).is_some()).count();
            if n != 1 {
                out.push(Violation::at("D4.1", i, format!("* GenerateContentRequest.contents[{i}].parts[{j}].data: required oneof field 'data' must have one initialized field")));
            }
            if let Some(t) = p.get("text") {
                if t.as_str().is_none_or(|t| t.trim().is_empty()) {
                    out.push(Violation::at(
                        "D4.1",
                        i,
                        format!("contents[{i}].parts[{j}].text: blank text part"),
                    ));
                }
            }
            if let Some(call) = p.get("functionCall") {
                if s(call.get("name")).is_empty() || !call.get("args").is_none_or(Value::is_object)
                {
                    out.push(Violation::at(
                        "D4.1",
                        i,
                        format!(
                            "contents[{i}].parts[{j}].functionCall: needs a name and object args"
                        ),
                    ));
                }
            }
            if let Some(inline) = p.get("inlineData") {
                let media = s(inline.get("mimeType"));
                if media.starts_with("image/") {
                    images.push((
                        i,
                        format!("parts[{j}]"),
                        media.to_string(),
                        s(inline.get("data")).to_string(),
                    ));
                }
            }
            if let Some(sig) = p.get("thoughtSignature").and_then(Value::as_str) {
                if rules.foreign_signatures.iter().any(|f| f == sig) {
                    out.push(Violation::at("D4.5", i, format!("contents[{i}].parts[{j}]: Invalid thought signature (written by another model)")));
                }
            }
        }
    }
    // D4.2: first user, alternation, last user.
    if role(&contents[0]) != "user" {
        out.push(Violation::at("D4.2", 0, "Please ensure that function call turn comes immediately after a user turn or after a function response turn."));
    }
    for (i, pair) in contents.windows(2).enumerate() {
        if role(&pair[1]) == role(&pair[0]) {
            out.push(Violation::at(
                "D4.2",
                i + 1,
                "Please ensure that multiturn requests alternate between user and model.",
            ));
        }
    }
    let last = contents.len() - 1;
    if role(&contents[last]) == "model" {
        out.push(Violation::at(
            "D4.2",
            last,
            "Requests ending with a model turn are not supported.",
        ));
    }
    // D4.3 / D4.4: k calls are answered by the next content, with exactly k responses and
    // nothing else, in order, names and ids matching.
    for (i, c) in contents.iter().enumerate() {
        let cs = calls(c);
        if !cs.is_empty() {
            let Some(next) = contents.get(i + 1) else {
                continue; // D4.2 already reports the trailing model turn.
            };
            let rs = responses(next);
            if role(next) != "user" || rs.len() != cs.len() {
                out.push(Violation::at("D4.3", i + 1, "Please ensure that the number of function response parts is equal to the number of function call parts of the function call turn."));
                continue;
            }
            if rs.len() != parts(next).len() {
                out.push(Violation::at(
                    "D4.3",
                    i + 1,
                    "a function response turn holds only functionResponse parts",
                ));
            }
            for (k, (call, resp)) in cs.iter().zip(rs.iter()).enumerate() {
                let same_id = call.get("id").is_none()
                    || resp.get("id").is_none()
                    || call.get("id") == resp.get("id");
                if s(call.get("name")) != s(resp.get("name")) || !same_id {
                    out.push(Violation::at(
                        "D4.3",
                        i + 1,
                        format!(
                            "functionResponse {k} does not answer functionCall {k} ({} / {})",
                            s(call.get("name")),
                            s(resp.get("name"))
                        ),
                    ));
                }
            }
        }
        if !responses(c).is_empty() && (i == 0 || calls(&contents[i - 1]).is_empty()) {
            out.push(Violation::at("D4.4", i, "Please ensure that function response turn comes immediately after a function call turn"));
        }
    }
    // D4.5: the current turn's model contents carry a signature on their first functionCall.
    if rules.require_signatures {
        let start = contents
            .iter()
            .rposition(|c| {
                role(c) == "user" && parts(c).iter().any(|p| p.get("functionResponse").is_none())
            })
            .map_or(0, |i| i + 1);
        for (i, c) in contents.iter().enumerate().skip(start) {
            if role(c) != "model" {
                continue;
            }
            let first = parts(c).iter().find(|p| p.get("functionCall").is_some());
            if let Some(p) = first {
                if s(p.get("thoughtSignature")).is_empty() {
                    let name = s(p.get("functionCall").and_then(|f| f.get("name")));
                    out.push(Violation::at("D4.5", i, format!("Function call is missing a thought_signature in functionCall parts. This is required for tools to work correctly, and missing thought_signature may lead to degraded model performance. Additional data, function call `default_api:{name}` , position {i}.")));
                }
            }
        }
    }
    for (i, path, problem) in check_images(&images) {
        out.push(Violation::at(
            "D1.16",
            i,
            format!("contents[{i}].{path}: {problem}"),
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn user(t: &str) -> Value {
        json!({"role": "user", "parts": [{"text": t}]})
    }
    fn model_call(name: &str, sig: Option<&str>) -> Value {
        let mut p = json!({"functionCall": {"id": name, "name": name, "args": {}}});
        if let Some(sig) = sig {
            p["thoughtSignature"] = json!(sig);
        }
        json!({"role": "model", "parts": [p]})
    }
    fn answer(name: &str) -> Value {
        json!({"role": "user", "parts": [{"functionResponse": {"id": name, "name": name, "response": {"output": "ok"}}}]})
    }
    fn rules(v: &[Violation]) -> Vec<&str> {
        v.iter().map(|v| v.rule).collect()
    }

    #[test]
    fn valid_list() {
        let c = vec![
            user("go"),
            model_call("f", Some(DUMMY_SIGNATURES[0])),
            answer("f"),
        ];
        assert!(validate(&c).is_empty(), "{:?}", validate(&c));
    }

    #[test]
    fn broken_lists() {
        assert_eq!(
            rules(&validate(&[user("go"), model_call("f", None), answer("f")])),
            vec!["D4.5"]
        );
        assert_eq!(
            rules(&validate(&[
                user("go"),
                json!({"role": "model", "parts": [{"text": "a"}]})
            ])),
            vec!["D4.2"]
        );
        assert_eq!(rules(&validate(&[user("go"), user("again")])), vec!["D4.2"]);
        assert_eq!(
            rules(&validate(&[
                user("go"),
                model_call("f", Some("s")),
                answer("g")
            ])),
            vec!["D4.3"]
        );
        assert_eq!(
            rules(&validate(&[user("go"), answer("f")])),
            vec!["D4.2", "D4.4"]
        );
        assert_eq!(
            rules(&validate(&[
                json!({"role": "user", "parts": [{"text": " "}]})
            ])),
            vec!["D4.1"]
        );
        assert_eq!(
            rules(&validate(&[
                json!({"role": "user", "parts": [{"text": "a", "inlineData": {}}]})
            ])),
            vec!["D4.1"]
        );
        let foreign = GeminiRules {
            foreign_signatures: vec!["old".into()],
            ..GeminiRules::default()
        };
        assert_eq!(
            rules(&validate_with(
                &[user("go"), model_call("f", Some("old")), answer("f")],
                &foreign
            )),
            vec!["D4.5"]
        );
        let bmp = json!({"role": "user", "parts": [{"inlineData": {"mimeType": "image/bmp", "data": "Qk02"}}]});
        assert_eq!(rules(&validate(&[bmp])), vec!["D1.16"]);
    }
}
