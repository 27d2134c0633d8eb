//! `zoom(id, n)`: what the model asks, checked and answered in words it can correct.

use serde_json::{json, Value};

use super::node::NodeId;

/// What a valid zoom reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ZoomTarget {
    /// `zoom(id, 1)`: the message itself, whole.
    Message(u64),
    /// `zoom(id, n)`: the two lines line `id+n` was made from, `n/2` messages each.
    Halves(NodeId, NodeId),
}

/// A zoom the model must correct; the text is the tool result it reads.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ZoomError {
    #[error("Error: zoom takes a line's id and n, as written: id+n.")]
    NotALine,
    #[error("Error: no line {id}+{n} here.")]
    NoSuchLine { id: i64, n: i64 },
}

/// Checks `zoom(id, n)` against a thread of `message_count` messages and says what to read.
/// Whether the halves' lines are built is for the caller to check (two indexed reads).
pub fn plan(id: i64, n: i64, message_count: u64) -> Result<ZoomTarget, ZoomError> {
    let (Ok(first), Ok(len)) = (u64::try_from(id), u64::try_from(n)) else {
        return Err(ZoomError::NotALine);
    };
    let node = NodeId::from_line(first, len).ok_or(ZoomError::NotALine)?;
    if !node.is_complete_below(message_count) {
        return Err(ZoomError::NoSuchLine { id, n });
    }
    Ok(match node.children() {
        None => ZoomTarget::Message(first),
        Some((left, right)) => ZoomTarget::Halves(left, right),
    })
}

/// The tool's name, as the model calls it.
pub const TOOL_NAME: &str = "zoom";

/// The zoom tool definition (Anthropic `tools[]` shape: name, description, input_schema).
pub fn tool_definition() -> Value {
    json!({
        "name": TOOL_NAME,
        "description": "Open a line of the summarized conversation: zoom(id, n) with the line's id+n gives the two \
    lines it was made from (n/2 messages each); zoom(id, 1) gives the message whole. Whenever you need something from \
    earlier, find its latest mention in the summary and zoom until you have it whole, before you act, guess or ask.",
        "input_schema": {
            "type": "object",
            "properties": {
                "id": {"type": "integer", "description": "The line's first message, as in id+n."},
                "n": {"type": "integer", "description": "How many messages the line covers, as in id+n."}
            },
            "required": ["id", "n"]
        }
    })
}

/// The search tool's name, as the model calls it.
pub const SEARCH_TOOL_NAME: &str = "search";

/// The search tool definition (Anthropic `tools[]` shape), offered with zoom: its results are
/// lines in the outline's own `id+n|text` form, so the next call is a zoom.
pub fn search_tool_definition() -> Value {
    json!({
        "name": SEARCH_TOOL_NAME,
        "description": "Search everything this conversation ever held, including what the summary left out: \
    search(query) gives the messages and summary lines that contain the query's words or exact strings (a file \
    path, a command, an error code, a number, a name), best first, as id+n|text lines with the match marked \
    «like this». Use it when the summary does not name what you need, then zoom(id, n) to open a hit: \
    zoom(id, 1) reads a message whole. Put an exact phrase in double quotes.",
        "input_schema": {
            "type": "object",
            "properties": {
                "query": {"type": "string", "description": "Words or exact strings to find; \"a phrase\" in quotes."},
                "limit": {"type": "integer", "description": "Most results (default 10, at most 50)."}
            },
            "required": ["query"]
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_seed_cases() {
        // zoom(0, 2) opens into 0+1 and 1+1; zoom(0, 1) is the first message.
        assert_eq!(
            plan(0, 2, 4),
            Ok(ZoomTarget::Halves(NodeId::leaf(0), NodeId::leaf(1)))
        );
        assert_eq!(plan(0, 1, 4), Ok(ZoomTarget::Message(0)));
        // zoom(1, 2) is not a line; zoom(64, 1) is no message of a short chat.
        assert_eq!(
            plan(1, 2, 4).unwrap_err().to_string(),
            "Error: zoom takes a line's id and n, as written: id+n."
        );
        assert_eq!(
            plan(64, 1, 4).unwrap_err().to_string(),
            "Error: no line 64+1 here."
        );
    }

    #[test]
    fn malformed_arguments_are_not_lines() {
        for (id, n) in [(0, 3), (0, 0), (-2, 2), (2, -2), (4, 8)] {
            assert_eq!(
                plan(id, n, 100),
                Err(ZoomError::NotALine),
                "zoom({id}, {n})"
            );
        }
    }

    #[test]
    fn a_block_that_is_not_complete_is_no_line() {
        assert_eq!(plan(8, 8, 15), Err(ZoomError::NoSuchLine { id: 8, n: 8 }));
        assert!(plan(8, 8, 16).is_ok());
    }

    #[test]
    fn the_tool_asks_for_id_and_n() {
        let tool = tool_definition();
        assert_eq!(tool["name"], "zoom");
        assert_eq!(tool["input_schema"]["required"], json!(["id", "n"]));
    }
}
