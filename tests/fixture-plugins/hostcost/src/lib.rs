//! hostcost: the probe `scripts/bench hostcost` loads into Envoy to measure what Envoy's side
//! of proxy-wasm costs per host call (tests/src/bench/hostcost.rs), not a product.
//!
//! Per request it makes `calls` host calls of one [`Call`] kind, in the callback where that
//! call belongs (request headers, request body, each response body chunk), and continues
//! everywhere else. `none` makes no host call at all: its row is the cost of the callbacks
//! alone. `floor` does what any gateway filter with our features must do per request
//! ([`Call::Floor`]), whatever its code.
//!
//! Config (JSON): `{"call": "get_header", "calls": 100}`; `calls` defaults to 1 and must be 1
//! for `none`, `metrics` and `floor`.
#![cfg_attr(
    not(test),
    deny(
        clippy::unwrap_used,
        clippy::expect_used,
        clippy::panic,
        clippy::indexing_slicing
    )
)]

#[cfg(target_arch = "wasm32")]
mod shell;

/// Most calls per request a config may ask for (a typo of 10⁹ would stall the worker).
pub const MAX_CALLS: u32 = 10_000;

/// The request header every request of the bench carries (`get_header`).
pub const PRESENT_HEADER: &str = "content-type";
/// A request header no request carries (`get_header_absent`, `remove_header`).
pub const ABSENT_HEADER: &str = "x-hostcost-absent";
/// The request header `replace_header` and the floor's writes set (`x-hostcost-<i>`).
pub const WRITTEN_HEADER: &str = "x-hostcost";
/// The filter state the probe sets and reads (`wasm.hostcost`).
pub const PROPERTY: &str = "hostcost";
/// A filter state no filter sets.
pub const ABSENT_PROPERTY: &str = "hostcost_absent";
/// The request attribute `get_attribute` reads.
pub const ATTRIBUTE: [&str; 2] = ["source", "address"];
/// The shared-data key the probe sets (at configure, and per request for `set_shared_data`).
pub const SHARED_KEY: &str = "hostcost";
/// A shared-data key nothing sets.
pub const ABSENT_SHARED_KEY: &str = "hostcost-absent";
/// The counter the probe increments (`wasmcustom.hostcost_calls`).
pub const METRIC: &str = "hostcost_calls";
/// The value every write writes (16 bytes, like a short header value or a shared counter).
pub const VALUE: &[u8] = b"0123456789abcdef";
/// Histograms [`Call::Metrics`] records once per request (usage-accounting's count).
pub const HISTOGRAMS: usize = 7;
/// Counters [`Call::Metrics`] increments once per request (usage-accounting's count).
pub const COUNTERS: usize = 5;
/// The values [`Call::Metrics`] records, one per histogram (tokens, milliseconds, µs per
/// token: what usage-accounting records for a chat request).
pub const HISTOGRAM_VALUES: [u64; HISTOGRAMS] = [2048, 600, 180, 35, 180, 35, 4200];
/// The deltas [`Call::Metrics`] adds, one per counter (tokens, cost, a record).
pub const COUNTER_DELTAS: [i64; COUNTERS] = [2048, 600, 1, 1, 9000];
/// Request headers the floor writes (an identity, a route, a request id: what the chain's
/// filters write for the next hop).
pub const FLOOR_HEADERS: usize = 5;

