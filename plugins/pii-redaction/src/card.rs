//! Payment cards: a run of 12 to 19 digits (in groups split by one kind of separator, a
//! space or a dash) whose prefix is a card brand's issuer range, whose length is one that
//! brand issues, and which passes the Luhn check.
//!
//! The ranges are the brands' published IIN ranges (ISO/IEC 7812 issuer identification
//! numbers as each network documents them): a Luhn-valid number outside every range, or of a
//! length its brand does not issue, is not taken for a card, which keeps order numbers and
//! other long Luhn-valid numbers out. UATP (airline, `1…`, 15 digits) is left out: it would
//! take many 15-digit numbers that are not cards.

use crate::context::{context_before, CARD_WORDS, REFERENCE_WORDS};
use crate::scan::{at, before, digits_from, is_digit, is_word, Step};

/// Lengths as a bit set: bit `n` for `n` digits.
const fn lengths(from: u32, to: u32) -> u32 {
    let mut set = 0;
    let mut n = from;
    while n <= to {
        set |= 1 << n;
        n += 1;
    }
    set
}

const L12_19: u32 = lengths(12, 19);
const L14_19: u32 = lengths(14, 19);
const L16_19: u32 = lengths(16, 19);
const L15: u32 = 1 << 15;
const L16: u32 = 1 << 16;
const VISA: u32 = (1 << 13) | (1 << 16) | (1 << 19);

/// (lowest prefix, highest prefix, digits in the prefix, lengths issued). A number matches
/// a row when its first `digits` digits, as a number, lie in `lowest..=highest`.
type Row = (u32, u32, u32, u32);

const RANGES: [Row; 18] = [
    (4, 4, 1, VISA),         // Visa
    (51, 55, 2, L16),        // Mastercard
    (2221, 2720, 4, L16),    // Mastercard 2-series
    (34, 34, 2, L15),        // American Express
    (37, 37, 2, L15),        // American Express
    (300, 305, 3, L14_19),   // Diners Club International
    (3095, 3095, 4, L14_19), // Diners Club International
    (36, 36, 2, L14_19),     // Diners Club International
    (38, 39, 2, L14_19),     // Diners Club International
    (35, 35, 2, L16_19),     // JCB 3528–3589; the rest of 35 is read as JCB too
    (1800, 1800, 4, L15),    // JCB 15-digit
    (2131, 2131, 4, L15),    // JCB 15-digit
    (2200, 2204, 4, L16_19), // Mir
    (6011, 6011, 4, L16_19), // Discover
    (60, 69, 2, L16_19),     // Discover 644–649/65, UnionPay 62, RuPay 60/65, Maestro
    (50, 59, 2, L16_19),     // Maestro 50/56–59, Verve 506099–506198, RuPay 508
    (81, 82, 2, L16_19),     // UnionPay 81, RuPay 81/82
    (9792, 9792, 4, L16),    // Troy
];

/// Maestro's short lengths, 12 to 15 digits: taken only when the number is grouped or a
/// word for a card stands before it, since many order and tracking numbers of those lengths
/// start with 5 or 6 and one in ten passes the Luhn check.
const MAESTRO_SHORT: [Row; 3] = [
    (50, 50, 2, L12_19),
    (56, 69, 2, L12_19),
    (604, 604, 4, L12_19), // Maestro `0604…` (older IIN tables)
];

fn fits(rows: &[Row], digits: &[u8]) -> bool {
    let n = digits.len() as u32;
    rows.iter().any(|&(lo, hi, width, lens)| {
        let Some(prefix) = digits.get(..width as usize) else {
            return false;
        };
        let value = prefix
            .iter()
            .fold(0u32, |a, &c| a * 10 + u32::from(c.wrapping_sub(b'0')));
        (lo..=hi).contains(&value) && lens & (1 << n.min(31)) != 0
    })
}

/// Whether `digits` (ASCII digits) start with a brand's range and have one of its lengths.
pub fn brand_fits(digits: &[u8]) -> bool {
    fits(&RANGES, digits) || fits(&MAESTRO_SHORT, digits)
}

/// True if the digits pass the Luhn check.
pub fn luhn(digits: &[u8]) -> bool {
    let mut sum = 0u32;
    for (k, &c) in digits.iter().rev().enumerate() {
        let mut d = u32::from(c.wrapping_sub(b'0'));
        if d > 9 {
            return false;
        }
        if k % 2 == 1 {
            d *= 2;
            if d > 9 {
                d -= 9;
            }
        }
        sum += d;
    }
    sum.is_multiple_of(10)
}

/// Bytes a card can start with (the first digits of the ranges above).
pub(crate) fn first(c: u8) -> bool {
    matches!(c, b'0'..=b'6' | b'8' | b'9')
}

