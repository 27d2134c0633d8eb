//! Provider-native items that have no Anthropic block: OpenAI Responses output items other than
//! messages, reasoning and function calls, and Gemini code execution parts
//! (`docs/NORMALIZATION.md` § Block fidelity).
//!
//! # Storage convention
//! Each is stored as a block of its own `type`, as the provider returned it: the calls in the
//! assistant turn (`web_search_call`, `computer_call`, `executable_code`, …) and the outputs the
//! client sends back in the user turn after it (`computer_call_output`,
//! `custom_tool_call_output`, …), the way a `function_call_output` is stored as a `tool_result`.
//! Gemini's parts use snake-case types: `{"type":"executable_code","code","language"}` and
//! `{"type":"code_execution_result","outcome","output"}`.
//!
//! # Sending
//! Their own provider gets them in order, in their input form: a Responses item without the
//! fields only the API's output has (`created_by`, …), if its fields are then of its input type's
//! kinds (`RESPONSES_FIELDS`); a Gemini part if its fields are its part type's. A Responses call
//! is sent with the first output for it in the next turn, and each `call_id` and item `id` once;
//! a call without its output, an output without its call, a repeat, or an item not in its input
//! form is sent as text instead (the API refuses it). Every other provider reads them as text
//! where they stood (`block_rendered_as_text`); an `item_reference`, opaque, is dropped for them
//! (reported).

use std::collections::HashSet;

use serde_json::Value;

use super::blocks::{block_type, str_field, text_block};
use super::render_text;
use super::{Ctx, Msg, Provider, RepairKind};

/// Responses items a response holds, answered by nothing the client sends.
const RESPONSES_SELF_CONTAINED: &[&str] = &[
    "web_search_call",
    "file_search_call",
    "code_interpreter_call",
    "image_generation_call",
    "mcp_call",
    "mcp_list_tools",
    "item_reference",
];

/// Responses calls the client answers, with their outputs' types.
const RESPONSES_PAIRED: &[(&str, &str)] = &[
    ("computer_call", "computer_call_output"),
    ("custom_tool_call", "custom_tool_call_output"),
    ("local_shell_call", "local_shell_call_output"),
    ("shell_call", "shell_call_output"),
    ("apply_patch_call", "apply_patch_call_output"),
];

/// Gemini code execution parts, in the model turn.
const GEMINI_PARTS: &[&str] = &["executable_code", "code_execution_result"];

/// The provider a native block belongs to, and whether it sits in the assistant turn.
pub fn native_block(v: &Value) -> Option<(Provider, bool)> {
    let t = block_type(v)?;
    if RESPONSES_SELF_CONTAINED.contains(&t) || RESPONSES_PAIRED.iter().any(|(c, _)| *c == t) {
        Some((Provider::OpenaiResponses, true))
    } else if RESPONSES_PAIRED.iter().any(|(_, o)| *o == t) {
        Some((Provider::OpenaiResponses, false))
    } else if GEMINI_PARTS.contains(&t) {
        Some((Provider::Gemini, true))
    } else {
        None
    }
}

/// The call a Responses call or output names: its `call_id` (a local shell output names its
/// call by `id`).
fn call_id(v: &Value) -> &str {
    let key = if block_type(v) == Some("local_shell_call_output") {
        "id"
    } else {
        "call_id"
    };
    str_field(v, key).unwrap_or("")
}

/// Fields a Responses output item carries that its input form refuses (`*`: every item).
const RESPONSES_OUTPUT_ONLY: &[(&str, &str)] =
    &[("*", "created_by"), ("custom_tool_call_output", "status")];

fn is_output_only(t: &str, key: &str) -> bool {
    RESPONSES_OUTPUT_ONLY
        .iter()
        .any(|(ty, field)| (*ty == "*" || *ty == t) && *field == key)
}

/// Takes out of a Responses item of type `t` the fields only the API's output form has.
pub(super) fn strip_output_only(t: &str, v: &mut Value) {
    if let Some(fields) = v.as_object_mut() {
        fields.retain(|key, _| !is_output_only(t, key));
    }
}

