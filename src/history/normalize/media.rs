//! Step e (media-error strip map) and step l (`stripExcessMediaItems`), `docs/NORMALIZATION.md`
//! § Pipeline, and Loupe's media rules (what every provider accepts, `docs/PROVIDER-RULES.md`
//! A.7 / D1.16): each refused item becomes a short text placeholder naming the reason
//! (`media_refused`); stored entries are never changed.

use std::collections::HashMap;

use serde_json::Value;

use super::blocks::{block_type, is_media, is_type, str_field, text_block};
use super::image::{decode_base64_prefix, dimensions, sniff};
use super::{Block, Ctx, Msg, RepairKind};
use crate::history::model::{Entry, EntryKind};

/// Image media types every provider accepts.
pub const IMAGE_MEDIA_TYPES: &[&str] = &["image/jpeg", "image/png", "image/gif", "image/webp"];
/// Base64 characters per image (5 MB: the strictest of the providers' limits).
pub const MAX_IMAGE_BASE64_BYTES: usize = 5 * 1024 * 1024;
/// Pixels per side of any image.
pub const MAX_IMAGE_SIDE: u32 = 8000;
/// Beyond this many images in a request, each must fit [`MANY_IMAGES_MAX_SIDE`].
pub const MANY_IMAGES: usize = 20;
pub const MANY_IMAGES_MAX_SIDE: u32 = 2000;
/// The largest request body (32 MB); media are refused, oldest first, until the messages fit.
pub const MAX_REQUEST_BYTES: usize = 32 * 1024 * 1024;

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

/// Visits every image and document (top level, and inside `tool_result` content) oldest first,
/// with the source entry of its block.
fn for_each_media(msgs: &mut [Msg], mut f: impl FnMut(&mut Value, u32)) {
    for m in msgs.iter_mut() {
        for b in m.blocks.iter_mut() {
            let src = b.src;
            if is_media(&b.v) {
                f(&mut b.v, src);
            } else if is_type(&b.v, "tool_result") {
                if let Some(Value::Array(items)) = b.v.get_mut("content") {
                    for item in items.iter_mut().filter(|x| is_media(x)) {
                        f(item, src);
                    }
                }
            }
        }
    }
}

/// The base64 source of an image or document: `(media_type, data)`; `None` for URL, file and
/// text sources (nothing to read).
fn base64_source(v: &Value) -> Option<(&str, Option<&str>)> {
    let source = v.get("source")?;
    if str_field(source, "type") != Some("base64") {
        return None;
    }
    Some((
        str_field(source, "media_type").unwrap_or(""),
        str_field(source, "data"),
    ))
}

/// Pixel size of a base64 image's data: the header is read from a short prefix, or from the whole
/// data for a JPEG whose frame header comes later.
fn pixel_size(data: &str) -> Option<(u32, u32)> {
    let head = decode_base64_prefix(data, 64 * 1024)?;
    dimensions(&head).or_else(|| {
        if sniff(&head) == Some("image/jpeg") && head.len() == 64 * 1024 {
            dimensions(&decode_base64_prefix(data, usize::MAX)?)
        } else {
            None
        }
    })
}

/// Why the provider would refuse this image or document, if it would.
fn refusal(v: &Value) -> Option<String> {
    let (media, data) = base64_source(v)?;
    let Some(data) = data else {
        return Some("no base64 data".into());
    };
    let head = decode_base64_prefix(data, 16);
    if is_type(v, "document") {
        if media != "application/pdf" {
            return Some(format!("media type {media:?} is not accepted"));
        }
        return match head.as_deref().and_then(sniff) {
            Some("application/pdf") => None,
            _ => Some("data is not application/pdf".into()),
        };
    }
    if !IMAGE_MEDIA_TYPES.contains(&media) {
        return Some(format!("media type {media:?} is not accepted"));
    }
    if data.len() > MAX_IMAGE_BASE64_BYTES {
        return Some(format!(
            "{} bytes of base64 > {MAX_IMAGE_BASE64_BYTES} bytes",
            data.len()
        ));
    }
    match head.as_deref().and_then(sniff) {
        Some(found) if found == media => {}
        Some(found) => return Some(format!("data is {found}, not {media}")),
        None => return Some(format!("data is not {media}")),
    }
    let Some((w, h)) = pixel_size(data) else {
        return Some("unreadable image header".into());
    };
    if w > MAX_IMAGE_SIDE || h > MAX_IMAGE_SIDE {
        return Some(format!("{w}x{h} px > {MAX_IMAGE_SIDE}x{MAX_IMAGE_SIDE}"));
    }
    None
}

