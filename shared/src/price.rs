//! A deployment's price and what a request's usage costs at it, in integers: no float ever
//! touches money.
//!
//! A [`Price`] holds **nano-units** (10⁻⁹) of its currency **per one million tokens**
//! ([`NanoPerMillion`]). It is written in two JSON forms, each converted where it is read:
//!
//! * the router's: integer **micro-units** per million tokens ([`MicroPrice`]; `150000` is
//!   0.15 per 1M). model-router's `deployments[].price` and token-ratelimit's `prices` are
//!   written in it, and `wasm.llm_route` carries `price` and `price_ceiling` in it
//!   ([`crate::route_info`]). ×1 000 on the way in, ÷1 000 on the way out: a price read in
//!   this form is written back with the same numbers.
//! * usage-accounting's: decimals per million tokens (`"0.30"`, at most 9 decimals), parsed
//!   by that plugin's configuration.
//!
//! Which tokens pay which amount: uncached input `input`; cache reads `cached_input`; cache
//! writes `cache_write`; output other than reasoning `output`; reasoning `reasoning`. The
//! optional three default to `input`, `input` and `output`. [`crate::usage::Usage`] says what
//! each count includes. A cost is
//!
//! ```text
//! cost_nano = round_half_up( Σ tokens_i × amount_i / 1 000 000 )
//! ```
//!
//! with the sum in `u128` and one rounding at the end ([`Price::cost`]), so a request's cost is
//! exact to the nano-unit whenever the amounts have at most 3 decimals (1 000 prompt tokens of
//! which 600 cached plus 100 output at 0.30 / 0.006 / 1.20 cost exactly 243 600 nano-units).

use crate::config::ConfigError;
use crate::json::ObjectWriter;
use crate::usage::Usage;
use serde::{Deserialize, Serialize};

/// Nano-units (10⁻⁹) of a currency per one million tokens. A `u128`: the router's form takes
/// any `u64` of micro-units, whose nano-units may not fit a `u64`.
pub type NanoPerMillion = u128;

/// Nano-units in a micro-unit.
const NANO_PER_MICRO: NanoPerMillion = 1_000;

/// The largest amount [`Price::cost`] prices at: `u64::MAX` nano-units per million tokens
/// (18 446 744 073.709551615 per 1M, the dearest usage-accounting's decimals can write). Each
/// product of a token count and an amount then fits a `u128`.
const COST_AMOUNT_CAP: NanoPerMillion = u64::MAX as NanoPerMillion;

/// The currency of a price that names none.
pub const DEFAULT_CURRENCY: &str = "USD";

/// A deployment's price: nano-units of `currency` per one million tokens of each kind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Price {
    /// The currency: an ISO 4217 code in the router's form ([`Price::validate`]); any short
    /// name in usage-accounting's.
    pub currency: String,
    /// Prompt (input) tokens neither read from nor written to a cache.
    pub input: NanoPerMillion,
    /// Completion (output) tokens other than reasoning.
    pub output: NanoPerMillion,
    /// Prompt tokens read from the provider's cache; `None`: priced as `input`.
    pub cached_input: Option<NanoPerMillion>,
    /// Prompt tokens written to the provider's cache; `None`: priced as `input`.
    pub cache_write: Option<NanoPerMillion>,
    /// Reasoning tokens; `None`: priced as `output`.
    pub reasoning: Option<NanoPerMillion>,
}

