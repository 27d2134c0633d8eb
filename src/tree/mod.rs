//! The summary tree: a binary tree of summary lines over a thread's messages, the outline sent to
//! the model (lines coarser with age), and `zoom(id, n)`, which opens any line back down to the
//! message, whole. This module holds the pure parts: addressing, the outline's folding, and zoom's
//! checks; node writing runs as background jobs.

pub mod node;
pub mod outline;
pub mod zoom;

pub use node::{decompose, render_line, NodeId};
pub use outline::Outline;
pub use zoom::{plan as plan_zoom, ZoomError, ZoomTarget};
