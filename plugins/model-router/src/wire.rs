//! How each attempt speaks to its deployment: which API the provider serves for the client's
//! endpoint (natively, through a translation, or not at all), at which path, with which
//! credential header.
//!
//! The client's API comes from its path ([`Endpoint::from_path`]); the deployment's from its
//! `provider`. OpenAI Chat Completions and Anthropic Messages translate into each other
//! ([`crate::translate`]), so every deployment serves both; the Responses API, embeddings and
//! Anthropic's token counting have no counterpart and are served only where they are native
//! (an Anthropic deployment serves no embeddings; only an Anthropic deployment counts tokens).
//! A request whose endpoint a deployment cannot serve skips it in the plan ([`crate::plan`]).
//!
//! The path a provider gets: unchanged when the deployment speaks the client's API at the
//! standard place (today's bytes: a route prefix stays the route's to strip); else the
//! deployment's own (`<path_prefix>/v1/messages`, `<path_prefix>/v1/chat/completions`, Azure's
//! `/openai/deployments/<name>/chat/completions?api-version=<v>`).

use crate::config::{Deployment, Provider};
use crate::translate::Wire;
use llm_gateway_shared::request::{Api, Endpoint};

/// The credential headers a provider may take; an attempt sets its deployment's and removes
/// the others.
pub use llm_gateway_shared::route_info::CREDENTIAL_HEADERS;

/// How a deployment serves a request whose body is in `endpoint`'s API.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Service {
    /// As it is (only `model` and the credential change).
    Native,
    /// Translated from the first API into the second.
    Translated(Wire, Wire),
}

/// The translatable API of an endpoint, if it has one.
pub fn endpoint_wire(endpoint: Endpoint) -> Option<Wire> {
    match endpoint {
        Endpoint::Api(Api::ChatCompletions) => Some(Wire::Chat),
        Endpoint::Api(Api::AnthropicMessages) => Some(Wire::Messages),
        _ => None,
    }
}

/// The endpoint of a wire API.
pub fn wire_endpoint(wire: Wire) -> Endpoint {
    match wire {
        Wire::Chat => Endpoint::Api(Api::ChatCompletions),
        Wire::Messages => Endpoint::Api(Api::AnthropicMessages),
    }
}

/// The API name of a wire API in records and metrics (`shared::request::Api::name`).
pub fn wire_name(wire: Wire) -> &'static str {
    match wire {
        Wire::Chat => Api::ChatCompletions.name(),
        Wire::Messages => Api::AnthropicMessages.name(),
    }
}

impl Deployment {
    /// The wire API the provider speaks.
    pub fn wire(&self) -> Wire {
        match self.provider {
            Provider::Anthropic => Wire::Messages,
            Provider::Openai | Provider::OpenaiCompatible | Provider::Azure => Wire::Chat,
        }
    }

    /// How this deployment serves a request of `endpoint`; `None` if it cannot.
    pub fn serves(&self, endpoint: Endpoint) -> Option<Service> {
        if let Some(wire) = endpoint_wire(endpoint) {
            let own = self.wire();
            return Some(if own == wire {
                Service::Native
            } else {
                Service::Translated(wire, own)
            });
        }
        let native = match (endpoint, self.provider) {
            (Endpoint::CountTokens, Provider::Anthropic) => true,
            (Endpoint::CountTokens, _) => false,
            (Endpoint::Api(Api::Responses), p) => {
                matches!(p, Provider::Openai | Provider::OpenaiCompatible)
            }
            (Endpoint::Api(Api::Embeddings), p) => p != Provider::Anthropic,
            (Endpoint::Api(_), _) => false,
        };
        native.then_some(Service::Native)
    }

    /// The endpoint the provider gets for a request of `endpoint` (its own API's when
    /// translated).
    pub fn provider_endpoint(&self, endpoint: Endpoint) -> Endpoint {
        match self.serves(endpoint) {
            Some(Service::Translated(_, to)) => wire_endpoint(to),
            _ => endpoint,
        }
    }

