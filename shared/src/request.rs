//! One view of a request for every filter: which API and endpoint its path addresses, and its
//! headers read once into plain values.
//!
//! [`Api`] names the APIs whose usage the gateway reads, charges and records, and
//! [`Endpoint::from_path`] is the one classification of paths every plugin takes: the
//! accounting, the redaction, the rate limits and the router all see the same API for the same
//! path (a Higress route with a provider prefix, `/openai/v1/chat/completions`, included).
//!
//! The accepted forms: the path without its query and fragment (and without trailing `/`) ends
//! in `/v1/<endpoint>`, where `<endpoint>` is one of `chat/completions`, `responses`,
//! `messages`, `messages/count_tokens`, `embeddings`; anything may come before the `/v1` (a
//! route prefix such as `/openai` or `/anthropic`). The `/v1/` segment is required: it is what
//! tells an API call from another resource whose path merely ends in the same word (OpenAI's
//! `/v1/threads/{id}/messages`, a site's own `/chat/completions` page).
//!
//! [`RequestHead`] holds the request headers after one host read (one `get_header_map_pairs`
//! instead of one call per header), with the values every filter asks for already parsed.

use crate::headers;
use crate::wire::EncodedHeaders;
use std::rc::Rc;

/// Request headers as the host lists them: lowercase names, byte values, in order.
pub type Pairs = Vec<(String, Vec<u8>)>;

/// What a request path addresses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    /// An API whose usage is read, charged and recorded.
    Api(Api),
    /// Anthropic's `POST /v1/messages/count_tokens`: routed like a message (to an Anthropic
    /// deployment), but it generates nothing, so it is counted as a request and charged no
    /// tokens.
    CountTokens,
}

/// The endpoint suffixes after `/v1`, longest first where one ends another.
const SUFFIXES: [(&str, Endpoint); 5] = [
    ("/v1/chat/completions", Endpoint::Api(Api::ChatCompletions)),
    ("/v1/responses", Endpoint::Api(Api::Responses)),
    ("/v1/messages/count_tokens", Endpoint::CountTokens),
    ("/v1/messages", Endpoint::Api(Api::AnthropicMessages)),
    ("/v1/embeddings", Endpoint::Api(Api::Embeddings)),
];

/// Azure OpenAI's deployment paths: `/openai/deployments/<name>/<suffix>`.
const AZURE_PREFIX: &str = "/openai/deployments/";
const AZURE_SUFFIXES: [(&str, Endpoint); 2] = [
    ("/chat/completions", Endpoint::Api(Api::ChatCompletions)),
    ("/embeddings", Endpoint::Api(Api::Embeddings)),
];

impl Endpoint {
    /// The endpoint `path` addresses (query and fragment ignored); `None` for anything else.
    /// Besides the `/v1/…` forms, Azure OpenAI's `/openai/deployments/<name>/chat/completions`
    /// and `…/embeddings` (the model router sends an Azure deployment's attempt there, and the
    /// filters after it read that path).
    pub fn from_path(path: &str) -> Option<Endpoint> {
        let path = path.split(['?', '#']).next().unwrap_or_default();
        let path = path.trim_end_matches('/');
        if let Some(rest) = path.strip_prefix(AZURE_PREFIX) {
            let (name, tail) = rest.split_once('/')?;
            return AZURE_SUFFIXES
                .iter()
                .find(|(suffix, _)| !name.is_empty() && tail == &suffix[1..])
                .map(|(_, endpoint)| *endpoint);
        }
        SUFFIXES
            .iter()
            .find(|(suffix, _)| path.ends_with(suffix))
            .map(|(_, endpoint)| *endpoint)
    }

    /// The API whose usage the request produces; `None` for token counting.
    pub fn api(self) -> Option<Api> {
        match self {
            Endpoint::Api(api) => Some(api),
            Endpoint::CountTokens => None,
        }
    }
}

/// An API whose usage the gateway reads, charges and records; a request's comes from its path
/// ([`Api::from_path`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Api {
    /// `POST /v1/chat/completions`
    ChatCompletions,
    /// `POST /v1/responses`
    Responses,
    /// `POST /v1/messages` (Anthropic)
    AnthropicMessages,
    /// `POST /v1/embeddings`
    Embeddings,
}

impl Api {
    /// Every API, in declaration order.
    pub const ALL: [Api; 4] = [
        Api::ChatCompletions,
        Api::Responses,
        Api::AnthropicMessages,
        Api::Embeddings,
    ];

