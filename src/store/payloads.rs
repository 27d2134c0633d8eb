//! The jobs the store enqueues itself (auto-compaction and tree jobs on append, tree jobs when
//! outline mode is turned on): their kinds and payloads. They live here, under the store, so the
//! store depends on nothing above it; the workers in `jobs/` read them from here.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::ThreadId;

/// Summarizes a thread and appends a compact boundary.
pub const KIND_COMPACTION: &str = "compaction";
/// Does nothing (benchmarks and tests of the queue).
pub const KIND_NOOP: &str = "noop";
/// Builds a thread's summary-tree nodes and advances its outline.
pub const KIND_TREE: &str = "tree";
/// Deletes expired threads and trims by the retention policies, a batch at a time.
pub const KIND_RETENTION: &str = "retention";

/// Rounds a compaction keeps whole after the summary when the request does not say.
pub const DEFAULT_KEEP_RECENT_ROUNDS: u32 = 2;

/// What a compaction job was asked to do.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CompactionPayload {
    pub thread_id: ThreadId,
    /// `manual` (the compact endpoint) or `auto` (the threshold was crossed).
    pub trigger: String,
    pub keep_recent_rounds: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instructions: Option<String>,
}

impl CompactionPayload {
    pub fn manual(
        thread_id: &ThreadId,
        keep_recent_rounds: u32,
        instructions: Option<String>,
    ) -> Self {
        CompactionPayload {
            thread_id: thread_id.clone(),
            trigger: "manual".to_owned(),
            keep_recent_rounds,
            instructions,
        }
    }

    pub fn auto(thread_id: &ThreadId) -> Self {
        CompactionPayload {
            thread_id: thread_id.clone(),
            trigger: "auto".to_owned(),
            keep_recent_rounds: DEFAULT_KEEP_RECENT_ROUNDS,
            instructions: None,
        }
    }

    pub fn to_value(&self) -> Value {
        serde_json::to_value(self).unwrap_or(Value::Null)
    }
}
