//! The context size estimate (`docs/NORMALIZATION.md` § Token estimate): the provider's own
//! count of the last request (`usage`), plus the content after it, counted by per-kind rates that
//! each window calibrates per model from its own usage deltas; and an upper bound.
//!
//! Why deltas: between two responses of one model, the prompt grows by exactly what was added
//! in between (the first response's output, then the entries after it), while the hidden part
//! (system prompt, tools) cancels. So each pair of anchors is a sample of how many tokens the
//! model's tokenizer makes of each kind of content, free of what no entry holds.

use serde_json::Value;

use super::blocks::{block_type, compaction, str_field, Compaction};
use super::tokens::{model_content, text_split, usage_tokens, ModelContent, Usage};
use crate::history::model::{Entry, EntryKind};

/// The calibrated kinds of content, as indexes into [`Features::kinds`].
const RESULTS: usize = 0;
const INPUTS: usize = 1;
const TEXT: usize = 2;
const CJK: usize = 3;
/// Framing: one per entry and one per block (role markers, block delimiters, tool ids), which
/// the per-kind rates count as nothing.
const FRAMES: usize = 4;
const KINDS: usize = 5;

/// What a rate of 1 means for each kind: the default rates count every kind at its
/// [`super::tokens::text_tokens`] figure, and framing at nothing.
const DEFAULT_WEIGHTS: [f64; KINDS] = [1.0, 1.0, 1.0, 1.0, 0.0];
/// The range a calibrated rate is clamped to, against the default; framing in tokens.
const LOWEST_WEIGHTS: [f64; KINDS] = [0.4, 0.4, 0.4, 0.4, 0.0];
const HIGHEST_WEIGHTS: [f64; KINDS] = [2.5, 2.5, 2.5, 2.5, 40.0];

/// Deltas a model needs before its calibration replaces the default rates.
const MIN_SAMPLES: u32 = 3;
/// Models a window keeps deltas for; the one that answered least recently goes first.
const MAX_MODELS: usize = 4;

/// The upper bound without calibration: the default rates by this much, plus framing.
const UNCALIBRATED_UPPER_PERCENT: u64 = 125;
const UNCALIBRATED_UPPER_FRAME_TOKENS: u64 = 8;

/// Content in tokens at the default rates, by kind, and what no rate changes (media, at 2,000
/// flat; content known only by its total).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Features {
    kinds: [u64; KINDS],
    fixed: u64,
}

impl Features {
    /// The tokens at the default rates: what the estimate counted before calibration existed.
    pub fn at_default_rates(&self) -> u64 {
        self.kinds[..FRAMES]
            .iter()
            .fold(self.fixed, |sum, n| sum.saturating_add(*n))
    }

    /// The upper bound of [`Features::at_default_rates`] with no calibration: what the stored
    /// estimate that triggers automatic compaction counts.
    pub fn upper_at_default_rates(&self) -> u64 {
        count(self, None).1
    }

    /// Whether some of it is counted flat (media, a PDF by its size): a count that may be far
    /// from the provider's either way.
    pub fn has_flat_counts(&self) -> bool {
        self.fixed > 0
    }

    /// Content known only by its total, counted as it is.
    pub fn add_fixed(&mut self, tokens: u64) {
        self.fixed = self.fixed.saturating_add(tokens);
    }

    fn add(&mut self, other: &Features) {
        for (mine, theirs) in self.kinds.iter_mut().zip(other.kinds) {
            *mine = mine.saturating_add(theirs);
        }
        self.fixed = self.fixed.saturating_add(other.fixed);
    }

    fn add_text(&mut self, kind: usize, text: &str) {
        let (rest, cjk) = text_split(text);
        self.kinds[kind] = self.kinds[kind].saturating_add(rest);
        self.kinds[CJK] = self.kinds[CJK].saturating_add(cjk);
    }

    fn floats(&self) -> [f64; KINDS] {
        self.kinds.map(|n| n as f64)
    }
}

/// One stored entry's content as the model reads it, by kind: what
/// [`context_entry_tokens`] counts, at the default rates.
pub fn entry_features(entry: &Entry) -> Features {
    let mut features = Features::default();
    match model_content(entry) {
        ModelContent::Text(text) => features.add_text(TEXT, text),
        ModelContent::Blocks(blocks) => {
            for block in blocks {
                add_block(&mut features, block, TEXT);
            }
        }
        ModelContent::Nothing => return features,
    }
    features.kinds[FRAMES] += 1;
    features
}

/// One block's content by kind: what [`context_block_tokens`] counts.
pub fn block_features(block: &Value) -> Features {
    let mut features = Features::default();
    add_block(&mut features, block, TEXT);
    features
}

/// Media counted flat (an image, a file or audio whose size the estimate cannot see in tokens).
const MEDIA_TOKENS: u64 = 2000;

