//! What the model router publishes about the deployment that serves a request.
//!
//! Prices belong to deployments: the router's deployment config carries each deployment's
//! price and `price_version`, and the router publishes them with the deployment and the model
//! group in Envoy filter state, where token-ratelimit (money budgets) and usage-accounting
//! (cost) read them: one type, [`RouteInfo`], describes the record on both sides (the router
//! writes it, usage-accounting reads it whole, token-ratelimit its view [`RoutePrices`]). The router writes it when it forwards the request (the first choice,
//! already listed in `tried`: attempt 1 goes there), and again when the response headers
//! arrive if another deployment answered (after a fallback or a budget switch); a first
//! attempt's answer leaves the first publication as the final one. Both carry
//! `price_ceiling`, the element-wise maximum price of every deployment the request may try:
//! that, not the first choice's `price`, is what a pre-deduct must price, since a fallback may
//! go to a dearer deployment.
//!
//! * property: [`PROPERTY`] (`llm_route`); a filter reads it with
//!   `get_property(["llm_route"])`, Envoy keeps it as filter state `wasm.llm_route`, and an
//!   access log prints it with `%FILTER_STATE(wasm.llm_route:PLAIN)%`;
//! * value: one JSON object, [`RouteInfo`], e.g.
//!   `{"request_id":"…","model_group":"fast","deployment":"openai-mini","model":"gpt-4o-mini",
//!   "provider":"openai","price":{"currency":"USD","input":150000,"output":600000},
//!   "price_version":"2026-01","route_version":"v7","attempts":1,
//!   "price_ceiling":{"currency":"USD","input":150000,"output":600000}}`.
//!
//! Prices are written in the router's form, integer micro-units of `currency` per one million
//! tokens (so `150000` is $0.15 per 1M tokens: [`MicroPrice`]), and read as [`Price`]s
//! (nano-units), the same numbers written back. Absent members are omitted.
//!
//! ## Budget fallback (router → token-ratelimit → router)
//!
//! When the request's group has a `budget_fallback` group, the router also plans that group
//! and publishes the result, an [`Alternative`], in [`BUDGET_FALLBACK_PROPERTY`]. token-ratelimit
//! switches a request its hard budget refuses at the group's price but accepts at the
//! alternative's: it applies [`Alternative::switch_writes`] (the plan's filter state, the
//! router's request headers, [`BUDGET_FALLBACK_TAKEN`]), rewrites the body's `model` and
//! clears the route cache. On the response the router follows the switched plan and adds
//! [`BUDGET_FALLBACK_HEADER`].

use crate::headers;
use crate::json::{Cursor, ObjectWriter};
use crate::price::{self, MicroPrice, Price};
use serde::{Deserialize, Serialize};

/// The property name (filter state `wasm.llm_route`).
pub const PROPERTY: &str = "llm_route";
/// Filter state with the plan's deployment names, comma-separated, attempt order (router →
/// its upstream role, which picks attempt k's deployment from it).
pub const PLAN_PROPERTY: &str = "llm_route_plan";
/// Prefix of the per-attempt cluster slots: `llm_try_<k>` = the cluster of attempt k+1, read
/// by the route's matcher cluster specifier (`docs/router-fallback.md`).
pub const TRY_PROPERTY_PREFIX: &str = "llm_try_";
/// Filter state with Envoy's number of the attempt under way (`0` before the first: the router
/// writes it when it plans; each attempt's upstream role writes its own). The route's matcher
/// cluster specifier reads `wasm.llm_attempt` to pick the slot: at retry k it still holds k,
/// so slot k (`llm_try_<k>`) serves attempt k+1. Filter state, not Envoy's
/// `x-envoy-attempt-count` header, because the upstream role removes that header before the
/// provider and an upstream filter's header changes persist into the next attempt.
pub const ATTEMPT_PROPERTY: &str = "llm_attempt";
/// How many `llm_try_<k>` slots there are at most (the router's largest `max_attempts`).
pub const TRY_SLOTS: usize = 8;
/// Envoy's request header bounding the retries of a request (plan length − 1).
pub const MAX_RETRIES_HEADER: &str = "x-envoy-max-retries";
/// router → token-ratelimit: the [`Alternative`] of the request's group, JSON.
pub const BUDGET_FALLBACK_PROPERTY: &str = "llm_route_budget_fallback";
/// token-ratelimit → router: set when the request was switched; value = the group switched to.
pub const BUDGET_FALLBACK_TAKEN: &str = "llm_budget_fallback";
/// Response header naming the group a budget switched the request to (added by the router).
pub const BUDGET_FALLBACK_HEADER: &str = "x-llm-budget-fallback";
/// The provider credential headers; a switch removes them all (see [`SwitchWrites`]).
pub const CREDENTIAL_HEADERS: [&str; 3] = ["authorization", "x-api-key", "api-key"];

