//! IBAN (ISO 13616): two letters of a country that issues IBANs, two check digits, the
//! country's BBAN (upper-case letters and digits) to the exact length that country uses, and
//! the mod-97 check (ISO 7064 MOD 97-10: the number with its first four characters moved to
//! the end and letters as 10..35 leaves 1). Written compact (`DE89370400440532013000`) or in
//! groups of four split by single spaces (`DE89 3704 0044 0532 0130 00`).
//!
//! The lengths are those of the SWIFT IBAN registry. A value of another length between 15
//! and 34 characters (the ISO 13616 bounds), with the same shape (a registry country, check
//! digits 02–98, upper-case letters and digits, compact or in groups of four) that passes the
//! mod-97 check is taken too: it is an IBAN with a wrong length (a typo, or a test generator
//! that writes 21-character GB values, as Faker's default bank provider does), still a bank
//! account the user meant to give. Anything else with that shape passes mod 97 by chance one
//! time in 97, and the shape itself (two capitals, two digits, eleven or more capitals and
//! digits as one token) is rare outside bank details.

use crate::scan::{at, before, Step};

/// (country, IBAN length), SWIFT IBAN registry.
const LENGTHS: [(&[u8; 2], u8); 89] = [
    (b"AD", 24),
    (b"AE", 23),
    (b"AL", 28),
    (b"AT", 20),
    (b"AZ", 28),
    (b"BA", 20),
    (b"BE", 16),
    (b"BG", 22),
    (b"BH", 22),
    (b"BI", 27),
    (b"BR", 29),
    (b"BY", 28),
    (b"CH", 21),
    (b"CR", 22),
    (b"CY", 28),
    (b"CZ", 24),
    (b"DE", 22),
    (b"DJ", 27),
    (b"DK", 18),
    (b"DO", 28),
    (b"EE", 20),
    (b"EG", 29),
    (b"ES", 24),
    (b"FI", 18),
    (b"FK", 18),
    (b"FO", 18),
    (b"FR", 27),
    (b"GB", 22),
    (b"GE", 22),
    (b"GI", 23),
    (b"GL", 18),
    (b"GR", 27),
    (b"GT", 28),
    (b"HN", 28),
    (b"HR", 21),
    (b"HU", 28),
    (b"IE", 22),
    (b"IL", 23),
    (b"IQ", 23),
    (b"IS", 26),
    (b"IT", 27),
    (b"JO", 30),
    (b"KW", 30),
    (b"KZ", 20),
    (b"LB", 28),
    (b"LC", 32),
    (b"LI", 21),
    (b"LT", 20),
    (b"LU", 20),
    (b"LV", 21),
    (b"LY", 25),
    (b"MC", 27),
    (b"MD", 24),
    (b"ME", 22),
    (b"MK", 19),
    (b"MN", 20),
    (b"MR", 27),
    (b"MT", 31),
    (b"MU", 30),
    (b"NI", 28),
    (b"NL", 18),
    (b"NO", 15),
    (b"OM", 23),
    (b"PK", 24),
    (b"PL", 28),
    (b"PS", 29),
    (b"PT", 25),
    (b"QA", 29),
    (b"RO", 24),
    (b"RS", 22),
    (b"RU", 33),
    (b"SA", 24),
    (b"SC", 31),
    (b"SD", 18),
    (b"SE", 24),
    (b"SI", 19),
    (b"SK", 24),
    (b"SM", 27),
    (b"SO", 23),
    (b"ST", 25),
    (b"SV", 28),
    (b"TL", 23),
    (b"TN", 24),
    (b"TR", 26),
    (b"UA", 29),
    (b"VA", 22),
    (b"VG", 24),
    (b"XK", 20),
    (b"YE", 30),
];

fn is_alnum_upper(c: u8) -> bool {
    c.is_ascii_uppercase() || c.is_ascii_digit()
}

/// True if `iban` (compact, upper case) passes the mod-97 check.
pub fn mod97(iban: &[u8]) -> bool {
    let (head, tail) = iban.split_at(iban.len().min(4));
    let mut rem = 0u32;
    for &c in tail.iter().chain(head) {
        rem = match c {
            b'0'..=b'9' => (rem * 10 + u32::from(c - b'0')) % 97,
            b'A'..=b'Z' => (rem * 100 + u32::from(c - b'A') + 10) % 97,
            _ => return false,
        };
    }
    rem == 1
}

pub(crate) fn iban(b: &[u8], i: usize) -> Step {
    let prev = before(b, i);
    if prev.is_ascii_alphanumeric() || prev == b'_' {
        return Step::No;
    }
    let (Some(country), true) = (
        b.get(i..i + 2),
        at(b, i + 2).is_ascii_digit() && at(b, i + 3).is_ascii_digit(),
    ) else {
        return Step::No;
    };
    let Some(len) = LENGTHS
        .iter()
        .find(|(code, _)| code.as_slice() == country)
        .map(|&(_, len)| usize::from(len))
    else {
        return Step::No;
    };
    // check digits 00, 01 and 99 are never issued (ISO 7064 MOD 97-10 gives 02..98)
    if matches!(b.get(i + 2..i + 4), Some(b"00" | b"01" | b"99")) {
        return Step::No;
    }
    match exact(b, i, len) {
        Step::Match(end) => Step::Match(end),
        _ => any_length(b, i),
    }
}