/// Decoded PDF bytes a token stands for: a page (text and its image) is 1,500–3,000 tokens,
/// and a page of a typical PDF 50–100 KB.
const PDF_BYTES_PER_TOKEN: u64 = 40;

/// Characters of an encrypted or opaque payload a token stands for (search results and
/// compactions the provider reads as the text they encrypt).
const OPAQUE_CHARS_PER_TOKEN: u64 = 4;

/// Adds a block; `text` is the kind its plain text counts as (a result's own blocks are the
/// result's).
fn add_block(features: &mut Features, b: &Value, text: usize) {
    features.kinds[FRAMES] += 1;
    match block_type(b) {
        Some("text" | "input_text" | "output_text") => {
            features.add_text(text, str_field(b, "text").unwrap_or(""));
        }
        Some("image" | "image_url" | "file" | "input_audio" | "input_image" | "input_file") => {
            features.add_fixed(MEDIA_TOKENS);
        }
        Some("document") => add_document(features, b, text),
        Some("tool_result") => match b.get("content") {
            Some(Value::String(s)) => features.add_text(RESULTS, s),
            Some(Value::Array(items)) => {
                for item in items {
                    add_block(features, item, RESULTS);
                }
            }
            _ => {}
        },
        Some("tool_use") => {
            let input = b.get("input").map(Value::to_string).unwrap_or_default();
            let kind = if text == RESULTS { RESULTS } else { INPUTS };
            features.add_text(
                kind,
                &format!("{}{}", str_field(b, "name").unwrap_or(""), input),
            );
        }
        Some("thinking") => features.add_text(text, str_field(b, "thinking").unwrap_or("")),
        Some("redacted_thinking") => features.add_text(text, str_field(b, "data").unwrap_or("")),
        // What a server tool, an MCP server or a search returned: documents, search results and
        // encrypted pages nested in it count as themselves, not as their JSON (a fetched PDF's
        // base64 read as prose is hundreds of thousands of tokens).
        Some(
            "web_search_tool_result"
            | "web_fetch_tool_result"
            | "code_execution_tool_result"
            | "bash_code_execution_tool_result"
            | "text_editor_code_execution_tool_result"
            | "tool_search_tool_result"
            | "mcp_tool_result"
            | "advisor_tool_result",
        ) => add_value(features, b.get("content").unwrap_or(&Value::Null), RESULTS),
        Some("search_result") => {
            for field in ["title", "source"] {
                add_value(features, b.get(field).unwrap_or(&Value::Null), text);
            }
            add_value(features, b.get("content").unwrap_or(&Value::Null), text);
        }
        // A server-side compaction: its summary, or the payload that stands for one.
        Some("compaction") => {
            add_value(features, b.get("content").unwrap_or(&Value::Null), text);
            add_opaque(features, b.get("encrypted_content"));
        }
        _ => features.add_text(text, &b.to_string()),
    }
}

/// A document: a text one by its text, one made of blocks by its blocks, a base64 PDF by its
/// size, any other (a URL or a file id) flat.
fn add_document(features: &mut Features, b: &Value, text: usize) {
    for field in ["title", "context"] {
        if let Some(value) = str_field(b, field) {
            features.add_text(text, value);
        }
    }
    let source = b.get("source");
    match source.and_then(|s| str_field(s, "type")) {
        Some("text") => features.add_text(
            text,
            source.and_then(|s| str_field(s, "data")).unwrap_or(""),
        ),
        Some("content") => add_value(
            features,
            source
                .and_then(|s| s.get("content"))
                .unwrap_or(&Value::Null),
            text,
        ),
        Some("base64") => {
            let chars = source
                .and_then(|s| str_field(s, "data"))
                .map_or(0, str::len) as u64;
            features.add_fixed((chars * 3 / 4 / PDF_BYTES_PER_TOKEN).max(MEDIA_TOKENS));
        }
        _ => features.add_fixed(MEDIA_TOKENS),
    }
}

/// A value nested in a result: blocks as blocks, strings as text, objects by their fields
/// (encrypted payloads by their size, signatures and type tags as nothing).
fn add_value(features: &mut Features, value: &Value, text: usize) {
    match value {
        Value::String(s) => features.add_text(text, s),
        Value::Array(items) => {
            for item in items {
                add_value(features, item, text);
            }
        }
        Value::Object(_) if block_type(value).is_some_and(is_content_block) => {
            add_block(features, value, text);
        }
        Value::Object(fields) => {
            for (key, field) in fields {
                match key.as_str() {
                    "type" | "signature" => {}
                    "encrypted_content" | "encrypted_index" => add_opaque(features, Some(field)),
                    _ => add_value(features, field, text),
                }
            }
        }
        Value::Number(_) | Value::Bool(_) | Value::Null => {}
    }
}

