//! Phone numbers of any country, in international and national formats.
//!
//! A candidate is a short run of digit groups: an optional `+`, groups of digits split by one
//! space, dash, dot or slash, a group may stand in parentheses (`(0161)`, `+49 (0) 30`), at
//! most 17 digits, and an optional extension (`x123`, ` ext. 123`). It is a phone number when
//! it has the structure of a numbering plan, checked from its digits and its format cues:
//!
//! * International: `+` or `00`, a country code assigned by the ITU (E.164), an optional
//!   `(0)` trunk prefix, and a national number of a length that country uses (a compact table
//!   for the large markets, taken from the ITU-T E.164 national numbering plans as published
//!   in libphonenumber's metadata; a generic range elsewhere). The `00` form needs a
//!   separator after the country code (`0049 30 …`, `001-415-…`).
//! * National with a trunk `0` (UK, DE, FR, NL, IT, AU, JP, KR, IN, CN landlines…):
//!   `0` then a non-zero digit, 9 to 12 digits, in groups (`01632 960 367`, `04 15 39 15 00`,
//!   `080-9718-5680`, `(03449) 78690`), or 10–11 digits bare (`01632960367`).
//! * North American: 3-3-4 with dashes, dots, spaces or `(415) 555-0132`, optionally after
//!   `1-`/`1 `.
//! * Mainland China mobile: `1[3-9]` and 11 digits, bare or 3-4-4.
//! * Others with a separator: Brazil/Mexico `11 91234-5678` (2-4-4, 2-5-4), Spain
//!   `612 34 56 78` (3-2-2-2), `612 345 678` (mobiles 6/7), Italy mobile `342 0837783`,
//!   India mobile `98765 43210`.
//!
//! * Bare digits with a word for a phone in the 32 bytes before or the 24 after ("phone",
//!   "tel", "call", "number", "mobile", "电话", "電話"…): North American 10 digits (area and
//!   exchange 2–9), or a trunk `0` and 9 to 12 digits.
//! * 2-4-4 joined by dashes, any area code (`90-3289-2184`: a Japanese mobile without its
//!   trunk 0), with a word for a phone in the 32 bytes before or the 48 after, none for a
//!   reference before.
//! * An area code in parentheses with its trunk `0` and one group (`(00492) 58991`).
//!
//! A parenthesis after the number that opens no group of digits (` (verified by phone)`) ends
//! the candidate.
//!
//! What is never a phone here: a bare run of digits after "order", "invoice", "tracking",
//! "ref", "ticket", "account", "id", "#", "订单"… (within 24 bytes); a bare run without a trunk `0`, the Chinese mobile
//! shape or a word for a phone before it (order numbers, timestamps), digit groups joined to letters or other digits (UUIDs,
//! hex, versions `1.2.3.4`, prices `1 234,50`), dates (`01.12.2024`), times (`10:30`).
//! Each try reads at most a few dozen bytes, so the scan stays linear.

use crate::context::{context_after, context_before, PHONE_WORDS, REFERENCE_WORDS, TAX_ID_WORDS};
use crate::national_id::valid_tax_id_de;
use crate::scan::{at, before, is_digit, is_word, Step};

/// Most digits in a candidate: `00` + a 3-digit country code + 12 national digits.
const MAX_DIGITS: usize = 17;
/// Most groups in a candidate.
const MAX_GROUPS: usize = 8;

/// Whether a byte can begin a phone number.
pub(crate) fn first(c: u8) -> bool {
    c == b'+' || c == b'(' || is_digit(c)
}

/// The groups of digits read from a candidate.
struct Shape {
    digits: [u8; MAX_DIGITS],
    n: usize,
    /// Length of each group.
    groups: [u8; MAX_GROUPS],
    g: usize,
    /// The separator before each group (0 for none, `(` when the group is in parentheses).
    seps: [u8; MAX_GROUPS],
    plus: bool,
}

impl Shape {
    fn digits(&self) -> &[u8] {
        self.digits.get(..self.n).unwrap_or_default()
    }
    fn groups(&self) -> &[u8] {
        self.groups.get(..self.g).unwrap_or_default()
    }
    fn group(&self, k: usize) -> usize {
        usize::from(self.groups.get(k).copied().unwrap_or(0))
    }
    fn sep(&self, k: usize) -> u8 {
        self.seps.get(k).copied().unwrap_or(0)
    }
    fn digit(&self, k: usize) -> u8 {
        self.digits.get(k).copied().unwrap_or(0)
    }
    /// The separators between groups, excluding parentheses, are all `c`.
    fn seps_all(&self, c: u8) -> bool {
        (1..self.g).all(|k| self.sep(k) == c)
    }
}

