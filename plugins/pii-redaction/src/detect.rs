//! Detectors: hand-written linear scanners for the built-in kinds of personal data, with
//! validation (GB 11643 check digit, address ranges; phones in [`crate::phone`], cards in
//! [`crate::card`], IBAN in [`crate::iban`], other national ids in [`crate::national_id`]),
//! and `regex-lite` for user rules and deny words.
//!
//! Every scanner looks at each byte a bounded number of times, so the time is linear in the
//! text whatever it contains; `regex-lite` has no backtracking. Built-in matches start and
//! end on `char` boundaries: the byte scanners' on ASCII bytes, names and addresses (their
//! own modules, [`crate::names`] and [`crate::address`]) on any character.

use std::net::Ipv6Addr;
use std::ops::Range;
use std::str::FromStr;

pub use crate::card::luhn;
use crate::context::{context_before, Words};
use crate::scan::{
    at, before, digits_from, find_byte, find_bytes, find_pair, is_digit, is_word,
    next_not_lower_or_space, Present, Step,
};

/// A built-in detector.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Builtin {
    /// `local@domain.tld`.
    Email,
    /// Mainland China mobile: `1[3-9]` + 9 digits, optional `+86`/`0086`, 3-4-4 grouping.
    PhoneCn,
    /// E.164 international: `+`, 8 to 15 digits, single spaces, dashes or dots between groups.
    PhoneE164,
    /// PRC resident ID (18 characters), birth date plausible and GB 11643 check digit valid.
    IdCn,
    /// Payment card: 12 to 19 digits (groups by one space or dash), a brand's prefix and
    /// length, Luhn valid ([`crate::card`]).
    Card,
    /// Dotted quad, each part 0..=255 without leading zeros.
    Ipv4,
    /// An IPv6 address, as `std::net::Ipv6Addr` parses it, with at least two colons.
    Ipv6,
    /// OpenAI-style secret key `sk-…` (20 or more key characters).
    OpenAiKey,
    /// AWS access key id `AKIA…` / `ASIA…` (16 more upper-case letters or digits).
    AwsAccessKey,
    /// A JSON Web Token: `eyJ…` `.` `eyJ…` `.` signature.
    Jwt,
    /// A PEM private key block, `-----BEGIN … PRIVATE KEY-----` to its `-----END …-----`.
    PrivateKey,
    /// A phone number of any country, international (`+44 20 7946 0958`, `0049 …`) or in a
    /// national format with its cues (`(415) 555-0132`, `01632 960 367`) ([`crate::phone`]).
    Phone,
    /// IBAN: country, per-country length, mod-97 check; compact or in groups of four.
    Iban,
    /// US Social Security number: 3-2-4 (dashes or spaces), area/group/serial rules.
    SsnUs,
    /// UK National Insurance number: `AB 12 34 56 C`, HMRC prefix and suffix rules.
    NinoUk,
    /// French NIR (numéro de sécurité sociale), 15 characters with its mod-97 key.
    NirFr,
    /// German tax id (Steuer-IdNr): 11 digits, digit-repetition rule, ISO 7064 check digit.
    TaxIdDe,
    /// Japanese My Number (個人番号): 12 digits with its check digit.
    MyNumberJp,
    /// A person's name: gazetteers of given names and surnames plus context (see
    /// [`crate::names`]).
    PersonName,
    /// A postal address by its shape per locale (see [`crate::address`]).
    StreetAddress,
}

impl Builtin {
    /// Every built-in, in the default rule order.
    pub const ALL: [Builtin; 20] = [
        Builtin::PrivateKey,
        Builtin::Jwt,
        Builtin::OpenAiKey,
        Builtin::AwsAccessKey,
        Builtin::Email,
        Builtin::IdCn,
        Builtin::Iban,
        Builtin::Card,
        Builtin::SsnUs,
        Builtin::NinoUk,
        Builtin::NirFr,
        Builtin::MyNumberJp,
        Builtin::PhoneCn,
        Builtin::PhoneE164,
        Builtin::Phone,
        Builtin::TaxIdDe,
        Builtin::Ipv6,
        Builtin::Ipv4,
        Builtin::StreetAddress,
        Builtin::PersonName,
    ];