/// The blocks a result may hold that [`add_block`] counts by their own rule.
fn is_content_block(kind: &str) -> bool {
    matches!(
        kind,
        "text" | "image" | "document" | "search_result" | "tool_result" | "tool_use"
    )
}

fn add_opaque(features: &mut Features, value: Option<&Value>) {
    if let Some(Value::String(s)) = value {
        features.add_fixed(s.len() as u64 / OPAQUE_CHARS_PER_TOKEN);
    }
}

/// Token count of one stored entry by the per-kind rates of [`super::tokens::text_tokens`]: what the thread's
/// context estimate (and so the auto-compaction trigger) adds for content no `usage` covers.
pub fn context_entry_tokens(entry: &Entry) -> u64 {
    entry_features(entry).at_default_rates()
}

/// A block by the per-kind rates: tool calls and results are code; media are 2,000 flat as in
/// [`super::tokens::estimate_tokens`]. What [`context_entry_tokens`] counts a block as.
pub fn context_block_tokens(b: &Value) -> u64 {
    block_features(b).at_default_rates()
}

/// What a context-token estimate is based on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum EstimateBasis {
    /// The `usage` of the last assistant entry that reports one, plus the content after it.
    Usage,
    /// The content alone, by per-kind rates (no entry of the window reports `usage`), plus the
    /// overhead learned for the model when the tenant's threads taught one.
    Content,
}

/// A thread's context size in tokens, how it was found, and how large it can be.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, utoipa::ToSchema)]
pub struct ContextEstimate {
    /// The best estimate of the prompt the next request sends, in the model's tokens.
    pub tokens: u64,
    /// An upper bound of `tokens`: the estimate plus twice the spread the calibration measured
    /// (or a quarter more than the default rates when the window has too few deltas to
    /// calibrate), plus the learned overhead's spread. Automatic compaction compares a bound of
    /// its own with the thread's threshold, kept as entries are appended: the last `usage` plus
    /// the content after it at the uncalibrated upper rates, without the learned overhead. On a
    /// content-only window it is this bound less the overhead's.
    pub upper_tokens: u64,
    pub basis: EstimateBasis,
    /// The seq of the assistant entry whose `usage` anchors the estimate.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub anchor_seq: Option<i64>,
    /// The model whose calibration the estimate used: the anchor's, else the last model an entry
    /// of the window names.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// How many usage deltas of the model calibrated the rates; 0 while the default rates apply.
    pub calibration_samples: u32,
    /// On content: the tokens the model's requests carry that no entry holds (system prompt,
    /// tools), as learned from the first request of the tenant's earlier windows; absent while
    /// none was learned.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub overhead_tokens: Option<u64>,
}

impl ContextEstimate {
    /// Adds a content-based estimate's learned overhead; an anchored estimate holds it already.
    pub fn with_overhead(mut self, overhead: &Overhead) -> Self {
        if self.basis == EstimateBasis::Content {
            self.tokens = self.tokens.saturating_add(overhead.tokens);
            self.upper_tokens = self.upper_tokens.saturating_add(overhead.upper_tokens);
            self.overhead_tokens = Some(overhead.tokens);
        }
        self
    }
}

/// A tenant's learned overheads, the most recently learned first.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LearnedOverheads(pub Vec<Overhead>);

impl LearnedOverheads {
    /// The overhead of `model`, else the most recently learned: a system prompt and tools differ
    /// little between a tenant's models, so another model's is closer than none.
    fn for_model(&self, model: Option<&str>) -> Option<&Overhead> {
        model
            .map(model_digest)
            .and_then(|digest| self.0.iter().find(|o| o.model_digest == digest))
            .or_else(|| self.0.first())
    }
}

impl ContextEstimate {
    /// A content-based estimate with the overhead learned for the model the request goes to
    /// (`requested`), else the window's, else the tenant's latest.
    pub fn with_learned(self, learned: &LearnedOverheads, requested: Option<&str>) -> Self {
        if self.basis != EstimateBasis::Content {
            return self;
        }
        let model = requested.or(self.model.as_deref());
        match learned.for_model(model).cloned() {
            Some(overhead) => self.with_overhead(&overhead),
            None => self,
        }
    }
}

/// What a model's requests carry that no stored entry holds, learned per tenant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Overhead {
    /// [`model_digest`] of the model's name: the name is the caller's text, and a table that
    /// outlives the threads it came from keeps none of it.
    pub model_digest: String,
    pub tokens: u64,
    pub upper_tokens: u64,
}

/// The last response of the window that reported `usage`.
#[derive(Debug, Clone, PartialEq)]
struct Anchor {
    /// Its whole count: the prompt and the output, which the next request carries.
    total: u64,
    seq: i64,
    model: Option<String>,
    response_id: Option<String>,
}

