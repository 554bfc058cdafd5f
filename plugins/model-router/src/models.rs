//! `GET /v1/models` and `GET /v1/models/{id}`: the model groups a key may use, answered by the
//! router itself in OpenAI's shape. Never sent to a provider: the reply is local, so the filters
//! after the router (rate limits, budgets, usage) never see the request, and it is no model call.
//!
//! The list is the configured groups, in configuration order, that `x-llm-groups` allows
//! ([`crate::plan::group_allowed`], the same rule as a model call); a group the key may not use
//! and a group that does not exist get the same 404 `model_not_found`, so a key cannot probe
//! for the names of groups it may not use.

use crate::config::RouterConfig;
use crate::plan::group_allowed;
use llm_gateway_shared::reject::Reject;
use serde::Serialize;

/// The path of the list; `/v1/models/{id}` retrieves one.
pub const MODELS_PATH: &str = "/v1/models";
/// `owned_by` of every model object.
pub const OWNED_BY: &str = "llm-gateway";

/// A request for the model list or one model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Listing {
    /// `GET /v1/models`
    List,
    /// `GET /v1/models/{id}`, the id percent-decoded.
    Retrieve(String),
}

/// What a `GET` of `path` (with or without a query) asks for; `None` if it is not one of the
/// model paths, or not a `GET`.
pub fn listing(method: &str, path: &str) -> Option<Listing> {
    if method != "GET" {
        return None;
    }
    let path = path.split(['?', '#']).next().unwrap_or_default();
    let rest = path.strip_prefix(MODELS_PATH)?;
    if rest.is_empty() || rest == "/" {
        return Some(Listing::List);
    }
    let id = rest.strip_prefix('/')?;
    // an id that does not decode names no group: retrieve answers 404 for it
    Some(Listing::Retrieve(percent_decode(id).unwrap_or_default()))
}

#[derive(Serialize)]
struct Model<'a> {
    id: &'a str,
    object: &'static str,
    created: u64,
    owned_by: &'static str,
}

#[derive(Serialize)]
struct List<'a> {
    object: &'static str,
    data: Vec<Model<'a>>,
}

fn model(id: &str, created: u64) -> Model<'_> {
    Model {
        id,
        object: "model",
        created,
        owned_by: OWNED_BY,
    }
}

/// The `200` body for `listing`: the groups `allowed` (the `x-llm-groups` value) lets the key
/// use, `created` (Unix seconds) on each; 404 `model_not_found` for a group it may not use or
/// that does not exist.
pub fn answer(
    config: &RouterConfig,
    listing: &Listing,
    allowed: Option<&str>,
    created: u64,
) -> Result<Vec<u8>, Reject> {
    let body = match listing {
        Listing::List => serde_json::to_vec(&List {
            object: "list",
            data: config
                .groups
                .iter()
                .filter(|g| group_allowed(config, allowed, &g.name))
                .map(|g| model(&g.name, created))
                .collect(),
        }),
        Listing::Retrieve(id) => match config.group(id) {
            Some(group) if group_allowed(config, allowed, &group.name) => {
                serde_json::to_vec(&model(&group.name, created))
            }
            _ => {
                return Err(Reject::not_found(
                    "model_not_found",
                    "the model does not exist or you do not have access to it",
                ))
            }
        },
    };
    body.map_err(|_| Reject::internal("cannot write the model list"))
}