/// One kind of host call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Call {
    /// No host call: the callbacks alone (every one continues at once).
    #[default]
    None,
    /// `get_header` of [`PRESENT_HEADER`] (a value comes back).
    GetHeader,
    /// `get_header` of [`ABSENT_HEADER`] (nothing comes back).
    GetHeaderAbsent,
    /// `get_header_map_pairs` of the request headers.
    GetHeaderPairs,
    /// `replace_header` of [`WRITTEN_HEADER`] (the first call adds it).
    ReplaceHeader,
    /// `remove_header` of [`ABSENT_HEADER`].
    RemoveHeader,
    /// `get_property` of filter state [`PROPERTY`], set once first (one `set_property`).
    GetPropertySet,
    /// `get_property` of filter state [`ABSENT_PROPERTY`].
    GetPropertyAbsent,
    /// `get_property` of the request attribute [`ATTRIBUTE`].
    GetAttribute,
    /// `set_property` of filter state [`PROPERTY`].
    SetProperty,
    /// `get_shared_data` of [`SHARED_KEY`] (set at configure: a value comes back).
    GetSharedData,
    /// `get_shared_data` of [`ABSENT_SHARED_KEY`].
    GetSharedDataAbsent,
    /// `set_shared_data` of [`SHARED_KEY`] (no CAS).
    SetSharedData,
    /// `increment_metric` of [`METRIC`] (defined once at configure).
    IncrementMetric,
    /// `record_metric` of the histogram [`histogram_name`]`(0)` (defined once at configure).
    RecordHistogram,
    /// `define_metric` of [`METRIC`] (what a plugin that does not cache metric ids pays).
    DefineMetric,
    /// `log` at info (Envoy runs at info: the line is written).
    LogInfo,
    /// `log` at debug (below Envoy's level: dropped by the host).
    LogDebug,
    /// `get_current_time_nanoseconds`.
    CurrentTime,
    /// `call_foreign_function("clear_route_cache")`.
    ClearRouteCache,
    /// `get_buffer_bytes` of the whole request body (buffered to its end).
    ReadBody,
    /// The request body read once, then `set_buffer_bytes` replacing it with itself.
    ReplaceBody,
    /// `get_buffer_bytes` of each response body chunk.
    ReadChunk,
    /// Each response body chunk read once, then replaced with itself.
    ReplaceChunk,
    /// At the end of each request (`on_log`), [`HISTOGRAMS`] histograms recorded and
    /// [`COUNTERS`] counters incremented, all defined once at configure: what usage-accounting
    /// records per request.
    Metrics,
    /// What a gateway filter must do per request: the request's header
    /// pairs once; the whole request body once; [`FLOOR_HEADERS`] request headers written;
    /// one filter state set; the route cache cleared once; the response's header pairs once;
    /// one metric increment; a JSON response body read once at its end, a stream's every
    /// chunk read once.
    Floor,
}

/// Where a call is made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// Nowhere.
    Nowhere,
    /// `on_http_request_headers`.
    RequestHeaders,
    /// `on_http_request_body` at the end of the body (the body is buffered).
    RequestBody,
    /// `on_http_response_body`, every chunk.
    ResponseChunk,
    /// `on_log`, once per request.
    Log,
    /// Several (the floor).
    Everywhere,
}

impl Call {
    /// The callback its calls are made in.
    pub fn stage(self) -> Stage {
        match self {
            Call::None => Stage::Nowhere,
            Call::ReadBody | Call::ReplaceBody => Stage::RequestBody,
            Call::ReadChunk | Call::ReplaceChunk => Stage::ResponseChunk,
            Call::Floor => Stage::Everywhere,
            Call::Metrics => Stage::Log,
            _ => Stage::RequestHeaders,
        }
    }

    /// Repeating it `calls` times per request means something (`none` and `floor` are fixed).
    pub fn repeats(self) -> bool {
        !matches!(self, Call::None | Call::Floor | Call::Metrics)
    }
}

/// The configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// The kind of call.
    #[serde(default)]
    pub call: Call,
    /// How many per request (per chunk for the chunk kinds), 1..=[`MAX_CALLS`].
    #[serde(default = "one")]
    pub calls: u32,
}

fn one() -> u32 {
    1
}

impl Default for Config {
    fn default() -> Self {
        Config {
            call: Call::None,
            calls: 1,
        }
    }
}

