//! Plugin configuration for both hosts, with one rule matcher.
//!
//! **Plain Envoy** hands the plugin one JSON object (the filter's `configuration`); it applies
//! to every request. **Higress** turns a `WasmPlugin`'s `defaultConfig` into the top-level
//! object and each `matchRules[]` entry into an element of `_rules_`, carrying the rule's
//! config plus exactly one matcher:
//!
//! | key | matches | against |
//! |---|---|---|
//! | `_match_route_` | route names, exactly | property `route_name` |
//! | `_match_route_prefix_` | route-name prefixes | property `route_name` |
//! | `_match_domain_` | `example.com`, `*.example.com` (suffix), `www.*` (prefix) | `:authority` without its port, any letter case |
//! | `_match_service_` | `fqdn` or `fqdn:port` | property `cluster_name` (`outbound\|port\|\|fqdn`; a plain Envoy cluster name is an fqdn without port) |
//!
//! The first rule that matches wins, else the global config; with neither, the plugin does
//! nothing for that request. A rule's config is the global config with the rule's fields
//! laid over it (a field in the rule replaces the global field of the same name), so an
//! auth plugin can keep its keys global and set only `allow` per route.
//!
//! Refused, with the field named: a document that is not a JSON object, `_rules_` that is not
//! an array of objects, a rule with no matcher or with two, an unknown `_match_*` key, a
//! matcher that is not a non-empty list of non-empty strings, a `*` inside a domain, and
//! whatever the plugin's own parser refuses. Other keys that begin and end with `_` are
//! reserved for the host and are not passed to the plugin.

use crate::config::ConfigError;
use serde_json::{Map, Value};

const RULES: &str = "_rules_";
const MATCH_ROUTE: &str = "_match_route_";
const MATCH_ROUTE_PREFIX: &str = "_match_route_prefix_";
const MATCH_DOMAIN: &str = "_match_domain_";
const MATCH_SERVICE: &str = "_match_service_";
const MATCH_PREFIX: &str = "_match_";

/// What the shell must read from the host for [`RuleSet::select`] to decide; fields it does
/// not need may be left empty in [`MatchInput`], saving host calls on every request.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct MatchNeeds {
    /// Some rule matches on the route name.
    pub route: bool,
    /// Some rule matches on the `:authority`.
    pub authority: bool,
    /// Some rule matches on the cluster name.
    pub cluster: bool,
}

/// Which config [`RuleSet::parse`] asks the plugin to build.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// The top-level (global) config.
    Global,
    /// `_rules_[n]`, laid over the global fields.
    Rule(usize),
}