/// Reads the candidate at `i`: its shape and end, or `None` if it is not one.
fn read(b: &[u8], i: usize) -> Option<(Shape, usize)> {
    let mut s = Shape {
        digits: [0; MAX_DIGITS],
        n: 0,
        groups: [0; MAX_GROUPS],
        g: 0,
        seps: [0; MAX_GROUPS],
        plus: false,
    };
    let mut p = i;
    if at(b, p) == b'+' {
        s.plus = true;
        p += 1;
        if !is_digit(at(b, p)) {
            return None;
        }
    }
    let mut sep = 0u8;
    let mut end = i;
    loop {
        let paren = at(b, p) == b'(';
        if paren {
            p += 1;
        }
        let from = p;
        let n_before = s.n;
        while is_digit(at(b, p)) {
            let slot = s.digits.get_mut(s.n)?;
            *slot = at(b, p);
            s.n += 1;
            p += 1;
        }
        let len = p - from;
        let closed = !paren || at(b, p) == b')';
        if len == 0 || !closed {
            // not a group (` (verified by phone)`, `(see`): the candidate ends before it
            if s.g == 0 {
                return None;
            }
            s.n = n_before;
            break;
        }
        if paren {
            p += 1;
        }
        *s.groups.get_mut(s.g)? = u8::try_from(len).ok()?;
        *s.seps.get_mut(s.g)? = if paren { b'(' } else { sep };
        s.g += 1;
        end = p;
        // what joins the next group: one separator, a `(`, or (after `)`) nothing
        let c = at(b, p);
        let next = at(b, p + 1);
        if matches!(c, b' ' | b'-' | b'.' | b'/') && (is_digit(next) || next == b'(') {
            sep = c;
            p += 1;
        } else if (c == b'(' && is_digit(next)) || (paren && is_digit(c)) {
            // `+44(0)…`, `(591)341-…`: a parenthesis alone joins the groups
            sep = 0;
        } else {
            break;
        }
    }
    Some((s, end))
}

/// Whether the text before `i` lets a phone number start there.
fn starts_clean(b: &[u8], i: usize) -> bool {
    let prev = before(b, i);
    !(is_word(prev) || matches!(prev, b'.' | b'-' | b'/' | b'+' | b',' | b':' | b'#' | b'$'))
}

/// Whether the text at `end` lets a phone number end there.
fn ends_clean(b: &[u8], end: usize) -> bool {
    let c = at(b, end);
    if is_word(c) {
        return false;
    }
    // a number continued by `.5`, `,50`, `:30`, `-2`, `/24`, or a percentage, is something else
    c != b'%' && !(matches!(c, b'.' | b',' | b':' | b'-' | b'/') && is_digit(at(b, end + 1)))
}

/// An extension after a number: `x123`, ` x123`, ` ext. 123`, ` ext 123`; its end.
fn extension(b: &[u8], end: usize) -> Option<usize> {
    let mut p = end;
    if at(b, p) == b' ' {
        p += 1;
    }
    if at(b, p) == b'x' {
        p += 1;
    } else if b.get(p..p + 3) == Some(b"ext") {
        p += 3;
        if at(b, p) == b'.' {
            p += 1;
        }
        if at(b, p) == b' ' {
            p += 1;
        }
    } else {
        return None;
    }
    let from = p;
    while is_digit(at(b, p)) && p - from < 6 {
        p += 1;
    }
    (p > from && !is_word(at(b, p))).then_some(p)
}

pub(crate) fn phone(b: &[u8], i: usize) -> Step {
    if !first(at(b, i)) || !starts_clean(b, i) {
        return Step::No;
    }
    let Some((shape, end)) = read(b, i) else {
        return Step::No;
    };
    let end = match extension(b, end) {
        Some(ext_end) => ext_end,
        None if ends_clean(b, end) => end,
        None => return Step::No,
    };
    let bare = shape.g == 1;
    let found = plausible(&shape)
        || (bare && bare_with_context(&shape, b, i, end))
        || (!bare && grouped_with_context(&shape, b, i, end));
    // a bare number after "order", "ticket", "id"… is a reference ("order number …"); a
    // bare German tax id shaped like a Chinese mobile, named as such, is the tax id's
    if found
        && !(bare
            && (context_before(b, i, &REFERENCE_WORDS, 24) || named_tax_id(&shape, b, i, end)))
    {
        Step::Match(end)
    } else {
        Step::No
    }
}

