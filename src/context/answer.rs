//! A context answer: its JSON shape ([`ContextResponse`]), and the answer sent from a checkpoint
//! ([`ContextAnswer`]), whose prefix goes out piece by piece from the shared checkpoint.

use std::sync::Arc;

use serde::Serialize;
use serde_json::Value;
use utoipa::ToSchema;

use super::cache::CachedContext;
use super::ReadError;
use crate::history::normalize::incremental::{NormalizedJson, TailRun};
use crate::history::normalize::{ContextEstimate, LearnedOverheads};
use crate::history::NormalizeOptions;
use crate::history::Normalized;

#[derive(Debug, Serialize, ToSchema)]
pub struct ContextResponse {
    #[serde(flatten)]
    pub normalized: Normalized,
    /// The thread's next seq when the context was read.
    pub next_seq: i64,
    /// The thread's context size in tokens, close to what the provider counts: the figure to
    /// budget by (does the next request fit the model's window, when to compact; the
    /// auto-compaction trigger compares this one with its threshold). `basis: usage` anchors on
    /// the `usage` the last assistant entry after the last boundary reports (input, cache and
    /// output tokens: the provider's own count, system prompt and tools included), plus an
    /// estimate of the content after it; `basis: content` (no usage reported) estimates the
    /// content alone at per-kind rates (code, JSON and tool output 2.5 characters a token,
    /// prose 3.5, CJK one token a character). It sizes the thread's stored window since its
    /// last boundary, not this answer's `messages`. Not to be confused with `estimated_tokens`,
    /// the characters / 4 of `messages` alone, which reads 2–3 times lower on real sessions.
    pub context_tokens: crate::history::normalize::ContextEstimate,
    /// Tools Loupe adds to the request, in the provider's shape, to send beside the caller's
    /// own: `zoom` and `search` (for `gemini`, one tool declaring both functions; for
    /// `openai_responses`, each with `strict: false`), answered by the zoom and search
    /// operations. Offered whenever the thread's settings turn clearing on, from the first read
    /// on (before any result is cleared, so the request's tools do not change when the first
    /// one is), and with `view=outline` once the outline has a line (never before: see
    /// docs/TREE.md on its cache cost); else empty.
    #[schema(value_type = Vec<Object>)]
    pub tools: Vec<Value>,
    /// For `view=outline`: the outline's boundary and version (equal versions, equal prefix).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub outline: Option<OutlineRef>,
}

/// Where the outline ends and which state it was rendered from.
#[derive(Debug, Serialize, ToSchema)]
pub struct OutlineRef {
    /// The outline covers `[0, boundary)`; the messages from `boundary` on follow whole.
    pub boundary: u64,
    pub lines: usize,
    pub version: i64,
}

/// The body of a context answer, written from a checkpoint's serialized prefix and the run over
/// its tail: the JSON of [`ContextResponse`] (without `outline`), not parsed again.
#[derive(Serialize)]
struct ContextBody<'a> {
    #[serde(flatten)]
    normalized: NormalizedJson<'a>,
    next_seq: i64,
    context_tokens: ContextEstimate,
    tools: Vec<Value>,
}

/// How a context body starts: its first field is the messages, the checkpoint's items first.
const MESSAGES_OPEN: &[u8] = br#"{"messages":["#;

/// Bytes of the checkpoint's items per piece of a body: large enough that a long answer goes
/// out in few writes, small beside the answer itself.
const BODY_CHUNK: usize = 256 * 1024;

/// A context answer ready to send. The checkpoint's items, most of a long thread's answer, are
/// copied from the shared checkpoint piece by piece as the body goes out, so the answer is never
/// held whole beside the checkpoint; only the rest (the tail's items and the other fields) is
/// written ahead.
pub struct ContextAnswer {
    cached: Arc<CachedContext>,
    /// Whether the checkpoint's items go out as [`TailRun::signs_prefix`] says.
    signed: bool,
    /// The body after the checkpoint's items: from the tail's first item (or the `]` closing the
    /// messages) to the end.
    rest: Vec<u8>,
}

