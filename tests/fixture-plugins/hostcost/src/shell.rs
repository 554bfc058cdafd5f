//! The proxy-wasm shell of the probe: the configured calls in their callback, `Continue`
//! everywhere else. A failed call is counted, not logged per call (a log line would cost more
//! than the call); the count goes to the log once per request that had failures, at warn, so a
//! row that measured errors instead of calls is seen in Envoy's log.

use crate::{
    counter_name, floor_header, histogram_name, is_event_stream, Call, Config, Stage,
    ABSENT_HEADER, ABSENT_PROPERTY, ABSENT_SHARED_KEY, ATTRIBUTE, COUNTERS, COUNTER_DELTAS,
    FLOOR_HEADERS, HISTOGRAMS, HISTOGRAM_VALUES, METRIC, PRESENT_HEADER, PROPERTY, SHARED_KEY,
    VALUE, WRITTEN_HEADER,
};
use llm_gateway_shared::host::{self, Buffer, HeaderMap, HostResult, LogLevel, Metric};
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{Action, ContextType};

proxy_wasm::main! {{
    proxy_wasm::set_root_context(|_| Box::new(Root::default()));
}}

#[derive(Default)]
struct Root {
    config: Config,
    metric: Option<Metric>,
    metrics: Metrics,
}

/// The histograms and counters of `metrics` and `record_histogram`, defined once per VM.
#[derive(Default, Clone, Copy)]
struct Metrics {
    histograms: [Option<Metric>; HISTOGRAMS],
    counters: [Option<Metric>; COUNTERS],
}

impl Context for Root {}

impl RootContext for Root {
    fn on_configure(&mut self, _size: usize) -> bool {
        let document = match host::buffer(Buffer::PluginConfiguration, 0, usize::MAX) {
            Ok(document) => document,
            Err(err) => {
                host::log(
                    LogLevel::Error,
                    &format!("hostcost: cannot read configuration: {err}"),
                );
                return false;
            }
        };
        match Config::parse(&document) {
            Ok(config) => self.config = config,
            Err(err) => {
                host::log(LogLevel::Error, &format!("hostcost: {err}"));
                return false;
            }
        }
        // once per VM, as a plugin would: the counter, and the shared value `get_shared_data` reads
        self.metric = Metric::counter(METRIC).ok();
        if matches!(self.config.call, Call::Metrics | Call::RecordHistogram) {
            for (i, slot) in self.metrics.histograms.iter_mut().enumerate() {
                *slot = Metric::histogram(&histogram_name(i)).ok();
            }
            for (i, slot) in self.metrics.counters.iter_mut().enumerate() {
                *slot = Metric::counter(&counter_name(i)).ok();
            }
        }
        if self.config.call == Call::GetSharedData
            && host::set_shared_data(SHARED_KEY, VALUE, 0).is_err()
        {
            host::log(LogLevel::Error, "hostcost: cannot set the shared value");
            return false;
        }
        true
    }

    fn create_http_context(&self, _context_id: u32) -> Option<Box<dyn HttpContext>> {
        Some(Box::new(Http {
            config: self.config,
            metric: self.metric,
            metrics: self.metrics,
            stream: false,
            failures: 0,
        }))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}

struct Http {
    config: Config,
    metric: Option<Metric>,
    metrics: Metrics,
    /// The response is an event stream (the floor reads each chunk instead of the whole body).
    stream: bool,
    /// Calls that failed in this request.
    failures: u32,
}

impl Context for Http {
    fn on_done(&mut self) -> bool {
        if self.failures > 0 {
            host::log(
                LogLevel::Warn,
                &format!(
                    "hostcost: {} host call(s) of {:?} failed in one request",
                    self.failures, self.config.call
                ),
            );
        }
        true
    }
}

impl Http {
    fn count<T>(&mut self, result: HostResult<T>) {
        if result.is_err() {
            self.failures = self.failures.saturating_add(1);
        }
    }