/// Replaces the media item by its placeholder and reports why.
fn refuse(v: &mut Value, src: u32, reason: &str, ctx: &mut Ctx) {
    let kind = block_type(v).unwrap_or("media").to_string();
    *v = text_block(&format!("[{kind} removed: {reason}]"));
    ctx.report(
        RepairKind::MediaRefused,
        [src],
        format!("{kind} replaced by a placeholder: {reason}"),
    );
}

/// Loupe — every base64 image must have an accepted media type ([`IMAGE_MEDIA_TYPES`]) that its
/// magic bytes agree with, at most [`MAX_IMAGE_BASE64_BYTES`] of base64, a readable header and at
/// most [`MAX_IMAGE_SIDE`] pixels a side; every base64 document must be a PDF (`%PDF-`). Others
/// become placeholders (`media_refused`). URL and file sources are not read.
pub fn refuse_unacceptable(msgs: &mut [Msg], ctx: &mut Ctx) {
    for_each_media(msgs, |v, src| {
        if let Some(reason) = refusal(v) {
            refuse(v, src, &reason, ctx);
        }
    });
}

/// Loupe — limits over the whole request, after the per-item checks and the count cap: with more
/// than [`MANY_IMAGES`] images, each larger than [`MANY_IMAGES_MAX_SIDE`] a side is refused; then,
/// while the messages would exceed [`MAX_REQUEST_BYTES`], the oldest base64 media are refused.
///
/// The pipeline runs the two passes itself ([`refuse_large_images_of_many`],
/// [`refuse_oldest_until_fits`]), so that a run resumed after a checkpoint counts the prefix's
/// images and bytes too (`incremental`); this is the same decision for one whole request.
pub fn enforce_request_limits(msgs: &mut [Msg], ctx: &mut Ctx) {
    let media = request_media(msgs);
    if media.images > MANY_IMAGES {
        refuse_large_images_of_many(msgs, ctx);
    }
    if media.media_bytes == 0 {
        return;
    }
    let total: usize = msgs.iter().map(block_bytes).sum();
    if total > MAX_REQUEST_BYTES {
        refuse_oldest_until_fits(msgs, total, ctx);
    }
}

/// What the request-wide limits count in some messages, before they refuse anything.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RequestMedia {
    /// Images, top level and inside tool results.
    pub images: usize,
    /// Images larger than [`MANY_IMAGES_MAX_SIDE`] a side (refused in a request of many images).
    /// Only counted by [`request_media_with_sizes`]: reading pixel sizes decodes each header.
    pub large_images: usize,
    /// Bytes of base64 media data.
    pub media_bytes: usize,
}

impl std::ops::AddAssign for RequestMedia {
    fn add_assign(&mut self, other: RequestMedia) {
        self.images += other.images;
        self.large_images += other.large_images;
        self.media_bytes += other.media_bytes;
    }
}

/// Every image and document of `msgs` (top level, and inside `tool_result` content), oldest first.
fn visit_media(msgs: &[Msg], mut f: impl FnMut(&Value)) {
    for b in msgs.iter().flat_map(|m| m.blocks.iter()) {
        if is_media(&b.v) {
            f(&b.v);
        } else if is_type(&b.v, "tool_result") {
            if let Some(Value::Array(items)) = b.v.get("content") {
                items.iter().filter(|x| is_media(x)).for_each(&mut f);
            }
        }
    }
}

