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
//! Their own provider gets them as they were stored, in order; a Responses call whose output is
//! missing, or an output without its call, is sent as text instead (the API refuses it unpaired).
//! Every other provider reads them as text where they stood (`block_rendered_as_text`); an
//! `item_reference`, opaque, is dropped for them (reported).

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

fn call_id(v: &Value) -> &str {
    str_field(v, "call_id").unwrap_or("")
}

/// Fields a Responses output item carries that its input form refuses (`*`: every item).
const RESPONSES_OUTPUT_ONLY: &[(&str, &str)] = &[
    ("*", "created_by"),
    ("custom_tool_call_output", "status"),
    ("custom_tool_call", "async"),
];

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
            if RESPONSES_SELF_CONTAINED.contains(&t) {
                if fresh_item {
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
            let answered = answer.is_some_and(|n| {
                n.blocks
                    .iter()
                    .any(|o| block_type(&o.v) == Some(*output) && call_id(&o.v) == id)
            });
            if !id.is_empty() && fresh_item && answered && call_ids.insert(id) {
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
                if own == Provider::OpenaiResponses {
                    if let Some(fields) = b.v.as_object_mut() {
                        for (ty, key) in RESPONSES_OUTPUT_ONLY {
                            if *ty == "*" || *ty == t {
                                fields.remove(*key);
                            }
                        }
                    }
                }
                return true;
            }
            let why = match own {
                _ if own != provider => "no form in this provider",
                Provider::Gemini => "not the form its part has",
                _ => "without its pair, or a repeated id",
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
}
