//! National identity numbers, each with the structure and check its issuer publishes:
//!
//! * US Social Security number (SSA): `AAA-GG-SSSS` or `AAA GG SSSS`; area not 000, 666 or
//!   900–999, group not 00, serial not 0000. Nine bare digits only after "SSN" or "social
//!   security" within the 32 bytes before (a bare 9-digit run is too often something else).
//! * UK National Insurance number (HMRC NIM39110): two prefix letters (first not D F I Q U V,
//!   second not D F I O Q U V, not BG GB KN NK NT TN ZZ), six digits, suffix A–D; compact or
//!   spaced (`AB 12 34 56 C`, `AB 123456 C`).
//! * French NIR (INSEE): sex, year, month, département (`2A`/`2B` for Corsica), commune,
//!   order, then the key `97 - (number mod 97)` with 2A read as 19 and 2B as 18; compact or
//!   spaced (`1 85 05 78 006 084 91`).
//! * German tax id (Steuerliche Identifikationsnummer, § 139b AO): 11 digits, no leading 0;
//!   in the first ten one digit appears twice or three times (three not in a row), and every
//!   other at most once; the last digit is the ISO 7064 MOD 11,10 check digit. Compact or
//!   `12 345 678 901`.
//! * Japanese My Number (個人番号): 12 digits, the last a check digit (weights 2–7, 2–6 from
//!   the right, mod 11); `1234 5678 9012` (spaces or dashes), or 12 bare digits after "My
//!   Number", "マイナンバー" or "個人番号" within the 32 bytes before or the 48 after (one
//!   random 12-digit number in ten passes the check) and whose first eight digits are not a
//!   date `YYYYMMDD`. The grouped form is not taken after a word for a reference ("Tracking
//!   2449 7616 7909", "order #", "注文") unless a word for a My Number is there too.

use crate::context::{
    context_after, context_before, Words, CARD_WORDS, PHONE_WORDS, REFERENCE_WORDS, TAX_ID_WORDS,
};
use crate::scan::{at, before, digits_from, is_digit, is_word, Step};

fn starts_clean(b: &[u8], i: usize) -> bool {
    let prev = before(b, i);
    !(is_word(prev) || matches!(prev, b'.' | b'-' | b'/' | b'+' | b'#'))
}

fn ends_clean(b: &[u8], end: usize) -> bool {
    let c = at(b, end);
    !(is_word(c) || (matches!(c, b'.' | b',' | b'-' | b'/' | b':') && is_digit(at(b, end + 1))))
}

/// The value of the ASCII digits `b[from..to]` (0 if absent).
fn value(b: &[u8], from: usize, to: usize) -> u64 {
    b.get(from..to)
        .unwrap_or_default()
        .iter()
        .fold(0u64, |a, &c| a * 10 + u64::from(c.wrapping_sub(b'0')))
}

/// Exactly `count` digits at `p` (not followed by another digit): their end.
fn exact_digits(b: &[u8], p: usize, count: usize) -> Option<usize> {
    let e = digits_from(b, p, count + 1);
    (e - p == count).then_some(e)
}

// ---------------------------------------------------------------------------------------
// US SSN

pub(crate) fn ssn_us(b: &[u8], i: usize) -> Step {
    if !is_digit(at(b, i)) || !starts_clean(b, i) {
        return Step::No;
    }
    let run = digits_from(b, i, 10);
    let end = match run - i {
        3 => {
            let sep = at(b, run);
            if !matches!(sep, b'-' | b' ') {
                return Step::No;
            }
            let Some(g) = exact_digits(b, run + 1, 2) else {
                return Step::No;
            };
            if at(b, g) != sep {
                return Step::No;
            }
            let Some(e) = exact_digits(b, g + 1, 4) else {
                return Step::No;
            };
            e
        }
        9 if context_before(b, i, &SSN_WORDS, 32) => run,
        _ => return Step::Skip(digits_from(b, i, usize::MAX)),
    };
    if !ends_clean(b, end) {
        return Step::No;
    }
    let mut digits = [0u8; 9];
    let from_text = b.get(i..end).unwrap_or_default().iter();
    for (slot, &c) in digits
        .iter_mut()
        .zip(from_text.filter(|c| c.is_ascii_digit()))
    {
        *slot = c;
    }
    if valid_ssn(&digits) {
        Step::Match(end)
    } else {
        Step::No
    }
}

