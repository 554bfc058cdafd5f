//! Which deployments a request tries, in which order: group resolution, the group ACL, the
//! canary split, the breaker and the context window.
//!
//! Pure: the breaker's verdicts and the prompt-size estimate come in as arguments.

use crate::config::{Deployment, Group, RouterConfig};
use llm_gateway_shared::price::Price;
use llm_gateway_shared::reject::Reject;
use llm_gateway_shared::request::{Api, Endpoint};
use llm_gateway_shared::route_info::RouteInfo;

/// What the router knows about the request when it plans.
#[derive(Debug, Clone, Default)]
pub struct Request<'a> {
    /// The `model` of the body: a group name.
    pub model: &'a str,
    /// `x-llm-groups` as key-auth set it (comma-separated, `*` = any); `None` if absent.
    pub allowed_groups: Option<&'a str>,
    /// The canary subject: `x-user-id` when present, else the consumer; `None`: neither.
    pub subject: Option<&'a str>,
    /// Estimated prompt tokens plus the output cap (0: unknown).
    pub estimated_tokens: u64,
    /// What the request's path addresses; deployments that cannot serve it (no native API
    /// and no translation: embeddings at Anthropic, token counting anywhere but Anthropic,
    /// [`Deployment::serves`]) are left out. `None`: every deployment is a candidate.
    pub endpoint: Option<Endpoint>,
}

/// The deployments to try, by index into [`RouterConfig::deployments`], first choice first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// The group's name.
    pub group: String,
    /// Deployment indexes in attempt order, at most `max_attempts`.
    pub deployments: Vec<usize>,
}

/// Why no plan: the reject to send.
pub type Refusal = Reject;

/// A breaker's answer for one deployment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// Closed, or this request is the half-open probe.
    Admit,
    /// Open: skip it; the value is how long until a probe may go through (ms).
    Skip(u64),
}

/// Plans a request. `admit` is asked once per candidate deployment, in the order they would
/// be tried, and only until `max_attempts` are admitted (so a half-open probe is claimed only
/// by a request that will actually try it).
pub fn plan(
    config: &RouterConfig,
    request: &Request<'_>,
    mut admit: impl FnMut(usize) -> Admission,
) -> Result<Plan, Refusal> {
    let Some(group) = config.group(request.model) else {
        return Err(Reject::not_found(
            "model_not_found",
            "the model does not exist or you do not have access to it",
        ));
    };
    if !group_allowed(config, request.allowed_groups, &group.name) {
        return Err(Reject::forbidden(
            "model_not_allowed",
            "this key may not use this model group",
        ));
    }

    let order = ordered_targets(group, request.subject);
    let mut deployments = Vec::with_capacity(order.len().min(config.max_attempts));
    let mut too_small = false;
    let mut retry_after_ms: Option<u64> = None;
    let mut serves_endpoint = false;
    for index in order {
        if deployments.len() >= config.max_attempts {
            break;
        }
        let Some(deployment) = config.deployments.get(index) else {
            continue;
        };
        if let Some(endpoint) = request.endpoint {
            if deployment.serves(endpoint).is_none() {
                continue;
            }
        }
        serves_endpoint = true;
        if let Some(window) = deployment.context_window {
            if request.estimated_tokens > window {
                too_small = true;
                continue;
            }
        }
        match admit(index) {
            Admission::Admit => deployments.push(index),
            Admission::Skip(ms) => {
                retry_after_ms = Some(retry_after_ms.map_or(ms, |m| m.min(ms)));
            }
        }
    }
    if !serves_endpoint {
        return Err(unsupported(request.endpoint));
    }
    if deployments.is_empty() {
        if let Some(ms) = retry_after_ms {
            return Err(Reject::new(
                503,
                llm_gateway_shared::reject::ErrorType::Api,
                "deployments_unavailable",
                "every deployment of this model group is failing; retry later",
            )
            .with_header("retry-after", ms.div_ceil(1000).max(1).to_string()));
        }
        if too_small {
            return Err(Reject::bad_request(
                "context_length_exceeded",
                "the request is larger than the context window of every deployment of this model group",
            ));
        }
    }
    Ok(Plan {
        group: group.name.clone(),
        deployments,
    })
}

/// Code of the refusal of a request whose endpoint no deployment of its group serves.
pub const UNSUPPORTED_ENDPOINT: &str = "unsupported_endpoint";