    /// The name used in config (`"detector": "email"`).
    pub fn id(self) -> &'static str {
        match self {
            Builtin::Email => "email",
            Builtin::PhoneCn => "phone_cn",
            Builtin::PhoneE164 => "phone_e164",
            Builtin::IdCn => "id_cn",
            Builtin::Card => "card",
            Builtin::Ipv4 => "ipv4",
            Builtin::Ipv6 => "ipv6",
            Builtin::OpenAiKey => "openai_key",
            Builtin::AwsAccessKey => "aws_access_key",
            Builtin::Jwt => "jwt",
            Builtin::PrivateKey => "private_key",
            Builtin::Phone => "phone",
            Builtin::Iban => "iban",
            Builtin::SsnUs => "ssn_us",
            Builtin::NinoUk => "nino_uk",
            Builtin::NirFr => "nir_fr",
            Builtin::TaxIdDe => "tax_id_de",
            Builtin::MyNumberJp => "my_number_jp",
            Builtin::PersonName => "person_name",
            Builtin::StreetAddress => "street_address",
        }
    }

    /// The default rule name, which is also the placeholder's (`[EMAIL_1]`).
    pub fn default_name(self) -> &'static str {
        match self {
            Builtin::Email => "EMAIL",
            Builtin::PhoneCn | Builtin::PhoneE164 | Builtin::Phone => "PHONE",
            Builtin::IdCn
            | Builtin::SsnUs
            | Builtin::NinoUk
            | Builtin::NirFr
            | Builtin::TaxIdDe
            | Builtin::MyNumberJp => "ID",
            Builtin::Iban => "IBAN",
            Builtin::Card => "CARD",
            Builtin::Ipv4 | Builtin::Ipv6 => "IP",
            Builtin::OpenAiKey => "API_KEY",
            Builtin::AwsAccessKey => "AWS_KEY",
            Builtin::Jwt => "JWT",
            Builtin::PrivateKey => "PRIVATE_KEY",
            Builtin::PersonName => "NAME",
            Builtin::StreetAddress => "ADDRESS",
        }
    }

    /// The built-in with this config name.
    pub fn from_id(id: &str) -> Option<Builtin> {
        Builtin::ALL.into_iter().find(|b| b.id() == id)
    }

    /// Calls `found` with the span of every match in `text`, in order, not overlapping.
    pub fn find(self, text: &str, found: &mut dyn FnMut(Range<usize>)) {
        let b = text.as_bytes();
        if let Some((first, try_at)) = self.anchored() {
            return starts(b, found, first, try_at);
        }
        match self {
            Builtin::Email => email(b, found),
            Builtin::Ipv6 => ipv6_runs(b, found),
            Builtin::PrivateKey => private_key(text, found),
            Builtin::PersonName => crate::names::find(text, found),
            Builtin::StreetAddress => crate::address::find(text, found),
            _ => {}
        }
    }

    /// [`find`](Self::find) in text whose [`Present`] bytes are known: a scanner that cannot
    /// match without a byte the text lacks is not run (the spans are the same).
    pub(crate) fn find_in(self, text: &str, present: Present, found: &mut dyn FnMut(Range<usize>)) {
        let needs = match self {
            Builtin::Email => Present::AT,
            Builtin::Ipv6 => Present::COLON,
            Builtin::PrivateKey => Present::DASH,
            Builtin::StreetAddress => {
                return crate::address::find_with(text, present.has(Present::DIGIT), found)
            }
            _ => return self.find(text, found),
        };
        if present.has(needs) {
            self.find(text, found);
        }
    }

    /// For the anchored scanners whose matcher returns [`Step::No`] unless these two bytes
    /// start the text at the position: the pair (the sweep searches it instead of trying the
    /// matcher at every first byte: `s` and `e` are frequent letters).
    /// With the [`Present`] byte the matcher needs too (`sk-`, `eyJ`): without it in the text
    /// the pair is not searched.
    fn pair(self) -> Option<([u8; 2], u8)> {
        match self {
            Builtin::OpenAiKey => Some((*b"sk", Present::DASH)),
            Builtin::Jwt => Some((*b"ey", Present::J)),
            _ => None,
        }
    }

    /// For the anchored scanners whose matcher returns [`Step::No`] unless the byte after
    /// the first passes a test: that test (the sweep then skips the call).
    fn second_byte(self) -> Option<FirstByte> {
        match self {
            Builtin::OpenAiKey => Some(|c| c == b'k'),
            Builtin::AwsAccessKey => Some(|c| matches!(c, b'K' | b'S')),
            Builtin::Jwt => Some(|c| c == b'y'),
            _ => None,
        }
    }

    /// For the scanners that try a match at each byte passing a first-byte test: that test
    /// and the matcher. `None` for the ones with a scan of their own.
    fn anchored(self) -> Option<(FirstByte, Matcher)> {
        let first: FirstByte = match self {
            Builtin::PhoneCn => |c| matches!(c, b'+' | b'0' | b'1'),
            Builtin::PhoneE164 => |c| c == b'+',
            Builtin::IdCn | Builtin::Ipv4 => is_digit,
            Builtin::Card => crate::card::first,
            Builtin::Phone => crate::phone::first,
            Builtin::Iban => |c| c.is_ascii_uppercase(),
            Builtin::SsnUs | Builtin::TaxIdDe | Builtin::MyNumberJp => is_digit,
            Builtin::NirFr => crate::national_id::nir_first,
            Builtin::NinoUk => crate::national_id::nino_first,
            Builtin::OpenAiKey => |c| c == b's',
            Builtin::AwsAccessKey => |c| c == b'A',
            Builtin::Jwt => |c| c == b'e',
            Builtin::Email
            | Builtin::Ipv6
            | Builtin::PrivateKey
            | Builtin::PersonName
            | Builtin::StreetAddress => return None,
        };
        let try_at: Matcher = match self {
            Builtin::PhoneCn => phone_cn,
            Builtin::PhoneE164 => phone_e164,
            Builtin::IdCn => id_cn,
            Builtin::Ipv4 => ipv4,
            Builtin::Card => crate::card::card,
            Builtin::Phone => crate::phone::phone,
            Builtin::Iban => crate::iban::iban,
            Builtin::SsnUs => crate::national_id::ssn_us,
            Builtin::NinoUk => crate::national_id::nino_uk,
            Builtin::NirFr => crate::national_id::nir_fr,
            Builtin::TaxIdDe => crate::national_id::tax_id_de,
            Builtin::MyNumberJp => crate::national_id::my_number_jp,
            Builtin::OpenAiKey => openai_key,
            Builtin::AwsAccessKey => aws_key,
            Builtin::Jwt => jwt,
            Builtin::Email
            | Builtin::Ipv6
            | Builtin::PrivateKey
            | Builtin::PersonName
            | Builtin::StreetAddress => return None,
        };
        Some((first, try_at))
    }
}

/// Several anchored built-ins run in one pass over the text: a table from byte value to the
/// set of scanners that may start there, so a byte no scanner cares about (most of prose)
/// costs one lookup instead of one test per scanner. Each scanner keeps its own resume
/// position, so the spans are exactly those of running [`Builtin::find`] for each one.
#[derive(Debug, Clone)]
pub struct Sweep {
    /// (scanner, caller's tag) for at most 32 anchored scanners.
    scanners: Vec<(Matcher, usize)>,
    /// Byte value -> bit set of `scanners` whose first-byte test passes.
    starts: Box<[u32; 256]>,
    /// Byte value -> bit set of `scanners` that may start right before it: those whose
    /// matcher rejects every other second byte ([`Builtin::second_byte`]) and all others.
    seconds: Box<[u32; 256]>,
    /// Scanners that can only start at a pair of bytes ([`Builtin::pair`]; not in
    /// `starts`): each runs at the pair's occurrences, found by a search of its own.
    pairs: Vec<(usize, [u8; 2], u8)>,
    /// No scanner in `starts` begins at an ASCII lower-case letter or a space: runs of
    /// those (most of prose) are skipped eight bytes per step.
    skip_prose: bool,
}