    /// Name in records and metrics (and in the router's `client_api`).
    pub fn name(self) -> &'static str {
        match self {
            Api::ChatCompletions => "chat.completions",
            Api::Responses => "responses",
            Api::AnthropicMessages => "messages",
            Api::Embeddings => "embeddings",
        }
    }

    /// The API whose [`Api::name`] is `name`; `None` for any other text.
    pub fn from_name(name: &str) -> Option<Api> {
        Api::ALL.into_iter().find(|api| api.name() == name)
    }

    /// The API a request path addresses (query string ignored); `None` for anything else,
    /// token counting included: the API part of [`Endpoint::from_path`].
    pub fn from_path(path: &str) -> Option<Api> {
        Endpoint::from_path(path).and_then(Endpoint::api)
    }
}

/// The request headers of one request, read once.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RequestHead {
    /// Every header as the host gave it (Envoy: lowercase names), values as bytes; shared
    /// with the fused filter's [`crate::chain::Headers`] rather than copied per stage.
    pairs: HeadPairs,
    /// `:method`.
    pub method: String,
    /// `:path`, query included.
    pub path: String,
    /// `:authority` (the rule matcher's domain).
    pub authority: String,
    /// What the path addresses.
    pub endpoint: Option<Endpoint>,
    /// `content-length`, when it is a number.
    pub content_length: Option<u64>,
    /// The logical request id (`x-llm-request-id`), when present and not empty.
    pub request_id: Option<String>,
    /// A verified re-entry of the same logical request (`x-llm-reentry` present).
    pub reentry: bool,
}

impl RequestHead {
    /// The view of `pairs` (the request's headers as the host lists them).
    pub fn new(pairs: Pairs) -> RequestHead {
        RequestHead::view(HeadPairs::Owned(pairs))
    }

    /// The view of headers shared with the fused filter's [`crate::chain::Headers`]
    /// ([`crate::chain::Headers::shared`]): no copy; they stay as they are while this view
    /// holds them.
    pub fn shared(pairs: Rc<Pairs>) -> RequestHead {
        RequestHead::view(HeadPairs::Shared(pairs))
    }

    /// The view of a header map as the host encoded it ([`wire::EncodedHeaders`]): one buffer
    /// and an index, no allocation per header (a plugin's own read of the request headers).
    pub fn encoded(headers: EncodedHeaders) -> RequestHead {
        RequestHead::view(HeadPairs::Encoded(headers))
    }

    fn view(pairs: HeadPairs) -> RequestHead {
        let mut head = RequestHead::default();
        for (name, value) in pairs.iter() {
            let text = || String::from_utf8_lossy(value).into_owned();
            match name {
                b":method" => head.method = text(),
                b":path" => head.path = text(),
                b":authority" => head.authority = text(),
                b"content-length" => {
                    head.content_length = std::str::from_utf8(value)
                        .ok()
                        .and_then(|v| v.trim().parse().ok())
                }
                _ if name == headers::REQUEST_ID.as_bytes() && !value.is_empty() => {
                    head.request_id = Some(text())
                }
                _ if name == headers::REENTRY.as_bytes() => head.reentry = true,
                _ => {}
            }
        }
        head.endpoint = Endpoint::from_path(&head.path);
        head.pairs = pairs;
        head
    }

    /// The API of the request; `None` for token counting and any other path.
    pub fn api(&self) -> Option<Api> {
        self.endpoint.and_then(Endpoint::api)
    }

    /// The first value of `name` (lowercase), as bytes.
    pub fn get(&self, name: &str) -> Option<&[u8]> {
        self.pairs
            .iter()
            .find(|(n, _)| *n == name.as_bytes())
            .map(|(_, v)| v)
    }

    /// The first value of `name` (lowercase) when it is UTF-8.
    pub fn text(&self, name: &str) -> Option<&str> {
        self.get(name).and_then(|v| std::str::from_utf8(v).ok())
    }

    /// True if `name` (lowercase) is present.
    pub fn has(&self, name: &str) -> bool {
        self.pairs.iter().any(|(n, _)| n == name.as_bytes())
    }

    /// Every header (name, value) in the host's order, as the host gave it.
    pub fn headers(&self) -> impl Iterator<Item = (&[u8], &[u8])> + '_ {
        self.pairs.iter()
    }
}

/// The headers a [`RequestHead`] views: its own list, the map as the host encoded it (a
/// filter's one read), or one shared with the fused filter's [`crate::chain::Headers`] (no
/// copy per stage).
#[derive(Debug, Clone)]
enum HeadPairs {
    /// A list of its own.
    Owned(Pairs),
    /// The host's encoding of the map, indexed in place.
    Encoded(EncodedHeaders),
    /// A list shared with the fused filter's headers as they were when the view was made.
    Shared(Rc<Pairs>),
}

