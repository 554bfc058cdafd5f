//! Budget fallback: the cheaper group a hard budget may switch a request to.
//!
//! A group may name a `budget_fallback` group. The downstream role then plans that group too
//! ([`plan_alternative`]) and publishes the plan as a
//! [`llm_gateway_shared::route_info::Alternative`] ([`alternative`]) in filter state
//! `llm_route_budget_fallback`. token-ratelimit, later in the chain, switches a request its
//! hard budget refuses at the group's price but accepts at the alternative's: it writes the
//! alternative's plan over the router's (`Alternative::switch_writes`) and sets
//! `llm_budget_fallback`. On the response the router reads the switch back
//! ([`switched_plan`]) and does its bookkeeping on the plan the attempts actually followed.
//!
//! Rules for the alternative, decided here:
//! * one hop: the fallback group's own `budget_fallback` is never followed;
//! * the consumer must be allowed the fallback group (`x-llm-groups`), else no alternative is
//!   published and the budget refuses the request as usual;
//! * the same plan rules as the request's own group: canary split by the same subject, the
//!   context window, the breakers — except that planning an alternative never claims a
//!   half-open probe (the request will most likely not take it): the shell's `admit` for it
//!   skips a deployment whose breaker is due for a probe.
//!
//! Pure: the breaker's verdicts come in as `admit`.

use crate::config::RouterConfig;
use crate::plan::{plan, route_info, Admission, Plan, Request};
use llm_gateway_shared::route_info::{Alternative, TRY_SLOTS};

/// Plans the budget fallback of `group` for `request` (whose `model` is ignored); `None` if
/// the group has none, the consumer may not use it, or no deployment of it can take the
/// request.
pub fn plan_alternative(
    config: &RouterConfig,
    request: &Request<'_>,
    group: &str,
    admit: impl FnMut(usize) -> Admission,
) -> Option<Plan> {
    let fallback = config.budget_fallback(group)?;
    let request = Request {
        model: &fallback.name,
        ..request.clone()
    };
    plan(config, &request, admit)
        .ok()
        .filter(|p| !p.deployments.is_empty())
}

/// The alternative to publish for a fallback `plan` of request `request_id`.
pub fn alternative(config: &RouterConfig, plan: &Plan, request_id: &str) -> Option<Alternative> {
    let deployments: Vec<_> = plan
        .deployments
        .iter()
        .filter_map(|i| config.deployments.get(*i))
        .collect();
    let first = deployments.first()?;
    if deployments.len() != plan.deployments.len() {
        return None;
    }
    Some(Alternative {
        route: route_info(
            config,
            &plan.group,
            &plan.deployments,
            first,
            request_id,
            1,
            // as the router's own first publication: attempt 1 goes to `first`
            vec![first.name.clone()],
        ),
        deployments: deployments.iter().map(|d| d.name.clone()).collect(),
        clusters: deployments.iter().map(|d| d.cluster.clone()).collect(),
    })
}

