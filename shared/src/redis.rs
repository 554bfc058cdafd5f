//! The Redis connection of every plugin that uses Redis — key-auth's key store (`redis`),
//! token-ratelimit's leases and budgets (`redis`), usage-accounting's ledger (`ledger`): how
//! the commands travel, where to, with which credentials and timeout ([`RedisConfig`]), read
//! from the section's members by one validation ([`RedisConfig::parse`]) and refused by one
//! rule in a build that cannot reach it ([`check_transport`]); and why a command got no reply
//! ([`Unanswered`]), whichever transport carried it.
//!
//! Two transports: Higress's Redis calls (`proxy_redis_init` / `proxy_redis_call`, only in a
//! plugin's Higress build: a plain Envoy refuses a module that imports them) and HTTP calls to
//! webdis ([`crate::webdis`], every build). What is not here: the host calls
//! (`host::redis_client`, `wasm32` only), each plugin's commands, and the members a plugin
//! adds around the connection (key-auth's `prefix` and cache, the ledger's `stream`), which its
//! own parser reads.

use crate::config::ConfigError;
use crate::webdis;
use std::fmt;

/// The `transport` member of a Redis section.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TransportName {
    /// Higress's Redis calls (the Higress build only).
    #[default]
    Higress,
    /// HTTP calls to webdis (every build).
    Http,
}

/// How commands reach Redis.
#[derive(Clone, PartialEq, Eq)]
pub enum RedisTransport {
    /// Higress's Redis calls (`proxy_redis_call`); the service is the Higress Redis service.
    Higress,
    /// `dispatch_http_call` to webdis; the service is its Envoy cluster.
    Http {
        /// `Authorization` for webdis's `http_basic_auth` (never logged).
        authorization: Option<String>,
    },
}

impl RedisTransport {
    /// The `transport` value that names this transport.
    pub fn name(&self) -> TransportName {
        match self {
            RedisTransport::Higress => TransportName::Higress,
            RedisTransport::Http { .. } => TransportName::Http,
        }
    }
}

// Written by hand: the derived form would print the webdis credentials.
impl fmt::Debug for RedisTransport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RedisTransport::Higress => f.write_str("Higress"),
            RedisTransport::Http { authorization } => f
                .debug_struct("Http")
                .field("authorization", &authorization.as_ref().map(|_| "<hidden>"))
                .finish(),
        }
    }
}

/// One Redis connection, validated.
#[derive(Clone, PartialEq, Eq)]
pub struct RedisConfig {
    /// The Higress Redis service (`outbound|6379||redis.static`), or the webdis cluster.
    pub service: String,
    /// How commands reach Redis.
    pub transport: RedisTransport,
    /// Redis ACL user (Higress transport; `""` counts as none).
    pub username: Option<String>,
    /// Redis password (Higress transport; `""` counts as none; never logged).
    pub password: Option<String>,
    /// Per call.
    pub timeout_ms: u32,
}

// Written by hand: the derived form would print the password.
impl fmt::Debug for RedisConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisConfig")
            .field("service", &self.service)
            .field("transport", &self.transport)
            .field("username", &self.username)
            .field("password", &self.password.as_ref().map(|_| "<hidden>"))
            .field("timeout_ms", &self.timeout_ms)
            .finish()
    }
}

/// The connection members of a Redis section as the plugin's serde form read them, its
/// defaults applied (the default timeout is the plugin's). A plugin without the HTTP
/// transport (key-auth) reads no `transport`, `cluster` or `auth` and leaves them at their
/// defaults.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct RedisFields {
    /// `transport`.
    pub transport: TransportName,
    /// `service` (Higress).
    pub service: Option<String>,
    /// `cluster` (HTTP).
    pub cluster: Option<String>,
    /// `auth`, `user:password` (HTTP; never echoed).
    pub auth: Option<String>,
    /// `username` (Higress).
    pub username: Option<String>,
    /// `password` (Higress; never echoed).
    pub password: Option<String>,
    /// `timeout_ms`.
    pub timeout_ms: u32,
}

/// The longest call timeout, in milliseconds.
pub const MAX_TIMEOUT_MS: u32 = 60_000;