impl HeadPairs {
    fn iter(&self) -> impl Iterator<Item = (&[u8], &[u8])> + '_ {
        let (listed, encoded) = match self {
            HeadPairs::Owned(pairs) => (Some(pairs.as_slice()), None),
            HeadPairs::Shared(pairs) => (Some(pairs.as_slice()), None),
            HeadPairs::Encoded(headers) => (None, Some(headers.iter())),
        };
        listed
            .unwrap_or_default()
            .iter()
            .map(|(n, v)| (n.as_bytes(), v.as_slice()))
            .chain(encoded.into_iter().flatten())
    }
}

impl Default for HeadPairs {
    fn default() -> Self {
        HeadPairs::Owned(Vec::new())
    }
}

impl PartialEq for HeadPairs {
    fn eq(&self, other: &Self) -> bool {
        self.iter().eq(other.iter())
    }
}

impl Eq for HeadPairs {}

#[cfg(test)]
mod tests {
    use super::*;

    fn endpoint(path: &str) -> Option<Endpoint> {
        Endpoint::from_path(path)
    }

    #[test]
    fn api_from_path() {
        assert_eq!(
            Api::from_path("/v1/chat/completions?x=1"),
            Some(Api::ChatCompletions)
        );
        assert_eq!(Api::from_path("/openai/v1/responses"), Some(Api::Responses));
        assert_eq!(Api::from_path("/v1/messages"), Some(Api::AnthropicMessages));
        assert_eq!(Api::from_path("/v1/embeddings/"), Some(Api::Embeddings));
        assert_eq!(Api::from_path("/v1/models"), None);
        // token counting generates nothing: no API whose usage is read, charged or recorded
        // (usage-accounting leaves it alone, token-ratelimit counts it as a request only)
        assert_eq!(Api::from_path("/v1/messages/count_tokens?beta=true"), None);
    }

    #[test]
    fn api_names_read_back() {
        for api in Api::ALL {
            assert_eq!(Api::from_name(api.name()), Some(api));
        }
        for other in ["", "chat", "Messages", "chat.completions ", "count_tokens"] {
            assert_eq!(Api::from_name(other), None, "{other:?}");
        }
    }

    #[test]
    fn the_v1_paths_and_their_prefixed_forms() {
        for prefix in ["", "/openai", "/anthropic", "/tenant-a/llm"] {
            let chat = format!("{prefix}/v1/chat/completions");
            assert_eq!(
                endpoint(&chat),
                Some(Endpoint::Api(Api::ChatCompletions)),
                "{chat}"
            );
            let responses = format!("{prefix}/v1/responses?stream=1");
            assert_eq!(
                endpoint(&responses),
                Some(Endpoint::Api(Api::Responses)),
                "{responses}"
            );
            let messages = format!("{prefix}/v1/messages?beta=true");
            assert_eq!(
                endpoint(&messages),
                Some(Endpoint::Api(Api::AnthropicMessages)),
                "{messages}"
            );
            let count = format!("{prefix}/v1/messages/count_tokens?beta=true");
            assert_eq!(endpoint(&count), Some(Endpoint::CountTokens), "{count}");
            let embeddings = format!("{prefix}/v1/embeddings/");
            assert_eq!(
                endpoint(&embeddings),
                Some(Endpoint::Api(Api::Embeddings)),
                "{embeddings}"
            );
        }
    }

    #[test]
    fn azure_deployment_paths() {
        assert_eq!(
            endpoint("/openai/deployments/gpt-4o/chat/completions?api-version=2024-10-21"),
            Some(Endpoint::Api(Api::ChatCompletions))
        );
        assert_eq!(
            endpoint("/openai/deployments/emb-3/embeddings?api-version=2024-10-21"),
            Some(Endpoint::Api(Api::Embeddings))
        );
    }

    #[test]
    fn other_resources_are_no_endpoint() {
        for path in [
            "/",
            "",
            "/v1/models",
            "/v1/messages/batches",
            "/v1/chat/completions/abc",
            "/v1/threads/thread_1/messages",
            "/chat/completions",
            "/openai/deployments//chat/completions",
            "/openai/deployments/gpt-4o/completions",
            "/openai/deployments/a/b/chat/completions",
            "/v1/chat/completionsx",
            "/v2/chat/completions",
            "/v1/responses/resp_1",
            "?/v1/chat/completions",
            "/x#/v1/messages",
        ] {
            assert_eq!(endpoint(path), None, "{path}");
        }
    }

    #[test]
    fn token_counting_has_no_api() {
        assert_eq!(Endpoint::CountTokens.api(), None);
        assert_eq!(Endpoint::Api(Api::Responses).api(), Some(Api::Responses));
    }

    fn pairs(list: &[(&str, &[u8])]) -> Vec<(String, Vec<u8>)> {
        list.iter()
            .map(|(n, v)| (n.to_string(), v.to_vec()))
            .collect()
    }

