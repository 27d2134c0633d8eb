//! A compaction plans over skeletons of its window, read a page at a time (see
//! `loupe::jobs::compaction::skeleton`): the plan must be the one the whole entries give, and
//! both must be the plain plan below (the view's entries cloned out, as the first version did),
//! for any stored history.

use loupe::history::normalize::view;
use loupe::history::{estimate_entry_tokens, group_rounds, Entry};
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

/// The plain plan, written independently of `plan_with_tokens`: the seqs to summarize and the
/// token sums, or `None` when there is nothing to summarize.
pub fn reference_plan(entries: &[Entry], keep: u32) -> Option<(Vec<Option<i64>>, u64, u64)> {
    let (indices, _) = view::slice_after_boundary(entries);
    let indices = view::hide_snipped(entries, indices);
    let view: Vec<Entry> = indices.iter().map(|&i| entries[i].clone()).collect();
    let rounds = group_rounds(&view);
    if rounds.len() <= keep as usize {
        return None;
    }
    let cut = match keep {
        0 => view.len(),
        keep => rounds[rounds.len() - keep as usize].first_index,
    };
    let summarized: Vec<&Entry> = view[..cut]
        .iter()
        .filter(|e| !e.is_compact_boundary() && !e.is_compact_summary)
        .collect();
    if !summarized.iter().any(|e| e.kind.is_model_visible()) {
        return None;
    }
    Some((
        summarized.iter().map(|e| e.seq).collect(),
        view.iter().map(estimate_entry_tokens).sum(),
        view[cut..].iter().map(estimate_entry_tokens).sum(),
    ))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

    #[test]
    fn planning_over_skeletons_equals_planning_over_the_entries(
        entries in chaos::chaotic_history(),
        keep in 0u32..5,
    ) {
        let tokens: Vec<u64> = entries.iter().map(estimate_entry_tokens).collect();
        let reference = reference_plan(&entries, keep);
        let whole = plan(entries.clone(), keep);
        match (&whole, &reference) {
            (Ok(whole), Some((seqs, pre, kept))) => {
                let summarized: Vec<Option<i64>> = whole.to_summarize.iter().map(|e| e.seq).collect();
                prop_assert_eq!(&summarized, seqs);
                prop_assert_eq!((whole.pre_tokens, whole.kept_tokens), (*pre, *kept));
                let own: Vec<u64> = whole.to_summarize.iter().map(estimate_entry_tokens).collect();
                prop_assert_eq!(&whole.to_summarize_tokens, &own);
            }
            (Err(_), None) => {}
            (whole, reference) => prop_assert!(false, "{:?} against the reference {:?}", whole.as_ref().map(|p| p.to_summarize.len()), reference),
        }
        let skeletons: Vec<_> = entries.into_iter().map(skeleton).collect();
        let light = plan_with_tokens(skeletons, &tokens, keep);
        match (whole, light) {
            (Ok(whole), Ok(light)) => prop_assert_eq!(decided(whole), decided(light)),
            (Err(whole), Err(light)) => prop_assert_eq!(whole, light),
            (whole, light) => prop_assert!(false, "{:?} against {:?}", whole.map(decided), light.map(decided)),
        }
    }
}