/// "18026259746 als Steuer-ID": 11 digits that are a valid German tax id with a word for one
/// in the 32 bytes before or the 24 after.
fn named_tax_id(s: &Shape, b: &[u8], i: usize, end: usize) -> bool {
    s.digits()
        .try_into()
        .is_ok_and(|id: [u8; 11]| valid_tax_id_de(&id))
        && (context_before(b, i, &TAX_ID_WORDS, 32) || context_after(b, end, &TAX_ID_WORDS, 24))
}

/// A bare run of digits with a word for a phone in the 32 bytes before or the 24 after ("5272868387 is
/// the phone number"): a North American number with valid area and exchange codes, or a trunk
/// `0`, a non-zero digit and 9 to 12 digits in all.
fn bare_with_context(s: &Shape, b: &[u8], i: usize, end: usize) -> bool {
    let d = s.digits();
    let nanp =
        d.len() == 10 && (b'2'..=b'9').contains(&s.digit(0)) && (b'2'..=b'9').contains(&s.digit(3));
    let trunk =
        (9..=12).contains(&d.len()) && s.digit(0) == b'0' && (b'1'..=b'9').contains(&s.digit(1));
    (nanp || trunk)
        && (context_before(b, i, &PHONE_WORDS, 32) || context_after(b, end, &PHONE_WORDS, 24))
}

/// A 2-4-4 number joined by dashes with a word for a phone in the 32 bytes before or the 48
/// after, whatever its area code ("電話番号は90-3289-2184", "50-7529-1703は昨日お客様から伺った
/// 電話番号です": Japanese mobiles written without their trunk 0), unless a word for a
/// reference is before it ("order number 20-2024-0001").
fn grouped_with_context(s: &Shape, b: &[u8], i: usize, end: usize) -> bool {
    s.groups() == [2, 4, 4]
        && s.seps_all(b'-')
        && s.digit(0) != b'0'
        && (context_before(b, i, &PHONE_WORDS, 32) || context_after(b, end, &PHONE_WORDS, 48))
        && !context_before(b, i, &REFERENCE_WORDS, 32)
}

/// Whether the shape is a phone number of some numbering plan.
fn plausible(s: &Shape) -> bool {
    if s.plus {
        return international(s, 0);
    }
    let d = s.digits();
    if d.starts_with(b"00") && s.sep(0) != b'(' {
        // `00` + country code in the first group, then a separator
        return s.g >= 2 && international(s, 2);
    }
    national(s)
}

/// The length of the country code at the start of `d` (ITU-T E.164 assignments: the
/// one-digit zones 1 and 7, the two-digit codes, the rest three digits), `None` if the
/// prefix is not assigned.
fn country_code_len(d: &[u8]) -> Option<usize> {
    let two = |k: usize| d.get(k).map(|c| c.wrapping_sub(b'0'));
    let (Some(a), Some(b)) = (two(0), two(1)) else {
        return None;
    };
    match (a, b) {
        (1 | 7, _) => Some(1),
        (2, 0 | 7) => Some(2),
        (2, _) => Some(3),
        (3, 0..=4 | 6 | 9) => Some(2),
        (3, 5 | 7 | 8) => Some(3),
        (4, 0 | 1 | 3..=9) => Some(2),
        (4, 2) => Some(3),
        (5, 1..=8) => Some(2),
        (5, 0 | 9) => Some(3),
        (6, 0..=6) => Some(2),
        (6, 7..=9) => Some(3),
        (8, 1 | 2 | 4 | 6) => Some(2),
        (8, 0 | 5 | 7 | 8) => Some(3),
        (9, 0..=5 | 8) => Some(2),
        (9, 6 | 7 | 9) => Some(3),
        _ => None,
    }
}