impl RedisConfig {
    /// Validates the connection members of the section `section` (`"redis"`, `"ledger"`: the
    /// prefix of the fields an error names): `service` (and a Redis `username` / `password`)
    /// only for Higress, `cluster` and `auth` only over HTTP, then `timeout_ms`. Whether this
    /// build has the transport is [`check_transport`]'s. A bad `auth` or password is refused
    /// without echoing it.
    pub fn parse(section: &str, fields: RedisFields) -> Result<RedisConfig, ConfigError> {
        let field = |name: &str| format!("{section}.{name}");
        let RedisFields {
            transport,
            service,
            cluster,
            auth,
            username,
            password,
            timeout_ms,
        } = fields;
        let (service, transport, username, password) = match transport {
            TransportName::Higress => {
                if cluster.is_some() || auth.is_some() {
                    return Err(ConfigError::new(
                        field("transport"),
                        "`cluster` and `auth` belong to `\"transport\": \"http\"`",
                    ));
                }
                let service = match service {
                    Some(service) if !service.is_empty() => service,
                    _ => return Err(ConfigError::new(field("service"), "must not be empty")),
                };
                let username = username.filter(|u| !u.is_empty());
                let password = password.filter(|p| !p.is_empty());
                (service, RedisTransport::Higress, username, password)
            }
            TransportName::Http => {
                if service.is_some() || username.is_some() || password.is_some() {
                    return Err(ConfigError::new(
                        field("transport"),
                        "`service`, `username` and `password` belong to `\"transport\": \"higress\"`; over HTTP name the webdis `cluster` and its `auth`",
                    ));
                }
                let cluster = cluster.unwrap_or_default();
                if cluster.is_empty() || cluster.len() > 256 {
                    return Err(ConfigError::new(
                        field("cluster"),
                        "must be the webdis cluster's name (1 to 256 characters)",
                    ));
                }
                let authorization = match auth {
                    None => None,
                    Some(auth) => Some(authorization(&auth).ok_or_else(|| {
                        // the value is a secret: not echoed
                        ConfigError::new(
                            field("auth"),
                            "must be `user:password`, as in webdis's `http_basic_auth`",
                        )
                    })?),
                };
                (cluster, RedisTransport::Http { authorization }, None, None)
            }
        };
        if timeout_ms == 0 || timeout_ms > MAX_TIMEOUT_MS {
            return Err(ConfigError::new(
                field("timeout_ms"),
                format!("must be between 1 and {MAX_TIMEOUT_MS}"),
            ));
        }
        Ok(RedisConfig {
            service,
            transport,
            username,
            password,
            timeout_ms,
        })
    }
}

/// The `Authorization` value of a webdis `auth` (`user:password`, a user, no control bytes).
fn authorization(auth: &str) -> Option<String> {
    let valid = auth
        .split_once(':')
        .is_some_and(|(user, _)| !user.is_empty())
        && !auth.bytes().any(|b| b.is_ascii_control());
    valid.then(|| webdis::basic_auth(auth))
}

/// Refuses `transport` for the section `section` in a build without Higress's Redis calls
/// (`higress_calls`: the plugin's `higress` feature, which links them): the error names the
/// section and says "this build has no Higress Redis calls", then `instead`, what the operator
/// can do (the plugin's Higress build, the HTTP transport where it has one). HTTP is in every
/// build.
pub fn check_transport(
    section: &str,
    transport: TransportName,
    higress_calls: bool,
    instead: &str,
) -> Result<(), ConfigError> {
    match transport {
        TransportName::Higress if !higress_calls => Err(ConfigError::new(
            section,
            format!("this build has no Higress Redis calls: {instead}"),
        )),
        _ => Ok(()),
    }
}

/// Why a Redis command got no reply (a Redis error reply is a reply: the plugin decodes it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unanswered {
    /// What happened, for a log line: the host's status, webdis's answer (never a key or a
    /// credential).
    pub why: String,
    /// webdis refused the command (its ACL, or the credentials): a configuration to fix, not
    /// an outage.
    pub forbidden: bool,
}

impl fmt::Display for Unanswered {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.why)
    }
}

impl From<webdis::WebdisError> for Unanswered {
    fn from(err: webdis::WebdisError) -> Self {
        Unanswered {
            forbidden: err == webdis::WebdisError::Forbidden,
            why: err.to_string(),
        }
    }
}

