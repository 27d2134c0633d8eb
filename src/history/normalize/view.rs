//! Steps a–d: which stored entries are in the view, and in what order. They work on indices into
//! the input slice, so nothing is cloned yet.

use std::collections::HashSet;

use serde_json::Value;

use super::blocks::{compaction, Compaction};
use super::{Ctx, Provider, RepairKind};
use crate::history::model::{Content, Entry, EntryKind};

/// Step a — `getMessagesAfterCompactBoundary` with Loupe's preserved segment.
///
/// Finds the last compact boundary. Without `compact_metadata.preserved_segment` the view is the
/// boundary and everything after it. With `preserved_segment {first_seq: A, last_seq: B}` the view
/// is: the boundary, the `is_compact_summary` user entries directly after it, the entries whose seq
/// is in `[A, B]` (kept by reference, stored before the boundary) except older compact boundaries
/// and compact summaries inside that range, then every other entry after the boundary; the last
/// two groups in seq order. No boundary: every entry. Returns the indices and the boundary's seq.
pub fn slice_after_boundary(entries: &[Entry]) -> (Vec<usize>, Option<i64>) {
    let Some(b) = entries.iter().rposition(Entry::is_compact_boundary) else {
        return ((0..entries.len()).collect(), None);
    };
    let boundary_seq = Some(entries[b].seq_or(b));
    let Some((first, last)) = entries[b].preserved_segment() else {
        return ((b..entries.len()).collect(), boundary_seq);
    };
    let mut view = vec![b];
    let mut j = b + 1;
    while j < entries.len() && entries[j].kind == EntryKind::User && entries[j].is_compact_summary {
        view.push(j);
        j += 1;
    }
    let in_segment = |i: usize| (first..=last).contains(&entries[i].seq_or(i));
    // A kept range that reaches back past an earlier compaction spans that compaction's boundary
    // and summary; they are history by now (the new summary folds the old one in), so a preserved
    // segment never brings back an older boundary or summary.
    let superseded = |i: usize| entries[i].is_compact_boundary() || entries[i].is_compact_summary;
    let mut kept: Vec<usize> = (0..entries.len())
        .filter(|&i| i != b && !(b < i && i < j) && in_segment(i) && !superseded(i))
        .collect();
    kept.sort_by_key(|&i| entries[i].seq_or(i));
    let mut rest: Vec<usize> = (j..entries.len()).filter(|&i| !in_segment(i)).collect();
    rest.sort_by_key(|&i| entries[i].seq_or(i));
    view.extend(kept);
    view.extend(rest);
    (view, boundary_seq)
}

/// Where the last compaction block `provider` reads stands, in an assistant entry: its entry and
/// the block's place in it. Anthropic's server-side summary is read by every provider (as a
/// summary turn by the others); a Responses compaction item by OpenAI Responses only.
pub fn server_compaction(entry: &Entry, provider: Provider) -> Option<usize> {
    // A response never sent (a virtual entry, a synthetic API error) stands for nothing.
    if entry.kind != EntryKind::Assistant || entry.is_virtual || entry.is_api_error {
        return None;
    }
    let Some(Content::Blocks(blocks)) = entry.message.as_ref().map(|m| &m.content) else {
        return None;
    };
    blocks.iter().rposition(|b| compaction_applies(b, provider))
}

/// Whether `provider` reads the compaction block `v` stands for.
pub fn compaction_applies(v: &Value, provider: Provider) -> bool {
    match compaction(v) {
        Some(Compaction::Summary(_)) => true,
        Some(Compaction::Opaque) => provider == Provider::OpenaiResponses,
        None => false,
    }
}

/// Step b'' — a server-side compaction stands for everything before it, as a compact boundary
/// does: the view starts at the last entry holding one the provider reads.
pub fn cut_at_server_compaction(
    entries: &[Entry],
    view: Vec<usize>,
    provider: Provider,
) -> Vec<usize> {
    match view
        .iter()
        .rposition(|&i| server_compaction(&entries[i], provider).is_some())
    {
        Some(at) if at > 0 => view[at..].to_vec(),
        _ => view,
    }
}

