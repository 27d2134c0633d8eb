//! Properties of the summary tree's pure parts: outline tiling, batched folding that never splits,
//! the budget, and reaching any message by zooming (with a needle-keeping summarizer).

use std::collections::HashMap;

use loupe::tree::{plan_zoom, NodeId, Outline, ZoomTarget};
use proptest::prelude::*;

/// A deterministic summarizer that keeps a planted token: a parent's line keeps the needle when a
/// child has it, then a short digest.
fn summarize(left: &str, right: &str) -> String {
    let needle = [left, right]
        .into_iter()
        .find_map(|t| t.split(' ').find(|w| w.starts_with("NEEDLE-")));
    match needle {
        Some(needle) => format!("{needle} and more"),
        None => format!("summary of {} bytes", left.len() + right.len()),
    }
}

/// An eagerly built tree over `count` messages: every complete block has its line.
fn build_tree(count: u64, needle_at: Option<u64>) -> HashMap<NodeId, String> {
    let mut lines = HashMap::new();
    for seq in 0..count {
        let text = match needle_at {
            Some(at) if at == seq => format!("message {seq} NEEDLE-{seq} here"),
            _ => format!("message {seq}"),
        };
        lines.insert(NodeId::leaf(seq), text);
    }
    let mut level = 0;
    while (1u64 << (level + 1)) <= count {
        let width = 1u64 << (level + 1);
        for index in 0..count / width {
            let parent = NodeId::new(level + 1, index);
            let (left, right) = parent.children().unwrap();
            let text = summarize(&lines[&left], &lines[&right]);
            lines.insert(parent, text);
        }
        level += 1;
    }
    lines
}

/// No tile of `before` was split: each lies whole inside one tile of `after`.
fn is_coarsening(before: &Outline, after: &Outline) -> bool {
    before.tiles.iter().all(|old| {
        after
            .tiles
            .iter()
            .any(|tile| tile.first() <= old.first() && old.end() <= tile.end())
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, .. ProptestConfig::default() })]

    #[test]
    fn outlines_tile_fold_in_batches_and_never_split(
        steps in prop::collection::vec((1u64..40, 0u64..30), 1..40),
        budget in 200usize..2000,
    ) {
        let mut outline = Outline::default();
        let mut count = 0u64;
        let target = budget / 2;
        for (appended, tail) in steps {
            count += appended;
            let lines = build_tree(count, None);
            let bytes = |node: NodeId| lines.get(&node).map(|text| node.to_string().len() + 1 + text.len());
            let boundary = count.saturating_sub(tail).max(outline.boundary());
            let before = outline.clone();
            outline.extend_to(boundary);
            prop_assert!(outline.is_tiling());
            let grown = outline.clone();
            outline.fold(count, budget, target, &bytes);
            prop_assert!(outline.is_tiling());
            prop_assert_eq!(outline.boundary(), boundary);
            prop_assert!(is_coarsening(&before, &outline));
            prop_assert!(is_coarsening(&grown, &outline));
            let total = outline.bytes(&bytes).unwrap();
            let mergeable = outline.tiles.windows(2).any(|pair| {
                pair[0].is_left_sibling_of(pair[1]) && lines.contains_key(&pair[0].parent())
            });
            if grown.bytes(&bytes).unwrap() <= budget {
                // Between batches nothing merges: the outline only grows at its end.
                prop_assert_eq!(&outline, &grown);
            } else {
                // A batch goes well under the budget, unless no pair with a built parent is left.
                prop_assert!(total <= target || !mergeable, "stopped at {} > {}: {:?}", total, target, outline.tiles);
            }
        }
    }

    #[test]
    fn a_needle_is_reached_in_log2_n_plus_one_zooms(count in 2u64..700, needle in any::<prop::sample::Index>(), budget in 100usize..1500) {
        let needle_at = needle.index(count as usize) as u64;
        let lines = build_tree(count, Some(needle_at));
        let bytes = |node: NodeId| lines.get(&node).map(|text| text.len() + 8);
        let mut outline = Outline::default();
        outline.extend_to(count);
        outline.fold(count, budget, budget / 2, &bytes);
        // The scripted agent finds the line with the token, then follows the token down.
        let token = format!("NEEDLE-{needle_at}");
        let start = *outline.tiles.iter().find(|t| lines[t].contains(&token)).expect("the outline keeps the token");
        let (mut node, mut calls) = (start, 0u32);
        loop {
            calls += 1;
            match plan_zoom(node.first() as i64, node.span() as i64, count).unwrap() {
                ZoomTarget::Message(seq) => {
                    prop_assert_eq!(seq, needle_at);
                    prop_assert!(lines[&NodeId::leaf(seq)].contains(&token));
                    break;
                }
                ZoomTarget::Halves(left, right) => {
                    node = if lines[&left].contains(&token) { left } else { right };
                    prop_assert!(lines[&node].contains(&token));
                }
            }
        }
        prop_assert_eq!(calls, start.level + 1, "log2(n) + 1 zooms for line {}", start);
    }
}