/// A Redis reply as RESP bytes ([`crate::resp`] decodes it), or why there is none.
pub type Answer = Result<Vec<u8>, Unanswered>;

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    fn higress(service: &str) -> RedisFields {
        RedisFields {
            service: Some(service.into()),
            timeout_ms: 100,
            ..RedisFields::default()
        }
    }

    fn http(cluster: &str) -> RedisFields {
        RedisFields {
            transport: TransportName::Http,
            cluster: Some(cluster.into()),
            timeout_ms: 100,
            ..RedisFields::default()
        }
    }

    #[test]
    fn a_section_becomes_one_connection_over_either_transport() {
        let redis = RedisConfig::parse(
            "redis",
            RedisFields {
                username: Some("gw".into()),
                password: Some(String::new()),
                ..higress("outbound|6379||redis.static")
            },
        )
        .unwrap();
        assert_eq!(
            redis,
            RedisConfig {
                service: "outbound|6379||redis.static".into(),
                transport: RedisTransport::Higress,
                username: Some("gw".into()),
                password: None,
                timeout_ms: 100,
            }
        );
        let redis = RedisConfig::parse(
            "ledger",
            RedisFields {
                auth: Some("gw:s3cret".into()),
                ..http("webdis")
            },
        )
        .unwrap();
        assert_eq!(redis.service, "webdis");
        assert_eq!(redis.transport.name(), TransportName::Http);
        assert_eq!(
            redis.transport,
            RedisTransport::Http {
                authorization: Some("Basic Z3c6czNjcmV0".into())
            }
        );
    }

    #[test]
    fn every_refusal_names_the_sections_field_and_echoes_no_secret() {
        let cases = [
            (higress(""), "ledger.service"),
            (RedisFields::default(), "ledger.service"),
            (
                RedisFields {
                    cluster: Some("w".into()),
                    ..higress("s")
                },
                "ledger.transport",
            ),
            (
                RedisFields {
                    auth: Some("u:pw".into()),
                    ..higress("s")
                },
                "ledger.transport",
            ),
            (http(""), "ledger.cluster"),
            (http(&"c".repeat(257)), "ledger.cluster"),
            (
                RedisFields {
                    service: Some("s".into()),
                    ..http("w")
                },
                "ledger.transport",
            ),
            (
                RedisFields {
                    password: Some("pw".into()),
                    ..http("w")
                },
                "ledger.transport",
            ),
            (
                RedisFields {
                    auth: Some("pw".into()),
                    ..http("w")
                },
                "ledger.auth",
            ),
            (
                RedisFields {
                    auth: Some(":pw".into()),
                    ..http("w")
                },
                "ledger.auth",
            ),
            (
                RedisFields {
                    auth: Some("u:p\nw".into()),
                    ..http("w")
                },
                "ledger.auth",
            ),
            (
                RedisFields {
                    timeout_ms: 0,
                    ..higress("s")
                },
                "ledger.timeout_ms",
            ),
            (
                RedisFields {
                    timeout_ms: 60_001,
                    ..http("w")
                },
                "ledger.timeout_ms",
            ),
        ];
        for (fields, field) in cases {
            let err = RedisConfig::parse("ledger", fields).unwrap_err();
            assert_eq!(err.field(), field, "{err}");
            assert!(!err.to_string().contains("pw"), "{err}");
        }
        let most = RedisFields {
            timeout_ms: MAX_TIMEOUT_MS,
            ..higress("s")
        };
        assert!(RedisConfig::parse("redis", most).is_ok());
    }

    #[test]
    fn only_higress_needs_the_build_with_its_calls() {
        let err = check_transport(
            "redis",
            TransportName::Higress,
            false,
            "use the Higress build",
        )
        .unwrap_err();
        assert_eq!(err.field(), "redis");
        assert_eq!(
            err.reason(),
            "this build has no Higress Redis calls: use the Higress build"
        );
        assert!(check_transport("redis", TransportName::Higress, true, "").is_ok());
        assert!(check_transport("redis", TransportName::Http, false, "").is_ok());
    }

    #[test]
    fn debug_output_hides_the_credentials() {
        let mut redis = RedisConfig::parse(
            "redis",
            RedisFields {
                auth: Some("gw:s3cret".into()),
                ..http("webdis")
            },
        )
        .unwrap();
        redis.password = Some("hunter2".into());
        let printed = format!("{redis:?}");
        assert!(printed.contains("webdis"), "{printed}");
        assert!(!printed.contains("hunter2"), "{printed}");
        assert!(!printed.contains("Z3c6czNjcmV0"), "{printed}");
    }

    #[test]
    fn a_webdis_refusal_is_forbidden_and_an_outage_is_not() {
        let forbidden = Unanswered::from(webdis::WebdisError::Forbidden);
        assert!(forbidden.forbidden);
        assert_eq!(
            forbidden.to_string(),
            webdis::WebdisError::Forbidden.to_string()
        );
        assert!(!Unanswered::from(webdis::WebdisError::RedisUnreachable).forbidden);
        assert!(!Unanswered::from(webdis::WebdisError::NoAnswer).forbidden);
    }
}
