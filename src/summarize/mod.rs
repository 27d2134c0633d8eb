//! Summarizers: turn a run of history entries into a compaction summary or one summary-tree line,
//! or merge two summary-tree lines into their parent's line.
//!
//! One trait, [`Summarizer`], and three backends:
//! - [`ExtractiveSummarizer`] (the default): deterministic, offline, no model. It keeps the user's own
//!   words first, then decisions and errors, then described tool calls, within a byte budget.
//! - [`AnthropicSummarizer`] (Messages API) and [`OpenAiSummarizer`] (Chat Completions, also local
//!   OpenAI-compatible servers). Both render the history as a plain-text transcript
//!   ([`render`]), never as raw provider blocks, retry transient failures with bounded exponential
//!   backoff, and summarize an over-long history in chunks, folding each chunk's summary into the
//!   next call.
//!
//! [`build`] wraps a model backend in [`WithFallback`], so a summary job always completes: when the
//! model fails, the extractive summary is returned and `Summary::summarizer` records it.

mod anthropic;
mod driver;
mod extractive;
mod fallback;
mod http;
mod openai;
pub mod render;
pub mod text;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use crate::history::model::Entry;

pub use anthropic::AnthropicSummarizer;
pub use extractive::{extract as extract_without_model, ExtractiveSummarizer};
pub use fallback::WithFallback;
pub use openai::OpenAiSummarizer;

/// What to summarize and how.
#[derive(Debug, Clone)]
pub struct SummaryRequest {
    /// The entries to summarize, in order.
    pub entries: Vec<Entry>,
    /// A summary of what came before `entries`; folded into the new summary.
    pub previous_summary: Option<String>,
    /// Extra instructions from the user (`/compact <instructions>`).
    pub instructions: Option<String>,
    /// Target size of the output in bytes. A bound for extractive output and for `Purpose::Line`
    /// and `Purpose::Merge`; a target for a model-written compaction summary (see [`Purpose`]).
    pub max_bytes: usize,
    pub purpose: Purpose,
    /// The summary lines to merge, in order (`Purpose::Merge`: the left child's line, then the
    /// right one's). Empty for the other purposes.
    pub lines: Vec<String>,
    /// For `Line` and `Merge`: the outline's lines just before the source, oldest first, without
    /// ids. A model reads them so that its line resolves "it" or "that file" and does not repeat
    /// what they say; the extractive summarizer ignores them.
    pub context: Vec<String>,
}

impl SummaryRequest {
    pub fn new(entries: Vec<Entry>, purpose: Purpose, max_bytes: usize) -> Self {
        SummaryRequest {
            entries,
            previous_summary: None,
            instructions: None,
            max_bytes,
            purpose,
            lines: Vec::new(),
            context: Vec::new(),
        }
    }

    /// A request to merge two summary-tree lines (a parent's two children, left first) into one
    /// line of at most `max_bytes` bytes.
    pub fn merge(left: String, right: String, max_bytes: usize) -> Self {
        SummaryRequest {
            lines: vec![left, right],
            ..SummaryRequest::new(Vec::new(), Purpose::Merge, max_bytes)
        }
    }
}

/// The "free node" rule of the summary tree: a parent whose children's lines fit together is
/// their concatenation, `left; right` (each trimmed), with no summarizer call; an empty child (it
/// covers only entries the model never sees) adds nothing. `None` when that is longer than
/// `max_bytes`.
pub fn merge_verbatim(left: &str, right: &str, max_bytes: usize) -> Option<String> {
    let line = match (left.trim(), right.trim()) {
        ("", only) | (only, "") => only.to_owned(),
        (left, right) => format!("{left}; {right}"),
    };
    (line.len() <= max_bytes).then_some(line)
}

/// The lines of a `Merge` request, each on one line (line breaks become spaces) and trimmed.
pub(crate) fn merge_lines(req: &SummaryRequest) -> Vec<String> {
    req.lines
        .iter()
        .map(|l| text::newlines_to_spaces(l))
        .collect()
}