/// The IBAN at `i` with the registry length `len` of its country.
fn exact(b: &[u8], i: usize, len: usize) -> Step {
    let mut compact = [0u8; 34];
    let mut n = 0;
    let mut p = i;
    let mut grouped = None; // decided at the first group boundary
    while n < len {
        if n > 0 && n % 4 == 0 {
            let gap = at(b, p) == b' ';
            if *grouped.get_or_insert(gap) != gap {
                return Step::No;
            }
            if gap {
                p += 1;
            }
        }
        let c = at(b, p);
        if !is_alnum_upper(c) {
            return Step::No;
        }
        let Some(slot) = compact.get_mut(n) else {
            return Step::No;
        };
        *slot = c;
        n += 1;
        p += 1;
    }
    let next = at(b, p);
    if next.is_ascii_alphanumeric() || next == b'_' {
        return Step::No;
    }
    if mod97(compact.get(..n).unwrap_or_default()) {
        Step::Match(p)
    } else {
        Step::No
    }
}

/// The longest IBAN-shaped token at `i` (at most 34 characters, compact or in groups of four
/// with a shorter last group), if it is 15 to 34 characters long and passes mod 97.
fn any_length(b: &[u8], i: usize) -> Step {
    let mut compact = [0u8; 34];
    let mut n = 0;
    let mut p = i;
    let mut grouped = None; // decided at the first group boundary
    while n < compact.len() {
        if n > 0 && n % 4 == 0 {
            let gap = at(b, p) == b' ' && is_alnum_upper(at(b, p + 1));
            if *grouped.get_or_insert(gap) {
                if !gap {
                    break;
                }
                p += 1;
            }
        }
        let c = at(b, p);
        let Some(slot) = compact.get_mut(n) else {
            break;
        };
        if !is_alnum_upper(c) {
            break;
        }
        *slot = c;
        n += 1;
        p += 1;
    }
    let next = at(b, p);
    if n < 15 || next.is_ascii_alphanumeric() || next == b'_' {
        return Step::No;
    }
    if mod97(compact.get(..n).unwrap_or_default()) {
        Step::Match(p)
    } else {
        Step::No
    }
}

#[cfg(test)]
mod tests {
    use crate::detect::Builtin;

    fn hits(text: &str) -> Vec<&str> {
        crate::detect::tests::hits(Builtin::Iban, text)
    }

    #[test]
    fn registry_examples_compact_and_grouped() {
        for iban in [
            "DE89370400440532013000",
            "DE89 3704 0044 0532 0130 00",
            "GB82WEST12345698765432",
            "GB82 WEST 1234 5698 7654 32",
            "FR1420041010050500013M02606",
            "FR14 2004 1010 0505 0001 3M02 606",
            "ES9121000418450200051332",
            "IT60X0542811101000000123456",
            "NL91ABNA0417164300",
            "BE68539007547034",
            "CH9300762011623852957",
            "NO9386011117947",
            "PL61109010140000071219812874",
            "SA0380000000608010167519",
            "MT84MALT011000012345MTLCAST001S",
        ] {
            let text = format!("IBAN: {iban}.");
            assert_eq!(hits(&text), [iban], "{iban}");
        }
    }

    #[test]
    fn wrong_check_length_or_country_is_not_an_iban() {
        for no in [
            "DE89370400440532013001",       // check fails
            "DE8937040044053201300",        // one short
            "DE893704004405320130000",      // one long
            "XX89370400440532013000",       // no such country
            "DE89 3704 0044 0532 013000",   // grouping broken
            "DE89  3704 0044 0532 0130 00", // two spaces
            "de89370400440532013000",       // lower case
            "ADE89370400440532013000",
            "DE89370400440532013000X",
            "GB01ROQI00575668282331", // check digits 01 are never issued
            "DE8937040044053",        // too short for any IBAN
            "DE89 3704 0044 0532 0130 0000 0000 0000 0000", // too long
            "DE89 3704 0044 05320 130 00", // a group of five
        ] {
            assert_eq!(hits(no), Vec::<&str>::new(), "{no}");
        }
    }

    #[test]
    fn a_valid_check_with_another_length_is_taken() {
        // Faker's default bank provider writes GB IBANs of 21 characters (GB has 22)
        for iban in [
            "GB54ESZY1417776317066",
            "GB85 EDQY 5182 2225 4189 4",
            "GB34AZUN9005929224469",
        ] {
            let text = format!("麻烦核对一下{iban}是否一致");
            assert_eq!(hits(&text), [iban], "{iban}");
        }
        // the same shape failing mod 97 is not one
        for no in ["GB54ESZY1417776317067", "GB85 EDQY 5182 2225 4189 5"] {
            assert!(hits(no).is_empty(), "{no}");
        }
        // a registry-length IBAN followed by a word in capitals ends at its length
        assert_eq!(
            hits("ES91 2100 0418 4502 0005 1332 EUR"),
            ["ES91 2100 0418 4502 0005 1332"]
        );
    }
}