/// The property name of attempt slot `k` (`llm_try_<k>`).
pub fn try_property(k: usize) -> String {
    let mut name = String::with_capacity(TRY_PROPERTY_PREFIX.len() + 2);
    name.push_str(TRY_PROPERTY_PREFIX);
    crate::json::push_u64(&mut name, u64::try_from(k).unwrap_or(u64::MAX));
    name
}

/// The published record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RouteInfo {
    /// The logical request id (`x-llm-request-id`), the same on every attempt.
    pub request_id: String,
    /// The group the client named.
    pub model_group: String,
    /// The deployment (first choice before the response; the one that answered after).
    pub deployment: String,
    /// The provider's model name sent upstream.
    pub model: String,
    /// `openai`, `anthropic` or `openai-compatible`.
    pub provider: String,
    /// The deployment's price, if configured.
    #[serde(
        default,
        with = "price::micro_option",
        skip_serializing_if = "Option::is_none"
    )]
    pub price: Option<Price>,
    /// The price's version, if configured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub price_version: Option<String>,
    /// The router configuration's `version`.
    pub route_version: String,
    /// Attempts made so far (1 before the response; the final count after).
    pub attempts: u32,
    /// The deployment of every attempt, in order (the last is `deployment`); before the
    /// response, the first attempt's (the router's publications; empty in older ones).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tried: Vec<String>,
    /// [`Price::ceiling`] of every deployment in the plan (all the attempts the request may
    /// take): what a money budget must reserve so that no fallback can overspend it. Absent
    /// if a deployment of the plan has no price or the currencies differ.
    #[serde(
        default,
        with = "price::micro_option",
        skip_serializing_if = "Option::is_none"
    )]
    pub price_ceiling: Option<Price>,
    /// The client's API (`chat.completions`, `messages`: `shared::request::Api::name`) when the
    /// router translates the request and the filters after it read another one (the first
    /// attempt's deployment's); absent when they read the client's own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_api: Option<String>,
}

impl RouteInfo {
    /// The JSON bytes to publish: byte for byte what the serde derive writes (members in
    /// declaration order, the absent optional ones omitted), by hand — the router writes it
    /// on every request.
    pub fn to_json(&self) -> Vec<u8> {
        // room for a record with both prices and a uuid request id (~330 bytes) without a
        // reallocation
        let mut out = String::with_capacity(512);
        self.write_json(&mut out);
        out.into_bytes()
    }

    fn write_json(&self, out: &mut String) {
        let mut object = ObjectWriter::open(out);
        object.string("request_id", &self.request_id);
        object.string("model_group", &self.model_group);
        object.string("deployment", &self.deployment);
        object.string("model", &self.model);
        object.string("provider", &self.provider);
        if let Some(price) = &self.price {
            MicroPrice::from(price).write_json(object.member("price"));
        }
        if let Some(version) = &self.price_version {
            object.string("price_version", version);
        }
        object.string("route_version", &self.route_version);
        object.u64("attempts", u64::from(self.attempts));
        if !self.tried.is_empty() {
            object.strings("tried", &self.tried);
        }
        if let Some(ceiling) = &self.price_ceiling {
            MicroPrice::from(ceiling).write_json(object.member("price_ceiling"));
        }
        if let Some(api) = &self.client_api {
            object.string("client_api", api);
        }
        object.close();
    }

    /// Reads a published record; `None` if it is not one.
    ///
    /// A record as the router writes it is read by [`RouteInfo::scan`]; anything it is not
    /// sure of goes to the serde parse, which decides.
    pub fn from_json(bytes: &[u8]) -> Option<RouteInfo> {
        RouteInfo::scan(bytes).or_else(|| RouteInfo::from_json_serde(bytes))
    }

    /// The fast path of [`RouteInfo::from_json`]: [`ScannedRoute::scan`], every member copied.
    fn scan(bytes: &[u8]) -> Option<RouteInfo> {
        let mut tried = Vec::new();
        let route = ScannedRoute::scan(bytes, |name| tried.push(name.to_string()))?;
        Some(RouteInfo {
            request_id: route.request_id.to_string(),
            model_group: route.model_group.to_string(),
            deployment: route.deployment.to_string(),
            model: route.model.to_string(),
            provider: route.provider.to_string(),
            price: route.price,
            price_version: route.price_version.map(str::to_string),
            route_version: route.route_version.to_string(),
            attempts: route.attempts,
            tried,
            price_ceiling: route.price_ceiling,
            client_api: route.client_api.map(str::to_string),
        })
    }

    /// The serde parse of [`RouteInfo::from_json`].
    fn from_json_serde(bytes: &[u8]) -> Option<RouteInfo> {
        serde_json::from_slice(bytes).ok()
    }
}