/// Three-digit codes inside the ranges of [`country_code_len`] that the ITU has not assigned
/// (spare or withdrawn).
fn spare(cc: u16) -> bool {
    matches!(
        cc,
        210 | 214
            | 215
            | 217
            | 219
            | 259
            | 280..=289
            | 292..=296
            | 384
            | 388
            | 422
            | 424..=429
            | 671
            | 693..=699
            | 801..=807
            | 809
            | 851
            | 854
            | 857..=859
            | 871..=877
            | 884
            | 885
            | 887
            | 889
            | 969
            | 978
            | 990
            | 997
            | 999
    )
}

/// National number lengths (without trunk prefix) by country code, from the E.164 plans of
/// the large markets; other codes get a generic range.
const NSN_LENGTHS: [(u16, u8, u8); 51] = [
    (1, 10, 10),  // NANP: US, CA, …
    (7, 10, 10),  // RU, KZ
    (20, 8, 10),  // EG
    (27, 9, 9),   // ZA
    (30, 10, 10), // GR
    (31, 9, 9),   // NL
    (32, 8, 9),   // BE
    (33, 9, 9),   // FR
    (34, 9, 9),   // ES
    (36, 8, 9),   // HU
    (39, 6, 11),  // IT (the leading 0 of landlines is part of the number)
    (40, 9, 9),   // RO
    (41, 9, 9),   // CH
    (43, 4, 13),  // AT
    (44, 7, 10),  // GB
    (45, 8, 8),   // DK
    (46, 7, 10),  // SE
    (47, 8, 8),   // NO
    (48, 9, 9),   // PL
    (49, 6, 13),  // DE
    (51, 8, 9),   // PE
    (52, 10, 10), // MX
    (54, 10, 11), // AR
    (55, 10, 11), // BR
    (56, 9, 9),   // CL
    (57, 10, 10), // CO
    (58, 10, 10), // VE
    (60, 8, 10),  // MY
    (61, 9, 9),   // AU
    (62, 8, 12),  // ID
    (63, 10, 10), // PH
    (64, 8, 10),  // NZ
    (65, 8, 8),   // SG
    (66, 8, 9),   // TH
    (81, 9, 10),  // JP
    (82, 8, 10),  // KR
    (84, 9, 10),  // VN
    (86, 9, 11),  // CN
    (90, 10, 10), // TR
    (91, 10, 10), // IN
    (92, 9, 10),  // PK
    (93, 9, 9),   // AF
    (94, 9, 9),   // LK
    (95, 7, 10),  // MM
    (98, 10, 10), // IR
    (351, 9, 9),  // PT
    (353, 7, 9),  // IE
    (358, 6, 12), // FI
    (380, 9, 9),  // UA
    (852, 8, 8),  // HK
    (886, 8, 9),  // TW
];

/// `skip` leading digits (`00`) then country code, optional `(0)`, national number.
fn international(s: &Shape, skip: usize) -> bool {
    let d = s.digits();
    let Some(rest) = d.get(skip..) else {
        return false;
    };
    let Some(cc_len) = country_code_len(rest) else {
        return false;
    };
    // the country code is not split across groups; with `00` it is the whole first group
    let first = s.group(0);
    if first < skip + cc_len || (skip > 0 && first != skip + cc_len) {
        return false;
    }
    let cc = rest
        .get(..cc_len)
        .unwrap_or_default()
        .iter()
        .fold(0u16, |a, &c| a * 10 + u16::from(c - b'0'));
    if spare(cc) {
        return false;
    }
    let mut nsn = d.len() - skip - cc_len;
    let mut nsn_first = s.digit(skip + cc_len);
    // `(0)` right after the country code: a trunk prefix written for national callers
    if first == skip + cc_len && s.group(1) == 1 && s.sep(1) == b'(' && nsn_first == b'0' {
        nsn -= 1;
        nsn_first = s.digit(skip + cc_len + 1);
    }
    // a national number never starts with 0 (Italy's keeps its landline 0), except written
    // after an explicit `(0)`: `+49(0) 014122775` is no valid number but clearly a phone
    if nsn_first == b'0' && cc != 39 && nsn == d.len() - skip - cc_len {
        return false;
    }
    let (min, max) = NSN_LENGTHS.iter().find(|&&(code, _, _)| code == cc).map_or(
        if cc_len == 3 { (6, 12) } else { (7, 11) },
        |&(_, min, max)| (usize::from(min), usize::from(max)),
    );
    (min..=max).contains(&nsn) && cc_len + nsn <= 15
}

