//! The OpenAI Chat Completions backend: `POST {base}/v1/chat/completions`. Also for local
//! OpenAI-compatible servers (llama.cpp, vLLM, Ollama, …), which may need no API key.

use async_trait::async_trait;
use serde_json::{json, Value};

use super::driver::{self, Prompt, Provider};
use super::text::cut_words;
use super::{http, Purpose, SummarizeError, Summarizer, SummarizerConfig, Summary, SummaryRequest};

/// Summarizes with a chat-completions model. Use through [`super::build`] to get the fallback.
pub struct OpenAiSummarizer {
    config: SummarizerConfig,
    client: reqwest::Client,
}

impl OpenAiSummarizer {
    pub fn new(config: SummarizerConfig) -> Self {
        let client = http::client(&config);
        OpenAiSummarizer { config, client }
    }
}

/// The text of a chat-completions reply: `choices[0].message.content` (a string, or an array of
/// `{type:"text", text}` parts as some compatible servers send).
pub(crate) fn reply_text(body: &Value) -> Result<String, SummarizeError> {
    let message = body
        .get("choices")
        .and_then(Value::as_array)
        .and_then(|c| c.first())
        .and_then(|c| c.get("message"))
        .ok_or_else(|| {
            SummarizeError::Malformed(format!(
                "no choices[0].message in the reply: {}",
                cut_words(&body.to_string(), 120)
            ))
        })?;
    let text = match message.get("content") {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(parts)) => parts
            .iter()
            .filter_map(|p| p.get("text").and_then(Value::as_str))
            .collect::<Vec<_>>()
            .join(""),
        _ => String::new(),
    };
    if text.trim().is_empty() {
        let why = match message.get("refusal").and_then(Value::as_str) {
            Some(r) => format!("the model refused: {}", cut_words(r, 120)),
            None => "the reply's message had no text content".to_string(),
        };
        return Err(SummarizeError::Malformed(why));
    }
    Ok(text)
}

#[async_trait]
impl Provider for OpenAiSummarizer {
    async fn complete(&self, prompt: &Prompt, _purpose: Purpose) -> Result<String, SummarizeError> {
        let mut body = json!({
            "model": self.config.model,
            "messages": [
                {"role": "system", "content": prompt.system},
                {"role": "user", "content": prompt.user},
            ],
        });
        if let Some(max) = self.config.max_output_tokens {
            body["max_tokens"] = json!(max);
        }
        let mut request = self
            .client
            .post(http::endpoint(&self.config.base_url, "chat/completions"))
            .json(&body);
        if let Some(key) = &self.config.api_key {
            request = request.bearer_auth(key);
        }
        let reply = http::send_json(request, &self.config).await?;
        reply_text(&reply)
    }
}

#[async_trait]
impl Summarizer for OpenAiSummarizer {
    fn name(&self) -> String {
        format!("openai:{}", self.config.model)
    }

    async fn summarize(&self, req: &SummaryRequest) -> Result<Summary, SummarizeError> {
        driver::run(self, &self.name(), &self.config, req).await
    }
}
