//! The options a history is sent to a model with, as `GET /context` (and a cursor batch in
//! `format=normalized`) takes them in its query and `POST /normalize` in its body. One parser
//! checks them and fills in the defaults, so both answer a bad value with the same field and
//! the same words; only the status differs, as for every query parameter and body member (400
//! `bad-request` in a query, 422 `validation` in a body).

use crate::history::ingest::FieldError;
use crate::history::normalize::ids::{is_valid_tool_name, TOOL_NAME_RULE};
use crate::history::{NormalizeOptions, Provider, ThinkingMode};

/// Model ids as Loupe accepts them.
pub const MODEL_RULE: &str = "1–256 characters, no control characters";
/// Longest model id, in characters.
pub const MAX_MODEL_CHARS: usize = 256;

/// The options as sent, each member under the name both endpoints give it; unset ones are
/// already their defaults (`anthropic`, `keep`, no cache marker, no advisor blocks).
#[derive(Debug, Default)]
pub struct SendOptions {
    pub provider: Provider,
    /// The tools available now (`None`: every tool), one name an item.
    pub tools: Option<Vec<String>>,
    pub thinking: ThinkingMode,
    pub model: Option<String>,
    pub cache: bool,
    pub advisor: bool,
}

impl SendOptions {
    /// The normalizer's options, or the first member that is wrong: a tool name by its index
    /// (`tools[2]`), or the model.
    pub fn parse(self) -> Result<NormalizeOptions, FieldError> {
        if let Some(tools) = &self.tools {
            if let Some(bad) = tools.iter().position(|name| !is_valid_tool_name(name)) {
                return Err(FieldError {
                    path: format!("tools[{bad}]"),
                    problem: format!("{:?} is not a tool name ({TOOL_NAME_RULE})", tools[bad]),
                });
            }
        }
        if let Some(model) = self.model.as_deref().filter(|model| !valid_model(model)) {
            return Err(FieldError {
                path: "model".to_owned(),
                problem: format!("{model:?} is not a model id ({MODEL_RULE})"),
            });
        }
        Ok(NormalizeOptions {
            provider: self.provider,
            tools: self.tools,
            thinking: self.thinking,
            model: self.model,
            cache: self.cache,
            advisor: self.advisor,
            // The thread's settings, which only a stored thread has, add these.
            microcompact: None,
            clearing: None,
        })
    }
}

/// The names of a query's comma-separated tool list: blanks around names and empty items are
/// dropped.
pub fn tool_list(list: &str) -> Vec<String> {
    list.split(',')
        .map(str::trim)
        .filter(|name| !name.is_empty())
        .map(str::to_owned)
        .collect()
}

fn valid_model(model: &str) -> bool {
    (1..=MAX_MODEL_CHARS).contains(&model.chars().count()) && !model.chars().any(char::is_control)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_filled_in_and_bad_members_named() {
        let options = SendOptions::default().parse().unwrap();
        assert_eq!(options.provider, Provider::default());
        assert_eq!(options.thinking, ThinkingMode::default());
        assert!(options.tools.is_none() && options.model.is_none());
        assert!(!options.cache && !options.advisor);

        let tools = |names: &[&str]| SendOptions {
            tools: Some(names.iter().map(|n| (*n).to_owned()).collect()),
            ..SendOptions::default()
        };
        assert_eq!(
            tools(&["Bash", "Read"]).parse().unwrap().tools.unwrap(),
            ["Bash", "Read"]
        );
        let error = tools(&["Bash", "no spaces"]).parse().unwrap_err();
        assert_eq!(error.path, "tools[1]");
        assert!(error.problem.contains("no spaces") && error.problem.contains(TOOL_NAME_RULE));

        let model = |model: String| SendOptions {
            model: Some(model),
            ..SendOptions::default()
        };
        assert!(model("x".repeat(MAX_MODEL_CHARS)).parse().is_ok());
        assert_eq!(
            model("x".repeat(MAX_MODEL_CHARS + 1))
                .parse()
                .unwrap_err()
                .path,
            "model"
        );
        assert_eq!(model("a\nb".to_owned()).parse().unwrap_err().path, "model");
        assert_eq!(model(String::new()).parse().unwrap_err().path, "model");
    }

    #[test]
    fn a_query_tool_list_drops_blanks() {
        assert_eq!(tool_list(" Bash, Read,,Edit ,"), ["Bash", "Read", "Edit"]);
        assert!(tool_list(" , ").is_empty());
    }
}