fn national(s: &Shape) -> bool {
    let d = s.digits();
    let n = d.len();
    let groups = s.groups();
    let first = s.digit(0);
    let second = s.digit(1);
    // North American 3-3-4, optionally after `1`
    let nanp = |k: usize| {
        groups.get(k..) == Some(&[3, 3, 4])
            && (s.sep(k) == b'(' && matches!(s.sep(k + 2), b'-' | b' ' | b'.')
                || (s.sep(k + 1) == s.sep(k + 2) && matches!(s.sep(k + 1), b'-' | b'.' | b' ')))
    };
    if nanp(0) || (groups.first() == Some(&1) && first == b'1' && nanp(1)) {
        return true;
    }
    // an area code in parentheses with its trunk `0`, then one group: `(03944) 11771`, and
    // `(00492) 58991` (no such area code, but the parentheses say phone)
    if first == b'0'
        && s.g == 2
        && s.sep(0) == b'('
        && (3..=6).contains(&s.group(0))
        && s.sep(1) == b' '
        && (9..=12).contains(&n)
        && s.group(1) >= 4
    {
        return true;
    }
    // trunk `0` then a non-zero digit
    if first == b'0' {
        if !(b'1'..=b'9').contains(&second) {
            return false;
        }
        if s.g == 1 {
            return (10..=11).contains(&n);
        }
        let date_like = matches!(s.sep(1), b'.' | b'/') && groups.starts_with(&[2, 2, 4]);
        return (9..=12).contains(&n)
            && (2..=6).contains(&s.group(0))
            && groups.iter().skip(1).all(|&g| g >= 2)
            && !date_like;
    }
    // mainland China mobile
    if first == b'1' && (b'3'..=b'9').contains(&second) && n == 11 {
        return s.g == 1 || (groups == [3, 4, 4] && (s.seps_all(b' ') || s.seps_all(b'-')));
    }
    if s.g < 2 {
        return false;
    }
    let spaced = s.seps_all(b' ');
    // Brazil, Mexico, Japan without its trunk 0: area code (or a parenthesised one), then
    // 4-4 or 5-4
    if (groups == [2, 4, 4] || groups == [2, 5, 4])
        && first != b'0'
        && second != b'0'
        && matches!(s.sep(2), b'-' | b' ')
        && matches!(s.sep(1), b' ' | b'(' | 0 | b'-')
    {
        return true;
    }
    // a group in parentheses first: (area) rest — the parenthesis is the cue
    if s.sep(0) == b'(' && (2..=4).contains(&s.group(0)) && (9..=11).contains(&n) {
        return groups.iter().skip(1).all(|&g| g >= 3);
    }
    // Spain: 3-2-2-2 mobiles and landlines (6, 7, 8, 9), 3-3-3 mobiles (6, 7)
    if groups == [3, 2, 2, 2] && (b'6'..=b'9').contains(&first) && spaced {
        return true;
    }
    if groups == [3, 3, 3] && matches!(first, b'6' | b'7') && spaced {
        return true;
    }
    // Italy mobile 3xx xxxxxxx
    if first == b'3' && groups.len() == 2 && s.group(0) == 3 && (6..=7).contains(&s.group(1)) {
        return spaced;
    }
    // India mobile 5-5
    groups == [5, 5] && (b'6'..=b'9').contains(&first) && spaced
}

#[cfg(test)]
mod tests {
    use crate::detect::Builtin;

    fn hits(text: &str) -> Vec<&str> {
        crate::detect::tests::hits(Builtin::Phone, text)
    }

    fn all_found(numbers: &[&str]) {
        for number in numbers {
            let text = format!("Call me at {number}, thanks.");
            assert_eq!(hits(&text), [*number], "in {text:?}");
        }
    }

