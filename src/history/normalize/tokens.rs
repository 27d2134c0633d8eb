//! Token estimation (`docs/NORMALIZATION.md` § Token estimate; the loop's `roughTokenCountEstimation`).

use serde_json::Value;

use super::blocks::{block_type, str_field};

/// `Math.round(len / 4)` with `len` in UTF-16 code units (JavaScript `String.length`).
pub fn rough(s: &str) -> u64 {
    let len: u64 = s.chars().map(|c| c.len_utf16() as u64).sum();
    (len + 2) / 4
}

/// One block's tokens as [`estimate_entry_tokens`] counts it (characters / 4).
pub fn block_tokens(b: &Value) -> u64 {
    match block_type(b) {
        Some("text" | "input_text" | "output_text") => rough(str_field(b, "text").unwrap_or("")),
        Some(
            "image" | "document" | "image_url" | "file" | "input_audio" | "input_image"
            | "input_file",
        ) => 2000,
        Some("tool_result") => content_tokens(b.get("content")),
        Some("tool_use") => {
            let input = b.get("input").map(Value::to_string).unwrap_or_default();
            rough(&format!("{}{}", str_field(b, "name").unwrap_or(""), input))
        }
        Some("thinking") => rough(str_field(b, "thinking").unwrap_or("")),
        Some("redacted_thinking") => rough(str_field(b, "data").unwrap_or("")),
        _ => rough(&b.to_string()),
    }
}

fn gemini_part_tokens(p: &Value) -> u64 {
    if let Some(t) = str_field(p, "text") {
        rough(t)
    } else if p.get("inlineData").is_some() || p.get("fileData").is_some() {
        2000
    } else if let Some(call) = p.get("functionCall") {
        let args = call.get("args").map(Value::to_string).unwrap_or_default();
        rough(&format!(
            "{}{}",
            str_field(call, "name").unwrap_or(""),
            args
        ))
    } else if let Some(resp) = p.get("functionResponse") {
        rough(
            &resp
                .get("response")
                .map(Value::to_string)
                .unwrap_or_default(),
        )
    } else {
        rough(&p.to_string())
    }
}

fn content_tokens(c: Option<&Value>) -> u64 {
    match c {
        Some(Value::String(s)) => rough(s),
        Some(Value::Array(items)) => items.iter().map(block_tokens).sum(),
        _ => 0,
    }
}

/// Rough token count of provider messages (`docs/NORMALIZATION.md` § Token estimate), either shape:
/// - every string is `round(UTF-16 length / 4)`, rounded per block;
/// - string content counts as its text; `text` → its text; `image`/`document` (and the OpenAI
///   `image_url`/`file`/`input_audio` parts) → **2000 flat**, also nested in tool results;
///   `tool_result` → the sum of its content; `tool_use` → `name + JSON(input)`; `thinking` → the
///   thinking text (signature ignored); `redacted_thinking` → `data`; any other block → its JSON;
/// - OpenAI `tool_calls` → `name + arguments` each; `tool` messages → their content;
/// - Responses items: `message` → its content parts (`input_text`/`output_text` as text,
///   `input_image`/`input_file` 2000), `function_call` → `name + arguments`,
///   `function_call_output` → its output, any other item (`reasoning`) → its JSON;
/// - Gemini contents: each part's text, `inlineData` 2000, `functionCall` → `name + JSON(args)`,
///   `functionResponse` → JSON of its response.
pub fn estimate_tokens(messages: &[Value]) -> u64 {
    messages
        .iter()
        .map(|m| {
            if let Some(parts) = m.get("parts").and_then(Value::as_array) {
                return parts.iter().map(gemini_part_tokens).sum();
            }
            match str_field(m, "type") {
                Some("function_call") => {
                    let name = str_field(m, "name").unwrap_or("");
                    let args = str_field(m, "arguments").unwrap_or("");
                    return rough(&format!("{name}{args}"));
                }
                Some("function_call_output") => {
                    return rough(str_field(m, "output").unwrap_or(""));
                }
                Some("message") | None => {}
                Some(_) => return rough(&m.to_string()),
            }
            let calls: u64 = m
                .get("tool_calls")
                .and_then(Value::as_array)
                .map(|calls| {
                    calls
                        .iter()
                        .map(|c| {
                            let f = c.get("function");
                            let name = f.and_then(|f| str_field(f, "name")).unwrap_or("");
                            let args = f.and_then(|f| str_field(f, "arguments")).unwrap_or("");
                            rough(&format!("{name}{args}"))
                        })
                        .sum()
                })
                .unwrap_or(0);
            content_tokens(m.get("content")) + calls
        })
        .sum()
}

