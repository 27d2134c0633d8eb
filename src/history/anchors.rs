//! Anchors: the specifics a summary tends to lose and a model later needs exactly (a file path,
//! a command, a URL, an identifier or error code, a number with its unit). They are found
//! without a model, by pattern, in what a model could read of an entry ([`super::search`]),
//! and the loss ledger marks each one kept (the summary holds it) or dropped.

use std::collections::{BTreeMap, HashSet};
use std::sync::LazyLock;

use regex::Regex;
use serde_json::Value;

use super::model::{Content, Entry};
use super::search::searchable;

/// What an anchor is.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    serde::Serialize,
    serde::Deserialize,
    utoipa::ToSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum AnchorKind {
    Path,
    Command,
    Url,
    Identifier,
    ErrorCode,
    Number,
}

impl AnchorKind {
    pub const ALL: [AnchorKind; 6] = [
        AnchorKind::Path,
        AnchorKind::Command,
        AnchorKind::Url,
        AnchorKind::Identifier,
        AnchorKind::ErrorCode,
        AnchorKind::Number,
    ];

    /// The kind's stable name (stored, and in the API).
    pub fn as_str(self) -> &'static str {
        match self {
            AnchorKind::Path => "path",
            AnchorKind::Command => "command",
            AnchorKind::Url => "url",
            AnchorKind::Identifier => "identifier",
            AnchorKind::ErrorCode => "error_code",
            AnchorKind::Number => "number",
        }
    }

    /// Which kinds an entry keeps first when it holds more than its share: the most specific.
    fn priority(self) -> u8 {
        match self {
            AnchorKind::Command => 0,
            AnchorKind::Path => 1,
            AnchorKind::ErrorCode => 2,
            AnchorKind::Url => 3,
            AnchorKind::Number => 4,
            AnchorKind::Identifier => 5,
        }
    }

    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|kind| kind.as_str() == name)
    }

    /// The kind's name in a footer, for `count` of them.
    pub fn plural(self, count: usize) -> &'static str {
        match (self, count == 1) {
            (AnchorKind::Path, true) => "path",
            (AnchorKind::Path, false) => "paths",
            (AnchorKind::Command, true) => "command",
            (AnchorKind::Command, false) => "commands",
            (AnchorKind::Url, true) => "URL",
            (AnchorKind::Url, false) => "URLs",
            (AnchorKind::Identifier, true) => "identifier",
            (AnchorKind::Identifier, false) => "identifiers",
            (AnchorKind::ErrorCode, true) => "error code",
            (AnchorKind::ErrorCode, false) => "error codes",
            (AnchorKind::Number, true) => "number",
            (AnchorKind::Number, false) => "numbers",
        }
    }
}

/// One anchor: its kind and its text, as the entry wrote it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Anchor {
    pub kind: AnchorKind,
    pub text: String,
}

/// Most anchors read of one entry: a file listing or a log names thousands of paths.
pub const MAX_ENTRY_ANCHORS: usize = 48;

/// The stored anchors of an entry take at most this share of its text (1/40, so that with the
/// short entries' floor the ledger stays under 5% of what it describes)…
const ENTRY_SHARE_DIVISOR: usize = 40;
/// …or this many bytes, for a short entry.
const MIN_ENTRY_BYTES: usize = 96;

/// Longest anchor, in bytes (a longer command is cut at a character boundary).
pub const MAX_ANCHOR_BYTES: usize = 160;

/// Bytes of an entry's text read for anchors: a 20 MB tool result is read as far as its first
/// 256 KiB, which bounds the time and leaves the rest to search.
pub const MAX_SCANNED_BYTES: usize = 256 * 1024;

/// Shortest text worth checking against a summary (`39%` is a figure; `ok` is not an anchor).
const MIN_ANCHOR_CHARS: usize = 3;