/// The plan a switch left in filter state: `taken` (`llm_budget_fallback`) names the group,
/// `names` (`llm_route_plan`) the deployments, attempt order. `None` unless the group and
/// every deployment are configured and there are 1..=[`TRY_SLOTS`] of them — then the router
/// keeps its own plan.
pub fn switched_plan(config: &RouterConfig, taken: &str, names: &str) -> Option<Plan> {
    let group = config.group(taken)?;
    let deployments = names
        .split(',')
        .map(|name| config.deployment(name).map(|(index, _)| index))
        .collect::<Option<Vec<usize>>>()?;
    if deployments.is_empty() || deployments.len() > TRY_SLOTS {
        return None;
    }
    Some(Plan {
        group: group.name.clone(),
        deployments,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::parse_document;
    use llm_gateway_shared::price::{MicroPrice, Price};

    const DOC: &str = r#"{
        "version": "v1",
        "deployments": [
            {"name": "big", "cluster": "c-big", "model": "gpt-big", "provider": "openai",
             "credential": "k1", "price": {"input": 5000000, "output": 15000000}},
            {"name": "big2", "cluster": "c-big2", "model": "claude-big", "provider": "anthropic",
             "credential": "k2", "price": {"input": 3000000, "output": 15000000}},
            {"name": "mini", "cluster": "c-mini", "model": "gpt-mini", "provider": "openai",
             "credential": "k3", "price": {"input": 150000, "output": 600000}, "context_window": 1000},
            {"name": "nano", "cluster": "c-nano", "model": "gpt-nano", "provider": "openai-compatible",
             "credential": "k4", "price": {"input": 100000, "output": 400000, "cached_input": 25000}}
        ],
        "groups": [
            {"name": "smart", "deployments": [{"deployment": "big"}, {"deployment": "big2"}],
             "budget_fallback": "cheap"},
            {"name": "cheap", "deployments": [{"deployment": "mini"}, {"deployment": "nano"}],
             "budget_fallback": "smart"},
            {"name": "plain", "deployments": [{"deployment": "big"}]}
        ]
    }"#;

    fn config() -> RouterConfig {
        parse_document(DOC.as_bytes())
            .unwrap()
            .global()
            .unwrap()
            .clone()
    }

    fn request<'a>(groups: &'a str, tokens: u64) -> Request<'a> {
        Request {
            model: "smart",
            allowed_groups: Some(groups),
            subject: Some("team-a"),
            estimated_tokens: tokens,
            endpoint: None,
        }
    }

    fn names(config: &RouterConfig, plan: &Plan) -> Vec<String> {
        plan.deployments
            .iter()
            .map(|i| config.deployments[*i].name.clone())
            .collect()
    }

    #[test]
    fn the_alternative_is_the_fallback_groups_plan() {
        let config = config();
        let plan =
            plan_alternative(&config, &request("*", 0), "smart", |_| Admission::Admit).unwrap();
        assert_eq!(plan.group, "cheap");
        assert_eq!(names(&config, &plan), ["mini", "nano"]);
        let alt = alternative(&config, &plan, "req-1").unwrap();
        assert_eq!(alt.group(), "cheap");
        assert_eq!(alt.deployments, ["mini", "nano"]);
        assert_eq!(alt.clusters, ["c-mini", "c-nano"]);
        assert_eq!(alt.route.request_id, "req-1");
        assert_eq!(alt.route.model_group, "cheap");
        assert_eq!(alt.route.deployment, "mini");
        assert_eq!(alt.route.model, "gpt-mini");
        assert_eq!(alt.route.provider, "openai");
        assert_eq!(alt.route.attempts, 1);
        assert_eq!(alt.route.route_version, "v1");
        // prices in the configuration's micro-units
        let micro = |price: Option<&Price>| MicroPrice::from(price.unwrap());
        assert_eq!(micro(alt.route.price.as_ref()).input, 150_000);
        // the ceiling covers both deployments of the alternative, cached input included
        let ceiling = micro(alt.route.price_ceiling.as_ref());
        assert_eq!(
            (ceiling.input, ceiling.output, ceiling.cached_input),
            (150_000, 600_000, Some(150_000))
        );
        // what token-ratelimit reads back is exactly this
        assert_eq!(Alternative::from_json(&alt.to_json()), Some(alt.clone()));
        // and the switch writes the body model of the first deployment
        assert_eq!(alt.switch_writes().model, "gpt-mini");
    }

    #[test]
    fn no_alternative_without_a_fallback_permission_or_deployment() {
        let config = config();
        let admit = |_| Admission::Admit;
        assert!(plan_alternative(&config, &request("*", 0), "plain", admit).is_none());
        assert!(plan_alternative(&config, &request("*", 0), "nope", admit).is_none());
        // the consumer may use smart but not cheap
        assert!(plan_alternative(&config, &request("smart", 0), "smart", admit).is_none());
        assert!(plan_alternative(&config, &request("smart, cheap", 0), "smart", admit).is_some());
        // every deployment of the fallback skipped by its breaker
        assert!(
            plan_alternative(&config, &request("*", 0), "smart", |_| Admission::Skip(5)).is_none()
        );
    }

    #[test]
    fn the_alternative_follows_the_same_plan_rules() {
        let config = config();
        // too large for mini's window: nano alone
        let plan =
            plan_alternative(&config, &request("*", 5_000), "smart", |_| Admission::Admit).unwrap();
        assert_eq!(names(&config, &plan), ["nano"]);
        let alt = alternative(&config, &plan, "r").unwrap();
        assert_eq!(alt.route.deployment, "nano");
        let ceiling = MicroPrice::from(alt.route.price_ceiling.as_ref().unwrap());
        assert_eq!(ceiling.input, 100_000);
        // the breaker: mini skipped
        let mini = config.deployment("mini").unwrap().0;
        let plan = plan_alternative(&config, &request("*", 0), "smart", |i| {
            if i == mini {
                Admission::Skip(1)
            } else {
                Admission::Admit
            }
        })
        .unwrap();
        assert_eq!(names(&config, &plan), ["nano"]);
        // max_attempts bounds it
        let mut one = config.clone();
        one.max_attempts = 1;
        let plan = plan_alternative(&one, &request("*", 0), "smart", |_| Admission::Admit).unwrap();
        assert_eq!(names(&one, &plan), ["mini"]);
        // one hop: cheap's own fallback (smart) is another request's business
        let back =
            plan_alternative(&config, &request("*", 0), "cheap", |_| Admission::Admit).unwrap();
        assert_eq!(back.group, "smart");
    }

    #[test]
    fn a_switch_is_read_back_only_when_it_names_configured_things() {
        let config = config();
        let plan = switched_plan(&config, "cheap", "mini,nano").unwrap();
        assert_eq!(plan.group, "cheap");
        assert_eq!(names(&config, &plan), ["mini", "nano"]);
        assert_eq!(
            names(&config, &switched_plan(&config, "cheap", "nano").unwrap()),
            ["nano"]
        );
        for (taken, names) in [
            ("nope", "mini"),
            ("cheap", ""),
            ("cheap", "mini,"),
            ("cheap", "mini,ghost"),
            ("", "mini"),
            ("cheap", "mini,nano,mini,nano,mini,nano,mini,nano,mini"),
        ] {
            assert_eq!(
                switched_plan(&config, taken, names),
                None,
                "{taken} {names}"
            );
        }
    }
}