/// One model's usage deltas, as the sums a least-squares fit needs.
#[derive(Debug, Clone, PartialEq)]
struct ModelDeltas {
    model: String,
    samples: u32,
    xtx: [[f64; KINDS]; KINDS],
    xty: [f64; KINDS],
    yy: f64,
}

impl ModelDeltas {
    fn new(model: String) -> Self {
        ModelDeltas {
            model,
            samples: 0,
            xtx: [[0.0; KINDS]; KINDS],
            xty: [0.0; KINDS],
            yy: 0.0,
        }
    }

    fn add(&mut self, x: [f64; KINDS], y: f64) {
        for i in 0..KINDS {
            for j in 0..KINDS {
                self.xtx[i][j] += x[i] * x[j];
            }
            self.xty[i] += x[i] * y;
        }
        self.yy += y * y;
        self.samples += 1;
    }

    /// The rates that fit the deltas best, drawn toward the default by a prior worth one
    /// average sample of each kind (so a kind seen once or never keeps about its default), then
    /// clamped; and the spread of what they leave unexplained. `None` below [`MIN_SAMPLES`].
    fn fit(&self) -> Option<Calibration> {
        if self.samples < MIN_SAMPLES {
            return None;
        }
        let n = f64::from(self.samples);
        let mut a = self.xtx;
        let mut b = self.xty;
        for k in 0..KINDS {
            let prior = (self.xtx[k][k] / n).max(1.0);
            a[k][k] += prior;
            b[k] += prior * DEFAULT_WEIGHTS[k];
        }
        let mut weights = solve(a, b)?;
        for k in 0..KINDS {
            weights[k] = weights[k].clamp(LOWEST_WEIGHTS[k], HIGHEST_WEIGHTS[k]);
        }
        let mut explained = 0.0;
        let mut fitted = 0.0;
        for i in 0..KINDS {
            explained += weights[i] * self.xty[i];
            for j in 0..KINDS {
                fitted += weights[i] * self.xtx[i][j] * weights[j];
            }
        }
        let unexplained = (self.yy - 2.0 * explained + fitted).max(0.0);
        Some(Calibration {
            weights,
            spread: (unexplained / n).sqrt(),
            samples: self.samples,
        })
    }
}

/// Gaussian elimination with partial pivoting; `None` when the system is singular.
fn solve(mut a: [[f64; KINDS]; KINDS], mut b: [f64; KINDS]) -> Option<[f64; KINDS]> {
    for col in 0..KINDS {
        let pivot = (col..KINDS).max_by(|&i, &j| a[i][col].abs().total_cmp(&a[j][col].abs()))?;
        if a[pivot][col].abs() < 1e-9 {
            return None;
        }
        a.swap(col, pivot);
        b.swap(col, pivot);
        let pivot_row = a[col];
        for row in col + 1..KINDS {
            let factor = a[row][col] / pivot_row[col];
            for (value, above) in a[row].iter_mut().zip(pivot_row).skip(col) {
                *value -= factor * above;
            }
            b[row] -= factor * b[col];
        }
    }
    let mut x = [0.0; KINDS];
    for row in (0..KINDS).rev() {
        let rest: f64 = (row + 1..KINDS).map(|k| a[row][k] * x[k]).sum();
        x[row] = (b[row] - rest) / a[row][row];
    }
    x.iter().all(|v| v.is_finite()).then_some(x)
}

/// A model's fitted rates.
#[derive(Debug, Clone, Copy)]
struct Calibration {
    weights: [f64; KINDS],
    /// The root mean square of what the rates leave unexplained per delta, in tokens.
    spread: f64,
    samples: u32,
}

/// Content's tokens and upper bound by a calibration, or by the default rates without one.
fn count(features: &Features, calibration: Option<&Calibration>) -> (u64, u64) {
    let defaults = features.at_default_rates();
    match calibration {
        None => {
            // Rounded up, so that the entries' bounds summed (the stored count, an entry at a
            // time) are never below the bound of their sum (a read's).
            let upper = (defaults - features.fixed)
                .saturating_mul(UNCALIBRATED_UPPER_PERCENT)
                .div_ceil(100)
                + features.kinds[FRAMES].saturating_mul(UNCALIBRATED_UPPER_FRAME_TOKENS)
                + features.fixed;
            (defaults, upper.max(defaults))
        }
        Some(calibration) => {
            let x = features.floats();
            let tokens: f64 = (0..KINDS).map(|k| calibration.weights[k] * x[k]).sum();
            let tokens = (tokens.round() as u64).saturating_add(features.fixed);
            // Twice the spread of one delta, and a tenth of the content for a tail longer than
            // the deltas it was calibrated on.
            let margin = 2.0 * calibration.spread + 0.1 * tokens as f64;
            (tokens, tokens.saturating_add(margin.ceil() as u64))
        }
    }
}