pub(crate) fn card(b: &[u8], i: usize) -> Step {
    if !first(at(b, i)) || is_word(before(b, i)) {
        return Step::No;
    }
    let mut digits = [0u8; 19];
    let mut n = 0;
    let mut p = i;
    let mut sep = 0u8;
    let mut end = i;
    loop {
        let c = at(b, p);
        if is_digit(c) {
            if n == digits.len() {
                // too long for a card: skip the whole run
                return Step::Skip(digits_from(b, p, usize::MAX));
            }
            if let Some(slot) = digits.get_mut(n) {
                *slot = c;
            }
            n += 1;
            p += 1;
            end = p;
        } else if matches!(c, b' ' | b'-') && (sep == 0 || sep == c) && is_digit(at(b, p + 1)) {
            sep = c;
            p += 1;
        } else {
            break;
        }
    }
    let digits = digits.get(..n).unwrap_or_default();
    if !(12..=19).contains(&n) || is_word(at(b, end)) {
        return Step::Skip(end);
    }
    // a bare number after "order" is an order number, unless a word for a card is nearer
    let card_word = || context_before(b, i, &CARD_WORDS, 32);
    if sep == 0 && context_before(b, i, &REFERENCE_WORDS, 24) && !card_word() {
        return Step::Skip(end);
    }
    // a short Maestro length is cued by grouping or a word for a card; grouping alone is no
    // cue after "Tracking", "order #"… ("Tracking 6173 6599 6652")
    let cued = || card_word() || (sep != 0 && !context_before(b, i, &REFERENCE_WORDS, 24));
    let brand = fits(&RANGES, digits) || (fits(&MAESTRO_SHORT, digits) && cued());
    if brand && luhn(digits) {
        Step::Match(end)
    } else {
        Step::Skip(end)
    }
}

#[cfg(test)]
mod tests {
    use crate::detect::Builtin;

    fn hits(text: &str) -> Vec<&str> {
        crate::detect::tests::hits(Builtin::Card, text)
    }

    #[test]
    fn every_brand_and_length() {
        // Luhn-valid numbers made for each brand's range and length
        for card in [
            "4111111111111111",    // Visa 16
            "4222222222222",       // Visa 13
            "4111111111111111110", // Visa 19
            "5555555555554444",    // Mastercard
            "2223000048400011",    // Mastercard 2-series
            "378282246310005",     // Amex
            "36227206271667",      // Diners 14
            "30569309025904",      // Diners 300-305
            "3530111333300000",    // JCB 16
            "180000000000002",     // JCB 15 (1800)
            "213100000000001",     // JCB 15 (2131)
            "6011111111111117",    // Discover
            "6200000000000005",    // UnionPay 16
            "6212345678901265",    // UnionPay 16
            "6212345678900000003", // UnionPay 19
            "5018 0000 0009",      // Maestro 12 (grouped)
            "6759649826438453",    // Maestro 16
            "0604-0000-0000",      // Maestro 0604, 12 (grouped)
            "2200000000000004",    // Mir
            "8171999927660000",    // UnionPay 81
            "9792000000000003",    // Troy
        ] {
            let digits: Vec<u8> = card.bytes().filter(u8::is_ascii_digit).collect();
            assert!(super::luhn(&digits), "{card} is Luhn-valid");
            assert_eq!(hits(card), [card], "{card}");
        }
    }

    #[test]
    fn short_maestro_needs_grouping_or_a_word_for_a_card() {
        assert_eq!(hits("card 501800000009"), ["501800000009"]);
        assert_eq!(hits("Maestro: 569825979192."), ["569825979192"]);
        assert_eq!(hits("order 501800000009"), Vec::<&str>::new());
        assert_eq!(hits("tracking 4929650670629"), Vec::<&str>::new());
        assert_eq!(
            hits("paid the order by card 4929650670629"),
            ["4929650670629"]
        );
        assert_eq!(hits("6759649826438453"), ["6759649826438453"]);
        // grouped after a reference word: a tracking number, unless a card is named
        assert_eq!(
            hits("Tracking 6173 6599 6652 is in transit."),
            Vec::<&str>::new()
        );
        assert_eq!(hits("order # 5018-0000-0009"), Vec::<&str>::new());
        assert_eq!(
            hits("order paid by card 5018 0000 0009"),
            ["5018 0000 0009"]
        );
        // a full-length card stays a card after a reference word
        assert_eq!(hits("account 4111 1111 1111 1111"), ["4111 1111 1111 1111"]);
    }

    #[test]
    fn groups_by_space_or_dash() {
        assert_eq!(
            hits("visa 4111 1111 1111 1111, amex 3782-822463-10005; maestro 5018 0000 0009."),
            ["4111 1111 1111 1111", "3782-822463-10005", "5018 0000 0009"]
        );
    }

    #[test]
    fn wrong_brand_length_or_check_is_not_a_card() {
        for no in [
            "4111111111111112",     // Luhn fails
            "411111111111",         // Visa has no 12-digit numbers
            "41111111111111",       // nor 14
            "37828224631000",       // Amex is 15 digits
            "5555555555554",        // Mastercard 13 (Luhn-valid)
            "711111111111113",      // no brand starts with 7
            "100000000000009",      // UATP is left out
            "4111-1111 1111 1111",  // mixed separators
            "41111111111111111111", // 20 digits
            "9111111111111111",
            "a4111111111111111",
            "4111111111111111b",
        ] {
            assert_eq!(hits(no), Vec::<&str>::new(), "{no}");
        }
    }
}