/// Whether nine digits are a Social Security number the SSA can issue.
pub fn valid_ssn(d: &[u8]) -> bool {
    if d.len() != 9 {
        return false;
    }
    let (area, group, serial) = (value(d, 0, 3), value(d, 3, 5), value(d, 5, 9));
    area != 0 && area != 666 && area < 900 && group != 0 && serial != 0
}

// ---------------------------------------------------------------------------------------
// UK NINO

pub(crate) fn nino_first(c: u8) -> bool {
    c.is_ascii_uppercase() && !matches!(c, b'D' | b'F' | b'I' | b'Q' | b'U' | b'V')
}

pub(crate) fn nino_uk(b: &[u8], i: usize) -> Step {
    let prev = before(b, i);
    if !nino_first(at(b, i)) || prev.is_ascii_alphanumeric() || prev == b'_' {
        return Step::No;
    }
    let second = at(b, i + 1);
    if !second.is_ascii_uppercase()
        || matches!(second, b'D' | b'F' | b'I' | b'O' | b'Q' | b'U' | b'V')
    {
        return Step::No;
    }
    if matches!(
        b.get(i..i + 2),
        Some(b"BG" | b"GB" | b"KN" | b"NK" | b"NT" | b"TN" | b"ZZ")
    ) {
        return Step::No;
    }
    let mut p = i + 2;
    if at(b, p) == b' ' {
        p += 1;
    }
    // three pairs of digits, spaced between all pairs or none
    let mut spaced = None;
    for pair in 0..3 {
        if pair > 0 {
            let gap = at(b, p) == b' ';
            if *spaced.get_or_insert(gap) != gap {
                return Step::No;
            }
            if gap {
                p += 1;
            }
        }
        if !(is_digit(at(b, p)) && is_digit(at(b, p + 1))) {
            return Step::No;
        }
        p += 2;
    }
    if at(b, p) == b' ' {
        p += 1;
    }
    if !matches!(at(b, p), b'A'..=b'D') {
        return Step::No;
    }
    p += 1;
    let next = at(b, p);
    if next.is_ascii_alphanumeric() || next == b'_' {
        return Step::No;
    }
    Step::Match(p)
}

// ---------------------------------------------------------------------------------------
// French NIR

pub(crate) fn nir_first(c: u8) -> bool {
    matches!(c, b'1' | b'2' | b'3' | b'4' | b'7' | b'8')
}

pub(crate) fn nir_fr(b: &[u8], i: usize) -> Step {
    if !nir_first(at(b, i)) || !starts_clean(b, i) {
        return Step::No;
    }
    // fields: sex 1, year 2, month 2, département 2, commune 3, order 3, key 2
    const FIELDS: [usize; 7] = [1, 2, 2, 2, 3, 3, 2];
    let mut nir = [0u8; 15];
    let mut n = 0;
    let mut p = i;
    for (k, &width) in FIELDS.iter().enumerate() {
        if k > 0 && at(b, p) == b' ' && at(b, p + 1).is_ascii_alphanumeric() {
            p += 1;
        }
        for j in 0..width {
            let c = at(b, p);
            let corsica =
                k == 3 && j == 1 && matches!(c, b'A' | b'B') && nir.get(n - 1) == Some(&b'2');
            if !(is_digit(c) || corsica) {
                return Step::No;
            }
            if let Some(slot) = nir.get_mut(n) {
                *slot = c;
            }
            n += 1;
            p += 1;
        }
    }
    if !ends_clean(b, p) {
        return Step::No;
    }
    if valid_nir(&nir) {
        Step::Match(p)
    } else {
        Step::No
    }
}

/// Whether 15 characters (`2A`/`2B` allowed at the département) are a NIR with a valid key.
pub fn valid_nir(nir: &[u8; 15]) -> bool {
    let month = value(nir, 3, 5);
    if !matches!(month, 1..=12 | 20..=42 | 50..=99) {
        return false;
    }
    let dept = nir.get(5..7).unwrap_or_default();
    let corsica = match dept {
        b"2A" => Some(19),
        b"2B" => Some(18),
        _ => None,
    };
    if corsica.is_none() && value(nir, 5, 7) == 0 {
        return false;
    }
    if value(nir, 7, 10) == 0 || value(nir, 10, 13) == 0 {
        return false;
    }
    let number = value(nir, 0, 5) * 100_000_000
        + corsica.unwrap_or_else(|| value(nir, 5, 7)) * 1_000_000
        + value(nir, 7, 13);
    let key = value(nir, 13, 15);
    (1..=97).contains(&key) && key == 97 - number % 97
}