impl Sweep {
    /// A sweep over the anchored built-ins among `(builtin, tag)`: the others (scanners with
    /// a scan of their own, and any past the 32nd) are left to [`Builtin::find`]; see
    /// [`Sweep::covers`].
    pub fn new(builtins: &[(Builtin, usize)]) -> Sweep {
        let mut sweep = Sweep {
            scanners: Vec::new(),
            starts: Box::new([0; 256]),
            seconds: Box::new([0; 256]),
            pairs: Vec::new(),
            skip_prose: false,
        };
        for &(builtin, tag) in builtins {
            let Some((first, try_at)) = builtin.anchored() else {
                continue;
            };
            if sweep.scanners.len() == 32 {
                break;
            }
            if let Some((pair, needs)) = builtin.pair() {
                sweep.pairs.push((sweep.scanners.len(), pair, needs));
                sweep.scanners.push((try_at, tag));
                continue;
            }
            let bit = 1u32 << sweep.scanners.len();
            for (value, set) in (0u8..=255).zip(sweep.starts.iter_mut()) {
                if first(value) {
                    *set |= bit;
                }
            }
            let second = builtin.second_byte();
            for (value, set) in (0u8..=255).zip(sweep.seconds.iter_mut()) {
                if second.is_none_or(|second| second(value)) {
                    *set |= bit;
                }
            }
            sweep.scanners.push((try_at, tag));
        }
        sweep.skip_prose = (b'a'..=b'z')
            .chain([b' '])
            .all(|c| sweep.starts.get(usize::from(c)) == Some(&0));
        sweep
    }

    /// Whether the sweep runs the scanner tagged `tag`.
    pub fn covers(&self, tag: usize) -> bool {
        self.scanners.iter().any(|&(_, t)| t == tag)
    }

    /// Calls `found(tag, span)` for every match of every scanner, each scanner's matches in
    /// order and not overlapping one another.
    pub fn find(&self, text: &str, found: &mut dyn FnMut(usize, Range<usize>)) {
        self.find_in(text, Present::ALL, found);
    }

    /// [`find`](Self::find) in text whose [`Present`] bytes are known: a pair scanner whose
    /// other byte the text lacks is not run (the spans are the same).
    pub(crate) fn find_in(
        &self,
        text: &str,
        present: Present,
        found: &mut dyn FnMut(usize, Range<usize>),
    ) {
        if self.scanners.is_empty() {
            return;
        }
        let b = text.as_bytes();
        // per scanner: no match of it starts before this position
        let mut resume = [0usize; 32];
        let mut i = 0;
        while i < b.len() {
            if self.skip_prose {
                i = next_not_lower_or_space(b, i);
            }
            let Some(&c) = b.get(i) else {
                break;
            };
            let mut set = self.starts.get(usize::from(c)).copied().unwrap_or(0);
            if set == 0 {
                i += 1;
                continue; // most bytes of prose
            }
            set &= self
                .seconds
                .get(usize::from(at(b, i + 1)))
                .copied()
                .unwrap_or(0);
            while set != 0 {
                let k = set.trailing_zeros() as usize;
                set &= set - 1;
                let (Some(&(try_at, tag)), Some(from)) = (self.scanners.get(k), resume.get_mut(k))
                else {
                    continue;
                };
                if i < *from {
                    continue;
                }
                match try_at(b, i) {
                    Step::Match(end) if end > i => {
                        found(tag, i..end);
                        *from = end;
                    }
                    Step::Skip(next) if next > i => *from = next,
                    _ => {}
                }
            }
            i += 1;
        }
        // each pair scanner where its pair occurs, with its own resume position
        for &(k, pair, needs) in &self.pairs {
            let Some(&(try_at, tag)) = self.scanners.get(k) else {
                continue;
            };
            if !present.has(needs) {
                continue;
            }
            let mut i = 0;
            while let Some(p) = find_pair(b, i, pair) {
                i = match try_at(b, p) {
                    Step::Match(end) if end > p => {
                        found(tag, p..end);
                        end
                    }
                    Step::Skip(next) if next > p => next,
                    _ => p + 1,
                };
            }
        }
    }
}

/// A detector of a rule.
#[derive(Debug, Clone)]
pub enum Detector {
    /// A built-in scanner.
    Builtin(Builtin),
    /// A user pattern (also used for deny words, compiled into one alternation).
    Regex(regex_lite::Regex),
}

impl Detector {
    /// Calls `found` with the span of every non-empty match in `text`.
    pub fn find(&self, text: &str, found: &mut dyn FnMut(Range<usize>)) {
        match self {
            Detector::Builtin(b) => b.find(text, found),
            Detector::Regex(re) => {
                for m in re.find_iter(text) {
                    if !m.range().is_empty() {
                        found(m.range());
                    }
                }
            }
        }
    }

    /// [`find`](Self::find) in text whose [`Present`] bytes are known
    /// ([`Builtin::find_in`]).
    pub(crate) fn find_in(
        &self,
        text: &str,
        present: Present,
        found: &mut dyn FnMut(Range<usize>),
    ) {
        match self {
            Detector::Builtin(b) => b.find_in(text, present, found),
            Detector::Regex(_) => self.find(text, found),
        }
    }
}

/// The regex of a deny-word list: any of the words, case-insensitive, as whole words where a
/// word begins or ends with an ASCII letter or digit.
pub fn deny_words_pattern(words: &[String]) -> String {
    let alternatives: Vec<String> = words
        .iter()
        .map(|w| {
            let lead = w.chars().next().is_some_and(|c| c.is_ascii_alphanumeric());
            let tail = w.chars().last().is_some_and(|c| c.is_ascii_alphanumeric());
            format!(
                "{}{}{}",
                if lead { r"\b" } else { "" },
                regex_lite::escape(w),
                if tail { r"\b" } else { "" }
            )
        })
        .collect();
    format!("(?i)(?:{})", alternatives.join("|"))
}

