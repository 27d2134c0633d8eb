//! Step e (media-error strip map) and step l (`stripExcessMediaItems`), `docs/NORMALIZATION.md` § Pipeline.

use std::collections::HashMap;

use serde_json::Value;

use super::blocks::{block_type, is_media, is_type};
use super::{Block, Ctx, Msg, RepairKind};
use crate::history::model::{Entry, EntryKind};

/// Maximum media items (images + documents) per request.
pub const MAX_MEDIA_ITEMS: usize = 100;

const DOC: &[&str] = &["document"];
const IMG: &[&str] = &["image"];
const BOTH: &[&str] = &["document", "image"];

/// Synthetic API error texts (interactive and non-interactive `-p` variants) → block types to
/// strip from the message that caused them.
pub const MEDIA_ERRORS: &[(&str, &[&str])] = &[
    ("PDF too large (max 100 pages, 20MB). Double press esc to go back and try again, or use pdftotext to convert to text first.", DOC),
    ("PDF is password protected. Please double press esc to edit your message and try again.", DOC),
    ("The PDF file was not valid. Double press esc to go back and try again with a different file.", DOC),
    ("Image was too large. Double press esc to go back and try again with a smaller image.", IMG),
    ("Request too large (max 20MB). Double press esc to go back and try with a smaller file.", BOTH),
    ("PDF too large (max 100 pages, 20MB). Try reading the file a different way (e.g., extract text with pdftotext).", DOC),
    ("PDF is password protected. Try using a CLI tool to extract or convert the PDF.", DOC),
    ("The PDF file was not valid. Try converting it to text first (e.g., pdftotext).", DOC),
    ("Image was too large. Try resizing the image or using a different approach.", IMG),
    ("Request too large (max 20MB). Try with a smaller file.", BOTH),
];

/// The block types a media-error text asks to strip.
pub fn error_types(text: &str) -> Option<&'static [&'static str]> {
    let text = text.trim();
    MEDIA_ERRORS
        .iter()
        .find(|(t, _)| *t == text)
        .map(|(_, types)| *types)
}

/// Step e — builds the strip map: entry index → block types to strip.
///
/// For each synthetic API error (assistant with `is_api_error`; `model` is not checked) whose first
/// text matches [`MEDIA_ERRORS`] exactly (surrounding whitespace ignored), walk backwards over the
/// view: other API errors are skipped; the first user entry becomes the target (a meta user
/// message or an attachment, as in the reference; Loupe also accepts a plain user prompt so an
/// oversized pasted image is not re-sent forever); anything else stops the walk.
pub fn build_strip_map(entries: &[Entry], view: &[usize]) -> HashMap<usize, Vec<&'static str>> {
    let mut map: HashMap<usize, Vec<&'static str>> = HashMap::new();
    for (pos, &i) in view.iter().enumerate() {
        let e = &entries[i];
        if !e.is_api_error_message() {
            continue;
        }
        let Some(types) = e.first_text().and_then(error_types) else {
            continue;
        };
        for &j in view[..pos].iter().rev() {
            let prev = &entries[j];
            if prev.is_api_error_message() {
                continue;
            }
            if matches!(prev.kind, EntryKind::User | EntryKind::Attachment) {
                let target = map.entry(j).or_default();
                for t in types {
                    if !target.contains(t) {
                        target.push(t);
                    }
                }
            }
            break;
        }
    }
    map
}

/// Removes the top-level blocks of `types`; returns how many were removed.
pub fn strip_media_types(blocks: &mut Vec<Block>, types: &[&str]) -> usize {
    let before = blocks.len();
    blocks.retain(|b| !block_type(&b.v).is_some_and(|t| types.contains(&t)));
    before - blocks.len()
}

fn nested_media_count(v: &Value) -> usize {
    if !is_type(v, "tool_result") {
        return 0;
    }
    match v.get("content") {
        Some(Value::Array(items)) => items.iter().filter(|x| is_media(x)).count(),
        _ => 0,
    }
}

