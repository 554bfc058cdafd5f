//! The Redis stream ledger: one `XADD … MAXLEN ~` per record, fire and forget (nothing waits
//! for the reply; a failure is counted and logged). Through Higress's Redis calls (Higress
//! build) or over HTTP to webdis, by the shared client (`host::redis_client`).
//!
//! Over HTTP the SDK hands a call's answer to the context that made the call and drops it if
//! that context has finished, which a request usually has by the time webdis answers (the
//! record is published at the end of the response or in `on_log`): a failed append would go
//! uncounted. So a request does not send its append: it puts it on a shared queue
//! ([`QUEUE`]), and the root context, called with `on_queue_ready` on the next turn of the
//! event loop, sends it and gets the answer. The fused filter, and a host without queues, send
//! from the request as before.

use crate::config::UsageConfig;
use crate::ledger::{xadd_args, LedgerConfig};
use llm_gateway_shared::host::{self, redis_client, LogLevel, Metric};
use llm_gateway_shared::redis::{Answer, TransportName};
use llm_gateway_shared::resp::{self, Limits};
use llm_gateway_shared::rules::RuleSet;
use std::hash::{Hash, Hasher};
use std::rc::Rc;

/// The shared queue's name prefix; the configuration's hash follows, so that two
/// usage-accounting filters with different configurations in one VM never take each other's
/// items (workers with the same configuration share one queue, which any of them may drain).
pub(super) const QUEUE: &str = "llm_usage_ledger:";

/// Registers the ledger queue when some scope appends over HTTP; `None` otherwise or when the
/// host refuses (appends are then sent from the requests).
pub(super) fn register_queue(rules: &RuleSet<Rc<UsageConfig>>) -> Option<u32> {
    let http = rules.configs().any(|c| {
        c.ledger
            .as_ref()
            .is_some_and(|l| l.transport.name() == TransportName::Http)
    });
    if !http {
        return None;
    }
    let document = host::buffer(host::Buffer::PluginConfiguration, 0, usize::MAX).ok()?;
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    document.hash(&mut hasher);
    match host::register_shared_queue(&format!("{QUEUE}{:016x}", hasher.finish())) {
        Ok(id) => Some(id),
        Err(err) => {
            host::log(
                LogLevel::Warn,
                &format!("usage-accounting: ledger: no shared queue ({err}): requests send their appends, and a failure after the request ended is not counted"),
            );
            None
        }
    }
}

/// Sends or queues the append of `record_json` under `ledger`, the ledger of `config` (a
/// scope of `rules`); `queue` is the root context's (see [`register_queue`]).
pub(super) fn submit(
    ledger: &LedgerConfig,
    config: &UsageConfig,
    record_json: &str,
    rules: &RuleSet<Rc<UsageConfig>>,
    queue: Option<u32>,
    errors: Option<Metric>,
) {
    if let (TransportName::Http, Some(queue)) = (ledger.transport.name(), queue) {
        let scope = rules
            .configs()
            .position(|c| std::ptr::eq(c.as_ref(), config));
        if let Some(scope) = scope.and_then(|s| u32::try_from(s).ok()) {
            let mut item = Vec::with_capacity(4 + record_json.len());
            item.extend_from_slice(&scope.to_le_bytes());
            item.extend_from_slice(record_json.as_bytes());
            if host::enqueue_shared_queue(queue, &item).is_ok() {
                return;
            }
        }
    }
    append(ledger, record_json, errors);
}

/// Sends every queued append (in the root context, so the answers come back to it).
pub(super) fn drain_queue(queue: u32, rules: &RuleSet<Rc<UsageConfig>>, errors: Option<Metric>) {
    while let Ok(Some(item)) = host::dequeue_shared_queue(queue) {
        let scope = item
            .get(..4)
            .and_then(|b| <[u8; 4]>::try_from(b).ok())
            .map(u32::from_le_bytes);
        let json = item.get(4..).unwrap_or_default();
        let ledger = scope
            .and_then(|s| usize::try_from(s).ok())
            .and_then(|s| rules.configs().nth(s))
            .and_then(|c| c.ledger.as_ref());
        match (ledger, std::str::from_utf8(json)) {
            (Some(ledger), Ok(json)) => append(ledger, json, errors),
            _ => {
                if let Some(metric) = errors {
                    let _ = metric.increment(1);
                }
                host::log(
                    LogLevel::Warn,
                    "usage-accounting: ledger: a queued append names no ledger of this configuration; dropped",
                );
            }
        }
    }
}

/// Connects every distinct Higress ledger service of the configuration (once per VM) and
/// registers the reply handler. False (logged) if the host refuses a service.
pub(super) fn init(rules: &RuleSet<Rc<UsageConfig>>, errors: Option<Metric>) -> bool {
    let ledgers = rules.configs().filter_map(|c| c.ledger.as_ref());
    let connected = redis_client::connect(ledgers.map(|l| &l.redis), move |_token, reply| {
        check(reply, errors);
    });
    if let Err(why) = connected {
        host::log(LogLevel::Error, &format!("usage-accounting: ledger: {why}"));
        return false;
    }
    true
}

/// Counts and logs a failed append (an error reply included).
fn check(reply: Answer, errors: Option<Metric>) {
    let failed = match reply {
        Ok(reply) => match resp::decode(&reply, &Limits::default()) {
            Ok(reply) => reply.error().map(str::to_owned),
            Err(err) => Some(err.to_string()),
        },
        Err(failure) => Some(failure.why),
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
    check(redis_client::http_reply(body_size), errors);
}

/// Sends the `XADD` of one record.
pub(super) fn append(config: &LedgerConfig, record_json: &str, errors: Option<Metric>) {
    let args = xadd_args(config, record_json);
    if let Err(err) = redis_client::send(&config.redis, &args) {
        if let Some(metric) = errors {
            let _ = metric.increment(1);
        }
        host::log(
            LogLevel::Warn,
            &format!("usage-accounting: ledger append not sent: {err}"),
        );
    }
}