/// Runs `try_at` at every position whose byte can begin a match (`first`); on a match,
/// reports it and continues after its end. Every `try_at` reads a bounded number of bytes, or
/// (for runs) returns how far it read so the scan skips them.
fn starts(
    b: &[u8],
    found: &mut dyn FnMut(Range<usize>),
    first: fn(u8) -> bool,
    try_at: fn(&[u8], usize) -> Step,
) {
    let mut i = 0;
    while let Some(off) = b
        .get(i..)
        .and_then(|rest| rest.iter().position(|&c| first(c)))
    {
        i += off;
        match try_at(b, i) {
            Step::Match(end) if end > i => {
                found(i..end);
                i = end;
            }
            Step::Skip(next) if next > i => i = next,
            _ => i += 1,
        }
    }
}

/// Tries a match at a position.
pub(crate) type Matcher = fn(&[u8], usize) -> Step;

/// Whether a byte can begin a match.
pub(crate) type FirstByte = fn(u8) -> bool;

// ---------------------------------------------------------------------------------------
// E-mail

fn is_local(c: u8) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, b'.' | b'_' | b'%' | b'+' | b'-')
}

fn is_domain(c: u8) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, b'.' | b'-')
}

fn email(b: &[u8], found: &mut dyn FnMut(Range<usize>)) {
    // `floor`: the left scan never goes below it (the previous '@' or match end), so every
    // byte is scanned left at most once and right at most once.
    let mut floor = 0;
    let mut i = 0;
    while let Some(at_sign) = find_byte(b, i, b'@') {
        let mut s = at_sign;
        while s > floor && is_local(before(b, s)) {
            s -= 1;
        }
        while s < at_sign && at(b, s) == b'.' {
            s += 1;
        }
        let mut e = at_sign + 1;
        while is_domain(at(b, e)) {
            e += 1;
        }
        while e > at_sign + 1 && matches!(before(b, e), b'.' | b'-') {
            e -= 1;
        }
        let domain = b.get(at_sign + 1..e).unwrap_or_default();
        if s < at_sign && valid_domain(domain) && before(b, at_sign) != b'.' {
            found(s..e);
            floor = e;
            i = e;
        } else {
            floor = at_sign + 1;
            i = at_sign + 1;
        }
    }
}

fn valid_domain(d: &[u8]) -> bool {
    let mut labels = 0;
    let mut last: &[u8] = &[];
    for label in d.split(|&c| c == b'.') {
        if label.is_empty() || label.first() == Some(&b'-') || label.last() == Some(&b'-') {
            return false;
        }
        labels += 1;
        last = label;
    }
    labels >= 2 && last.len() >= 2 && last.iter().all(u8::is_ascii_alphabetic)
}

// ---------------------------------------------------------------------------------------
// Phones

fn phone_cn(b: &[u8], i: usize) -> Step {
    let c = at(b, i);
    if !(c == b'+' || is_digit(c)) || is_word(before(b, i)) || before(b, i) == b'+' {
        return Step::No;
    }
    let mut p = i;
    if b.get(p..p + 3) == Some(b"+86") {
        p += 3;
    } else if b.get(p..p + 4) == Some(b"0086") {
        p += 4;
    } else if c == b'+' {
        return Step::No;
    }
    if p > i && matches!(at(b, p), b' ' | b'-') {
        p += 1;
    }
    if at(b, p) != b'1' || !matches!(at(b, p + 1), b'3'..=b'9') {
        return Step::No;
    }
    let e3 = digits_from(b, p, 3);
    if e3 != p + 3 {
        return Step::No;
    }
    // 3-4-4 with one separator kind, or 11 digits in a row
    let sep = at(b, e3);
    let end = if matches!(sep, b' ' | b'-') {
        let e7 = digits_from(b, e3 + 1, 4);
        if e7 != e3 + 5 || at(b, e7) != sep {
            return Step::No;
        }
        let e11 = digits_from(b, e7 + 1, 4);
        if e11 != e7 + 5 {
            return Step::No;
        }
        e11
    } else {
        let e11 = digits_from(b, e3, 8);
        if e11 != e3 + 8 {
            return Step::No;
        }
        e11
    };
    if is_word(at(b, end)) {
        return Step::No;
    }
    Step::Match(end)
}

fn phone_e164(b: &[u8], i: usize) -> Step {
    if at(b, i) != b'+' || is_word(before(b, i)) || !matches!(at(b, i + 1), b'1'..=b'9') {
        return Step::No;
    }
    let mut p = i + 1;
    let mut count = 0;
    let mut end = p;
    while count <= 15 {
        let c = at(b, p);
        if is_digit(c) {
            count += 1;
            p += 1;
            end = p;
        } else if matches!(c, b' ' | b'-' | b'.') && is_digit(at(b, p + 1)) && p > i + 1 {
            p += 1;
        } else {
            break;
        }
    }
    if !(8..=15).contains(&count) || is_word(at(b, end)) {
        return Step::No;
    }
    Step::Match(end)
}

// ---------------------------------------------------------------------------------------
// PRC resident ID (GB 11643-1999)

const ID_WEIGHTS: [u32; 17] = [7, 9, 10, 5, 8, 4, 2, 1, 6, 3, 7, 9, 10, 5, 8, 4, 2];
const ID_CHECK: &[u8; 11] = b"10X98765432";

/// True if the 18 characters are a valid resident ID number (check digit and birth date).
pub fn valid_id_cn(id: &[u8]) -> bool {
    if id.len() != 18 || !id.iter().take(17).all(|c| c.is_ascii_digit()) {
        return false;
    }
    let num = |r: Range<usize>| {
        id.get(r)
            .unwrap_or_default()
            .iter()
            .fold(0u32, |a, &c| a * 10 + u32::from(c - b'0'))
    };
    let (year, month, day) = (num(6..10), num(10..12), num(12..14));
    if !(1800..=2199).contains(&year) || !(1..=12).contains(&month) || !(1..=31).contains(&day) {
        return false;
    }
    if at(id, 0) == b'0' {
        return false;
    }
    let sum: u32 = id
        .iter()
        .zip(ID_WEIGHTS)
        .map(|(&c, w)| u32::from(c - b'0') * w)
        .sum();
    let expected = ID_CHECK.get((sum % 11) as usize).copied().unwrap_or(0);
    at(id, 17).to_ascii_uppercase() == expected
}