impl Price {
    /// Checks the currency is a three-letter upper-case ISO 4217 code (what the router's form
    /// requires).
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.currency.len() != 3 || !self.currency.bytes().all(|b| b.is_ascii_uppercase()) {
            return Err(ConfigError::new(
                "currency",
                "must be a three-letter ISO 4217 code",
            ));
        }
        Ok(())
    }

    /// What a cached prompt token costs: `cached_input`, else `input`.
    pub fn effective_cached_input(&self) -> NanoPerMillion {
        self.cached_input.unwrap_or(self.input)
    }

    /// What a prompt token written to the cache costs: `cache_write`, else `input`.
    pub fn effective_cache_write(&self) -> NanoPerMillion {
        self.cache_write.unwrap_or(self.input)
    }

    /// What a reasoning token costs: `reasoning`, else `output`.
    pub fn effective_reasoning(&self) -> NanoPerMillion {
        self.reasoning.unwrap_or(self.output)
    }

    /// The element-wise maximum of `prices`: a price no deployment among them exceeds in any
    /// amount. `None` if there is no price, any is `None` (an unpriced deployment has no
    /// ceiling), or the currencies differ.
    ///
    /// An optional amount is the maximum of each price's effective one; it stays `None`
    /// (priced as its default) only when every price leaves it so.
    pub fn ceiling<'a>(prices: impl IntoIterator<Item = Option<&'a Price>>) -> Option<Price> {
        let mut ceiling: Option<Price> = None;
        for price in prices {
            let price = price?;
            ceiling = Some(match ceiling {
                None => price.clone(),
                Some(c) => {
                    if c.currency != price.currency {
                        return None;
                    }
                    let optional =
                        |mine: Option<NanoPerMillion>,
                         theirs: Option<NanoPerMillion>,
                         effective: fn(&Price) -> NanoPerMillion| {
                            match (mine, theirs) {
                                (None, None) => None,
                                _ => Some(effective(&c).max(effective(price))),
                            }
                        };
                    Price {
                        input: c.input.max(price.input),
                        output: c.output.max(price.output),
                        cached_input: optional(
                            c.cached_input,
                            price.cached_input,
                            Price::effective_cached_input,
                        ),
                        cache_write: optional(
                            c.cache_write,
                            price.cache_write,
                            Price::effective_cache_write,
                        ),
                        reasoning: optional(
                            c.reasoning,
                            price.reasoning,
                            Price::effective_reasoning,
                        ),
                        currency: c.currency,
                    }
                }
            });
        }
        ceiling
    }

    /// The cost of `usage` at this price, in nano-units of `currency`: each kind of token at
    /// its amount, summed, rounded half up once (see the module doc). An amount above
    /// `u64::MAX` nano-units per million (only the router's form writes one) is priced at
    /// `u64::MAX`; the sum saturates, never wraps.
    pub fn cost(&self, usage: &Usage) -> u64 {
        let reasoning = usage.reasoning_tokens.min(usage.completion_tokens);
        let parts: [(u64, NanoPerMillion); 5] = [
            (usage.uncached_prompt_tokens(), self.input),
            (
                usage.cached_prompt_tokens.min(usage.prompt_tokens),
                self.effective_cached_input(),
            ),
            (usage.cache_write_tokens, self.effective_cache_write()),
            (usage.completion_tokens - reasoning, self.output),
            (reasoning, self.effective_reasoning()),
        ];
        // Each product fits a u128 (both factors fit a u64); their sum may not, at amounts
        // near the cap and counts near u64::MAX: saturate, never wrap.
        let total = parts.iter().fold(0u128, |sum, (tokens, amount)| {
            sum.saturating_add(u128::from(*tokens) * (*amount).min(COST_AMOUNT_CAP))
        });
        let nano = total.saturating_add(500_000) / 1_000_000;
        u64::try_from(nano).unwrap_or(u64::MAX)
    }
}

/// A price in the router's JSON form: integer micro-units of `currency` per one million
/// tokens, `currency` defaulting to `USD`, `cached_input` absent when priced as `input`, no
/// other member. Serde reads and writes it, naming it `Price` in its messages (as operators know
/// it from configuration errors); [`Price`] is what the code uses.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(expecting = "struct Price", deny_unknown_fields)]
pub struct MicroPrice {
    /// ISO 4217 code; default `USD`.
    #[serde(default = "default_currency")]
    pub currency: String,
    /// Prompt (input) tokens.
    pub input: u64,
    /// Completion (output) tokens, reasoning included.
    pub output: u64,
    /// Prompt tokens served from the provider's cache; absent: priced as `input`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cached_input: Option<u64>,
}

fn default_currency() -> String {
    DEFAULT_CURRENCY.to_string()
}

/// Micro-units to nano-units: exact.
fn nano(micro: u64) -> NanoPerMillion {
    NanoPerMillion::from(micro) * NANO_PER_MICRO
}

/// Nano-units to micro-units: exact for what [`nano`] made; anything else rounded up (a price
/// is never written cheaper than it is), at most `u64::MAX`.
fn micro(nano: NanoPerMillion) -> u64 {
    u64::try_from(nano.div_ceil(NANO_PER_MICRO)).unwrap_or(u64::MAX)
}

