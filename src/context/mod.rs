//! The context read: a thread's window normalized for one provider, answered the cheapest way
//! that gives the plain pipeline's answer. The handler (`http::context`) parses the options,
//! reads the thread's head, takes its turn in the window budget and a slot, then calls
//! [`ContextReader::read`] and sends what it answers.
//!
//! | strategy | taken when | reads | falls back to | proved equal to the plain read by |
//! |---|---|---|---|---|
//! | plain | the cache is off (`--context-cache-bytes 0`) | the window at once | — | it is the reference |
//! | continued (`continue_read`) | the cache holds a checkpoint for the thread and options | the tail after the checkpoint | paged | `tests/api/context_cache.rs`, `normalize_incremental` (properties) |
//! | paged (`ContextReader::paged_read`) | no checkpoint (one read per key at a time: [`cache::ContextCache::first_read_turn`]) | the window a page at a time, each going on from the last page's cut | full | `normalize_incremental::read_in_pages` (property), `context_cache.rs` |
//! | full (`full_read`) | pages that cannot go on from each other, or a thread that changed between pages | the window at once | — | `context_cache.rs` |
//! | outline | `view=outline` | the stored outline, and the window from its boundary | — | `tests/api/tree.rs` |
//!
//! Every strategy but the plain one leaves a checkpoint in the cache when the window holds a cut,
//! so the next read of the thread normalizes only what was appended since.

pub mod answer;
pub mod cache;

use std::future::Future;
use std::sync::Arc;

use serde_json::Value;

pub use answer::{ContextAnswer, ContextResponse, OutlineRef};
use cache::{CachedContext, ContextCache, ContextKey};

use crate::history::model::Entry;
use crate::history::normalize::incremental::{Advance, Checkpoint, PagedRead};
use crate::history::normalize::Fallback;
use crate::history::normalize::LearnedOverheads;
use crate::history::{normalize, NormalizeOptions};
use crate::store::{
    ContextHead, ContextTail, ContextWindow, Seq, Store, StoreError, TenantId, ThreadId,
    WindowBounds,
};

/// Most pages' worth of entries a paged read keeps waiting for a cut before it reads the whole
/// window instead: each page normalizes the waiting entries again, so a window without cuts
/// costs 1 + 2 + … pages of work before it gives up.
const MAX_PENDING_PAGES: usize = 2;

/// Why a read has no answer.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("view=outline needs outline mode: set `outline.enabled` in the thread's settings")]
    OutlineDisabled,
    /// A bug: the answer did not serialize, CPU work panicked.
    #[error("{0}")]
    Internal(String),
}

/// Where a read's CPU work runs: off the threads that serve requests, holding whatever bounds it
/// (the request's expensive slot) until the work ends.
pub trait Offload: Sync {
    fn offload<T: Send + 'static>(
        &self,
        work: impl FnOnce() -> T + Send + 'static,
    ) -> impl Future<Output = Result<T, ReadError>> + Send;
}

/// A context read's answer.
pub enum ContextRead {
    /// Sent from a checkpoint, its prefix piece by piece ([`ContextAnswer::pieces`]).
    Streamed(ContextAnswer),
    /// Built whole: the plain and the outlined reads.
    Whole(ContextResponse),
}

/// What one try of a strategy gave.
enum Attempt {
    Answered(ContextAnswer),
    /// It cannot answer this read: the next strategy down does.
    FellBack(Fallback),
}

/// Which context a read answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum View {
    /// The messages after the last compact boundary.
    Window,
    /// The outline's lines, then the messages from its boundary on.
    Outline,
}

/// The context read's parts: the store, the shared cache, the page size, where CPU work runs.
pub struct ContextReader<'a, O> {
    pub store: &'a Store,
    pub cache: &'a Arc<ContextCache>,
    /// Entries a paged read reads at once.
    pub page_entries: usize,
    pub offload: &'a O,
    /// The tenant's learned overheads, which a content-only estimate adds (empty when the
    /// thread's window has `usage`).
    pub overheads: LearnedOverheads,
}

