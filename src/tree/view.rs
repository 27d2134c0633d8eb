//! The outline as the model reads it: a short header, then the lines in fixed-size blocks.
//!
//! Blocks are cut by position (every [`LINES_PER_BLOCK`] lines), so a block's bytes change only
//! when one of its own lines changes. Anthropic `cache_control` breakpoints go on whole blocks
//! only: the last whole block, and earlier whole blocks at fixed positions (every
//! [`MARK_SPACING`]th block), so a fold that changes an early line still finds a cached prefix
//! within the provider's ~20-block lookback, and an epoch moves no mark but the last.

use serde_json::{json, Value};

use super::node::{render_line, NodeId};
use crate::history::model::{ApiMessage, Content, Entry, EntryKind, Role};
use crate::history::{normalize, NormalizeOptions, Normalized, Provider};

/// Lines per cache block.
pub const LINES_PER_BLOCK: usize = 16;
/// Blocks between two breakpoints (under Anthropic's ~20-block lookback).
pub const MARK_SPACING: usize = 16;

/// The first block of every outline: how a line reads and that zoom opens it. Constant, so it
/// never breaks the cached prefix.
pub const HEADER: &str = "The earlier part of this conversation, as summary lines, oldest first. \
A line reads id+n|text: a summary of the n messages from message id on (n = 1: one message). \
A line is a summary, never anyone's exact words: call zoom(id, n) to open it into the two lines \
it was made from, and zoom(id, 1) to read a message whole, before you act, guess or quote. \
The messages after the summary follow whole.";

/// The outline's text blocks: [`HEADER`], then the rendered lines, [`LINES_PER_BLOCK`] a block.
pub fn blocks(lines: &[(NodeId, &str)]) -> Vec<String> {
    let mut blocks = vec![HEADER.to_owned()];
    for chunk in lines.chunks(LINES_PER_BLOCK) {
        let rendered: Vec<String> = chunk
            .iter()
            .map(|(node, text)| render_line(*node, text))
            .collect();
        blocks.push(rendered.join("\n"));
    }
    blocks
}

/// Indices (into [`blocks`]) of the blocks that carry a cache breakpoint: whole line blocks only,
/// the last whole one first, then earlier ones at fixed blocks (every [`MARK_SPACING`]th, from the
/// latest down), at most `max_marks`. The earlier marks do not move as the outline grows: a
/// request's bytes up to its last whole block stay those of the previous request, marks
/// included, so an epoch keeps the outline's prefix.
pub fn cache_marks(line_count: usize, max_marks: usize) -> Vec<usize> {
    let whole_blocks = line_count / LINES_PER_BLOCK;
    // Block k (1-based after the header) holds lines [(k-1)·B, k·B).
    if whole_blocks == 0 || max_marks == 0 {
        return Vec::new();
    }
    let latest_fixed = (whole_blocks - 1) / MARK_SPACING * MARK_SPACING;
    std::iter::once(whole_blocks)
        .chain(
            (1..=latest_fixed / MARK_SPACING)
                .rev()
                .map(|k| k * MARK_SPACING),
        )
        .take(max_marks)
        .collect()
}

/// The outline as Anthropic text blocks, with breakpoints on `marks`.
pub fn anthropic_blocks(blocks: &[String], marks: &[usize]) -> Vec<Value> {
    blocks
        .iter()
        .enumerate()
        .map(|(i, text)| {
            let mut block = json!({"type": "text", "text": text});
            if marks.contains(&i) {
                block["cache_control"] = json!({"type": "ephemeral"});
            }
            block
        })
        .collect()
}

/// Breakpoints a request may carry (Anthropic).
pub const MAX_BREAKPOINTS: usize = 4;

/// The context of an outlined thread: one user turn holding the outline (when it has lines)
/// and its `footer` (what the lines dropped, after them: it changes only when they do), then
/// the tail entries, normalized together so the provider accepts the whole. For Anthropic the
/// outline's whole blocks carry breakpoints, leaving room for the caller's own (`cache`).
pub fn outlined_context(
    lines: &[(NodeId, String)],
    footer: &str,
    tail: Vec<Entry>,
    options: &NormalizeOptions,
) -> Normalized {
    if lines.is_empty() {
        return normalize(&tail, options);
    }
    let refs: Vec<(NodeId, &str)> = lines.iter().map(|(n, t)| (*n, t.as_str())).collect();
    let mut texts = blocks(&refs);
    if !footer.is_empty() {
        texts.push(footer.to_owned());
    }
    let outline = Entry {
        message: Some(ApiMessage::new(
            Role::User,
            Content::Blocks(anthropic_blocks(&texts, &[])),
        )),
        ..Entry::new(EntryKind::User)
    };
    let mut entries = Vec::with_capacity(tail.len() + 1);
    entries.push(outline);
    entries.extend(tail);
    let mut normalized = normalize(&entries, options);
    if options.provider == Provider::Anthropic {
        let room = MAX_BREAKPOINTS - usize::from(options.cache);
        let marks = cache_marks(lines.len(), room);
        let content = normalized
            .messages
            .first_mut()
            .and_then(|message| message.get_mut("content"))
            .and_then(Value::as_array_mut);
        if let Some(content) = content {
            for mark in marks {
                if let Some(block) = content.get_mut(mark) {
                    block["cache_control"] = json!({"type": "ephemeral"});
                }
            }
        }
    }
    normalized
}

