//! Which provider the mock plays: its routes, how it authenticates, the shape of its errors.

use std::fmt;
use std::str::FromStr;

use hyper::header::HeaderMap;
use hyper::{Method, StatusCode};

use crate::error::{ApiError, Dialect};

/// The provider a [`crate::MockUpstream`] plays (see the crate docs for each one's routes and
/// rules).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Flavor {
    /// Every route of every provider but Azure's, no authentication, lenient bodies,
    /// OpenAI-shaped errors.
    #[default]
    Any,
    /// api.openai.com: Chat Completions, Responses, embeddings; `authorization: Bearer`.
    Openai,
    /// api.anthropic.com: Messages and count_tokens; `x-api-key`, `anthropic-version`.
    Anthropic,
    /// Azure OpenAI: `/openai/deployments/{deployment}/…?api-version=`; `api-key`.
    Azure,
}

impl Flavor {
    /// Every flavor, for tests and usage lines.
    pub const ALL: [Flavor; 4] = [
        Flavor::Any,
        Flavor::Openai,
        Flavor::Anthropic,
        Flavor::Azure,
    ];

    /// The name `--flavor` takes.
    pub fn name(self) -> &'static str {
        match self {
            Flavor::Any => "any",
            Flavor::Openai => "openai",
            Flavor::Anthropic => "anthropic",
            Flavor::Azure => "azure",
        }
    }

    /// How this flavor writes its error bodies.
    pub(crate) fn dialect(self) -> Dialect {
        match self {
            Flavor::Anthropic => Dialect::Anthropic,
            Flavor::Any | Flavor::Openai | Flavor::Azure => Dialect::Openai,
        }
    }

    /// The route for a request, or this provider's 404.
    pub(crate) fn route(
        self,
        method: &Method,
        path: &str,
        query: Option<&str>,
    ) -> Result<Route, ApiError> {
        if method == Method::GET && path == "/health" {
            return Ok(Route::Health);
        }
        let found = if method == Method::POST {
            match self {
                Flavor::Any => match path {
                    "/v1/chat/completions" => Some(Route::Chat),
                    "/v1/messages" => Some(Route::Messages),
                    "/v1/messages/count_tokens" => Some(Route::CountTokens),
                    "/v1/responses" => Some(Route::Responses),
                    "/v1/embeddings" => Some(Route::Embeddings),
                    _ => None,
                },
                Flavor::Openai => match path {
                    "/v1/chat/completions" => Some(Route::Chat),
                    "/v1/responses" => Some(Route::Responses),
                    "/v1/embeddings" => Some(Route::Embeddings),
                    _ => None,
                },
                Flavor::Anthropic => match path {
                    "/v1/messages" => Some(Route::Messages),
                    "/v1/messages/count_tokens" => Some(Route::CountTokens),
                    _ => None,
                },
                Flavor::Azure => azure_route(path, query),
            }
        } else {
            None
        };
        found.ok_or_else(|| self.not_found(method, path))
    }

    fn not_found(self, method: &Method, path: &str) -> ApiError {
        match self {
            Flavor::Any | Flavor::Openai => ApiError {
                code: Some("not_found".to_owned()),
                ..ApiError::new(
                    StatusCode::NOT_FOUND,
                    format!("no route for {method} {path}"),
                    "invalid_request_error",
                )
            },
            Flavor::Anthropic => ApiError::new(
                StatusCode::NOT_FOUND,
                "Not Found".to_owned(),
                "invalid_request_error",
            ),
            Flavor::Azure => ApiError::azure(StatusCode::NOT_FOUND, "Resource not found"),
        }
    }

    /// The provider's authentication (presence only: any non-empty key is accepted).
    pub(crate) fn authenticate(self, headers: &HeaderMap) -> Result<(), ApiError> {
        let present = |name: &str| {
            headers
                .get(name)
                .and_then(|v| v.to_str().ok())
                .is_some_and(|v| !v.trim().is_empty())
        };
        match self {
            Flavor::Any => Ok(()),
            Flavor::Openai => {
                let bearer = headers
                    .get(hyper::header::AUTHORIZATION)
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.trim().split_once(' '))
                    .is_some_and(|(scheme, token)| {
                        scheme.eq_ignore_ascii_case("bearer") && !token.trim().is_empty()
                    });
                if bearer {
                    Ok(())
                } else {
                    Err(ApiError::new(
                        StatusCode::UNAUTHORIZED,
                        OPENAI_NO_KEY.to_owned(),
                        "invalid_request_error",
                    ))
                }
            }
            Flavor::Anthropic => {
                if !present("x-api-key") {
                    Err(ApiError::new(
                        StatusCode::UNAUTHORIZED,
                        "x-api-key header is required".to_owned(),
                        "authentication_error",
                    ))
                } else if !present("anthropic-version") {
                    Err(ApiError::bad_request(
                        "anthropic-version: header is required".to_owned(),
                        None,
                        None,
                    ))
                } else {
                    Ok(())
                }
            }
            Flavor::Azure => {
                if present("api-key") {
                    Ok(())
                } else {
                    Err(ApiError::azure(
                        StatusCode::UNAUTHORIZED,
                        AZURE_ACCESS_DENIED,
                    ))
                }
            }
        }
    }
}