impl<O: Offload> ContextReader<'_, O> {
    /// The context of `thread_id` from `head` (read before, with the options' thread settings
    /// filled in).
    pub async fn read(
        &self,
        tenant: &TenantId,
        thread_id: &ThreadId,
        head: ContextHead,
        view: View,
        options: NormalizeOptions,
    ) -> Result<ContextRead, ReadError> {
        if view == View::Outline {
            let outline = head.settings.outline.unwrap_or_default();
            return self
                .outline_read(tenant, thread_id, &outline, &options)
                .await
                .map(ContextRead::Whole);
        }
        let cache = self.cache.clone();
        // With the cache off, the plain pipeline, kept apart from the checkpoint's path on
        // purpose: it is the reference the cached answers are tested against.
        if !cache.is_enabled() {
            return self
                .plain_read(&head, options)
                .await
                .map(ContextRead::Whole);
        }
        let key = ContextKey::new(tenant, thread_id, &options, head.redaction_epoch);
        if let Some(answer) = self.cached_read(&head, &key, &options).await? {
            return Ok(ContextRead::Streamed(answer));
        }
        // No checkpoint. Of concurrent reads of one key, one reads the window; the others wait
        // for it, then go on from the checkpoint it left, from the thread's head as it is now.
        // So a burst of first reads reads the window once. A read that waited and still finds
        // none (the window leaves no checkpoint) reads the window itself, without waiting again.
        let turn = cache.first_read_turn(&key).await;
        let head = match turn {
            Some(_) => head,
            None => {
                let head = self.store.context_head(tenant, thread_id).await?;
                if let Some(answer) = self.cached_read(&head, &key, &options).await? {
                    return Ok(ContextRead::Streamed(answer));
                }
                head
            }
        };
        let answer = self
            .paged_read(tenant, thread_id, &head, options, key)
            .await;
        drop(turn);
        answer.map(ContextRead::Streamed)
    }

    /// The plain pipeline: the window at once, normalized from scratch.
    async fn plain_read(
        &self,
        head: &ContextHead,
        options: NormalizeOptions,
    ) -> Result<ContextResponse, ReadError> {
        let bounds = self.store.context_bounds(head).await?;
        let window = self.store.window_entries(bounds).await?;
        let context_tokens = crate::history::normalize::estimate_context(&window.entries)
            .with_learned(&self.overheads, options.model.as_deref());
        let entries = window.entries;
        let tools = offered_tools(&options, 0);
        let normalized = self
            .offload
            .offload(move || normalize(&entries, &options))
            .await?;
        Ok(ContextResponse {
            normalized,
            next_seq: window.next_seq,
            context_tokens,
            tools,
            outline: None,
        })
    }

    /// A read that goes on from the key's checkpoint, if the cache holds one that can answer.
    async fn cached_read(
        &self,
        head: &ContextHead,
        key: &ContextKey,
        options: &NormalizeOptions,
    ) -> Result<Option<ContextAnswer>, ReadError> {
        let cache = self.cache;
        // A head read after an erasure never goes on from a checkpoint made before it.
        if key.epoch() != head.redaction_epoch {
            return Ok(None);
        }
        let Some(cached) = cache.get(key) else {
            return Ok(None);
        };
        let tail = match cached.checkpoint.resume_seq() {
            Some(resume) => Some(
                self.store
                    .context_tail(head, Seq::new(resume), cached.window_start)
                    .await?,
            ),
            None => None,
        };
        if let Some(tail) = tail.filter(|tail| tail.thread_key == cached.thread_key) {
            let (shared, key, options) = (cache.clone(), key.clone(), options.clone());
            let learned = self.overheads.clone();
            let read = self
                .offload
                .offload(move || continue_read(cached, tail, &options, &learned, &shared, key))
                .await??;
            match read {
                Attempt::Answered(answer) => {
                    cache.record_hit();
                    return Ok(Some(answer));
                }
                Attempt::FellBack(Fallback(reason)) => {
                    crate::metrics::context_fallback("incremental", reason)
                }
            }
        }
        // The checkpoint could not answer (another thread of that id, or a tail that changes
        // it): no later read should try it again. The full read after this leaves a new one when
        // it can.
        drop(cache.take(key));
        Ok(None)
    }

    /// A read that finds no checkpoint: the window a page at a time ([`PagedRead`]), so what it
    /// holds parsed is a page, not the window. The pages are read up to the end `head` saw, so
    /// an append meanwhile does not land in the answer without its `next_seq`. When the pages
    /// cannot be read so (a later page changes what an earlier one normalized), the whole window
    /// within the same bounds is read at once; when the thread went meanwhile, it is read again
    /// from its head. Either way the read leaves a checkpoint when it can.
    async fn paged_read(
        &self,
        tenant: &TenantId,
        thread_id: &ThreadId,
        head: &ContextHead,
        options: NormalizeOptions,
        key: ContextKey,
    ) -> Result<ContextAnswer, ReadError> {
        let bounds = self.store.context_bounds(head).await?;
        let page_entries = self.page_entries.max(1);
        let mut read = PagedRead::new(options.clone(), page_entries * MAX_PENDING_PAGES);
        let mut from = bounds.start_seq;
        // The first page reaches the boundary: a segment the boundary preserves lies before it,
        // and a boundary in a later page would make the pages fall back.
        let first_end = bounds.boundary_seq().map_or(0, |seq| seq.saturating_add(1));
        let mut pages = 0;
        loop {
            pages += 1;
            let mut to = from.saturating_add(page_entries as i64);
            if pages == 1 {
                to = to.max(first_end);
            }
            let to = to.min(bounds.next_seq);
            let page = self.store.window_page(&bounds, from, to).await?;
            if page.len() as i64 != to - from {
                // Seqs are dense: a page short of entries means the thread went (deleted, or
                // deleted and made again) while it was read. The whole read answers what is
                // there now.
                crate::metrics::context_fallback("paged", "the thread changed between pages");
                let window = self.store.context_window(tenant, thread_id, None).await?;
                return self.full(window, options, key).await;
            }
            if to >= bounds.next_seq {
                let (cache, key, bounds) = (self.cache.clone(), key.clone(), bounds.clone());
                let learned = self.overheads.clone();
                let answer = self
                    .offload
                    .offload(move || finish_read(read, page, &bounds, pages, &learned, &cache, key))
                    .await??;
                if let Attempt::Answered(answer) = answer {
                    return Ok(answer);
                }
                break;
            }
            let fed = self
                .offload
                .offload(move || {
                    let fed = read.feed(page);
                    fed.map(|()| read)
                })
                .await?;
            match fed {
                Ok(fed) => read = fed,
                Err(Fallback(reason)) => {
                    crate::metrics::context_fallback("paged", reason);
                    break;
                }
            }
            from = to;
        }
        let window = self.store.window_entries(bounds).await?;
        self.full(window, options, key).await
    }

    async fn full(
        &self,
        window: ContextWindow,
        options: NormalizeOptions,
        key: ContextKey,
    ) -> Result<ContextAnswer, ReadError> {
        let cache = self.cache.clone();
        let learned = self.overheads.clone();
        self.offload
            .offload(move || full_read(window, &options, &learned, &cache, key))
            .await?
    }

    /// The outlined context: the stored outline's lines, then the messages from its boundary on.
    async fn outline_read(
        &self,
        tenant: &TenantId,
        thread_id: &ThreadId,
        outline: &crate::tree::OutlineOptions,
        options: &NormalizeOptions,
    ) -> Result<ContextResponse, ReadError> {
        if !outline.enabled {
            return Err(ReadError::OutlineDisabled);
        }
        let snapshot = self.store.outline_snapshot(tenant, thread_id).await?;
        let boundary = snapshot.outline.boundary();
        let window = self
            .store
            .context_window(tenant, thread_id, Some(Seq::new(boundary as i64)))
            .await?;
        let context_tokens = crate::history::normalize::estimate_context(&window.entries)
            .with_learned(&self.overheads, options.model.as_deref());
        let (version, line_count) = (snapshot.version, snapshot.lines.len());
        let (lines, footer, render_options) = (snapshot.lines, snapshot.footer, options.clone());
        let normalized = self
            .offload
            .offload(move || {
                crate::tree::view::outlined_context(
                    &lines,
                    &footer,
                    window.entries,
                    &render_options,
                )
            })
            .await?;
        Ok(ContextResponse {
            normalized,
            next_seq: window.next_seq,
            context_tokens,
            tools: offered_tools(options, line_count),
            outline: Some(OutlineRef {
                boundary,
                lines: line_count,
                version,
            }),
        })
    }
}