/// The tools a model reads a summarized or cleared thread with, zoom and search, in the
/// provider's `tools` shape (one Gemini tool declaring both functions).
pub fn navigation_tools(provider: Provider) -> Vec<Value> {
    let definitions = [
        super::zoom::tool_definition(),
        super::zoom::search_tool_definition(),
    ];
    if provider == Provider::Gemini {
        let declarations: Vec<Value> = definitions
            .iter()
            .map(|tool| provider_tool(tool, provider)["functionDeclarations"][0].clone())
            .collect();
        return vec![json!({"functionDeclarations": declarations})];
    }
    definitions
        .iter()
        .map(|tool| provider_tool(tool, provider))
        .collect()
}

/// The zoom tool in the provider's `tools` shape.
pub fn zoom_tool(provider: Provider) -> Value {
    provider_tool(&super::zoom::tool_definition(), provider)
}

/// A tool definition (Anthropic shape) in the provider's `tools` shape.
fn provider_tool(tool: &Value, provider: Provider) -> Value {
    match provider {
        Provider::Anthropic => tool.clone(),
        Provider::Openai => json!({
            "type": "function",
            "function": {
                "name": tool["name"],
                "description": tool["description"],
                "parameters": tool["input_schema"],
            }
        }),
        // Responses makes a function without `strict` strict, every property then required
        // (`search`'s `limit` is optional), and its SDK's `FunctionToolParam` requires the key.
        Provider::OpenaiResponses => json!({
            "type": "function",
            "name": tool["name"],
            "description": tool["description"],
            "parameters": tool["input_schema"],
            "strict": false,
        }),
        Provider::Gemini => json!({
            "functionDeclarations": [{
                "name": tool["name"],
                "description": tool["description"],
                "parameters": tool["input_schema"],
            }]
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn responses_tools_say_they_are_not_strict() {
        let tools = navigation_tools(Provider::OpenaiResponses);
        assert_eq!(tools.len(), 2);
        for tool in tools.iter().chain([&zoom_tool(Provider::OpenaiResponses)]) {
            assert_eq!(tool["strict"], json!(false), "{tool}");
        }
        // Chat's `function.strict` is optional and false when absent.
        for tool in navigation_tools(Provider::Openai) {
            assert!(tool["function"].get("strict").is_none(), "{tool}");
        }
    }

    #[test]
    fn lines_come_in_fixed_blocks_after_the_header() {
        let texts: Vec<String> = (0..20).map(|i| format!("line {i}")).collect();
        let lines: Vec<(NodeId, &str)> = texts
            .iter()
            .enumerate()
            .map(|(i, t)| (NodeId::leaf(i as u64), t.as_str()))
            .collect();
        let blocks = blocks(&lines);
        assert_eq!(blocks.len(), 3);
        assert_eq!(blocks[0], HEADER);
        assert!(blocks[1].starts_with("0+1|line 0\n1+1|line 1"));
        assert_eq!(blocks[1].lines().count(), LINES_PER_BLOCK);
        assert_eq!(
            blocks[2],
            "16+1|line 16\n17+1|line 17\n18+1|line 18\n19+1|line 19"
        );
    }

    #[test]
    fn marks_sit_on_the_last_whole_block_and_on_fixed_blocks_before_it() {
        assert!(cache_marks(15, 3).is_empty());
        assert_eq!(cache_marks(16, 3), vec![1]);
        assert_eq!(cache_marks(40, 3), vec![2]);
        assert_eq!(cache_marks(16 * 16, 3), vec![16]);
        assert_eq!(cache_marks(16 * 17, 3), vec![17, 16]);
        assert_eq!(cache_marks(16 * 40 + 3, 3), vec![40, 32, 16]);
        assert_eq!(cache_marks(16 * 40, 2), vec![40, 32]);
        assert_eq!(cache_marks(16 * 48, 4), vec![48, 32, 16]);
        assert!(cache_marks(16 * 40, 0).is_empty());
    }

    #[test]
    fn a_growing_outline_keeps_its_earlier_marks() {
        // Only the last whole block's mark moves, as long as no new fixed block is reached.
        for lines in (LINES_PER_BLOCK..LINES_PER_BLOCK * 100).step_by(7) {
            for grown in [lines + 5, lines + LINES_PER_BLOCK * 3] {
                let (before, after) = (cache_marks(lines, 3), cache_marks(grown, 3));
                let fixed = |n: usize| (n / LINES_PER_BLOCK - 1) / MARK_SPACING;
                if fixed(lines) == fixed(grown) {
                    assert_eq!(before[1..], after[1..], "{lines} then {grown} lines");
                }
                // Within the provider's ~20-block lookback of each other.
                assert!(after.windows(2).all(|w| w[0] - w[1] <= MARK_SPACING));
            }
        }
    }

    #[test]
    fn breakpoints_are_placed_on_the_marked_blocks() {
        let blocks = vec!["h".to_owned(), "a".to_owned(), "b".to_owned()];
        let out = anthropic_blocks(&blocks, &[1]);
        assert!(out[0].get("cache_control").is_none());
        assert_eq!(out[1]["cache_control"]["type"], "ephemeral");
        assert!(out[2].get("cache_control").is_none());
    }
}