static URL: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r#"https?://[^\s<>"'`\)\]\}]+"#).expect("url pattern"));
static PATH: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(
        r"(?:~|\.{1,2})?/?(?:[A-Za-z0-9_.@+-]+/)+[A-Za-z0-9_.@+-]+|\b[A-Za-z0-9_-]+\.(?:rs|py|ts|tsx|js|jsx|go|java|kt|c|h|cc|cpp|hpp|rb|php|cs|swift|sql|sh|toml|json|yaml|yml|md|lock|html|css|txt|log|cfg|ini|xml|proto)\b",
    )
    .expect("path pattern")
});
static ERROR_CODE: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(
        r"\b(?:E\d{4}|[A-Z]{2,5}-?\d{3,5}|E(?:NOENT|ACCES|PERM|EXIST|CONNREFUSED|CONNRESET|TIMEDOUT|ADDRINUSE|NOTDIR|ISDIR|NOSPC|PIPE|NOMEM|AGAIN|BADF|INVAL)|[A-Z][A-Za-z0-9]*(?:Error|Exception))\b",
    )
    .expect("error code pattern")
});
static IDENTIFIER: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(
        r"\b[A-Za-z_][A-Za-z0-9_]*(?:::[A-Za-z_][A-Za-z0-9_]*)+|\b[a-z][a-z0-9]*(?:_[a-z0-9]+)+\b|\b[a-z][a-z0-9]+(?:[A-Z][a-z0-9]+)+\b|\b[A-Z][a-z0-9]+(?:[A-Z][a-z0-9]+)+\b",
    )
    .expect("identifier pattern")
});
static NUMBER: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(
        r"\b\d+(?:[.,]\d+)?\s?(?:%|×|(?:ms|µs|us|ns|s|sec|secs|seconds|min|minutes|h|hours|days|B|KB|MB|GB|TB|KiB|MiB|GiB|TiB|kB|bytes|tokens|req/s|rps|x|lines|files|rows|MHz|GHz|px|°C)\b)",
    )
    .expect("number pattern")
});
static SHELL_LINE: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"(?m)^\s*\$ (\S.*)$").expect("shell line pattern"));
/// A shell call as a summary line renders it: `Bash(cargo test)`.
static TOOL_CALL: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"\b(?:Bash|Shell|bash|shell|run_command|execute_command)\(([^()\n]+)\)")
        .expect("tool call pattern")
});

/// The anchors of an entry a model reads: distinct, in order of first appearance, at most
/// [`MAX_ENTRY_ANCHORS`]. Thinking is left out: it is not sent everywhere, and a summary is
/// judged by what it keeps of what the model was shown.
pub fn anchors_of_entry(entry: &Entry) -> Vec<Anchor> {
    let Some(found) = searchable(entry) else {
        return Vec::new();
    };
    let mut anchors = Anchors::default();
    if let Some(Content::Blocks(blocks)) = entry.message.as_ref().map(|m| &m.content) {
        for block in blocks {
            if block.get("type").and_then(Value::as_str) == Some("tool_use") {
                for key in ["command", "cmd"] {
                    if let Some(command) = block.pointer(&format!("/input/{key}")) {
                        if let Some(command) = command.as_str() {
                            anchors.push(AnchorKind::Command, first_line(command));
                        }
                    }
                }
            }
        }
    }
    anchors.scan(&found.text);
    within_share(anchors.list, found.text.len())
}

/// The anchors kept of an entry of `text_bytes`: the most specific kinds first (commands,
/// paths, error codes, URLs, numbers, then identifiers), in order of appearance within a kind,
/// while their stored form fits the entry's share (the first whatever its length).
fn within_share(mut anchors: Vec<Anchor>, text_bytes: usize) -> Vec<Anchor> {
    let budget = (text_bytes / ENTRY_SHARE_DIVISOR).max(MIN_ENTRY_BYTES);
    anchors.sort_by_key(|anchor| anchor.kind.priority());
    let mut used = 0;
    anchors.retain(|anchor| {
        let bytes = stored_bytes(anchor);
        // The first always: a long command is an entry's most specific anchor.
        let fits = used == 0 || used + bytes <= budget;
        if fits {
            used += bytes;
        }
        fits
    });
    anchors
}

/// Bytes an anchor takes in [`encode`]'s form.
fn stored_bytes(anchor: &Anchor) -> usize {
    anchor.kind.as_str().len() + anchor.text.len() + 2
}