/// OpenAI's 401 without an API key.
pub(crate) const OPENAI_NO_KEY: &str = "You didn't provide an API key. You need to provide your API key in an Authorization header using Bearer auth (i.e. Authorization: Bearer YOUR_KEY), or as the password field (with blank username) if you're accessing the API from your browser and are prompted for a username and password. You can obtain an API key from https://platform.openai.com/account/api-keys.";

/// Azure's 401 without an `api-key`.
pub(crate) const AZURE_ACCESS_DENIED: &str = "Access denied due to invalid subscription key or wrong API endpoint. Make sure to provide a valid key for an active subscription and use a correct regional API endpoint for your resource.";

/// `/openai/deployments/{deployment}/chat/completions` or `…/embeddings`, with a non-empty
/// `api-version` query parameter.
fn azure_route(path: &str, query: Option<&str>) -> Option<Route> {
    let rest = path.strip_prefix("/openai/deployments/")?;
    let (deployment, operation) = rest.split_once('/')?;
    if deployment.is_empty() {
        return None;
    }
    let has_version = query.is_some_and(|q| {
        q.split('&')
            .filter_map(|pair| pair.split_once('='))
            .any(|(key, value)| key == "api-version" && !value.is_empty())
    });
    if !has_version {
        return None;
    }
    let deployment = deployment.to_owned();
    match operation {
        "chat/completions" => Some(Route::AzureChat(deployment)),
        "embeddings" => Some(Route::AzureEmbeddings(deployment)),
        _ => None,
    }
}

/// What a request asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Route {
    Health,
    Chat,
    Messages,
    CountTokens,
    Responses,
    Embeddings,
    /// Azure's chat completions of a deployment (the path's).
    AzureChat(String),
    /// Azure's embeddings of a deployment.
    AzureEmbeddings(String),
}

impl FromStr for Flavor {
    type Err = String;

    fn from_str(s: &str) -> Result<Flavor, String> {
        Flavor::ALL
            .into_iter()
            .find(|f| f.name().eq_ignore_ascii_case(s))
            .ok_or_else(|| {
                format!("unknown flavor {s:?} (expected openai, anthropic, azure or any)")
            })
    }
}

