//! Properties of the summary tree's pure parts: outline tiling, batched folding that never splits,
//! the budget, and reaching any message by zooming (with a needle-keeping summarizer).

use std::collections::HashMap;

use loupe::tree::{
    advance, next_boundary, plan_zoom, NodeId, Outline, OutlineOptions, Tail, ZoomTarget,
};
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

    /// The job's step, `policy::advance`, over a growing thread of random message sizes and
    /// rounds: the boundary only moves to a round start whose lines exist, the tail moves in
    /// epochs (an over-budget tail ends at a quarter of the budget, unless one round is larger),
    /// the outline tiles `[0, b)`, never splits, stays within its budget once parents exist, and
    /// every message under it is `log2(n) + 1` zooms from the line that holds it.
    #[test]
    fn the_outline_advances_in_epochs_at_round_starts(
        messages in prop::collection::vec((1u64..400, any::<bool>()), 1..400),
        batch in 1usize..12,
        budget in 300usize..3000,
        tail_budget in 50u64..2000,
        lag in 0u64..4,
    ) {
        let options = OutlineOptions { enabled: true, line_bytes: 64, budget_bytes: budget, tail_tokens: tail_budget };
        let tokens: Vec<u64> = messages.iter().map(|(t, _)| *t).collect();
        // A round starts at every message flagged so (and at 0).
        let starts: Vec<u64> = messages.iter().enumerate()
            .filter(|(i, (_, start))| *i == 0 || *start)
            .map(|(i, _)| i as u64)
            .collect();
        let mut outline = Outline::default();
        let mut t = 0u64;
        while (t as usize) < messages.len() {
            t = (t + batch as u64).min(messages.len() as u64);
            let lines = build_tree(t, None);
            let bytes = |node: NodeId| lines.get(&node).map(|text| node.to_string().len() + 2 + text.len());
            let start = outline.boundary();
            let round_starts: Vec<u64> = starts.iter().copied().filter(|&s| s >= start && s < t).collect();
            let tail = Tail { start, tokens: &tokens[start as usize..t as usize], round_starts: &round_starts };
            let built_below = t.saturating_sub(lag);
            let before = outline.clone();
            let boundary = next_boundary(tail, options.tail_tokens, built_below);
            outline = advance(&before, t, boundary, &options, &bytes);
            let b = outline.boundary();
            prop_assert!(outline.is_tiling());
            prop_assert!(b >= start && b <= built_below.max(start));
            prop_assert!(b == start || starts.contains(&b), "boundary {} is no round start", b);
            prop_assert!(is_coarsening(&before, &outline));
            let tail_tokens: u64 = tokens[start as usize..t as usize].iter().sum();
            if b > start {
                prop_assert!(tail_tokens > tail_budget, "moved a tail within its budget");
                let rest: u64 = tokens[b as usize..t as usize].iter().sum();
                // A quarter of the budget, unless the next round start would have been past the
                // lines or this is the last round start (one round larger than that).
                let later_start = starts.iter().any(|&s| s > b && s < t && s <= built_below);
                prop_assert!(rest <= tail_budget / 4 || !later_start, "rest {} > {}", rest, tail_budget / 4);
            }
            let total = outline.bytes(&bytes).unwrap();
            let mergeable = outline.tiles.windows(2).any(|pair| {
                pair[0].is_left_sibling_of(pair[1]) && lines.contains_key(&pair[0].parent())
            });
            prop_assert!(total <= budget || !mergeable, "over budget with a mergeable pair");
            for tile in &outline.tiles {
                // Any message under the tile: log2(n) zooms into halves, then zoom(m, 1).
                let target = tile.first() + (tile.span() - 1) / 2;
                let (mut node, mut calls) = (*tile, 0u32);
                loop {
                    calls += 1;
                    match plan_zoom(node.first() as i64, node.span() as i64, t).unwrap() {
                        ZoomTarget::Message(seq) => { prop_assert_eq!(seq, target); break; }
                        ZoomTarget::Halves(left, right) => {
                            prop_assert!(lines.contains_key(&left) && lines.contains_key(&right));
                            node = if target < right.first() { left } else { right };
                        }
                    }
                }
                prop_assert_eq!(calls, tile.level + 1);
            }
        }
    }
}