/// The anchors of a text (a summary line a parent is merged from, say), as for an entry.
pub fn anchors_in_text(text: &str) -> Vec<Anchor> {
    let mut anchors = Anchors::default();
    anchors.scan(text);
    anchors.list
}

/// Whether `summary` keeps `anchor`: it holds the anchor's text as written, as a whole token
/// (`12 ms` is not kept by `1112 ms`, nor `a.pem` by `a.pem.bak`), whitespace runs read as one
/// space.
pub fn kept_in(summary: &str, anchor: &str) -> bool {
    if holds_token(summary, anchor) {
        return true;
    }
    let squashed = |s: &str| s.split_whitespace().collect::<Vec<_>>().join(" ");
    let anchor = squashed(anchor);
    !anchor.is_empty() && holds_token(&squashed(summary), &anchor)
}

/// Whether `text` holds `token` with no word character joined to either end of it (a `.` or
/// `-` then a word character continues it too).
fn holds_token(text: &str, token: &str) -> bool {
    if token.is_empty() {
        return false;
    }
    let word = |c: char| c.is_alphanumeric() || c == '_';
    text.match_indices(token).any(|(at, _)| {
        let before = text[..at].chars().next_back();
        let mut after = text[at + token.len()..].chars();
        let joined_before = before.is_some_and(word) && token.starts_with(word);
        let joined_after = match after.next() {
            Some(c) if word(c) => token.ends_with(word),
            Some('.' | '-') => after.next().is_some_and(word),
            _ => false,
        };
        !joined_before && !joined_after
    })
}

/// Anchors as one stored text: one per line, `kind<TAB>text`.
pub fn encode(anchors: &[Anchor]) -> String {
    let mut out = String::new();
    for anchor in anchors {
        out.push_str(anchor.kind.as_str());
        out.push('\t');
        out.push_str(&anchor.text);
        out.push('\n');
    }
    out
}

/// The anchors of a stored text ([`encode`]); a line it cannot read is skipped.
pub fn decode(stored: &str) -> Vec<Anchor> {
    stored
        .lines()
        .filter_map(|line| {
            let (kind, text) = line.split_once('\t')?;
            Some(Anchor {
                kind: AnchorKind::parse(kind)?,
                text: text.to_owned(),
            })
        })
        .collect()
}

#[derive(Default)]
struct Anchors {
    list: Vec<Anchor>,
    seen: HashSet<(AnchorKind, String)>,
    /// Byte spans already taken by an anchor, start to end, never overlapping (a URL's path is
    /// not a path of its own): one lookup per match, whatever the text repeats.
    taken: BTreeMap<usize, usize>,
}

/// What [`Anchors::push`] made of a match.
#[derive(Debug, PartialEq, Eq)]
enum Pushed {
    New,
    /// An anchor already listed: its span is taken all the same.
    Again,
    Refused,
}

impl Anchors {
    fn full(&self) -> bool {
        self.list.len() >= MAX_ENTRY_ANCHORS
    }

    fn push(&mut self, kind: AnchorKind, text: &str) -> Pushed {
        let text = cut(text.trim().trim_end_matches(['.', ',', ';', ':', '!', '?']));
        if text.chars().count() < MIN_ANCHOR_CHARS || text.contains(['\t', '\n']) {
            return Pushed::Refused;
        }
        let key = (kind, text.to_owned());
        if self.seen.contains(&key) {
            return Pushed::Again;
        }
        if self.full() {
            return Pushed::Refused;
        }
        self.seen.insert(key);
        self.list.push(Anchor {
            kind,
            text: text.to_owned(),
        });
        Pushed::New
    }

    fn overlaps_taken(&self, (start, end): (usize, usize)) -> bool {
        self.taken
            .range(..end)
            .next_back()
            .is_some_and(|(_, &taken_end)| taken_end > start)
    }