impl ContextAnswer {
    pub(super) fn new(
        run: &TailRun,
        cached: Arc<CachedContext>,
        next_seq: i64,
        options: &NormalizeOptions,
        learned: &LearnedOverheads,
    ) -> Result<ContextAnswer, ReadError> {
        let body = ContextBody {
            normalized: run.json_without_prefix_items(&cached.checkpoint),
            next_seq,
            context_tokens: run
                .context_estimate()
                .with_learned(learned, options.model.as_deref()),
            tools: super::offered_tools(options, 0),
        };
        let internal = ReadError::Internal;
        let mut written = serde_json::to_vec(&body)
            .map_err(|error| internal(format!("the context did not serialize: {error}")))?;
        if !written.starts_with(MESSAGES_OPEN) {
            return Err(internal("a context body starts with its messages".into()));
        }
        written.drain(..MESSAGES_OPEN.len());
        Ok(ContextAnswer {
            signed: run.signs_prefix(),
            cached,
            rest: written,
        })
    }

    /// The body's pieces, in order: the opening with the checkpoint's items a chunk at a time,
    /// then the rest.
    pub fn pieces(self) -> impl Iterator<Item = Vec<u8>> + Send {
        let ContextAnswer {
            cached,
            signed,
            mut rest,
        } = self;
        let items = cached.checkpoint.prefix_len();
        if items > 0 && !rest.starts_with(b"]") {
            // The tail's first item follows the checkpoint's last.
            rest.insert(0, b',');
        }
        let (mut next, mut opened) = (0, false);
        let chunks = std::iter::from_fn(move || {
            if opened && next >= items {
                return None;
            }
            let mut chunk = Vec::with_capacity(BODY_CHUNK + 4096);
            if !opened {
                chunk.extend_from_slice(MESSAGES_OPEN);
                opened = true;
            }
            while next < items && chunk.len() < BODY_CHUNK {
                if next > 0 {
                    chunk.push(b',');
                }
                let item = cached.checkpoint.prefix_item(next, signed);
                chunk.extend_from_slice(item.get().as_bytes());
                next += 1;
            }
            Some(chunk)
        });
        chunks.chain(std::iter::once(rest))
    }