// ---------------------------------------------------------------------------------------
// German tax id

pub(crate) fn tax_id_de(b: &[u8], i: usize) -> Step {
    if !matches!(at(b, i), b'1'..=b'9') || !starts_clean(b, i) {
        return Step::No;
    }
    let mut id = [0u8; 11];
    let run = digits_from(b, i, 12);
    let end = match run - i {
        11 => {
            id.copy_from_slice(b.get(i..run).unwrap_or(&[0; 11]));
            // "电话13564087944": a Chinese mobile after a word for a phone, unless a word for
            // a tax id is there too
            if matches!(at(b, i + 1), b'3'..=b'9')
                && at(b, i) == b'1'
                && context_before(b, i, &PHONE_WORDS, 32)
                && !context_before(b, i, &TAX_ID_WORDS, 32)
            {
                return Step::No;
            }
            run
        }
        2 => {
            // 12 345 678 901
            let mut p = i;
            let mut n = 0;
            for (k, width) in [2usize, 3, 3, 3].into_iter().enumerate() {
                if k > 0 {
                    if at(b, p) != b' ' {
                        return Step::No;
                    }
                    p += 1;
                }
                let Some(e) = exact_digits(b, p, width) else {
                    return Step::No;
                };
                for &c in b.get(p..e).unwrap_or_default() {
                    if let Some(slot) = id.get_mut(n) {
                        *slot = c;
                    }
                    n += 1;
                }
                p = e;
            }
            p
        }
        _ => return Step::Skip(digits_from(b, i, usize::MAX)),
    };
    if ends_clean(b, end) && valid_tax_id_de(&id) {
        Step::Match(end)
    } else {
        Step::No
    }
}

/// Whether 11 digits are a German tax id: repetition rule and ISO 7064 MOD 11,10 check.
pub fn valid_tax_id_de(id: &[u8; 11]) -> bool {
    if id.first() == Some(&b'0') || !id.iter().all(u8::is_ascii_digit) {
        return false;
    }
    let body = id.get(..10).unwrap_or_default();
    let mut counts = [0u8; 10];
    for &c in body {
        if let Some(count) = counts.get_mut(usize::from(c - b'0')) {
            *count += 1;
        }
    }
    // exactly one digit repeats, twice or three times (three not in a row)
    let mut repeated = counts.iter().enumerate().filter(|(_, &count)| count > 1);
    let (Some((digit, &count)), None) = (repeated.next(), repeated.next()) else {
        return false;
    };
    if count > 3 {
        return false;
    }
    let d = b'0' + digit as u8;
    if count == 3 && body.windows(3).any(|w| w == [d, d, d]) {
        return false;
    }
    let mut product = 10u32;
    for &c in body {
        let mut sum = (u32::from(c - b'0') + product) % 10;
        if sum == 0 {
            sum = 10;
        }
        product = (sum * 2) % 11;
    }
    let check = (11 - product) % 10;
    id.get(10).map(|&c| u32::from(c - b'0')) == Some(check)
}

// ---------------------------------------------------------------------------------------
// Japanese My Number

pub(crate) fn my_number_jp(b: &[u8], i: usize) -> Step {
    if !is_digit(at(b, i)) || !starts_clean(b, i) {
        return Step::No;
    }
    let mut number = [0u8; 12];
    let run = digits_from(b, i, 13);
    let end = match run - i {
        12 => {
            number.copy_from_slice(b.get(i..run).unwrap_or(&[0; 12]));
            if looks_like_date(&number) || !named_my_number(b, i, run) {
                return Step::No;
            }
            run
        }
        4 => {
            let sep = at(b, run);
            if !matches!(sep, b' ' | b'-') {
                return Step::No;
            }
            let mut p = i;
            for k in 0..3 {
                if k > 0 {
                    if at(b, p) != sep {
                        return Step::No;
                    }
                    p += 1;
                }
                let Some(e) = exact_digits(b, p, 4) else {
                    return Step::No;
                };
                if let (Some(slot), Some(src)) = (number.get_mut(k * 4..k * 4 + 4), b.get(p..e)) {
                    slot.copy_from_slice(src);
                }
                p = e;
            }
            // "Tracking 2449 7616 7909": a reference, "numéro de carte : 6762 7074 5729": a
            // card, unless the text names a My Number
            if (context_before(b, i, &REFERENCE_WORDS, 24) || context_before(b, i, &CARD_WORDS, 32))
                && !named_my_number(b, i, p)
            {
                return Step::No;
            }
            p
        }
        _ => return Step::Skip(digits_from(b, i, usize::MAX)),
    };
    if ends_clean(b, end) && valid_my_number(&number) {
        Step::Match(end)
    } else {
        Step::No
    }
}

