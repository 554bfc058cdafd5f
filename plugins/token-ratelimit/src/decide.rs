//! The answers the plugin gives: refusals (429, 402, 503) and response headers.

use crate::config::{Budget, BudgetUnit, Limit, Unit};
use llm_gateway_shared::reject::{ErrorType, Reject};

/// Response header naming the group a budget fallback switched to.
pub const BUDGET_FALLBACK_HEADER: &str = "x-llm-budget-fallback";
/// Response header listing crossed soft thresholds (`<budget>=<percent>`).
pub const BUDGET_WARNING_HEADER: &str = "x-llm-budget-warning";

fn unit_name(unit: Unit) -> &'static str {
    match unit {
        Unit::Requests => "requests",
        Unit::Tokens => "tokens",
    }
}

fn window_name(window_ms: u64) -> String {
    match window_ms {
        1_000 => "second".into(),
        60_000 => "minute".into(),
        3_600_000 => "hour".into(),
        86_400_000 => "day".into(),
        ms => format!("{ms} ms"),
    }
}

/// 429 for a soft limit of `amount` (the request's tier's): `Retry-After` (seconds, rounded
/// up), `retry-after-ms`, and the limit's `x-ratelimit-*` headers.
pub fn rate_limited(
    limit: &Limit,
    amount: u64,
    cost: u64,
    retry_after_ms: u64,
    never: bool,
) -> Reject {
    let unit = unit_name(limit.unit);
    let message = if never {
        format!(
            "this request needs {cost} {unit}, more than rate limit `{}` allows ({} {unit} per {}); lower max_tokens or the prompt",
            limit.name,
            amount,
            window_name(limit.window_ms)
        )
    } else {
        format!(
            "rate limit `{}` reached ({} {unit} per {}); retry after {} ms",
            limit.name,
            amount,
            window_name(limit.window_ms),
            retry_after_ms
        )
    };
    Reject::too_many_requests(
        "rate_limit_exceeded",
        message,
        retry_after_ms.div_ceil(1000),
    )
    .with_header("retry-after-ms", retry_after_ms.to_string())
    .with_header(limit_header(limit.unit), amount.to_string())
    .with_header(remaining_header(limit.unit), "0")
}

/// `x-ratelimit-limit-requests` / `-tokens`.
pub fn limit_header(unit: Unit) -> &'static str {
    match unit {
        Unit::Requests => "x-ratelimit-limit-requests",
        Unit::Tokens => "x-ratelimit-limit-tokens",
    }
}

/// `x-ratelimit-remaining-requests` / `-tokens`.
pub fn remaining_header(unit: Unit) -> &'static str {
    match unit {
        Unit::Requests => "x-ratelimit-remaining-requests",
        Unit::Tokens => "x-ratelimit-remaining-tokens",
    }
}

/// 402 `insufficient_quota`: a hard budget cannot cover the request.
pub fn budget_exhausted(budget: &Budget, needed: u64, remaining: i64) -> Reject {
    let what = match &budget.unit {
        BudgetUnit::Tokens => format!("{needed} tokens reserved, {} left", remaining.max(0)),
        BudgetUnit::Money { currency } => format!(
            "{} {currency} reserved, {} {currency} left",
            decimal(needed),
            decimal(u64::try_from(remaining.max(0)).unwrap_or(0))
        ),
    };
    Reject::new(
        402,
        ErrorType::InsufficientQuota,
        "budget_exceeded",
        format!(
            "budget `{}` ({} level) cannot cover this request: {what}",
            budget.name,
            budget.by.as_str()
        ),
    )
    .with_header("x-llm-budget", budget.name.clone())
}

/// 503: a budget that must not be served without Redis, while Redis is unreachable.
pub fn budget_unavailable(budget: &Budget) -> Reject {
    Reject::new(
        503,
        ErrorType::Api,
        "budget_unavailable",
        format!(
            "budget `{}` cannot be checked right now (its store is unreachable); retry later",
            budget.name
        ),
    )
    .with_header("retry-after", "1")
}

/// 500: a money budget and a deployment without a price in the budget's currency.
pub fn unpriced(budget: &Budget) -> Reject {
    Reject::new(
        500,
        ErrorType::Api,
        "budget_unpriced",
        format!(
            "budget `{}` counts money but the deployment has no price in its currency",
            budget.name
        ),
    )
}

/// 503: the gateway cannot hold more budget operations while Redis is unreachable.
pub fn journal_full() -> Reject {
    Reject::new(
        503,
        ErrorType::Api,
        "budget_unavailable",
        "budgets cannot be recorded right now; retry later",
    )
    .with_header("retry-after", "1")
}

