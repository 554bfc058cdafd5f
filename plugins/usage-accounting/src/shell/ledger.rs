//! The Redis stream ledger: one `XADD … MAXLEN ~` per record, fire and forget (nothing waits
//! for the reply; a failure is counted and logged). Through Higress's Redis calls (Higress
//! build) or over HTTP to webdis. Over HTTP the SDK hands the answer to the request's context,
//! and drops it if that context has finished: an append sent from `on_log` is still carried
//! out (the host makes the call on the root context), but its failure is then not counted.

use crate::config::UsageConfig;
use crate::ledger::{xadd_args, LedgerConfig, LedgerTransport};
use llm_gateway_shared::host::webdis::{self, HttpRedis};
use llm_gateway_shared::host::{self, LogLevel, Metric};
use llm_gateway_shared::resp::{self, Limits};
use llm_gateway_shared::rules::RuleSet;
use std::rc::Rc;

/// Connects every distinct Higress ledger service of the configuration (once per VM) and
/// registers the reply handler. False if the host refuses a service.
pub(super) fn init(rules: &RuleSet<Rc<UsageConfig>>, errors: Option<Metric>) -> bool {
    let higress: Vec<&LedgerConfig> = rules
        .configs()
        .filter_map(|c| c.ledger.as_ref())
        .filter(|l| l.transport == LedgerTransport::Higress)
        .collect();
    if higress.is_empty() {
        return true;
    }
    init_higress(&higress, errors)
}

#[cfg(feature = "higress")]
fn init_higress(configs: &[&LedgerConfig], errors: Option<Metric>) -> bool {
    use llm_gateway_shared::host::redis::{on_redis_call_response, redis_init, redis_reply};
    let mut done: Vec<&str> = Vec::new();
    for config in configs {
        if done.contains(&config.service.as_str()) {
            continue;
        }
        done.push(&config.service);
        let user = config.username.as_deref().unwrap_or_default();
        let password = config.password.as_deref().unwrap_or_default();
        if let Err(err) = redis_init(&config.service, user, password, config.timeout_ms) {
            host::log(
                LogLevel::Error,
                &format!(
                    "usage-accounting: ledger: cannot connect Redis service {}: {err}",
                    config.service
                ),
            );
            return false;
        }
    }
    on_redis_call_response(move |response| {
        let reply = if response.answered() {
            Ok(redis_reply(response.size).unwrap_or_default())
        } else {
            Err(format!("call failed (status {})", response.status))
        };
        check(reply, errors);
    });
    true
}

#[cfg(not(feature = "higress"))]
fn init_higress(_configs: &[&LedgerConfig], _errors: Option<Metric>) -> bool {
    false // refused by the config parser already
}

/// Counts and logs a failed append (an error reply included).
fn check(reply: Result<Vec<u8>, String>, errors: Option<Metric>) {
    let failed = match reply {
        Ok(reply) => match resp::decode(&reply, &Limits::default()) {
            Ok(reply) => reply.error().map(str::to_owned),
            Err(err) => Some(err.to_string()),
        },
        Err(why) => Some(why),
    };
    if let Some(why) = failed {
        if let Some(metric) = errors {
            let _ = metric.increment(1);
        }
        host::log(
            LogLevel::Warn,
            &format!("usage-accounting: ledger append failed: {why}"),
        );
    }
}

/// A webdis answer to an append.
pub(super) fn http_reply(body_size: usize, errors: Option<Metric>) {
    check(webdis::reply(body_size).map_err(|e| e.to_string()), errors);
}

/// Sends the `XADD` of one record.
pub(super) fn append(config: &LedgerConfig, record_json: &str, errors: Option<Metric>) {
    let args = xadd_args(config, record_json);
    let sent = match &config.transport {
        LedgerTransport::Http { authorization } => {
            let to = HttpRedis {
                cluster: config.service.clone(),
                authorization: authorization.clone(),
                timeout_ms: config.timeout_ms,
            };
            webdis::send(&to, &args).map(|_| ())
        }
        LedgerTransport::Higress => send_higress(&config.service, &resp::encode_command(&args)),
    };
    if let Err(err) = sent {
        if let Some(metric) = errors {
            let _ = metric.increment(1);
        }
        host::log(
            LogLevel::Warn,
            &format!("usage-accounting: ledger append not sent: {err}"),
        );
    }
}

#[cfg(feature = "higress")]
fn send_higress(service: &str, query: &[u8]) -> Result<(), host::HostError> {
    llm_gateway_shared::host::redis::redis_call(service, query).map(|_| ())
}

#[cfg(not(feature = "higress"))]
fn send_higress(_service: &str, _query: &[u8]) -> Result<(), host::HostError> {
    Err(host::HostError::Unimplemented)
}
