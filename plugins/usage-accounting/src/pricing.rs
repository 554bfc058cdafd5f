//! Prices and cost in integer units: no float ever touches money.
//!
//! A price is written as a decimal per **million tokens** in the configured currency
//! (`"0.30"`, or the JSON number `0.30`), with at most 9 decimals, and held as **nano-units
//! per million tokens** (`0.30` → `300_000_000`). A cost is
//!
//! ```text
//! cost_nano = round_half_up( Σ tokens_i × price_i_nano_per_million / 1 000 000 )
//! ```
//!
//! with the sum in `u128` and one rounding at the end, so a request's cost is exact to the
//! nano-unit whenever the prices have at most 3 decimals (the usual case: 1 000 prompt tokens
//! of which 600 cached plus 100 output at 0.30 / 0.006 / 1.20 cost exactly 243 600 nano-units,
//! that is 243.6 micro-units).
//!
//! Which tokens pay which price: uncached input at `input`; cache reads at `cached_input`
//! (default: `input`); cache writes at `cache_write` (default: `input`); output other than
//! reasoning at `output`; reasoning at `reasoning` (default: `output`). See
//! [`llm_gateway_shared::usage::Usage`] for what each count includes.

use llm_gateway_shared::json::push_u64;
use llm_gateway_shared::usage::Usage;
use serde_json::Value;

/// Nano-units (10⁻⁹) of a currency per million tokens.
pub type NanoPerMillion = u64;

/// One deployment's price.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Price {
    /// Uncached input tokens.
    pub input: NanoPerMillion,
    /// Input tokens read from the prompt cache.
    pub cached_input: NanoPerMillion,
    /// Input tokens written to the prompt cache.
    pub cache_write: NanoPerMillion,
    /// Output tokens other than reasoning.
    pub output: NanoPerMillion,
    /// Reasoning tokens.
    pub reasoning: NanoPerMillion,
    /// Version of the price list this price comes from; every record names it.
    pub version: String,
    /// ISO 4217 code (or any short name) of the currency.
    pub currency: String,
}

/// A cost: nano-units of `currency`, priced with `version`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cost {
    /// Nano-units of the currency.
    pub nano: u64,
    /// The price list version used.
    pub version: String,
    /// The currency.
    pub currency: String,
}

impl Price {
    /// The cost of `usage` at this price.
    pub fn cost(&self, usage: &Usage) -> Cost {
        let reasoning = usage.reasoning_tokens.min(usage.completion_tokens);
        let parts: [(u64, NanoPerMillion); 5] = [
            (usage.uncached_prompt_tokens(), self.input),
            (
                usage.cached_prompt_tokens.min(usage.prompt_tokens),
                self.cached_input,
            ),
            (usage.cache_write_tokens, self.cache_write),
            (usage.completion_tokens - reasoning, self.output),
            (reasoning, self.reasoning),
        ];
        // Each product fits a u128 (both factors are u64); their sum may not, at prices near
        // the largest the config accepts and counts near u64::MAX: saturate, never wrap.
        let total = parts.iter().fold(0u128, |sum, (tokens, price)| {
            sum.saturating_add(u128::from(*tokens) * u128::from(*price))
        });
        let nano = total.saturating_add(500_000) / 1_000_000;
        Cost {
            nano: u64::try_from(nano).unwrap_or(u64::MAX),
            version: self.version.clone(),
            currency: self.currency.clone(),
        }
    }
}

/// Parses a price per million tokens into nano-units: a decimal string or JSON number, at most
/// 9 decimals, not negative, no exponent.
pub fn parse_price(value: &Value) -> Result<NanoPerMillion, String> {
    let text = match value {
        Value::String(text) => text.trim().to_string(),
        // serde_json prints the shortest text that reads back as the same f64: for a price
        // written with up to 15 significant digits that is the text the operator wrote.
        Value::Number(number) => number.to_string(),
        _ => return Err("must be a decimal number or string such as \"0.30\"".into()),
    };
    parse_decimal_nano(&text)
}

