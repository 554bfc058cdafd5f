//! Fallback through the internal redirect (`"fallback": "redirect"`): Higress 2.2.4 and plain
//! Envoy 1.36–1.38, which have no `refresh_cluster_on_retry` (and Higress no upstream filters).
//!
//! There Envoy does not retry to another cluster; `custom_response` sends the request through
//! the whole chain again as a new stream on a provider's 429 or 5xx (or Envoy's own 503 for a
//! connect failure). The router cannot keep anything in filter state across that: the new
//! stream starts with none. It writes its [`Continuation`] into filter state instead
//! ([`PROPERTY`], `wasm.llm_route_next`), only while a later deployment exists; the redirect
//! policy fires only when that filter state is set (so the last deployment's error reaches the
//! client as it is) and copies it into the new stream's `x-llm-route-next`
//! (`%FILTER_STATE(wasm.llm_route_next:PLAIN)%`). key-auth lets that header through only on a
//! pass whose re-entry ticket it verified (it removes every other client `x-llm-*`), so the
//! router trusts it there and nowhere else.
//!
//! Upstream Envoy's redirect answers with the FIRST response's status (`custom_response` keeps
//! the error code of the response it replaced); `envoy-config/gateway-1.36.yaml` has the policy
//! report the real one (`x-llm-upstream-status: %RESPONSE_CODE%`) and a Lua filter between it
//! and the plugins put it back, so every plugin sees the status the deployment sent.

use crate::translate::{Asked, Wire};
use llm_gateway_shared::config::ConfigError;
use serde::Deserialize;

/// Filter state with the continuation of the next pass (`wasm.llm_route_next`).
pub const PROPERTY: &str = "llm_route_next";

/// Where the first pass keeps the client's `:path` when it sends the request elsewhere (a
/// translated attempt, Azure, a `path_prefix`). Higress's redirect with
/// `use_original_request_uri` builds the next pass's path from this header, else from the
/// edited `:path`, and re-sends the client's original body (`use_original_request_body`):
/// without it the client's body would come back at the first deployment's path, in another
/// API than the path says. Higress's own ai-proxy keeps it the same way
/// (`util.OverwriteRequestPath`). Upstream Envoy ignores it (its redirect re-sends the edited
/// body to the edited path).
pub const ORIGINAL_PATH_HEADER: &str = "x-envoy-original-path";

/// How the router moves a request to the next deployment of its plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Fallback {
    /// Envoy's retries, one cluster per attempt (matcher cluster specifier and
    /// `refresh_cluster_on_retry`, Envoy >= 1.39), rewritten per attempt by the upstream role.
    #[default]
    Retry,
    /// The `custom_response` internal redirect re-runs the chain; the listener role rewrites
    /// each pass itself (no upstream role).
    Redirect,
}

/// Where the next pass continues: attempt `attempt` (1-based) of `plan`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Continuation {
    /// The attempt the pass makes (2 for the first fallback).
    pub attempt: u32,
    /// The model group.
    pub group: String,
    /// The logical request id (`x-llm-request-id`), the same on every pass.
    pub request_id: String,
    /// The plan's deployment names, attempt order.
    pub plan: Vec<String>,
    /// The client's API and what it asked for, when the client speaks one the router
    /// translates: a later pass's body may be in another API (the one an earlier pass
    /// translated it into), and its answer must reach the client in the client's.
    pub client: Option<Client>,
}

/// The API a client speaks and what it asked for (the continuation's fifth field:
/// `chat`, `messages`, each optionally with `+stream` and `+usage`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Client {
    /// The client's API.
    pub wire: Wire,
    /// What it asked for.
    pub asked: Asked,
}

impl Client {
    fn encode(self) -> String {
        let mut text = String::from(match self.wire {
            Wire::Chat => "chat",
            Wire::Messages => "messages",
        });
        if self.asked.stream {
            text.push_str("+stream");
        }
        if self.asked.include_usage {
            text.push_str("+usage");
        }
        text
    }

    fn parse(text: &str) -> Option<Client> {
        let mut parts = text.split('+');
        let wire = match parts.next()? {
            "chat" => Wire::Chat,
            "messages" => Wire::Messages,
            _ => return None,
        };
        let mut asked = Asked::default();
        for flag in parts {
            match flag {
                "stream" => asked.stream = true,
                "usage" => asked.include_usage = true,
                _ => return None,
            }
        }
        Some(Client { wire, asked })
    }
}

impl Continuation {
    /// The continuation after attempt `attempt` of `plan`, if the plan has a later deployment.
    pub fn after(attempt: u32, group: &str, request_id: &str, plan: &[&str]) -> Option<Self> {
        let next = attempt.checked_add(1)?;
        if usize::try_from(next).ok()? > plan.len() {
            return None;
        }
        Some(Continuation {
            attempt: next,
            group: group.to_string(),
            request_id: request_id.to_string(),
            plan: plan.iter().map(|s| s.to_string()).collect(),
            client: None,
        })
    }