/// 400 for a request whose endpoint no deployment of its group can serve, naming why.
fn unsupported(endpoint: Option<Endpoint>) -> Reject {
    let message = match endpoint {
        Some(Endpoint::CountTokens) => {
            "this model group has no Anthropic deployment: /v1/messages/count_tokens needs one"
        }
        Some(Endpoint::Api(Api::Responses)) => {
            "no deployment of this model group serves the Responses API (/v1/responses): only OpenAI and OpenAI-compatible deployments do; use /v1/chat/completions or /v1/messages"
        }
        Some(Endpoint::Api(Api::Embeddings)) => {
            "no deployment of this model group serves embeddings (/v1/embeddings): an Anthropic deployment has none"
        }
        _ => "no deployment of this model group serves this endpoint",
    };
    Reject::bad_request(UNSUPPORTED_ENDPOINT, message)
}

/// The price ceiling of a plan (`RouteInfo::price_ceiling`): the element-wise maximum price of
/// every deployment in it, `None` if one has no price, the currencies differ or it is empty.
pub fn price_ceiling(config: &RouterConfig, deployments: &[usize]) -> Option<Price> {
    Price::ceiling(
        deployments
            .iter()
            .map(|i| config.deployments.get(*i).and_then(|d| d.price.as_ref())),
    )
}

/// The route info the router publishes (`llm_route`) for `deployment` of a plan of `group`
/// whose deployments are `plan` (for the price ceiling).
pub fn route_info(
    config: &RouterConfig,
    group: &str,
    plan: &[usize],
    deployment: &Deployment,
    request_id: &str,
    attempts: u32,
    tried: Vec<String>,
) -> RouteInfo {
    RouteInfo {
        request_id: request_id.to_string(),
        model_group: group.to_string(),
        deployment: deployment.name.clone(),
        model: deployment.model.clone(),
        provider: deployment.provider.as_str().to_string(),
        price: deployment.price.clone(),
        price_version: deployment.price_version.clone(),
        route_version: config.version.clone(),
        attempts,
        tried,
        price_ceiling: price_ceiling(config, plan),
        client_api: None,
    }
}

/// The route info once attempt `attempts` of `plan` (deployment names, in attempt order) has
/// answered from `deployment`: what the upstream role publishes at that attempt's response
/// headers, before any listener filter sees the response (unless it is the first attempt's
/// success, which the listener role's first publication already says). A listener filter
/// that holds the response headers (usage-accounting with `cost_headers`) finalises before
/// the downstream role's response callback runs, so the answering deployment must already be
/// published.
/// The group, request id, route version and price ceiling of the request's plan are kept.
pub fn answered_by(
    mut info: RouteInfo,
    deployment: &Deployment,
    plan: &str,
    attempts: u32,
) -> RouteInfo {
    info.deployment = deployment.name.clone();
    info.model = deployment.model.clone();
    info.provider = deployment.provider.as_str().to_string();
    info.price = deployment.price.clone();
    info.price_version = deployment.price_version.clone();
    info.attempts = attempts;
    info.tried = plan
        .split(',')
        .take(usize::try_from(attempts).unwrap_or(usize::MAX))
        .map(str::to_string)
        .collect();
    info
}

/// True if `allowed` (the `x-llm-groups` value) lets the caller use `group`.
pub fn group_allowed(config: &RouterConfig, allowed: Option<&str>, group: &str) -> bool {
    match allowed {
        None => !config.enforce_groups,
        Some(list) => list
            .split(',')
            .map(str::trim)
            .any(|g| g == "*" || g == group),
    }
}

/// The group's deployments with the first choice first: by the canary split when the group
/// has weights (a stable hash of the subject picks the bucket), the rest in configured order.
pub fn ordered_targets(group: &Group, subject: Option<&str>) -> Vec<usize> {
    let mut order: Vec<usize> = group.targets.iter().map(|t| t.deployment).collect();
    if group.total_weight == 0 {
        return order;
    }
    let point = match subject {
        Some(subject) => split_point(&group.name, subject) % group.total_weight,
        None => 0,
    };
    let mut begin = 0u64;
    let mut first = 0usize;
    for (i, target) in group.targets.iter().enumerate() {
        let end = begin + u64::from(target.weight);
        if point >= begin && point < end {
            first = i;
            break;
        }
        begin = end;
    }
    if first > 0 && first < order.len() {
        let chosen = order.remove(first);
        order.insert(0, chosen);
    }
    order
}