    #[test]
    fn the_head_parses_what_every_filter_asks_for() {
        let head = RequestHead::new(pairs(&[
            (":method", b"POST"),
            (":path", b"/openai/v1/chat/completions?x=1"),
            (":authority", b"gw.example"),
            ("content-length", b" 2048 "),
            ("x-llm-request-id", b"req-1"),
            ("x-llm-reentry", b""),
            ("x-project", b"alpha"),
            ("x-bad", &[0xff, 0xfe]),
        ]));
        assert_eq!(head.method, "POST");
        assert_eq!(head.path, "/openai/v1/chat/completions?x=1");
        assert_eq!(head.authority, "gw.example");
        assert_eq!(head.content_length, Some(2048));
        assert_eq!(head.request_id.as_deref(), Some("req-1"));
        assert!(head.reentry);
        assert_eq!(head.api(), Some(Api::ChatCompletions));
        assert_eq!(head.text("x-project"), Some("alpha"));
        assert_eq!(head.get("x-bad"), Some(&[0xff, 0xfe][..]));
        assert_eq!(head.text("x-bad"), None);
        assert!(head.has("x-llm-reentry"));
        assert!(!head.has("x-missing"));
        assert_eq!(head.headers().count(), 8);
    }

    #[test]
    fn missing_or_bad_values_are_absent() {
        let head = RequestHead::new(pairs(&[
            (":path", b"/v1/models"),
            ("content-length", b"12x"),
            ("x-llm-request-id", b""),
        ]));
        assert_eq!(head.method, "");
        assert_eq!(head.content_length, None);
        assert_eq!(head.request_id, None);
        assert!(!head.reentry);
        assert_eq!(head.endpoint, None);
        assert_eq!(RequestHead::new(Vec::new()), RequestHead::default());
    }

    #[test]
    fn a_shared_list_gives_the_same_view_as_an_own_one() {
        let list = pairs(&[
            (":method", b"POST"),
            (":path", b"/v1/embeddings"),
            ("x-llm-request-id", b"req-2"),
        ]);
        let shared = RequestHead::shared(Rc::new(list.clone()));
        assert_eq!(shared, RequestHead::new(list));
        assert_eq!(shared.api(), Some(Api::Embeddings));
        assert_eq!(shared.request_id.as_deref(), Some("req-2"));
        assert_eq!(shared.headers().count(), 3);
    }

    #[cfg(not(target_arch = "wasm32"))]
    mod properties {
        use super::*;
        use crate::wire::{encode_header_map, EncodedHeaders};
        use proptest::prelude::*;

        fn name() -> impl Strategy<Value = String> {
            prop_oneof![
                Just(":method".to_string()),
                Just(":path".to_string()),
                Just(":authority".to_string()),
                Just("content-length".to_string()),
                Just(crate::headers::REQUEST_ID.to_string()),
                Just(crate::headers::REENTRY.to_string()),
                "[a-z:-]{0,6}",
            ]
        }

        fn value() -> impl Strategy<Value = Vec<u8>> {
            prop_oneof![
                Just(b"/v1/chat/completions".to_vec()),
                Just(b" 42 ".to_vec()),
                proptest::collection::vec(any::<u8>(), 0..12),
            ]
        }

        proptest! {
            #[test]
            fn the_encoded_view_is_the_listed_view(
                list in proptest::collection::vec((name(), value()), 0..10),
                asked in name(),
            ) {
                let borrowed: Vec<(&str, &[u8])> =
                    list.iter().map(|(n, v)| (n.as_str(), v.as_slice())).collect();
                let encoded = EncodedHeaders::new(encode_header_map(&borrowed));
                prop_assert!(encoded.is_some());
                let encoded = RequestHead::encoded(encoded.unwrap_or_default());
                let listed = RequestHead::new(list.clone());
                prop_assert_eq!(&encoded, &listed);
                prop_assert_eq!(&encoded.method, &listed.method);
                prop_assert_eq!(&encoded.path, &listed.path);
                prop_assert_eq!(encoded.content_length, listed.content_length);
                prop_assert_eq!(&encoded.request_id, &listed.request_id);
                prop_assert_eq!(encoded.reentry, listed.reentry);
                prop_assert_eq!(encoded.endpoint, listed.endpoint);
                prop_assert_eq!(encoded.get(&asked), listed.get(&asked));
                prop_assert_eq!(encoded.text(&asked), listed.text(&asked));
                prop_assert_eq!(encoded.has(&asked), listed.has(&asked));
                let first = list.iter().find(|(n, _)| *n == asked).map(|(_, v)| v.as_slice());
                prop_assert_eq!(encoded.get(&asked), first);
            }
        }
    }
}