/// Rough token count of one stored entry as the model would see it, at characters / 4
/// (`docs/NORMALIZATION.md`; the summary tree's budgets and a boundary's `pre_tokens` use it):
/// the [`estimate_tokens`] of a user/assistant/attachment message's content, the text of a
/// `local_command` system entry; 0 for every other entry (progress, boundaries, snips, virtual
/// and API-error entries never reach the model).
pub fn estimate_entry_tokens(entry: &crate::history::model::Entry) -> u64 {
    entry_tokens_with(entry, rough, block_tokens)
}

fn entry_tokens_with(
    entry: &crate::history::model::Entry,
    text: fn(&str) -> u64,
    block: fn(&Value) -> u64,
) -> u64 {
    match model_content(entry) {
        ModelContent::Text(s) => text(s),
        ModelContent::Blocks(blocks) => blocks.iter().map(block).sum(),
        ModelContent::Nothing => 0,
    }
}

/// What of a stored entry a model reads.
pub(super) enum ModelContent<'a> {
    Text(&'a str),
    Blocks(&'a [Value]),
    Nothing,
}

/// A user/assistant/attachment message's content, the content of a `local_command` system
/// entry; nothing of any other entry (progress, boundaries, snips, virtual and API-error
/// entries never reach the model).
pub(super) fn model_content(entry: &crate::history::model::Entry) -> ModelContent<'_> {
    use crate::history::model::{subtype, Content, EntryKind};
    if entry.is_virtual || entry.is_api_error_message() {
        return ModelContent::Nothing;
    }
    match entry.kind {
        EntryKind::User | EntryKind::Assistant | EntryKind::Attachment => match &entry.message {
            Some(message) => match &message.content {
                Content::Text(s) => ModelContent::Text(s),
                Content::Blocks(blocks) => ModelContent::Blocks(blocks),
            },
            None => ModelContent::Nothing,
        },
        EntryKind::System if entry.subtype.as_deref() == Some(subtype::LOCAL_COMMAND) => {
            match entry.content.as_ref() {
                Some(Value::String(s)) => ModelContent::Text(s),
                Some(Value::Array(blocks)) => ModelContent::Blocks(blocks),
                _ => ModelContent::Nothing,
            }
        }
        _ => ModelContent::Nothing,
    }
}

/// Characters per token of each kind of content, as tenths (35 = 3.5 characters a token).
///
/// How they were derived: on real Claude Code transcripts the input tokens reported in `usage`
/// grew 1.4 to 2.0 times faster than characters / 4, and those transcripts are mostly code, JSON
/// and tool output. Code, JSON and tool output therefore count 2.5 characters a token (1.6 times
/// characters / 4, inside that range; a JSON file is counted at 2 bytes a token by the reference
/// agent itself). English prose tokenizes more densely; it counts 3.5 characters a token, a
/// little more than characters / 4 so that prose never lowers the estimate below the reference.
/// Chinese, Japanese and Korean characters are about one token each (characters / 4 counts them
/// a quarter of a token, the worst undercount); other non-ASCII letters count two characters a
/// token. The rates err high: a late compaction fails the request, an early one costs a summary.
pub const TENTHS_PER_TOKEN_CODE: u64 = 25;
pub const TENTHS_PER_TOKEN_PROSE: u64 = 35;
pub const TENTHS_PER_TOKEN_CJK: u64 = 10;
pub const TENTHS_PER_TOKEN_OTHER: u64 = 20;