    /// The body's length in bytes: the opening, the items with the commas between them (and
    /// before the tail's first), the rest.
    pub fn body_len(&self) -> usize {
        let checkpoint = &self.cached.checkpoint;
        let items = checkpoint.prefix_len();
        let item_bytes: usize = (0..items)
            .map(|i| checkpoint.prefix_item(i, self.signed).get().len())
            .sum();
        let joins =
            items.saturating_sub(1) + usize::from(items > 0 && !self.rest.starts_with(b"]"));
        MESSAGES_OPEN.len() + item_bytes + joins + self.rest.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::model::Entry;
    use crate::history::normalize::incremental::{Advance, Checkpoint};
    use crate::history::{normalize, NormalizeOptions, Provider};

    /// The body a [`ContextAnswer`] sends, its pieces joined.
    fn sent(
        run: &TailRun,
        checkpoint: &Checkpoint,
        next_seq: i64,
        options: &NormalizeOptions,
    ) -> String {
        let cached = Arc::new(CachedContext {
            thread_key: crate::store::ThreadKey::from_stored("k".into()),
            window_start: crate::store::Seq::new(0),
            checkpoint: checkpoint.clone(),
        });
        let none = LearnedOverheads::default();
        let answer = ContextAnswer::new(run, cached, next_seq, options, &none).unwrap();
        let length = answer.body_len();
        let bytes: Vec<u8> = answer.pieces().flatten().collect();
        assert_eq!(bytes.len(), length, "the announced length");
        String::from_utf8(bytes).unwrap()
    }

    /// Reads `entries` from scratch, from the checkpoint the read moved to, and after it: each
    /// answer sent must be the JSON of the plain pipeline's `ContextResponse`.
    fn check_sent_bodies(entries: &[Entry], options: &NormalizeOptions) {
        let next_seq = entries.len() as i64;
        let expected = serde_json::to_string(&ContextResponse {
            normalized: normalize(entries, options),
            next_seq,
            context_tokens: crate::history::normalize::estimate_context(entries),
            tools: Vec::new(),
            outline: None,
        })
        .unwrap();
        let mut checkpoint = Checkpoint::start();
        let run = checkpoint.continue_with(entries, options).unwrap();
        assert_eq!(
            sent(&run, &checkpoint, next_seq, options),
            expected,
            "from scratch"
        );
        let (moved, advanced) = run.advance(&mut checkpoint, entries);
        assert_eq!(advanced, Advance::Moved, "a cut");
        assert!(checkpoint.prefix_len() > 0);
        assert_eq!(
            sent(&moved, &checkpoint, next_seq, options),
            expected,
            "moved"
        );
        let tail = &entries[checkpoint.resume_seq().unwrap() as usize..];
        let run = checkpoint.continue_with(tail, options).unwrap();
        assert_eq!(
            sent(&run, &checkpoint, next_seq, options),
            expected,
            "after"
        );
    }

    #[test]
    fn the_sent_body_is_the_context_response() {
        let entries: Vec<Entry> = serde_json::from_value(serde_json::json!([
            {"seq": 0, "uuid": "a", "type": "user", "message": {"role": "user", "content": "go"}},
            {"seq": 1, "uuid": "b", "type": "assistant", "message": {"role": "assistant", "id": "m1",
                "content": [{"type": "tool_use", "id": "t1", "name": "Bash", "input": {}}]}},
            {"seq": 2, "uuid": "c", "type": "user", "message": {"role": "user",
                "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "ok"}]}},
            {"seq": 3, "uuid": "d", "type": "assistant", "message": {"role": "assistant", "id": "m2",
                "content": [{"type": "text", "text": " "}, {"type": "tool_use", "id": "t2", "name": "Bash", "input": {}}]}},
        ]))
        .unwrap();
        for provider in [
            Provider::Anthropic,
            Provider::Openai,
            Provider::OpenaiResponses,
            Provider::Gemini,
        ] {
            let options = NormalizeOptions {
                provider,
                cache: true,
                ..NormalizeOptions::default()
            };
            check_sent_bodies(&entries, &options);
        }
    }

    #[test]
    fn a_long_prefix_is_sent_in_several_pieces() {
        let text = "The parser reads the amount and rounds half to even. ".repeat(6);
        let entries: Vec<Entry> = (0..3_000)
            .map(|i| {
                let entry = if i % 2 == 0 {
                    serde_json::json!({"seq": i, "uuid": format!("u{i}"), "type": "user",
                        "message": {"role": "user", "content": text}})
                } else {
                    serde_json::json!({"seq": i, "uuid": format!("a{i}"), "type": "assistant",
                        "message": {"role": "assistant", "id": format!("m{i}"),
                            "content": [{"type": "text", "text": text}]}})
                };
                serde_json::from_value(entry).unwrap()
            })
            .collect();
        let options = NormalizeOptions::default();
        let mut checkpoint = Checkpoint::start();
        let run = checkpoint.continue_with(&entries, &options).unwrap();
        let (run, _) = run.advance(&mut checkpoint, &entries);
        let cached = Arc::new(CachedContext {
            thread_key: crate::store::ThreadKey::from_stored("k".into()),
            window_start: crate::store::Seq::new(0),
            checkpoint: checkpoint.clone(),
        });
        let pieces: Vec<Vec<u8>> =
            ContextAnswer::new(&run, cached, 3_000, &options, &LearnedOverheads::default())
                .unwrap()
                .pieces()
                .collect();
        assert!(pieces.len() > 3, "{} pieces", pieces.len());
        assert!(pieces.iter().all(|p| p.len() < BODY_CHUNK + 4096));
        check_sent_bodies(&entries, &options);
    }
}