/// The estimate as a fold over a window's entries in seq order: [`Estimator::push`] each, then
/// [`Estimator::estimate`]. Pushing the entries a piece at a time gives what pushing them at
/// once gives, so a read that goes on from a checkpoint keeps the fold and goes on with it.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Estimator {
    pushed: usize,
    /// Everything the window holds.
    window: Features,
    /// The last anchor since the last boundary, and the content after it.
    anchor: Option<Anchor>,
    since_anchor: Features,
    /// The last model an assistant entry named.
    model: Option<String>,
    /// The deltas of the window after its last boundary, per model.
    deltas: Vec<ModelDeltas>,
}

impl Estimator {
    /// The fold over `entries`.
    pub fn over(entries: &[Entry]) -> Estimator {
        let mut estimator = Estimator::default();
        estimator.extend(entries);
        estimator
    }

    pub fn extend(&mut self, entries: &[Entry]) {
        for entry in entries {
            self.push(entry);
        }
    }

    /// Folds the next entry in; returns its content, which a caller that counts it too need
    /// not read again.
    pub fn push(&mut self, entry: &Entry) -> Features {
        let features = entry_features(entry);
        let server_compaction = holds_server_compaction(entry);
        if server_compaction {
            // The provider drops everything before a compaction block, as before a boundary.
            self.window = Features::default();
        }
        self.window.add(&features);
        if entry.is_compact_boundary() || server_compaction {
            // Usage before a boundary describes a context that is gone, and a delta across it
            // compares two different contexts.
            self.anchor = None;
            self.since_anchor = Features::default();
            self.deltas.clear();
        }
        let model = entry
            .message
            .as_ref()
            .and_then(|m| m.model.as_deref())
            .filter(|m| entry.kind == EntryKind::Assistant && *m != "<synthetic>");
        if let Some(model) = model {
            if self.model.as_deref() != Some(model) {
                self.model = Some(model.to_owned());
            }
        }
        match usage_tokens(entry) {
            Some(total) => {
                let message = entry.message.as_ref();
                let response_id = message.and_then(|m| m.id.clone());
                let anchor = Anchor {
                    total,
                    seq: entry.seq_or(self.pushed),
                    model: model.map(str::to_owned),
                    response_id,
                };
                self.learn(&anchor, entry);
                self.anchor = Some(anchor);
                self.since_anchor = Features::default();
            }
            None => self.since_anchor.add(&features),
        }
        self.pushed += 1;
        features
    }

    /// What the fold weighs in memory, roughly: a checkpoint keeps one.
    pub fn approx_bytes(&self) -> usize {
        std::mem::size_of::<Self>()
            + self
                .deltas
                .iter()
                .map(|d| std::mem::size_of::<ModelDeltas>() + d.model.len())
                .sum::<usize>()
            + self.model.as_ref().map_or(0, String::len)
    }

    /// Content known only by its total, added to the window (a preserved segment summed
    /// elsewhere): counted as it is, never calibrated.
    pub fn preserve(&mut self, tokens: u64) {
        self.window.add_fixed(tokens);
        self.since_anchor.add_fixed(tokens);
    }

    /// Starts a new window (a boundary in a fold over a whole thread): the next entries are all
    /// it holds.
    pub fn restart_window(&mut self) {
        self.window = Features::default();
    }

    /// Takes the delta from the previous anchor to `anchor` as a sample of the model's rates,
    /// when both are one model's, it is a new response, and content could explain it.
    fn learn(&mut self, anchor: &Anchor, entry: &Entry) {
        let Some(previous) = self.anchor.as_ref() else {
            return;
        };
        let Some(model) = anchor.model.as_deref() else {
            return;
        };
        if previous.model.as_deref() != Some(model)
            || (anchor.response_id.is_some() && anchor.response_id == previous.response_id)
        {
            return;
        }
        let Some(prompt) = prompt_tokens(entry) else {
            return;
        };
        let x = self.since_anchor.floats();
        let grew = prompt as f64 - previous.total as f64 - self.since_anchor.fixed as f64;
        // What no rate in range could make of the content is not the tokenizer's doing (context
        // the client sent and never stored, or left out): it must not teach the rates.
        let at = |weights: &[f64; KINDS]| -> f64 { (0..KINDS).map(|k| weights[k] * x[k]).sum() };
        if grew < at(&LOWEST_WEIGHTS) / 2.0 - 500.0 || grew > 2.0 * at(&HIGHEST_WEIGHTS) + 500.0 {
            return;
        }
        let index = match self.deltas.iter().position(|d| d.model == model) {
            Some(index) => index,
            None => {
                if self.deltas.len() == MAX_MODELS {
                    self.deltas.remove(0);
                }
                self.deltas.push(ModelDeltas::new(model.to_owned()));
                self.deltas.len() - 1
            }
        };
        let mut deltas = self.deltas.remove(index);
        deltas.add(x, grew);
        self.deltas.push(deltas);
    }

