//! The outline: lines tiling `[0, b)`, coarser with age, sent to the model instead of the old
//! messages.
//!
//! The outline only ever grows at its end (new level-0 lines) or merges two sibling lines into
//! their parent; a merged line is never split again. Merges come in batches: once the lines
//! exceed their budget, the most overdue sibling pairs whose parent exists are merged until the
//! lines fit well under the budget (a sawtooth), so between batches every request's outline is a
//! prefix-stable extension of the previous one and the provider's prompt cache keeps hitting.

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
        while total > target {
            let Some(at) = self.most_overdue_pair(message_count, line_bytes) else {
                break;
            };
            let (left, right) = (self.tiles[at], self.tiles[at + 1]);
            let parent = left.parent();
            let parent_bytes = line_bytes(parent).unwrap_or_default();
            let child_bytes =
                line_bytes(left).unwrap_or_default() + line_bytes(right).unwrap_or_default();
            total = (total + parent_bytes).saturating_sub(child_bytes);
            self.tiles.splice(at..at + 2, [parent]);
            merged.push(parent);
        }
        merged
    }

    /// The position of the left tile of the most overdue mergeable pair.
    fn most_overdue_pair(
        &self,
        message_count: u64,
        line_bytes: &impl Fn(NodeId) -> Option<usize>,
    ) -> Option<usize> {
        let mut best: Option<(usize, u128, u32)> = None;
        for at in 0..self.tiles.len().saturating_sub(1) {
            let (left, right) = (self.tiles[at], self.tiles[at + 1]);
            if !left.is_left_sibling_of(right) || line_bytes(left.parent()).is_none() {
                continue;
            }
            let age = u128::from(message_count.saturating_sub(right.last()));
            let level = left.level;
            // Compare age_a / 2^la with age_b / 2^lb without division: age_a·2^lb vs age_b·2^la.
            let more_overdue = match best {
                None => true,
                Some((_, best_age, best_level)) => (age << best_level) > (best_age << level),
            };
            if more_overdue {
                best = Some((at, age, level));
            }
        }
        best.map(|(at, _, _)| at)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

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