/// A stable 64-bit hash of (group, subject): FNV-1a, then a murmur3 finalizer so that
/// subjects that differ only in their last characters spread over the whole range. The same
/// subject always lands in the same place of a group's split; different groups split
/// independently.
pub fn split_point(group: &str, subject: &str) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in group.bytes().chain([0u8]).chain(subject.bytes()) {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    hash ^= hash >> 33;
    hash = hash.wrapping_mul(0xff51_afd7_ed55_8ccd);
    hash ^= hash >> 33;
    hash = hash.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    hash ^ (hash >> 33)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::tests::example;
    use llm_gateway_shared::price::MicroPrice;

    fn names(config: &RouterConfig, plan: &Plan) -> Vec<String> {
        plan.deployments
            .iter()
            .map(|i| config.deployments[*i].name.clone())
            .collect()
    }

    fn request<'a>(model: &'a str, groups: &'a str) -> Request<'a> {
        Request {
            model,
            allowed_groups: Some(groups),
            subject: Some("team-a"),
            estimated_tokens: 0,
            endpoint: None,
        }
    }

    #[test]
    fn counting_tokens_plans_only_anthropic_deployments() {
        let config = example();
        let count = |model| Request {
            endpoint: Some(Endpoint::CountTokens),
            ..request(model, "*")
        };
        // smart: claude (anthropic) and openai-mini; whichever the canary puts first
        for subject in ["team-a", "team-b", "u1", "u2", "u3"] {
            let r = Request {
                subject: Some(subject),
                ..count("smart")
            };
            let p = plan(&config, &r, |_| Admission::Admit).unwrap();
            assert_eq!(names(&config, &p), ["claude"], "{subject}");
        }
        // fast has none: refused, not sent to a provider that has no such endpoint
        let err = plan(&config, &count("fast"), |_| Admission::Admit).unwrap_err();
        assert_eq!(
            (err.status, err.code.as_ref()),
            (400, "unsupported_endpoint")
        );
        // the ACL and the breaker still apply
        let err = plan(
            &config,
            &Request {
                allowed_groups: Some("fast"),
                ..count("smart")
            },
            |_| Admission::Admit,
        )
        .unwrap_err();
        assert_eq!(err.status, 403);
        let err = plan(&config, &count("smart"), |_| Admission::Skip(1000)).unwrap_err();
        assert_eq!(err.status, 503);
        // embeddings and the Responses API skip the Anthropic deployment
        for api in [Api::Embeddings, Api::Responses] {
            let r = Request {
                endpoint: Some(Endpoint::Api(api)),
                subject: Some("u1"),
                ..request("smart", "*")
            };
            let p = plan(&config, &r, |_| Admission::Admit).unwrap();
            assert_eq!(names(&config, &p), ["openai-mini"], "{api:?}");
        }
    }

    #[test]
    fn a_group_that_cannot_serve_the_endpoint_is_refused_naming_why() {
        let doc = r#"{"deployments":[
            {"name":"claude","cluster":"a","model":"claude-sonnet-4","provider":"anthropic"}],
            "groups":[{"name":"claude","deployments":[{"deployment":"claude"}]}]}"#;
        let rules = crate::config::parse_document(doc.as_bytes()).unwrap();
        let config = rules.global().unwrap();
        for (api, why) in [
            (Api::Embeddings, "embeddings"),
            (Api::Responses, "Responses API"),
        ] {
            let r = Request {
                endpoint: Some(Endpoint::Api(api)),
                ..request("claude", "*")
            };
            let err = plan(config, &r, |_| Admission::Admit).unwrap_err();
            assert_eq!((err.status, err.code.as_ref()), (400, UNSUPPORTED_ENDPOINT));
            assert!(err.message.contains(why), "{}", err.message);
        }
        // chat and messages: every deployment, whatever its API (translated)
        for api in [Api::ChatCompletions, Api::AnthropicMessages] {
            let r = Request {
                endpoint: Some(Endpoint::Api(api)),
                ..request("claude", "*")
            };
            let p = plan(config, &r, |_| Admission::Admit).unwrap();
            assert_eq!(names(config, &p), ["claude"], "{api:?}");
        }
    }

    #[test]
    fn resolves_a_group_to_its_deployments_in_order() {
        let config = example();
        let plan = plan(&config, &request("fast", "fast,smart"), |_| {
            Admission::Admit
        })
        .unwrap();
        assert_eq!(plan.group, "fast");
        assert_eq!(names(&config, &plan), ["openai-mini", "azure-mini"]);
    }

    #[test]
    fn unknown_group_is_404_and_a_group_not_allowed_is_403() {
        let config = example();
        let err = plan(&config, &request("gpt-9", "*"), |_| Admission::Admit).unwrap_err();
        assert_eq!((err.status, err.code.as_ref()), (404, "model_not_found"));
        let err = plan(&config, &request("smart", "fast"), |_| Admission::Admit).unwrap_err();
        assert_eq!(err.status, 403);
        let missing = Request {
            allowed_groups: None,
            ..request("fast", "")
        };
        assert_eq!(
            plan(&config, &missing, |_| Admission::Admit)
                .unwrap_err()
                .status,
            403
        );
        assert!(plan(&config, &request("smart", "x, *"), |_| Admission::Admit).is_ok());
        assert!(plan(&config, &request("smart", "fast, smart"), |_| {
            Admission::Admit
        })
        .is_ok());
        // a group name is matched whole, not as a prefix
        assert!(plan(&config, &request("fast", "faster"), |_| Admission::Admit).is_err());
    }

    #[test]
    fn the_breaker_skips_and_max_attempts_bounds_the_plan() {
        let mut config = example();
        let skipped = config.deployment("openai-mini").unwrap().0;
        let plan1 = plan(&config, &request("fast", "*"), |i| {
            if i == skipped {
                Admission::Skip(500)
            } else {
                Admission::Admit
            }
        })
        .unwrap();
        assert_eq!(names(&config, &plan1), ["azure-mini"]);
        let err = plan(&config, &request("fast", "*"), |_| Admission::Skip(1500)).unwrap_err();
        assert_eq!(err.status, 503);
        assert!(err.headers.contains(&("retry-after", "2".to_string())));

        config.max_attempts = 1;
        let mut asked = Vec::new();
        let plan2 = plan(&config, &request("fast", "*"), |i| {
            asked.push(i);
            Admission::Admit
        })
        .unwrap();
        assert_eq!(plan2.deployments.len(), 1);
        assert_eq!(
            asked.len(),
            1,
            "a probe is claimed only by a request that tries it"
        );
    }

    #[test]
    fn a_deployment_whose_window_is_too_small_is_left_out() {
        let config = example();
        let big = Request {
            estimated_tokens: 10_000,
            ..request("fast", "*")
        };
        let p = plan(&config, &big, |_| Admission::Admit).unwrap();
        assert_eq!(names(&config, &p), ["openai-mini"]);
        let huge = Request {
            estimated_tokens: 1_000_000,
            ..request("fast", "*")
        };
        let err = plan(&config, &huge, |_| Admission::Admit).unwrap_err();
        assert_eq!(err.code, "context_length_exceeded");
    }

    #[test]
    fn the_price_ceiling_covers_every_deployment_of_the_plan() {
        let doc = r#"{"deployments":[
            {"name":"a","cluster":"ca","model":"m","provider":"openai",
             "price":{"input":100,"output":400,"cached_input":50}},
            {"name":"b","cluster":"cb","model":"m","provider":"openai",
             "price":{"input":300,"output":200}},
            {"name":"c","cluster":"cc","model":"m","provider":"openai"},
            {"name":"d","cluster":"cd","model":"m","provider":"openai",
             "price":{"currency":"EUR","input":1,"output":1}}],
           "groups":[{"name":"g","deployments":[{"deployment":"a"},{"deployment":"b"}]}]}"#;
        let set = crate::config::parse_document(doc.as_bytes()).unwrap();
        let config = set.global().unwrap();
        let p = plan(config, &request("g", "*"), |_| Admission::Admit).unwrap();
        // in the configuration's micro-units
        let ceiling = MicroPrice::from(&price_ceiling(config, &p.deployments).unwrap());
        assert_eq!(
            (
                ceiling.currency.as_str(),
                ceiling.input,
                ceiling.output,
                ceiling.cached_input
            ),
            ("USD", 300, 400, Some(300))
        );
        // the first choice alone when the breaker leaves only it
        let p = plan(config, &request("g", "*"), |i| {
            if i == 1 {
                Admission::Skip(1)
            } else {
                Admission::Admit
            }
        })
        .unwrap();
        let ceiling = MicroPrice::from(&price_ceiling(config, &p.deployments).unwrap());
        assert_eq!((ceiling.input, ceiling.output), (100, 400));
        // an unpriced deployment, another currency, no deployment: no ceiling
        assert_eq!(price_ceiling(config, &[0, 2]), None);
        assert_eq!(price_ceiling(config, &[0, 3]), None);
        assert_eq!(price_ceiling(config, &[]), None);
        assert_eq!(price_ceiling(config, &[0, 99]), None);
    }

    #[test]
    fn canary_split_of_10000_consumers_is_within_one_percent() {
        let config = example();
        let group = config.group("smart").unwrap(); // claude 90, openai-mini 10
        let claude = config.deployment("claude").unwrap().0;
        let n = 10_000;
        let first_is_claude = (0..n)
            .filter(|i| ordered_targets(group, Some(&format!("consumer-{i}")))[0] == claude)
            .count();
        let share = first_is_claude as f64 / n as f64;
        assert!((share - 0.90).abs() <= 0.01, "claude share {share}");
        // the other deployment stays as fallback
        assert_eq!(ordered_targets(group, Some("consumer-1")).len(), 2);
    }

    #[test]
    fn canary_splits_of_other_shapes_hold_too() {
        for weights in [[50u32, 50], [1, 99], [30, 70]] {
            let doc = format!(
                r#"{{"deployments":[
                    {{"name":"a","cluster":"ca","model":"m","provider":"openai"}},
                    {{"name":"b","cluster":"cb","model":"m","provider":"openai"}}],
                   "groups":[{{"name":"g","deployments":[{{"deployment":"a","weight":{}}},{{"deployment":"b","weight":{}}}]}}]}}"#,
                weights[0], weights[1]
            );
            let set = crate::config::parse_document(doc.as_bytes()).unwrap();
            let group = set.global().unwrap().group("g").unwrap();
            let a = (0..10_000)
                .filter(|i| ordered_targets(group, Some(&format!("user-{i}@example.com")))[0] == 0)
                .count();
            let expected = f64::from(weights[0]) / 100.0;
            let share = a as f64 / 10_000.0;
            assert!((share - expected).abs() <= 0.01, "{weights:?}: {share}");
        }
    }

    #[test]
    fn a_subject_stays_on_its_side() {
        let config = example();
        let group = config.group("smart").unwrap();
        for i in 0..100 {
            let subject = format!("u{i}");
            assert_eq!(
                ordered_targets(group, Some(&subject)),
                ordered_targets(group, Some(&subject))
            );
        }
        // no subject: the first bucket, deterministically
        assert_eq!(
            ordered_targets(group, None)[0],
            config.deployment("claude").unwrap().0
        );
    }

    #[test]
    fn the_answering_attempt_replaces_the_first_choice_and_keeps_the_plan() {
        let config = example();
        let plan_indexes = [0, 1];
        let first = &config.deployments[0];
        let before = route_info(
            &config,
            "fast",
            &plan_indexes,
            first,
            "req-1",
            1,
            Vec::new(),
        );
        let (_, azure) = config.deployment("azure-mini").unwrap();
        let after = answered_by(before.clone(), azure, "openai-mini,azure-mini", 2);
        assert_eq!(after.deployment, "azure-mini");
        assert_eq!(after.model, "gpt-4o-mini-2024");
        assert_eq!(after.provider, "openai-compatible");
        assert_eq!(
            after.price, None,
            "azure-mini has no price: none is carried over"
        );
        assert_eq!(after.price_version, None);
        assert_eq!(after.attempts, 2);
        assert_eq!(after.tried, ["openai-mini", "azure-mini"]);
        assert_eq!(
            (
                after.request_id.as_str(),
                after.model_group.as_str(),
                after.route_version.as_str()
            ),
            ("req-1", "fast", "v7")
        );
        assert_eq!(after.price_ceiling, before.price_ceiling);
        // the first attempt answering publishes itself alone
        let same = answered_by(before.clone(), first, "openai-mini,azure-mini", 1);
        assert_eq!(same.tried, ["openai-mini"]);
        assert_eq!(same.price, first.price);
    }
}
