//! This plugin's prices: decimals per million tokens, held as [`Price`]s, and what a request
//! costs at them.
//!
//! A price is written as a decimal per **million tokens** in the configured currency
//! (`"0.30"`, or the JSON number `0.30`), with at most 9 decimals, and held as **nano-units
//! per million tokens** (`0.30` → `300_000_000`): [`llm_gateway_shared::price::Price`], the one
//! price type of every plugin, which also says which tokens pay which amount and computes the
//! cost (exact to the nano-unit, rounded once). The router publishes its prices in its own
//! form (integer micro-units), which `shared::route_info` reads into the same type.
//!
//! What this module adds: the version of the price list a price comes from
//! ([`VersionedPrice`]; every record names it), the [`Cost`] a record and the cost headers
//! carry, and the decimal text of prices and costs.

use llm_gateway_shared::json::push_u64;
use llm_gateway_shared::price::{NanoPerMillion, Price};
use llm_gateway_shared::usage::Usage;
use serde_json::Value;

/// A price of this plugin's table and the version of the price list it comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VersionedPrice {
    /// The amounts and the currency.
    pub price: Price,
    /// Version of the price list; every record names it.
    pub version: String,
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

/// The cost of `usage` at `price`, from the price list `version` ([`Price::cost`]).
pub fn cost(price: &Price, version: &str, usage: &Usage) -> Cost {
    Cost {
        nano: price.cost(usage),
        version: version.to_string(),
        currency: price.currency.clone(),
    }
}

/// Parses a price per million tokens into nano-units: a decimal string or JSON number, at most
/// 9 decimals, not negative, no exponent, at most `u64::MAX` nano-units.
pub fn parse_price(value: &Value) -> Result<NanoPerMillion, String> {
    let text = match value {
        Value::String(text) => text.trim().to_string(),
        // serde_json prints the shortest text that reads back as the same f64: for a price
        // written with up to 15 significant digits that is the text the operator wrote.
        Value::Number(number) => number.to_string(),
        _ => return Err("must be a decimal number or string such as \"0.30\"".into()),
    };
    parse_decimal_nano(&text).map(NanoPerMillion::from)
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

    #[test]
    fn a_cost_names_its_version_and_currency() {
        let price = Price {
            currency: "EUR".into(),
            input: parse_price(&json!("0.30")).unwrap(),
            output: parse_price(&json!("1.20")).unwrap(),
            cached_input: Some(parse_price(&json!("0.006")).unwrap()),
            cache_write: None,
            reasoning: None,
        };
        let usage = Usage {
            prompt_tokens: 1_000,
            completion_tokens: 100,
            cached_prompt_tokens: 600,
            ..Usage::default()
        };
        let cost = cost(&price, "v1", &usage);
        // 400 × 0.30 + 600 × 0.006 + 100 × 1.20 per million = 243.6 micro-units
        assert_eq!(
            cost,
            Cost {
                nano: 243_600,
                version: "v1".into(),
                currency: "EUR".into()
            }
        );
        assert_eq!(format_nano(cost.nano), "0.0002436");
    }

    #[test]
    fn prices_parse_exactly() {
        assert_eq!(parse_price(&json!("0.30")), Ok(300_000_000));
        assert_eq!(parse_price(&json!(0.3)), Ok(300_000_000));
        assert_eq!(parse_price(&json!(0.006)), Ok(6_000_000));
        assert_eq!(parse_price(&json!(15)), Ok(15_000_000_000));
        assert_eq!(parse_price(&json!("0.000000001")), Ok(1));
        // the dearest price: u64::MAX nano-units per million tokens
        assert_eq!(
            parse_price(&json!("18446744073.709551615")),
            Ok(u128::from(u64::MAX))
        );
        for bad in [
            json!("18446744073.709551616"),
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
    }
}