/// Text whose ASCII holds at least this share of symbols (brackets, quotes, operators,
/// separators), in percent, counts as code, JSON or tool output; prose holds 2 to 4 %.
const CODE_SYMBOL_PERCENT: u64 = 7;

/// The token count of a text by the per-kind rates above. Code is told from prose by the share
/// of symbols in its ASCII characters, CJK and other non-ASCII characters by their code points.
pub fn text_tokens(text: &str) -> u64 {
    let (rest, cjk) = text_split(text);
    rest + cjk
}

/// [`text_tokens`] in two parts: its CJK characters' tokens, and the rest's (at least 1 for a
/// non-empty text), which the estimate calibrates apart.
pub(super) fn text_split(text: &str) -> (u64, u64) {
    let (mut ascii, mut symbols, mut cjk, mut other) = (0_u64, 0_u64, 0_u64, 0_u64);
    for c in text.chars() {
        if c.is_ascii() {
            ascii += 1;
            if c.is_ascii_punctuation() {
                symbols += 1;
            }
        } else if is_cjk(c) {
            cjk += 1;
        } else {
            other += 1;
        }
    }
    let ascii_rate = if ascii > 0 && symbols * 100 >= ascii * CODE_SYMBOL_PERCENT {
        TENTHS_PER_TOKEN_CODE
    } else {
        TENTHS_PER_TOKEN_PROSE
    };
    let rest = ascii * 10 / ascii_rate + other * 10 / TENTHS_PER_TOKEN_OTHER;
    let cjk = cjk * 10 / TENTHS_PER_TOKEN_CJK;
    if rest + cjk == 0 && !text.is_empty() {
        (1, 0)
    } else {
        (rest, cjk)
    }
}

/// Han, kana and Hangul: about one token each.
fn is_cjk(c: char) -> bool {
    matches!(u32::from(c),
        0x3040..=0x30FF      // hiragana, katakana
        | 0x3400..=0x4DBF    // CJK extension A
        | 0x4E00..=0x9FFF    // CJK unified ideographs
        | 0xAC00..=0xD7AF    // Hangul syllables
        | 0xF900..=0xFAFF    // CJK compatibility ideographs
        | 0xFF00..=0xFFEF    // full-width forms
        | 0x20000..=0x2FFFF) // supplementary ideographs
}

/// The tokens an assistant entry's `message.usage` reports for its request and response: its
/// prompt (cache reads and writes included) plus its output ([`Usage::read`] names the forms).
/// None without usage, for a synthetic message (`model: "<synthetic>"`), an API error or a
/// virtual entry, and when every figure is 0. Each figure is clamped to [`MAX_USAGE_TOKENS`], so
/// a figure no provider could report (`2^64-1`) neither wraps the sum nor drives a thread's
/// stored count negative.
pub fn usage_tokens(entry: &crate::history::model::Entry) -> Option<u64> {
    use crate::history::model::EntryKind;
    if entry.kind != EntryKind::Assistant || entry.is_api_error || entry.is_virtual {
        return None;
    }
    let message = entry.message.as_ref()?;
    if message.model.as_deref() == Some("<synthetic>") {
        return None;
    }
    let total = Usage::read(message.usage.as_ref()?).total();
    (total > 0).then_some(total)
}

/// What a response's `usage` reports, whichever provider's names it carries: the prompt split
/// by price (plain input, cache writes, cache reads, which add up to the prompt) and the output.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    /// The prompt's tokens neither written to nor read from a cache.
    pub input: u64,
    pub cache_write: u64,
    pub cache_read: u64,
    /// The response's tokens, reasoning included.
    pub output: u64,
}

