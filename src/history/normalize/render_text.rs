//! Blocks a target API has no form for, as the text a model reads in their place
//! (`docs/NORMALIZATION.md` § Block fidelity): server tool calls and their results, MCP calls
//! and results, advisor results, container uploads, documents and search results, and media a
//! target cannot fetch. What a model could read of the block goes: its query, titles and URLs,
//! fetched text, code and its output, a document's title and text. What no model reads stays
//! out: signatures, encrypted fields, base64 data and opaque ids.

use serde_json::{Map, Value};

use super::blocks::{block_type, str_field};

/// Members no model reads: signatures, encrypted payloads, cache markers, ids and raw bytes
/// (a resource's `blob`, a generated image's `result`).
fn is_opaque(key: &str) -> bool {
    matches!(
        key,
        "signature"
            | "thoughtSignature"
            | "thought_signature"
            | "cache_control"
            | "type"
            | "id"
            | "tool_use_id"
            | "blob"
    ) || key.starts_with("encrypted_")
}

/// A `data:` URL: bytes, however they are labelled.
fn is_data_url(s: &str) -> bool {
    s.get(..5).is_some_and(|p| p.eq_ignore_ascii_case("data:"))
}

/// The block as text, headed by what it was; `None` when nothing of it is readable.
pub(crate) fn rendered(v: &Value) -> Option<String> {
    let kind = block_type(v)?;
    let header = match kind {
        "server_tool_use" | "mcp_tool_use" => {
            let name = str_field(v, "name").unwrap_or("tool");
            let server = str_field(v, "server_name")
                .map(|s| format!("{s} "))
                .unwrap_or_default();
            let input = v
                .get("input")
                .filter(|i| !i.as_object().is_some_and(Map::is_empty))
                .map(|i| format!(" {i}"))
                .unwrap_or_default();
            return Some(format!("[{server}{name} call{input}]"));
        }
        "container_upload" => {
            return Some(format!(
                "[file uploaded to the code container: {}]",
                str_field(v, "file_id").unwrap_or("?")
            ))
        }
        "image" => return Some(media_text("image", v)),
        // It marks a model hop and is never rendered into the prompt: nothing to read.
        "fallback" => return None,
        "document" => media_text("document", v),
        "search_result" => "[search result]".to_owned(),
        other => match other.strip_suffix("_tool_result") {
            Some(tool) => format!("[{tool} result]"),
            None => format!("[{other}]"),
        },
    };
    let mut lines = vec![header];
    members(v, &mut lines);
    (lines.len() > 1 || kind == "document").then(|| lines.join("\n"))
}

/// An image or document that is not sent as media: its title and where it is, never its bytes.
pub(super) fn media_text(kind: &str, v: &Value) -> String {
    let source = v.get("source");
    let place = match source.and_then(|s| str_field(s, "type")) {
        Some("url") => source.and_then(|s| str_field(s, "url")).map(str::to_owned),
        Some("file") => source
            .and_then(|s| str_field(s, "file_id"))
            .map(|id| format!("file {id}")),
        _ => None,
    };
    let title = str_field(v, "title");
    match (title, place) {
        (Some(t), Some(p)) => format!("[{kind}: {t} ({p})]"),
        (Some(t), None) => format!("[{kind}: {t}]"),
        (None, Some(p)) => format!("[{kind}: {p}]"),
        (None, None) => format!("[{kind}]"),
    }
}

/// What is readable in any JSON value (a tool's input, a result's content), one line a piece.
pub(crate) fn readable_text(v: &Value) -> String {
    let mut lines = Vec::new();
    readable(v, &mut lines);
    lines.join("\n")
}

/// Appends what is readable in `v`, depth first in stored order.
fn readable(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::String(s) if is_data_url(s) => out.push("[inline data]".to_owned()),
        Value::String(s) if !s.trim().is_empty() => out.push(s.clone()),
        Value::Array(items) => items.iter().for_each(|item| readable(item, out)),
        Value::Object(_) => match block_type(v) {
            Some("image") => out.push(media_text("image", v)),
            Some("document") => {
                out.push(media_text("document", v));
                members(v, out);
            }
            _ => members(v, out),
        },
        _ => {}
    }
}