/// The request facts rules match on, as the host reports them.
#[derive(Debug, Default, Clone, Copy)]
pub struct MatchInput<'a> {
    /// Property `route_name`.
    pub route: &'a str,
    /// Header `:authority`, port included or not.
    pub authority: &'a str,
    /// Property `cluster_name`.
    pub cluster: &'a str,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum DomainPattern {
    Exact(String),
    Suffix(String),
    Prefix(String),
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct ServicePattern {
    fqdn: String,
    port: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Matcher {
    Route(Vec<String>),
    RoutePrefix(Vec<String>),
    Domain(Vec<DomainPattern>),
    Service(Vec<ServicePattern>),
}

#[derive(Debug)]
struct Rule<C> {
    matcher: Matcher,
    config: C,
}

/// A plugin's parsed configuration: an optional global config and ordered rules.
#[derive(Debug)]
pub struct RuleSet<C> {
    global: Option<C>,
    rules: Vec<Rule<C>>,
    needs: MatchNeeds,
}

impl<C> RuleSet<C> {
    /// Parses a configuration document of either host. `parse` turns one effective config
    /// object (the global one, or a rule laid over it) into the plugin's config, told which
    /// of the two it is; its errors come back with the rule's path in front
    /// (`_rules_[2].allow`).
    ///
    /// An empty document counts as `{}`.
    pub fn parse<F>(document: &[u8], mut parse: F) -> Result<Self, ConfigError>
    where
        F: FnMut(&Map<String, Value>, Scope) -> Result<C, ConfigError>,
    {
        let value: Value = if document.iter().all(u8::is_ascii_whitespace) {
            Value::Object(Map::new())
        } else {
            serde_json::from_slice(document)
                .map_err(|e| ConfigError::new("", format!("not valid JSON: {e}")))?
        };
        let Value::Object(mut top) = value else {
            return Err(ConfigError::new("", "must be a JSON object"));
        };

        let rules_value = top.remove(RULES);
        if let Some(key) = top.keys().find(|k| k.starts_with(MATCH_PREFIX)) {
            return Err(ConfigError::new(
                key.as_str(),
                "matchers are only valid inside a `_rules_` entry",
            ));
        }
        top.retain(|k, _| !is_reserved(k));

        let global = if rules_value.is_none() || !top.is_empty() {
            Some(parse(&top, Scope::Global)?)
        } else {
            None
        };

        let rule_values = match rules_value {
            None => Vec::new(),
            Some(Value::Array(items)) => items,
            Some(_) => return Err(ConfigError::new(RULES, "must be an array of rule objects")),
        };
        if global.is_none() && rule_values.is_empty() {
            return Err(ConfigError::new(
                RULES,
                "no global configuration and no rules: nothing to apply",
            ));
        }

        let mut needs = MatchNeeds::default();
        let mut rules = Vec::with_capacity(rule_values.len());
        for (index, item) in rule_values.into_iter().enumerate() {
            let path = format!("{RULES}[{index}]");
            let Value::Object(rule_fields) = item else {
                return Err(ConfigError::new(path, "must be an object"));
            };
            let (matcher, own_fields) = split_rule(rule_fields).map_err(|e| e.within(&path))?;
            match matcher {
                Matcher::Route(_) | Matcher::RoutePrefix(_) => needs.route = true,
                Matcher::Domain(_) => needs.authority = true,
                Matcher::Service(_) => needs.cluster = true,
            }
            let mut effective = top.clone();
            effective.extend(own_fields);
            let config = parse(&effective, Scope::Rule(index)).map_err(|e| e.within(&path))?;
            rules.push(Rule { matcher, config });
        }

        Ok(RuleSet {
            global,
            rules,
            needs,
        })
    }

    /// A rule set of one global config and no rules (what a plain JSON document gives).
    pub fn global_only(config: C) -> Self {
        RuleSet {
            global: Some(config),
            rules: Vec::new(),
            needs: MatchNeeds::default(),
        }
    }

    /// Which request facts [`RuleSet::select`] looks at.
    pub fn needs(&self) -> MatchNeeds {
        self.needs
    }

    /// The config for a request: the first matching rule's, else the global one, else `None`
    /// (the plugin does nothing for this request).
    pub fn select(&self, input: &MatchInput<'_>) -> Option<&C> {
        self.rules
            .iter()
            .find(|rule| rule.matcher.matches(input))
            .map(|rule| &rule.config)
            .or(self.global.as_ref())
    }

    /// The global config, if the document has one.
    pub fn global(&self) -> Option<&C> {
        self.global.as_ref()
    }

    /// Every config in the set: the global one first, then the rules' in order.
    pub fn configs(&self) -> impl Iterator<Item = &C> {
        self.global
            .iter()
            .chain(self.rules.iter().map(|rule| &rule.config))
    }
}

fn is_reserved(key: &str) -> bool {
    key.len() >= 2 && key.starts_with('_') && key.ends_with('_')
}

/// Splits a rule object into its one matcher and its own config fields.
fn split_rule(fields: Map<String, Value>) -> Result<(Matcher, Map<String, Value>), ConfigError> {
    let mut matcher = None;
    let mut own = Map::new();
    for (key, value) in fields {
        if !key.starts_with(MATCH_PREFIX) {
            if !is_reserved(&key) {
                own.insert(key, value);
            }
            continue;
        }
        let values = string_list(&key, &value)?;
        let parsed = match key.as_str() {
            MATCH_ROUTE => Matcher::Route(values),
            MATCH_ROUTE_PREFIX => Matcher::RoutePrefix(values),
            MATCH_DOMAIN => Matcher::Domain(
                values
                    .iter()
                    .enumerate()
                    .map(|(i, v)| domain_pattern(v).map_err(|e| e.within(&format!("{key}[{i}]"))))
                    .collect::<Result<_, _>>()?,
            ),
            MATCH_SERVICE => Matcher::Service(values.iter().map(|v| service_pattern(v)).collect()),
            _ => {
                return Err(ConfigError::new(
                    key.as_str(),
                    "unknown matcher (known: _match_route_, _match_route_prefix_, _match_domain_, _match_service_)",
                ))
            }
        };
        if matcher.replace(parsed).is_some() {
            return Err(ConfigError::new(
                key.as_str(),
                "a rule takes exactly one matcher; this one has two",
            ));
        }
    }
    let matcher = matcher.ok_or_else(|| {
        ConfigError::new(
            "",
            "a rule needs one of _match_route_, _match_route_prefix_, _match_domain_, _match_service_",
        )
    })?;
    Ok((matcher, own))
}

fn string_list(key: &str, value: &Value) -> Result<Vec<String>, ConfigError> {
    let Value::Array(items) = value else {
        return Err(ConfigError::new(key, "must be a list of strings"));
    };
    if items.is_empty() {
        return Err(ConfigError::new(key, "must not be empty"));
    }
    items
        .iter()
        .enumerate()
        .map(|(i, item)| match item {
            Value::String(s) if !s.is_empty() => Ok(s.clone()),
            Value::String(_) => Err(ConfigError::new(format!("{key}[{i}]"), "must not be empty")),
            _ => Err(ConfigError::new(format!("{key}[{i}]"), "must be a string")),
        })
        .collect()
}

fn domain_pattern(pattern: &str) -> Result<DomainPattern, ConfigError> {
    let lower = pattern.to_ascii_lowercase();
    let parsed = if let Some(suffix) = lower.strip_prefix('*') {
        DomainPattern::Suffix(suffix.to_string())
    } else if let Some(prefix) = lower.strip_suffix('*') {
        DomainPattern::Prefix(prefix.to_string())
    } else {
        DomainPattern::Exact(lower.clone())
    };
    let rest = match &parsed {
        DomainPattern::Exact(s) | DomainPattern::Suffix(s) | DomainPattern::Prefix(s) => s,
    };
    if rest.contains('*') {
        return Err(ConfigError::new(
            "",
            "`*` is allowed only as the first or the last character",
        ));
    }
    Ok(parsed)
}

fn service_pattern(pattern: &str) -> ServicePattern {
    match pattern.rsplit_once(':') {
        Some((fqdn, port)) if !port.is_empty() && port.bytes().all(|b| b.is_ascii_digit()) => {
            ServicePattern {
                fqdn: fqdn.to_string(),
                port: Some(port.to_string()),
            }
        }
        _ => ServicePattern {
            fqdn: pattern.to_string(),
            port: None,
        },
    }
}

impl Matcher {
    fn matches(&self, input: &MatchInput<'_>) -> bool {
        match self {
            Matcher::Route(routes) => routes.iter().any(|r| r == input.route),
            Matcher::RoutePrefix(prefixes) => {
                prefixes.iter().any(|p| input.route.starts_with(p.as_str()))
            }
            Matcher::Domain(patterns) => {
                let host = strip_port(input.authority);
                patterns.iter().any(|p| p.matches(host))
            }
            Matcher::Service(patterns) => {
                let (fqdn, port) = split_cluster_name(input.cluster);
                !fqdn.is_empty() && patterns.iter().any(|p| p.matches(fqdn, port))
            }
        }
    }
}

impl DomainPattern {
    fn matches(&self, host: &str) -> bool {
        let host = host.as_bytes();
        match self {
            DomainPattern::Exact(p) => host.eq_ignore_ascii_case(p.as_bytes()),
            DomainPattern::Suffix(p) => {
                host.len() >= p.len()
                    && host
                        .get(host.len() - p.len()..)
                        .is_some_and(|tail| tail.eq_ignore_ascii_case(p.as_bytes()))
            }
            DomainPattern::Prefix(p) => host
                .get(..p.len())
                .is_some_and(|head| head.eq_ignore_ascii_case(p.as_bytes())),
        }
    }
}

impl ServicePattern {
    fn matches(&self, fqdn: &str, port: Option<&str>) -> bool {
        self.fqdn == fqdn
            && match &self.port {
                None => true,
                Some(want) => port == Some(want.as_str()),
            }
    }
}

/// `:authority` without its port: `example.com:8080` -> `example.com`, `[::1]:80` -> `[::1]`.
fn strip_port(authority: &str) -> &str {
    match authority.rfind(':') {
        Some(colon) if authority.rfind(']').is_none_or(|bracket| bracket < colon) => {
            authority.get(..colon).unwrap_or(authority)
        }
        _ => authority,
    }
}

/// Higress cluster names are `outbound|port|subset|fqdn`; anything else is an fqdn alone.
fn split_cluster_name(cluster: &str) -> (&str, Option<&str>) {
    let mut parts = cluster.split('|');
    match (
        parts.next(),
        parts.next(),
        parts.next(),
        parts.next(),
        parts.next(),
    ) {
        (Some(_), Some(port), Some(_), Some(fqdn), None) => (fqdn, Some(port)),
        _ => (cluster, None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    /// A toy plugin config: a name and an optional number, unknown fields refused.
    #[derive(Debug, PartialEq, serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Toy {
        name: String,
        #[serde(default)]
        n: u32,
    }

    fn toy(fields: &Map<String, Value>, _scope: Scope) -> Result<Toy, ConfigError> {
        serde_json::from_value(Value::Object(fields.clone()))
            .map_err(|e| ConfigError::from_serde("", &e))
    }

    fn parse(doc: &str) -> Result<RuleSet<Toy>, ConfigError> {
        RuleSet::parse(doc.as_bytes(), toy)
    }

    fn pick<'a>(
        set: &'a RuleSet<Toy>,
        route: &str,
        authority: &str,
        cluster: &str,
    ) -> Option<&'a str> {
        set.select(&MatchInput {
            route,
            authority,
            cluster,
        })
        .map(|t| t.name.as_str())
    }

    #[test]
    fn plain_envoy_document_is_global() {
        let set = parse(r#"{"name":"g","n":3}"#).unwrap();
        assert_eq!(
            set.global(),
            Some(&Toy {
                name: "g".into(),
                n: 3
            })
        );
        assert_eq!(pick(&set, "any", "h", "c"), Some("g"));
        assert_eq!(set.needs(), MatchNeeds::default());
    }

    #[test]
    fn empty_document_is_empty_object() {
        let err = parse("  \n").unwrap_err();
        // Toy requires `name`: the plugin's parser saw `{}`.
        assert!(err.reason().contains("missing field `name`"), "{err}");
        let set = RuleSet::parse(b"", |m, _| Ok(m.len())).unwrap();
        assert_eq!(set.global(), Some(&0));
    }

    #[test]
    fn higress_rules_first_match_wins_else_global() {
        let set = parse(
            r#"{
              "name": "global",
              "_rules_": [
                {"_match_route_": ["default/chat"], "name": "route"},
                {"_match_route_prefix_": ["default/"], "name": "prefix"},
                {"_match_domain_": ["*.example.com", "api.*", "exact.org"], "name": "domain"},
                {"_match_service_": ["llm.svc.cluster.local:443", "any-port.svc"], "name": "service"}
              ]
            }"#,
        )
        .unwrap();
        let cases = [
            ("default/chat", "", "", "route"),
            ("default/other", "", "", "prefix"),
            ("other/x", "a.example.com:8443", "", "domain"),
            ("other/x", "A.EXAMPLE.com", "", "domain"),
            ("other/x", "example.com", "", "global"),
            ("other/x", "api.internal", "", "domain"),
            ("other/x", "exact.org", "", "domain"),
            ("other/x", "exact.org.evil", "", "global"),
            ("", "", "outbound|443||llm.svc.cluster.local", "service"),
            ("", "", "outbound|80||llm.svc.cluster.local", "global"),
            ("", "", "outbound|80||any-port.svc", "service"),
            ("", "", "any-port.svc", "service"),
            ("", "", "llm.svc.cluster.local", "global"),
            ("", "", "", "global"),
        ];
        for (route, authority, cluster, want) in cases {
            assert_eq!(
                pick(&set, route, authority, cluster),
                Some(want),
                "route={route:?} authority={authority:?} cluster={cluster:?}"
            );
        }
        assert_eq!(
            set.needs(),
            MatchNeeds {
                route: true,
                authority: true,
                cluster: true
            }
        );
    }

    #[test]
    fn rules_only_document_has_no_global() {
        let set = parse(r#"{"_rules_":[{"_match_route_":["r"],"name":"only"}]}"#).unwrap();
        assert!(set.global().is_none());
        assert_eq!(pick(&set, "r", "", ""), Some("only"));
        assert_eq!(pick(&set, "other", "", ""), None);
        assert_eq!(
            set.needs(),
            MatchNeeds {
                route: true,
                ..MatchNeeds::default()
            }
        );
    }

    #[test]
    fn rule_fields_lay_over_global_fields() {
        let set = parse(r#"{"name":"g","n":7,"_rules_":[{"_match_route_":["r"],"name":"rule"}]}"#)
            .unwrap();
        let rule = set
            .select(&MatchInput {
                route: "r",
                ..MatchInput::default()
            })
            .unwrap();
        assert_eq!(
            rule,
            &Toy {
                name: "rule".into(),
                n: 7
            }
        );
        assert_eq!(set.configs().count(), 2);
    }

    #[test]
    fn the_plugin_is_told_the_scope() {
        let mut seen = Vec::new();
        RuleSet::parse(
            br#"{"a":1,"_rules_":[{"_match_route_":["r"]},{"_match_domain_":["d"]}]}"#,
            |_, scope| {
                seen.push(scope);
                Ok(())
            },
        )
        .unwrap();
        assert_eq!(seen, vec![Scope::Global, Scope::Rule(0), Scope::Rule(1)]);
    }

    #[test]
    fn reserved_keys_are_not_passed_to_the_plugin() {
        let set = RuleSet::parse(
            br#"{"name":"g","_higress_meta_":1,"_rules_":[{"_match_route_":["r"],"_x_":2,"n":1}]}"#,
            |fields, _| Ok(fields.keys().cloned().collect::<Vec<_>>()),
        )
        .unwrap();
        let seen: Vec<_> = set.configs().cloned().collect();
        assert_eq!(
            seen,
            vec![
                vec!["name".to_string()],
                vec!["n".to_string(), "name".to_string()]
            ]
        );
    }

    #[test]
    fn refusals_name_the_field() {
        let cases = [
            ("[1,2]", "", "must be a JSON object"),
            ("{\"name\":", "", "not valid JSON"),
            (r#"{"name":"g","_rules_":{}}"#, "_rules_", "array"),
            (r#"{"_rules_":[]}"#, "_rules_", "nothing to apply"),
            (
                r#"{"name":"g","_rules_":[1]}"#,
                "_rules_[0]",
                "must be an object",
            ),
            (
                r#"{"name":"g","_rules_":[{"name":"x"}]}"#,
                "_rules_[0]",
                "needs one of",
            ),
            (
                r#"{"name":"g","_rules_":[{"_match_route_":["a"],"_match_domain_":["b"]}]}"#,
                "_rules_[0]._match_",
                "exactly one matcher",
            ),
            (
                r#"{"name":"g","_rules_":[{"_match_path_":["/v1"]}]}"#,
                "_rules_[0]._match_path_",
                "unknown matcher",
            ),
            (
                r#"{"name":"g","_rules_":[{"_match_route_":[]}]}"#,
                "_rules_[0]._match_route_",
                "must not be empty",
            ),
            (
                r#"{"name":"g","_rules_":[{"_match_route_":"r"}]}"#,
                "_rules_[0]._match_route_",
                "list of strings",
            ),
            (
                r#"{"name":"g","_rules_":[{"_match_route_":["r", 3]}]}"#,
                "_rules_[0]._match_route_[1]",
                "must be a string",
            ),
            (
                r#"{"name":"g","_rules_":[{"_match_route_":[""]}]}"#,
                "_rules_[0]._match_route_[0]",
                "must not be empty",
            ),
            (
                r#"{"name":"g","_rules_":[{"_match_domain_":["a.*.com"]}]}"#,
                "_rules_[0]._match_domain_[0]",
                "`*`",
            ),
            (
                r#"{"name":"g","_match_route_":["r"]}"#,
                "_match_route_",
                "only valid inside",
            ),
            (
                r#"{"name":"g","_rules_":[{"_match_route_":["r"],"nmae":"typo"}]}"#,
                "_rules_[1]",
                "",
            ),
            (r#"{"name":5}"#, "", "invalid type"),
        ];
        for (doc, field, reason) in cases {
            let Err(err) = parse(doc) else {
                panic!("accepted {doc}");
            };
            if field == "_rules_[1]" {
                // the typo'd field is refused by the plugin's parser, inside rule 0
                assert_eq!(err.field(), "_rules_[0]", "{doc}: {err}");
                assert!(err.reason().contains("nmae"), "{doc}: {err}");
                continue;
            }
            assert!(
                err.field().starts_with(field),
                "{doc}: field {:?}",
                err.field()
            );
            assert!(
                err.reason().contains(reason),
                "{doc}: reason {:?}",
                err.reason()
            );
        }
    }

    #[test]
    fn ports_are_stripped_from_authority() {
        assert_eq!(strip_port("example.com:8080"), "example.com");
        assert_eq!(strip_port("example.com"), "example.com");
        assert_eq!(strip_port("[::1]:80"), "[::1]");
        assert_eq!(strip_port("[::1]"), "[::1]");
        assert_eq!(strip_port(":"), "");
    }

    #[test]
    fn cluster_names_split_like_higress() {
        assert_eq!(
            split_cluster_name("outbound|80||a.svc"),
            ("a.svc", Some("80"))
        );
        assert_eq!(
            split_cluster_name("outbound|80|v1|a.svc"),
            ("a.svc", Some("80"))
        );
        assert_eq!(split_cluster_name("mock"), ("mock", None));
        assert_eq!(split_cluster_name("a|b|c|d|e"), ("a|b|c|d|e", None));
    }

    #[cfg(not(target_arch = "wasm32"))]
    mod properties {
        use super::*;
        use proptest::prelude::*;

        proptest! {
            /// Matching never panics and answers the global config when no rule matches.
            #[test]
            fn select_total(route in ".{0,20}", authority in ".{0,30}", cluster in ".{0,40}") {
                let set = parse(r#"{"name":"g","_rules_":[
                    {"_match_domain_":["*.x.com","y*"],"name":"d"},
                    {"_match_service_":["s:1","t"],"name":"s"},
                    {"_match_route_prefix_":["p/"],"name":"p"}]}"#).unwrap();
                let got = pick(&set, &route, &authority, &cluster);
                prop_assert!(got.is_some());
            }

            /// Parsing any bytes yields a config or an error, never a panic.
            #[test]
            fn parse_total(doc in proptest::collection::vec(any::<u8>(), 0..200)) {
                let _ = RuleSet::parse(&doc, |m, _| Ok(m.len()));
            }

            /// Rule order is priority: with two rules matching the same route, the first wins.
            #[test]
            fn first_rule_wins(route in "[a-z]{1,8}") {
                let doc = format!(
                    r#"{{"_rules_":[{{"_match_route_prefix_":["{p}"],"name":"first"}},{{"_match_route_":["{route}"],"name":"second"}}]}}"#,
                    p = route.get(..1).unwrap_or("")
                );
                let set = parse(&doc).unwrap();
                prop_assert_eq!(pick(&set, &route, "", ""), Some("first"));
            }
        }
    }
}
