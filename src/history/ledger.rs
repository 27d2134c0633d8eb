//! The loss ledger's arithmetic: which anchors of the entries a summary covers it kept, which it
//! dropped, and the short footer the model reads under a summary, naming what was dropped by
//! kind so that it knows what to search for. The footer holds only what the covered entries
//! said, so it is derived again wherever the summary is.

use std::collections::{BTreeMap, HashSet};

use super::anchors::{anchors_of_entry, kept_in, Anchor, AnchorKind};
use super::model::Entry;

/// Where a footer starts in a summary's text (and what [`without_footer`] cuts at).
pub const FOOTER_OPEN: &str = "\n\n[Not kept in this summary; search finds them:";

/// Dropped anchors a footer names of each kind (the rest it counts).
const FOOTER_EXAMPLES: usize = 3;

/// Longest example a footer quotes, in characters.
const FOOTER_EXAMPLE_CHARS: usize = 60;

/// Most distinct anchors one tally holds: a summary over a whole long session is judged on its
/// first ones, and its memory stays bounded.
pub const MAX_TALLY_ANCHORS: usize = 20_000;

/// The distinct anchors of the entries a summary covers, in order of first appearance.
#[derive(Debug, Default)]
pub struct Tally {
    anchors: Vec<Anchor>,
    seen: HashSet<Anchor>,
}

impl Tally {
    /// Counts the anchors of an entry the summary covers.
    pub fn add_entry(&mut self, entry: &Entry) {
        self.add(anchors_of_entry(entry));
    }

    pub fn add(&mut self, anchors: impl IntoIterator<Item = Anchor>) {
        for anchor in anchors {
            if self.anchors.len() >= MAX_TALLY_ANCHORS {
                return;
            }
            if self.seen.insert(anchor.clone()) {
                self.anchors.push(anchor);
            }
        }
    }

    /// The anchors `summary` does not hold, in order.
    pub fn dropped<'a>(&'a self, summary: &'a str) -> impl Iterator<Item = &'a Anchor> + 'a {
        self.anchors
            .iter()
            .filter(move |anchor| !kept_in(summary, &anchor.text))
    }

    /// The footer for `summary` (empty when it kept every anchor).
    pub fn footer(&self, summary: &str) -> String {
        footer(self.dropped(summary))
    }
}

/// A footer naming `dropped` by kind: a count and a few examples of each.
pub fn footer<'a>(dropped: impl Iterator<Item = &'a Anchor>) -> String {
    let mut by_kind: BTreeMap<AnchorKind, (usize, Vec<&str>)> = BTreeMap::new();
    for anchor in dropped {
        let (count, examples) = by_kind.entry(anchor.kind).or_default();
        *count += 1;
        if examples.len() < FOOTER_EXAMPLES {
            examples.push(&anchor.text);
        }
    }
    if by_kind.is_empty() {
        return String::new();
    }
    let parts: Vec<String> = by_kind
        .into_iter()
        .map(|(kind, (count, examples))| {
            let mut quoted: Vec<String> = examples.iter().map(|e| quote(e)).collect();
            if count > quoted.len() {
                quoted.push("…".to_owned());
            }
            format!("{count} {} ({})", kind.plural(count), quoted.join(", "))
        })
        .collect();
    format!("{FOOTER_OPEN} {}.]", parts.join("; "))
}

/// Counts only, for a line of the outline: `kind:count,…` as a line stores it.
pub fn encode_counts(counts: &BTreeMap<AnchorKind, u64>) -> String {
    counts
        .iter()
        .filter(|(_, count)| **count > 0)
        .map(|(kind, count)| format!("{}:{count}", kind.as_str()))
        .collect::<Vec<_>>()
        .join(",")
}

/// Adds the counts a line stores ([`encode_counts`]) to `into`.
pub fn add_counts(stored: &str, into: &mut BTreeMap<AnchorKind, u64>) {
    for part in stored.split(',') {
        if let Some((kind, count)) = part.split_once(':') {
            if let (Some(kind), Ok(count)) = (AnchorKind::parse(kind), count.parse::<u64>()) {
                *into.entry(kind).or_default() += count;
            }
        }
    }
}

/// The outline's footer: what its lines dropped, by kind (empty when nothing was).
pub fn outline_footer(counts: &BTreeMap<AnchorKind, u64>) -> String {
    let parts: Vec<String> = counts
        .iter()
        .filter(|(_, count)| **count > 0)
        .map(|(kind, count)| format!("{count} {}", kind.plural(*count as usize)))
        .collect();
    if parts.is_empty() {
        return String::new();
    }
    format!(
        "[Not kept in the lines above: {}. The search tool finds them; zoom opens what it finds.]",
        parts.join(", ")
    )
}

/// A summary's text without its footer: cut at the last footer's start, since the footer is
/// always last and a summary may quote a conversation that wrote one.
pub fn without_footer(text: &str) -> &str {
    text.rfind(FOOTER_OPEN).map_or(text, |at| &text[..at])
}

fn quote(text: &str) -> String {
    let mut quoted: String = text.chars().take(FOOTER_EXAMPLE_CHARS).collect();
    if quoted.len() < text.len() {
        quoted.push('…');
    }
    format!("`{}`", quoted.replace('`', "'"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::anchors::anchors_in_text;

    #[test]
    fn a_footer_names_what_was_dropped_by_kind() {
        let mut tally = Tally::default();
        tally.add(anchors_in_text(
            "Edited src/a.rs, src/b.rs, src/c.rs and src/d.rs; E0282 at 412 ms.",
        ));
        let summary = "Fixed src/a.rs after 412 ms.";
        let footer = tally.footer(summary);
        assert!(footer.starts_with(FOOTER_OPEN), "{footer}");
        assert!(
            footer.contains("3 paths (`src/b.rs`, `src/c.rs`, `src/d.rs`)"),
            "{footer}"
        );
        assert!(footer.contains("1 error code (`E0282`)"), "{footer}");
        assert!(
            !footer.contains("src/a.rs") && !footer.contains("412"),
            "{footer}"
        );
        let sent = format!("{summary}{footer}");
        assert_eq!(without_footer(&sent), summary);
        // A summary that quotes a footer keeps the quote; only its own footer goes.
        let quoting = format!("quoted:{footer} and more{footer}");
        assert_eq!(
            without_footer(&quoting),
            format!("quoted:{footer} and more")
        );
        assert_eq!(
            tally.footer("src/a.rs src/b.rs src/c.rs src/d.rs E0282 412 ms"),
            ""
        );
    }

    #[test]
    fn counts_round_trip_and_sum() {
        let mut counts = BTreeMap::new();
        add_counts("path:2,command:1", &mut counts);
        add_counts("path:3,bogus:9,number:x", &mut counts);
        assert_eq!(encode_counts(&counts), "path:5,command:1");
        assert_eq!(
            outline_footer(&counts),
            "[Not kept in the lines above: 5 paths, 1 command. The search tool finds them; \
             zoom opens what it finds.]"
        );
        assert_eq!(outline_footer(&BTreeMap::new()), "");
    }
}