    /// The path the provider gets for a request of `endpoint` that arrived at `current`
    /// (the request's `:path`); `None` when `current` is right as it is.
    pub fn path(&self, endpoint: Endpoint, current: &str) -> Option<String> {
        let endpoint = self.provider_endpoint(endpoint);
        let wanted = self.standard_path(endpoint)?;
        if wanted == current {
            return None;
        }
        // A request at the standard place already (a route prefix or a query the client
        // added included) goes as it is, as before translation existed.
        let native_here = self.provider != Provider::Azure
            && self.path_prefix.is_empty()
            && Endpoint::from_path(current) == Some(endpoint)
            && !current.starts_with("/openai/deployments/");
        if native_here {
            return None;
        }
        Some(wanted)
    }

    /// Where the provider serves `endpoint`; `None` for an endpoint it has no path for.
    fn standard_path(&self, endpoint: Endpoint) -> Option<String> {
        let suffix = match endpoint {
            Endpoint::Api(Api::ChatCompletions) => "chat/completions",
            Endpoint::Api(Api::AnthropicMessages) => "messages",
            Endpoint::Api(Api::Responses) => "responses",
            Endpoint::Api(Api::Embeddings) => "embeddings",
            Endpoint::CountTokens => "messages/count_tokens",
        };
        if self.provider == Provider::Azure {
            let name = self.azure_deployment.as_deref().unwrap_or(&self.model);
            let version = self.api_version.as_deref().unwrap_or_default();
            return Some(
                [
                    "/openai/deployments/",
                    name,
                    "/",
                    suffix,
                    "?api-version=",
                    version,
                ]
                .concat(),
            );
        }
        Some([self.path_prefix.as_str(), "/v1/", suffix].concat())
    }

