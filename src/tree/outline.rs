//! The outline: lines tiling `[0, b)`, coarser with age, sent to the model instead of the old
//! messages.
//!
//! The outline only ever grows at its end (new level-0 lines) or merges two sibling lines into
//! their parent; a merged line is never split again. Merges come in batches: once the lines
//! exceed their budget, the most overdue sibling pairs whose parent exists are merged until the
//! lines fit well under the budget (a sawtooth), so between batches every request's outline is a
//! prefix-stable extension of the previous one and the provider's prompt cache keeps hitting.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use super::node::NodeId;

/// The nodes of an outline, in order; they tile `[0, boundary())` with no gap or overlap.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Outline {
    pub tiles: Vec<NodeId>,
}

impl Outline {
    pub fn new(tiles: Vec<NodeId>) -> Self {
        Outline { tiles }
    }

    /// The first message not in the outline: the outline covers `[0, boundary)`.
    pub fn boundary(&self) -> u64 {
        self.tiles.last().map_or(0, |node| node.end())
    }

    /// Whether the tiles cover `[0, boundary)` in order, with aligned ranges and no gap or overlap.
    pub fn is_tiling(&self) -> bool {
        let mut at = 0;
        for node in &self.tiles {
            if node.first() != at {
                return false;
            }
            at = node.end();
        }
        true
    }

    /// Moves the messages `[boundary, new_boundary)` into the outline as level-0 lines.
    pub fn extend_to(&mut self, new_boundary: u64) {
        let start = self.boundary();
        self.tiles.extend((start..new_boundary).map(NodeId::leaf));
    }

    /// Total bytes of the outline's lines; `None` when a line is not built.
    pub fn bytes(&self, line_bytes: &impl Fn(NodeId) -> Option<usize>) -> Option<usize> {
        self.tiles.iter().map(|node| line_bytes(*node)).sum()
    }

    /// When the lines exceed `budget` bytes, merges sibling pairs whose parent line exists, most
    /// overdue first, until they fit in `target` bytes (or nothing more can merge). Returns the
    /// parents that replaced their children, in merge order.
    ///
    /// A pair's overdue-ness is `(T − last) / 2^l`: how long ago its last message was, relative to
    /// its size, so old small lines merge before recent or large ones; ties go to the oldest pair.
    /// Candidate pairs wait in a priority queue (stale ones are skipped when popped), so a fold
    /// of `n` tiles costs `O(n log n)`, also when a long thread is outlined at once.
    pub fn fold(
        &mut self,
        message_count: u64,
        budget: usize,
        target: usize,
        line_bytes: &impl Fn(NodeId) -> Option<usize>,
    ) -> Vec<NodeId> {
        let mut merged = Vec::new();
        let Some(mut total) = self.bytes(line_bytes) else {
            return merged;
        };
        if total <= budget {
            return merged;
        }
        // The tiles as a linked list: merging a pair empties the right slot.
        let len = self.tiles.len();
        let mut slots: Vec<Option<NodeId>> = self.tiles.iter().copied().map(Some).collect();
        let mut prev: Vec<Option<usize>> = (0..len).map(|i| i.checked_sub(1)).collect();
        let mut next: Vec<Option<usize>> =
            (0..len).map(|i| (i + 1 < len).then_some(i + 1)).collect();
        let candidate = |slots: &[Option<NodeId>], next: &[Option<usize>], at: usize| {
            let left = slots[at]?;
            let right = slots[next[at]?]?;
            (left.is_left_sibling_of(right) && line_bytes(left.parent()).is_some()).then(|| {
                Candidate {
                    age: u128::from(message_count.saturating_sub(right.last())),
                    level: left.level,
                    at,
                    left,
                    right,
                }
            })
        };
        let mut queue: BinaryHeap<Candidate> = (0..len)
            .filter_map(|at| candidate(&slots, &next, at))
            .collect();
        while total > target {
            let Some(pair) = queue.pop() else {
                break;
            };
            let Some(right_at) = next[pair.at] else {
                continue;
            };
            if slots[pair.at] != Some(pair.left) || slots[right_at] != Some(pair.right) {
                continue; // stale: one of the two was merged since
            }
            let parent = pair.left.parent();
            let parent_bytes = line_bytes(parent).unwrap_or_default();
            let child_bytes = line_bytes(pair.left).unwrap_or_default()
                + line_bytes(pair.right).unwrap_or_default();
            total = (total + parent_bytes).saturating_sub(child_bytes);
            slots[pair.at] = Some(parent);
            slots[right_at] = None;
            next[pair.at] = next[right_at];
            if let Some(after) = next[right_at] {
                prev[after] = Some(pair.at);
            }
            merged.push(parent);
            for at in [prev[pair.at], Some(pair.at)].into_iter().flatten() {
                if let Some(candidate) = candidate(&slots, &next, at) {
                    queue.push(candidate);
                }
            }
        }
        self.tiles = slots.into_iter().flatten().collect();
        merged
    }
}

/// A pair of sibling tiles that may merge, ordered most overdue first, then oldest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Candidate {
    /// `T − last`: messages since the pair's last one.
    age: u128,
    level: u32,
    /// The left tile's slot.
    at: usize,
    left: NodeId,
    right: NodeId,
}