    /// `<attempt>|<group>|<request id>|<name>,<name>…[|<client>]` (names never hold `|` or
    /// `,`: [`llm_gateway_shared::config::validate_name`]).
    pub fn encode(&self) -> String {
        let mut text = format!(
            "{}|{}|{}|{}",
            self.attempt,
            self.group,
            self.request_id,
            self.plan.join(",")
        );
        if let Some(client) = self.client {
            text.push('|');
            text.push_str(&client.encode());
        }
        text
    }

    /// The continuation a header carries; `None` for anything malformed.
    pub fn parse(text: &[u8]) -> Option<Self> {
        let text = std::str::from_utf8(text).ok()?;
        let mut parts = text.splitn(5, '|');
        let attempt: u32 = parts.next()?.parse().ok()?;
        let group = parts.next()?;
        let request_id = parts.next()?;
        let plan: Vec<String> = parts.next()?.split(',').map(str::to_string).collect();
        let client = match parts.next() {
            None => None,
            Some(text) => Some(Client::parse(text)?),
        };
        let valid = |s: &str| !s.is_empty() && !s.contains('|');
        if attempt < 2
            || usize::try_from(attempt).ok()? > plan.len()
            || !valid(group)
            || !valid(request_id)
            || !plan.iter().all(|n| valid(n))
        {
            return None;
        }
        Some(Continuation {
            attempt,
            group: group.to_string(),
            request_id: request_id.to_string(),
            plan,
            client,
        })
    }

    /// The deployment name of this pass's attempt.
    pub fn deployment(&self) -> Option<&str> {
        let index = usize::try_from(self.attempt).ok()?.checked_sub(1)?;
        self.plan.get(index).map(String::as_str)
    }
}

/// Config check: the budget fallback switches plans in token-ratelimit, after the router, in a
/// way that relies on the upstream role; it is not available with the redirect yet.
pub fn validate(fallback: Fallback, has_budget_fallback: bool) -> Result<(), ConfigError> {
    if fallback == Fallback::Redirect && has_budget_fallback {
        return Err(ConfigError::new(
            "fallback",
            "\"redirect\" cannot be combined with a group's budget_fallback yet (it needs the upstream role of \"retry\")",
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_continuation_exists_only_while_a_deployment_is_left() {
        let plan = ["a", "b", "c"];
        let second = Continuation::after(1, "fast", "rid", &plan).unwrap();
        assert_eq!(second.encode(), "2|fast|rid|a,b,c");
        assert_eq!(second.deployment(), Some("b"));
        let third = Continuation::after(2, "fast", "rid", &plan).unwrap();
        assert_eq!(third.deployment(), Some("c"));
        assert_eq!(Continuation::after(3, "fast", "rid", &plan), None);
        assert_eq!(Continuation::after(1, "fast", "rid", &["a"]), None);
    }

    #[test]
    fn parse_reads_what_encode_wrote_and_nothing_else() {
        let cont = Continuation::after(1, "fast", "0123abcd", &["openai-mini", "azure-mini"]);
        let cont = cont.unwrap();
        assert_eq!(Continuation::parse(cont.encode().as_bytes()), Some(cont));
        for bad in [
            "",
            "1|fast|rid|a,b",            // the first pass never continues
            "3|fast|rid|a,b",            // past the plan
            "2||rid|a,b",                // no group
            "2|fast||a,b",               // no id
            "2|fast|rid|a,,b",           // an empty name
            "x|fast|rid|a,b",            // not a number
            "2|fast|rid|a|b",            // a separator in a name
            "2|fast|rid|a,b|",           // an empty client
            "2|fast|rid|a,b|grpc",       // an unknown client API
            "2|fast|rid|a,b|chat+tools", // an unknown flag
            "2|fast|rid|a,b|chat|x",     // a sixth field
            "-",                         // what a formatter prints for missing state
        ] {
            assert_eq!(Continuation::parse(bad.as_bytes()), None, "{bad}");
        }
        assert_eq!(Continuation::parse(b"2|fast|rid|\xff"), None);
    }

    #[test]
    fn the_client_api_travels_with_the_continuation() {
        for (wire, stream, include_usage, text) in [
            (Wire::Chat, false, false, "chat"),
            (Wire::Chat, true, true, "chat+stream+usage"),
            (Wire::Messages, true, false, "messages+stream"),
        ] {
            let mut cont = Continuation::after(1, "mixed", "rid", &["claude", "openai"]).unwrap();
            cont.client = Some(Client {
                wire,
                asked: Asked {
                    stream,
                    include_usage,
                },
            });
            let encoded = cont.encode();
            assert_eq!(encoded, format!("2|mixed|rid|claude,openai|{text}"));
            assert_eq!(Continuation::parse(encoded.as_bytes()), Some(cont));
        }
    }

    #[test]
    fn budget_fallback_needs_retry() {
        assert!(validate(Fallback::Redirect, true).is_err());
        assert!(validate(Fallback::Redirect, false).is_ok());
        assert!(validate(Fallback::Retry, true).is_ok());
    }

    proptest! {
        #[test]
        fn parse_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = Continuation::parse(&bytes);
        }
    }
}