/// The free-node answer to a `Merge` request: [`merge_verbatim`] of its two lines (any other
/// number of lines: joined by `; `), when that fits `max_bytes`. `None` without lines.
pub(crate) fn merge_free(req: &SummaryRequest) -> Option<String> {
    match merge_lines(req).as_slice() {
        [] => None,
        [left, right] => merge_verbatim(left, right, req.max_bytes),
        lines => {
            let line = lines.join("; ");
            (line.len() <= req.max_bytes).then_some(line)
        }
    }
}

/// What the summary is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Purpose {
    /// A compaction summary (the shape of `docs/NORMALIZATION.md` § Compaction): multi-section text. A model's
    /// output is not cut at `max_bytes` (its last sections, current work and next step, matter
    /// most); the extractive output never exceeds it.
    Compaction,
    /// One summary-tree line: a single line of text, no newlines, never more than `max_bytes`.
    Line,
    /// Two summary-tree lines (`SummaryRequest::lines`) merged into their parent's line: a single
    /// line of text, no newlines, never more than `max_bytes`. When the two fit side by side,
    /// the answer is [`merge_verbatim`] (no model call).
    Merge,
}

impl Purpose {
    pub fn as_str(self) -> &'static str {
        match self {
            Purpose::Compaction => "compaction",
            Purpose::Line => "line",
            Purpose::Merge => "merge",
        }
    }
}

/// A written summary.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Summary {
    pub text: String,
    /// Which backend wrote it: `extractive`, `verbatim`, `anthropic:<model>`, `openai:<model>`,
    /// or `fallback:extractive (<backend> failed: <short error>)`.
    pub summarizer: String,
    /// HTTP requests sent to a model for this summary, failed attempts included.
    pub calls: u32,
}

/// Why a summary could not be written.
#[derive(thiserror::Error, Debug)]
pub enum SummarizeError {
    /// HTTP 429. `retry_after` is the server's hint, when it sent one.
    #[error("rate limited (HTTP 429{})", .retry_after.map(|d| format!(", retry after {:.1}s", d.as_secs_f64())).unwrap_or_default())]
    RateLimited { retry_after: Option<Duration> },
    /// HTTP 5xx (including Anthropic's 529 overloaded).
    #[error("server error (HTTP {status}): {message}")]
    Server { status: u16, message: String },
    /// Any other non-success status (400, 401, 403, 404, 413, …); never retried.
    #[error("request rejected (HTTP {status}): {message}")]
    Rejected { status: u16, message: String },
    /// No complete response within the configured timeout.
    #[error("timed out after {0:?}")]
    Timeout(Duration),
    /// Connection refused, reset, DNS failure, …
    #[error("transport error: {0}")]
    Transport(String),
    /// A 2xx reply that is not the provider's shape: bad JSON, no text, empty summary.
    #[error("malformed reply: {0}")]
    Malformed(String),
    /// Missing API key, bad URL, invalid environment variable, …
    #[error("configuration error: {0}")]
    Config(String),
    /// The model backend stopped retrying; `last` is the error of the last attempt.
    #[error("gave up after {calls} model call(s): {last}")]
    GaveUp {
        calls: u32,
        #[source]
        last: Box<SummarizeError>,
    },
}

impl SummarizeError {
    /// The underlying error, looking through [`SummarizeError::GaveUp`].
    pub fn root(&self) -> &SummarizeError {
        match self {
            SummarizeError::GaveUp { last, .. } => last.root(),
            other => other,
        }
    }

    /// Model calls made before the error (0 unless wrapped in `GaveUp`).
    pub fn calls(&self) -> u32 {
        match self {
            SummarizeError::GaveUp { calls, .. } => *calls,
            _ => 0,
        }
    }

