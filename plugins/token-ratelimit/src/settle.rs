//! What settling a finished request gives back or charges, from what it reserved and what it
//! really used (usage-accounting's record).
//!
//! * A request that never went upstream (refused later in the chain, client gone while it
//!   waited) used nothing: every unit comes back, requests included.
//! * A forwarded request keeps its request units; its token units come back minus the real
//!   total (negative: over-use, paid as debt).
//! * A request that is no model call (`/v1/messages/count_tokens`) keeps its request units and
//!   used no tokens; it reserved no budget.
//! * Without a usage record (usage-accounting missing from the chain, or placed after this
//!   filter) nothing is known: the reservation stands (tokens kept, budgets charged it) — the
//!   safe direction, counted as `settled_without_usage`.

use crate::budget::{self, Actual, Level};
use crate::config::{Budget, BudgetUnit, Unit};
use llm_gateway_shared::price::Price;
use llm_gateway_shared::usage_record::Charge;

impl Actual {
    /// Usage as the record gives it.
    pub fn from_record(record: &Charge) -> Actual {
        Actual {
            tokens: record.usage.total_tokens,
            cost: record.cost_nano.zip(record.currency.clone()),
            prompt_tokens: record.usage.prompt_tokens,
            completion_tokens: record.usage.completion_tokens,
        }
    }

    /// Nothing used.
    pub fn zero() -> Actual {
        Actual {
            tokens: 0,
            cost: None,
            prompt_tokens: 0,
            completion_tokens: 0,
        }
    }
}

/// What a request used: nothing if it was never forwarded or is no model call (token
/// counting: it generates nothing and has no usage record), else its record's usage (`None`:
/// unknown).
pub fn actual(forwarded: bool, model_call: bool, record: Option<&Charge>) -> Option<Actual> {
    if forwarded && model_call {
        record.map(Actual::from_record)
    } else {
        Some(Actual::zero())
    }
}

/// Units to give back to a soft bucket that `reserved` were taken from (negative: debt).
pub fn bucket_refund(unit: Unit, reserved: u64, forwarded: bool, actual: Option<&Actual>) -> i64 {
    let used = match (unit, actual) {
        (Unit::Requests, _) if forwarded => return 0,
        (Unit::Requests, _) => 0,
        (Unit::Tokens, Some(actual)) => actual.tokens,
        (Unit::Tokens, None) => return 0,
    };
    let refund = i128::from(reserved) - i128::from(used);
    i64::try_from(refund).unwrap_or(if refund < 0 { i64::MIN } else { i64::MAX })
}

/// What each budget level is charged in the end: its actual amount, or what it reserved when
/// the usage is unknown.
pub fn level_charges(
    budgets: &[Budget],
    levels: &[Level],
    reserved: &[u64],
    actual: Option<&Actual>,
    price: Option<&Price>,
) -> Vec<u64> {
    levels
        .iter()
        .zip(reserved)
        .map(|(level, reserved)| {
            budgets
                .get(level.budget)
                .and_then(|b| budget::actual_amount(b, actual, price))
                .unwrap_or(*reserved)
        })
        .collect()
}

/// Whether [`level_charges`] reads its `price` for these levels: only a money budget whose
/// actual cost is not in the record (in its currency) is priced; every other level is charged
/// the same whatever the price.
pub fn needs_price(budgets: &[Budget], levels: &[Level], actual: Option<&Actual>) -> bool {
    let Some(actual) = actual else {
        return false; // unknown usage: every level is charged what it reserved
    };
    levels.iter().any(|level| match budgets.get(level.budget) {
        Some(Budget {
            unit: BudgetUnit::Money { currency },
            ..
        }) => !matches!(&actual.cost, Some((_, c)) if c == currency),
        _ => false,
    })
}