    /// The estimate of the entries pushed so far. A content-based one holds no overhead: add the
    /// tenant's with [`ContextEstimate::with_overhead`].
    pub fn estimate(&self) -> ContextEstimate {
        let model = self
            .anchor
            .as_ref()
            .and_then(|a| a.model.clone())
            .or_else(|| self.model.clone());
        let Some(anchor) = &self.anchor else {
            // No anchor since the last boundary, so no delta either: the default rates.
            let (tokens, upper) = count(&self.window, None);
            return ContextEstimate {
                tokens,
                upper_tokens: upper,
                basis: EstimateBasis::Content,
                anchor_seq: None,
                model,
                calibration_samples: 0,
                overhead_tokens: None,
            };
        };
        let calibration = model
            .as_deref()
            .and_then(|m| self.deltas.iter().find(|d| d.model == m))
            .and_then(ModelDeltas::fit);
        let (tail, upper) = count(&self.since_anchor, calibration.as_ref());
        ContextEstimate {
            tokens: anchor.total.saturating_add(tail),
            upper_tokens: anchor.total.saturating_add(upper),
            basis: EstimateBasis::Usage,
            anchor_seq: Some(anchor.seq),
            model,
            calibration_samples: calibration.map_or(0, |c| c.samples),
            overhead_tokens: None,
        }
    }
}

/// Whether a response holds a server-side compaction summary, which every provider's request
/// starts at (`view::cut_at_server_compaction`).
fn holds_server_compaction(entry: &Entry) -> bool {
    entry.kind == EntryKind::Assistant
        && matches!(model_content(entry), ModelContent::Blocks(blocks)
            if blocks.iter().any(|b| matches!(compaction(b), Some(Compaction::Summary(_)))))
}

/// The SHA-256 of a model's name, in hex: how the learned overheads name it.
pub fn model_digest(model: &str) -> String {
    use sha2::{Digest, Sha256};
    hex::encode(Sha256::digest(model.as_bytes()))
}

/// The prompt a response's `usage` reports: input, cache reads and cache writes, in any
/// provider's form ([`Usage::read`]).
pub fn prompt_tokens(entry: &Entry) -> Option<u64> {
    usage_tokens(entry)?;
    let usage = entry.message.as_ref()?.usage.as_ref()?;
    Some(Usage::read(usage).prompt())
}