/// The uuids the snip entries among `entries` remove.
pub fn snipped_uuids<'a>(entries: impl IntoIterator<Item = &'a Entry>) -> HashSet<&'a str> {
    entries
        .into_iter()
        .filter(|e| e.is_snip())
        .filter_map(|e| e.snip_metadata.as_ref())
        .flat_map(|m| m.removed_uuids.iter().map(String::as_str))
        .collect()
}

/// Step b — hides the entries named by every `snip` entry of the input (`removed_uuids`).
pub fn hide_snipped(entries: &[Entry], view: Vec<usize>) -> Vec<usize> {
    let removed = snipped_uuids(entries);
    if removed.is_empty() {
        return view;
    }
    view.into_iter()
        .filter(|&i| {
            entries[i]
                .uuid
                .as_deref()
                .is_none_or(|u| !removed.contains(u))
        })
        .collect()
}

/// Step b' — hides tombstones ([`Entry::is_erased`]): an erasure took their content. Reports
/// `erased` for each one a model would have read; the passes after it repair what their absence
/// leaves (a `tool_use` without its result, a result without its use) as they repair a missing
/// entry.
pub fn hide_erased(entries: &[Entry], view: Vec<usize>, ctx: &mut Ctx) -> Vec<usize> {
    if !view.iter().any(|&i| entries[i].is_erased()) {
        return view;
    }
    let mut kept = Vec::with_capacity(view.len());
    for i in view {
        let entry = &entries[i];
        if !entry.is_erased() {
            kept.push(i);
        } else if entry.kind.is_model_visible() || entry.kind == EntryKind::Attachment {
            ctx.report(
                RepairKind::Erased,
                [i as u32],
                "an erased entry was left out".to_owned(),
            );
        }
    }
    kept
}

/// A stopping point of `reorderAttachmentsForAPI`: an assistant, or a user whose array content
/// starts with a `tool_result`.
fn is_stopping_point(e: &Entry) -> bool {
    match e.kind {
        EntryKind::Assistant => true,
        EntryKind::User => matches!(
            e.message.as_ref().map(|m| &m.content),
            Some(Content::Blocks(b)) if b.first().and_then(|v| v.get("type")).and_then(Value::as_str) == Some("tool_result")
        ),
        _ => false,
    }
}

/// Step c — `reorderAttachmentsForAPI`: scanning bottom-up, attachments bubble up past plain user
/// prompts, system and progress entries until a stopping point, and are placed right after it in
/// their original order; any still pending at the top go first. `[asst A, user "prompt", att X]`
/// becomes `[A, X, "prompt"]`. Reports `attachment_moved` for each attachment that passed a user
/// entry (moving past system/progress entries is invisible to the model).
pub fn reorder_attachments(entries: &[Entry], view: Vec<usize>, ctx: &mut Ctx) -> Vec<usize> {
    if !view
        .iter()
        .any(|&i| entries[i].kind == EntryKind::Attachment)
    {
        return view;
    }
    let mut out = Vec::with_capacity(view.len());
    // (index, users passed when collected)
    let mut pending: Vec<(usize, usize)> = Vec::new();
    let mut passed = 0usize;
    let mut moved = Vec::new();
    let flush = |pending: &mut Vec<(usize, usize)>,
                 out: &mut Vec<usize>,
                 moved: &mut Vec<(usize, usize)>,
                 passed: usize| {
        for (i, at) in pending.drain(..) {
            if passed > at {
                moved.push((i, passed - at));
            }
            out.push(i);
        }
    };
    for &i in view.iter().rev() {
        let e = &entries[i];
        if e.kind == EntryKind::Attachment {
            pending.push((i, passed));
            continue;
        }
        if is_stopping_point(e) {
            flush(&mut pending, &mut out, &mut moved, passed);
        } else if e.kind == EntryKind::User && !pending.is_empty() {
            passed += 1;
        }
        out.push(i);
    }
    flush(&mut pending, &mut out, &mut moved, passed);
    out.reverse();
    moved.sort_unstable();
    for (i, n) in moved {
        ctx.report(
            RepairKind::AttachmentMoved,
            [i as u32],
            format!("attachment moved up before {n} user message(s)"),
        );
    }
    out
}

