//! Image rules shared by every provider (`docs/PROVIDER-RULES.md` A7.1–A7.4, D1.16): the media type, the
//! magic bytes, 5 MB of base64, and the pixel size read from the image's own header.

use serde_json::Value;

/// A7.1: image media types.
pub const IMAGE_MEDIA_TYPES: &[&str] = &["image/jpeg", "image/png", "image/gif", "image/webp"];
/// A7.2: base64 characters per image.
pub const MAX_IMAGE_BASE64_BYTES: usize = 5 * 1024 * 1024;
/// A7.3: pixels per side; per side beyond [`MANY_IMAGES`] images.
pub const MAX_SIDE: u32 = 8000;
pub const MANY_IMAGES: usize = 20;
pub const MANY_IMAGES_MAX_SIDE: u32 = 2000;

/// Decodes standard base64 (no padding needed), at most `limit` bytes; `None` on a bad character.
pub fn unbase64(data: &str, limit: usize) -> Option<Vec<u8>> {
    let table = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = Vec::new();
    let mut buf: u64 = 0;
    let mut n = 0;
    for ch in data.bytes().filter(|c| !c.is_ascii_whitespace()) {
        if ch == b'=' || out.len() >= limit {
            break;
        }
        let v = table.iter().position(|t| *t == ch)? as u64;
        buf = buf << 6 | v;
        n += 6;
        if n >= 8 {
            n -= 8;
            out.push((buf >> n & 0xff) as u8);
        }
    }
    out.truncate(limit);
    Some(out)
}

/// The image format the bytes start with.
pub fn magic(bytes: &[u8]) -> Option<&'static str> {
    let starts = |p: &[u8]| bytes.len() >= p.len() && &bytes[..p.len()] == p;
    if starts(&[0x89, b'P', b'N', b'G']) {
        Some("image/png")
    } else if starts(&[0xFF, 0xD8, 0xFF]) {
        Some("image/jpeg")
    } else if starts(b"GIF8") {
        Some("image/gif")
    } else if starts(b"RIFF") && bytes.get(8..12) == Some(b"WEBP") {
        Some("image/webp")
    } else {
        None
    }
}

fn u16_at(b: &[u8], i: usize, big: bool) -> Option<u32> {
    let (x, y) = (u32::from(*b.get(i)?), u32::from(*b.get(i + 1)?));
    Some(if big { x << 8 | y } else { y << 8 | x })
}

/// Width and height from the header of a PNG, GIF, WebP or JPEG image.
pub fn size(b: &[u8]) -> Option<(u32, u32)> {
    match magic(b)? {
        "image/png" => {
            let w = u16_at(b, 16, true)? << 16 | u16_at(b, 18, true)?;
            let h = u16_at(b, 20, true)? << 16 | u16_at(b, 22, true)?;
            (b.get(12..16)? == b"IHDR").then_some((w, h))
        }
        "image/gif" => Some((u16_at(b, 6, false)?, u16_at(b, 8, false)?)),
        "image/webp" => {
            let chunk = b.get(12..16)?;
            if chunk == b"VP8 " {
                Some((
                    u16_at(b, 26, false)? & 0x3fff,
                    u16_at(b, 28, false)? & 0x3fff,
                ))
            } else if chunk == b"VP8L" {
                let v = u16_at(b, 21, false)? | u16_at(b, 23, false)? << 16;
                Some(((v & 0x3fff) + 1, (v >> 14 & 0x3fff) + 1))
            } else if chunk == b"VP8X" {
                let w = u16_at(b, 24, false)? | u32::from(*b.get(26)?) << 16;
                let h = u16_at(b, 27, false)? | u32::from(*b.get(29)?) << 16;
                Some((w + 1, h + 1))
            } else {
                None
            }
        }
        _ => {
            let mut i = 2;
            while i + 3 < b.len() {
                if b[i] != 0xFF {
                    return None;
                }
                let m = b[i + 1];
                if m == 0xFF {
                    i += 1;
                    continue;
                }
                if (0xD0..=0xD7).contains(&m) || m == 0x01 {
                    i += 2;
                    continue;
                }
                if (0xC0..=0xCF).contains(&m) && m != 0xC4 && m != 0xC8 && m != 0xCC {
                    return Some((u16_at(b, i + 7, true)?, u16_at(b, i + 5, true)?));
                }
                i += 2 + u16_at(b, i + 2, true)? as usize;
            }
            None
        }
    }
}

