//! Loupe: keeps LLM conversation threads whole and hands them back ready for the model.
//!
//! See `docs/ARCHITECTURE.md` for the module map and the data flows.

pub mod app;
pub mod auth;
pub mod cli;
pub mod context;
pub mod history;
pub mod http;
pub mod import;
pub mod jobs;
pub mod json_weight;
pub mod metrics;
pub mod shutdown;
pub mod store;
pub mod summarize;
pub mod telemetry;
pub mod tree;
pub mod turns;
pub mod webhooks;