impl fmt::Display for Flavor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hyper::header::HeaderValue;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.insert(*name, HeaderValue::from_str(value).expect("value"));
        }
        map
    }

    #[test]
    fn names_round_trip() {
        for flavor in Flavor::ALL {
            assert_eq!(flavor.name().parse::<Flavor>(), Ok(flavor));
            assert_eq!(flavor.to_string(), flavor.name());
        }
        assert_eq!("OpenAI".parse::<Flavor>(), Ok(Flavor::Openai));
        assert!("gemini".parse::<Flavor>().is_err());
        assert_eq!(Flavor::default(), Flavor::Any);
    }

    #[test]
    fn routes_per_flavor() {
        let post = Method::POST;
        let route =
            |flavor: Flavor, path: &str, query: Option<&str>| flavor.route(&post, path, query).ok();
        assert_eq!(
            route(Flavor::Any, "/v1/messages", None),
            Some(Route::Messages)
        );
        assert_eq!(route(Flavor::Openai, "/v1/messages", None), None);
        assert_eq!(
            route(Flavor::Openai, "/v1/responses", None),
            Some(Route::Responses)
        );
        assert_eq!(route(Flavor::Anthropic, "/v1/chat/completions", None), None);
        assert_eq!(
            route(Flavor::Anthropic, "/v1/messages/count_tokens", None),
            Some(Route::CountTokens)
        );
        assert_eq!(
            route(
                Flavor::Any,
                "/openai/deployments/d/chat/completions",
                Some("api-version=1")
            ),
            None
        );
        assert_eq!(
            route(
                Flavor::Azure,
                "/openai/deployments/gpt4o/chat/completions",
                Some("x=1&api-version=2024-10-21")
            ),
            Some(Route::AzureChat("gpt4o".into()))
        );
        assert_eq!(
            route(
                Flavor::Azure,
                "/openai/deployments/e/embeddings",
                Some("api-version=v")
            ),
            Some(Route::AzureEmbeddings("e".into()))
        );
        for (path, query) in [
            ("/openai/deployments/d/chat/completions", None),
            (
                "/openai/deployments/d/chat/completions",
                Some("api-version="),
            ),
            (
                "/openai/deployments//chat/completions",
                Some("api-version=1"),
            ),
            ("/openai/deployments/d/completions", Some("api-version=1")),
            ("/v1/chat/completions", Some("api-version=1")),
        ] {
            assert_eq!(route(Flavor::Azure, path, query), None, "{path} {query:?}");
        }
        for flavor in Flavor::ALL {
            assert_eq!(
                flavor.route(&Method::GET, "/health", None).ok(),
                Some(Route::Health)
            );
            assert!(flavor
                .route(&Method::GET, "/v1/chat/completions", None)
                .is_err());
        }
    }

    #[test]
    fn authentication_per_flavor() {
        let ok = |flavor: Flavor, pairs: &[(&'static str, &str)]| {
            flavor
                .authenticate(&headers(pairs))
                .map_err(|e| e.status.as_u16())
        };
        assert_eq!(ok(Flavor::Any, &[]), Ok(()));
        assert_eq!(
            ok(Flavor::Openai, &[("authorization", "Bearer sk-1")]),
            Ok(())
        );
        assert_eq!(
            ok(Flavor::Openai, &[("authorization", "Bearer ")]),
            Err(401)
        );
        assert_eq!(
            ok(Flavor::Openai, &[("authorization", "Basic abc")]),
            Err(401)
        );
        assert_eq!(ok(Flavor::Openai, &[("x-api-key", "sk-1")]), Err(401));
        let anthropic = [("x-api-key", "k"), ("anthropic-version", "2023-06-01")];
        assert_eq!(ok(Flavor::Anthropic, &anthropic), Ok(()));
        assert_eq!(ok(Flavor::Anthropic, &anthropic[..1]), Err(400));
        assert_eq!(
            ok(Flavor::Anthropic, &[("x-api-key", ""), anthropic[1]]),
            Err(401)
        );
        assert_eq!(
            ok(
                Flavor::Anthropic,
                &[("authorization", "Bearer k"), anthropic[1]]
            ),
            Err(401)
        );
        assert_eq!(ok(Flavor::Azure, &[("api-key", "k")]), Ok(()));
        assert_eq!(
            ok(Flavor::Azure, &[("authorization", "Bearer k")]),
            Err(401)
        );
    }
}