/// What each level has spent after a reservation, from the remainders Redis reported.
pub fn spent_after(levels: &[Level], remaining: &[i64]) -> Vec<u64> {
    levels
        .iter()
        .zip(remaining)
        .map(|(l, r)| u64::try_from(i128::from(l.limit) - i128::from(*r)).unwrap_or(0))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Dimension, OnRedisFailure, Period};
    use llm_gateway_shared::price::MicroPrice;

    fn used(tokens: u64) -> Actual {
        Actual {
            tokens,
            cost: None,
            prompt_tokens: tokens,
            completion_tokens: 0,
        }
    }

    #[test]
    fn buckets_get_back_what_was_not_used() {
        // forwarded: requests stay counted, tokens come back minus the real use
        assert_eq!(bucket_refund(Unit::Requests, 1, true, Some(&used(5))), 0);
        assert_eq!(
            bucket_refund(Unit::Tokens, 300, true, Some(&used(120))),
            180
        );
        assert_eq!(
            bucket_refund(Unit::Tokens, 100, true, Some(&used(130))),
            -30
        );
        // unknown usage: the reservation stands
        assert_eq!(bucket_refund(Unit::Tokens, 300, true, None), 0);
        // never forwarded: everything comes back
        let nothing = actual(false, true, None);
        assert_eq!(bucket_refund(Unit::Requests, 1, false, nothing.as_ref()), 1);
        assert_eq!(
            bucket_refund(Unit::Tokens, 300, false, nothing.as_ref()),
            300
        );
        // forwarded, but no model call (token counting): the request stays counted, no
        // tokens were used, and no record is waited for (a stray one is not read)
        let counted = actual(true, false, None);
        assert_eq!(counted.as_ref().map(|a| a.tokens), Some(0));
        assert_eq!(bucket_refund(Unit::Requests, 1, true, counted.as_ref()), 0);
        assert_eq!(bucket_refund(Unit::Tokens, 0, true, counted.as_ref()), 0);
        // a model call without a record: unknown
        assert!(actual(true, true, None).is_none());
    }

    #[test]
    fn levels_are_charged_the_actual_or_their_reservation() {
        let tokens = Budget {
            name: "t".into(),
            by: Dimension::Tenant,
            period: Period::Day,
            unit: BudgetUnit::Tokens,
            amount: 1000,
            tiers: Default::default(),
            model_groups: vec![],
            on_redis_failure: OnRedisFailure::Reject,
            warn_at: vec![],
        };
        let money = Budget {
            unit: BudgetUnit::Money {
                currency: "USD".into(),
            },
            ..tokens.clone()
        };
        let level = |budget| Level {
            budget,
            key: "k".into(),
            limit: 1000,
            expire_at_ms: 0,
        };
        let budgets = [tokens, money];
        let levels = [level(0), level(1)];
        assert_eq!(
            level_charges(&budgets, &levels, &[400, 9000], Some(&used(150)), None),
            vec![150, 9000],
            "a money level without a price keeps its reservation"
        );
        assert_eq!(
            level_charges(&budgets, &levels, &[400, 9000], None, None),
            vec![400, 9000]
        );
        assert_eq!(spent_after(&levels, &[600, -5]), vec![400, 1005]);

        // the price is read exactly when it can change a charge
        let usd = Price::from(MicroPrice {
            currency: "USD".into(),
            input: 1_000_000,
            output: 2_000_000,
            cached_input: None,
        });
        let eur = Price {
            currency: "EUR".into(),
            ..usd.clone()
        };
        let costed = |currency: &str| Actual {
            cost: Some((77, currency.into())),
            ..used(150)
        };
        for (levels, actual, needed) in [
            (&levels[..1], Some(used(150)), false),
            (&levels[..], Some(used(150)), true),
            (&levels[..], Some(costed("USD")), false),
            (&levels[..], Some(costed("EUR")), true),
            (&levels[1..], None, false),
        ] {
            let actual = actual.as_ref();
            assert_eq!(needs_price(&budgets, levels, actual), needed, "{actual:?}");
            let reserved = vec![400; levels.len()];
            let with = |price| level_charges(&budgets, levels, &reserved, actual, price);
            let unchanged = [Some(&usd), Some(&eur)]
                .iter()
                .all(|p| with(*p) == with(None));
            assert_eq!(unchanged, !needed, "{actual:?}");
        }
    }
}