/// A published [`RouteInfo`] as the hand scan reads it, its strings borrowed from the JSON
/// (`tried` goes to the scan's caller, name by name).
#[derive(Debug, Default)]
struct ScannedRoute<'a> {
    request_id: &'a str,
    model_group: &'a str,
    deployment: &'a str,
    model: &'a str,
    provider: &'a str,
    price: Option<Price>,
    price_version: Option<&'a str>,
    route_version: &'a str,
    attempts: u32,
    price_ceiling: Option<Price>,
    client_api: Option<&'a str>,
}

impl<'a> ScannedRoute<'a> {
    /// The fast path of [`RouteInfo::from_json`] and [`RoutePrices::from_json`]: `Some` only
    /// for a record serde accepts (then with what serde reads), `None` for anything else —
    /// including records serde accepts that this pass does not handle: one object, each
    /// member of [`RouteInfo`] at most once (the required ones present) and no other; strings
    /// without escapes; integers without sign, fraction or exponent. Each name of `tried` is
    /// handed to `tried_name` as it is read (a reader that drops them allocates nothing).
    fn scan(bytes: &'a [u8], mut tried_name: impl FnMut(&'a str)) -> Option<ScannedRoute<'a>> {
        /// The members without a default.
        const REQUIRED: u32 = 0b1_1001_1111;
        let mut at = Cursor::new(bytes)?;
        let mut route = ScannedRoute::default();
        let seen = at.object(|at, key| match key {
            "request_id" => at.string().map(|id| {
                route.request_id = id;
                0
            }),
            "model_group" => at.string().map(|group| {
                route.model_group = group;
                1
            }),
            "deployment" => at.string().map(|deployment| {
                route.deployment = deployment;
                2
            }),
            "model" => at.string().map(|model| {
                route.model = model;
                3
            }),
            "provider" => at.string().map(|provider| {
                route.provider = provider;
                4
            }),
            "price" => at.price_or_null().map(|price| {
                route.price = price;
                5
            }),
            "price_version" => at.text_or_null().map(|version| {
                route.price_version = version;
                6
            }),
            "route_version" => at.string().map(|version| {
                route.route_version = version;
                7
            }),
            "attempts" => at
                .u64()
                .and_then(|n| u32::try_from(n).ok())
                .map(|attempts| {
                    route.attempts = attempts;
                    8
                }),
            "tried" => at.strings(&mut tried_name).map(|()| 9),
            "price_ceiling" => at.price_or_null().map(|price| {
                route.price_ceiling = price;
                10
            }),
            "client_api" => at.text_or_null().map(|api| {
                route.client_api = api;
                11
            }),
            _ => None,
        })?;
        at.end()?;
        (seen & REQUIRED == REQUIRED).then_some(route)
    }
}

/// What a reader that prices a request needs of a published [`RouteInfo`]: the group and the
/// two prices. [`RoutePrices::from_json`] accepts exactly what [`RouteInfo::from_json`]
/// accepts (every member is still checked), without copying the members it drops.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RoutePrices {
    /// [`RouteInfo::model_group`].
    pub model_group: String,
    /// [`RouteInfo::price`].
    pub price: Option<Price>,
    /// [`RouteInfo::price_ceiling`].
    pub price_ceiling: Option<Price>,
}

impl RoutePrices {
    /// Reads a published record; `None` exactly when [`RouteInfo::from_json`] is.
    ///
    /// A record as the router writes it is read by [`RoutePrices::scan`], one pass that
    /// checks every member as serde would; anything it is not sure of goes to the serde
    /// parse, which decides.
    pub fn from_json(bytes: &[u8]) -> Option<RoutePrices> {
        RoutePrices::scan(bytes).or_else(|| RoutePrices::from_json_serde(bytes))
    }

    /// The fast path of [`RoutePrices::from_json`]: [`ScannedRoute::scan`], keeping the group
    /// and the prices.
    fn scan(bytes: &[u8]) -> Option<RoutePrices> {
        ScannedRoute::scan(bytes, |_| ()).map(|route| RoutePrices {
            model_group: route.model_group.to_string(),
            price: route.price,
            price_ceiling: route.price_ceiling,
        })
    }

    /// The serde parse of [`RoutePrices::from_json`].
    fn from_json_serde(bytes: &[u8]) -> Option<RoutePrices> {
        let view: BorrowedRoute<'_> = serde_json::from_slice(bytes).ok()?;
        Some(RoutePrices {
            model_group: view.model_group.0.into_owned(),
            price: view.price,
            price_ceiling: view.price_ceiling,
        })
    }
}

