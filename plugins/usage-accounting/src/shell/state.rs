//! What every request of a configuration shares, and what only usage-accounting asks of the
//! host: publishing a record (filter state, log line, metrics, ledger).

use super::ledger;
use crate::config::UsageConfig;
use crate::core::{Publish, Worker};
use crate::metrics::{
    translated_name, values, Kind, LabelHash, Labels, MAX_LABEL_SETS, MAX_TRANSLATIONS, SERIES,
};
use crate::record::Record;
use llm_gateway_shared::host::{self, HostResult, LogLevel, Metric, Sink};
use llm_gateway_shared::rules::RuleSet;
use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;

pub struct State {
    pub(super) rules: RuleSet<Rc<UsageConfig>>,
    /// The metrics of each label set seen so far in this VM ([`SERIES`] order).
    series: RefCell<HashMap<Labels, [Option<Metric>; SERIES.len()], LabelHash>>,
    /// The `llm_gateway.usage.translated.*` counters defined so far in this VM, by name.
    translations: RefCell<Vec<(String, Option<Metric>)>>,
    /// `llm_gateway.usage.ledger_errors`: ledger appends that failed.
    ledger_errors: Option<Metric>,
    /// The shared queue through which requests hand their webdis appends to the root context
    /// (`None`: no HTTP ledger, the fused filter, or the host has no queue: requests send
    /// them themselves).
    ledger_queue: Option<u32>,
    /// What superseded passes left for their re-entering pass (the core's per-worker state).
    pub(super) worker: RefCell<Worker>,
}

impl State {
    /// The state of `rules`; `None` (logged) if the ledger cannot be set up.
    pub(super) fn new(rules: RuleSet<Rc<UsageConfig>>, fused: bool) -> Option<State> {
        if !fused {
            let prices = rules.global().map_or(0, |c| c.prices.len());
            let line = format!("usage-accounting: configured with {prices} prices");
            host::log(LogLevel::Info, &line);
        }
        let ledger_errors = Metric::counter("llm_gateway.usage.ledger_errors").ok();
        if !ledger::init(&rules, ledger_errors) {
            return None;
        }
        // the fused filter's requests send their appends themselves
        let ledger_queue = if fused {
            None
        } else {
            ledger::register_queue(&rules)
        };
        Some(State {
            rules,
            series: RefCell::new(HashMap::default()),
            translations: RefCell::default(),
            ledger_errors,
            ledger_queue,
            worker: RefCell::default(),
        })
    }

    pub(super) fn queue_ready(&self, queue: u32) {
        if self.ledger_queue == Some(queue) {
            ledger::drain_queue(queue, &self.rules, self.ledger_errors);
        }
    }

    /// A webdis answer to a ledger append.
    pub(super) fn ledger_reply(&self, body_size: usize) {
        ledger::http_reply(body_size, self.ledger_errors);
    }

    fn record_metrics(&self, record: &Record, provider: Option<&str>, config: &UsageConfig) {
        let mut labels = Labels::of(record, provider, config.consumer_label);
        let mut series = self.series.borrow_mut();
        if series.len() >= MAX_LABEL_SETS && !series.contains_key(&labels) {
            labels = Labels::other(config.consumer_label);
        }
        let metrics = series.entry(labels).or_insert_with_key(|labels| {
            SERIES.map(|(base, kind, scope)| {
                let name = labels.name(base, scope);
                match kind {
                    Kind::Counter => Metric::counter(&name),
                    Kind::Histogram => Metric::histogram(&name),
                }
                .ok()
            })
        });
        for ((metric, (_, kind, _)), value) in metrics.iter().zip(SERIES).zip(values(record)) {
            let (Some(metric), Some(value)) = (metric, value) else {
                continue;
            };
            let _ = match kind {
                Kind::Counter => metric.increment(i64::try_from(value).unwrap_or(i64::MAX)),
                Kind::Histogram => metric.record(value),
            };
        }
        // only a translated record gets here: an untranslated one costs no host call more
        if let Some(name) = translated_name(record) {
            let mut translations = self.translations.borrow_mut();
            let metric = match translations.iter().position(|(n, _)| *n == name) {
                Some(at) => translations.get(at).and_then(|(_, metric)| *metric),
                None if translations.len() < MAX_TRANSLATIONS => {
                    let metric = Metric::counter(&name).ok();
                    translations.push((name, metric));
                    metric
                }
                None => None,
            };
            if let Some(metric) = metric {
                let _ = metric.increment(1);
            }
        }
    }
}

impl State {
    /// What only usage-accounting asks of the host: publishing a record.
    pub(super) fn publish(&self, publish: &Publish, target: &mut Sink<'_>) -> HostResult<()> {
        let Publish {
            record,
            json,
            config,
            provider,
        } = publish;
        let published = host::set_property(&[config.filter_state.as_str()], json.as_bytes());
        if let (Ok(()), Sink::Fused(x)) = (&published, &mut *target) {
            // a later stage (token-ratelimit's settlement) reads it from here
            x.publish(&config.filter_state, json.as_bytes());
        }
        if config.log_records {
            let mut line = String::with_capacity(json.len() + 14);
            line.push_str("usage_record: ");
            line.push_str(json);
            host::log(LogLevel::Info, &line);
        }
        self.record_metrics(record, provider.as_deref(), config);
        if let Some(ledger) = &config.ledger {
            ledger::submit(
                ledger,
                config,
                json,
                &self.rules,
                self.ledger_queue,
                self.ledger_errors,
            );
        }
        published
    }
}