/// Step d — drops virtual (display-only) entries. Loupe drops any entry with `is_virtual`, not
/// only user/assistant ones: the model documents the flag as "never sent to the model".
pub fn drop_virtual(entries: &[Entry], view: Vec<usize>) -> Vec<usize> {
    view.into_iter()
        .filter(|&i| !entries[i].is_virtual)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::super::testutil::*;
    use super::*;
    use serde_json::json;

    fn seqs(entries: &[Entry], view: &[usize]) -> Vec<i64> {
        view.iter().map(|&i| entries[i].seq.unwrap()).collect()
    }

    #[test]
    fn no_boundary_keeps_everything() {
        let e = vec![user(0, json!("a")), asst(1, "X", json!([text("b")]))];
        assert_eq!(slice_after_boundary(&e), (vec![0, 1], None));
    }

    #[test]
    fn slices_at_last_boundary_inclusive() {
        let e = vec![
            user(0, json!("a")),
            system(1, "compact_boundary", json!("Conversation compacted")),
            user(2, json!("b")),
            system(3, "compact_boundary", json!("Conversation compacted")),
            user(4, json!("c")),
        ];
        let (view, b) = slice_after_boundary(&e);
        assert_eq!(b, Some(3));
        assert_eq!(seqs(&e, &view), vec![3, 4]);
    }

    #[test]
    fn preserved_segment_is_reinserted_after_summaries() {
        let mut boundary = system(5, "compact_boundary", json!("Conversation compacted"));
        boundary.compact_metadata =
            Some(json!({"preserved_segment": {"first_seq": 2, "last_seq": 3}}));
        let mut summary = user(6, json!("Summary"));
        summary.is_compact_summary = true;
        let e = vec![
            user(0, json!("old")),
            asst(1, "X", json!([text("old")])),
            user(2, json!("kept prompt")),
            asst(3, "Y", json!([text("kept answer")])),
            user(4, json!("dropped")),
            boundary,
            summary,
            attachment(7, json!([text("file")])),
            user(8, json!("next")),
        ];
        let (view, b) = slice_after_boundary(&e);
        assert_eq!(b, Some(5));
        assert_eq!(seqs(&e, &view), vec![5, 6, 2, 3, 7, 8]);
    }

    #[test]
    fn a_preserved_segment_never_brings_back_an_older_boundary_or_summary() {
        let mut old_boundary = system(2, "compact_boundary", json!("Conversation compacted"));
        old_boundary.compact_metadata =
            Some(json!({"preserved_segment": {"first_seq": 0, "last_seq": 1}}));
        let mut old_summary = user(3, json!("Old summary"));
        old_summary.is_compact_summary = true;
        let mut boundary = system(6, "compact_boundary", json!("Conversation compacted"));
        boundary.compact_metadata =
            Some(json!({"preserved_segment": {"first_seq": 1, "last_seq": 5}}));
        let mut summary = user(7, json!("New summary"));
        summary.is_compact_summary = true;
        let e = vec![
            user(0, json!("old")),
            asst(1, "X", json!([text("kept from before")])),
            old_boundary,
            old_summary,
            user(4, json!("p")),
            asst(5, "Y", json!([text("kept")])),
            boundary,
            summary,
            user(8, json!("next")),
        ];
        let (view, _) = slice_after_boundary(&e);
        assert_eq!(seqs(&e, &view), vec![6, 7, 1, 4, 5, 8]);
    }

    #[test]
    fn hides_snipped_uuids_from_every_snip() {
        let mut s1 = system(3, "snip", json!(""));
        s1.snip_metadata = Some(crate::history::SnipMetadata {
            removed_uuids: vec!["u1".into()],
        });
        let mut s2 = system(4, "snip", json!(""));
        s2.snip_metadata = Some(crate::history::SnipMetadata {
            removed_uuids: vec!["u2".into()],
        });
        let e = vec![
            user(0, json!("a")),
            user(1, json!("b")),
            user(2, json!("c")),
            s1,
            s2,
        ];
        let view = hide_snipped(&e, (0..5).collect());
        assert_eq!(seqs(&e, &view), vec![0, 3, 4]);
    }

    #[test]
    fn attachments_bubble_up_to_stopping_point() {
        // [asst A, user "prompt", att X] → [A, X, "prompt"]
        let e = vec![
            asst(0, "A", json!([text("a")])),
            user(1, json!("prompt")),
            attachment(2, json!([text("x")])),
        ];
        let mut ctx = Ctx::new(&e);
        let view = reorder_attachments(&e, vec![0, 1, 2], &mut ctx);
        assert_eq!(seqs(&e, &view), vec![0, 2, 1]);
        assert_eq!(kinds(&ctx), vec![RepairKind::AttachmentMoved]);
    }

    #[test]
    fn attachments_keep_order_and_stop_at_tool_result_users() {
        let e = vec![
            user(0, json!([tr("a"), text("x")])),
            user(1, json!("prompt")),
            entry(json!({"seq": 2, "type": "progress"})),
            attachment(3, json!([text("x1")])),
            attachment(4, json!([text("x2")])),
        ];
        let mut ctx = Ctx::new(&e);
        let view = reorder_attachments(&e, (0..5).collect(), &mut ctx);
        assert_eq!(seqs(&e, &view), vec![0, 3, 4, 1, 2]);
        assert_eq!(ctx.repairs.len(), 2);
    }

    #[test]
    fn pending_attachments_go_to_the_top_and_unmoved_are_not_reported() {
        let e = vec![user(0, json!("prompt")), attachment(1, json!([text("x")]))];
        let mut ctx = Ctx::new(&e);
        assert_eq!(
            seqs(&e, &reorder_attachments(&e, vec![0, 1], &mut ctx)),
            vec![1, 0]
        );
        let e2 = vec![asst(0, "A", json!([])), attachment(1, json!([text("x")]))];
        let mut ctx2 = Ctx::new(&e2);
        assert_eq!(
            seqs(&e2, &reorder_attachments(&e2, vec![0, 1], &mut ctx2)),
            vec![0, 1]
        );
        assert!(ctx2.repairs.is_empty());
    }

    #[test]
    fn drops_virtual_entries() {
        let mut v = user(1, json!("v"));
        v.is_virtual = true;
        let e = vec![user(0, json!("a")), v];
        assert_eq!(drop_virtual(&e, vec![0, 1]), vec![0]);
    }

    /// Anthropic's server-side compaction stands for what came before it: its own provider gets
    /// the block first, verbatim; the others read its summary as a user turn. A compaction that
    /// failed (`content: null`) stands for nothing.
    #[test]
    fn a_server_side_compaction_replaces_what_it_summarizes() {
        use super::super::testutil::{asst, text, user};
        use super::super::{normalize, NormalizeOptions, RepairKind};
        let compaction = json!({"type": "compaction", "content": "We chose SQLite for the cache."});
        let entries = vec![
            user(0, json!("Which database for the cache?")),
            asst(
                1,
                "msg_1",
                json!([text("Let me compare SQLite and Redis at length.")]),
            ),
            user(2, json!("Go on.")),
            asst(
                3,
                "msg_2",
                json!([compaction.clone(), text("Next, the schema.")]),
            ),
            user(4, json!("And the schema?")),
        ];
        let anthropic = normalize(&entries, &NormalizeOptions::default());
        assert_eq!(
            anthropic.messages,
            [
                json!({"role": "assistant", "content": [compaction, text("Next, the schema.")]}),
                json!({"role": "user", "content": [text("And the schema?")]}),
            ]
        );
        assert!(anthropic.repairs.is_empty(), "{:?}", anthropic.repairs);
        for provider in OTHER_PROVIDERS {
            let n = normalize_for(&entries, provider);
            let sent = sent_json(&n);
            assert!(sent.contains("We chose SQLite for the cache."), "{sent}");
            assert!(sent.contains("Next, the schema."), "{sent}");
            assert!(
                !sent.contains("at length"),
                "{provider:?} re-sent the summarized: {sent}"
            );
            assert!(
                n.repairs
                    .iter()
                    .any(|r| r.kind == RepairKind::BlockRenderedAsText && r.seqs == [3]),
                "{:?}",
                n.repairs
            );
        }
        let mut failed = entries.clone();
        failed[3] = asst(
            3,
            "msg_2",
            json!([{"type": "compaction", "content": null}, text("Next.")]),
        );
        let n = normalize(&failed, &NormalizeOptions::default());
        assert!(serde_json::to_string(&n.messages)
            .unwrap()
            .contains("at length"));
    }

    /// A compaction that never reached the model (a virtual entry, an API error) stands for
    /// nothing; an Anthropic one that failed (no `content`, a `signature`) neither, even for
    /// Responses.
    #[test]
    fn compactions_that_stand_for_nothing_cut_nothing() {
        use super::super::testutil::{asst, normalize_for, sent_json, text, user};
        let mut hidden = asst(
            2,
            "msg_2",
            json!([{"type": "compaction", "content": "S"}, text("x")]),
        );
        hidden.is_virtual = true;
        let failed = asst(
            2,
            "msg_2",
            json!([{"type": "compaction", "encrypted_content": "E", "signature": "sig"}, text("x")]),
        );
        for compaction in [hidden, failed] {
            let entries = vec![
                user(0, json!("first question")),
                asst(1, "msg_1", json!([text("first answer")])),
                compaction,
                user(3, json!("next")),
            ];
            for provider in [Provider::Anthropic, Provider::OpenaiResponses] {
                let sent = sent_json(&normalize_for(&entries, provider));
                assert!(sent.contains("first answer"), "{provider:?}: {sent}");
            }
        }
    }

    /// An OpenAI Responses compaction item is opaque: Responses gets it first, verbatim; to
    /// another provider it means nothing, so the history it stands for is sent instead.
    #[test]
    fn a_responses_compaction_item_is_read_by_responses_only() {
        use super::super::testutil::{asst, text, user};
        use super::super::{normalize, NormalizeOptions};
        let item =
            json!({"type": "compaction", "id": "cmp_1", "encrypted_content": "gAAAA-opaque"});
        let entries = vec![
            user(0, json!("Summarize the incident.")),
            asst(1, "msg_1", json!([text("The outage began at 09:12.")])),
            asst(2, "msg_2", json!([item.clone(), text("Continuing.")])),
            user(3, json!("What next?")),
        ];
        let responses = normalize(
            &entries,
            &NormalizeOptions {
                provider: Provider::OpenaiResponses,
                ..Default::default()
            },
        );
        assert_eq!(responses.messages[0], item);
        assert!(!serde_json::to_string(&responses.messages)
            .unwrap()
            .contains("09:12"));
        for provider in [Provider::Anthropic, Provider::Openai, Provider::Gemini] {
            let n = normalize_for(&entries, provider);
            let sent = sent_json(&n);
            assert!(sent.contains("09:12"), "{provider:?}: {sent}");
            assert!(!sent.contains("gAAAA-opaque"), "{provider:?}: {sent}");
        }
    }
}
