//! A model backend with the extractive summarizer behind it, so a summary job always completes.

use std::sync::Arc;

use async_trait::async_trait;

use super::text::cut_words;
use super::{ExtractiveSummarizer, SummarizeError, Summarizer, Summary, SummaryRequest};

/// Tries `primary` (which does its own retries); when it fails, returns the extractive summary
/// (which fits `max_bytes`), named `fallback:extractive (<primary> failed: <short error>)`, with
/// `calls` = the model calls the primary made.
pub struct WithFallback {
    pub primary: Arc<dyn Summarizer>,
    pub fallback: ExtractiveSummarizer,
}

impl WithFallback {
    pub fn new(primary: Arc<dyn Summarizer>) -> Self {
        WithFallback {
            primary,
            fallback: ExtractiveSummarizer::new(),
        }
    }
}

/// A short description of why the model failed, for `Summary::summarizer`.
pub fn short_error(error: &SummarizeError) -> String {
    cut_words(&error.root().to_string(), 80)
}

#[async_trait]
impl Summarizer for WithFallback {
    fn name(&self) -> String {
        format!("{}|fallback:extractive", self.primary.name())
    }

    async fn summarize(&self, req: &SummaryRequest) -> Result<Summary, SummarizeError> {
        let primary = self.primary.name();
        let backend = crate::metrics::backend_label(&primary);
        crate::metrics::summarizer_call(backend);
        match self.primary.summarize(req).await {
            Ok(summary) => Ok(summary),
            Err(error) => {
                crate::metrics::summarizer_failure(backend);
                crate::metrics::summarizer_call("extractive");
                tracing::warn!(
                    summarizer = %self.primary.name(),
                    error = %error,
                    "model summarizer failed; using the extractive summary"
                );
                let mut summary = self.fallback.summarize_now(req);
                summary.summarizer = format!(
                    "fallback:extractive ({} failed: {})",
                    self.primary.name(),
                    short_error(&error)
                );
                summary.calls = error.calls();
                Ok(summary)
            }
        }
    }
}