/// The images and media bytes of `msgs`, as [`enforce_request_limits`] counts them.
pub fn request_media(msgs: &[Msg]) -> RequestMedia {
    let mut media = RequestMedia::default();
    visit_media(msgs, |v| {
        media.images += usize::from(is_type(v, "image"));
        media.media_bytes += base64_source(v).and_then(|(_, d)| d).map_or(0, str::len);
    });
    media
}

/// [`request_media`] with `large_images` counted.
pub fn request_media_with_sizes(msgs: &[Msg]) -> RequestMedia {
    let mut media = request_media(msgs);
    visit_media(msgs, |v| {
        media.large_images += usize::from(large_size(v).is_some())
    });
    media
}

/// The pixel size of a base64 image over [`MANY_IMAGES_MAX_SIDE`] a side.
fn large_size(v: &Value) -> Option<(u32, u32)> {
    let size = match base64_source(v) {
        Some((_, Some(data))) if is_type(v, "image") => pixel_size(data),
        _ => None,
    };
    size.filter(|(w, h)| *w.max(h) > MANY_IMAGES_MAX_SIDE)
}

/// Loupe — in a request of more than [`MANY_IMAGES`] images, each image larger than
/// [`MANY_IMAGES_MAX_SIDE`] a side is refused.
pub fn refuse_large_images_of_many(msgs: &mut [Msg], ctx: &mut Ctx) {
    for_each_media(msgs, |v, src| {
        if let Some((w, h)) = large_size(v) {
            let reason = format!(
                "{w}x{h} px > {MANY_IMAGES_MAX_SIDE}x{MANY_IMAGES_MAX_SIDE} in a request of more than {MANY_IMAGES} images"
            );
            refuse(v, src, &reason, ctx);
        }
    });
}

/// The bytes a message adds to the request's size as [`enforce_request_limits`] counts it: each
/// block's JSON plus one.
pub fn block_bytes(m: &Msg) -> usize {
    m.blocks.iter().map(|b| json_len(&b.v) + 1).sum()
}

/// The length of a value's compact JSON, without building the string.
fn json_len(v: &Value) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len();
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count(0);
    serde_json::to_writer(&mut count, v).map_or(0, |()| count.0)
}

/// Loupe — while the request (`total` bytes) would exceed [`MAX_REQUEST_BYTES`], its oldest
/// base64 media are refused.
pub fn refuse_oldest_until_fits(msgs: &mut [Msg], mut total: usize, ctx: &mut Ctx) {
    for_each_media(msgs, |v, src| {
        let Some((_, Some(data))) = base64_source(v) else {
            return;
        };
        if total <= MAX_REQUEST_BYTES {
            return;
        }
        total = total.saturating_sub(data.len());
        refuse(v, src, "the request would exceed 32 MB", ctx);
    });
}

