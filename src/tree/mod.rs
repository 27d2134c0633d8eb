//! The summary tree: a binary tree of summary lines over a thread's messages, the outline sent to
//! the model (lines coarser with age), and `zoom(id, n)`, which opens any line back down to the
//! message, whole. This module holds the pure parts: addressing, the outline's folding and its
//! tail policy, rendering, and zoom's checks; node writing runs as background jobs
//! ([`crate::jobs`]), storage is in [`crate::store`].
//!
//! **What the tree covers.** Every stored entry has a position: its `seq` (dense from 0). Node
//! `(l, i)` covers the seqs `[i·2^l, (i+1)·2^l)`. A level-0 line renders its entry as a short
//! transcript turn (`user: …`, `assistant: …` with `[tool call: Read(src/a.rs)]`, `tool: [result of
//! …]`, attachments as their text); entries the model never sees (progress, system records such
//! as compact boundaries) render as a bracketed note, e.g. `(system: compact_boundary)`, so every
//! address is a real message id and the tiling has no holes.

pub mod node;
pub mod outline;
pub mod policy;
pub mod view;
pub mod zoom;

pub use node::{decompose, render_line, NodeId};
pub use outline::Outline;
pub use policy::{advance, next_boundary, OutlineOptions, Tail};
pub use zoom::{plan as plan_zoom, ZoomError, ZoomTarget};