/// Nano-units as a decimal amount (`2500000000` → `2.5`).
pub fn decimal(nano: u64) -> String {
    let whole = nano / 1_000_000_000;
    let frac = nano % 1_000_000_000;
    if frac == 0 {
        return whole.to_string();
    }
    let digits = format!("{frac:09}");
    format!("{whole}.{}", digits.trim_end_matches('0'))
}

/// The highest soft threshold of `budget` that spending `spent` of `amount` (the request's
/// tier's) crosses.
pub fn warning(budget: &Budget, amount: u64, spent: u64) -> Option<u8> {
    let percent = u128::from(spent) * 100 / u128::from(amount.max(1));
    budget
        .warn_at
        .iter()
        .rev()
        .find(|p| u128::from(**p) <= percent)
        .copied()
}

/// `x-ratelimit-*` response headers: per unit, the limit with the least left.
pub fn rate_headers(taken: &[(Unit, u64, u64)]) -> Vec<(&'static str, String)> {
    let mut out = Vec::new();
    for unit in [Unit::Requests, Unit::Tokens] {
        if let Some((_, amount, remaining)) = taken
            .iter()
            .filter(|(u, _, _)| *u == unit)
            .min_by_key(|(_, _, remaining)| *remaining)
        {
            out.push((limit_header(unit), amount.to_string()));
            out.push((remaining_header(unit), remaining.to_string()));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Dimension, OnRedisFailure, Period};

    fn limit() -> Limit {
        Limit {
            name: "key-tpm".into(),
            by: vec![Dimension::Key],
            unit: Unit::Tokens,
            amount: 1000,
            tiers: [("free".to_string(), 10)].into(),
            window_ms: 60_000,
            model_groups: vec![],
        }
    }

    #[test]
    fn a_429_says_which_limit_and_when() {
        let r = rate_limited(&limit(), 1000, 10, 1500, false);
        assert_eq!(r.status, 429);
        assert_eq!(r.code, "rate_limit_exceeded");
        assert!(r.message.contains("key-tpm") && r.message.contains("1000 tokens per minute"));
        let headers: Vec<_> = r.response_headers();
        assert!(headers.contains(&("retry-after", "2")));
        assert!(headers.contains(&("retry-after-ms", "1500")));
        assert!(headers.contains(&("x-ratelimit-limit-tokens", "1000")));
        let never = rate_limited(&limit(), 1000, 5000, 60_000, true);
        assert!(never.message.contains("5000 tokens"), "{}", never.message);
    }

    #[test]
    fn a_429_states_the_amount_of_the_requests_tier() {
        let l = limit();
        let r = rate_limited(&l, l.amount_for(Some("free")), 20, 6000, false);
        assert!(r.message.contains("10 tokens per minute"), "{}", r.message);
        assert!(r
            .response_headers()
            .contains(&("x-ratelimit-limit-tokens", "10")));
    }

    #[test]
    fn a_402_names_the_level() {
        let b = Budget {
            name: "month".into(),
            by: Dimension::Tenant,
            period: Period::Month,
            unit: BudgetUnit::Money {
                currency: "USD".into(),
            },
            amount: 5_000_000_000,
            tiers: Default::default(),
            model_groups: vec![],
            on_redis_failure: OnRedisFailure::Reject,
            warn_at: vec![80, 95],
        };
        let r = budget_exhausted(&b, 2_500_000_000, 1_000_000);
        assert_eq!(
            (r.status, r.error_type),
            (402, ErrorType::InsufficientQuota)
        );
        assert!(r.message.contains("tenant level"), "{}", r.message);
        assert!(
            r.message.contains("2.5 USD reserved, 0.001 USD left"),
            "{}",
            r.message
        );
        assert_eq!(warning(&b, b.amount, 3_999_999_999), None);
        assert_eq!(warning(&b, b.amount, 4_000_000_000), Some(80));
        // against a tier's smaller amount the same spend crosses the higher threshold
        assert_eq!(warning(&b, 4_100_000_000, 4_000_000_000), Some(95));
        assert_eq!(warning(&b, b.amount, 4_900_000_000), Some(95));
    }

    #[test]
    fn rate_headers_report_the_tightest_limit_per_unit() {
        let h = rate_headers(&[
            (Unit::Tokens, 1000, 900),
            (Unit::Tokens, 5000, 100),
            (Unit::Requests, 60, 59),
        ]);
        assert!(h.contains(&("x-ratelimit-limit-tokens", "5000".into())));
        assert!(h.contains(&("x-ratelimit-remaining-tokens", "100".into())));
        assert!(h.contains(&("x-ratelimit-remaining-requests", "59".into())));
        assert_eq!(h.len(), 4);
    }
}
