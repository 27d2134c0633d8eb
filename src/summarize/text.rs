//! Byte-budget text helpers shared by the summarizers. Every cut lands on a char boundary.

/// The largest index `<= max` that is a char boundary of `s`.
pub fn floor_boundary(s: &str, max: usize) -> usize {
    if max >= s.len() {
        return s.len();
    }
    let mut i = max;
    while !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

/// The longest prefix of `s` of at most `max` bytes.
pub fn cut_bytes(s: &str, max: usize) -> &str {
    &s[..floor_boundary(s, max)]
}

/// The longest suffix of `s` of at most `max` bytes.
pub fn cut_bytes_tail(s: &str, max: usize) -> &str {
    if max >= s.len() {
        return s;
    }
    let mut i = s.len() - max;
    while !s.is_char_boundary(i) {
        i += 1;
    }
    &s[i..]
}

const ELLIPSIS: &str = "…";

/// Words a cut never ends on: a line ending on one reads as if it went on ("fix the parser in
/// the…").
const DANGLING: &[&str] = &[
    "a", "an", "the", "and", "or", "but", "of", "to", "in", "on", "at", "by", "for", "from",
    "with", "as", "is", "was", "that", "into",
];

/// `s` cut to at most `max` bytes with `…` appended when something was cut and there is room
/// for it. The cut lands on a word boundary when one is in the second half of what fits, else on
/// a punctuation boundary (`src/parser/…`), and never right after a word that needs a next one
/// (`the`, `of`, `and`, …); only a single word longer than half the room is cut inside.
pub fn cut_words(s: &str, max: usize) -> String {
    let s = s.trim();
    if s.len() <= max {
        return s.to_string();
    }
    let room = if max > 4 * ELLIPSIS.len() {
        max - ELLIPSIS.len()
    } else {
        max
    };
    let hard = floor_boundary(s, room);
    let mut cut = hard;
    let next_is_space = s[hard..].chars().next().is_some_and(char::is_whitespace);
    if !next_is_space {
        let half = hard / 2;
        if let Some(space) = s[..hard].rfind(char::is_whitespace).filter(|&i| i >= half) {
            cut = space;
        } else if let Some(mark) = s[..hard]
            .rfind(['/', '.', ',', ';', ':', '-', '_', ')', '='])
            .filter(|&i| i >= half)
        {
            cut = mark + 1;
        }
    }
    let trim = |t: &str| {
        t.trim_end_matches(|c: char| c.is_whitespace() || c == ';' || c == ',')
            .len()
    };
    let mut end = trim(&s[..cut]);
    while let Some(space) = s[..end].rfind(' ') {
        let last = &s[space + 1..end];
        if space < hard / 2 || !DANGLING.contains(&last.to_ascii_lowercase().as_str()) {
            break;
        }
        end = trim(&s[..space]);
    }
    let mut out = s[..end].to_string();
    if room < max {
        out.push_str(ELLIPSIS);
    }
    debug_assert!(out.len() <= max);
    out
}

/// A summary line cut to at most `max` bytes with its meaning intact: whole items (a line's items
/// are separated by `; `), ending `; …`, when the items kept fill at least half of it; otherwise
/// [`cut_words`].
pub fn cut_line(s: &str, max: usize) -> String {
    const MORE: &str = "; …";
    let s = s.trim();
    if s.len() <= max {
        return s.to_string();
    }
    if max > 2 * MORE.len() {
        let head = &s[..floor_boundary(s, max - MORE.len())];
        if let Some(at) = head.rfind("; ").filter(|&at| at >= max / 2) {
            return format!("{}{MORE}", &s[..at]);
        }
    }
    cut_words(s, max)
}

/// Line breaks (`\r\n`, `\n`, `\r`) become single spaces; ends trimmed. Other text is kept.
pub fn newlines_to_spaces(s: &str) -> String {
    s.replace("\r\n", " ")
        .replace(['\n', '\r'], " ")
        .trim()
        .to_string()
}

/// Every run of whitespace becomes one space; ends trimmed.
pub fn squash(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// `s` cut to at most `max` bytes keeping its head and tail, with a marker naming what was
/// left out in between.
pub fn head_tail(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let marker_len = format!(" … [{} bytes omitted] … ", s.len()).len();
    if max <= marker_len + 8 {
        return cut_words(s, max);
    }
    let room = max - marker_len;
    let head = cut_bytes(s, room * 2 / 3);
    let tail = cut_bytes_tail(s, room - head.len());
    let omitted = s.len() - head.len() - tail.len();
    let out = format!("{head} … [{omitted} bytes omitted] … {tail}");
    debug_assert!(out.len() <= max);
    out
}

/// Runs of blank lines become one blank line; trailing spaces on lines are dropped; trimmed.
pub fn collapse_blank_lines(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut blank_run = 0;
    for line in s.lines() {
        let line = line.trim_end();
        if line.is_empty() {
            blank_run += 1;
            continue;
        }
        if !out.is_empty() {
            out.push_str(if blank_run > 0 { "\n\n" } else { "\n" });
        }
        blank_run = 0;
        out.push_str(line);
    }
    out
}

/// A byte count for people: `512 B`, `1.2 KB`, `3.4 MB`.
pub fn human_bytes(n: usize) -> String {
    if n < 1000 {
        format!("{n} B")
    } else if n < 1_000_000 {
        format!("{:.1} KB", n as f64 / 1000.0)
    } else {
        format!("{:.1} MB", n as f64 / 1_000_000.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cuts_never_exceed_and_stay_on_char_boundaries() {
        let s = "héllo wörld ünïcode 日本語のテキスト and more words here";
        for max in 0..s.len() + 3 {
            let c = cut_words(s, max);
            assert!(c.len() <= max, "{max}: {c:?}");
            let h = head_tail(s, max);
            assert!(h.len() <= max, "{max}: {h:?}");
            assert!(cut_bytes(s, max).len() <= max);
            assert!(cut_bytes_tail(s, max).len() <= max);
        }
    }

    #[test]
    fn cut_words_prefers_word_boundary() {
        assert_eq!(cut_words("alpha beta gamma delta", 16), "alpha beta…");
        assert_eq!(cut_words("short", 16), "short");
        // Never on a word that needs the next one.
        assert_eq!(
            cut_words("fix the parser in the lexer module", 26),
            "fix the parser…"
        );
        // A long path is cut at a separator, not inside a name.
        assert_eq!(
            cut_words("Read(src/summarize/extractive_module.rs)", 24),
            "Read(src/summarize/…"
        );
    }

    #[test]
    fn cut_line_keeps_whole_items() {
        let line = "user: fix the parser; error: 2 tests failed; tool: Read(src/parser.rs)";
        assert_eq!(
            cut_line(line, 50),
            "user: fix the parser; error: 2 tests failed; …"
        );
        assert_eq!(cut_line(line, 200), line);
        for max in 0..line.len() + 2 {
            assert!(cut_line(line, max).len() <= max, "{max}");
        }
    }

    #[test]
    fn head_tail_keeps_both_ends() {
        let s = format!("START{}END", "x".repeat(1000));
        let h = head_tail(&s, 100);
        assert!(h.starts_with("START") && h.ends_with("END") && h.contains("omitted"));
    }

    #[test]
    fn blank_lines_collapse() {
        assert_eq!(collapse_blank_lines("\n a\n\n\n\nb  \n\n"), " a\n\nb");
    }
}