impl From<MicroPrice> for Price {
    fn from(price: MicroPrice) -> Price {
        Price {
            currency: price.currency,
            input: nano(price.input),
            output: nano(price.output),
            cached_input: price.cached_input.map(nano),
            cache_write: None,
            reasoning: None,
        }
    }
}

impl From<&Price> for MicroPrice {
    /// The router's form of `price`: the same numbers for a price read from it. It has no
    /// `cache_write` or `reasoning`, which are left out (only usage-accounting's decimals
    /// set them, and it writes no price).
    fn from(price: &Price) -> MicroPrice {
        MicroPrice {
            currency: price.currency.clone(),
            input: micro(price.input),
            output: micro(price.output),
            cached_input: price.cached_input.map(micro),
        }
    }
}

impl MicroPrice {
    /// Writes the price as its serde derive does: `cached_input` only when present.
    pub(crate) fn write_json(&self, out: &mut String) {
        let mut object = ObjectWriter::open(out);
        object.string("currency", &self.currency);
        object.u64("input", self.input);
        object.u64("output", self.output);
        if let Some(cached_input) = self.cached_input {
            object.u64("cached_input", cached_input);
        }
        object.close();
    }
}

/// Serde for an `Option<Price>` member written in the router's form, absent or `null` when
/// `None`: `#[serde(default, with = "crate::price::micro_option")]`.
pub mod micro_option {
    use super::{MicroPrice, Price};
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    /// Writes `price` as an optional [`MicroPrice`].
    pub fn serialize<S: Serializer>(price: &Option<Price>, out: S) -> Result<S::Ok, S::Error> {
        price.as_ref().map(MicroPrice::from).serialize(out)
    }

