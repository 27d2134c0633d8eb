//! Conversation history: the stored model, API-round grouping and normalization for providers.
//!
//! Everything here is pure (no I/O).

pub mod anchors;
pub mod economics;
pub mod ingest;
pub mod ledger;
pub mod model;
pub mod normalize;
pub mod render;
pub mod rounds;
pub mod search;
pub mod transcript;
pub mod visibility;

pub use model::{ApiMessage, Content, Entry, EntryKind, ErasedMark, Role, SnipMetadata};
pub use normalize::{
    entries_from_messages, estimate_entry_tokens, estimate_tokens, normalize, MicrocompactOptions,
    NormalizeOptions, Normalized, Provider, Repair, RepairKind, ThinkingMode,
};
pub use rounds::{group_rounds, round_skeleton, Round};
pub use visibility::is_sent_to_model;