/// Appends the readable members of the object `v`: free text as it is, other strings, numbers
/// and booleans as `key: value`, nested values in turn. A document's title is in its header.
fn members(v: &Value, out: &mut Vec<String>) {
    let Value::Object(map) = v else { return };
    // Base64 bytes are data, not text; a text source's `data` is the document's text.
    let base64 = str_field(v, "type") == Some("base64");
    let document = block_type(v) == Some("document");
    // A generated image's `result` is its base64 bytes.
    let image_generation = block_type(v) == Some("image_generation_call");
    for (key, value) in map {
        if is_opaque(key)
            || (base64 && key == "data")
            || key == "media_type"
            || (document && key == "title")
            || (image_generation && key == "result")
        {
            continue;
        }
        match value {
            Value::String(s) if s.trim().is_empty() => {}
            Value::String(s) if is_data_url(s) => out.push(format!("{key}: [inline data]")),
            Value::String(s) if is_free_text(key) => out.push(s.clone()),
            Value::String(s) => out.push(format!("{key}: {s}")),
            Value::Number(n) => out.push(format!("{key}: {n}")),
            Value::Bool(b) => out.push(format!("{key}: {b}")),
            Value::Null => {}
            nested => readable(nested, out),
        }
    }
}

/// Members whose value is itself what was read or written, shown without a label.
fn is_free_text(key: &str) -> bool {
    matches!(key, "text" | "content" | "data" | "stdout" | "stderr")
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::super::testutil::*;
    use super::super::RepairKind;
    use super::*;

    /// What a model read, switched to a provider with no form for the blocks that held it, is
    /// still there, and each rendering is reported against its entry.
    #[test]
    fn documents_search_results_and_server_tools_reach_every_other_provider() {
        let entries = vec![
            user(
                0,
                json!([
                    {"type": "document", "title": "Release notes",
                        "source": {"type": "text", "media_type": "text/plain", "data": "v2 drops Python 3.8."}},
                    {"type": "search_result", "title": "Changelog", "source": "https://example.com/changelog",
                        "content": [{"type": "text", "text": "3.8 support ends in v2."}]},
                    {"type": "image", "source": {"type": "file", "file_id": "file_011CNha8iCJcU1wXNR6q4V8w"}},
                    text("Which versions are supported?"),
                ]),
            ),
            asst(
                1,
                "msg_1",
                json!([
                    {"type": "server_tool_use", "id": "srvtoolu_01", "name": "web_search",
                        "input": {"query": "python 3.8 end of life"}},
                    {"type": "web_search_tool_result", "tool_use_id": "srvtoolu_01",
                        "content": [{"type": "web_search_result", "title": "Status of Python versions",
                            "url": "https://devguide.python.org/versions/", "encrypted_content": "SECRETBLOB"}]},
                    text("3.9 and later."),
                ]),
            ),
            user(2, json!("thanks")),
        ];
        for provider in OTHER_PROVIDERS {
            let n = normalize_for(&entries, provider);
            let sent = sent_json(&n);
            for read in [
                "Release notes",
                "v2 drops Python 3.8.",
                "Changelog",
                "https://example.com/changelog",
                "3.8 support ends in v2.",
                "file_011CNha8iCJcU1wXNR6q4V8w",
                "python 3.8 end of life",
                "Status of Python versions",
                "https://devguide.python.org/versions/",
                "3.9 and later.",
            ] {
                assert!(sent.contains(read), "{provider:?} lost {read:?}: {sent}");
            }
            assert!(!sent.contains("SECRETBLOB"), "{provider:?}: {sent}");
            let rendered: Vec<i64> = n
                .repairs
                .iter()
                .filter(|r| r.kind == RepairKind::BlockRenderedAsText)
                .flat_map(|r| r.seqs.clone())
                .collect();
            assert_eq!(rendered, [0, 0, 0, 1, 1], "{provider:?}: {:?}", n.repairs);
        }
    }

    #[test]
    fn a_web_search_shows_its_query_titles_and_urls_never_its_encrypted_content() {
        let call = json!({"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search",
            "input": {"query": "rust lifetimes"}});
        assert_eq!(
            rendered(&call).unwrap(),
            r#"[web_search call {"query":"rust lifetimes"}]"#
        );
        let result = json!({"type": "web_search_tool_result", "tool_use_id": "srvtoolu_1",
            "content": [{"type": "web_search_result", "title": "The Book", "url": "https://doc.rust-lang.org/book",
                "encrypted_content": "SECRETBLOB", "page_age": "2 days"}]});
        let text = rendered(&result).unwrap();
        assert!(text.starts_with("[web_search result]"), "{text}");
        assert!(text.contains("title: The Book"), "{text}");
        assert!(
            text.contains("url: https://doc.rust-lang.org/book"),
            "{text}"
        );
        assert!(!text.contains("SECRETBLOB"), "{text}");
    }

    #[test]
    fn code_execution_shows_its_output_and_a_fetched_document_its_text() {
        let result = json!({"type": "bash_code_execution_tool_result", "tool_use_id": "srvtoolu_2",
            "content": {"type": "bash_code_execution_result", "stdout": "42\n", "stderr": "",
                "return_code": 0, "content": []}});
        assert_eq!(
            rendered(&result).unwrap(),
            "[bash_code_execution result]\n42\n\nreturn_code: 0"
        );
        let fetch = json!({"type": "web_fetch_tool_result", "tool_use_id": "srvtoolu_3",
            "content": {"type": "web_fetch_result", "url": "https://example.com/a",
                "content": {"type": "document", "title": "A page",
                    "source": {"type": "text", "media_type": "text/plain", "data": "Page body."}}}});
        let text = rendered(&fetch).unwrap();
        assert!(text.contains("url: https://example.com/a"), "{text}");
        assert!(text.contains("[document: A page]"), "{text}");
        assert!(text.contains("Page body."), "{text}");
    }

    /// Bytes under any name stay out: data URLs, a resource's blob, a generated image.
    #[test]
    fn inline_bytes_never_become_text_whatever_they_are_called() {
        let screenshot = json!({"type": "computer_call_output", "call_id": "call_1",
            "output": {"type": "computer_screenshot", "image_url": "data:image/png;base64,iVBORSECRETBYTES"}});
        let generated = json!({"type": "image_generation_call", "id": "ig_1", "status": "completed",
            "result": "iVBORGENERATEDBYTES", "revised_prompt": "a red fox"});
        let resource = json!({"type": "mcp_tool_result", "tool_use_id": "mcptoolu_1",
            "content": [{"type": "resource", "resource": {"uri": "file:///a.png", "blob": "BLOBBYTES",
                "mimeType": "image/png"}}]});
        let code = json!({"type": "executable_code", "code": "print(1)", "language": "PYTHON",
            "thoughtSignature": "SIGBYTES"});
        for block in [&screenshot, &generated, &resource, &code] {
            let text = rendered(block).unwrap();
            for bytes in ["SECRETBYTES", "GENERATEDBYTES", "BLOBBYTES", "SIGBYTES"] {
                assert!(!text.contains(bytes), "{text}");
            }
        }
        assert!(rendered(&generated).unwrap().contains("a red fox"));
        assert!(rendered(&resource).unwrap().contains("file:///a.png"));
    }

    #[test]
    fn base64_bytes_and_signatures_never_become_text() {
        let doc = json!({"type": "document", "title": "Scan",
            "source": {"type": "base64", "media_type": "application/pdf", "data": "JVBERi0xLjQK"}});
        let text = rendered(&doc).unwrap();
        assert_eq!(text, "[document: Scan]");
        let compaction = json!({"type": "compaction", "content": "We fixed the parser.",
            "encrypted_content": "OPAQUE"});
        assert_eq!(
            rendered(&compaction).unwrap(),
            "[compaction]\nWe fixed the parser."
        );
    }
}
