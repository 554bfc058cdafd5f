//! `x-mock-tool-call`: an answer that calls one of the request's tools.

use crate::error::ApiError;
use crate::json::str_lit;
use crate::knobs::TOOL_CALL;

/// Characters per piece of a streamed call's arguments (one delta event each).
pub(crate) const ARGUMENT_PIECE_CHARS: usize = 5;

/// One call of a tool: `{"query": <text>}` as its arguments.
pub(crate) struct ToolCall {
    /// The tool's name as a JSON string literal.
    pub(crate) name: String,
    /// The arguments, a JSON object's text.
    pub(crate) arguments: String,
    pieces: Vec<String>,
}

impl ToolCall {
    /// A call of `name` with `{"query": query}` (`"tok0"` for an empty query).
    pub(crate) fn new(name: &str, query: &str) -> ToolCall {
        let query = if query.is_empty() { "tok0" } else { query };
        let arguments = format!(r#"{{"query":{}}}"#, str_lit(query));
        let chars: Vec<char> = arguments.chars().collect();
        let pieces = chars
            .chunks(ARGUMENT_PIECE_CHARS)
            .map(|c| c.iter().collect())
            .collect();
        ToolCall {
            name: str_lit(name),
            arguments,
            pieces,
        }
    }

    /// The arguments in pieces of [`ARGUMENT_PIECE_CHARS`] characters.
    pub(crate) fn pieces(&self) -> &[String] {
        &self.pieces
    }

    /// The completion token count: one per piece.
    pub(crate) fn tokens(&self) -> u64 {
        self.pieces.len() as u64
    }
}

/// The call `x-mock-tool-call` asks for: none without the knob, or when the request's last
/// message is a tool result (the model then answers in text); a `400` when `tools` (the
/// names of the request's tools) has no tool of that name.
pub(crate) fn requested<'t>(
    knob: Option<&str>,
    mut tools: impl Iterator<Item = &'t str>,
    answers_tool_result: bool,
    query: &str,
) -> Result<Option<ToolCall>, ApiError> {
    let Some(name) = knob.filter(|_| !answers_tool_result) else {
        return Ok(None);
    };
    if !tools.any(|tool| tool == name) {
        return Err(ApiError::invalid(
            &format!("{TOOL_CALL}: the request's tools have no tool named {name:?}"),
            Some(TOOL_CALL),
        ));
    }
    Ok(Some(ToolCall::new(name, query)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arguments_and_pieces() {
        let call = ToolCall::new("f", "héllo \"x\"");
        assert_eq!(call.arguments, r#"{"query":"héllo \"x\""}"#);
        assert_eq!(call.pieces().concat(), call.arguments);
        assert!(call.pieces().iter().all(|p| p.chars().count() <= 5));
        assert_eq!(call.tokens(), call.pieces().len() as u64);
        assert_eq!(ToolCall::new("f", "").arguments, r#"{"query":"tok0"}"#);
        assert_eq!(call.name, "\"f\"");
    }

    #[test]
    fn knob_needs_the_tool() {
        let tools = ["a", "b"];
        assert!(requested(None, tools.into_iter(), false, "q").is_ok_and(|c| c.is_none()));
        assert!(requested(Some("b"), tools.into_iter(), false, "q").is_ok_and(|c| c.is_some()));
        assert!(requested(Some("b"), tools.into_iter(), true, "q").is_ok_and(|c| c.is_none()));
        let e = requested(Some("z"), tools.into_iter(), false, "q").err();
        assert_eq!(e.map(|e| e.status.as_u16()), Some(400));
    }
}