impl Usage {
    /// A `usage` object in any provider's form (0 for every figure of anything else):
    ///
    /// - Anthropic: `input_tokens`, `cache_creation_input_tokens` and `cache_read_input_tokens`,
    ///   which add up to the prompt, and `output_tokens`.
    /// - OpenAI Responses: `input_tokens`, the whole prompt, of which
    ///   `input_tokens_details.cached_tokens` were read from the cache, and `output_tokens`.
    /// - OpenAI Chat Completions: `prompt_tokens`, the whole prompt, of which
    ///   `prompt_tokens_details.cached_tokens` were cached, and `completion_tokens`.
    /// - Gemini's `usageMetadata` (its REST names, or the snake_case of its Python SDK's
    ///   default dump): `promptTokenCount`, of which `cachedContentTokenCount` were cached, plus
    ///   `toolUsePromptTokenCount` (not part of it), and `candidatesTokenCount` plus
    ///   `thoughtsTokenCount`.
    ///
    /// A form is chosen by the names it holds as numbers (Anthropic's and Responses'
    /// `input_tokens`/`output_tokens` first), so a `usage` holding a provider's names beside
    /// Anthropic's is counted once, and a stray `null` or cache figure chooses nothing. A
    /// cached figure above its prompt counts as the whole prompt.
    pub fn read(usage: &Value) -> Usage {
        let has = |names: &[&str]| {
            names
                .iter()
                .any(|name| usage.get(name).is_some_and(Value::is_number))
        };
        let field = |name: &str| usage_figure(usage, name);
        // Of a whole prompt, the part a cache served: the rest is plain input.
        let split_cached = |prompt: u64, cached: u64| {
            let read = cached.min(prompt);
            (prompt - read, read)
        };
        if has(&["input_tokens", "output_tokens"]) {
            let input = field("input_tokens");
            let (input, cache_write, cache_read) =
                if has(&["cache_creation_input_tokens", "cache_read_input_tokens"]) {
                    let write = field("cache_creation_input_tokens");
                    (input, write, field("cache_read_input_tokens"))
                } else {
                    let cached = usage_figure(&usage["input_tokens_details"], "cached_tokens");
                    let (input, read) = split_cached(input, cached);
                    (input, 0, read)
                };
            Usage {
                input,
                cache_write,
                cache_read,
                output: field("output_tokens"),
            }
        } else if has(&["prompt_tokens", "completion_tokens"]) {
            let cached = usage_figure(&usage["prompt_tokens_details"], "cached_tokens");
            let (input, cache_read) = split_cached(field("prompt_tokens"), cached);
            Usage {
                input,
                cache_write: 0,
                cache_read,
                output: field("completion_tokens"),
            }
        } else {
            // Gemini's REST names, else its Python SDK's.
            let gemini = |camel: &str, snake: &str| field(camel).max(field(snake));
            let (input, cache_read) = split_cached(
                gemini("promptTokenCount", "prompt_token_count"),
                gemini("cachedContentTokenCount", "cached_content_token_count"),
            );
            Usage {
                input: input + gemini("toolUsePromptTokenCount", "tool_use_prompt_token_count"),
                cache_write: 0,
                cache_read,
                output: gemini("candidatesTokenCount", "candidates_token_count")
                    + gemini("thoughtsTokenCount", "thoughts_token_count"),
            }
        }
    }

    /// The whole prompt: plain input, cache writes and cache reads.
    pub fn prompt(&self) -> u64 {
        self.input + self.cache_write + self.cache_read
    }

    /// The prompt and the output: everything the next request holds again.
    pub fn total(&self) -> u64 {
        self.prompt() + self.output
    }
}

/// One figure of a `usage` object, as [`usage_tokens`] counts it: 0 when absent or not a
/// non-negative integer (a string, a negative or fractional number), at most
/// [`MAX_USAGE_TOKENS`].
fn usage_figure(usage: &Value, name: &str) -> u64 {
    usage
        .get(name)
        .and_then(Value::as_u64)
        .unwrap_or(0)
        .min(MAX_USAGE_TOKENS)
}