/// [`ContextReader::paged_read`]'s last page: the answer, and the checkpoint left in the cache.
fn finish_read(
    read: PagedRead,
    last: Vec<Entry>,
    bounds: &WindowBounds,
    pages: usize,
    learned: &LearnedOverheads,
    cache: &Arc<ContextCache>,
    key: ContextKey,
) -> Result<Attempt, ReadError> {
    let (checkpoint, run, moved) = match read.finish(last) {
        Ok(done) => done,
        Err(fallback) => {
            crate::metrics::context_fallback("paged", fallback.0);
            return Ok(Attempt::FellBack(fallback));
        }
    };
    if moved == Advance::NotReproduced {
        tracing::warn!(
            thread_key = %bounds.thread_key,
            "a paged read's last cut did not reproduce its tail; not cached"
        );
    }
    crate::metrics::context_read(if pages > 1 { "paged" } else { "full" });
    let cached = Arc::new(CachedContext {
        thread_key: bounds.thread_key.clone(),
        window_start: Seq::new(bounds.start_seq),
        checkpoint,
    });
    let answer = ContextAnswer::new(
        &run,
        cached.clone(),
        bounds.next_seq,
        key.options(),
        learned,
    )?;
    // An earlier page may have moved it even when the last did not.
    if cached.checkpoint.resume_seq().is_some() && moved != Advance::NotReproduced {
        cache.put(key, cached);
    }
    Ok(Attempt::Answered(answer))
}

