//! Addressing in the summary tree: node `(l, i)` covers messages `[i·2^l, (i+1)·2^l)` by seq and
//! is written as the line `id+n|text`, with `id = i·2^l` and `n = 2^l`.

use std::fmt;

/// Deepest level a node can have; `2^62` messages is more than any thread holds.
pub const MAX_LEVEL: u32 = 62;

/// A node of the tree (equally: a line of the outline).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NodeId {
    pub level: u32,
    pub index: u64,
}

impl NodeId {
    pub fn new(level: u32, index: u64) -> Self {
        NodeId { level, index }
    }

    /// The level-0 node of one message.
    pub fn leaf(seq: u64) -> Self {
        NodeId::new(0, seq)
    }

    /// How many messages the node covers: `n = 2^l`.
    pub fn span(self) -> u64 {
        1u64 << self.level
    }

    /// The first message it covers: `id = i·2^l`.
    pub fn first(self) -> u64 {
        self.index << self.level
    }

    /// One past the last message it covers.
    pub fn end(self) -> u64 {
        self.first() + self.span()
    }

    /// The last message it covers.
    pub fn last(self) -> u64 {
        self.end() - 1
    }

    /// The node of line `id+n`, when `n` is a power of two and `id` a multiple of it.
    pub fn from_line(id: u64, n: u64) -> Option<Self> {
        if n == 0 || !n.is_power_of_two() || !id.is_multiple_of(n) {
            return None;
        }
        let level = n.trailing_zeros();
        (level <= MAX_LEVEL).then(|| NodeId::new(level, id / n))
    }

    /// The two nodes it was made from; `None` for a leaf.
    pub fn children(self) -> Option<(NodeId, NodeId)> {
        (self.level > 0).then(|| {
            let level = self.level - 1;
            (
                NodeId::new(level, self.index * 2),
                NodeId::new(level, self.index * 2 + 1),
            )
        })
    }

    pub fn parent(self) -> NodeId {
        NodeId::new(self.level + 1, self.index / 2)
    }

    /// Whether `self` and `next` are the left and right children of one parent.
    pub fn is_left_sibling_of(self, next: NodeId) -> bool {
        self.level == next.level && self.index.is_multiple_of(2) && next.index == self.index + 1
    }

    /// A node exists only for a complete block: all of its messages are stored.
    pub fn is_complete_below(self, message_count: u64) -> bool {
        self.end() <= message_count
    }
}

impl fmt::Display for NodeId {
    /// The line's address as the model reads it: `id+n`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}+{}", self.first(), self.span())
    }
}

/// A line as the outline writes it: `id+n|text`, on one line (newlines become spaces).
pub fn render_line(node: NodeId, text: &str) -> String {
    let mut line = format!("{node}|");
    let mut last_was_space = false;
    for ch in text.trim().chars() {
        let ch = if ch == '\n' || ch == '\r' { ' ' } else { ch };
        if ch == ' ' && last_was_space {
            continue;
        }
        last_was_space = ch == ' ';
        line.push(ch);
    }
    line
}

/// Bytes the node takes in the outline: its line and a newline. A node with no text (it covers
/// only entries the model never sees) takes no line at all.
pub fn line_size(node: NodeId, text: &str) -> usize {
    if text.trim().is_empty() {
        0
    } else {
        render_line(node, text).len() + 1
    }
}

/// The aligned nodes that tile `[start, end)`, largest first where alignment allows (the binary
/// decomposition, as in a Fenwick tree): `[0, 13)` is `0+8, 8+4, 12+1`.
pub fn decompose(start: u64, end: u64) -> Vec<NodeId> {
    let mut nodes = Vec::new();
    let mut at = start;
    while at < end {
        let align = if at == 0 {
            MAX_LEVEL
        } else {
            at.trailing_zeros().min(MAX_LEVEL)
        };
        let fit = (end - at).ilog2();
        let level = align.min(fit);
        nodes.push(NodeId::new(level, at >> level));
        at += 1u64 << level;
    }
    nodes
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_is_its_line_address() {
        let node = NodeId::new(3, 2);
        assert_eq!((node.first(), node.span(), node.last()), (16, 8, 23));
        assert_eq!(node.to_string(), "16+8");
        assert_eq!(NodeId::from_line(16, 8), Some(node));
        assert_eq!(NodeId::from_line(5, 1), Some(NodeId::leaf(5)));
    }

    #[test]
    fn only_aligned_powers_of_two_are_lines() {
        assert_eq!(NodeId::from_line(1, 2), None);
        assert_eq!(NodeId::from_line(0, 3), None);
        assert_eq!(NodeId::from_line(0, 0), None);
        assert_eq!(NodeId::from_line(12, 8), None);
    }

    #[test]
    fn children_and_parents_are_inverse() {
        let node = NodeId::new(2, 5);
        let (left, right) = node.children().unwrap();
        assert_eq!(
            (left.to_string(), right.to_string()),
            ("20+2".to_owned(), "22+2".to_owned())
        );
        assert_eq!(left.parent(), node);
        assert_eq!(right.parent(), node);
        assert!(left.is_left_sibling_of(right));
        assert!(!right.is_left_sibling_of(NodeId::new(1, 12)));
        assert!(NodeId::leaf(7).children().is_none());
    }

    #[test]
    fn lines_are_one_line() {
        assert_eq!(render_line(NodeId::leaf(4), "  a\nb \r\n c  "), "4+1|a b c");
        assert_eq!(line_size(NodeId::leaf(4), "a b"), "4+1|a b\n".len());
        assert_eq!(line_size(NodeId::new(3, 1), " \n"), 0);
    }

    #[test]
    fn a_range_decomposes_into_aligned_blocks() {
        let lines: Vec<String> = decompose(0, 13).iter().map(|n| n.to_string()).collect();
        assert_eq!(lines, ["0+8", "8+4", "12+1"]);
        let lines: Vec<String> = decompose(6, 17).iter().map(|n| n.to_string()).collect();
        assert_eq!(lines, ["6+2", "8+8", "16+1"]);
        assert!(decompose(5, 5).is_empty());
    }
}