fn id_cn(b: &[u8], i: usize) -> Step {
    if !is_digit(at(b, i)) || is_word(before(b, i)) {
        return Step::No;
    }
    let e = digits_from(b, i, 18);
    let end = match e - i {
        18 => e,
        17 if matches!(at(b, e), b'X' | b'x') => e + 1,
        _ => return Step::Skip(digits_from(b, i, usize::MAX)),
    };
    if is_word(at(b, end)) {
        return Step::Skip(end);
    }
    match b.get(i..end) {
        Some(id) if valid_id_cn(id) => Step::Match(end),
        _ => Step::Skip(end),
    }
}

// ---------------------------------------------------------------------------------------
// IP addresses

fn ipv4(b: &[u8], i: usize) -> Step {
    if !is_digit(at(b, i)) || is_word(before(b, i)) || before(b, i) == b'.' {
        return Step::No;
    }
    let mut p = i;
    for part in 0..4 {
        if part > 0 {
            if at(b, p) != b'.' {
                return Step::No;
            }
            p += 1;
        }
        let e = digits_from(b, p, 4);
        let len = e - p;
        if len == 0 || len > 3 || (len > 1 && at(b, p) == b'0') {
            return Step::No;
        }
        let v = b
            .get(p..e)
            .unwrap_or_default()
            .iter()
            .fold(0u32, |a, &c| a * 10 + u32::from(c - b'0'));
        if v > 255 {
            return Step::No;
        }
        p = e;
    }
    if is_word(at(b, p)) || (at(b, p) == b'.' && is_digit(at(b, p + 1))) {
        return Step::No;
    }
    // `version 1.2.3.4`, `build 10.0.0.1`: a four-part version number, not an address
    if context_before(b, i, &VERSION_WORDS, 16) {
        return Step::No;
    }
    Step::Match(p)
}

/// Words before a dotted quad that make it a version number (lower case).
const VERSION_WORDS: Words = Words::new(&[b"version", b"release", b"build", b"firmware"]);

fn is_ipv6_char(c: u8) -> bool {
    c.is_ascii_hexdigit() || c == b':' || c == b'.'
}

/// IPv6 candidates all contain a `:`: jump from colon to colon, take the run of address
/// characters around it once, and validate it.
fn ipv6_runs(b: &[u8], found: &mut dyn FnMut(Range<usize>)) {
    let mut done = 0; // bytes before this were part of a run already looked at
    let mut i = 0;
    while let Some(colon) = find_byte(b, i, b':') {
        let mut start = colon;
        while start > done && is_ipv6_char(before(b, start)) {
            start -= 1;
        }
        // the run may begin with '.' characters that cannot start an address
        while start < colon && at(b, start) == b'.' {
            start += 1;
        }
        let end = match ipv6(b, start) {
            Step::Match(end) => {
                found(start..end);
                end
            }
            Step::Skip(end) => end,
            Step::No => {
                let mut e = colon;
                while is_ipv6_char(at(b, e)) {
                    e += 1;
                }
                e
            }
        };
        done = end.max(colon + 1);
        i = done;
    }
}

fn ipv6(b: &[u8], i: usize) -> Step {
    let c = at(b, i);
    if !(c.is_ascii_hexdigit() || c == b':') {
        return Step::No;
    }
    let prev = before(b, i);
    if is_word(prev) || prev == b':' || prev == b'.' {
        return Step::No;
    }
    let mut e = i;
    while at(b, e).is_ascii_hexdigit() || matches!(at(b, e), b':' | b'.') {
        e += 1;
    }
    let run_end = e;
    if is_word(at(b, e)) || e - i > 45 {
        return Step::Skip(run_end);
    }
    // a sentence may end right after an address
    while e > i && before(b, e) == b'.' {
        e -= 1;
    }
    let run = b.get(i..e).unwrap_or_default();
    let colons = run.iter().filter(|&&c| c == b':').count();
    if colons < 2 || !run.iter().any(u8::is_ascii_hexdigit) {
        return Step::Skip(run_end);
    }
    let valid = std::str::from_utf8(run)
        .ok()
        .and_then(|s| Ipv6Addr::from_str(s).ok())
        .is_some();
    if valid {
        Step::Match(e)
    } else {
        Step::Skip(run_end)
    }
}

// ---------------------------------------------------------------------------------------
// Secrets

fn is_key_char(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_' || c == b'-'
}

fn key_run(b: &[u8], from: usize) -> usize {
    let mut e = from;
    while is_key_char(at(b, e)) {
        e += 1;
    }
    e
}

fn openai_key(b: &[u8], i: usize) -> Step {
    if b.get(i..i + 3) != Some(b"sk-") || is_key_char(before(b, i)) {
        return Step::No;
    }
    let end = key_run(b, i + 3);
    let body = b.get(i + 3..end).unwrap_or_default();
    // at least 20 key characters, not all one kind of filler
    if body.len() >= 20 && body.iter().filter(|c| c.is_ascii_alphanumeric()).count() >= 16 {
        Step::Match(end)
    } else {
        Step::Skip(end)
    }
}

fn aws_key(b: &[u8], i: usize) -> Step {
    let prefix = b.get(i..i + 4);
    if !matches!(prefix, Some(b"AKIA" | b"ASIA")) || is_word(before(b, i)) {
        return Step::No;
    }
    let body = b.get(i + 4..i + 20).unwrap_or_default();
    if body.len() == 16
        && body
            .iter()
            .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit())
        && !is_word(at(b, i + 20))
    {
        Step::Match(i + 20)
    } else {
        Step::No
    }
}

