//! The tool side of a request, as every API maps it: the tools (OpenAI
//! function shape, `{"type": "function", "function": {name, description,
//! parameters}}`, which the chat templates render), `tool_choice` and
//! whether parallel calls are allowed. The [`crate::driver::Driver`] checks
//! the model's calls against it.

use serde_json::{Map, Value};

/// `tool_choice`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolChoice {
    Auto,
    None,
    Required,
    Named(String),
}

/// The tool side of a chat request.
#[derive(Debug, Clone, PartialEq)]
pub struct Tools {
    /// The request's `tools`, as given (rendered into the prompt).
    pub tools: Vec<Value>,
    pub choice: ToolChoice,
    pub parallel: bool,
    /// `chat_template_kwargs`, all of them (for the jinja template).
    pub kwargs: Map<String, Value>,
}

impl Default for Tools {
    fn default() -> Self {
        Tools {
            tools: Vec::new(),
            choice: ToolChoice::Auto,
            parallel: true,
            kwargs: Map::new(),
        }
    }
}

impl Tools {
    /// Tools as rendered into the prompt: none for `tool_choice: none`, only
    /// the named one for a named choice.
    pub fn rendered(&self) -> Vec<Value> {
        match &self.choice {
            ToolChoice::None => vec![],
            ToolChoice::Named(n) => self
                .tools
                .iter()
                .filter(|t| tool_name(t) == Some(n.as_str()))
                .cloned()
                .collect(),
            _ => self.tools.clone(),
        }
    }

    /// Whether the output is parsed for tool calls.
    pub fn parse_calls(&self) -> bool {
        !self.tools.is_empty() && self.choice != ToolChoice::None
    }
}

pub fn tool_name(t: &Value) -> Option<&str> {
    t.get("function")?.get("name")?.as_str()
}