    /// Reads an optional [`MicroPrice`].
    pub fn deserialize<'de, D: Deserializer<'de>>(input: D) -> Result<Option<Price>, D::Error> {
        Ok(Option::<MicroPrice>::deserialize(input)?.map(Price::from))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    /// A price in the router's form (micro-units).
    fn micro_price(currency: &str, input: u64, output: u64, cached_input: Option<u64>) -> Price {
        Price::from(MicroPrice {
            currency: currency.into(),
            input,
            output,
            cached_input,
        })
    }

    /// A price in nano-units, every kind of token priced on its own.
    fn full(
        input: u128,
        cached_input: u128,
        cache_write: u128,
        output: u128,
        reasoning: u128,
    ) -> Price {
        Price {
            currency: "USD".into(),
            input,
            output,
            cached_input: Some(cached_input),
            cache_write: Some(cache_write),
            reasoning: Some(reasoning),
        }
    }

    #[test]
    fn the_router_form_converts_both_ways_exactly() {
        let price = micro_price("EUR", 150_000, 600_000, Some(75_000));
        assert_eq!(price.input, 150_000_000);
        assert_eq!(price.output, 600_000_000);
        assert_eq!(price.cached_input, Some(75_000_000));
        assert_eq!((price.cache_write, price.reasoning), (None, None));
        for micro in [0, 1, 999, 150_000, u64::MAX / 1_000 + 1, u64::MAX] {
            let wire = MicroPrice {
                currency: "USD".into(),
                input: micro,
                output: micro,
                cached_input: Some(micro),
            };
            assert_eq!(
                MicroPrice::from(&Price::from(wire.clone())),
                wire,
                "{micro}"
            );
        }
        // a price the form cannot hold exactly is written dearer, never cheaper
        let mut odd = micro_price("USD", 1, 1, None);
        odd.input += 1;
        odd.output = NanoPerMillion::MAX;
        let wire = MicroPrice::from(&odd);
        assert_eq!((wire.input, wire.output), (2, u64::MAX));
    }

    #[test]
    fn the_router_form_reads_and_writes_the_same_json() {
        for json in [
            r#"{"currency":"USD","input":1,"output":2}"#,
            r#"{"currency":"EUR","input":150000,"output":600000,"cached_input":75000}"#,
            r#"{"currency":"USD","input":18446744073709551615,"output":0}"#,
        ] {
            let wire: MicroPrice = serde_json::from_str(json).unwrap();
            let back = MicroPrice::from(&Price::from(wire));
            assert_eq!(serde_json::to_string(&back).unwrap(), json);
            let mut hand = String::new();
            back.write_json(&mut hand);
            assert_eq!(hand, json);
        }
        let price: MicroPrice = serde_json::from_str(r#"{"input":1,"output":2}"#).unwrap();
        assert_eq!(price.currency, "USD");
        for bad in [
            r#"{"input":1}"#,
            r#"{"input":1,"output":2,"reasoning":3}"#,
            r#"{"input":-1,"output":2}"#,
            r#"{"input":1.5,"output":2}"#,
        ] {
            assert!(serde_json::from_str::<MicroPrice>(bad).is_err(), "{bad}");
        }
        // serde's messages name the type as operators know it
        let err = serde_json::from_str::<MicroPrice>("5").unwrap_err();
        assert!(err.to_string().contains("struct Price"), "{err}");
    }

    #[test]
    fn validate_checks_the_currency_code() {
        assert!(micro_price("USD", 1, 2, None).validate().is_ok());
        for bad in ["usd", "US", "USDT", "U$D", ""] {
            let err = micro_price(bad, 1, 2, None).validate().unwrap_err();
            assert_eq!(err.field(), "currency");
        }
    }

    #[test]
    fn the_ceiling_is_the_element_wise_maximum() {
        let a = micro_price("USD", 150, 600, Some(75));
        let b = micro_price("USD", 100, 900, None);
        let c = micro_price("USD", 120, 500, Some(10));
        // b's cached tokens cost its input price (100): the ceiling's cached price is 100
        assert_eq!(
            Price::ceiling([Some(&a), Some(&b), Some(&c)]),
            Some(micro_price("USD", 150, 900, Some(100)))
        );
        assert_eq!(Price::ceiling([Some(&b)]), Some(b.clone()));
        assert_eq!(
            Price::ceiling([Some(&b), Some(&micro_price("USD", 1, 1, None))]),
            Some(micro_price("USD", 100, 900, None)),
            "no cached price anywhere stays absent"
        );
        // the order does not matter
        assert_eq!(
            Price::ceiling([Some(&c), Some(&b), Some(&a)]),
            Price::ceiling([Some(&a), Some(&b), Some(&c)])
        );
        // never below any member, in every amount
        let d = full(5, 1, 7, 9, 30);
        let ceiling = Price::ceiling([Some(&a), Some(&b), Some(&c), Some(&d)]).unwrap();
        for p in [&a, &b, &c, &d] {
            assert!(ceiling.input >= p.input && ceiling.output >= p.output);
            assert!(ceiling.effective_cached_input() >= p.effective_cached_input());
            assert!(ceiling.effective_cache_write() >= p.effective_cache_write());
            assert!(ceiling.effective_reasoning() >= p.effective_reasoning());
        }
        assert_eq!(ceiling.cache_write, Some(150_000));
        assert_eq!(ceiling.reasoning, Some(900_000));
    }

    #[test]
    fn no_ceiling_without_a_price_for_every_deployment_in_one_currency() {
        let a = micro_price("USD", 150, 600, None);
        assert_eq!(Price::ceiling([]), None);
        assert_eq!(Price::ceiling([Some(&a), None]), None);
        assert_eq!(Price::ceiling([None, Some(&a)]), None);
        assert_eq!(
            Price::ceiling([Some(&a), Some(&micro_price("EUR", 1, 1, None))]),
            None
        );
    }

    #[test]
    fn the_known_case_is_exact() {
        let usage = Usage {
            prompt_tokens: 1_000,
            completion_tokens: 100,
            cached_prompt_tokens: 600,
            ..Usage::default()
        };
        let price = Price {
            cached_input: Some(6_000_000),
            ..micro_price("USD", 300_000, 1_200_000, None)
        };
        // 400 × 0.30 + 600 × 0.006 + 100 × 1.20 per million = 243.6 micro-units
        assert_eq!(price.cost(&usage), 243_600);
    }

    #[test]
    fn cache_writes_and_reasoning_have_their_prices() {
        let usage = Usage {
            prompt_tokens: 1_162,
            completion_tokens: 200,
            cached_prompt_tokens: 1_000,
            cache_write_tokens: 150,
            reasoning_tokens: 50,
        };
        let price = full(
            3_000_000_000,
            300_000_000,
            3_750_000_000,
            15_000_000_000,
            20_000_000_000,
        );
        // 12×3 + 1000×0.30 + 150×3.75 + 150×15 + 50×20 = 36+300+562.5+2250+1000 = 4148.5 µ
        assert_eq!(price.cost(&usage), 4_148_500);
        // unset: cache writes at input, reasoning at output
        let defaulted = Price {
            cache_write: None,
            reasoning: None,
            ..price
        };
        // 12×3 + 1000×0.30 + 150×3 + 200×15 = 36+300+450+3000 = 3786 µ
        assert_eq!(defaulted.cost(&usage), 3_786_000);
    }

    #[test]
    fn rounding_happens_once_half_up() {
        let price = full(1, 0, 0, 0, 0); // 1 nano per million tokens
        let usage = |n| Usage {
            prompt_tokens: n,
            ..Usage::default()
        };
        assert_eq!(price.cost(&usage(499_999)), 0);
        assert_eq!(price.cost(&usage(500_000)), 1);
        assert_eq!(price.cost(&usage(1_500_000)), 2);
    }

    /// Found by the `usage_stream` fuzz target: at the dearest amount an upstream reporting
    /// u64::MAX prompt and completion tokens overflowed the u128 sum, which the wasm build (no
    /// overflow checks) wraps into a tiny cost.
    #[test]
    fn cost_saturates_at_the_dearest_price() {
        let huge = Usage {
            prompt_tokens: u64::MAX,
            completion_tokens: u64::MAX,
            ..Usage::default()
        };
        let dearest = u128::from(u64::MAX);
        assert_eq!(
            full(dearest, dearest, dearest, dearest, dearest).cost(&huge),
            u64::MAX
        );
        let beyond = NanoPerMillion::MAX;
        assert_eq!(
            full(beyond, beyond, beyond, beyond, beyond).cost(&huge),
            u64::MAX
        );
    }

    #[test]
    fn amounts_above_the_cap_cost_what_the_cap_costs() {
        let usage = Usage {
            prompt_tokens: 3,
            completion_tokens: 2,
            ..Usage::default()
        };
        let cap = u128::from(u64::MAX);
        let at_cap = micro_price("USD", 0, 0, None);
        let at_cap = Price {
            input: cap,
            output: cap,
            ..at_cap
        };
        let dearer = micro_price("USD", u64::MAX, u64::MAX, None);
        assert!(dearer.input > cap);
        assert_eq!(dearer.cost(&usage), at_cap.cost(&usage));
    }

    /// Native only: proptest is not built for the wasm32 test run.
    #[cfg(not(target_arch = "wasm32"))]
    mod properties {
        use super::*;
        use proptest::prelude::*;

        proptest! {
            #[test]
            fn cost_is_the_exact_sum_rounded_once(
                prompt in 0u64..1 << 40, cached in 0u64..1 << 40, completion in 0u64..1 << 40,
                input in 0u128..1 << 40, cached_price in 0u128..1 << 40, output in 0u128..1 << 40,
            ) {
                let cached = cached.min(prompt);
                let price = Price {
                    currency: "USD".into(),
                    input,
                    output,
                    cached_input: Some(cached_price),
                    cache_write: None,
                    reasoning: None,
                };
                let usage = Usage {
                    prompt_tokens: prompt,
                    completion_tokens: completion,
                    cached_prompt_tokens: cached,
                    ..Usage::default()
                };
                let exact = u128::from(prompt - cached) * input
                    + u128::from(cached) * cached_price
                    + u128::from(completion) * output;
                let cost = u128::from(price.cost(&usage));
                // |cost - exact/10^6| <= 1/2, and saturates instead of wrapping
                if cost < u128::from(u64::MAX) {
                    prop_assert!(cost * 1_000_000 + 500_000 >= exact);
                    prop_assert!(cost * 1_000_000 <= exact + 500_000);
                }
            }

            #[test]
            fn the_router_form_round_trips(
                input in any::<u64>(), output in any::<u64>(), cached in any::<Option<u64>>(),
            ) {
                let wire = MicroPrice { currency: "USD".into(), input, output, cached_input: cached };
                prop_assert_eq!(MicroPrice::from(&Price::from(wire.clone())), wire);
            }
        }
    }
}
