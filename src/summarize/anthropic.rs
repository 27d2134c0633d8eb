//! The Anthropic Messages API backend: `POST {base}/v1/messages`.

use async_trait::async_trait;
use serde_json::{json, Value};

use super::driver::{self, Prompt, Provider};
use super::{http, Purpose, SummarizeError, Summarizer, SummarizerConfig, Summary, SummaryRequest};
use super::{text::cut_words, DEFAULT_ANTHROPIC_MAX_TOKENS};

pub const ANTHROPIC_VERSION: &str = "2023-06-01";

/// Summarizes with a Claude model. Use through [`super::build`] to get the extractive fallback.
pub struct AnthropicSummarizer {
    config: SummarizerConfig,
    client: reqwest::Client,
}

impl AnthropicSummarizer {
    pub fn new(config: SummarizerConfig) -> Self {
        let client = http::client(&config);
        AnthropicSummarizer { config, client }
    }

    fn max_tokens(&self, purpose: Purpose, max_bytes: usize) -> u32 {
        let cap = self
            .config
            .max_output_tokens
            .unwrap_or(DEFAULT_ANTHROPIC_MAX_TOKENS)
            .max(1);
        match purpose {
            Purpose::Compaction => cap,
            // A line is short; leave room for a stray preamble, then cut.
            Purpose::Line | Purpose::Merge => cap.min((max_bytes / 2).clamp(256, 4096) as u32),
        }
    }
}

/// The text of a Messages API reply: its `text` blocks, joined.
pub(crate) fn reply_text(body: &Value) -> Result<String, SummarizeError> {
    let Some(content) = body.get("content").and_then(Value::as_array) else {
        return Err(SummarizeError::Malformed(format!(
            "no content array in the reply: {}",
            cut_words(&body.to_string(), 120)
        )));
    };
    let texts: Vec<&str> = content
        .iter()
        .filter(|b| b.get("type").and_then(Value::as_str) == Some("text"))
        .filter_map(|b| b.get("text").and_then(Value::as_str))
        .collect();
    if texts.is_empty() {
        return Err(SummarizeError::Malformed(
            "the reply contained no text block".into(),
        ));
    }
    Ok(texts.join(""))
}

struct Wire<'a> {
    outer: &'a AnthropicSummarizer,
    max_bytes: usize,
}

#[async_trait]
impl Provider for Wire<'_> {
    async fn complete(&self, prompt: &Prompt, purpose: Purpose) -> Result<String, SummarizeError> {
        let s = self.outer;
        let key = s.config.api_key.as_deref().unwrap_or_default();
        let body = json!({
            "model": s.config.model,
            "max_tokens": s.max_tokens(purpose, self.max_bytes),
            "system": prompt.system,
            "messages": [{"role": "user", "content": prompt.user}],
        });
        let request = s
            .client
            .post(http::endpoint(&s.config.base_url, "messages"))
            .header("x-api-key", key)
            .header("anthropic-version", ANTHROPIC_VERSION)
            .json(&body);
        let reply = http::send_json(request, &s.config).await?;
        reply_text(&reply)
    }
}

#[async_trait]
impl Summarizer for AnthropicSummarizer {
    fn name(&self) -> String {
        format!("anthropic:{}", self.config.model)
    }

    async fn summarize(&self, req: &SummaryRequest) -> Result<Summary, SummarizeError> {
        if self.config.api_key.is_none() {
            return Err(SummarizeError::Config(
                "no Anthropic API key (LOUPE_SUMMARIZER_API_KEY or ANTHROPIC_API_KEY)".into(),
            ));
        }
        let wire = Wire {
            outer: self,
            max_bytes: req.max_bytes,
        };
        driver::run(&wire, &self.name(), &self.config, req).await
    }
}