fn jwt(b: &[u8], i: usize) -> Step {
    if b.get(i..i + 3) != Some(b"eyJ") || is_key_char(before(b, i)) {
        return Step::No;
    }
    let e1 = key_run(b, i);
    if e1 - i < 10 || at(b, e1) != b'.' || b.get(e1 + 1..e1 + 4) != Some(b"eyJ") {
        return Step::Skip(e1);
    }
    let e2 = key_run(b, e1 + 1);
    if at(b, e2) != b'.' {
        return Step::Skip(e2);
    }
    let e3 = key_run(b, e2 + 1);
    Step::Match(e3)
}

fn private_key(text: &str, found: &mut dyn FnMut(Range<usize>)) {
    const BEGIN: &[u8] = b"-----BEGIN ";
    const END: &[u8] = b"-----END ";
    const DASHES: &[u8] = b"-----";
    // byte searches (a word at a time to each `-`) rather than `str::find`, whose
    // substring search costs more per byte of prose in wasm; the needles are ASCII, so the
    // positions are the same and on `char` boundaries
    let b = text.as_bytes();
    let mut i = 0;
    while let Some(start) = find_bytes(b, i, BEGIN) {
        let label_from = start + BEGIN.len();
        let Some(label_end) = find_bytes(b, label_from, DASHES) else {
            return;
        };
        let label = b.get(label_from..label_end).unwrap_or_default();
        let after_begin = label_end + DASHES.len();
        if !label.ends_with(b"PRIVATE KEY") || label.len() > 40 {
            i = label_from;
            continue;
        }
        // no END after this BEGIN means none after any later BEGIN either: stop
        let Some(end_at) = find_bytes(b, after_begin, END) else {
            return;
        };
        let Some(close) = find_bytes(b, end_at + END.len(), DASHES) else {
            return;
        };
        let end = close + DASHES.len();
        found(start..end);
        i = end;
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// The scan of PEM blocks before it searched bytes ([`private_key`] must find the same).
    fn private_key_by_str(text: &str, found: &mut dyn FnMut(Range<usize>)) {
        const BEGIN: &str = "-----BEGIN ";
        const END: &str = "-----END ";
        const DASHES: &str = "-----";
        let mut i = 0;
        while let Some(off) = text.get(i..).and_then(|t| t.find(BEGIN)) {
            let start = i + off;
            let label_from = start + BEGIN.len();
            let Some(label_len) = text.get(label_from..).and_then(|t| t.find(DASHES)) else {
                return;
            };
            let label = text.get(label_from..label_from + label_len).unwrap_or("");
            let after_begin = label_from + label_len + DASHES.len();
            if !label.ends_with("PRIVATE KEY") || label.len() > 40 {
                i = label_from;
                continue;
            }
            // no END after this BEGIN means none after any later BEGIN either: stop
            let Some(end_off) = text.get(after_begin..).and_then(|t| t.find(END)) else {
                return;
            };
            let end_label = after_begin + end_off + END.len();
            let Some(close) = text.get(end_label..).and_then(|t| t.find(DASHES)) else {
                return;
            };
            let end = end_label + close + DASHES.len();
            found(start..end);
            i = end;
        }
    }

    /// The text of every match of `b` in `text` (the detector modules' tests use it too).
    pub(crate) fn hits(b: Builtin, text: &str) -> Vec<&str> {
        let mut out = Vec::new();
        b.find(text, &mut |r| out.push(&text[r]));
        out
    }

    #[test]
    fn email() {
        assert_eq!(
            hits(Builtin::Email, "mail a.b+c@ex-ample.co.uk, or x@y.io."),
            ["a.b+c@ex-ample.co.uk", "x@y.io"]
        );
        for no in [
            "a@b", "@x.com", "a@.com", "a@b.c", "a@b..com", "a@-b.com", "a@b.c0m", "a.@b.com",
        ] {
            assert_eq!(hits(Builtin::Email, no), Vec::<&str>::new(), "{no}");
        }
        assert_eq!(hits(Builtin::Email, "x@@a.com b@c.org"), ["b@c.org"]);
        assert_eq!(
            hits(Builtin::Email, "邮箱zhang@corp.cn谢谢"),
            ["zhang@corp.cn"]
        );
    }

    #[test]
    fn phone_cn() {
        assert_eq!(
            hits(
                Builtin::PhoneCn,
                "tel 13800138000, +86 139-1234-5678, 0086 15012345678 and 138 0013 8000"
            ),
            [
                "13800138000",
                "+86 139-1234-5678",
                "0086 15012345678",
                "138 0013 8000"
            ]
        );
        for no in [
            "12800138000",
            "138001380001",
            "a13800138000",
            "138-0013 8000",
            "1380013800",
            "+8613800138000x",
        ] {
            assert_eq!(hits(Builtin::PhoneCn, no), Vec::<&str>::new(), "{no}");
        }
        assert_eq!(hits(Builtin::PhoneCn, "电话13800138000。"), ["13800138000"]);
    }

    #[test]
    fn phone_e164() {
        assert_eq!(
            hits(Builtin::PhoneE164, "call +1 415-555-2671 or +442071838750."),
            ["+1 415-555-2671", "+442071838750"]
        );
        for no in [
            "+0123456789",
            "+1234567",
            "+1234567890123456",
            "a+12345678901",
            "+ 1234567890",
        ] {
            assert_eq!(hits(Builtin::PhoneE164, no), Vec::<&str>::new(), "{no}");
        }
    }

    #[test]
    fn id_cn_check_digit() {
        // 11010519491231002X: the GB 11643 example
        assert!(valid_id_cn(b"11010519491231002X"));
        assert!(valid_id_cn(b"11010519491231002x"));
        assert!(!valid_id_cn(b"110105194912310021"));
        assert_eq!(
            hits(Builtin::IdCn, "ID 11010519491231002X, 440524188001010014."),
            ["11010519491231002X", "440524188001010014"]
        );
        // a random 18-digit number that fails the check is not an ID
        for no in [
            "123456789012345678",
            "110105194913310028",
            "11010519491231002X1",
            "A11010519491231002X",
        ] {
            assert_eq!(hits(Builtin::IdCn, no), Vec::<&str>::new(), "{no}");
        }
    }

    #[test]
    fn card_luhn() {
        assert!(luhn(b"4111111111111111"));
        assert!(!luhn(b"4111111111111112"));
        assert_eq!(
            hits(
                Builtin::Card,
                "visa 4111 1111 1111 1111, amex 378282246310005; mc 5555-5555-5555-4444"
            ),
            [
                "4111 1111 1111 1111",
                "378282246310005",
                "5555-5555-5555-4444"
            ]
        );
        for no in [
            "4111111111111112",
            "4111-1111 1111 1111",
            "411111111111",
            "41111111111111111111",
            "9111111111111111",
        ] {
            assert_eq!(hits(Builtin::Card, no), Vec::<&str>::new(), "{no}");
        }
    }

    #[test]
    fn ip_addresses() {
        assert_eq!(
            hits(Builtin::Ipv4, "from 10.0.0.1 to 192.168.255.254."),
            ["10.0.0.1", "192.168.255.254"]
        );
        for no in [
            "256.1.1.1",
            "1.2.3",
            "1.2.3.4.5",
            "01.2.3.4",
            "v1.2.3.4",
            "version 1.2.3.4",
            "Build 10.0.0.1",
        ] {
            assert_eq!(hits(Builtin::Ipv4, no), Vec::<&str>::new(), "{no}");
        }
        assert_eq!(
            hits(
                Builtin::Ipv6,
                "at 2001:db8::8a2e:370:7334, fe80::1 and ::ffff:10.0.0.1."
            ),
            ["2001:db8::8a2e:370:7334", "fe80::1", "::ffff:10.0.0.1"]
        );
        for no in [
            "12:30:45",
            "std::io",
            "::",
            "deadbeef",
            "1::2::3",
            "2001:db8::g1",
        ] {
            assert_eq!(hits(Builtin::Ipv6, no), Vec::<&str>::new(), "{no}");
        }
    }

    #[test]
    fn secrets() {
        let key = "sk-proj-AbCdEfGhIjKlMnOpQrStUvWx1234";
        assert_eq!(hits(Builtin::OpenAiKey, &format!("key={key} ok")), [key]);
        assert_eq!(hits(Builtin::OpenAiKey, "task-sk-abc"), Vec::<&str>::new());
        assert_eq!(hits(Builtin::OpenAiKey, "sk-short"), Vec::<&str>::new());
        assert_eq!(
            hits(Builtin::AwsAccessKey, "id AKIAIOSFODNN7EXAMPLE."),
            ["AKIAIOSFODNN7EXAMPLE"]
        );
        assert_eq!(
            hits(Builtin::AwsAccessKey, "AKIAIOSFODNN7EXAMPLEX"),
            Vec::<&str>::new()
        );
        let jwt = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0In0.sig-_nature";
        assert_eq!(hits(Builtin::Jwt, &format!("Bearer {jwt}")), [jwt]);
        assert_eq!(
            hits(Builtin::Jwt, "eyJhbGciOiJIUzI1NiJ9.notjwt.x"),
            Vec::<&str>::new()
        );
        let pem = "-----BEGIN RSA PRIVATE KEY-----\nMIIEow\n-----END RSA PRIVATE KEY-----";
        assert_eq!(hits(Builtin::PrivateKey, &format!("k:\n{pem}\n")), [pem]);
        assert_eq!(
            hits(
                Builtin::PrivateKey,
                "-----BEGIN PUBLIC KEY-----\nx\n-----END PUBLIC KEY-----"
            ),
            Vec::<&str>::new()
        );
        assert_eq!(
            hits(Builtin::PrivateKey, "-----BEGIN PRIVATE KEY-----\nx"),
            Vec::<&str>::new()
        );
    }

    #[test]
    fn deny_words() {
        let re = regex_lite::Regex::new(&deny_words_pattern(&[
            "Project X".into(),
            "机密".into(),
            "a.b".into(),
        ]))
        .unwrap();
        let d = Detector::Regex(re);
        let text = "about project x and 机密资料, not aXb or project xy";
        let mut out = Vec::new();
        d.find(text, &mut |r| out.push(&text[r]));
        assert_eq!(out, ["project x", "机密"]);
    }

    #[test]
    fn scanners_survive_adversarial_input() {
        // long runs of the bytes the scanners key on; linear time keeps this fast
        let inputs = [
            "@".repeat(10_000),
            "a@".repeat(10_000),
            "1".repeat(10_000),
            "1 ".repeat(10_000),
            "1.".repeat(10_000),
            ":".repeat(10_000),
            "a:".repeat(10_000),
            "+1".repeat(10_000),
            "sk-".repeat(10_000),
            "eyJ.".repeat(10_000),
            "-----BEGIN PRIVATE KEY-----".repeat(1_000),
            "(0)".repeat(10_000),
            "+44 ".repeat(10_000),
            "DE89 ".repeat(10_000),
            "AB 12 ".repeat(10_000),
            "call 0".repeat(10_000),
            // names and addresses: Title Case, cues, CJK runs, street shapes
            "John Smith ".repeat(2_000),
            "Mr ".repeat(5_000),
            "Dear John, ".repeat(2_000),
            "王李张".repeat(3_000),
            "井上 ".repeat(3_000),
            "省市区路号".repeat(2_000),
            "1 Main Street ".repeat(2_000),
            "12, rue ".repeat(2_000),
            "Weg 1 ".repeat(2_000),
            "〒123-4567".repeat(1_000),
        ];
        for text in &inputs {
            for b in Builtin::ALL {
                b.find(text, &mut |r| assert!(text.get(r).is_some()));
            }
        }
    }

    /// Every built-in's spans, one `find` per built-in (the reference for the sweep).
    fn one_by_one(text: &str) -> Vec<(usize, Range<usize>)> {
        let mut out = Vec::new();
        for (tag, b) in Builtin::ALL.into_iter().enumerate() {
            b.find(text, &mut |r| out.push((tag, r)));
        }
        out.sort_by_key(|(tag, r)| (*tag, r.start));
        out
    }

    /// The sweep's spans plus those of the built-ins it leaves to their own scan.
    fn swept(text: &str) -> Vec<(usize, Range<usize>)> {
        let all: Vec<(Builtin, usize)> = Builtin::ALL.into_iter().zip(0..).collect();
        let sweep = Sweep::new(&all);
        let mut out = Vec::new();
        sweep.find(text, &mut |tag, r| out.push((tag, r)));
        for (b, tag) in all {
            if !sweep.covers(tag) {
                b.find(text, &mut |r| out.push((tag, r)));
            }
        }
        out.sort_by_key(|(tag, r)| (*tag, r.start));
        out
    }

    #[test]
    fn the_sweep_finds_what_each_scanner_finds() {
        let text = format!(
            "{} sk-proj-abcdefghijklmnopqrstuv AKIAABCDEFGHIJKLMNOP +86 138 0013 8000 \
             +44 20 7946 0958 11010519491231002X 4111 1111 1111 1111 192.168.0.1 \
             eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.c2lnbmF0dXJl a.b@example.com fe80::1 \
             13800138000 5555555555554444 +1 (415) 555-0132 01632 960 367 080-9718-5680 \
             DE89 3704 0044 0532 0130 00 GB82WEST12345698765432 123-45-6789 AB 12 34 56 C \
             1 85 05 78 006 084 91 86095742719 1234 5678 9018 card 501800000009",
            "The quick brown fox. ".repeat(20)
        );
        let expected = one_by_one(&text);
        assert!(expected.len() >= 22, "the sample has matches: {expected:?}");
        assert_eq!(swept(&text), expected);
        let all: Vec<(Builtin, usize)> = Builtin::ALL.into_iter().zip(0..).collect();
        let sweep = Sweep::new(&all);
        assert!(!sweep.covers(0), "private_key has its own scan");
        assert!(sweep.covers(1), "jwt is anchored");
    }

    proptest::proptest! {
        /// Skipping the scanners whose byte a text lacks changes no span of any built-in.
        #[test]
        fn find_in_present_bytes_equals_find(parts in proptest::collection::vec(
            proptest::prop_oneof![
                proptest::strategy::Just("a@x.com "),
                proptest::strategy::Just("a(at)x.com "),
                proptest::strategy::Just("fe80::1 "),
                proptest::strategy::Just("fe80 1 "),
                proptest::strategy::Just("-----BEGIN RSA PRIVATE KEY-----\nMII\n-----END RSA PRIVATE KEY-----"),
                proptest::strategy::Just("BEGIN RSA PRIVATE KEY\nMII\nEND RSA PRIVATE KEY"),
                proptest::strategy::Just("12 rue de la Paix\n75002 Paris"),
                proptest::strategy::Just("rue de la Paix\nParis"),
                proptest::strategy::Just("Schillerstraße 5 "),
                proptest::strategy::Just("送到朝阳区建国路88号"),
                proptest::strategy::Just("[EMAIL_1] "),
                proptest::strategy::Just("John Smith "),
                proptest::strategy::Just("The quarterly review covers onboarding, "),
                proptest::strategy::Just("follow-up "),
                proptest::strategy::Just("sk-proj-abcdefghijklmnopqrstuv "),
                proptest::strategy::Just("sk proj abcdefghijklmnopqrstuv "),
                proptest::strategy::Just("eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.sig "),
                proptest::strategy::Just("eyhbGciOiIUzI1Ni9.eyzdWIiOiIxIn0.sig "),
            ], 0..10)) {
            let text: String = parts.concat();
            let present = Present::of(text.as_bytes());
            let all: Vec<(Builtin, usize)> = Builtin::ALL.into_iter().zip(0..).collect();
            let sweep = Sweep::new(&all);
            let (mut new, mut old) = (Vec::new(), Vec::new());
            sweep.find_in(&text, present, &mut |tag, r| new.push((tag, r)));
            sweep.find_in(&text, Present::ALL, &mut |tag, r| old.push((tag, r)));
            proptest::prop_assert_eq!(new, old);
            for b in Builtin::ALL {
                let (mut new, mut old) = (Vec::new(), Vec::new());
                b.find_in(&text, present, &mut |r| new.push(r));
                b.find(&text, &mut |r| old.push(r));
                proptest::prop_assert_eq!(new, old, "{:?}", b);
            }
        }

        /// The byte search of PEM blocks finds what the `str::find` one found, on text made of
        /// the markers' pieces, labels, prose and non-ASCII characters.
        #[test]
        fn private_key_equals_the_str_search(parts in proptest::collection::vec(
            proptest::prop_oneof![
                proptest::strategy::Just("-----BEGIN "),
                proptest::strategy::Just("-----END "),
                proptest::strategy::Just("-----"),
                proptest::strategy::Just("-"),
                proptest::strategy::Just("RSA PRIVATE KEY"),
                proptest::strategy::Just("PRIVATE KEY"),
                proptest::strategy::Just("CERTIFICATE"),
                proptest::strategy::Just("MIIEvQIBADANBg"),
                proptest::strategy::Just("\n"),
                proptest::strategy::Just(" follow-up é "),
                proptest::strategy::Just("ü-"),
            ], 0..24)) {
            let text: String = parts.concat();
            let (mut new, mut old) = (Vec::new(), Vec::new());
            private_key(&text, &mut |r| new.push(r));
            private_key_by_str(&text, &mut |r| old.push(r));
            proptest::prop_assert_eq!(new, old);
        }
    }

    proptest::proptest! {
        #[test]
        fn the_sweep_equals_scanning_one_by_one(
            text in "([0-9+ .:@eyJskA-]|sk-|AKIA|eyJ|\\+86|[a-z]{1,3}|[0-9]{3,4}|\\.|[()x/]|DE89|GB82|AB|2A|card|call|[A-Z]{2}[0-9]{2}){0,80}"
        ) {
            proptest::prop_assert_eq!(swept(&text), one_by_one(&text));
        }
    }
}