    /// Whether another attempt may succeed (429, 5xx, timeout, transport, malformed).
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            SummarizeError::RateLimited { .. }
                | SummarizeError::Server { .. }
                | SummarizeError::Timeout(_)
                | SummarizeError::Transport(_)
                | SummarizeError::Malformed(_)
        )
    }
}

/// Writes summaries.
#[async_trait]
pub trait Summarizer: Send + Sync {
    /// The backend's name, as recorded in `Summary::summarizer` (e.g. `anthropic:claude-x`).
    fn name(&self) -> String;
    async fn summarize(&self, req: &SummaryRequest) -> Result<Summary, SummarizeError>;
}

/// Which backend [`build`] makes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Extractive,
    Anthropic,
    Openai,
}

impl Backend {
    pub fn as_str(self) -> &'static str {
        match self {
            Backend::Extractive => "extractive",
            Backend::Anthropic => "anthropic",
            Backend::Openai => "openai",
        }
    }

    pub fn default_base_url(self) -> &'static str {
        match self {
            Backend::Extractive => "",
            Backend::Anthropic => "https://api.anthropic.com",
            Backend::Openai => "https://api.openai.com",
        }
    }

    pub fn default_model(self) -> &'static str {
        match self {
            Backend::Extractive => "",
            Backend::Anthropic => "claude-haiku-4-5",
            Backend::Openai => "gpt-4o-mini",
        }
    }
}

impl std::str::FromStr for Backend {
    type Err = SummarizeError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "" | "extractive" => Ok(Backend::Extractive),
            "anthropic" => Ok(Backend::Anthropic),
            "openai" => Ok(Backend::Openai),
            other => Err(SummarizeError::Config(format!(
                "the summarizer must be extractive, anthropic or openai, not {other:?}"
            ))),
        }
    }
}

/// Summarizer settings; `cli::SummarizerArgs` fills them from flags and variables.
#[derive(Clone)]
pub struct SummarizerConfig {
    pub backend: Backend,
    /// Without the `/v1/...` path; a trailing `/v1` is accepted too.
    pub base_url: String,
    pub model: String,
    pub api_key: Option<String>,
    /// Per HTTP request.
    pub timeout: Duration,
    /// HTTP attempts per model call (per chunk), the first included.
    pub max_attempts: u32,
    /// First retry delay; doubled per retry, capped at `max_backoff`.
    pub backoff_base: Duration,
    pub max_backoff: Duration,
    /// Upper bound on a server's `Retry-After` hint.
    pub max_retry_after: Duration,
    /// Bound on the rendered history (plus folded-in summary) sent in one call; longer
    /// histories are summarized in chunks.
    pub max_input_bytes: usize,
    /// Anthropic `max_tokens` (default 8000). For OpenAI, sent as `max_tokens` only when set
    /// explicitly (newer OpenAI models reject `max_tokens`).
    pub max_output_tokens: Option<u32>,
}

impl std::fmt::Debug for SummarizerConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SummarizerConfig")
            .field("backend", &self.backend)
            .field("base_url", &self.base_url)
            .field("model", &self.model)
            .field("api_key", &self.api_key.as_ref().map(|_| "<redacted>"))
            .field("timeout", &self.timeout)
            .field("max_attempts", &self.max_attempts)
            .field("backoff_base", &self.backoff_base)
            .field("max_backoff", &self.max_backoff)
            .field("max_retry_after", &self.max_retry_after)
            .field("max_input_bytes", &self.max_input_bytes)
            .field("max_output_tokens", &self.max_output_tokens)
            .finish()
    }
}

pub const DEFAULT_TIMEOUT_SECS: u64 = 60;
pub const DEFAULT_MAX_ATTEMPTS: u32 = 4;
pub const DEFAULT_BACKOFF_BASE_MS: u64 = 500;
pub const DEFAULT_MAX_INPUT_BYTES: usize = 400_000;
pub const DEFAULT_ANTHROPIC_MAX_TOKENS: u32 = 8_000;