    #[test]
    fn a_parenthesis_after_the_number_is_not_a_group() {
        for (text, number) in [
            (
                "phone number: (0151) 4960812 (verified by phone).",
                "(0151) 4960812",
            ),
            ("phone: +44(0)151 496 0489 (verified)", "+44(0)151 496 0489"),
            (
                "Telefonnummer: (06030) 620278 (telefonisch)",
                "(06030) 620278",
            ),
            (
                "indique 01 44 43 41 92 (numéro de téléphone)",
                "01 44 43 41 92",
            ),
            (
                "phone number: 351.839.6937 (verified by phone).",
                "351.839.6937",
            ),
            (
                "phone number: 01144960552 (verified by phone).",
                "01144960552",
            ),
        ] {
            assert_eq!(hits(text), [number], "in {text:?}");
        }
        // an unclosed or empty parenthesis still ends the number before it
        assert_eq!(hits("call 020 7946 0958 (ext"), ["020 7946 0958"]);
        assert_eq!(hits("call 020 7946 0958 ()"), ["020 7946 0958"]);
        // but a bare parenthesis with no number before it is nothing
        assert!(hits("see (note) 12").is_empty());
    }

    #[test]
    fn words_for_a_phone_after_a_bare_number_or_before_a_2_4_4_one() {
        for (text, number) in [
            (
                "5272868387 is the phone number the customer gave",
                "5272868387",
            ),
            (
                "The form lists 3662218131 as the phone number",
                "3662218131",
            ),
            ("私の電話番号は90-3289-2184です。", "90-3289-2184"),
            ("Unter (00695) 848304 haben wir", "(00695) 848304"),
            (
                "50-7529-1703は昨日お客様から伺った電話番号です。",
                "50-7529-1703",
            ),
            ("oder +49(0) 014122775 wegen", "+49(0) 014122775"),
            ("电话18026259746", "18026259746"), // a valid tax id too, but no word for one
            (
                "Im Formular steht (00492) 58991 als Telefonnummer",
                "(00492) 58991",
            ),
        ] {
            assert_eq!(hits(text), [number], "in {text:?}");
        }
        for no in [
            "5272868387 is the order reference", // no word for a phone
            "5272868387 was logged; long after that the phone rang", // the word too far
            "1272868387 is the phone number",    // no such area code
            "90-3289-2184 rows were copied",     // 2-4-4 without a word for a phone
            "phone order number 20-2024-0001",   // a reference word too
            "Im Formular steht 18026259746 als Steuer-ID", // a valid tax id, named
            "Steuer-IdNr. 18026259746",
            "(00695)848304", // no space after the parenthesis
            "+49 014122775", // a 0 after the country code, no (0)
            "(00695) 848",   // too short
        ] {
            assert!(hits(no).is_empty(), "{no:?}: {:?}", hits(no));
        }
    }

    #[test]
    fn us_and_canada() {
        all_found(&[
            "+1 (415) 555-0132",
            "+1-780-563-6083",
            "+1 415 555 0132",
            "+14155550132",
            "(415) 555-0132",
            "(591)341-7776",
            "415-555-0132",
            "415.555.0132",
            "415 555 0132",
            "1-415-555-0132",
            "1 (786) 834-4978",
            "001-415-555-0132",
            "415-555-0132x9150",
            "206.269.0743x9150",
            "106-690-7439 x150",
            "415-555-0132 ext. 12",
        ]);
    }

    #[test]
    fn united_kingdom() {
        all_found(&[
            "01632 960 367",
            "01632 960367",
            "(01632) 960391",
            "(0161) 4960066",
            "020 7946 0958",
            "07700 900123",
            "01632960367",
            "+44 20 7946 0958",
            "+44(0)115 4960914",
            "+44(0)2074960074",
            "+44115 496 0777",
            "+44 (0) 121 496 0000",
            "0044 20 7946 0958",
        ]);
    }

    #[test]
    fn germany() {
        all_found(&[
            "+49(0)3473 86352",
            "+49 (0) 9141 777631",
            "+49(0) 778353374",
            "+49 30 901820",
            "+49 151 23456789",
            "030 901820",
            "03662 585178",
            "(03449) 78690",
            "0341/1234567",
            "0151-23456789",
            "0049 89 1234567",
        ]);
    }

    #[test]
    fn france() {
        all_found(&[
            "+33 1 83 41 77 76",
            "+33 (0)1 41 63 60 83",
            "+33612345678",
            "04 15 39 15 00",
            "07 88 35 33 74",
            "01.23.45.67.89",
            "0612345678",
        ]);
    }