    /// One call of a request-headers kind.
    fn header_call(&mut self, call: Call) {
        let result = match call {
            Call::GetHeader => host::header(HeaderMap::RequestHeaders, PRESENT_HEADER).map(drop),
            Call::GetHeaderAbsent => {
                host::header(HeaderMap::RequestHeaders, ABSENT_HEADER).map(drop)
            }
            Call::GetHeaderPairs => host::headers(HeaderMap::RequestHeaders).map(drop),
            Call::ReplaceHeader => {
                host::set_header(HeaderMap::RequestHeaders, WRITTEN_HEADER, VALUE)
            }
            Call::RemoveHeader => host::remove_header(HeaderMap::RequestHeaders, ABSENT_HEADER),
            Call::GetPropertySet => host::property(&[PROPERTY]).map(drop),
            Call::GetPropertyAbsent => host::property(&[ABSENT_PROPERTY]).map(drop),
            Call::GetAttribute => host::property(&ATTRIBUTE).map(drop),
            Call::SetProperty => host::set_property(&[PROPERTY], VALUE),
            Call::GetSharedData => host::shared_data(SHARED_KEY).map(drop),
            Call::GetSharedDataAbsent => host::shared_data(ABSENT_SHARED_KEY).map(drop),
            Call::SetSharedData => host::set_shared_data(SHARED_KEY, VALUE, 0),
            Call::IncrementMetric => match self.metric {
                Some(metric) => metric.increment(1),
                None => Err(host::HostError::NotFound),
            },
            Call::DefineMetric => define_counter(METRIC),
            Call::RecordHistogram => match self.metrics.histograms.first().copied().flatten() {
                Some(histogram) => histogram.record(HISTOGRAM_VALUES.first().copied().unwrap_or(1)),
                None => Err(host::HostError::NotFound),
            },
            Call::LogInfo => {
                host::log(LogLevel::Info, "hostcost: a line at info");
                Ok(())
            }
            Call::LogDebug => {
                host::log(LogLevel::Debug, "hostcost: a line at debug");
                Ok(())
            }
            Call::CurrentTime => host::now_nanos().map(drop),
            Call::ClearRouteCache => host::clear_route_cache(),
            _ => Ok(()),
        };
        self.count(result);
    }
}

impl HttpContext for Http {
    fn on_log(&mut self) {
        if self.config.call != Call::Metrics {
            return;
        }
        // Envoy may call on_log after on_done: the failures are told here
        let metrics = self.metrics;
        let mut failed = 0u32;
        for (histogram, value) in metrics.histograms.iter().zip(HISTOGRAM_VALUES) {
            let result = histogram.ok_or(host::HostError::NotFound);
            failed += u32::from(result.and_then(|h| h.record(value)).is_err());
        }
        for (counter, delta) in metrics.counters.iter().zip(COUNTER_DELTAS) {
            let result = counter.ok_or(host::HostError::NotFound);
            failed += u32::from(result.and_then(|c| c.increment(delta)).is_err());
        }
        if failed > 0 {
            host::log(
                LogLevel::Warn,
                &format!("hostcost: {failed} host call(s) of Metrics failed in one request"),
            );
        }
    }

    fn on_http_request_headers(&mut self, _headers: usize, end_of_stream: bool) -> Action {
        let config = self.config;
        match config.call.stage() {
            Stage::RequestHeaders => {
                if config.call == Call::GetPropertySet {
                    let set = host::set_property(&[PROPERTY], VALUE);
                    self.count(set);
                }
                for _ in 0..config.calls {
                    self.header_call(config.call);
                }
                Action::Continue
            }
            Stage::Everywhere => {
                let pairs = host::headers(HeaderMap::RequestHeaders);
                self.count(pairs);
                // hold the headers until the body is read: the writes depend on it
                if end_of_stream {
                    self.floor_request_writes();
                    Action::Continue
                } else {
                    Action::Pause
                }
            }
            _ => Action::Continue,
        }
    }