impl Config {
    /// Parses a configuration; an empty document is `{"call": "none"}`.
    pub fn parse(document: &[u8]) -> Result<Config, String> {
        if document.iter().all(u8::is_ascii_whitespace) {
            return Ok(Config::default());
        }
        let config: Config =
            serde_json::from_slice(document).map_err(|e| format!("bad configuration: {e}"))?;
        if config.calls == 0 || config.calls > MAX_CALLS {
            return Err(format!(
                "bad configuration: calls {} is not within 1..={MAX_CALLS}",
                config.calls
            ));
        }
        if !config.call.repeats() && config.calls != 1 {
            return Err(format!(
                "bad configuration: {:?} makes a fixed set of calls, calls must be 1",
                config.call
            ));
        }
        Ok(config)
    }

    /// The request body must be buffered to its end (a call reads it there).
    pub fn buffers_request(&self) -> bool {
        matches!(self.call.stage(), Stage::RequestBody | Stage::Everywhere)
    }
}

/// The name of the `i`-th request header the floor writes.
pub fn floor_header(i: usize) -> String {
    format!("{WRITTEN_HEADER}-{i}")
}

/// The name of the `i`-th histogram (`wasmcustom.hostcost_histogram_<i>`).
pub fn histogram_name(i: usize) -> String {
    format!("hostcost_histogram_{i}")
}

/// The name of the `i`-th counter [`Call::Metrics`] increments (`wasmcustom.hostcost_counter_<i>`).
pub fn counter_name(i: usize) -> String {
    format!("hostcost_counter_{i}")
}