impl<'a> Cursor<'a> {
    /// `null` or a [`MicroPrice`] object: `input` and `output` once each, `currency` (default
    /// `USD`) and `cached_input` at most once, nothing else (it denies unknown members).
    fn price_or_null(&mut self) -> Option<Option<Price>> {
        if self.word(b"null") {
            return Some(None);
        }
        let mut price = MicroPrice {
            currency: String::new(),
            input: 0,
            output: 0,
            cached_input: None,
        };
        let mut currency = None;
        let seen = self.object(|cursor, key| match key {
            "currency" => cursor.string().map(|c| {
                currency = Some(c);
                0
            }),
            "input" => cursor.u64().map(|n| {
                price.input = n;
                1
            }),
            "output" => cursor.u64().map(|n| {
                price.output = n;
                2
            }),
            "cached_input" => cursor.u64_or_null().map(|n| {
                price.cached_input = n;
                3
            }),
            _ => None,
        })?;
        if seen & 0b110 != 0b110 {
            return None;
        }
        price.currency = currency
            .unwrap_or(crate::price::DEFAULT_CURRENCY)
            .to_string();
        Some(Some(Price::from(price)))
    }

    /// An array of strings (each without escapes), each handed to `each` as it is read.
    fn strings(&mut self, mut each: impl FnMut(&'a str)) -> Option<()> {
        self.expect(b'[')?;
        if self.eat(b']') {
            return Some(());
        }
        loop {
            each(self.string()?);
            if !self.eat(b',') {
                return self.expect(b']');
            }
        }
    }
}

impl From<RouteInfo> for RoutePrices {
    fn from(route: RouteInfo) -> RoutePrices {
        RoutePrices {
            model_group: route.model_group,
            price: route.price,
            price_ceiling: route.price_ceiling,
        }
    }
}

/// A JSON string, borrowed from the input unless it has escapes.
#[derive(Deserialize)]
#[serde(transparent)]
pub(crate) struct Text<'a>(#[serde(borrow)] pub(crate) std::borrow::Cow<'a, str>);

/// [`RouteInfo`]'s members and types, strings borrowed: what [`RoutePrices::from_json`]
/// checks. Members it does not keep are read only to be checked.
#[derive(Deserialize)]
#[allow(dead_code)]
struct BorrowedRoute<'a> {
    #[serde(borrow)]
    request_id: Text<'a>,
    #[serde(borrow)]
    model_group: Text<'a>,
    #[serde(borrow)]
    deployment: Text<'a>,
    #[serde(borrow)]
    model: Text<'a>,
    #[serde(borrow)]
    provider: Text<'a>,
    #[serde(default, with = "price::micro_option")]
    price: Option<Price>,
    #[serde(default, borrow)]
    price_version: Option<Text<'a>>,
    #[serde(borrow)]
    route_version: Text<'a>,
    attempts: u32,
    #[serde(default, borrow)]
    tried: Vec<Text<'a>>,
    #[serde(default, with = "price::micro_option")]
    price_ceiling: Option<Price>,
}

/// The plan of a group's budget fallback, as the router publishes it in
/// [`BUDGET_FALLBACK_PROPERTY`] when the request's group has one (and the consumer may use the
/// fallback group, and at least one of its deployments can take the request).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Alternative {
    /// The route of the alternative's first deployment, `price_ceiling` over its whole plan
    /// (what a money budget reserves if the request switches); `model_group` is the group.
    pub route: RouteInfo,
    /// The plan's deployment names, attempt order (the first is `route.deployment`).
    pub deployments: Vec<String>,
    /// The cluster of each attempt (same length as `deployments`).
    pub clusters: Vec<String>,
}

/// What a filter writes to switch a request to an [`Alternative`] (see
/// [`Alternative::switch_writes`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SwitchWrites {
    /// Filter state to set, `(property, value)`, in order.
    pub properties: Vec<(String, Vec<u8>)>,
    /// Request headers to set (replacing any value).
    pub set_headers: Vec<(&'static str, String)>,
    /// Request headers to remove.
    pub remove_headers: Vec<&'static str>,
    /// The body's new `model` (the alternative's first deployment's model name).
    pub model: String,
}

impl Alternative {
    /// The group switched to.
    pub fn group(&self) -> &str {
        &self.route.model_group
    }

    /// The JSON bytes to publish: byte for byte what the serde derive writes, by hand (the
    /// router writes it on every request to a group with a budget fallback).
    pub fn to_json(&self) -> Vec<u8> {
        let mut out = String::with_capacity(768);
        let mut object = ObjectWriter::open(&mut out);
        self.route.write_json(object.member("route"));
        object.strings("deployments", &self.deployments);
        object.strings("clusters", &self.clusters);
        object.close();
        out.into_bytes()
    }

    /// Reads a published alternative; `None` if it is not one or is inconsistent (no
    /// deployment, more than [`TRY_SLOTS`], `clusters` not one per deployment, a name with a
    /// `,`, or a first deployment other than `route.deployment`).
    pub fn from_json(bytes: &[u8]) -> Option<Alternative> {
        let alternative: Alternative = serde_json::from_slice(bytes).ok()?;
        alternative.is_consistent().then_some(alternative)
    }

    fn is_consistent(&self) -> bool {
        !self.deployments.is_empty()
            && self.deployments.len() <= TRY_SLOTS
            && self.clusters.len() == self.deployments.len()
            && self
                .deployments
                .iter()
                .all(|d| !d.is_empty() && !d.contains(','))
            && self.clusters.iter().all(|c| !c.is_empty())
            && self.deployments.first() == Some(&self.route.deployment)
    }