    fn on_http_request_body(&mut self, size: usize, end_of_stream: bool) -> Action {
        let config = self.config;
        if !config.buffers_request() {
            return Action::Continue;
        }
        if !end_of_stream {
            return Action::Pause;
        }
        match config.call {
            Call::ReadBody => {
                for _ in 0..config.calls {
                    let body = host::buffer(Buffer::RequestBody, 0, size);
                    self.count(body);
                }
            }
            Call::ReplaceBody => match host::buffer(Buffer::RequestBody, 0, size) {
                Ok(body) => {
                    for _ in 0..config.calls {
                        let set = host::set_buffer(Buffer::RequestBody, 0, size, &body);
                        self.count(set);
                    }
                }
                Err(err) => self.count::<()>(Err(err)),
            },
            Call::Floor => {
                let body = host::buffer(Buffer::RequestBody, 0, size);
                self.count(body);
                self.floor_request_writes();
            }
            _ => {}
        }
        Action::Continue
    }

    fn on_http_response_headers(&mut self, _headers: usize, _end_of_stream: bool) -> Action {
        if self.config.call == Call::Floor {
            match host::headers(HeaderMap::ResponseHeaders) {
                Ok(pairs) => {
                    self.stream = pairs.iter().any(|(name, value)| {
                        name.eq_ignore_ascii_case("content-type") && is_event_stream(value)
                    });
                }
                Err(err) => self.count::<()>(Err(err)),
            }
            let increment = match self.metric {
                Some(metric) => metric.increment(1),
                None => Err(host::HostError::NotFound),
            };
            self.count(increment);
        }
        Action::Continue
    }

    fn on_http_response_body(&mut self, size: usize, end_of_stream: bool) -> Action {
        let config = self.config;
        match config.call {
            Call::ReadChunk => {
                for _ in 0..config.calls {
                    let chunk = host::buffer(Buffer::ResponseBody, 0, size);
                    self.count(chunk);
                }
            }
            Call::ReplaceChunk => match host::buffer(Buffer::ResponseBody, 0, size) {
                Ok(chunk) => {
                    for _ in 0..config.calls {
                        let set = host::set_buffer(Buffer::ResponseBody, 0, size, &chunk);
                        self.count(set);
                    }
                }
                Err(err) => self.count::<()>(Err(err)),
            },
            Call::Floor if self.stream => self.read_event(size),
            Call::Floor => {
                if !end_of_stream {
                    return Action::Pause;
                }
                let body = host::buffer(Buffer::ResponseBody, 0, size);
                self.count(body);
            }
            _ => {}
        }
        Action::Continue
    }
}

impl Http {
    /// The floor's read of one chunk of a stream (an empty last frame has nothing to read).
    fn read_event(&mut self, size: usize) {
        if size > 0 {
            let chunk = host::buffer(Buffer::ResponseBody, 0, size);
            self.count(chunk);
        }
    }

    /// The floor's request writes, once the body is read: the headers, one filter state, the
    /// route cache cleared (the headers steer the route).
    fn floor_request_writes(&mut self) {
        for i in 0..FLOOR_HEADERS {
            let set = host::set_header(HeaderMap::RequestHeaders, &floor_header(i), VALUE);
            self.count(set);
        }
        let property = host::set_property(&[PROPERTY], VALUE);
        self.count(property);
        let clear = host::clear_route_cache();
        self.count(clear);
    }
}

/// `proxy_define_metric` of a counter, uncached: the shared crate's [`Metric`] remembers ids
/// (one define per name per VM) and the SDK's `hostcalls::define_metric` panics on a status it
/// does not expect, so this kind declares the import itself.
#[allow(unsafe_code)]
fn define_counter(name: &str) -> HostResult<()> {
    #[link(wasm_import_module = "env")]
    extern "C" {
        fn proxy_define_metric(kind: u32, name: *const u8, size: usize, id: *mut u32) -> u32;
    }
    let mut id = 0u32;
    // SAFETY: pointer and length of a live `&str`; out-pointer to a live local.
    let status = unsafe { proxy_define_metric(0, name.as_ptr(), name.len(), &mut id) };
    host::HostError::check(status)
}