/// A response is a stream (its chunks are events, read one by one) when its content type is
/// `text/event-stream`.
pub fn is_event_stream(content_type: &[u8]) -> bool {
    content_type
        .get(..17)
        .is_some_and(|t| t.eq_ignore_ascii_case(b"text/event-stream"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_empty_configuration_makes_no_call() {
        for document in [&b""[..], b" \n", b"{}"] {
            let config = Config::parse(document).unwrap();
            assert_eq!(config, Config::default());
            assert_eq!(config.call, Call::None);
            assert_eq!(config.call.stage(), Stage::Nowhere);
            assert!(!config.buffers_request());
        }
    }

    #[test]
    fn every_kind_is_read_with_its_count_and_stage() {
        let cases = [
            ("get_header", Call::GetHeader, Stage::RequestHeaders),
            (
                "get_header_absent",
                Call::GetHeaderAbsent,
                Stage::RequestHeaders,
            ),
            (
                "get_header_pairs",
                Call::GetHeaderPairs,
                Stage::RequestHeaders,
            ),
            ("replace_header", Call::ReplaceHeader, Stage::RequestHeaders),
            ("remove_header", Call::RemoveHeader, Stage::RequestHeaders),
            (
                "get_property_set",
                Call::GetPropertySet,
                Stage::RequestHeaders,
            ),
            (
                "get_property_absent",
                Call::GetPropertyAbsent,
                Stage::RequestHeaders,
            ),
            ("get_attribute", Call::GetAttribute, Stage::RequestHeaders),
            ("set_property", Call::SetProperty, Stage::RequestHeaders),
            (
                "get_shared_data",
                Call::GetSharedData,
                Stage::RequestHeaders,
            ),
            (
                "get_shared_data_absent",
                Call::GetSharedDataAbsent,
                Stage::RequestHeaders,
            ),
            (
                "set_shared_data",
                Call::SetSharedData,
                Stage::RequestHeaders,
            ),
            (
                "increment_metric",
                Call::IncrementMetric,
                Stage::RequestHeaders,
            ),
            ("define_metric", Call::DefineMetric, Stage::RequestHeaders),
            (
                "record_histogram",
                Call::RecordHistogram,
                Stage::RequestHeaders,
            ),
            ("log_info", Call::LogInfo, Stage::RequestHeaders),
            ("log_debug", Call::LogDebug, Stage::RequestHeaders),
            ("current_time", Call::CurrentTime, Stage::RequestHeaders),
            (
                "clear_route_cache",
                Call::ClearRouteCache,
                Stage::RequestHeaders,
            ),
            ("read_body", Call::ReadBody, Stage::RequestBody),
            ("replace_body", Call::ReplaceBody, Stage::RequestBody),
            ("read_chunk", Call::ReadChunk, Stage::ResponseChunk),
            ("replace_chunk", Call::ReplaceChunk, Stage::ResponseChunk),
        ];
        for (name, call, stage) in cases {
            let doc = format!(r#"{{"call": "{name}", "calls": 100}}"#);
            let config = Config::parse(doc.as_bytes()).unwrap();
            assert_eq!(config, Config { call, calls: 100 }, "{name}");
            assert_eq!(call.stage(), stage, "{name}");
            assert!(call.repeats(), "{name}");
            assert_eq!(
                config.buffers_request(),
                stage == Stage::RequestBody,
                "{name}"
            );
            // the count defaults to one
            let once = Config::parse(format!(r#"{{"call": "{name}"}}"#).as_bytes()).unwrap();
            assert_eq!(once.calls, 1, "{name}");
        }
        let floor = Config::parse(br#"{"call": "floor"}"#).unwrap();
        assert_eq!(floor.call.stage(), Stage::Everywhere);
        assert!(floor.buffers_request());
        let metrics = Config::parse(br#"{"call": "metrics"}"#).unwrap();
        assert_eq!(metrics.call, Call::Metrics);
        assert_eq!(metrics.call.stage(), Stage::Log);
        assert!(!metrics.call.repeats());
        assert!(!metrics.buffers_request());
    }

    #[test]
    fn a_bad_configuration_is_refused() {
        for document in [
            &br#"{"call": "get_everything"}"#[..],
            br#"{"call": "get_header", "calls": 0}"#,
            br#"{"call": "get_header", "calls": 10001}"#,
            br#"{"call": "get_header", "calls": -1}"#,
            br#"{"call": "get_header", "count": 3}"#,
            br#"{"call": "none", "calls": 5}"#,
            br#"{"call": "floor", "calls": 2}"#,
            br#"{"call": "metrics", "calls": 7}"#,
            b"not json",
            br#""get_header""#,
        ] {
            assert!(Config::parse(document).is_err(), "{document:?}");
        }
        assert!(Config::parse(br#"{"call": "get_header", "calls": 10000}"#).is_ok());
    }

    #[test]
    fn event_streams_are_told_by_their_content_type() {
        assert!(is_event_stream(b"text/event-stream"));
        assert!(is_event_stream(b"Text/Event-Stream; charset=utf-8"));
        assert!(!is_event_stream(b"application/json"));
        assert!(!is_event_stream(b"text/event"));
        assert!(!is_event_stream(b""));
    }

    #[test]
    fn the_metrics_are_usage_accountings_count_with_distinct_names() {
        for name in [histogram_name, counter_name] {
            let mut names: Vec<String> = (0..HISTOGRAMS.max(COUNTERS)).map(name).collect();
            names.sort();
            names.dedup();
            assert_eq!(names.len(), HISTOGRAMS.max(COUNTERS));
        }
        assert_ne!(histogram_name(0), counter_name(0));
        assert_ne!(histogram_name(0), METRIC);
        assert_eq!((HISTOGRAMS, COUNTERS), (7, 5));
        // Envoy refuses a counter delta <= 0
        assert!(COUNTER_DELTAS.iter().all(|d| *d > 0));
    }

    #[test]
    fn the_floor_writes_distinct_headers() {
        let names: Vec<String> = (0..FLOOR_HEADERS).map(floor_header).collect();
        let mut unique = names.clone();
        unique.sort();
        unique.dedup();
        assert_eq!(unique.len(), FLOOR_HEADERS);
        assert!(names.iter().all(|n| n.starts_with(WRITTEN_HEADER)));
    }
}