/// The JSON a field of a Responses input item takes (`Null…`: also `null`).
#[derive(Clone, Copy)]
enum Kind {
    Str,
    NullOrStr,
    Obj,
    NullOrObj,
    Arr,
    NullOrArr,
    StrOrParts,
    Bool,
    NullOrNum,
    OneOf(&'static [&'static str]),
    NullOrOneOf(&'static [&'static str]),
}

impl Kind {
    fn admits(self, v: &Value) -> bool {
        let one_of = |allowed: &[&str]| v.as_str().is_some_and(|s| allowed.contains(&s));
        match self {
            Kind::Str => v.is_string(),
            Kind::NullOrStr => v.is_null() || v.is_string(),
            Kind::Obj => v.is_object(),
            Kind::NullOrObj => v.is_null() || v.is_object(),
            Kind::Arr => v.is_array(),
            Kind::NullOrArr => v.is_null() || v.is_array(),
            Kind::StrOrParts => {
                v.is_string()
                    || v.as_array()
                        .is_some_and(|parts| parts.iter().all(input_part))
            }
            Kind::Bool => v.is_boolean(),
            Kind::NullOrNum => v.is_null() || v.is_number(),
            Kind::OneOf(allowed) => one_of(allowed),
            Kind::NullOrOneOf(allowed) => v.is_null() || one_of(allowed),
        }
    }
}

const CALL_STATUS: &[&str] = &["in_progress", "completed", "incomplete"];
const SEARCH_STATUS: &[&str] = &[
    "in_progress",
    "searching",
    "completed",
    "incomplete",
    "failed",
];

