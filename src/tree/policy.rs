//! When the tail moves into the outline, and the per-thread outline options.
//!
//! The tail (the messages after the outline's boundary, sent whole) has its own token budget, so
//! its size never forces merges of old lines. When it exceeds the budget, whole rounds move from
//! its start into the outline in one batch, down to a quarter of the budget (an epoch), and only
//! rounds whose level-0 lines exist. Between epochs the tail only grows at its end, so every
//! request shares its whole prefix with the previous one; an epoch costs one request most of its
//! cached prefix, so epochs are made rare: a large tail budget, emptied to a quarter each time.
//! (Measured by tests/tree_replay.rs on a 5,000-message replay; see docs/TREE.md.)

use serde::{Deserialize, Serialize};

use super::node::NodeId;
use super::outline::Outline;

/// Per-thread outline options (stored in the thread's settings).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutlineOptions {
    /// Whether the thread is outlined: the tree is built and `view=outline` is served.
    pub enabled: bool,
    /// Target bytes of one line (a source that fits is its own line, word for word).
    pub line_bytes: usize,
    /// Bytes of all the outline's lines; past it, sibling lines merge in a batch down to half.
    pub budget_bytes: usize,
    /// Estimated tokens of the whole tail; past it, rounds move into the outline down to a
    /// quarter.
    pub tail_tokens: u64,
}

impl OutlineOptions {
    pub const DEFAULT_LINE_BYTES: usize = 512;
    /// The two budgets, chosen by the cost curve of the tool-heavy replays (BENCHMARKS.md, "Cost
    /// curve"): under half of automatic compaction's input, alone or with clearing.
    pub const DEFAULT_BUDGET_BYTES: usize = 64_000;
    pub const DEFAULT_TAIL_TOKENS: u64 = 16_000;
    /// Smallest line budget accepted: shorter lines lose too much (OptChat: 128 B failed).
    pub const MIN_LINE_BYTES: usize = 64;
}

impl Default for OutlineOptions {
    fn default() -> Self {
        OutlineOptions {
            enabled: false,
            line_bytes: Self::DEFAULT_LINE_BYTES,
            budget_bytes: Self::DEFAULT_BUDGET_BYTES,
            tail_tokens: Self::DEFAULT_TAIL_TOKENS,
        }
    }
}

/// The tail as the policy sees it.
#[derive(Debug, Clone, Copy)]
pub struct Tail<'a> {
    /// The outline's boundary: the tail is `[start, start + tokens.len())`.
    pub start: u64,
    /// Estimated tokens of each tail entry, in seq order.
    pub tokens: &'a [u64],
    /// Seqs where a round starts, ascending (the tail's first round starts at `start`).
    pub round_starts: &'a [u64],
}

/// The new boundary: `tail.start` when the tail fits `budget`; otherwise the first round start
/// after which at most `budget / 4` tokens remain, or, when even the last round is larger, the
/// last round start. Only starts at or below `built_below` (level-0 lines exist up to there)
/// qualify.
pub fn next_boundary(tail: Tail<'_>, budget: u64, built_below: u64) -> u64 {
    let total: u64 = tail.tokens.iter().sum();
    if total <= budget {
        return tail.start;
    }
    let target = budget / 4;
    let end = tail.start + tail.tokens.len() as u64;
    // Tokens from the candidate start to the end, kept as the starts go up (one pass).
    let (mut suffix, mut at) = (total, tail.start);
    let mut chosen = tail.start;
    for &start in tail.round_starts {
        if start <= tail.start || start >= end || start > built_below {
            continue;
        }
        suffix -= tail.tokens[(at - tail.start) as usize..(start - tail.start) as usize]
            .iter()
            .sum::<u64>();
        at = start;
        chosen = start;
        if suffix <= target {
            break;
        }
    }
    chosen
}

/// The outline after `t` messages: the tail up to `boundary` (from [`next_boundary`]) moved in,
/// then folded into the byte budget, down to half of it ([`Outline::fold`]). `line_bytes` gives
/// the rendered size of a built node (`None`: not built).
pub fn advance(
    outline: &Outline,
    t: u64,
    boundary: u64,
    options: &OutlineOptions,
    line_bytes: &impl Fn(NodeId) -> Option<usize>,
) -> Outline {
    let mut next = outline.clone();
    next.extend_to(boundary);
    next.fold(
        t,
        options.budget_bytes,
        options.budget_bytes / 2,
        line_bytes,
    );
    next
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tail_within_budget_stays() {
        let tokens = [10, 10, 10];
        let tail = Tail {
            start: 5,
            tokens: &tokens,
            round_starts: &[5, 6],
        };
        assert_eq!(next_boundary(tail, 30, 100), 5);
    }

    #[test]
    fn an_overflowing_tail_moves_whole_rounds_down_to_a_quarter_of_the_budget() {
        // Rounds start at 0, 2, 4, 6, 8; ten entries of 10 tokens; budget 80, target 20.
        let tokens = [10; 10];
        let tail = Tail {
            start: 0,
            tokens: &tokens,
            round_starts: &[0, 2, 4, 6, 8],
        };
        assert_eq!(next_boundary(tail, 80, 100), 8);
        // Lines built only up to seq 4: the cut waits at 4.
        assert_eq!(next_boundary(tail, 80, 4), 4);
        assert_eq!(next_boundary(tail, 80, 1), 0);
    }

    #[test]
    fn a_huge_last_round_leaves_only_itself() {
        let tokens = [10, 10, 500];
        let tail = Tail {
            start: 0,
            tokens: &tokens,
            round_starts: &[0, 1, 2],
        };
        assert_eq!(next_boundary(tail, 100, 100), 2);
    }
}
