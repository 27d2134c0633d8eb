//! What an image's bytes say about it: the format (by magic bytes) and the pixel size (from the
//! PNG, JPEG, GIF or WebP header), plus the small base64 decoder they need. Pure; no image crate.

/// A media type from the magic bytes at the start of `bytes`: `image/png`, `image/jpeg`,
/// `image/gif`, `image/webp` or `application/pdf`.
pub fn sniff(bytes: &[u8]) -> Option<&'static str> {
    if bytes.starts_with(b"\x89PNG\r\n\x1a\n") {
        Some("image/png")
    } else if bytes.starts_with(&[0xFF, 0xD8, 0xFF]) {
        Some("image/jpeg")
    } else if bytes.starts_with(b"GIF87a") || bytes.starts_with(b"GIF89a") {
        Some("image/gif")
    } else if bytes.len() >= 12 && &bytes[..4] == b"RIFF" && &bytes[8..12] == b"WEBP" {
        Some("image/webp")
    } else if bytes.starts_with(b"%PDF-") {
        Some("application/pdf")
    } else {
        None
    }
}

/// Width and height in pixels, read from the header of a PNG, JPEG, GIF or WebP image. `None`
/// when the bytes are not one of those or the header is cut short.
pub fn dimensions(bytes: &[u8]) -> Option<(u32, u32)> {
    match sniff(bytes)? {
        "image/png" => png(bytes),
        "image/jpeg" => jpeg(bytes),
        "image/gif" => gif(bytes),
        "image/webp" => webp(bytes),
        _ => None,
    }
}

fn be16(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from(u16::from_be_bytes(
        b.get(at..at + 2)?.try_into().ok()?,
    )))
}

fn le16(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from(u16::from_le_bytes(
        b.get(at..at + 2)?.try_into().ok()?,
    )))
}

fn le24(b: &[u8], at: usize) -> Option<u32> {
    let s = b.get(at..at + 3)?;
    Some(u32::from(s[0]) | u32::from(s[1]) << 8 | u32::from(s[2]) << 16)
}

/// The IHDR chunk comes first: width and height as big-endian u32 at bytes 16 and 20.
fn png(b: &[u8]) -> Option<(u32, u32)> {
    if b.get(12..16)? != b"IHDR" {
        return None;
    }
    let w = u32::from_be_bytes(b.get(16..20)?.try_into().ok()?);
    let h = u32::from_be_bytes(b.get(20..24)?.try_into().ok()?);
    Some((w, h))
}

/// The logical screen size, little-endian u16 at bytes 6 and 8.
fn gif(b: &[u8]) -> Option<(u32, u32)> {
    Some((le16(b, 6)?, le16(b, 8)?))
}

/// The first chunk says which encoding: `VP8 ` (lossy), `VP8L` (lossless) or `VP8X` (extended,
/// with the canvas size).
fn webp(b: &[u8]) -> Option<(u32, u32)> {
    match b.get(12..16)? {
        b"VP8 " => {
            // Frame tag (3 bytes) and start code 9d 01 2a, then 14-bit sizes.
            if b.get(23..26)? != [0x9d, 0x01, 0x2a] {
                return None;
            }
            Some((le16(b, 26)? & 0x3fff, le16(b, 28)? & 0x3fff))
        }
        b"VP8L" => {
            if *b.get(20)? != 0x2f {
                return None;
            }
            let bits = u32::from_le_bytes(b.get(21..25)?.try_into().ok()?);
            Some(((bits & 0x3fff) + 1, ((bits >> 14) & 0x3fff) + 1))
        }
        b"VP8X" => Some((le24(b, 24)? + 1, le24(b, 27)? + 1)),
        _ => None,
    }
}

/// Walks the marker segments up to the first start-of-frame (SOF0–SOF15 except DHT, JPG and DAC),
/// which holds height then width as big-endian u16.
fn jpeg(b: &[u8]) -> Option<(u32, u32)> {
    let mut at = 2;
    loop {
        if *b.get(at)? != 0xFF {
            return None;
        }
        let mut marker = *b.get(at + 1)?;
        while marker == 0xFF {
            at += 1;
            marker = *b.get(at + 1)?;
        }
        at += 2;
        match marker {
            0x01 | 0xD0..=0xD7 => continue,
            0xD9 | 0xDA => return None,
            0xC0..=0xCF if !matches!(marker, 0xC4 | 0xC8 | 0xCC) => {
                let h = be16(b, at + 3)?;
                let w = be16(b, at + 5)?;
                return Some((w, h));
            }
            _ => {
                let len = be16(b, at)? as usize;
                if len < 2 {
                    return None;
                }
                at += len;
            }
        }
    }
}

fn sextet(c: u8) -> Option<u32> {
    Some(u32::from(match c {
        b'A'..=b'Z' => c - b'A',
        b'a'..=b'z' => c - b'a' + 26,
        b'0'..=b'9' => c - b'0' + 52,
        b'+' => 62,
        b'/' => 63,
        _ => return None,
    }))
}