/// The largest figure one `usage` field counts for: far above any provider's context window
/// (a few million tokens), far below where four of them could overflow an `i64`.
pub const MAX_USAGE_TOKENS: u64 = 1_000_000_000;

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn each_kind_of_text_has_its_rate_and_none_counts_less_than_chars_over_4() {
        let prose = "The parser rounds half up now, and the report agrees with it.";
        let code = "fn main() { let x = vec![1, 2]; println!(\"{:?}\", x); }";
        let json = r#"{"file_path":"/src/a.ts","old_string":"a","new_string":"b"}"#;
        let cjk = "日本語の請求書も直りました";
        for text in [prose, code, json, cjk] {
            assert!(text_tokens(text) >= rough(text), "{text}");
        }
        assert_eq!(text_tokens(prose), 61 * 10 / 35);
        assert_eq!(text_tokens(code), 54 * 10 / 25);
        assert_eq!(text_tokens(cjk), 13);
        assert!(text_tokens(json) >= rough(json) * 3 / 2);
    }

    fn reply(usage: Value) -> crate::history::model::Entry {
        serde_json::from_value(json!({"type": "assistant", "message": {"role": "assistant",
            "model": "m", "content": [{"type": "text", "text": "ok"}], "usage": usage}}))
        .unwrap()
    }

    #[test]
    fn every_providers_usage_counts_its_prompt_once() {
        let anthropic = json!({"input_tokens": 3, "cache_creation_input_tokens": 100,
            "cache_read_input_tokens": 900, "output_tokens": 20});
        // OpenAI's and Gemini's cached tokens are part of the prompt, not beside it.
        let responses = json!({"input_tokens": 1003, "input_tokens_details": {"cached_tokens": 900},
            "output_tokens": 20, "output_tokens_details": {"reasoning_tokens": 8},
            "total_tokens": 1023});
        let chat = json!({"prompt_tokens": 1003, "completion_tokens": 20, "total_tokens": 1023,
            "prompt_tokens_details": {"cached_tokens": 900, "audio_tokens": 0},
            "completion_tokens_details": {"reasoning_tokens": 8}});
        let gemini = json!({"promptTokenCount": 1003, "cachedContentTokenCount": 900,
            "candidatesTokenCount": 12, "thoughtsTokenCount": 8, "totalTokenCount": 1023});
        // What a client stored before Chat's names counted: them beside Anthropic's.
        let both = json!({"prompt_tokens": 1003, "completion_tokens": 20,
            "prompt_tokens_details": {"cached_tokens": 900},
            "input_tokens": 103, "cache_read_input_tokens": 900, "output_tokens": 20});
        for usage in [anthropic, responses, chat, gemini, both] {
            assert_eq!(usage_tokens(&reply(usage.clone())), Some(1023), "{usage}");
        }
    }

    /// Forms the first reading got wrong: Gemini's tool-use prompt (outside its prompt count)
    /// and its Python SDK's snake_case dump; a Chat usage beside a lone Anthropic cache figure
    /// or a `null`; and Anthropic's names winning over other figures of another form.
    #[test]
    fn every_field_of_a_form_counts_and_only_numbers_choose_it() {
        let gemini_tools = json!({"promptTokenCount": 1003, "cachedContentTokenCount": 900,
            "toolUsePromptTokenCount": 500, "candidatesTokenCount": 12, "thoughtsTokenCount": 8,
            "totalTokenCount": 1523});
        assert_eq!(Usage::read(&gemini_tools).total(), 1523);
        assert_eq!(Usage::read(&gemini_tools).cache_read, 900);
        let gemini_python = json!({"prompt_token_count": 1003, "cached_content_token_count": 900,
            "candidates_token_count": 12, "thoughts_token_count": 8, "total_token_count": 1023});
        assert_eq!(Usage::read(&gemini_python).total(), 1023);
        let chat_beside_a_cache_figure = json!({"prompt_tokens": 1003, "completion_tokens": 20,
            "prompt_tokens_details": {"cached_tokens": 900}, "cache_read_input_tokens": 900});
        let chat_beside_null = json!({"prompt_tokens": 1003, "completion_tokens": 20,
            "prompt_tokens_details": {"cached_tokens": 900}, "input_tokens": null});
        for usage in [chat_beside_a_cache_figure, chat_beside_null] {
            let read = Usage::read(&usage);
            assert_eq!(
                (read.input, read.cache_read, read.output),
                (103, 900, 20),
                "{usage}"
            );
        }
        let anthropic_wins = json!({"prompt_tokens": 5000, "completion_tokens": 70,
            "input_tokens": 3, "cache_creation_input_tokens": 100,
            "cache_read_input_tokens": 900, "output_tokens": 20});
        let read = Usage::read(&anthropic_wins);
        assert_eq!(
            (read.input, read.cache_write, read.cache_read, read.output),
            (3, 100, 900, 20)
        );
    }

    #[test]
    fn openai_and_gemini_cached_tokens_are_cache_reads() {
        let read = |usage: Value| Usage::read(&usage);
        let split = |input, cache_write, cache_read, output| Usage {
            input,
            cache_write,
            cache_read,
            output,
        };
        assert_eq!(
            read(json!({"prompt_tokens": 1003, "completion_tokens": 20,
                "prompt_tokens_details": {"cached_tokens": 900}})),
            split(103, 0, 900, 20)
        );
        assert_eq!(
            read(
                json!({"input_tokens": 1003, "input_tokens_details": {"cached_tokens": 900},
                "output_tokens": 20})
            ),
            split(103, 0, 900, 20)
        );
        assert_eq!(
            read(
                json!({"promptTokenCount": 1003, "cachedContentTokenCount": 900,
                "candidatesTokenCount": 12, "thoughtsTokenCount": 8})
            ),
            split(103, 0, 900, 20)
        );
        // Without details, the whole prompt is plain input; a cached figure above the prompt
        // is the prompt, never an underflow.
        assert_eq!(
            read(json!({"prompt_tokens": 50, "completion_tokens": 5})),
            split(50, 0, 0, 5)
        );
        assert_eq!(
            read(json!({"prompt_tokens": 50, "prompt_tokens_details": {"cached_tokens": 80}})),
            split(0, 0, 50, 0)
        );
        assert_eq!(
            read(json!({"prompt_tokens": null, "prompt_tokens_details": null})),
            split(0, 0, 0, 0)
        );
        assert_eq!(read(json!({"total_tokens": 9})), Usage::default());
        let max = MAX_USAGE_TOKENS;
        let huge = read(
            json!({"promptTokenCount": u64::MAX, "candidatesTokenCount": u64::MAX,
            "thoughtsTokenCount": u64::MAX}),
        );
        assert_eq!(huge.total(), 3 * max);
    }

    #[test]
    fn rough_rounds_like_math_round() {
        assert_eq!(rough(""), 0);
        assert_eq!(rough("a"), 0);
        assert_eq!(rough("ab"), 1);
        assert_eq!(rough("abcdef"), 2);
        assert_eq!(rough("😀😀"), 1); // 4 UTF-16 units
    }

    #[test]
    fn estimates_blocks() {
        let msgs = vec![
            json!({"role": "user", "content": "abcdefgh"}),
            json!({"role": "assistant", "content": [
                {"type": "thinking", "thinking": "abcd", "signature": "zzzzzzzzzzzzzzzz"},
                {"type": "tool_use", "id": "x", "name": "ab", "input": {}}
            ]}),
            json!({"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "x", "content": [{"type": "image", "source": {}}, {"type": "text", "text": "abcd"}]}
            ]}),
        ];
        // 2 + (1 + round(4/4)=1) + (2000 + 1)
        assert_eq!(estimate_tokens(&msgs), 2 + 1 + 1 + 2000 + 1);
        let oa = vec![json!({"role": "assistant", "content": null, "tool_calls": [
            {"id": "c", "type": "function", "function": {"name": "abcd", "arguments": "{}"}}]})];
        assert_eq!(estimate_tokens(&oa), 2);
    }
}