/// Words for a US Social Security number before a bare 9-digit run (lower case).
const SSN_WORDS: Words = Words::new(&[b"ssn", b"social security"]);

/// Words for a My Number before a bare 12-digit run (lower case; ASCII ignoring case).
const MY_NUMBER_WORDS: Words = Words::new(&[
    b"my number",
    b"mynumber",
    b"individual number",
    "マイナンバー".as_bytes(),
    "個人番号".as_bytes(),
]);

/// Whether the text names a My Number around the number at `i..end`: a word for it in the
/// 32 bytes before, or in the 48 after ("…は昨日お客様から伺ったマイナンバーです").
fn named_my_number(b: &[u8], i: usize, end: usize) -> bool {
    context_before(b, i, &MY_NUMBER_WORDS, 32) || context_after(b, end, &MY_NUMBER_WORDS, 48)
}

/// `YYYYMMDD` with a year 1900–2099: the head of a timestamp.
fn looks_like_date(d: &[u8]) -> bool {
    let (year, month, day) = (value(d, 0, 4), value(d, 4, 6), value(d, 6, 8));
    (1900..=2099).contains(&year) && (1..=12).contains(&month) && (1..=31).contains(&day)
}

/// Whether 12 digits are a My Number: the last is the check digit of the first eleven.
pub fn valid_my_number(d: &[u8; 12]) -> bool {
    if !d.iter().all(u8::is_ascii_digit) {
        return false;
    }
    // P_n is the n-th digit from the right of the first eleven, Q_n its weight
    let sum: u32 = d
        .iter()
        .take(11)
        .rev()
        .enumerate()
        .map(|(k, &c)| {
            let n = k as u32 + 1;
            let q = if n <= 6 { n + 1 } else { n - 5 };
            u32::from(c - b'0') * q
        })
        .sum();
    let r = sum % 11;
    let check = if r <= 1 { 0 } else { 11 - r };
    d.get(11).map(|&c| u32::from(c - b'0')) == Some(check)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::detect::tests::hits;
    use crate::detect::Builtin;

    fn none(b: Builtin, texts: &[&str]) {
        for text in texts {
            assert_eq!(hits(b, text), Vec::<&str>::new(), "{text}");
        }
    }

    /// The default rules (every built-in) mask the new kinds with their placeholder names and
    /// restore them.
    #[test]
    fn default_rules_mask_and_restore_the_new_kinds() {
        let rules = crate::config::parse_document(b"{}").unwrap();
        let config = rules.global().unwrap();
        let text = "Call +44 20 7946 0958, IBAN DE89 3704 0044 0532 0130 00, SSN 123-45-6789, \
                    NINO AB 12 34 56 C, IdNr 86095742719, card 501800000009.";
        let mut map = crate::mask::PlaceholderMap::default();
        let masked = config.redactor.redact(text, &mut map).unwrap().unwrap();
        assert_eq!(
            masked,
            "Call [PHONE_1], IBAN [IBAN_1], SSN [ID_1], NINO [ID_2], IdNr [ID_3], card [CARD_1]."
        );
        assert_eq!(map.restore(&masked), text);
    }

    #[test]
    fn ssn_us() {
        assert_eq!(
            hits(
                Builtin::SsnUs,
                "SSN 123-45-6789, also 078 05 1120; SSN: 219099999 and social security no. 536225555."
            ),
            ["123-45-6789", "078 05 1120", "219099999", "536225555"]
        );
        none(
            Builtin::SsnUs,
            &[
                "000-12-3456",
                "666-12-3456",
                "912-34-5678",
                "123-00-4567",
                "123-45-0000",
                "123-45 6789",
                "123456789",
                "order 123456789",
                "1234-56-7890",
                "2024-12-01",
                "123-45-67890",
                "x123-45-6789",
                "ORD-123-45-6789",
                "415-555-0132",
                "123-45-6789.5",
            ],
        );
    }

    #[test]
    fn nino_uk() {
        assert_eq!(
            hits(
                Builtin::NinoUk,
                "NI AB123456C, also JG 10 37 35 D, CE 123456 A, PP123456 B."
            ),
            ["AB123456C", "JG 10 37 35 D", "CE 123456 A", "PP123456 B"]
        );
        none(
            Builtin::NinoUk,
            &[
                "DA123456C",     // D is not a first letter
                "AO123456C",     // O is not a second letter
                "GB123456C",     // reserved prefix
                "ZZ 11 52 44 A", // administrative prefix
                "AB123456E",     // suffix A-D only
                "AB12345C",      // five digits
                "AB 12 3456 C",  // spaced unevenly
                "XAB123456C",
                "AB123456CD",
                "ab123456c",
            ],
        );
    }

    #[test]
    fn nir_fr() {
        // built by hand: the key is 97 - (first 13 digits mod 97)
        assert!(valid_nir(b"185057800608491"));
        assert_eq!(
            hits(
                Builtin::NirFr,
                "NIR 1 85 05 78 006 084 91, 185057800608491 and 2 69 05 2A 123 456 88."
            ),
            [
                "1 85 05 78 006 084 91",
                "185057800608491",
                "2 69 05 2A 123 456 88"
            ]
        );
        none(
            Builtin::NirFr,
            &[
                "185057800608492",  // key
                "185137800608491",  // month 13
                "185050000608491",  // département 00
                "585057800608491",  // sex 5
                "1850578006084915", // 16 digits
                "1 85 05 2C 123 456 11",
                "x185057800608491",
            ],
        );
    }

    #[test]
    fn tax_id_de() {
        assert_eq!(
            hits(Builtin::TaxIdDe, "IdNr 86095742719, 86 095 742 719."),
            ["86095742719", "86 095 742 719"]
        );
        none(
            Builtin::TaxIdDe,
            &[
                "86095742718",  // check digit
                "06095742719",  // leading 0
                "12345678903",  // no digit repeats
                "11223456789",  // two digits repeat
                "860957427190", // 12 digits
                "86-095-742-719",
                "电话13564087944", // a Chinese mobile after a word for a phone
            ],
        );
        // with a word for a tax id too, it is one
        assert_eq!(
            hits(Builtin::TaxIdDe, "Telefon? Nein, Steuer-ID 18026259746"),
            ["18026259746"]
        );
    }

    #[test]
    fn my_number_jp() {
        assert_eq!(
            hits(
                Builtin::MyNumberJp,
                "個人番号 123456789018, 1234 5678 9018 と 1234-5678-9018。"
            ),
            ["123456789018", "1234 5678 9018", "1234-5678-9018"]
        );
        none(
            Builtin::MyNumberJp,
            &[
                "123456789012",          // check digit
                "1234 5678-9018",        // mixed separators
                "1234567890180",         // 13 digits
                "個人番号 202412011030", // a timestamp YYYYMMDDhhmm
                "order 123456789018",    // bare, no word for a My Number
                "A123456789018",
                "Tracking 2449 7616 7909 is in transit.", // a reference before
                "Tracking 1048 6936 2956 is in transit.",
                "注文番号 1234-5678-9018",
                "numéro de carte : 1234 5678 9018", // a word for a card before
                "order # 1234 5678 9018",
                "123456789018は注文番号です。", // a word after, not for a My Number
                // the word for a My Number too far after
                "123456789018は昨日お客様から電話で伺った内容と一致する会員のマイナンバー",
            ],
        );
        // a word for a My Number after the bare number, or next to a reference word
        assert_eq!(
            hits(
                Builtin::MyNumberJp,
                "123456789018は昨日お客様から伺ったマイナンバーです。"
            ),
            ["123456789018"]
        );
        assert_eq!(
            hits(Builtin::MyNumberJp, "My Number (ID): 1234 5678 9018"),
            ["1234 5678 9018"]
        );
        assert_eq!(
            hits(Builtin::MyNumberJp, "Tracking 2449 7616 7909 (My Number)"),
            ["2449 7616 7909"]
        );
    }
}
