//! Which plugin a `root_id` selects. Pure: the shell reads the root id from the host.

/// A plugin of the bundle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Plugin {
    /// `plugins/key-auth`.
    KeyAuth,
    /// `plugins/model-router` (both roles: the role comes from its config's `"role"`).
    ModelRouter,
    /// `plugins/pii-redaction`.
    PiiRedaction,
    /// `plugins/usage-accounting` (with the tokenizer).
    UsageAccounting,
    /// `plugins/token-ratelimit` (with the tokenizer).
    TokenRatelimit,
    /// The fused filter: every plugin's stage in one filter context ([`crate::fused_config`]).
    Fused,
}

/// The root ids the bundle knows and the plugin each one selects: the root ids of
/// `envoy-config/gateway.yaml`, in chain order. `model-router-upstream` is the router's
/// upstream filter; like the standalone module, the router takes its role from its
/// configuration's `"role"`, not from the root id.
pub const ROOT_IDS: [(&str, Plugin); 7] = [
    ("key-auth", Plugin::KeyAuth),
    ("model-router", Plugin::ModelRouter),
    ("model-router-upstream", Plugin::ModelRouter),
    ("pii-redaction", Plugin::PiiRedaction),
    ("usage-accounting", Plugin::UsageAccounting),
    ("token-ratelimit", Plugin::TokenRatelimit),
    ("llm-gateway", Plugin::Fused),
];

/// Longest root id quoted in a log line (a root id is the operator's, not a secret, but a log
/// line stays short).
const MAX_QUOTED: usize = 128;

/// The plugin `root_id` selects; `None` for a root id the bundle does not know.
pub fn plugin(root_id: &str) -> Option<Plugin> {
    ROOT_IDS
        .iter()
        .find(|(id, _)| *id == root_id)
        .map(|(_, plugin)| *plugin)
}

/// The log line of a root context the bundle cannot serve: the root id it got (`None`: the
/// host did not say) and the ones it knows.
pub fn unknown_root_id(root_id: Option<&str>) -> String {
    let got = match root_id {
        Some(id) if id.chars().count() > MAX_QUOTED => {
            let cut: String = id.chars().take(MAX_QUOTED).collect();
            format!(
                "unknown root_id {cut:?}… ({} characters)",
                id.chars().count()
            )
        }
        Some(id) => format!("unknown root_id {id:?}"),
        None => "the host did not give the root_id (property plugin_root_id)".to_string(),
    };
    let known: Vec<&str> = ROOT_IDS.iter().map(|(id, _)| *id).collect();
    format!(
        "llm-gateway bundle: {got}; set the filter's root_id to one of: {}",
        known.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_root_id_of_the_chain_selects_its_plugin() {
        assert_eq!(plugin("key-auth"), Some(Plugin::KeyAuth));
        assert_eq!(plugin("model-router"), Some(Plugin::ModelRouter));
        assert_eq!(plugin("model-router-upstream"), Some(Plugin::ModelRouter));
        assert_eq!(plugin("pii-redaction"), Some(Plugin::PiiRedaction));
        assert_eq!(plugin("usage-accounting"), Some(Plugin::UsageAccounting));
        assert_eq!(plugin("token-ratelimit"), Some(Plugin::TokenRatelimit));
        assert_eq!(plugin("llm-gateway"), Some(Plugin::Fused));
    }

    #[test]
    fn root_ids_match_exactly() {
        for id in [
            "",
            "key_auth",
            "Key-Auth",
            "key-auth ",
            "model-router-",
            "bundle",
        ] {
            assert_eq!(plugin(id), None, "{id:?}");
        }
    }

    #[test]
    fn root_ids_are_distinct() {
        for (i, (a, _)) in ROOT_IDS.iter().enumerate() {
            assert!(ROOT_IDS.iter().skip(i + 1).all(|(b, _)| a != b), "{a}");
        }
    }

    #[test]
    fn the_unknown_root_id_message_names_the_id_and_every_known_one() {
        let message = unknown_root_id(Some("pii"));
        assert!(message.contains("unknown root_id \"pii\""), "{message}");
        for (id, _) in ROOT_IDS {
            assert!(message.contains(id), "{message}");
        }
        let empty = unknown_root_id(Some(""));
        assert!(empty.contains("unknown root_id \"\""), "{empty}");
        let missing = unknown_root_id(None);
        assert!(missing.contains("plugin_root_id"), "{missing}");
    }

    #[test]
    fn a_long_root_id_is_cut_on_a_char_boundary() {
        let id = "é".repeat(1000);
        let message = unknown_root_id(Some(&id));
        assert!(message.contains("(1000 characters)"), "{message}");
        assert!(message.len() < 600, "{}", message.len());
    }
}