    /// Reads the anchors of `text`'s first [`MAX_SCANNED_BYTES`], in time linear in them, and
    /// stops once the list is full.
    fn scan(&mut self, text: &str) {
        let text = cut_at(text, MAX_SCANNED_BYTES);
        for pattern in [&SHELL_LINE, &TOOL_CALL] {
            for line in pattern.captures_iter(text) {
                if self.full() {
                    return;
                }
                self.push(AnchorKind::Command, &line[1]);
            }
        }
        // Most specific first: a span one kind took is not read again as another.
        let kinds: [(AnchorKind, &Regex); 5] = [
            (AnchorKind::Url, &URL),
            (AnchorKind::Path, &PATH),
            (AnchorKind::ErrorCode, &ERROR_CODE),
            (AnchorKind::Number, &NUMBER),
            (AnchorKind::Identifier, &IDENTIFIER),
        ];
        for (kind, pattern) in kinds {
            for found in pattern.find_iter(text) {
                if self.full() {
                    return;
                }
                let span = (found.start(), found.end());
                if self.overlaps_taken(span)
                    || kind == AnchorKind::Path && !looks_like_path(found.as_str())
                {
                    continue;
                }
                if self.push(kind, found.as_str()) != Pushed::Refused {
                    self.taken.insert(span.0, span.1);
                }
            }
        }
    }
}

/// A slash-separated match is a path when it is rooted, or names a file, or has three parts
/// (`and/or` and `1/2` are not paths).
fn looks_like_path(text: &str) -> bool {
    if !text.contains('/') {
        return true;
    }
    let rooted = text.starts_with(['/', '~', '.']);
    let last = text.rsplit('/').next().unwrap_or_default();
    let file = last.contains('.') && last.chars().any(|c| c.is_ascii_alphabetic());
    let parts = text.split('/').filter(|part| !part.is_empty()).count();
    let alphabetic = text.chars().any(|c| c.is_ascii_alphabetic());
    alphabetic && (rooted && parts >= 1 || file || parts >= 3)
}

fn first_line(text: &str) -> &str {
    text.trim().lines().next().unwrap_or_default()
}

fn cut(text: &str) -> &str {
    cut_at(text, MAX_ANCHOR_BYTES)
}