/// The context size of a window (entries in seq order): anchored on the last assistant entry
/// after the last compact boundary that reports `usage` (the provider's own count of everything
/// sent, the system prompt and tools included), plus the estimate of what follows it; without
/// one, the estimate of everything.
pub fn estimate_context(entries: &[Entry]) -> ContextEstimate {
    Estimator::over(entries).estimate()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::normalize::tokens::estimate_entry_tokens;
    use serde_json::json;

    fn entry(v: Value) -> Entry {
        serde_json::from_value(v).unwrap()
    }

    fn user(content: Value) -> Entry {
        entry(json!({"type": "user", "message": {"role": "user", "content": content}}))
    }

    /// A response of `model` whose prompt was `prompt` tokens, `output` more in its output.
    fn response(model: &str, id: &str, prompt: u64, output: u64) -> Entry {
        entry(
            json!({"type": "assistant", "message": {"role": "assistant", "id": id,
            "model": model, "content": [{"type": "text", "text": "ok"}],
            "usage": {"input_tokens": 3, "cache_read_input_tokens": prompt - 3,
                      "output_tokens": output}}}),
        )
    }

    fn result(text: &str) -> Entry {
        user(json!([{"type": "tool_result", "tool_use_id": "t", "content": text}]))
    }

    #[test]
    fn the_default_rates_are_the_per_kind_counts() {
        let blocks = json!([
            {"type": "text", "text": "The parser rounds half up now. 日本語"},
            {"type": "tool_use", "id": "t", "name": "Read", "input": {"file_path": "/a.rs"}},
            {"type": "tool_result", "tool_use_id": "t", "content": [
                {"type": "text", "text": "fn main() {}"}, {"type": "image", "source": {}}]},
            {"type": "thinking", "thinking": "hmm", "signature": "s"},
            {"type": "server_tool_use", "id": "s", "name": "web_search", "input": {}},
        ]);
        let text = super::super::tokens::text_tokens;
        let expected = [
            text("The parser rounds half up now. 日本語"),
            text(r#"Read{"file_path":"/a.rs"}"#),
            text("fn main() {}") + 2000,
            text("hmm"),
            text(&blocks[4].to_string()),
        ];
        for (block, expected) in blocks.as_array().unwrap().iter().zip(expected) {
            assert_eq!(block_features(block).at_default_rates(), expected);
            assert_eq!(context_block_tokens(block), expected);
        }
        let e = user(blocks);
        let features = entry_features(&e);
        assert_eq!(features.at_default_rates(), context_entry_tokens(&e));
        assert_eq!(
            features.kinds[FRAMES], 8,
            "the entry, its five blocks, the result's two"
        );
        assert!(features.kinds[CJK] >= 3 && features.kinds[RESULTS] > 0);
        assert!(features.kinds[INPUTS] > 0 && features.fixed == 2000);
    }

    #[test]
    fn nested_payloads_count_as_what_they_stand_for() {
        let text = super::super::tokens::text_tokens;
        // A Responses text part is text, not its JSON.
        let part = json!({"type": "input_text", "text": "hello there"});
        assert_eq!(
            block_features(&part).at_default_rates(),
            text("hello there")
        );
        // A search result's page is encrypted: counted by its size, its signature not at all.
        let page = "Zm9v".repeat(1_000);
        let search = json!({"type": "web_search_tool_result", "tool_use_id": "s",
            "content": [{"type": "web_search_result", "url": "https://a.example", "title": "A",
                "encrypted_content": page, "page_age": null}]});
        let counted = block_features(&search);
        assert_eq!(counted.fixed, 4_000 / OPAQUE_CHARS_PER_TOKEN);
        assert!(counted.at_default_rates() < 1_100, "{counted:?}");
        // A text document by its text; a PDF by its size, at least as much as any media.
        let document = |source: Value| json!({"type": "document", "source": source});
        let words = "word ".repeat(1_000);
        let as_text = document(json!({"type": "text", "media_type": "text/plain", "data": words}));
        assert_eq!(block_features(&as_text).at_default_rates(), text(&words));
        let small_pdf = document(json!({"type": "base64", "data": "JVBERi0xLjQK"}));
        assert_eq!(block_features(&small_pdf).at_default_rates(), MEDIA_TOKENS);
        let big_pdf = document(json!({"type": "base64", "data": "A".repeat(4_000_000)}));
        assert_eq!(
            block_features(&big_pdf).at_default_rates(),
            3_000_000 / PDF_BYTES_PER_TOKEN
        );
    }

    /// A thread whose model counts results at `rate` times the default and each entry and
    /// block at 5 framing tokens: calibration learns both from the deltas and predicts the next.
    #[test]
    fn calibration_learns_a_model_s_rates_from_its_deltas_alone() {
        let hidden_overhead = 12_000_u64;
        let truth = |e: &Entry| -> u64 {
            let f = entry_features(e);
            (f.kinds[RESULTS] as f64 * 0.6).round() as u64 + f.kinds[TEXT] + 5 * f.kinds[FRAMES]
        };
        let mut entries = vec![user(json!("Fix the parser, please."))];
        let mut prompt = hidden_overhead + truth(&entries[0]);
        let mut last_output = 0;
        let mut errors = Vec::new();
        for round in 0..12_u64 {
            prompt += last_output;
            if round > 0 {
                let estimate = estimate_context(&entries);
                errors.push((estimate.tokens as f64 - prompt as f64).abs() / prompt as f64);
                assert!(estimate.upper_tokens >= estimate.tokens);
                if round > 6 {
                    assert!(estimate.upper_tokens >= prompt, "round {round}");
                    assert_eq!(estimate.model.as_deref(), Some("sim"));
                }
            }
            let output = 40 + round;
            entries.push(response("sim", &format!("m{round}"), prompt, output));
            last_output = output;
            let body = "x = [1, 2, 3]; // ".repeat(10 + (round as usize * 37) % 200);
            let added = result(&body);
            prompt += truth(&added);
            entries.push(added);
        }
        let fold = Estimator::over(&entries);
        let estimate = fold.estimate();
        assert!(estimate.calibration_samples >= 8);
        let expected = prompt + last_output;
        let error = |tokens: u64| (tokens as f64 - expected as f64).abs() / expected as f64;
        assert!(error(estimate.tokens) < 0.002, "{}", error(estimate.tokens));
        // The default rates count the results 1/0.6 of what they are, and no framing.
        let defaults = fold.anchor.as_ref().unwrap().total + fold.since_anchor.at_default_rates();
        assert!(error(defaults) > 5.0 * error(estimate.tokens), "{errors:?}");
    }

    #[test]
    fn deltas_across_models_boundaries_or_one_response_teach_nothing() {
        let mut entries = Vec::new();
        for round in 0..6_u64 {
            let model = if round % 2 == 0 { "a" } else { "b" };
            entries.push(response(
                model,
                &format!("m{round}"),
                1000 + round * 500,
                10,
            ));
            entries.push(result(&"{\"k\": 1}, ".repeat(50)));
        }
        assert_eq!(estimate_context(&entries).calibration_samples, 0);
        // One response stored as several entries, each with the same usage.
        let mut split = Vec::new();
        for _ in 0..5 {
            split.push(response("a", "same", 1000, 10));
        }
        assert_eq!(Estimator::over(&split).deltas.len(), 0);
        // A delta no rate could explain (context the client never stored) is left out.
        let mut injected = Vec::new();
        for round in 0..6_u64 {
            injected.push(response(
                "a",
                &format!("m{round}"),
                1000 + round * 40_000,
                10,
            ));
            injected.push(result("ok"));
        }
        assert_eq!(Estimator::over(&injected).deltas.len(), 0);
    }

    #[test]
    fn a_fold_in_pieces_is_the_fold_at_once() {
        let mut entries = Vec::new();
        for round in 0..8_u64 {
            entries.push(response("a", &format!("m{round}"), 1000 + round * 300, 20));
            entries.push(result(&"let y = f(x);\n".repeat(10 + round as usize * 3)));
        }
        let whole = Estimator::over(&entries);
        for cut in 0..entries.len() {
            let mut pieces = Estimator::over(&entries[..cut]);
            pieces.extend(&entries[cut..]);
            assert_eq!(pieces, whole);
        }
        assert!(whole.estimate().calibration_samples >= MIN_SAMPLES);
    }

    #[test]
    fn a_learned_overhead_adds_to_content_only() {
        let overhead = Overhead {
            model_digest: model_digest("a"),
            tokens: 9000,
            upper_tokens: 9500,
        };
        let content = estimate_context(&[user(json!("hello there"))]);
        let with = content.clone().with_overhead(&overhead);
        assert_eq!(with.tokens, content.tokens + 9000);
        assert_eq!(with.upper_tokens, content.upper_tokens + 9500);
        assert_eq!(with.overhead_tokens, Some(9000));
        let anchored = estimate_context(&[response("a", "m", 5000, 10)]);
        assert_eq!(anchored.clone().with_overhead(&overhead), anchored);
    }

    #[test]
    fn entry_estimates_count_only_what_the_model_sees() {
        let entry =
            |v: Value| -> crate::history::model::Entry { serde_json::from_value(v).unwrap() };
        let user =
            entry(json!({"type": "user", "message": {"role": "user", "content": "abcdefgh"}}));
        assert_eq!(estimate_entry_tokens(&user), 2);
        let asst = entry(json!({"type": "assistant", "message": {"role": "assistant",
            "content": [{"type": "text", "text": "abcd"}, {"type": "image", "source": {}}]}}));
        assert_eq!(estimate_entry_tokens(&asst), 2001);
        let prose = entry(
            json!({"type": "user", "message": {"role": "user", "content": "abcdefg hijklmn"}}),
        );
        assert_eq!(context_entry_tokens(&prose), 4); // 15 prose characters / 3.5
        assert_eq!(context_entry_tokens(&asst), 2001);
        let progress = entry(json!({"type": "progress", "data": "x".repeat(400)}));
        assert_eq!(estimate_entry_tokens(&progress), 0);
        let boundary = entry(
            json!({"type": "system", "subtype": "compact_boundary", "content": "Conversation compacted"}),
        );
        assert_eq!(estimate_entry_tokens(&boundary), 0);
    }

    #[test]
    fn the_estimate_anchors_on_the_last_usage_after_the_last_boundary() {
        let entry =
            |v: Value| -> crate::history::model::Entry { serde_json::from_value(v).unwrap() };
        let usage = json!({"input_tokens": 3, "cache_creation_input_tokens": 1000,
            "cache_read_input_tokens": 20000, "output_tokens": 97});
        let history = vec![
            entry(json!({"type": "user", "message": {"role": "user", "content": "abcdefg"}})),
            entry(
                json!({"type": "assistant", "message": {"role": "assistant", "id": "m1",
                "usage": usage, "content": [{"type": "text", "text": "hi"}]}}),
            ),
            entry(json!({"type": "user", "message": {"role": "user", "content": "abcdefg"}})),
            entry(
                json!({"type": "assistant", "isApiErrorMessage": true, "message": {"role": "assistant",
                "model": "<synthetic>", "usage": {"input_tokens": 0, "output_tokens": 0},
                "content": [{"type": "text", "text": "API Error"}]}}),
            ),
        ];
        let estimate = estimate_context(&history);
        assert_eq!(estimate.basis, EstimateBasis::Usage);
        assert_eq!(estimate.anchor_seq, Some(1));
        assert_eq!(estimate.tokens, 21100 + 2);
        let content = estimate_context(&history[..1]);
        assert_eq!(content.basis, EstimateBasis::Content);
        assert_eq!(content.tokens, 2);
        // Usage before a boundary describes a context that is gone.
        let mut compacted = history[..2].to_vec();
        compacted.push(entry(
            json!({"type": "system", "subtype": "compact_boundary"}),
        ));
        compacted.push(history[2].clone());
        let after = estimate_context(&compacted);
        assert_eq!(
            (after.basis, after.tokens),
            (EstimateBasis::Content, 2 + 1 + 2)
        );
    }
}
