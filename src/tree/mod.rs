//! The summary tree: a binary tree of summary lines over a thread's messages, the outline sent to
//! the model (lines coarser with age), and `zoom(id, n)`, which opens any line back down to the
//! message, whole. This module holds the pure parts: addressing, the outline's folding and its
//! tail policy, rendering, and zoom's checks; node writing runs as background jobs
//! ([`crate::jobs`]), storage is in [`crate::store`].
//!
//! **What the tree covers.** Every stored entry has a position: its `seq` (dense from 0). Node
//! `(l, i)` covers the seqs `[i·2^l, (i+1)·2^l)`. A level-0 line renders its entry as a short
//! transcript turn (`user: …`, `assistant: …` with `[tool call: Read(src/a.rs)]`, `tool: [result of
//! …]`, attachments as their text). Entries the model never sees
//! ([`crate::history::is_sent_to_model`]: progress, system records, unknown kinds) get an empty
//! text: they keep their address, so the tiling has no holes and every address is a real message
//! id, but a node covering only such entries takes no line in the outline.

pub mod node;
pub mod outline;
pub mod policy;
pub mod view;
pub mod zoom;

pub use node::{decompose, line_size, render_line, NodeId};
pub use outline::Outline;
pub use policy::{advance, next_boundary, OutlineOptions, Tail};
pub use zoom::{plan as plan_zoom, ZoomError, ZoomTarget};