/// A read that goes on from the thread's cached checkpoint: only `tail` (the entries after it) is
/// normalized. When the tail holds a new cut, the checkpoint moves on and goes back into the
/// cache; otherwise the read answers from the shared checkpoint as it is, so concurrent reads of a
/// thread never wait for each other. [`Attempt::FellBack`]: the tail could change what the
/// checkpoint holds, so the caller reads the whole window.
fn continue_read(
    cached: Arc<CachedContext>,
    tail: ContextTail,
    options: &NormalizeOptions,
    learned: &LearnedOverheads,
    cache: &Arc<ContextCache>,
    key: ContextKey,
) -> Result<Attempt, ReadError> {
    let run = match cached.checkpoint.continue_with(&tail.entries, options) {
        Ok(run) => run,
        Err(fallback) => return Ok(Attempt::FellBack(fallback)),
    };
    crate::metrics::context_read("incremental");
    if !run.has_cut() {
        return ContextAnswer::new(&run, cached, tail.next_seq, options, learned)
            .map(Attempt::Answered);
    }
    // Moving needs a checkpoint of its own: taken out of the cache, and copied only when another
    // read holds it at this moment.
    drop(cache.take(&key));
    let mut owned = Arc::unwrap_or_clone(cached);
    let (run, moved) = run.advance(&mut owned.checkpoint, &tail.entries);
    let owned = Arc::new(owned);
    let answer = ContextAnswer::new(&run, owned.clone(), tail.next_seq, options, learned)?;
    match moved {
        Advance::NotReproduced => {
            tracing::warn!(
                thread_key = %owned.thread_key,
                "a context checkpoint did not reproduce its tail; dropped"
            );
        }
        // Moved on, or kept where it was: either way it serves the next read.
        Advance::Moved | Advance::NoCut | Advance::FellBack(_) => cache.put(key, owned),
    }
    Ok(Attempt::Answered(answer))
}

/// A read of the whole window at once, from scratch, when [`ContextReader::paged_read`] cannot
/// page it; it
/// leaves a checkpoint in the cache when the window holds a closed round to end one at.
fn full_read(
    window: ContextWindow,
    options: &NormalizeOptions,
    learned: &LearnedOverheads,
    cache: &Arc<ContextCache>,
    key: ContextKey,
) -> Result<ContextAnswer, ReadError> {
    crate::metrics::context_read("full");
    let mut checkpoint = Checkpoint::start();
    let run = checkpoint
        .continue_with(&window.entries, options)
        .map_err(|Fallback(reason)| {
            ReadError::Internal(format!("a read from scratch fell back: {reason}"))
        })?;
    let (run, moved) = run.advance(&mut checkpoint, &window.entries);
    let cached = Arc::new(CachedContext {
        thread_key: window.thread_key,
        window_start: Seq::new(window.start_seq),
        checkpoint,
    });
    let answer = ContextAnswer::new(&run, cached.clone(), window.next_seq, options, learned)?;
    if moved == Advance::Moved {
        cache.put(key, cached);
    }
    Ok(answer)
}

/// The tools Loupe adds to a context: zoom and search, once the outline has a line (`outline_lines`) or
/// whenever the thread clears old results (their stubs name zoom addresses). Offered from the
/// start of clearing rather than at its first batch, so the request's tools, which providers
/// render first, do not change when the first result is cleared.
fn offered_tools(options: &NormalizeOptions, outline_lines: usize) -> Vec<Value> {
    if outline_lines > 0 || options.clearing.is_some() {
        crate::tree::view::navigation_tools(options.provider)
    } else {
        Vec::new()
    }
}