    /// Everything the switching filter must write, besides the body's `model` and the
    /// `clear_route_cache` call that follows:
    /// * filter state: `llm_try_<k>` = the cluster of attempt k+1 for every slot up to
    ///   [`TRY_SLOTS`] — past the alternative's plan, its last cluster again (see below) —,
    ///   [`PLAN_PROPERTY`] = the names joined by `,`, [`PROPERTY`] = `route` as JSON,
    ///   [`BUDGET_FALLBACK_TAKEN`] = the group;
    /// * request headers set: `x-llm-model-group`, `x-llm-deployment`, `x-llm-cluster` (the
    ///   first deployment) and [`MAX_RETRIES_HEADER`] = plan length − 1;
    /// * request headers removed: [`CREDENTIAL_HEADERS`] — the router may have set the first
    ///   plan's credential; each attempt's own is set by the router's upstream role, and a
    ///   key meant for one provider must never reach another.
    ///
    /// Slots past the plan: `x-envoy-max-retries` bounds Envoy's attempts to the
    /// alternative's length, so slot `len` and above are never read. The first plan may have
    /// been longer and left its clusters there; they are overwritten anyway (with the
    /// alternative's last cluster), so that even an attempt past the bound could not reach a
    /// deployment of the group the budget refused.
    ///
    /// An inconsistent value (see [`Alternative::from_json`]) writes only what it can: no
    /// panic, no slot for a missing cluster.
    pub fn switch_writes(&self) -> SwitchWrites {
        let mut properties = Vec::with_capacity(TRY_SLOTS + 3);
        if let Some(last) = self.clusters.last() {
            for k in 0..TRY_SLOTS.max(self.clusters.len()) {
                let cluster = self.clusters.get(k).unwrap_or(last);
                properties.push((try_property(k), cluster.as_bytes().to_vec()));
            }
        }
        properties.push((
            PLAN_PROPERTY.to_string(),
            self.deployments.join(",").into_bytes(),
        ));
        properties.push((PROPERTY.to_string(), self.route.to_json()));
        properties.push((
            BUDGET_FALLBACK_TAKEN.to_string(),
            self.group().as_bytes().to_vec(),
        ));
        let mut set_headers = vec![
            (headers::MODEL_GROUP, self.route.model_group.clone()),
            (headers::DEPLOYMENT, self.route.deployment.clone()),
        ];
        if let Some(first) = self.clusters.first() {
            set_headers.push((headers::CLUSTER, first.clone()));
        }
        set_headers.push((
            MAX_RETRIES_HEADER,
            self.deployments.len().saturating_sub(1).to_string(),
        ));
        SwitchWrites {
            properties,
            set_headers,
            remove_headers: CREDENTIAL_HEADERS.to_vec(),
            model: self.route.model.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn route_prices_accept_exactly_what_route_info_accepts() {
        let full = r#"{"request_id":"r\"1","model_group":"f\u0061st","deployment":"d","model":"m","provider":"openai","price":{"currency":"EUR","input":1,"output":2,"cached_input":3},"price_version":"v\n1","route_version":"v7","attempts":2,"tried":["a","b\\"],"price_ceiling":{"input":4,"output":5}}"#;
        let plain = r#"{"request_id":"r","model_group":"fast","deployment":"d","model":"m","provider":"p","route_version":"v","attempts":1,"extra":[1,{"x":null}]}"#;
        let cases = [
            full.to_string(),
            plain.to_string(),
            plain.replace(r#""attempts":1"#, r#""attempts":-1"#),
            plain.replace(r#""attempts":1"#, r#""attempts":"1""#),
            plain.replace(r#""model":"m","#, ""),
            plain.replace(r#""model":"m""#, r#""model":7"#),
            plain.replace(r#""model":"m""#, r#""model":"m","model":"n""#),
            plain.replace(r#","extra""#, r#","tried":[1],"extra""#),
            plain.replace(r#","extra""#, r#","price_version":null,"extra""#),
            plain.replace(
                r#","extra""#,
                r#","price":{"input":1,"output":2,"x":1},"extra""#,
            ),
            plain.replace(r#","extra""#, r#","price":{"input":1},"extra""#),
            plain.replace(r#","extra""#, r#","price_ceiling":null,"extra""#),
            format!("{plain} x"),
            format!(" {plain}\n"),
            plain.replace('}', ""),
            "[]".into(),
            "null".into(),
            String::new(),
        ];
        for case in &cases {
            let info = RouteInfo::from_json_serde(case.as_bytes());
            assert_eq!(RouteInfo::from_json(case.as_bytes()), info, "{case}");
            assert_eq!(
                RoutePrices::from_json(case.as_bytes()),
                info.map(RoutePrices::from),
                "{case}"
            );
        }
        let read = RoutePrices::from_json(full.as_bytes()).unwrap();
        assert_eq!(read.model_group, "fast");
        assert_eq!(read.price, Some(price("EUR", 1, 2, Some(3))));
        assert_eq!(read.price_ceiling, Some(price("USD", 4, 5, None)));
        assert!(RouteInfo::from_json(plain.as_bytes()).is_some());
    }

    #[test]
    fn round_trips_and_omits_absent_members() {
        let info = RouteInfo {
            request_id: "r1".into(),
            model_group: "fast".into(),
            deployment: "openai-mini".into(),
            model: "gpt-4o-mini".into(),
            provider: "openai".into(),
            price: None,
            price_version: None,
            route_version: "v7".into(),
            attempts: 1,
            tried: Vec::new(),
            price_ceiling: None,
            client_api: None,
        };
        let json = String::from_utf8(info.to_json()).unwrap();
        assert!(!json.contains("price"), "{json}");
        assert_eq!(RouteInfo::from_json(json.as_bytes()), Some(info.clone()));

        let ceiling = Some(price("USD", 1, 2, None));
        let priced = RouteInfo {
            price_ceiling: ceiling.clone(),
            ..info.clone()
        };
        let json = String::from_utf8(priced.to_json()).unwrap();
        assert_eq!(json.as_bytes(), serde_json::to_vec(&priced).unwrap());
        assert!(
            json.contains(r#""price_ceiling":{"currency":"USD","input":1,"output":2}"#),
            "{json}"
        );
        assert_eq!(RouteInfo::from_json(json.as_bytes()), Some(priced));

        // every optional member, escapes and extremes: still serde's bytes, read back
        let full = RouteInfo {
            model: "m\"\\\u{8}\u{c}\n\u{1f}\u{7f}é😀".into(),
            price: Some(price("EUR", u64::MAX, 0, Some(u64::MAX))),
            price_version: Some("p\t1".into()),
            attempts: u32::MAX,
            tried: vec!["a".into(), "b\"".into()],
            price_ceiling: ceiling,
            client_api: Some("chat.completions".into()),
            ..info
        };
        let json = full.to_json();
        assert_eq!(json, serde_json::to_vec(&full).unwrap());
        assert_eq!(RouteInfo::from_json(&json), Some(full));
    }

    /// A price in the router's form (micro-units per million tokens).
    fn price(currency: &str, input: u64, output: u64, cached_input: Option<u64>) -> Price {
        Price::from(MicroPrice {
            currency: currency.into(),
            input,
            output,
            cached_input,
        })
    }

    fn alternative() -> Alternative {
        Alternative {
            route: RouteInfo {
                request_id: "r1".into(),
                model_group: "cheap".into(),
                deployment: "mini".into(),
                model: "gpt-4o-mini".into(),
                provider: "openai".into(),
                price: Some(price("USD", 150, 600, None)),
                price_version: Some("p1".into()),
                route_version: "v7".into(),
                attempts: 1,
                tried: Vec::new(),
                price_ceiling: Some(price("USD", 200, 600, None)),
                client_api: None,
            },
            deployments: vec!["mini".into(), "nano".into()],
            clusters: vec!["openai".into(), "azure".into()],
        }
    }

    #[test]
    fn an_alternative_round_trips_and_inconsistent_ones_are_refused() {
        let alt = alternative();
        assert_eq!(Alternative::from_json(&alt.to_json()), Some(alt.clone()));
        let mut bad = Vec::new();
        let mut a = alt.clone();
        a.clusters.pop();
        bad.push(a);
        let mut a = alt.clone();
        a.deployments.clear();
        a.clusters.clear();
        bad.push(a);
        let mut a = alt.clone();
        a.deployments.swap(0, 1);
        bad.push(a);
        let mut a = alt.clone();
        a.deployments[1] = "x,y".into();
        bad.push(a);
        let mut a = alt.clone();
        a.deployments = (0..=TRY_SLOTS).map(|i| format!("d{i}")).collect();
        a.deployments[0] = "mini".into();
        a.clusters = (0..=TRY_SLOTS).map(|i| format!("c{i}")).collect();
        bad.push(a);
        for a in bad {
            assert_eq!(Alternative::from_json(&a.to_json()), None, "{a:?}");
        }
        for junk in [&b""[..], b"{}", b"null", b"[]", b"\xff", br#"{"route":1}"#] {
            assert_eq!(Alternative::from_json(junk), None);
        }
        // members a later router adds are ignored, like RouteInfo's
        let mut extra: serde_json::Value = serde_json::from_slice(&alt.to_json()).unwrap();
        extra["later"] = serde_json::json!(1);
        assert_eq!(
            Alternative::from_json(extra.to_string().as_bytes()),
            Some(alt)
        );
    }

    #[test]
    fn switch_writes_cover_every_slot_the_plan_and_the_credentials() {
        let alt = alternative();
        let w = alt.switch_writes();
        let prop = |name: &str| {
            w.properties
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, v)| String::from_utf8(v.clone()).unwrap())
        };
        assert_eq!(prop("llm_try_0").as_deref(), Some("openai"));
        assert_eq!(prop("llm_try_1").as_deref(), Some("azure"));
        // past the plan: the alternative's last cluster, never a slot of the first plan
        for k in 2..TRY_SLOTS {
            assert_eq!(prop(&try_property(k)).as_deref(), Some("azure"), "slot {k}");
        }
        assert_eq!(prop(&try_property(TRY_SLOTS)), None);
        assert_eq!(prop("llm_route_plan").as_deref(), Some("mini,nano"));
        assert_eq!(prop("llm_budget_fallback").as_deref(), Some("cheap"));
        let route = RouteInfo::from_json(prop("llm_route").unwrap().as_bytes()).unwrap();
        assert_eq!(route, alt.route);
        assert_eq!(w.properties.len(), TRY_SLOTS + 3);
        assert_eq!(
            w.set_headers,
            vec![
                ("x-llm-model-group", "cheap".to_string()),
                ("x-llm-deployment", "mini".to_string()),
                ("x-llm-cluster", "openai".to_string()),
                ("x-envoy-max-retries", "1".to_string()),
            ]
        );
        assert_eq!(
            w.remove_headers,
            vec!["authorization", "x-api-key", "api-key"]
        );
        assert_eq!(w.model, "gpt-4o-mini");
    }

    #[test]
    fn switch_writes_of_an_inconsistent_value_do_not_panic() {
        let mut alt = alternative();
        alt.clusters.clear();
        alt.deployments.clear();
        let w = alt.switch_writes();
        assert!(!w.properties.iter().any(|(n, _)| n.starts_with("llm_try_")));
        assert!(w
            .set_headers
            .contains(&("x-envoy-max-retries", "0".to_string())));
    }

    /// The hand scan against serde on generated records, their variants and byte mutations
    /// (native only: proptest is not built for the wasm32 test run).
    #[cfg(not(target_arch = "wasm32"))]
    mod scan_agrees_with_serde {
        use super::*;
        use crate::json::mutate::{apply, edit, value_edges, SNIPPETS};
        use proptest::prelude::*;

        /// Names, mostly plain; some with what JSON escapes (quotes, backslashes, every
        /// control character) and multi-byte characters; some arbitrary.
        fn text() -> impl Strategy<Value = String> {
            prop_oneof![
                8 => "[a-z0-9._-]{0,10}",
                2 => "[a-z\"\\\\/\\x00-\\x1f\\x7f\u{e9}\u{1F600} ]{0,8}",
                1 => any::<String>(),
            ]
        }

        /// A price or count: small, or anywhere up to the extremes.
        fn number() -> impl Strategy<Value = u64> {
            prop_oneof![0u64..1000, any::<u64>(), Just(0), Just(u64::MAX)]
        }

        fn price() -> impl Strategy<Value = Option<Price>> {
            prop::option::of(
                (
                    prop_oneof![Just("USD".to_string()), "[A-Z]{3}", text()],
                    number(),
                    number(),
                    prop::option::of(number()),
                )
                    .prop_map(|(currency, input, output, cached_input)| {
                        Price::from(MicroPrice {
                            currency,
                            input,
                            output,
                            cached_input,
                        })
                    }),
            )
        }

        prop_compose! {
            fn route()(
                names in prop::collection::vec(text(), 6),
                version in prop::option::of(text()),
                attempts in prop_oneof![any::<u32>(), Just(u32::MAX), 0u32..3],
                tried in prop::collection::vec(text(), 0..3),
                prices in (price(), price()),
            ) -> RouteInfo {
                let name = |i: usize| names.get(i).cloned().unwrap_or_default();
                RouteInfo {
                    request_id: name(0),
                    model_group: name(1),
                    deployment: name(2),
                    model: name(3),
                    provider: name(4),
                    price: prices.0,
                    price_version: version,
                    route_version: name(5),
                    attempts,
                    tried,
                    price_ceiling: prices.1,
                    client_api: None,
                }
            }
        }

        /// One record's JSON in one of the shapes a reader may meet.
        fn shaped(route: &RouteInfo, shape: u8, pick: usize) -> String {
            let line = String::from_utf8(route.to_json()).unwrap_or_default();
            let value = serde_json::to_value(route).unwrap_or_default();
            let mut members: Vec<(String, serde_json::Value)> = value
                .as_object()
                .map(|m| m.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
                .unwrap_or_default();
            let join = |members: &[(String, serde_json::Value)]| {
                let parts: Vec<String> = members
                    .iter()
                    .map(|(k, v)| format!("{}:{v}", serde_json::json!(k)))
                    .collect();
                format!("{{{}}}", parts.join(","))
            };
            let i = pick % members.len().max(1);
            match shape % 8 {
                0 => line,
                1 => value.to_string(),
                2 => serde_json::to_string_pretty(route).unwrap_or_default(),
                3 => {
                    if i < members.len() {
                        members.remove(i);
                    }
                    join(&members)
                }
                4 => {
                    if let Some(extra) = members.get(i).cloned() {
                        members.push(extra);
                    }
                    join(&members)
                }
                5 => {
                    let extra = ["[1,{\"a\":null}]", "[\"a\"]", "\"x\"", "null"];
                    let extra = extra.get(pick % extra.len()).unwrap_or(&"0");
                    line.replacen('{', &format!("{{\"extra\":{extra},"), 1)
                }
                // a member of a price missing, or an unknown one in it
                6 => {
                    let mut value = value.clone();
                    let prices = ["price", "price_ceiling"];
                    let keys = ["currency", "input", "output", "cached_input"];
                    let name = prices.get(pick % 2).unwrap_or(&"price");
                    if let Some(price) = value.get_mut(*name).and_then(|p| p.as_object_mut()) {
                        match keys.get(pick / 2 % 5) {
                            Some(key) => price.remove(*key),
                            None => price.insert("extra".into(), 1.into()),
                        };
                    }
                    value.to_string()
                }
                // the optional members written as null
                _ => line.replacen(
                    '{',
                    "{\"price\":null,\"price_version\":null,\"price_ceiling\":null,",
                    1,
                ),
            }
        }

        /// Both readers against the serde parse of the whole record: what the scans accept,
        /// serde accepts with the same result, and `from_json` is serde's answer.
        fn check(bytes: &[u8]) {
            let reference = RouteInfo::from_json_serde(bytes);
            let prices = reference.clone().map(RoutePrices::from);
            let text = String::from_utf8_lossy(bytes);
            if let Some(scanned) = RouteInfo::scan(bytes) {
                assert_eq!(Some(scanned), reference, "{text}");
            }
            if let Some(scanned) = RoutePrices::scan(bytes) {
                assert_eq!(Some(scanned), prices, "{text}");
            }
            assert_eq!(RouteInfo::from_json(bytes), reference, "{text}");
            assert_eq!(RoutePrices::from_json(bytes), prices, "{text}");
        }

        /// Every snippet at every value edge of two records, one at a time.
        #[test]
        fn on_every_snippet_at_every_value_edge() {
            let priced = super::price("EUR", 3, 15, Some(1));
            let plain = RouteInfo {
                request_id: "r".into(),
                model_group: "fast".into(),
                deployment: "east".into(),
                model: "m".into(),
                provider: "openai".into(),
                price: None,
                price_version: None,
                route_version: "v".into(),
                attempts: 1,
                tried: Vec::new(),
                price_ceiling: None,
                client_api: None,
            };
            let full = RouteInfo {
                price: Some(priced.clone()),
                price_version: Some("p".into()),
                tried: vec!["east".into(), "west".into()],
                price_ceiling: Some(Price {
                    cached_input: None,
                    ..priced
                }),
                ..plain.clone()
            };
            for route in [plain, full] {
                for line in [route.to_json(), serde_json::to_vec_pretty(&route).unwrap()] {
                    for at in value_edges(&line) {
                        for snippet in SNIPPETS {
                            let mut case = line.clone();
                            case.splice(at..at, snippet.bytes());
                            check(&case);
                        }
                    }
                }
            }
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(2000))]

            /// What the scan accepts, serde accepts, with the same prices; `from_json` is
            /// serde's answer on every input.
            #[test]
            fn on_records_and_their_mutations(
                route in route(),
                shape in any::<u8>(),
                pick in any::<usize>(),
                edits in prop::collection::vec(edit(), 0..4),
            ) {
                check(&apply(shaped(&route, shape, pick).into_bytes(), &edits));
            }

            /// A record as the router writes it takes the fast path unless a string has an
            /// escape (so the property above is about the scans, not only the fallback).
            #[test]
            fn a_plain_record_is_scanned(route in route()) {
                let line = route.to_json();
                let plain = !line.contains(&b'\\');
                let expected = plain.then(|| route.clone());
                prop_assert_eq!(RouteInfo::scan(&line), expected);
                let expected = plain.then(|| RoutePrices::from(route));
                prop_assert_eq!(RoutePrices::scan(&line), expected);
            }

            /// The hand-written writers write byte for byte what the serde derive writes.
            #[test]
            fn the_writers_write_what_serde_writes(
                route in route(),
                deployments in prop::collection::vec(text(), 0..4),
                clusters in prop::collection::vec(text(), 0..4),
            ) {
                let line = route.to_json();
                prop_assert_eq!(&line, &serde_json::to_vec(&route).unwrap_or_default());
                let alternative = Alternative { route, deployments, clusters };
                prop_assert_eq!(
                    alternative.to_json(),
                    serde_json::to_vec(&alternative).unwrap_or_default()
                );
            }
        }
    }
}