impl Ord for Candidate {
    fn cmp(&self, other: &Self) -> Ordering {
        // age_a / 2^la against age_b / 2^lb without division: age_a·2^lb against age_b·2^la.
        (self.age << other.level)
            .cmp(&(other.age << self.level))
            .then_with(|| other.left.first().cmp(&self.left.first()))
    }
}

impl PartialOrd for Candidate {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    /// The fold as first written (a full scan for the most overdue pair before every merge): the
    /// oracle the queue-based fold must match merge for merge.
    fn fold_by_scanning(
        outline: &mut Outline,
        t: u64,
        budget: usize,
        target: usize,
        bytes: &impl Fn(NodeId) -> Option<usize>,
    ) -> Vec<NodeId> {
        let mut merged = Vec::new();
        let Some(mut total) = outline.bytes(bytes) else {
            return merged;
        };
        if total <= budget {
            return merged;
        }
        while total > target {
            let mut best: Option<(usize, u128, u32)> = None;
            for at in 0..outline.tiles.len().saturating_sub(1) {
                let (left, right) = (outline.tiles[at], outline.tiles[at + 1]);
                if !left.is_left_sibling_of(right) || bytes(left.parent()).is_none() {
                    continue;
                }
                let age = u128::from(t.saturating_sub(right.last()));
                let better = match best {
                    None => true,
                    Some((_, best_age, best_level)) => {
                        (age << best_level) > (best_age << left.level)
                    }
                };
                if better {
                    best = Some((at, age, left.level));
                }
            }
            let Some((at, _, _)) = best else {
                break;
            };
            let (left, right) = (outline.tiles[at], outline.tiles[at + 1]);
            total = (total + bytes(left.parent()).unwrap_or_default())
                .saturating_sub(bytes(left).unwrap_or_default() + bytes(right).unwrap_or_default());
            outline.tiles.splice(at..at + 2, [left.parent()]);
            merged.push(left.parent());
        }
        merged
    }

    #[test]
    fn the_queue_merges_exactly_as_the_full_scan() {
        // Deterministic sizes that vary by node, parents missing above some levels.
        for (count, budget, max_level) in [
            (37u64, 300, 9),
            (200, 900, 3),
            (513, 2_000, 10),
            (64, 100, 6),
        ] {
            let bytes = |node: NodeId| {
                (node.level <= max_level && node.end() <= count)
                    .then_some(8 + ((node.first() * 7 + u64::from(node.level) * 13) % 23) as usize)
            };
            for start in [0, count / 3] {
                let mut by_queue = Outline::new(crate::tree::decompose(0, start));
                by_queue.extend_to(count);
                let mut by_scan = by_queue.clone();
                let queued = by_queue.fold(count, budget, budget / 2, &bytes);
                let scanned = fold_by_scanning(&mut by_scan, count, budget, budget / 2, &bytes);
                assert_eq!(queued, scanned, "count {count}, budget {budget}");
                assert_eq!(by_queue, by_scan);
            }
        }
    }

    fn names(outline: &Outline) -> Vec<String> {
        outline.tiles.iter().map(|n| n.to_string()).collect()
    }

    #[test]
    fn extending_adds_level_zero_lines() {
        let mut outline = Outline::default();
        outline.extend_to(3);
        assert_eq!(names(&outline), ["0+1", "1+1", "2+1"]);
        assert_eq!(outline.boundary(), 3);
        assert!(outline.is_tiling());
    }

    #[test]
    fn the_revised_rule_merges_the_recent_small_pair_first() {
        // OptChat's counterexample: at T=10 with 0+4, 4+4, 8+1, 9+1 the pair 8+1, 9+1 is the
        // most overdue relative to its size, not the old large lines.
        let mut outline = Outline::new(vec![
            NodeId::new(2, 0),
            NodeId::new(2, 1),
            NodeId::leaf(8),
            NodeId::leaf(9),
        ]);
        let built = |_: NodeId| Some(10);
        let merged = outline.fold(10, 35, 30, &built);
        assert_eq!(
            merged.first().map(|n| n.to_string()).as_deref(),
            Some("8+2")
        );
    }

    #[test]
    fn nothing_merges_under_budget_or_without_a_built_parent() {
        let mut outline = Outline::default();
        outline.extend_to(4);
        let small = |_: NodeId| Some(10);
        assert!(outline.fold(4, 100, 50, &small).is_empty());
        let leaves_only = |node: NodeId| (node.level == 0).then_some(100);
        assert!(outline.fold(4, 100, 50, &leaves_only).is_empty());
        assert_eq!(outline.tiles.len(), 4);
    }

    #[test]
    fn a_batch_merges_down_to_the_target() {
        let mut outline = Outline::default();
        outline.extend_to(16);
        let bytes = |_: NodeId| Some(10);
        let merged = outline.fold(16, 150, 80, &bytes);
        assert!(!merged.is_empty());
        assert!(outline.bytes(&bytes).unwrap() <= 80);
        assert!(outline.is_tiling());
        // Never split: every tile is a node built above the original leaves.
        let seen: HashSet<NodeId> = merged.into_iter().collect();
        assert!(outline
            .tiles
            .iter()
            .all(|t| t.level == 0 || seen.contains(t)));
    }
}