/// A `data:<media>;base64,<data>` URL split in two.
pub fn data_url(url: &str) -> Option<(&str, &str)> {
    url.strip_prefix("data:")?.split_once(";base64,")
}

/// Why the provider refuses this base64 image, in its own words where the rules give them; `many`
/// when the request holds more than [`MANY_IMAGES`] images.
pub fn image_problem(media: &str, data: &str, many: bool) -> Option<String> {
    if !IMAGE_MEDIA_TYPES.contains(&media) {
        return Some(format!("Image format {media} not supported"));
    }
    if data.len() > MAX_IMAGE_BASE64_BYTES {
        return Some(format!(
            "image exceeds 5 MB maximum: {} bytes > {MAX_IMAGE_BASE64_BYTES} bytes",
            data.len()
        ));
    }
    let head = unbase64(data, 1 << 16).unwrap_or_default();
    if magic(&head) != Some(media) {
        return Some(format!("Could not process image: data is not {media}"));
    }
    let dims = size(&head).or_else(|| size(&unbase64(data, usize::MAX)?));
    let Some((w, h)) = dims else {
        return Some("Could not process image: no readable size".into());
    };
    let max = if many { MANY_IMAGES_MAX_SIDE } else { MAX_SIDE };
    (w > max || h > max).then(|| {
        format!(
            "image dimensions {w}x{h} exceed the maximum of {max} pixels{}",
            if many { " for many-image requests" } else { "" }
        )
    })
}

/// Every base64 image of a list, with its location, found by `images`; the problems of each.
pub fn check_images(found: &[(usize, String, String, String)]) -> Vec<(usize, String, String)> {
    let many = found.len() > MANY_IMAGES;
    found
        .iter()
        .filter_map(|(i, path, media, data)| {
            image_problem(media, data, many).map(|p| (*i, path.clone(), p))
        })
        .collect()
}

/// The text of a JSON value if it is a string.
pub(crate) fn s(v: Option<&Value>) -> &str {
    v.and_then(Value::as_str).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    const PNG: &str = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg==";

    #[test]
    fn sizes_from_headers() {
        assert_eq!(size(&unbase64(PNG, 100).unwrap()), Some((1, 1)));
        let gif = b"GIF89a\x10\x00\x20\x00";
        assert_eq!(size(gif), Some((16, 32)));
        let mut jpeg = vec![0xFF, 0xD8, 0xFF, 0xE0, 0, 4, 0, 0];
        jpeg.extend_from_slice(&[0xFF, 0xC0, 0, 11, 8, 0x0B, 0xB8, 0x1F, 0x41, 3]);
        assert_eq!(size(&jpeg), Some((8001, 3000)));
        assert_eq!(size(b"BM...."), None);
    }

    #[test]
    fn problems() {
        assert!(image_problem("image/png", PNG, false).is_none());
        assert!(image_problem("image/bmp", PNG, false)
            .unwrap()
            .contains("not supported"));
        assert!(image_problem("image/jpeg", PNG, false)
            .unwrap()
            .contains("Could not process image"));
        let huge = "A".repeat(MAX_IMAGE_BASE64_BYTES + 1);
        assert!(image_problem("image/png", &huge, false)
            .unwrap()
            .contains("exceeds 5 MB"));
        assert_eq!(
            data_url("data:image/png;base64,QUJD"),
            Some(("image/png", "QUJD"))
        );
    }
}