/// `"1.25"` → `1_250_000_000`.
pub fn parse_decimal_nano(text: &str) -> Result<u64, String> {
    const BAD: &str =
        "must be a plain decimal such as \"0.30\" (at most 9 decimals, no sign or exponent)";
    let (whole, fraction) = match text.split_once('.') {
        Some((whole, fraction)) => (whole, fraction),
        None => (text, ""),
    };
    let digits = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
    if whole.is_empty() || !digits(whole) || !digits(fraction) || fraction.len() > 9 {
        return Err(BAD.into());
    }
    if text.ends_with('.') {
        return Err(BAD.into());
    }
    let whole: u64 = whole.parse().map_err(|_| BAD.to_string())?;
    let mut scaled_fraction: u64 = 0;
    for (i, byte) in fraction.bytes().enumerate() {
        let digit = u64::from(byte - b'0');
        scaled_fraction += digit * 10u64.pow(8 - i as u32);
    }
    whole
        .checked_mul(1_000_000_000)
        .and_then(|n| n.checked_add(scaled_fraction))
        .ok_or_else(|| "too large".to_string())
}

/// Formats nano-units as a decimal (`243600` → `"0.0002436"`), for headers and reports.
pub fn format_nano(nano: u64) -> String {
    let whole = nano / 1_000_000_000;
    let fraction = nano % 1_000_000_000;
    let mut out = String::with_capacity(30);
    push_u64(&mut out, whole);
    if fraction == 0 {
        return out;
    }
    // nine digits with the leading zeros, then without the trailing ones
    let mut digits = [b'0'; 9];
    let mut rest = fraction;
    for slot in digits.iter_mut().rev() {
        // `rest % 10` is below 10: the cast cannot truncate
        *slot = b'0' + (rest % 10) as u8;
        rest /= 10;
    }
    let kept = digits
        .iter()
        .rposition(|d| *d != b'0')
        .map_or(0, |last| last + 1);
    out.push('.');
    for digit in digits.iter().take(kept) {
        out.push(char::from(*digit));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn price(input: &str, cached: &str, output: &str) -> Price {
        let p = |s: &str| parse_decimal_nano(s).unwrap();
        Price {
            input: p(input),
            cached_input: p(cached),
            cache_write: p(input),
            output: p(output),
            reasoning: p(output),
            version: "v1".into(),
            currency: "USD".into(),
        }
    }

    #[test]
    fn the_known_case_is_exact() {
        let usage = Usage {
            prompt_tokens: 1_000,
            completion_tokens: 100,
            cached_prompt_tokens: 600,
            ..Usage::default()
        };
        let cost = price("0.30", "0.006", "1.20").cost(&usage);
        // 400 × 0.30 + 600 × 0.006 + 100 × 1.20 per million = 243.6 micro-units
        assert_eq!(cost.nano, 243_600);
        assert_eq!(format_nano(cost.nano), "0.0002436");
        assert_eq!(cost.version, "v1");
    }

    #[test]
    fn cache_writes_and_reasoning_have_their_prices() {
        let mut p = price("3", "0.30", "15");
        p.cache_write = parse_decimal_nano("3.75").unwrap();
        p.reasoning = parse_decimal_nano("20").unwrap();
        let usage = Usage {
            prompt_tokens: 1_162,
            completion_tokens: 200,
            cached_prompt_tokens: 1_000,
            cache_write_tokens: 150,
            reasoning_tokens: 50,
        };
        // 12×3 + 1000×0.30 + 150×3.75 + 150×15 + 50×20 = 36+300+562.5+2250+1000 = 4148.5 µ
        assert_eq!(p.cost(&usage).nano, 4_148_500);
    }

    #[test]
    fn rounding_happens_once_half_up() {
        let p = price("0.000000001", "0", "0"); // 1 nano per million tokens
        let usage = |n| Usage {
            prompt_tokens: n,
            ..Usage::default()
        };
        assert_eq!(p.cost(&usage(499_999)).nano, 0);
        assert_eq!(p.cost(&usage(500_000)).nano, 1);
        assert_eq!(p.cost(&usage(1_500_000)).nano, 2);
        let huge = Usage {
            prompt_tokens: u64::MAX,
            completion_tokens: u64::MAX,
            ..Usage::default()
        };
        assert_eq!(price("1000", "1000", "1000").cost(&huge).nano, u64::MAX);
    }

    /// Found by the `usage_stream` fuzz target: at the dearest price the config accepts
    /// (`18446744073.709551615`, u64::MAX nano per million) an upstream reporting u64::MAX
    /// prompt and completion tokens overflowed the u128 sum, which the wasm build (no
    /// overflow checks) wraps into a tiny cost.
    #[test]
    fn cost_saturates_at_the_dearest_price() {
        let dearest = parse_decimal_nano("18446744073.709551615").unwrap();
        assert_eq!(dearest, u64::MAX);
        let p = Price {
            input: dearest,
            cached_input: dearest,
            cache_write: dearest,
            output: dearest,
            reasoning: dearest,
            version: "v1".into(),
            currency: "USD".into(),
        };
        let huge = Usage {
            prompt_tokens: u64::MAX,
            completion_tokens: u64::MAX,
            ..Usage::default()
        };
        assert_eq!(p.cost(&huge).nano, u64::MAX);
    }

    #[test]
    fn prices_parse_exactly() {
        assert_eq!(parse_price(&json!("0.30")), Ok(300_000_000));
        assert_eq!(parse_price(&json!(0.3)), Ok(300_000_000));
        assert_eq!(parse_price(&json!(0.006)), Ok(6_000_000));
        assert_eq!(parse_price(&json!(15)), Ok(15_000_000_000));
        assert_eq!(parse_price(&json!("0.000000001")), Ok(1));
        for bad in [
            json!("-1"),
            json!("1e-7"),
            json!(1e-7),
            json!("0.0000000001"),
            json!("."),
            json!("1."),
            json!(""),
            json!(true),
            json!("99999999999999999999"),
        ] {
            assert!(parse_price(&bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn format_nano_prints_decimals() {
        assert_eq!(format_nano(0), "0");
        assert_eq!(format_nano(1), "0.000000001");
        assert_eq!(format_nano(1_500_000_000), "1.5");
    }

    proptest::proptest! {
        #[test]
        fn format_nano_writes_the_shortest_decimal(nano in proptest::prelude::any::<u64>()) {
            let (whole, fraction) = (nano / 1_000_000_000, nano % 1_000_000_000);
            let expected = if fraction == 0 {
                whole.to_string()
            } else {
                format!("{whole}.{}", format!("{fraction:09}").trim_end_matches('0'))
            };
            proptest::prop_assert_eq!(format_nano(nano), expected);
        }

        #[test]
        fn cost_is_the_exact_sum_rounded_once(
            prompt in 0u64..1 << 40, cached in 0u64..1 << 40, completion in 0u64..1 << 40,
            input in 0u64..1 << 40, cached_price in 0u64..1 << 40, output in 0u64..1 << 40,
        ) {
            let cached = cached.min(prompt);
            let price = Price { input, cached_input: cached_price, cache_write: input, output, reasoning: output, version: "v".into(), currency: "USD".into() };
            let usage = Usage { prompt_tokens: prompt, completion_tokens: completion, cached_prompt_tokens: cached, ..Usage::default() };
            let exact = u128::from(prompt - cached) * u128::from(input)
                + u128::from(cached) * u128::from(cached_price)
                + u128::from(completion) * u128::from(output);
            let cost = u128::from(price.cost(&usage).nano);
            // |cost - exact/10^6| <= 1/2, and saturates instead of wrapping
            if cost < u128::from(u64::MAX) {
                proptest::prop_assert!(cost * 1_000_000 + 500_000 >= exact);
                proptest::prop_assert!(cost * 1_000_000 <= exact + 500_000);
            }
        }
    }
}