/// `text`'s first `max` bytes at most, cut at a character boundary.
fn cut_at(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn kinds(text: &str) -> Vec<(&'static str, String)> {
        anchors_in_text(text)
            .into_iter()
            .map(|a| (a.kind.as_str(), a.text))
            .collect()
    }

    fn has(found: &[(&'static str, String)], kind: &str, text: &str) -> bool {
        found.iter().any(|(k, t)| *k == kind && t == text)
    }

    #[test]
    fn each_kind_is_found_where_agents_write_it() {
        let found = kinds(
            "Edited src/store/jobs.rs and ./scripts/hotpath.sh; see https://docs.rs/sqlx/latest. \
             rustc said E0282 in Store::index_thread, then ENOENT. The ValueError came from \
             parse_body after 412 ms; memory hit 1.5 GiB (39%). Cargo.toml too.\n$ cargo test --lib",
        );
        for (kind, text) in [
            ("path", "src/store/jobs.rs"),
            ("path", "./scripts/hotpath.sh"),
            ("path", "Cargo.toml"),
            ("url", "https://docs.rs/sqlx/latest"),
            ("error_code", "E0282"),
            ("error_code", "ENOENT"),
            ("error_code", "ValueError"),
            ("identifier", "Store::index_thread"),
            ("identifier", "parse_body"),
            ("number", "412 ms"),
            ("number", "1.5 GiB"),
            ("number", "39%"),
            ("command", "cargo test --lib"),
        ] {
            assert!(has(&found, kind, text), "{kind} {text}: {found:?}");
        }
        // The URL's path is not read again as a path of its own.
        assert!(!has(&found, "path", "docs.rs/sqlx/latest"), "{found:?}");
    }

    #[test]
    fn prose_is_not_an_anchor() {
        let found = kinds("Yes, and/or maybe 1/2 of it. The answer is 42. I think so.");
        assert!(found.is_empty(), "{found:?}");
    }

    #[test]
    fn a_tool_call_command_is_an_anchor_and_thinking_is_not_read() {
        let entry: Entry = serde_json::from_value(json!({
            "type": "assistant", "message": {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "maybe secret/path/here.rs", "signature": "c2ln"},
                {"type": "tool_use", "id": "toolu_1", "name": "Bash",
                 "input": {"command": "pg_ctlcluster 15 main start\necho done", "description": "start"}}
            ]}
        }))
        .unwrap();
        let found = anchors_of_entry(&entry);
        assert!(found.contains(&Anchor {
            kind: AnchorKind::Command,
            text: "pg_ctlcluster 15 main start".to_owned()
        }));
        assert!(
            !found.iter().any(|a| a.text.contains("secret")),
            "{found:?}"
        );
    }

    #[test]
    fn an_entry_keeps_its_most_specific_anchors_within_its_share() {
        let listing: String = (0..200)
            .map(|i| format!("let value_{i} = read(\"src/gen/mod_{i}.rs\");\n"))
            .collect();
        let entry: Entry = serde_json::from_value(json!({
            "type": "user", "message": {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": listing.clone()}]}
        }))
        .unwrap();
        let kept = anchors_of_entry(&entry);
        let bytes: usize = kept.iter().map(stored_bytes).sum();
        assert!(bytes <= listing.len() / 40, "{bytes} of {}", listing.len());
        assert!(kept.len() > 5, "{kept:?}");
        // Paths before identifiers.
        assert!(kept.iter().all(|a| a.kind == AnchorKind::Path), "{kept:?}");
        // A short entry keeps a few all the same.
        let short: Entry = serde_json::from_value(json!({
            "type": "user", "message": {"role": "user", "content": "see src/a.rs and E0282"}
        }))
        .unwrap();
        assert_eq!(anchors_of_entry(&short).len(), 2);
    }

    #[test]
    fn anchors_are_bounded_and_round_trip() {
        let listing: String = (0..500).map(|i| format!("src/mod_{i}/file.rs\n")).collect();
        let found = anchors_in_text(&listing);
        assert_eq!(found.len(), MAX_ENTRY_ANCHORS);
        let long = format!("$ {}", "x".repeat(1000));
        let command = &anchors_in_text(&long)[0];
        assert!(command.text.len() <= MAX_ANCHOR_BYTES);
        assert_eq!(decode(&encode(&found)), found);
    }

    #[test]
    fn kept_reads_whitespace_runs_as_one() {
        assert!(kept_in("took 412  ms to run", "412 ms"));
        assert!(kept_in("ran cargo test --lib", "cargo test --lib"));
        assert!(!kept_in("ran the tests", "cargo test --lib"));
    }

    #[test]
    fn kept_means_the_whole_token() {
        assert!(!kept_in("it took 1112 ms", "12 ms"));
        assert!(!kept_in("moved to /srv/a.pem.bak", "/srv/a.pem"));
        assert!(!kept_in("error E42421 again", "E4242"));
        assert!(kept_in("see /srv/a.pem.", "/srv/a.pem"));
        assert!(kept_in("(src/a.rs)", "src/a.rs"));
        assert!(kept_in("./src/a.rs was read", "src/a.rs"));
    }

    #[test]
    fn a_text_that_repeats_one_anchor_is_read_in_linear_time() {
        // 400,000 repeats of one path: each match is one lookup, and the text is read only as
        // far as its first MAX_SCANNED_BYTES. (Before, each match was compared with every
        // earlier one: minutes for this text.)
        let text = "src/a.rs ".repeat(400_000);
        let found = anchors_in_text(&text);
        assert_eq!(found.len(), 1, "{found:?}");
        // A repeated URL still hides its own path each time.
        let urls = "https://ci.example.com/run/1 ".repeat(1000);
        assert_eq!(
            kinds(&urls),
            [("url", "https://ci.example.com/run/1".to_owned())]
        );
    }

    #[test]
    fn a_rendered_shell_call_is_a_command() {
        assert_eq!(
            kinds("Bash(cat /var/log/app_1.log) then done"),
            [
                ("command", "cat /var/log/app_1.log".to_owned()),
                ("path", "/var/log/app_1.log".to_owned())
            ]
        );
    }
}
