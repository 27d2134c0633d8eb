//! A compaction plans over skeletons of its window, read a page at a time (see
//! `loupe::jobs::compaction::skeleton`): the plan must be the one the whole entries give, for
//! any stored history.

use loupe::history::estimate_entry_tokens;
use loupe::jobs::compaction::{plan, plan_with_tokens, skeleton, CompactionPlan};
use proptest::prelude::*;

use crate::chaos;

/// What a plan decides, by seq: the skeleton plan's entries have no bodies to compare.
#[derive(Debug, PartialEq)]
struct Decided {
    to_summarize: Vec<Option<i64>>,
    to_summarize_tokens: Vec<u64>,
    previous_summary: Option<String>,
    first_kept_seq: Option<i64>,
    pre_tokens: u64,
    kept_tokens: u64,
    rounds: usize,
}

fn decided(plan: CompactionPlan) -> Decided {
    Decided {
        to_summarize: plan.to_summarize.iter().map(|e| e.seq).collect(),
        to_summarize_tokens: plan.to_summarize_tokens,
        previous_summary: plan.previous_summary,
        first_kept_seq: plan.first_kept_seq,
        pre_tokens: plan.pre_tokens,
        kept_tokens: plan.kept_tokens,
        rounds: plan.rounds,
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

    #[test]
    fn planning_over_skeletons_equals_planning_over_the_entries(
        entries in chaos::chaotic_history(),
        keep in 0u32..5,
    ) {
        let tokens: Vec<u64> = entries.iter().map(estimate_entry_tokens).collect();
        let whole = plan(entries.clone(), keep);
        let skeletons: Vec<_> = entries.into_iter().map(skeleton).collect();
        let light = plan_with_tokens(skeletons, &tokens, keep);
        match (whole, light) {
            (Ok(whole), Ok(light)) => prop_assert_eq!(decided(whole), decided(light)),
            (Err(whole), Err(light)) => prop_assert_eq!(whole, light),
            (whole, light) => prop_assert!(false, "{:?} against {:?}", whole.map(decided), light.map(decided)),
        }
    }
}