/// Step l — `stripExcessMediaItems(msgs, max)`: counts image/document blocks, top-level and inside
/// `tool_result`s, and removes the oldest first, scanning messages front to back; within a message
/// nested media go before top-level ones. Emptied turns are fixed later by `enforce`.
pub fn strip_excess_media(msgs: &mut [Msg], max: usize, ctx: &mut Ctx) {
    let total: usize = msgs
        .iter()
        .flat_map(|m| m.blocks.iter())
        .map(|b| usize::from(is_media(&b.v)) + nested_media_count(&b.v))
        .sum();
    if total <= max {
        return;
    }
    let mut excess = total - max;
    for m in msgs.iter_mut() {
        if excess == 0 {
            break;
        }
        let mut removed = 0usize;
        let mut srcs = Vec::new();
        for b in m.blocks.iter_mut() {
            if excess == 0 {
                break;
            }
            if nested_media_count(&b.v) == 0 {
                continue;
            }
            if let Some(Value::Array(items)) = b.v.get_mut("content") {
                items.retain(|x| {
                    if excess > 0 && is_media(x) {
                        excess -= 1;
                        removed += 1;
                        false
                    } else {
                        true
                    }
                });
                srcs.push(b.src);
            }
        }
        m.blocks.retain(|b| {
            if excess > 0 && is_media(&b.v) {
                excess -= 1;
                removed += 1;
                srcs.push(b.src);
                false
            } else {
                true
            }
        });
        if removed > 0 {
            ctx.report(
                RepairKind::MediaCapped,
                srcs,
                format!("removed {removed} oldest media item(s): over {max} per request"),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::testutil::*;
    use super::*;
    use serde_json::json;

    fn api_error(seq: i64, text: &str) -> Entry {
        let mut e = asst(
            seq,
            &format!("err{seq}"),
            json!([{"type": "text", "text": text}]),
        );
        e.is_api_error = true;
        e.message.as_mut().unwrap().model = Some("<synthetic>".into());
        e
    }

    fn doc() -> Value {
        json!({"type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": "AAAA"}})
    }

    fn img() -> Value {
        json!({"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}})
    }

    #[test]
    fn pdf_error_targets_previous_meta_user_skipping_other_errors() {
        let e = vec![
            user(0, json!("read this")),
            meta_user(1, json!([doc(), text("the pdf")])),
            api_error(2, MEDIA_ERRORS[0].0),
            api_error(
                3,
                "PDF is password protected. Try using a CLI tool to extract or convert the PDF.",
            ),
        ];
        let map = build_strip_map(&e, &[0, 1, 2, 3]);
        assert_eq!(map.len(), 1);
        assert_eq!(map[&1], vec!["document"]);
    }

    #[test]
    fn walk_stops_at_assistant_and_system() {
        let e = vec![
            meta_user(0, json!([img()])),
            asst(1, "A", json!([text("x")])),
            api_error(
                2,
                "Image was too large. Try resizing the image or using a different approach.",
            ),
            meta_user(3, json!([img()])),
            system(4, "informational", json!("x")),
            api_error(
                5,
                "Image was too large. Try resizing the image or using a different approach.",
            ),
        ];
        assert!(build_strip_map(&e, &[0, 1, 2, 3, 4, 5]).is_empty());
    }

    #[test]
    fn request_too_large_strips_both_and_unknown_text_nothing() {
        let e = vec![
            attachment(0, json!([img(), doc()])),
            api_error(
                1,
                " Request too large (max 20MB). Try with a smaller file.\n",
            ),
            user(2, json!([img()])),
            api_error(3, "Some other error"),
        ];
        let map = build_strip_map(&e, &[0, 1, 2, 3]);
        assert_eq!(map.len(), 1);
        assert_eq!(map[&0], vec!["document", "image"]);
    }

    #[test]
    fn caps_oldest_media_nested_first() {
        let e = vec![
            user(
                0,
                json!([img(), {"type": "tool_result", "tool_use_id": "a", "content": [img(), text("t")]}]),
            ),
            user(1, json!([img(), img()])),
        ];
        let mut m = msgs(&e);
        let mut ctx = Ctx::new(&e);
        strip_excess_media(&mut m, 2, &mut ctx);
        let s = shape(&m);
        // nested image of message 0 goes first, then its top-level image.
        assert_eq!(
            s[0].1,
            vec![json!({"type": "tool_result", "tool_use_id": "a", "content": [text("t")]})]
        );
        assert_eq!(s[1].1.len(), 2);
        assert_eq!(kinds(&ctx), vec![RepairKind::MediaCapped]);
    }

    #[test]
    fn under_cap_is_untouched() {
        let e = vec![user(0, json!([img(), doc()]))];
        let mut m = msgs(&e);
        let before = m.clone();
        let mut ctx = Ctx::new(&e);
        strip_excess_media(&mut m, 2, &mut ctx);
        assert_eq!(m, before);
        assert!(ctx.repairs.is_empty());
    }
}