    #[test]
    fn china_and_japan() {
        all_found(&[
            "15191417776",
            "138 0013 8000",
            "138-0013-8000",
            "+86 138 0013 8000",
            "+86 10 8888 6666",
            "010-88886666",
            "0755-12345678",
            "080-9718-5680",
            "090-3915-0008",
            "03-1234-5678",
            "+81 90-1234-5678",
            "+81 3 1234 5678",
        ]);
        // after CJK text with no space
        assert_eq!(hits("电话13800138000。"), ["13800138000"]);
        assert_eq!(hits("電話は080-9718-5680です"), ["080-9718-5680"]);
    }

    #[test]
    fn other_large_markets() {
        all_found(&[
            "+91 98765 43210",
            "+919141777631",
            "98765 43210",
            "08124158683",
            "+55 61 9141-7776",
            "+55 11 91234-5678",
            "(11) 91234-5678",
            "12 3915-0008",
            "+34842 91 41 77",
            "+34 948 812 415",
            "612 34 56 78",
            "612 345 678",
            "+39 0925141776",
            "+39 342 083 7783",
            "342 0837783",
            "0961073668",
            "+31(0)914 177763",
            "+3170 6690743",
            "(0406)-812415",
            "073 6625851",
            "02 4177 7631",
            "+61-2-8377-8353",
            "+61.437.406.812",
            "0412 345 678",
            "(08)-8690-7366",
            "02-0080-6360",
            "010-1234-5678",
            "041-914-1777",
            "+82 10-1234-5678",
            "+52 55 1234 5678",
            "55 1234 5678",
        ]);
    }

    #[test]
    fn bare_digits_need_a_word_for_a_phone() {
        for (text, number) in [
            ("phone: 4155550132", "4155550132"),
            ("Call 2114524493 today", "2114524493"),
            ("Tel. 010889957", "010889957"),
            ("电话：0755123456", "0755123456"),
            ("My number is 2114524493.", "2114524493"),
        ] {
            assert_eq!(hits(text), [number], "{text}");
        }
        for no in [
            "order 4155550132",
            "Order number 16701186859", // the shape of a Chinese mobile, but an order
            "订单号15039756049",
            "phone 1733068800", // area code cannot start with 1
            "call 4151550132",  // nor the exchange
            "ref 010889957",
            "order number 4155550132",
            "ticket number: 2114524493",
            "hotel 2114524493", // `tel` only at the start of a word
            "x = 2147483647",
        ] {
            assert_eq!(hits(no), Vec::<&str>::new(), "{no}");
        }
    }

    #[test]
    fn near_misses_are_not_phones() {
        for no in [
            "order 123456789012",
            "order #0123456789",
            "ORD-415-555-0132",
            "invoice 2024-000123",
            "at 2024-12-01 10:30:45",
            "on 01.12.2024 at noon",
            "on 01/12/2024",
            "ts 1733068800",
            "ts 1733068800123",
            "version 1.2.3.4",
            "v10.0.19041.1234",
            "price 1 234 567,89 EUR",
            "price $1,234,567.00",
            "uuid 550e8400-e29b-41d4-a716-446655440000",
            "hash 3f786850e387550fdab836ed7e6dc881de23001b",
            "sha 0123456789abcdef",
            "ip 192.168.100.200",
            "+0123456789",
            "+1 555 0132",
            "+999 1234567",
            "+44 1234",
            "0000 123 456",
            "12345",
            "1234 5678",
            "call 12800138000 now",
            "x415-555-0132",
            "415-555-0132a",
            "415-555-0132.5",
            "20 20 20 20",
            "3.14159",
            "1-2-3-4-5-6",
            "port 8080, pid 44123",
        ] {
            assert_eq!(hits(no), Vec::<&str>::new(), "{no}");
        }
    }

    #[test]
    fn adversarial_runs_stay_linear() {
        for text in [
            "1 ".repeat(20_000),
            "(1".repeat(20_000),
            "+1 ".repeat(20_000),
            "0-".repeat(20_000),
            "(0)".repeat(20_000),
            "1".repeat(40_000),
            "415-555-0132x".repeat(3_000),
        ] {
            let start = std::time::Instant::now();
            let mut spans = Vec::new();
            Builtin::Phone.find(&text, &mut |r| spans.push(r));
            assert!(spans.windows(2).all(|w| w[0].end <= w[1].start));
            assert!(start.elapsed().as_secs() < 5, "slow on {:?}…", &text[..12]);
        }
    }
}