/// The images and documents [`strip_excess_media`] counts in one message.
pub fn media_items(m: &Msg) -> usize {
    m.blocks
        .iter()
        .map(|b| usize::from(is_media(&b.v)) + nested_media_count(&b.v))
        .sum()
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
    let total: usize = msgs.iter().map(media_items).sum();
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

    fn png_of(w: u32, h: u32) -> String {
        // A PNG signature and IHDR chunk are all the size check reads.
        let mut v = b"\x89PNG\r\n\x1a\n\0\0\0\x0dIHDR".to_vec();
        v.extend_from_slice(&w.to_be_bytes());
        v.extend_from_slice(&h.to_be_bytes());
        v.extend_from_slice(&[8, 6, 0, 0, 0, 0, 0, 0, 0]);
        b64(&v)
    }

    fn b64(bytes: &[u8]) -> String {
        const A: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
        bytes
            .chunks(3)
            .flat_map(|c| {
                let v = u32::from(c[0]) << 16
                    | u32::from(*c.get(1).unwrap_or(&0)) << 8
                    | u32::from(*c.get(2).unwrap_or(&0));
                (0..4).map(move |i| {
                    if i <= c.len() {
                        A[((v >> (18 - 6 * i)) & 63) as usize] as char
                    } else {
                        '='
                    }
                })
            })
            .collect()
    }

    fn image(media: &str, data: &str) -> Value {
        json!({"type": "image", "source": {"type": "base64", "media_type": media, "data": data}})
    }

    #[test]
    fn refused_media_become_placeholders_with_the_reason() {
        let e = vec![user(
            0,
            json!([
                image("image/png", PNG),
                image("image/bmp", "Qk02"),
                image("image/jpeg", PNG),
                image("image/png", &png_of(9000, 10)),
                image("image/png", &"A".repeat(MAX_IMAGE_BASE64_BYTES + 1)),
                {"type": "tool_result", "tool_use_id": "a", "content": [image("image/gif", "AAAA")]},
                {"type": "image", "source": {"type": "url", "url": "https://x/y.bmp"}},
                {"type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": "AAAA"}},
            ]),
        )];
        let mut m = msgs(&e);
        let mut ctx = Ctx::new(&e);
        refuse_unacceptable(&mut m, &mut ctx);
        let s = shape(&m);
        assert_eq!(s[0].1[0], image("image/png", PNG));
        assert_eq!(
            s[0].1[1],
            text("[image removed: media type \"image/bmp\" is not accepted]")
        );
        assert_eq!(
            s[0].1[2],
            text("[image removed: data is image/png, not image/jpeg]")
        );
        assert_eq!(s[0].1[3], text("[image removed: 9000x10 px > 8000x8000]"));
        assert_eq!(
            s[0].1[4],
            text(&format!(
                "[image removed: {} bytes of base64 > {MAX_IMAGE_BASE64_BYTES} bytes]",
                MAX_IMAGE_BASE64_BYTES + 1
            ))
        );
        assert_eq!(
            s[0].1[5]["content"][0],
            text("[image removed: data is not image/gif]")
        );
        assert_eq!(s[0].1[6]["type"], "image");
        assert_eq!(
            s[0].1[7],
            text("[document removed: data is not application/pdf]")
        );
        assert_eq!(kinds(&ctx), vec![RepairKind::MediaRefused; 6]);
    }

    #[test]
    fn many_images_must_be_small_and_the_request_must_fit() {
        let mut blocks = vec![image("image/png", &png_of(2001, 10))];
        blocks.extend((0..20).map(|_| image("image/png", &png_of(2000, 2000))));
        let e = vec![user(0, Value::Array(blocks.clone()))];
        let mut m = msgs(&e);
        let mut ctx = Ctx::new(&e);
        enforce_request_limits(&mut m, &mut ctx);
        assert_eq!(shape(&m)[0].1[0]["type"], "text");
        assert_eq!(shape(&m)[0].1[1], blocks[1]);
        assert_eq!(kinds(&ctx), vec![RepairKind::MediaRefused]);
        // 20 images: no small-size rule.
        let e = vec![user(0, Value::Array(blocks[..20].to_vec()))];
        let mut m = msgs(&e);
        let mut ctx = Ctx::new(&e);
        enforce_request_limits(&mut m, &mut ctx);
        assert!(ctx.repairs.is_empty());
        // Seven 5 MB images are over 32 MB: the oldest go until the rest fits.
        let big = PNG.to_string() + &"A".repeat(MAX_IMAGE_BASE64_BYTES - PNG.len());
        let e = vec![user(
            0,
            Value::Array((0..7).map(|_| image("image/png", &big)).collect()),
        )];
        let mut m = msgs(&e);
        let mut ctx = Ctx::new(&e);
        enforce_request_limits(&mut m, &mut ctx);
        let s = shape(&m);
        assert_eq!(s[0].1[0]["type"], "text");
        assert_eq!(s[0].1[1]["type"], "image");
        assert_eq!(kinds(&ctx), vec![RepairKind::MediaRefused]);
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