    /// The header this deployment's credential goes in.
    pub fn credential_header(&self) -> &'static str {
        match self.provider {
            Provider::Anthropic => "x-api-key",
            Provider::Azure => "api-key",
            Provider::Openai | Provider::OpenaiCompatible => "authorization",
        }
    }

    /// The credential header's value.
    pub fn credential_value(&self, credential: &str) -> String {
        match self.provider {
            Provider::Openai | Provider::OpenaiCompatible => ["Bearer ", credential].concat(),
            Provider::Anthropic | Provider::Azure => credential.to_string(),
        }
    }

    /// Translating to Chat: the output cap goes into `max_completion_tokens` (OpenAI's own
    /// API) or `max_tokens` (Azure's older versions, OpenAI-compatible providers).
    pub fn takes_max_completion_tokens(&self) -> bool {
        self.provider == Provider::Openai
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::parse_document;

    fn deployments() -> Vec<Deployment> {
        let doc = r#"{"deployments":[
            {"name":"o","cluster":"c","model":"gpt-4o","provider":"openai"},
            {"name":"a","cluster":"c","model":"claude","provider":"anthropic"},
            {"name":"z","cluster":"c","model":"gpt-4o-mini","provider":"azure","api_version":"2024-10-21"},
            {"name":"q","cluster":"c","model":"qwen-plus","provider":"openai-compatible","path_prefix":"/compatible-mode/"},
            {"name":"d","cluster":"c","model":"deepseek-chat","provider":"openai-compatible"}]}"#;
        let rules = parse_document(doc.as_bytes()).unwrap();
        rules.global().unwrap().deployments.clone()
    }

    const CHAT: Endpoint = Endpoint::Api(Api::ChatCompletions);
    const MESSAGES: Endpoint = Endpoint::Api(Api::AnthropicMessages);
    const RESPONSES: Endpoint = Endpoint::Api(Api::Responses);
    const EMBEDDINGS: Endpoint = Endpoint::Api(Api::Embeddings);

    #[test]
    fn every_deployment_serves_both_wire_apis_and_only_its_own_others() {
        let [o, a, z, q, d] = <[Deployment; 5]>::try_from(deployments()).unwrap();
        assert_eq!(o.serves(CHAT), Some(Service::Native));
        assert_eq!(
            o.serves(MESSAGES),
            Some(Service::Translated(Wire::Messages, Wire::Chat))
        );
        assert_eq!(
            a.serves(CHAT),
            Some(Service::Translated(Wire::Chat, Wire::Messages))
        );
        assert_eq!(a.serves(MESSAGES), Some(Service::Native));
        assert_eq!(
            z.serves(MESSAGES),
            Some(Service::Translated(Wire::Messages, Wire::Chat))
        );
        // no counterpart: served where native only
        assert_eq!(a.serves(RESPONSES), None);
        assert_eq!(a.serves(EMBEDDINGS), None);
        assert_eq!(z.serves(RESPONSES), None);
        assert_eq!(z.serves(EMBEDDINGS), Some(Service::Native));
        assert_eq!(o.serves(RESPONSES), Some(Service::Native));
        assert_eq!(q.serves(RESPONSES), Some(Service::Native));
        assert_eq!(a.serves(Endpoint::CountTokens), Some(Service::Native));
        for other in [&o, &z, &q, &d] {
            assert_eq!(other.serves(Endpoint::CountTokens), None, "{}", other.name);
        }
    }

    #[test]
    fn paths_change_only_where_the_provider_needs_another() {
        let [o, a, z, q, _] = <[Deployment; 5]>::try_from(deployments()).unwrap();
        // native at the standard place: as it is, prefix and query included
        assert_eq!(o.path(CHAT, "/v1/chat/completions"), None);
        assert_eq!(o.path(CHAT, "/openai/v1/chat/completions?x=1"), None);
        assert_eq!(a.path(MESSAGES, "/v1/messages?beta=true"), None);
        // translated: the deployment's API at its standard place
        assert_eq!(
            a.path(CHAT, "/v1/chat/completions").as_deref(),
            Some("/v1/messages")
        );
        assert_eq!(
            o.path(MESSAGES, "/v1/messages?beta=true").as_deref(),
            Some("/v1/chat/completions")
        );
        // Azure: its deployment path and api-version, translated or not
        assert_eq!(
            z.path(CHAT, "/v1/chat/completions").as_deref(),
            Some("/openai/deployments/gpt-4o-mini/chat/completions?api-version=2024-10-21")
        );
        assert_eq!(
            z.path(MESSAGES, "/v1/messages").as_deref(),
            Some("/openai/deployments/gpt-4o-mini/chat/completions?api-version=2024-10-21")
        );
        assert_eq!(
            z.path(
                CHAT,
                "/openai/deployments/gpt-4o-mini/chat/completions?api-version=2024-10-21"
            ),
            None
        );
        // an Azure path in the request goes to OpenAI's place for an OpenAI deployment
        assert_eq!(
            o.path(
                CHAT,
                "/openai/deployments/gpt-4o-mini/chat/completions?api-version=2024-10-21"
            )
            .as_deref(),
            Some("/v1/chat/completions")
        );
        // a path prefix (DashScope's compatible mode), trailing slash trimmed
        assert_eq!(
            q.path(CHAT, "/v1/chat/completions").as_deref(),
            Some("/compatible-mode/v1/chat/completions")
        );
        assert_eq!(q.path(CHAT, "/compatible-mode/v1/chat/completions"), None);
    }

    #[test]
    fn credentials_go_where_each_provider_reads_them() {
        let [o, a, z, q, _] = <[Deployment; 5]>::try_from(deployments()).unwrap();
        assert_eq!(o.credential_header(), "authorization");
        assert_eq!(o.credential_value("sk"), "Bearer sk");
        assert_eq!(q.credential_value("sk"), "Bearer sk");
        assert_eq!(a.credential_header(), "x-api-key");
        assert_eq!(a.credential_value("sk"), "sk");
        assert_eq!(z.credential_header(), "api-key");
        assert_eq!(z.credential_value("k"), "k");
        assert!(o.takes_max_completion_tokens());
        assert!(!z.takes_max_completion_tokens() && !q.takes_max_completion_tokens());
    }
}