/// Decodes at most the first `max_bytes` bytes of standard base64 `data` (ASCII whitespace is
/// skipped; decoding stops at `=`). `None` when a character outside the alphabet comes first.
pub fn decode_base64_prefix(data: &str, max_bytes: usize) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(max_bytes.min(data.len() / 4 * 3 + 3));
    let mut acc = 0u32;
    let mut bits = 0u32;
    for c in data.bytes() {
        if out.len() >= max_bytes {
            break;
        }
        if c.is_ascii_whitespace() {
            continue;
        }
        if c == b'=' {
            break;
        }
        acc = (acc << 6) | sextet(c)?;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
            acc &= (1 << bits) - 1;
        }
    }
    out.truncate(max_bytes);
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b64(bytes: &[u8]) -> String {
        const A: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
        let mut s = String::new();
        for chunk in bytes.chunks(3) {
            let n = chunk.len();
            let v = u32::from(chunk[0]) << 16
                | u32::from(*chunk.get(1).unwrap_or(&0)) << 8
                | u32::from(*chunk.get(2).unwrap_or(&0));
            for i in 0..4 {
                if i <= n {
                    s.push(A[((v >> (18 - 6 * i)) & 63) as usize] as char);
                } else {
                    s.push('=');
                }
            }
        }
        s
    }

    fn png_header(w: u32, h: u32) -> Vec<u8> {
        let mut v = b"\x89PNG\r\n\x1a\n\0\0\0\x0dIHDR".to_vec();
        v.extend_from_slice(&w.to_be_bytes());
        v.extend_from_slice(&h.to_be_bytes());
        v.extend_from_slice(&[8, 6, 0, 0, 0]);
        v
    }

    #[test]
    fn base64_round_trips_and_stops_where_asked() {
        let data: Vec<u8> = (0..=255u8).collect();
        let enc = b64(&data);
        assert_eq!(decode_base64_prefix(&enc, 1000).unwrap(), data);
        assert_eq!(decode_base64_prefix(&enc, 10).unwrap(), data[..10].to_vec());
        assert_eq!(decode_base64_prefix("QUJD", 10).unwrap(), b"ABC".to_vec());
        assert_eq!(decode_base64_prefix("QUI=", 10).unwrap(), b"AB".to_vec());
        assert_eq!(decode_base64_prefix("QU\nJD", 10).unwrap(), b"ABC".to_vec());
        assert!(decode_base64_prefix("Q*JD", 10).is_none());
        assert!(decode_base64_prefix("", 10).unwrap().is_empty());
    }

    #[test]
    fn png_size_from_ihdr() {
        let real = decode_base64_prefix("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg==", 1 << 20).unwrap();
        assert_eq!(sniff(&real), Some("image/png"));
        assert_eq!(dimensions(&real), Some((1, 1)));
        assert_eq!(dimensions(&png_header(9000, 12)), Some((9000, 12)));
        assert_eq!(dimensions(&png_header(9000, 12)[..20]), None);
    }

    #[test]
    fn gif_size_is_little_endian() {
        let mut g = b"GIF89a".to_vec();
        g.extend_from_slice(&[0x40, 0x1f, 0x02, 0x01]);
        assert_eq!(sniff(&g), Some("image/gif"));
        assert_eq!(dimensions(&g), Some((8000, 258)));
        assert_eq!(dimensions(b"GIF87a\x01"), None);
    }

    fn riff(chunk: &[u8; 4], body: &[u8]) -> Vec<u8> {
        let mut v = b"RIFF\0\0\0\0WEBP".to_vec();
        v.extend_from_slice(chunk);
        v.extend_from_slice(&[0, 0, 0, 0]);
        v.extend_from_slice(body);
        v
    }

    #[test]
    fn webp_lossy_lossless_and_extended() {
        let lossy = riff(
            b"VP8 ",
            &[0, 0, 0, 0x9d, 0x01, 0x2a, 0x20, 0x03, 0x58, 0x02],
        );
        assert_eq!(sniff(&lossy), Some("image/webp"));
        assert_eq!(dimensions(&lossy), Some((800, 600)));
        // 640x480: (w-1) in bits 0..14, (h-1) in bits 14..28.
        let bits: u32 = 639 | (479 << 14);
        let mut body = vec![0x2f];
        body.extend_from_slice(&bits.to_le_bytes());
        assert_eq!(dimensions(&riff(b"VP8L", &body)), Some((640, 480)));
        let ext = riff(b"VP8X", &[0, 0, 0, 0, 0x3f, 0x1f, 0, 0x0f, 0, 0]);
        assert_eq!(dimensions(&ext), Some((8000, 16)));
        assert_eq!(
            dimensions(&riff(b"VP8 ", &[0, 0, 0, 1, 2, 3, 0, 0, 0, 0])),
            None
        );
    }

    #[test]
    fn jpeg_walks_segments_to_the_frame_header() {
        let mut j = vec![0xFF, 0xD8];
        // APP0 (length 16) and a DHT before the SOF2 (progressive) frame.
        j.extend_from_slice(&[0xFF, 0xE0, 0, 16]);
        j.extend_from_slice(&[0; 14]);
        j.extend_from_slice(&[0xFF, 0xC4, 0, 4, 0, 0]);
        j.extend_from_slice(&[
            0xFF, 0xFF, 0xC2, 0, 11, 8, 0x07, 0xD0, 0x0B, 0xB8, 3, 0, 0, 0,
        ]);
        assert_eq!(sniff(&j), Some("image/jpeg"));
        assert_eq!(dimensions(&j), Some((3000, 2000)));
        assert_eq!(dimensions(&j[..30]), None);
        assert_eq!(dimensions(&[0xFF, 0xD8, 0xFF, 0xDA, 0, 2]), None);
    }

    #[test]
    fn other_bytes_are_not_images() {
        assert_eq!(sniff(b"BM\x36\0\0\0"), None);
        assert_eq!(dimensions(b"BM\x36\0\0\0"), None);
        assert_eq!(sniff(b"%PDF-1.4\n"), Some("application/pdf"));
        assert_eq!(dimensions(b"%PDF-1.4\n"), None);
        assert_eq!(sniff(b""), None);
    }
}