/// A field: its name, its kind, and whether the type requires it.
type Field = (&'static str, Kind, bool);

/// The fields of each Responses input item Loupe passes through (`openai.types.responses`
/// `ResponseInputItemParam`, openai 3.60). Any other field is refused.
const RESPONSES_FIELDS: &[(&str, &[Field])] = &[
    (
        "web_search_call",
        &[
            ("id", Kind::Str, true),
            ("action", Kind::Obj, true),
            ("status", Kind::OneOf(SEARCH_STATUS), true),
        ],
    ),
    (
        "file_search_call",
        &[
            ("id", Kind::Str, true),
            ("queries", Kind::Arr, true),
            ("status", Kind::OneOf(SEARCH_STATUS), true),
            ("results", Kind::NullOrArr, false),
        ],
    ),
    (
        "code_interpreter_call",
        &[
            ("id", Kind::Str, true),
            ("code", Kind::NullOrStr, true),
            ("container_id", Kind::Str, true),
            ("outputs", Kind::NullOrArr, true),
            (
                "status",
                Kind::OneOf(&[
                    "in_progress",
                    "completed",
                    "incomplete",
                    "interpreting",
                    "failed",
                ]),
                true,
            ),
        ],
    ),
    (
        "image_generation_call",
        &[
            ("id", Kind::Str, true),
            ("result", Kind::NullOrStr, true),
            (
                "status",
                Kind::OneOf(&["in_progress", "completed", "generating", "failed"]),
                true,
            ),
            (
                "action",
                Kind::NullOrOneOf(&["generate", "edit", "auto"]),
                false,
            ),
            (
                "background",
                Kind::NullOrOneOf(&["transparent", "opaque", "auto"]),
                false,
            ),
            ("error", Kind::Obj, false),
            (
                "output_format",
                Kind::NullOrOneOf(&["png", "webp", "jpeg", "gif", "svg"]),
                false,
            ),
            (
                "quality",
                Kind::NullOrOneOf(&["low", "medium", "high", "xhigh", "max", "auto"]),
                false,
            ),
            ("revised_prompt", Kind::NullOrStr, false),
            ("size", Kind::NullOrStr, false),
            ("svg_usage", Kind::Obj, false),
        ],
    ),
    (
        "mcp_call",
        &[
            ("id", Kind::Str, true),
            ("arguments", Kind::Str, true),
            ("name", Kind::Str, true),
            ("server_label", Kind::Str, true),
            ("approval_request_id", Kind::NullOrStr, false),
            ("error", Kind::NullOrObj, false),
            ("output", Kind::NullOrStr, false),
            (
                "status",
                Kind::OneOf(&[
                    "in_progress",
                    "completed",
                    "incomplete",
                    "calling",
                    "failed",
                ]),
                false,
            ),
        ],
    ),
    (
        "mcp_list_tools",
        &[
            ("id", Kind::Str, true),
            ("server_label", Kind::Str, true),
            ("tools", Kind::Arr, true),
            ("error", Kind::NullOrStr, false),
        ],
    ),
    ("item_reference", &[("id", Kind::Str, true)]),
    (
        "custom_tool_call",
        &[
            ("call_id", Kind::Str, true),
            ("input", Kind::Str, true),
            ("name", Kind::Str, true),
            ("id", Kind::Str, false),
            ("async", Kind::Bool, false),
            ("caller", Kind::NullOrObj, false),
            ("namespace", Kind::Str, false),
        ],
    ),
    (
        "custom_tool_call_output",
        &[
            ("call_id", Kind::Str, true),
            ("output", Kind::StrOrParts, true),
            ("id", Kind::Str, false),
            ("caller", Kind::NullOrObj, false),
        ],
    ),
    (
        "computer_call",
        &[
            ("id", Kind::Str, true),
            ("call_id", Kind::Str, true),
            ("pending_safety_checks", Kind::Arr, true),
            ("status", Kind::OneOf(CALL_STATUS), true),
            ("action", Kind::Obj, false),
            ("actions", Kind::Arr, false),
        ],
    ),
    (
        "computer_call_output",
        &[
            ("call_id", Kind::Str, true),
            ("output", Kind::Obj, true),
            ("id", Kind::NullOrStr, false),
            ("acknowledged_safety_checks", Kind::NullOrArr, false),
            ("status", Kind::NullOrOneOf(CALL_STATUS), false),
        ],
    ),
    (
        "local_shell_call",
        &[
            ("id", Kind::Str, true),
            ("action", Kind::Obj, true),
            ("call_id", Kind::Str, true),
            ("status", Kind::OneOf(CALL_STATUS), true),
        ],
    ),
    (
        "local_shell_call_output",
        &[
            ("id", Kind::Str, true),
            ("output", Kind::Str, true),
            ("status", Kind::NullOrOneOf(CALL_STATUS), false),
        ],
    ),
    (
        "shell_call",
        &[
            ("action", Kind::Obj, true),
            ("call_id", Kind::Str, true),
            ("id", Kind::NullOrStr, false),
            ("caller", Kind::NullOrObj, false),
            ("environment", Kind::NullOrObj, false),
            ("status", Kind::NullOrOneOf(CALL_STATUS), false),
        ],
    ),
    (
        "shell_call_output",
        &[
            ("call_id", Kind::Str, true),
            ("output", Kind::Arr, true),
            ("id", Kind::NullOrStr, false),
            ("caller", Kind::NullOrObj, false),
            ("max_output_length", Kind::NullOrNum, false),
            ("status", Kind::NullOrOneOf(CALL_STATUS), false),
        ],
    ),
    (
        "apply_patch_call",
        &[
            ("call_id", Kind::Str, true),
            ("operation", Kind::Obj, true),
            ("status", Kind::OneOf(&["in_progress", "completed"]), true),
            ("id", Kind::NullOrStr, false),
            ("caller", Kind::NullOrObj, false),
        ],
    ),
    (
        "apply_patch_call_output",
        &[
            ("call_id", Kind::Str, true),
            ("status", Kind::OneOf(&["completed", "failed"]), true),
            ("id", Kind::NullOrStr, false),
            ("caller", Kind::NullOrObj, false),
            ("output", Kind::NullOrStr, false),
        ],
    ),
];

/// A part of a tool output list: `input_text`, `input_image` (with its `detail`) or
/// `input_file`, with their fields only, each text (or null).
fn input_part(part: &Value) -> bool {
    let Some(fields) = part.as_object() else {
        return false;
    };
    let (required, optional): (&[&str], &[&str]) = match str_field(part, "type") {
        Some("input_text") => (&["text"], &[]),
        Some("input_image") => (&["detail"], &["image_url", "file_id"]),
        Some("input_file") => (&[], &["file_data", "file_id", "file_url", "filename"]),
        _ => return false,
    };
    let detail_ok = part.get("detail").is_none_or(|d| {
        d.as_str()
            .is_some_and(|d| ["low", "high", "auto", "original"].contains(&d))
    });
    let field_ok = |(key, value): (&String, &Value)| {
        key == "type"
            || ((required.contains(&key.as_str()) || optional.contains(&key.as_str()))
                && (value.is_string() || value.is_null()))
    };
    detail_ok && required.iter().all(|k| fields.contains_key(*k)) && fields.iter().all(field_ok)
}

/// Whether a Responses item has the fields its input type takes, of their kinds, and nothing
/// else but those [`strip_output_only`] takes out; a web search's `action` is checked as well.
fn responses_item_well_formed(t: &str, v: &Value) -> bool {
    let Some(fields) = v.as_object() else {
        return false;
    };
    let Some((_, spec)) = RESPONSES_FIELDS.iter().find(|(ty, _)| *ty == t) else {
        return false;
    };
    let fits = spec
        .iter()
        .all(|(name, kind, required)| match fields.get(*name) {
            Some(value) => kind.admits(value),
            None => !required,
        });
    let known = fields
        .keys()
        .all(|k| k == "type" || is_output_only(t, k) || spec.iter().any(|(name, _, _)| name == k));
    fits && known && (t != "web_search_call" || web_search_action(&v["action"]))
}

/// A web search's `action`: a search (its `query` text), a page opened or a text found in one.
fn web_search_action(action: &Value) -> bool {
    let text = |key: &str| action.get(key).is_none_or(Value::is_string);
    match str_field(action, "type") {
        Some("search") => text("query") && action.get("sources").is_none_or(Value::is_array),
        Some("open_page") => text("url"),
        Some("find") | Some("find_in_page") => text("url") && text("pattern"),
        _ => false,
    }
}

/// Gemini's code execution parts, checked against their part types: `code` text, `language` and
/// `outcome` among the enum's values, and no field the part does not have.
fn gemini_part_well_formed(t: &str, v: &Value) -> bool {
    let Some(fields) = v.as_object() else {
        return false;
    };
    let is_text = |key: &str| fields.get(key).is_none_or(Value::is_string);
    let one_of = |key: &str, allowed: &[&str]| {
        fields
            .get(key)
            .is_none_or(|x| x.as_str().is_some_and(|x| allowed.contains(&x)))
    };
    let known: &[&str] = match t {
        "executable_code" => &["code", "language"],
        _ => &["outcome", "output"],
    };
    let only_known = fields.keys().all(|k| {
        ["type", "id", "thought_signature"].contains(&k.as_str()) || known.contains(&k.as_str())
    });
    only_known
        && is_text("id")
        && match t {
            "executable_code" => {
                fields.get("code").is_some_and(Value::is_string)
                    && one_of("language", &["LANGUAGE_UNSPECIFIED", "PYTHON"])
            }
            _ => {
                is_text("output")
                    && one_of(
                        "outcome",
                        &[
                            "OUTCOME_UNSPECIFIED",
                            "OUTCOME_OK",
                            "OUTCOME_FAILED",
                            "OUTCOME_DEADLINE_EXCEEDED",
                        ],
                    )
            }
        }
}

/// The Responses native items sent as they were: a self-contained item whose `id` no earlier
/// item has; a paired call with a `call_id` no earlier call has (function calls included: one
/// namespace), and the first output for it in the next turn. Keys `type:call_id`, or `type:#n`
/// for the n-th block overall (self-contained items).
fn responses_kept(msgs: &[Msg]) -> HashSet<String> {
    let mut kept = HashSet::new();
    let mut call_ids: HashSet<&str> = msgs
        .iter()
        .flat_map(|m| &m.blocks)
        .filter(|b| block_type(&b.v) == Some("tool_use"))
        .filter_map(|b| str_field(&b.v, "id"))
        .collect();
    let mut item_ids: HashSet<&str> = HashSet::new();
    let mut index = 0usize;
    for (at, m) in msgs.iter().enumerate() {
        for b in &m.blocks {
            index += 1;
            let Some(t) = block_type(&b.v) else { continue };
            if native_block(&b.v).is_none_or(|(own, _)| own != Provider::OpenaiResponses) {
                continue;
            }
            let fresh_item = str_field(&b.v, "id").is_none_or(|id| item_ids.insert(id));
            let well_formed = responses_item_well_formed(t, &b.v);
            if RESPONSES_SELF_CONTAINED.contains(&t) {
                if fresh_item && well_formed {
                    kept.insert(format!("{t}:#{index}"));
                }
                continue;
            }
            let Some((_, output)) = RESPONSES_PAIRED.iter().find(|(c, _)| *c == t) else {
                continue;
            };
            let id = call_id(&b.v);
            let answer = msgs
                .get(at + 1)
                .filter(|n| m.is_assistant() && !n.is_assistant());
            // Its first output in the next turn, which must have its input form too.
            let answered = answer
                .and_then(|n| {
                    n.blocks
                        .iter()
                        .find(|o| block_type(&o.v) == Some(*output) && call_id(&o.v) == id)
                })
                .is_some_and(|o| responses_item_well_formed(output, &o.v));
            if !id.is_empty() && fresh_item && well_formed && answered && call_ids.insert(id) {
                kept.insert(format!("{t}:{id}"));
                kept.insert(format!("{output}:{id}"));
            }
        }
    }
    kept
}

/// Native blocks of another provider, Responses calls and outputs that are not paired or that
/// repeat an id, and malformed Gemini parts, as text where they stood (reported). Runs after
/// pairing, on the final turns.
pub fn render_foreign(msgs: &mut [Msg], provider: Provider, ctx: &mut Ctx) {
    let mut kept_responses = if provider == Provider::OpenaiResponses {
        responses_kept(msgs)
    } else {
        HashSet::new()
    };
    let mut index = 0usize;
    for m in msgs.iter_mut() {
        m.blocks.retain_mut(|b| {
            index += 1;
            let Some((own, _)) = native_block(&b.v) else {
                return true;
            };
            let t = block_type(&b.v).unwrap_or("").to_owned();
            let kept = own == provider
                && match own {
                    Provider::Gemini => gemini_part_well_formed(&t, &b.v),
                    // A paired output is sent once: a second one for the same call is text.
                    _ => {
                        kept_responses.remove(&format!("{t}:#{index}"))
                            || kept_responses.remove(&format!("{t}:{}", call_id(&b.v)))
                    }
                };
            if kept {
                // `responses_kept` kept only items that have their input form without these.
                strip_output_only(&t, &mut b.v);
                return true;
            }
            let why = match own {
                _ if own != provider => "no form in this provider",
                Provider::Gemini => "not the form its part has",
                _ => "without its pair, a repeated id, or not its input form",
            };
            // An opaque reference carries nothing a model reads: it goes, reported.
            let Some(text) = render_text::rendered(&b.v) else {
                ctx.report(
                    RepairKind::UnsupportedBlockDropped,
                    [b.src],
                    format!("dropped {t}: {why}, and nothing in it to read"),
                );
                return false;
            };
            ctx.report(
                RepairKind::BlockRenderedAsText,
                [b.src],
                format!("{t} sent as text: {why}"),
            );
            b.v = text_block(&text);
            true
        });
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::super::testutil::*;
    use super::super::{normalize, NormalizeOptions, Provider, RepairKind};

    fn opts(provider: Provider) -> NormalizeOptions {
        NormalizeOptions {
            provider,
            ..Default::default()
        }
    }

    /// A Responses web search and a paired custom tool call go back to Responses as they were
    /// returned, in order; the other providers read them as text.
    #[test]
    fn responses_items_go_back_to_responses_and_are_read_elsewhere() {
        let search = json!({"type": "web_search_call", "id": "ws_1", "status": "completed",
            "action": {"type": "search", "query": "tokio select"}});
        let call = json!({"type": "custom_tool_call", "id": "ctc_1", "call_id": "call_1",
            "name": "apply_diff", "input": "--- a/x\n+++ b/x"});
        let output = json!({"type": "custom_tool_call_output", "call_id": "call_1",
            "output": "applied"});
        let entries = vec![
            user(0, json!("fix it")),
            asst(1, "resp_1", json!([search.clone(), call.clone()])),
            user(2, json!([output.clone()])),
            asst(3, "resp_2", json!([text("Fixed.")])),
            user(4, json!("thanks")),
        ];
        let responses = normalize(&entries, &opts(Provider::OpenaiResponses));
        assert_eq!(&responses.messages[1..4], &[search, call, output]);
        assert!(responses.repairs.is_empty(), "{:?}", responses.repairs);
        for provider in [Provider::Anthropic, Provider::Openai, Provider::Gemini] {
            let n = normalize(&entries, &opts(provider));
            let sent = sent_json(&n);
            for read in ["tokio select", "apply_diff", "+++ b/x", "applied"] {
                assert!(sent.contains(read), "{provider:?} lost {read:?}: {sent}");
            }
            let rendered = n
                .repairs
                .iter()
                .filter(|r| r.kind == RepairKind::BlockRenderedAsText)
                .count();
            assert_eq!(rendered, 3, "{provider:?}: {:?}", n.repairs);
        }
    }

    /// A custom tool call whose output never came is text even for Responses, which refuses an
    /// unpaired call.
    #[test]
    fn an_unpaired_responses_call_is_text_even_for_responses() {
        let entries = vec![
            user(0, json!("go")),
            asst(
                1,
                "resp_1",
                json!([{"type": "custom_tool_call", "call_id": "call_9", "name": "grep", "input": "TODO"}]),
            ),
            user(2, json!("never mind")),
        ];
        let n = normalize(&entries, &opts(Provider::OpenaiResponses));
        let sent = sent_json(&n);
        assert!(!sent.contains("\"custom_tool_call\""), "{sent}");
        assert!(sent.contains("TODO"), "{sent}");
    }

    /// Gemini's code execution parts go back to Gemini as parts; others read the code and its
    /// output.
    #[test]
    fn gemini_code_execution_goes_back_to_gemini_and_is_read_elsewhere() {
        let entries = vec![
            user(0, json!("compute")),
            asst(
                1,
                "g_1",
                json!([{"type": "executable_code", "language": "PYTHON", "code": "print(2**10)"},
                {"type": "code_execution_result", "outcome": "OUTCOME_OK", "output": "1024\n"},
                text("2^10 = 1024")]),
            ),
            user(2, json!("thanks")),
        ];
        let gemini = normalize(&entries, &opts(Provider::Gemini));
        assert_eq!(
            gemini.messages[1]["parts"][0],
            json!({"executableCode": {"language": "PYTHON", "code": "print(2**10)"}})
        );
        assert_eq!(
            gemini.messages[1]["parts"][1],
            json!({"codeExecutionResult": {"outcome": "OUTCOME_OK", "output": "1024\n"}})
        );
        for provider in [
            Provider::Anthropic,
            Provider::Openai,
            Provider::OpenaiResponses,
        ] {
            let sent =
                serde_json::to_string(&normalize(&entries, &opts(provider)).messages).unwrap();
            assert!(
                sent.contains("print(2**10)") && sent.contains("1024"),
                "{sent}"
            );
        }
    }

    /// A Responses item loses only what its output form alone has: a custom tool call's `async`
    /// is an input field too, and stays; `created_by` and an output's `status` go.
    #[test]
    fn only_output_fields_are_taken_out_of_responses_items() {
        let call = json!({"type": "custom_tool_call", "id": "ctc_1", "call_id": "call_1",
            "name": "apply_diff", "input": "diff", "async": true, "created_by": "resp_1"});
        let output = json!({"type": "custom_tool_call_output", "call_id": "call_1",
            "output": "applied", "status": "completed"});
        let entries = vec![
            user(0, json!("fix it")),
            asst(1, "resp_1", json!([call])),
            user(2, json!([output])),
            asst(3, "resp_2", json!([text("Fixed.")])),
        ];
        let sent = normalize(&entries, &opts(Provider::OpenaiResponses)).messages;
        assert_eq!(
            sent[1],
            json!({"type": "custom_tool_call", "id": "ctc_1", "call_id": "call_1",
                "name": "apply_diff", "input": "diff", "async": true})
        );
        assert_eq!(
            sent[2],
            json!({"type": "custom_tool_call_output", "call_id": "call_1", "output": "applied"})
        );
    }
}