impl SummarizerConfig {
    /// The defaults for a backend (no API key).
    pub fn new(backend: Backend) -> Self {
        SummarizerConfig {
            backend,
            base_url: backend.default_base_url().to_string(),
            model: backend.default_model().to_string(),
            api_key: None,
            timeout: Duration::from_secs(DEFAULT_TIMEOUT_SECS),
            max_attempts: DEFAULT_MAX_ATTEMPTS,
            backoff_base: Duration::from_millis(DEFAULT_BACKOFF_BASE_MS),
            max_backoff: Duration::from_secs(30),
            max_retry_after: Duration::from_secs(60),
            max_input_bytes: DEFAULT_MAX_INPUT_BYTES,
            max_output_tokens: None,
        }
    }
}

/// The summarizer for a configuration. Model backends are wrapped in [`WithFallback`], so
/// `summarize` only fails for the extractive backend, which never fails.
pub fn build(config: &SummarizerConfig) -> Arc<dyn Summarizer> {
    let primary: Arc<dyn Summarizer> = match config.backend {
        Backend::Extractive => return Arc::new(ExtractiveSummarizer::new()),
        Backend::Anthropic => Arc::new(AnthropicSummarizer::new(config.clone())),
        Backend::Openai => Arc::new(OpenAiSummarizer::new(config.clone())),
    };
    if config.backend == Backend::Anthropic && config.api_key.is_none() {
        tracing::warn!(
            "LOUPE_SUMMARIZER=anthropic without an API key: every summary will use the extractive fallback"
        );
    }
    Arc::new(WithFallback::new(primary))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merge_verbatim_joins_trimmed_lines_when_they_fit() {
        assert_eq!(
            merge_verbatim("  user: fix the parser ", "\terror: 2 tests failed\n", 100),
            Some("user: fix the parser; error: 2 tests failed".to_string())
        );
        let exact = "user: a; user: b".len();
        assert_eq!(
            merge_verbatim("user: a", "user: b", exact).as_deref(),
            Some("user: a; user: b")
        );
        assert_eq!(merge_verbatim("user: a", "user: b", exact - 1), None);
        // An empty side (entries the model never sees) adds nothing.
        assert_eq!(merge_verbatim("", "", 0).as_deref(), Some(""));
        assert_eq!(
            merge_verbatim(" ", "user: b", 7).as_deref(),
            Some("user: b")
        );
        assert_eq!(merge_verbatim("user: a", "", 7).as_deref(), Some("user: a"));
        // Bytes, not chars.
        let (l, r) = ("prix: 49 €", "décision: pas de remise");
        let n = format!("{l}; {r}").len();
        assert!(n > format!("{l}; {r}").chars().count());
        assert!(merge_verbatim(l, r, n).is_some());
        assert!(merge_verbatim(l, r, n - 1).is_none());
    }

    #[test]
    fn merge_request_shape() {
        let req = SummaryRequest::merge("a".into(), "b".into(), 64);
        assert_eq!(req.purpose, Purpose::Merge);
        assert_eq!(req.purpose.as_str(), "merge");
        assert_eq!(req.lines, vec!["a".to_string(), "b".to_string()]);
        assert!(req.entries.is_empty() && req.previous_summary.is_none());
        assert_eq!(req.max_bytes, 64);
        assert!(SummaryRequest::new(vec![], Purpose::Line, 64)
            .lines
            .is_empty());
    }

    #[test]
    fn merge_free_puts_lines_on_one_line() {
        let req = SummaryRequest::merge("a\nb".into(), " c\r\nd ".into(), 64);
        assert_eq!(merge_free(&req).as_deref(), Some("a b; c d"));
        let mut req = SummaryRequest::merge("a".into(), "b".into(), 64);
        req.lines.clear();
        assert_eq!(merge_free(&req), None);
        req.lines = vec!["x".into(), "y".into(), "z".into()];
        assert_eq!(merge_free(&req).as_deref(), Some("x; y; z"));
    }
}