/// `%XX` sequences decoded; `None` if one is malformed or the result is not UTF-8.
fn percent_decode(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while let Some(&b) = bytes.get(i) {
        if b == b'%' {
            let hex = bytes.get(i + 1..i + 3)?;
            let hex = std::str::from_utf8(hex).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(b);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::parse_document;
    use serde_json::{json, Value};

    fn config(extra: &str) -> RouterConfig {
        let doc = format!(
            r#"{{"deployments": [
                {{"name": "a", "cluster": "c", "model": "m", "provider": "openai"}},
                {{"name": "b", "cluster": "c", "model": "m", "provider": "openai"}}
              ],
              "groups": [
                {{"name": "fast", "deployments": [{{"deployment": "a"}}]}},
                {{"name": "smart", "deployments": [{{"deployment": "b"}}]}},
                {{"name": "org/claude", "deployments": [{{"deployment": "b"}}]}}
              ]{extra}}}"#
        );
        parse_document(doc.as_bytes())
            .unwrap()
            .global()
            .unwrap()
            .clone()
    }

    fn ids(body: &[u8]) -> Vec<String> {
        let v: Value = serde_json::from_slice(body).unwrap();
        assert_eq!(v["object"], "list");
        v["data"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["id"].as_str().unwrap().to_string())
            .collect()
    }

    #[test]
    fn listing_from_method_and_path() {
        for (method, path, expected) in [
            ("GET", "/v1/models", Some(Listing::List)),
            ("GET", "/v1/models/", Some(Listing::List)),
            ("GET", "/v1/models?limit=5", Some(Listing::List)),
            (
                "GET",
                "/v1/models/fast",
                Some(Listing::Retrieve("fast".into())),
            ),
            (
                "GET",
                "/v1/models/org%2Fclaude?x=1",
                Some(Listing::Retrieve("org/claude".into())),
            ),
            (
                "GET",
                "/v1/models/org/claude",
                Some(Listing::Retrieve("org/claude".into())),
            ),
            (
                "GET",
                "/v1/models/%zz",
                Some(Listing::Retrieve(String::new())),
            ),
            (
                "GET",
                "/v1/models/%e9",
                Some(Listing::Retrieve(String::new())),
            ),
            (
                "GET",
                "/v1/models/%",
                Some(Listing::Retrieve(String::new())),
            ),
            ("POST", "/v1/models", None),
            ("HEAD", "/v1/models", None),
            ("GET", "/v1/modelsx", None),
            ("GET", "/v1/chat/completions", None),
            ("GET", "/models", None),
            ("GET", "", None),
        ] {
            assert_eq!(listing(method, path), expected, "{method} {path}");
        }
    }

    #[test]
    fn the_list_is_the_groups_the_key_may_use() {
        let c = config("");
        let all = answer(&c, &Listing::List, Some("*"), 7).unwrap();
        assert_eq!(ids(&all), ["fast", "smart", "org/claude"]);
        let v: Value = serde_json::from_slice(&all).unwrap();
        assert_eq!(
            v["data"][0],
            json!({"id": "fast", "object": "model", "created": 7, "owned_by": "llm-gateway"})
        );
        let fast = answer(&c, &Listing::List, Some("fast"), 7).unwrap();
        assert_eq!(ids(&fast), ["fast"]);
        // the key's order and unknown names do not matter: config order, known groups only
        let two = answer(&c, &Listing::List, Some(" smart , gone,fast"), 7).unwrap();
        assert_eq!(ids(&two), ["fast", "smart"]);
        let none = answer(&c, &Listing::List, Some(""), 7).unwrap();
        assert_eq!(ids(&none), Vec::<String>::new());
        // no x-llm-groups: no group while the router enforces groups (the default), every
        // group when it does not (the same rule as a model call)
        assert!(ids(&answer(&c, &Listing::List, None, 7).unwrap()).is_empty());
        let open = config(r#", "enforce_groups": false"#);
        assert_eq!(
            ids(&answer(&open, &Listing::List, None, 7).unwrap()).len(),
            3
        );
    }

    #[test]
    fn retrieve_answers_a_usable_group_and_404_otherwise() {
        let c = config("");
        let body = answer(&c, &Listing::Retrieve("fast".into()), Some("fast"), 9).unwrap();
        let v: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(
            v,
            json!({"id": "fast", "object": "model", "created": 9, "owned_by": "llm-gateway"})
        );
        // not allowed and not there: the same answer
        for (id, allowed) in [("smart", "fast"), ("nope", "*"), ("", "*"), ("FAST", "*")] {
            let reject = answer(&c, &Listing::Retrieve(id.into()), Some(allowed), 9).unwrap_err();
            assert_eq!(reject.status, 404, "{id}");
            assert_eq!(reject.code, "model_not_found", "{id}");
            let body: Value = serde_json::from_slice(&reject.body()).unwrap();
            assert_eq!(body["error"]["type"], "not_found_error", "{id}");
        }
    }
}
