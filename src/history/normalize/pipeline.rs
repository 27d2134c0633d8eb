//! The passes of the pipeline in order (the module docs of [`super`] list them with their file),
//! shared by a plain [`super::normalize`] and by a read resumed after a checkpoint
//! ([`super::incremental`]).
//!
//! Each pass is followed by the [`Seam`]'s `pass_done`: it closes the pass's stage of repairs
//! and, in a resumed run, checks that the pass could not have reached across into the prefix.
//! The few passes that look at the whole request (media counts and sizes, the loop in progress,
//! the first turn) take what the prefix holds from the seam. A run from the start of the view
//! passes every check.

use serde_json::Value;

use super::thinking::LoopOpener;
use super::{
    advisor, cache, cleanup, clearing, convert, enforce, gemini, media, merge, microcompact,
    native, output, pairing, responses, thinking, tool_reference, view, Ctx, Fallback, Msg,
    NormalizeOptions, PassEnd, Provider, ThinkingMode,
};
use crate::history::model::Entry;

/// Where a run starts, as [`run`] asks it: at the start of the view, or after a checkpointed
/// prefix (`incremental` implements it). Besides ending each pass ([`PassEnd`]), it gives the
/// view's entries and the passes over the whole request what the prefix holds, and checks that
/// nothing of the run reaches into the prefix; a check that fails ends the run with a
/// [`Fallback`].
pub trait Seam: PassEnd {
    /// The view's entries (indices into `entries`) and the boundary the view starts at.
    fn view(&self, entries: &[Entry]) -> Result<(Vec<usize>, Option<i64>), Fallback>;
    /// The view once snips are applied.
    fn check_view(&self, entries: &[Entry], view: &[usize]) -> Result<(), Fallback>;
    /// The messages as converted, before any merge or pairing.
    fn converted(&mut self, msgs: &[Msg]) -> Result<(), Fallback>;
    /// Before the media cap.
    fn count_media_items(&mut self, msgs: &[Msg]) -> Result<(), Fallback>;
    /// Whether the request holds more than [`media::MANY_IMAGES`] images.
    fn many_images(&mut self, msgs: &[Msg]) -> Result<bool, Fallback>;
    /// The request's size, when it is over [`media::MAX_REQUEST_BYTES`] with media to refuse.
    fn oversized_request(&mut self, msgs: &[Msg]) -> Result<Option<usize>, Fallback>;
    /// Whether the messages follow a user turn, so the first is not the first.
    fn after_user_turn(&self) -> bool;
    /// The turn that opened the tool loop in progress before the run.
    fn loop_opener(&self) -> Option<&LoopOpener>;
    /// With clearing, the sizes of the results before the run the rule had left whole.
    fn clearing_carried(&self) -> &[u64];
    /// After the last pass.
    fn check_end(&self, msgs: &[Msg], opts: &NormalizeOptions) -> Result<(), Fallback>;
}

/// Steps 1–13: the entries → the final working messages, and the boundary the view starts at.
pub fn run(
    entries: &[Entry],
    opts: &NormalizeOptions,
    seam: &mut impl Seam,
    ctx: &mut Ctx,
) -> Result<(Vec<Msg>, Option<i64>), Fallback> {
    let (view, boundary) = seam.view(entries)?;
    let view = view::hide_snipped(entries, view);
    let view = view::hide_erased(entries, view, ctx);
    let view = view::cut_at_server_compaction(entries, view, opts.provider);
    // A stage of its own: a run resumed from a checkpoint reports the prefix's repairs, then
    // the tail's, stage by stage, so the plain run's order is kept only between stages.
    ctx.end_stage();
    seam.check_view(entries, &view)?;
    let view = view::reorder_attachments(entries, view, ctx);
    ctx.end_stage();
    let view = view::drop_virtual(entries, view);
    let strip = media::build_strip_map(entries, &view);
    let msgs = convert::to_messages(entries, &view, &strip, opts, ctx);
    seam.converted(&msgs)?;
    seam.pass_done(&msgs, ctx)?;
    let msgs = tool_reference::strip_tool_references(msgs, opts.tools.as_deref(), ctx);
    seam.pass_done(&msgs, ctx)?;
    let msgs = merge::merge_messages(msgs, ctx);
    seam.pass_done(&msgs, ctx)?;
    let msgs = cleanup::run_passes(msgs, ctx, seam)?;
    let mut msgs = pairing::ensure_tool_result_pairing(msgs, ctx);
    seam.pass_done(&msgs, ctx)?;
    // Other providers read the advisor's answers as text, where they stood.
    if !opts.advisor && opts.provider == Provider::Anthropic {
        advisor::strip_advisor_blocks(&mut msgs, ctx);
    }
    seam.pass_done(&msgs, ctx)?;
    native::render_foreign(&mut msgs, opts.provider, ctx);
    seam.pass_done(&msgs, ctx)?;
    media::refuse_unacceptable(&mut msgs, ctx);
    seam.pass_done(&msgs, ctx)?;
    seam.count_media_items(&msgs)?;
    media::strip_excess_media(&mut msgs, media::MAX_MEDIA_ITEMS, ctx);
    seam.pass_done(&msgs, ctx)?;
    if seam.many_images(&msgs)? {
        media::refuse_large_images_of_many(&mut msgs, ctx);
    }
    seam.pass_done(&msgs, ctx)?;
    if let Some(total) = seam.oversized_request(&msgs)? {
        media::refuse_oldest_until_fits(&mut msgs, total, ctx);
    }
    seam.pass_done(&msgs, ctx)?;
    let mut msgs = enforce::run(msgs, opts.provider, seam.after_user_turn(), ctx, seam)?;
    if opts.thinking == ThinkingMode::Enabled && opts.provider == Provider::Anthropic {
        thinking::close_loop_after(&mut msgs, seam.loop_opener(), ctx);
    }
    seam.pass_done(&msgs, ctx)?;
    if let Some(clearing) = &opts.clearing {
        // Before micro-compaction, whose placeholders appear as its recent calls move on: what
        // this pass counts is then the same at every read.
        if clearing::clear_old_results(&mut msgs, clearing, seam.clearing_carried(), ctx).is_none()
        {
            return Err(Fallback(
                "the checkpoint cleared results this window sends whole",
            ));
        }
    }
    seam.pass_done(&msgs, ctx)?;
    if let Some(mc) = &opts.microcompact {
        // Last content rewrite, so a placeholder written by an earlier step is never cleared only
        // on a second pass (idempotence).
        microcompact::microcompact(&mut msgs, mc, ctx);
    }
    seam.pass_done(&msgs, ctx)?;
    seam.check_end(&msgs, opts)?;
    Ok((msgs, boundary))
}

/// Step 14: the messages in the provider's shape. `last`: they end the request, so the Anthropic
/// cache breakpoint goes on their last block. Gemini contents come unsigned: the caller signs the
/// current turn ([`gemini::sign_current_turn`]), which may begin before these messages.
pub fn render(
    mut msgs: Vec<Msg>,
    opts: &NormalizeOptions,
    last: bool,
    ctx: &mut Ctx,
) -> Vec<Value> {
    match opts.provider {
        Provider::Anthropic => {
            cache::add_cache_breakpoint(&mut msgs, opts.cache && last);
            output::to_anthropic(msgs)
        }
        Provider::Openai => output::to_openai(msgs, ctx),
        Provider::OpenaiResponses => responses::to_responses(msgs, ctx),
        Provider::Gemini => gemini::unsigned_contents(msgs, ctx),
    }
}
