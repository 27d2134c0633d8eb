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

/// Native blocks of another provider, and Responses calls and outputs that are not paired, as
/// text where they stood (reported). Runs after pairing, on the final turns.
pub fn render_foreign(msgs: &mut [Msg], provider: Provider, ctx: &mut Ctx) {
    // Paired Responses calls whose output the next turn holds, and the outputs so answered.
    let mut paired: HashSet<String> = HashSet::new();
    if provider == Provider::OpenaiResponses {
        for w in msgs.windows(2) {
            let [call_turn, answer] = w else { continue };
            if !call_turn.is_assistant() || answer.is_assistant() {
                continue;
            }
            for (call, output) in RESPONSES_PAIRED {
                let outputs: HashSet<&str> = answer
                    .blocks
                    .iter()
                    .filter(|b| block_type(&b.v) == Some(*output))
                    .map(|b| call_id(&b.v))
                    .collect();
                for b in &call_turn.blocks {
                    if block_type(&b.v) == Some(*call) && outputs.contains(call_id(&b.v)) {
                        paired.insert(format!("{call}:{}", call_id(&b.v)));
                        paired.insert(format!("{output}:{}", call_id(&b.v)));
                    }
                }
            }
        }
    }
    for m in msgs.iter_mut() {
        m.blocks.retain_mut(|b| {
            let Some((own, _)) = native_block(&b.v) else {
                return true;
            };
            let t = block_type(&b.v).unwrap_or("").to_owned();
            let kept = own == provider
                && (RESPONSES_SELF_CONTAINED.contains(&t.as_str())
                    || GEMINI_PARTS.contains(&t.as_str())
                    || paired.contains(&format!("{t}:{}", call_id(&b.v))));
            if kept {
                return true;
            }
            let why = if own == provider {
                "without its pair"
            } else {
                "no form in this provider"
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
