//! Every integration test, in one binary: one module per area, and the helpers they share in
//! `support/` (`common`, `chaos`, `fake_provider`; each reachable as `crate::<name>`).

#[macro_use]
mod support;
use support::{chaos, common, fake_provider};

mod architecture;
mod bounds;
mod cli_help;
mod compaction_props;
mod conformance;
mod context;
mod context_cache;
mod cursors;
mod docs_page;
mod drills;
mod economics;
mod erasure;
mod estimate_blocks;
mod estimate_replay;
mod events;
mod examples;
mod forgetting;
mod forks;
mod group_commit;
mod guard_rails;
mod hostile;
mod jobs;
mod keep_alive;
mod ledger;
mod lifecycle;
mod memory_bounds;
mod normalize_incremental;
mod normalize_invariants;
mod normalize_perf;
mod normalize_smoke_props;
mod nul_text;
mod openapi;
mod problems;
mod providers;
mod recall;
mod replicas;
mod retention;
mod sdk_fidelity;
mod search;
mod shard_ready;
mod summarize_extractive;
mod summarize_models;
mod tenants;
mod thread_life;
mod token_estimates;
mod transcripts;
mod tree;
mod tree_props;
mod tree_replay;
mod ui;
mod validator_selftest;
mod webhooks;
