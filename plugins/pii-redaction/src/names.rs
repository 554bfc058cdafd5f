//! `person_name`: personal names without a model — gazetteers of given names and surnames
//! plus context rules.
//!
//! * Latin script: a capitalised known given name followed by capitalised words (a middle
//!   name or initial, particles such as `von`, `van der`, `de la`, then a surname); where
//!   the given name is also an everyday word (`Will`, `April`, `Grant`) the surname must be a
//!   known one too. After an honorific (`Mr`, `Dr.`, `Herr`, `Mme`), a cue (`my name is`,
//!   `je m'appelle`, `ich heiße`, `Dear`) or a closing (`Best regards,`) any capitalised words
//!   are a name.
//! * Chinese: a surname (the classical 百家姓 list and today's most common ones) and one or
//!   two characters common in given names, with context: the name stands alone between
//!   punctuation, or a cue precedes or follows it (`我叫`, `给`, `帮…写`, `先生`, `的`).
//!   Surnames that are everyday words (`高`, `方`, `文`) need a strong cue (`姓名`, `先生`),
//!   a cue on both sides, or a three-character name standing alone.
//! * Japanese: a common surname, then a space and a given name (kanji or kana), or a given
//!   name of one or two kanji that ends the kanji run, or an honorific (`さん`, `様`).
//!
//! Data: `data/*.txt`, sorted, one lower-case, accent-folded entry per line, searched by
//! bisection in place (no allocation, no start-up cost); `data/README.md` says where each
//! list comes from. Spans start and end on `char` boundaries (they may be non-ASCII). Time is
//! linear: every word or character is looked at a bounded number of times, each lookup is
//! logarithmic in a fixed list.

use crate::scan::next_upper_or_non_ascii;
use std::ops::Range;
use std::sync::OnceLock;

const GIVEN_NAMES: &str = include_str!("../data/given_names.txt");
const SURNAMES: &str = include_str!("../data/surnames.txt");
const CN_SURNAMES: &str = include_str!("../data/cn_surnames.txt");
const CN_PROSE_SURNAMES: &str = include_str!("../data/cn_surnames_prose.txt");
const CN_GIVEN_CHARS: &str = include_str!("../data/cn_given_chars.txt");
const JA_SURNAMES: &str = include_str!("../data/ja_surnames.txt");

/// Calls `found` with every personal name in `text`, in order, not overlapping.
pub fn find(text: &str, found: &mut dyn FnMut(Range<usize>)) {
    let mut spans = Vec::new();
    latin_names(text, &mut |r| spans.push(r));
    if has_cjk(text) {
        cjk_names(text, &mut |r| spans.push(r));
    }
    spans.sort_by_key(|r| r.start);
    let mut end = 0;
    for span in spans {
        if span.start >= end {
            end = span.end;
            found(span);
        }
    }
}

/// Whether `text` may hold CJK characters (a UTF-8 lead byte of U+3000 or above); ASCII
/// text is ruled out a word at a time (`str::is_ascii`).
pub(crate) fn has_cjk(text: &str) -> bool {
    !text.is_ascii() && text.bytes().any(|b| b >= 0xE3)
}

/// Whether the sorted newline-separated `list` holds `word` (bisection over the bytes).
pub(crate) fn listed(list: &str, word: &str) -> bool {
    let b = list.as_bytes();
    let key = word.as_bytes();
    // lo and hi are always line starts
    let (mut lo, mut hi) = (0usize, b.len());
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        let start = b
            .get(lo..mid)
            .and_then(|s| s.iter().rposition(|&c| c == b'\n'))
            .map_or(lo, |p| lo + p + 1);
        let end = b
            .get(start..hi)
            .and_then(|s| s.iter().position(|&c| c == b'\n'))
            .map_or(hi, |p| start + p);
        let line = b.get(start..end).unwrap_or_default();
        match line.cmp(key) {
            std::cmp::Ordering::Equal => return true,
            std::cmp::Ordering::Less => lo = end + 1,
            std::cmp::Ordering::Greater => hi = start,
        }
    }
    false
}

/// Lower case with Latin accents folded to ASCII (`Jürgen` → `jurgen`, `Øre` → `ore`), as
/// the lists are stored; `None` for letters outside Latin-1 and Latin Extended-A.
fn fold_into(word: &str, out: &mut String) -> Option<()> {
    out.clear();
    for c in word.chars() {
        let lower = c.to_lowercase().next().unwrap_or(c);
        let folded: &str = match lower {
            'a'..='z' | '-' | '\'' => {
                out.push(lower);
                continue;
            }
            '’' => "'",
            'à'..='å' | 'ā' | 'ă' | 'ą' => "a",
            'æ' => "ae",
            'ç' | 'ć' | 'ĉ' | 'ċ' | 'č' => "c",
            'ď' | 'đ' | 'ð' => "d",
            'è'..='ë' | 'ē' | 'ĕ' | 'ė' | 'ę' | 'ě' => "e",
            'ĝ' | 'ğ' | 'ġ' | 'ģ' => "g",
            'ĥ' => "h",
            'ì'..='ï' | 'ĩ' | 'ī' | 'ĭ' | 'į' => "i",
            'ĵ' => "j",
            'ķ' => "k",
            'ĺ' | 'ļ' | 'ľ' | 'ŀ' | 'ł' => "l",
            'ñ' | 'ń' | 'ņ' | 'ň' => "n",
            'ò'..='ö' | 'ø' | 'ō' | 'ŏ' | 'ő' => "o",
            'œ' => "oe",
            'ŕ' | 'ŗ' | 'ř' => "r",
            'ß' => "ss",
            'ś' | 'ŝ' | 'ş' | 'š' => "s",
            'ţ' | 'ť' => "t",
            'þ' => "th",
            'ù'..='ü' | 'ũ' | 'ū' | 'ŭ' | 'ů' | 'ű' | 'ų' => "u",
            'ŵ' => "w",
            'ý' | 'ÿ' | 'ŷ' => "y",
            'ź' | 'ż' | 'ž' => "z",
            _ => return None,
        };
        out.push_str(folded);
    }
    Some(())
}

// ---------------------------------------------------------------------------------------
// Latin script

/// A word of Latin letters (inner `-`, `'`, `’` allowed) and what follows it.
#[derive(Debug, Clone)]
struct Word {
    span: Range<usize>,
    /// Upper-case first letter, then a lower-case letter (`John`, `McDonald`, `O'Neil`).
    capital: bool,
    /// A single capital with a dot after it (`J.`): a middle initial.
    initial: bool,
    /// What separates it from the next word.
    gap: Gap,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Gap {
    /// Spaces or tabs only.
    Space,
    /// `,` then spaces (a closing `Best regards, John`).
    Comma,
    /// A line break, with spaces or a comma (`Regards,\nJohn`).
    Line,
    /// Anything else (sentence end, digits, CJK, brackets…).
    Other,
}

fn is_latin_letter(c: char) -> bool {
    c.is_ascii_alphabetic() || (c.is_alphabetic() && ('\u{C0}'..='\u{24F}').contains(&c))
}

/// The words of `text`, each with the gap after it. The honorific `M.` keeps its dot out of
/// the word but is marked as an initial.
fn words(text: &str) -> Vec<Word> {
    let mut out: Vec<Word> = Vec::new();
    let mut chars = text.char_indices().peekable();
    while let Some((start, c)) = chars.next() {
        if !is_latin_letter(c) {
            continue;
        }
        let mut end = start + c.len_utf8();
        let mut second: Option<char> = None;
        let mut len = 1;
        while let Some(&(i, d)) = chars.peek() {
            if is_latin_letter(d) {
                chars.next();
                end = i + d.len_utf8();
                if second.is_none() {
                    second = Some(d);
                }
                len += 1;
                continue;
            }
            if matches!(d, '-' | '\'' | '’')
                && text
                    .get(i + d.len_utf8()..)
                    .and_then(|r| r.chars().next())
                    .is_some_and(is_latin_letter)
            {
                chars.next();
                end = i + d.len_utf8();
                continue;
            }
            break;
        }
        // a letter glued to digits or CJK is not a word of a name
        let rest = text.get(end..).unwrap_or_default();
        let next = rest.chars().next();
        let dot = next == Some('.');
        let capital = c.is_uppercase() && second.is_some_and(|s| s.is_lowercase() || s == '\'');
        let initial = len == 1 && c.is_uppercase() && dot;
        let after = if dot {
            rest.get(1..).unwrap_or_default()
        } else {
            rest
        };
        let gap = gap_after(after, dot);
        out.push(Word {
            span: start..end,
            capital,
            initial,
            gap,
        });
    }
    out
}

fn gap_after(rest: &str, dot: bool) -> Gap {
    let mut comma = false;
    let mut line = false;
    let mut spaces = 0;
    let mut next = None;
    for c in rest.chars() {
        match c {
            ' ' | '\t' => spaces += 1,
            ',' if !comma && !line => comma = true,
            '\n' | '\r' => line = true,
            _ => {
                next = Some(c);
                break;
            }
        }
        if spaces > 8 {
            break;
        }
    }
    // the next word must follow the gap directly (`Key | Type` is a table, not a name)
    if !next.is_some_and(is_latin_letter) {
        return Gap::Other;
    }
    if line {
        Gap::Line
    } else if comma && !dot {
        Gap::Comma
    } else if spaces > 0 && !comma {
        Gap::Space
    } else {
        Gap::Other
    }
}

/// Given names that are also everyday English words: after them the surname must be known.
const WEAK_GIVEN: &[&str] = &[
    "april",
    "art",
    "august",
    "bill",
    "bird",
    "buck",
    "chance",
    "chase",
    "christian",
    "clay",
    "dale",
    "dawn",
    "dean",
    "drew",
    "earl",
    "faith",
    "field",
    "ford",
    "frank",
    "gay",
    "glen",
    "grace",
    "grant",
    "guy",
    "hall",
    "harmony",
    "hope",
    "hunter",
    "iris",
    "ivy",
    "jack",
    "jade",
    "jay",
    "jean",
    "joy",
    "june",
    "king",
    "lane",
    "lee",
    "lily",
    "mark",
    "mason",
    "max",
    "may",
    "miles",
    "page",
    "pat",
    "pearl",
    "penny",
    "price",
    "ray",
    "reed",
    "rich",
    "rob",
    "rose",
    "ruby",
    "rusty",
    "sandy",
    "sky",
    "stone",
    "summer",
    "sunny",
    "victor",
    "wade",
    "ward",
    "will",
    "winter",
    "wood",
    "york",
];

/// Capitalised words that end a candidate instead of being a surname: places, organisations,
/// products, titles, calendar words.
const NOT_SURNAME: &[&str] = &[
    "academy",
    "api",
    "cloud",
    "code",
    "pro",
    "server",
    "airlines",
    "airways",
    "arena",
    "charts",
    "falls",
    "gate",
    "memorial",
    "monument",
    "motors",
    "stadium",
    "agency",
    "airport",
    "alley",
    "and",
    "app",
    "april",
    "avenue",
    "bank",
    "bay",
    "beach",
    "boulevard",
    "bridge",
    "building",
    "campus",
    "center",
    "centre",
    "church",
    "city",
    "club",
    "college",
    "company",
    "corp",
    "council",
    "county",
    "court",
    "day",
    "december",
    "department",
    "drive",
    "foundation",
    "friday",
    "garden",
    "gardens",
    "group",
    "harbor",
    "heights",
    "highway",
    "hospital",
    "hotel",
    "house",
    "inc",
    "institute",
    "island",
    "january",
    "lake",
    "lane",
    "library",
    "limited",
    "ltd",
    "mall",
    "market",
    "monday",
    "mountain",
    "museum",
    "office",
    "park",
    "place",
    "plaza",
    "project",
    "river",
    "road",
    "saturday",
    "school",
    "service",
    "services",
    "square",
    "station",
    "street",
    "studio",
    "sunday",
    "team",
    "theater",
    "theatre",
    "thursday",
    "tower",
    "tuesday",
    "university",
    "valley",
    "wednesday",
];

const PARTICLES: &[&str] = &[
    "da", "das", "de", "del", "della", "der", "des", "di", "do", "dos", "du", "la", "le", "ten",
    "ter", "van", "von", "zu",
];

const HONORIFICS: &[&str] = &[
    "Dr",
    "Frau",
    "Herr",
    "Madame",
    "Mademoiselle",
    "Miss",
    "Mlle",
    "Mme",
    "Monsieur",
    "Mr",
    "Mrs",
    "Ms",
    "Mx",
    "Prof",
    "Sir",
];

/// Word sequences after which capitalised words are a name.
const STRONG_CUES: &[&[&str]] = &[
    &["name", "is"],
    &["m'appelle"],
    &["m’appelle"],
    &["ich", "heiße"],
    &["ich", "heisse"],
    &["name", "ist"],
    &["nom", "est"],
    &["call", "me"],
];

/// Words after which a capitalised word is a name if it is a known given name, and two are.
const WEAK_CUES: &[&[&str]] = &[
    &["dear"],
    &["liebe"],
    &["lieber"],
    &["cher"],
    &["chère"],
    &["hello"],
    &["hi"],
    &["hallo"],
    &["bonjour"],
    &["i", "am"],
    &["i'm"],
    &["je", "suis"],
    &["ich", "bin"],
    &["signed"],
];

/// Closings after which (a comma or a line break, then) capitalised words are a name.
const CLOSINGS: &[&[&str]] = &[
    &["regards"],
    &["sincerely"],
    &["cheers"],
    &["cordialement"],
    &["grüße"],
    &["grüßen"],
    &["gruesse"],
    &["thanks"],
];

fn word_text<'t>(text: &'t str, w: &Word) -> &'t str {
    text.get(w.span.clone()).unwrap_or_default()
}

/// Bytes of text around a candidate that its rules read: the cue words before it, the
/// name's words after it.
const BACK: usize = 48;
const AHEAD: usize = 160;

fn latin_names(text: &str, found: &mut dyn FnMut(Range<usize>)) {
    let b = text.as_bytes();
    let mut fold = String::new();
    let mut i = 0;
    while i < b.len() {
        let c = b.get(i).copied().unwrap_or(0);
        if c.is_ascii() && !c.is_ascii_uppercase() {
            // only a capital or a non-ASCII letter can start a name: skip to the next one
            // (eight bytes per step)
            i = next_upper_or_non_ascii(b, i);
            continue;
        }
        // most bytes: not the start of a capitalised word
        let capital = c.is_ascii_uppercase()
            || ((0xC3..=0xC5).contains(&c) && char_at(text, i).is_some_and(char::is_uppercase));
        if !capital || char_before(text, i).is_some_and(is_word_char) || !worth_a_look(text, i) {
            i += 1;
            continue;
        }
        // the words of a window around it; every candidate in the window's first part is
        // decided with this one cut (so Title Case text is cut into words about twice)
        let from = floor_boundary(text, i.saturating_sub(BACK));
        let to = floor_boundary(text, (i + AHEAD).min(text.len()));
        let decided_to = if to == text.len() {
            to
        } else {
            floor_boundary(text, to - AHEAD / 2)
        };
        let window = text.get(from..to).unwrap_or_default();
        let words = words(window);
        let mut next = decided_to.max(i + 1);
        let mut k = words
            .iter()
            .position(|w| w.span.start + from >= i)
            .unwrap_or(words.len());
        while let Some(w) = words.get(k) {
            if w.span.start + from >= decided_to {
                break;
            }
            let named = if w.capital {
                let cue = cue_before(window, &words, k);
                name_at(window, &words, k, cue, &mut fold)
            } else {
                None
            };
            match named.and_then(|last| words.get(last).map(|l| (last, l.span.end))) {
                Some((last, end)) => {
                    found(w.span.start + from..end + from);
                    next = next.max(end + from);
                    k = last + 1;
                }
                None => k += 1,
            }
        }
        i = next;
    }
}

fn char_at(text: &str, i: usize) -> Option<char> {
    match text.as_bytes().get(i) {
        // an ASCII byte is a whole character (no decoding)
        Some(&c) if c.is_ascii() => Some(char::from(c)),
        _ => text.get(i..).and_then(|r| r.chars().next()),
    }
}

fn char_before(text: &str, i: usize) -> Option<char> {
    match i.checked_sub(1).and_then(|j| text.as_bytes().get(j)) {
        // an ASCII byte is a whole character, and the next one starts at `i`
        Some(&c) if c.is_ascii() && i <= text.len() => Some(char::from(c)),
        _ => text.get(..i).and_then(|r| r.chars().next_back()),
    }
}

fn is_word_char(c: char) -> bool {
    c.is_alphanumeric() || matches!(c, '\'' | '’' | '-' | '_')
}

fn floor_boundary(text: &str, mut i: usize) -> usize {
    while i > 0 && !text.is_char_boundary(i) {
        i -= 1;
    }
    i
}

/// The last words of cues ([`STRONG_CUES`], [`WEAK_CUES`], [`CLOSINGS`]), lower case.
const CUE_ENDS: &[&str] = &[
    "am",
    "bin",
    "bonjour",
    "cher",
    "cheers",
    "chère",
    "cordialement",
    "dear",
    "est",
    "gruesse",
    "grüße",
    "grüßen",
    "hallo",
    "heisse",
    "heiße",
    "hello",
    "hi",
    "i'm",
    "ist",
    "is",
    "liebe",
    "lieber",
    "m'appelle",
    "m’appelle",
    "me",
    "regards",
    "signed",
    "sincerely",
    "suis",
    "thanks",
];

/// A cheap test before the window is cut into words: the capitalised word at `i` is
/// followed by a capitalised word, an initial or a particle, or preceded by an honorific or
/// the end of a cue.
fn worth_a_look(text: &str, i: usize) -> bool {
    let b = text.as_bytes();
    let byte = |k: usize| b.get(k).copied().unwrap_or(0);
    let mut e = i;
    while let Some(c) = char_at(text, e) {
        if !(is_latin_letter(c) || (matches!(c, '\'' | '’' | '-') && e > i)) {
            break;
        }
        e += c.len_utf8();
    }
    // after: [.] spaces, then a capital or a particle
    let mut p = e;
    if byte(p) == b'.' {
        p += 1;
    }
    let spaces = p;
    while matches!(byte(p), b' ' | b'\t') && p - spaces < 3 {
        p += 1;
    }
    if p > spaces {
        if char_at(text, p).is_some_and(char::is_uppercase) {
            return true;
        }
        let next: &[u8] = b.get(p..).unwrap_or_default();
        let word_len = next.iter().take_while(|c| c.is_ascii_lowercase()).count();
        if next
            .get(..word_len)
            .is_some_and(|w| PARTICLES.iter().any(|x| x.as_bytes() == w))
        {
            return true;
        }
    }
    // before: a cue's last word, then spaces, a comma or a line break
    let mut s = i;
    while s > 0 && s + 4 > i && matches!(byte(s - 1), b' ' | b'\t' | b',' | b'\n' | b'\r') {
        s -= 1;
    }
    if s == i {
        return false;
    }
    if s > 0 && byte(s - 1) == b'.' {
        s -= 1; // `Dr. `, `M. `
    }
    let mut w = s;
    while w > 0
        && s - w < 14
        && char_before(text, w).is_some_and(|c| c.is_alphabetic() || c == '\'' || c == '’')
    {
        w -= char_before(text, w).map_or(1, char::len_utf8);
    }
    let prev = text.get(w..s).unwrap_or_default();
    !prev.is_empty()
        && (CUE_ENDS.iter().any(|c| prev.eq_ignore_ascii_case(c))
            || HONORIFICS.contains(&prev)
            || prev == "M")
}

/// What the words right before a candidate say about it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cue {
    /// Nothing: the first word must be a known given name.
    None,
    /// `Dear`, a closing line: one word must be a known given name, two capitalised words
    /// are a name.
    Weak,
    /// An honorific or `my name is`: any capitalised words are a name.
    Strong,
}

/// The cue right before word `i`: an honorific, a cue phrase or a closing line.
fn cue_before(text: &str, words: &[Word], i: usize) -> Cue {
    let Some(prev) = i.checked_sub(1).and_then(|p| words.get(p)) else {
        return Cue::None;
    };
    let prev_text = word_text(text, prev);
    // `Mr Smith`, `Dr. Jones`, `M. Dupont`
    if prev.gap == Gap::Space
        && (HONORIFICS.contains(&prev_text) || (prev_text == "M" && prev.initial))
    {
        return Cue::Strong;
    }
    let lower_eq = |w: &Word, s: &str| word_text(text, w).eq_ignore_ascii_case(s);
    let ends_with = |phrase: &[&str]| {
        let n = phrase.len();
        if n > i {
            return false;
        }
        phrase.iter().enumerate().all(|(k, p)| {
            words
                .get(i - n + k)
                .is_some_and(|w| lower_eq(w, p) && (k + 1 == n || w.gap == Gap::Space))
        })
    };
    if prev.gap == Gap::Space && STRONG_CUES.iter().any(|c| ends_with(c)) {
        return Cue::Strong;
    }
    if prev.gap == Gap::Space && WEAK_CUES.iter().any(|c| ends_with(c)) {
        return Cue::Weak;
    }
    if matches!(prev.gap, Gap::Comma | Gap::Line) && CLOSINGS.iter().any(|c| ends_with(c)) {
        return Cue::Weak;
    }
    Cue::None
}

/// The index of the last word of a name starting at word `i`, if there is one.
fn name_at(text: &str, words: &[Word], i: usize, cue: Cue, fold: &mut String) -> Option<usize> {
    let first = words.get(i)?;
    if !first.capital {
        return None;
    }
    let first_text = word_text(text, first);
    if HONORIFICS.contains(&first_text) || is_common_capitalised(first_text) {
        return None;
    }
    fold_into(first_text, fold)?;
    let given = is_given(fold);
    let weak = WEAK_GIVEN.contains(&fold.as_str());
    if cue == Cue::None && !given {
        return None;
    }
    // extend over the name's words: capitalised words, initials and particles, joined by
    // spaces; the name ends on its last capitalised word
    let mut last = i;
    let mut k = i;
    while k - i < 4 {
        let Some(w) = words.get(k) else { break };
        let Some(next) = words.get(k + 1) else { break };
        if w.gap != Gap::Space {
            break;
        }
        let next_text = word_text(text, next);
        if next.capital {
            fold_into(next_text, fold)?;
            if NOT_SURNAME.contains(&fold.as_str()) || german_compound_noun(fold) {
                break;
            }
            last = k + 1;
        } else if !(next.initial || PARTICLES.contains(&next_text)) {
            break;
        }
        k += 1;
    }
    if last == i {
        // a single word: only after a cue, and not a common word
        return (cue == Cue::Strong || (cue == Cue::Weak && given && !weak)).then_some(i);
    }
    let surname = words.get(last).map(|w| word_text(text, w))?;
    fold_into(surname, fold)?;
    let known_surname = is_surname(fold);
    if cue != Cue::None || known_surname || (given && !weak) {
        Some(last)
    } else {
        None
    }
}

/// Ends of German compound nouns that are capitalised like names (`Telefonnummer`,
/// `Kartennummer`, `Steuer-ID`, `Lieferadresse`): such a word is not a surname.
const GERMAN_NOUN_ENDS: &[&str] = &[
    "nummer",
    "adresse",
    "karte",
    "konto",
    "-id",
    "daten",
    "rechnung",
    "vertrag",
    "anschrift",
];

fn german_compound_noun(folded: &str) -> bool {
    GERMAN_NOUN_ENDS
        .iter()
        .any(|e| folded.len() > e.len() + 2 && folded.ends_with(e))
}

fn is_given(folded: &str) -> bool {
    listed(GIVEN_NAMES, folded)
        || folded
            .split_once('-')
            .is_some_and(|(a, b)| listed(GIVEN_NAMES, a) && listed(GIVEN_NAMES, b))
}

fn is_surname(folded: &str) -> bool {
    listed(SURNAMES, folded)
        || folded
            .rsplit_once('-')
            .is_some_and(|(_, b)| listed(SURNAMES, b))
}

/// Capitalised words that follow `Dear` or `I am` without being a name.
fn is_common_capitalised(word: &str) -> bool {
    matches!(
        word,
        "Sir"
            | "Madam"
            | "Team"
            | "All"
            | "Customer"
            | "Colleagues"
            | "Friends"
            | "Everyone"
            | "The"
            | "Support"
            | "Sales"
            | "Management"
            | "Mesdames"
            | "Messieurs"
            | "Damen"
    )
}

// ---------------------------------------------------------------------------------------
// Chinese and Japanese

fn is_han(c: char) -> bool {
    ('\u{4E00}'..='\u{9FFF}').contains(&c) || ('\u{3400}'..='\u{4DBF}').contains(&c) || c == '々'
}

fn is_kana(c: char) -> bool {
    ('\u{3041}'..='\u{30FF}').contains(&c) && c != '・'
}

/// Chinese words right before a name.
const CN_BEFORE: &[&str] = &[
    "我叫",
    "叫",
    "我是",
    "是",
    "姓名",
    "名字",
    "名叫",
    "联系人",
    "收件人",
    "收货人",
    "客户",
    "帮",
    "给",
    "致",
    "请",
    "联系",
    "和",
    "与",
    "同",
    "跟",
    "找",
    "问",
    "告诉",
    "通知",
    "由",
    "被",
    "让",
    "把",
    "感谢",
    "谢谢",
    "亲爱的",
    "尊敬的",
    "同事",
    "朋友",
    "用户",
    "作者",
    "负责人",
    "申请人",
    "发件人",
    "对",
    "向",
    "经理",
    "老师",
    "医生",
    "患者",
    "员工",
    "学生",
    "签名",
    "通过",
    "改成",
    "改为",
    "核对一下",
    "确认一下",
    "查一下",
];

/// Chinese words right after a name.
const CN_AFTER: &[&str] = &[
    "先生", "女士", "小姐", "老师", "同学", "经理", "总", "医生", "教授", "同志", "的", "是", "说",
    "在", "已", "将", "打", "发", "来", "去", "和", "与", "及", "写", "负责", "签", "您", "你",
    "吗", "呢", "也", "还", "就", "都", "会", "要", "想", "需要", "今天", "明天", "昨天", "回复",
    "提交", "确认", "收到", "联系", "预约", "住", "今年", "出生", "等", "询问", "问", "表示",
    "认为", "觉得", "希望", "告诉", "给", "向", "对", "把", "让", "刚", "正在", "目前", "最近",
    "先", "又", "再", "不", "没", "很", "申请", "提出", "报名", "购买", "下单", "投诉", "开会",
    "参加", "同意", "拒绝", "发送", "寄", "退", "买", "卖", "做", "看", "听", "用", "请", "了",
    "从", "于", "是否",
];

/// Words after a name that make it one with no cue before it (`请总结杨旭的投诉`).
const CN_AFTER_ALONE: &[&str] = &[
    "先生",
    "女士",
    "小姐",
    "老师",
    "同学",
    "经理",
    "医生",
    "教授",
    "同志",
    "的投诉",
    "的订单",
    "的电话",
    "的地址",
    "的邮件",
    "的信",
    "的账户",
    "的申请",
    "询问",
    "表示",
    "签署",
    "回复",
];

/// Cues strong enough for surnames that are also everyday words.
const CN_STRONG_BEFORE: &[&str] = &[
    "我叫",
    "叫",
    "名叫",
    "姓名",
    "名字",
    "联系人",
    "收件人",
    "收货人",
    "尊敬的",
    "亲爱的",
];
const CN_STRONG_AFTER: &[&str] = &[
    "先生", "女士", "小姐", "老师", "同学", "经理", "医生", "教授", "同志",
];

/// Japanese honorifics and titles after a name.
const JA_AFTER: &[&str] = &[
    "さん",
    "様",
    "さま",
    "氏",
    "先生",
    "くん",
    "君",
    "ちゃん",
    "殿",
    "部長",
    "課長",
    "社長",
    "選手",
    "教授",
];

/// Kanji that end place names, organisations and addresses rather than given names.
const JA_NOT_GIVEN_END: &str =
    "区市町村県都府道郡駅線店社院校課部長局所館園橋丁目番号地通機業屋堂製会団組品室場";

/// One CJK character of the text with its byte span.
#[derive(Debug, Clone, Copy)]
struct Ch {
    c: char,
    at: usize,
}

fn cjk_names(text: &str, found: &mut dyn FnMut(Range<usize>)) {
    let chars: Vec<Ch> = text.char_indices().map(|(at, c)| Ch { c, at }).collect();
    let end_of = |k: usize| chars.get(k).map_or(text.len(), |ch| ch.at);
    let mut k = 0;
    while k < chars.len() {
        let Some(ch) = chars.get(k) else { break };
        if !is_han(ch.c) {
            k += 1;
            continue;
        }
        let run_start = k == 0 || chars.get(k - 1).is_none_or(|p| !is_han(p.c));
        if let Some(len) = japanese_at(text, &chars, k, run_start)
            .or_else(|| chinese_at(text, &chars, k, run_start))
        {
            found(ch.at..end_of(k + len));
            k += len;
        } else {
            k += 1;
        }
    }
}

/// The text of `chars[from..from+n]` (fewer at the end).
fn slice<'t>(text: &'t str, chars: &[Ch], from: usize, n: usize) -> &'t str {
    let start = chars.get(from).map_or(text.len(), |c| c.at);
    let end = chars.get(from + n).map_or(text.len(), |c| c.at);
    text.get(start..end).unwrap_or_default()
}

fn starts_with_any(text: &str, chars: &[Ch], at: usize, words: &[&str]) -> bool {
    let start = chars.get(at).map_or(text.len(), |c| c.at);
    let rest = text.get(start..).unwrap_or_default();
    words.iter().any(|w| rest.starts_with(w))
}

fn ends_with_any(text: &str, chars: &[Ch], at: usize, words: &[&str]) -> bool {
    let end = chars.get(at).map_or(text.len(), |c| c.at);
    let before = text.get(..end).unwrap_or_default();
    words.iter().any(|w| before.ends_with(w))
}

fn han_at(chars: &[Ch], k: usize) -> bool {
    chars.get(k).is_some_and(|c| is_han(c.c))
}

/// A set of Han characters (U+4E00..=U+9FFF) as bits, for the lookups made at every Han
/// character of a text: one bit test instead of a bisection of a list.
struct HanSet([u64; HAN_WORDS]);

const HAN_FIRST: u32 = 0x4E00;
const HAN_WORDS: usize = (0xA000 - 0x4E00) / 64;

impl HanSet {
    /// The first character of every entry of a newline-separated list.
    fn first_chars(list: &str) -> HanSet {
        let mut set = HanSet([0; HAN_WORDS]);
        for c in list.lines().filter_map(|l| l.chars().next()) {
            if let Some(word) = (c as u32)
                .checked_sub(HAN_FIRST)
                .and_then(|i| set.0.get_mut(i as usize / 64).map(|w| (w, i % 64)))
            {
                *word.0 |= 1 << word.1;
            }
        }
        set
    }

    fn has(&self, c: char) -> bool {
        (c as u32)
            .checked_sub(HAN_FIRST)
            .and_then(|i| self.0.get(i as usize / 64).map(|w| w >> (i % 64) & 1 == 1))
            .unwrap_or(false)
    }
}

/// The first characters of the Chinese and of the Japanese surnames, and the Chinese
/// given-name characters (built on the first text with Han characters, 8 KB).
fn han_sets() -> &'static [HanSet; 3] {
    static SETS: OnceLock<[HanSet; 3]> = OnceLock::new();
    SETS.get_or_init(|| {
        [
            HanSet::first_chars(CN_SURNAMES),
            HanSet::first_chars(JA_SURNAMES),
            HanSet::first_chars(CN_GIVEN_CHARS),
        ]
    })
}

/// Length in chars of a Chinese name at `k`.
fn chinese_at(text: &str, chars: &[Ch], k: usize, run_start: bool) -> Option<usize> {
    let [cn_first, _, cn_given] = han_sets();
    if !chars.get(k).is_some_and(|c| cn_first.has(c.c)) {
        return None;
    }
    let surname_len = [2, 1].into_iter().find(|&n| {
        (0..n).all(|j| han_at(chars, k + j)) && listed(CN_SURNAMES, slice(text, chars, k, n))
    })?;
    let prose = surname_len == 1 && listed(CN_PROSE_SURNAMES, slice(text, chars, k, 1));
    let strong_before = ends_with_any(text, chars, k, CN_STRONG_BEFORE);
    let cue_before = strong_before || ends_with_any(text, chars, k, CN_BEFORE);
    let before = run_start || cue_before;
    for given in [2, 1] {
        let g = k + surname_len;
        let all_given = (0..given).all(|j| chars.get(g + j).is_some_and(|c| cn_given.has(c.c)));
        // `韩国`, `王国`: a state or kingdom, not a one-character given name
        if !all_given || (given == 1 && chars.get(g).is_some_and(|c| c.c == '国')) {
            continue;
        }
        let after = g + given;
        let strong_after = starts_with_any(text, chars, after, CN_STRONG_AFTER);
        let run_end = !han_at(chars, after);
        let cue_after = strong_after || starts_with_any(text, chars, after, CN_AFTER);
        let bounded = run_end || cue_after;
        let accepted = if prose {
            // or a cue before and the run ending after it, or three characters standing
            // alone between punctuation (`：林建平（`)
            strong_before
                || strong_after
                || (cue_before && bounded)
                || (given == 2 && run_start && run_end)
        } else {
            // a cue word before it (the longest given name of name characters), or the
            // start of a run and a cue or the end after it
            cue_before || (before && bounded) || starts_with_any(text, chars, after, CN_AFTER_ALONE)
        };
        if accepted {
            return Some(surname_len + given);
        }
    }
    None
}

/// Particles and punctuation that can follow a Japanese name.
fn ja_particle(c: char) -> bool {
    matches!(
        c,
        'は' | 'が'
            | 'を'
            | 'に'
            | 'と'
            | 'の'
            | 'で'
            | 'か'
            | 'も'
            | 'へ'
            | 'や'
            | '、'
            | '。'
            | '）'
    )
}

/// Length in chars (the space included) of a Japanese name at `k`.
fn japanese_at(text: &str, chars: &[Ch], k: usize, run_start: bool) -> Option<usize> {
    if !chars.get(k).is_some_and(|c| han_sets()[1].has(c.c)) {
        return None;
    }
    let surname_len = [3, 2, 1].into_iter().find(|&n| {
        (0..n).all(|j| han_at(chars, k + j)) && listed(JA_SURNAMES, slice(text, chars, k, n))
    })?;
    let s_end = k + surname_len;
    // surname, a space, a given name of kanji and kana (`篤司`, `さゆり`, `くみ子`)
    if chars
        .get(s_end)
        .is_some_and(|c| c.c == ' ' || c.c == '\u{3000}')
    {
        let g = s_end + 1;
        // kana then kanji (`くみ子`) is a name; kana after kanji is okurigana or a particle
        let mut run = 0;
        let mut kanji = false;
        while run < 6 {
            match chars.get(g + run) {
                Some(c) if is_han(c.c) => kanji = true,
                Some(c) if is_kana(c.c) && !kanji => {}
                _ => break,
            }
            run += 1;
        }
        // the longest given name followed by an honorific, else by a particle or the end
        let with_honorific = (1..=run.min(5))
            .rev()
            .find(|&n| starts_with_any(text, chars, g + n, JA_AFTER));
        let plain = (1..=run.min(5)).rev().find(|&n| {
            chars
                .get(g + n)
                .is_none_or(|c| !(is_han(c.c) || is_kana(c.c)) || ja_particle(c.c))
        });
        let given = with_honorific.or(plain)?;
        let kana_only = (0..given).all(|j| chars.get(g + j).is_some_and(|c| is_kana(c.c)));
        if kana_only && given < 2 {
            return None;
        }
        return Some(surname_len + 1 + given);
    }
    if !run_start && !ends_with_any(text, chars, k, CN_BEFORE) {
        return None;
    }
    if starts_with_any(text, chars, s_end, JA_AFTER) {
        return Some(surname_len);
    }
    // surname and a given name of one or two kanji filling the kanji run (a particle or
    // an honorific after it)
    let given = (0..3).take_while(|&j| han_at(chars, s_end + j)).count();
    if !(1..=2).contains(&given) || surname_len < 2 {
        return None;
    }
    let last = chars.get(s_end + given - 1)?;
    if JA_NOT_GIVEN_END.contains(last.c) {
        return None;
    }
    let after = s_end + given;
    let particle_after = chars.get(after).is_some_and(|c| ja_particle(c.c))
        || starts_with_any(text, chars, after, JA_AFTER);
    particle_after.then_some(surname_len + given)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(text: &str) -> Vec<&str> {
        let mut out = Vec::new();
        find(text, &mut |r| out.push(&text[r]));
        out
    }

    #[test]
    fn lists_are_sorted_and_searchable() {
        for list in [
            GIVEN_NAMES,
            SURNAMES,
            CN_SURNAMES,
            CN_PROSE_SURNAMES,
            CN_GIVEN_CHARS,
            JA_SURNAMES,
        ] {
            let lines: Vec<&str> = list.lines().collect();
            assert!(lines.windows(2).all(|w| w[0] < w[1]), "sorted, unique");
            for (i, line) in lines.iter().enumerate().step_by(97) {
                assert!(listed(list, line), "{i}: {line}");
                assert!(!listed(list, &format!("{line}x\u{1}")));
            }
        }
        assert!(listed(GIVEN_NAMES, "john") && listed(SURNAMES, "underwood"));
        assert!(!listed(GIVEN_NAMES, "docker") && !listed(GIVEN_NAMES, ""));
    }

    #[test]
    fn han_sets_hold_exactly_the_listed_first_characters() {
        let [cn_first, ja_first, cn_given] = han_sets();
        let starts = |list: &str, c: char| list.lines().any(|l| l.starts_with(c));
        for c in ('\u{4DFF}'..='\u{A000}').chain(['a', '〒']) {
            let mut buf = [0; 4];
            assert_eq!(
                cn_given.has(c),
                listed(CN_GIVEN_CHARS, c.encode_utf8(&mut buf)),
                "{c}"
            );
            assert_eq!(cn_first.has(c), starts(CN_SURNAMES, c), "{c}");
            assert_eq!(ja_first.has(c), starts(JA_SURNAMES, c), "{c}");
        }
    }

    #[test]
    fn folding() {
        let mut s = String::new();
        fold_into("Jürgen", &mut s).unwrap();
        assert_eq!(s, "jurgen");
        fold_into("Françoise", &mut s).unwrap();
        assert_eq!(s, "francoise");
        fold_into("Weiß", &mut s).unwrap();
        assert_eq!(s, "weiss");
        assert!(fold_into("Ωmega", &mut s).is_none());
    }

    #[test]
    fn western_names() {
        assert_eq!(
            names("Please ask John Underwood and Victoire Maury about it."),
            ["John Underwood", "Victoire Maury"]
        );
        assert_eq!(
            names(
                "Karsten Wieloch-Bolnbach met Jean-Pierre de la Fontaine and Ludwig van Beethoven"
            ),
            [
                "Karsten Wieloch-Bolnbach",
                "Jean-Pierre de la Fontaine",
                "Ludwig van Beethoven"
            ]
        );
        assert_eq!(
            names("Françoise Gauthier, Stéphanie Georges"),
            ["Françoise Gauthier", "Stéphanie Georges"]
        );
        assert_eq!(names("John F. Kennedy spoke"), ["John F. Kennedy"]);
        assert_eq!(
            names("April Griffin and Will Smith"),
            ["April Griffin", "Will Smith"]
        );
    }

    #[test]
    fn german_nouns_are_not_names() {
        for text in [
            "Meine Telefonnummer ist 030 1234567.",
            "Meine Kartennummer lautet 4111 1111 1111 1111.",
            "Meine Steuer-ID ist 12345678901.",
            "Ihre Lieferadresse wurde geändert.",
            "Der Vorstand tagt morgen.",
            "Anna Kundennummer 4711",
        ] {
            assert_eq!(names(text), Vec::<&str>::new(), "{text}");
        }
        assert_eq!(names("Anna Schmidt ruft an."), ["Anna Schmidt"]);
    }

    #[test]
    fn western_context() {
        assert_eq!(names("Mr Hardy and Dr. Oderwald"), ["Hardy", "Oderwald"]);
        assert_eq!(
            names("Bonjour M. Dupuis, Mme Lefebvre"),
            ["Dupuis", "Lefebvre"]
        );
        assert_eq!(
            names("Herr Neuschäfer und Frau Schlosser"),
            ["Neuschäfer", "Schlosser"]
        );
        assert_eq!(names("Hi, my name is Zorblat Quux."), ["Zorblat Quux"]);
        assert_eq!(names("je m'appelle Zoé Grenier"), ["Zoé Grenier"]);
        assert_eq!(names("ich heiße Bekir Neuschäfer"), ["Bekir Neuschäfer"]);
        assert_eq!(names("Best regards,\nQuentin Zyx"), ["Quentin Zyx"]);
        assert_eq!(names("Dear Ms Okonkwo,"), ["Okonkwo"]);
    }

    #[test]
    fn western_negatives() {
        for text in [
            "New York is busy on Monday.",
            "We run Docker Compose and Python on Visual Studio Code.",
            "Madison Square Garden and Lincoln Center",
            "Will you merge it? April is fine. Grant Access to it.",
            "The Release Notes mention Apple Music and Google Cloud.",
            "Victoria Station",
            "Dear Sir,",
            "version 1.2.3 at 2024-05-01T10:00:00Z costs $19.99",
        ] {
            assert_eq!(names(text), Vec::<&str>::new(), "{text}");
        }
    }

    #[test]
    fn chinese_names() {
        assert_eq!(names("我叫朱颖，请联系梁鑫。"), ["朱颖", "梁鑫"]);
        assert_eq!(names("请帮朱冬梅写一封信"), ["朱冬梅"]);
        assert_eq!(names("客户：刘娜 电话"), ["刘娜"]);
        assert_eq!(names("欧阳娜娜女士"), ["欧阳娜娜"]);
        assert_eq!(names("高明先生来了"), ["高明"]);
        // cues: `通过` (through), `改成`/`改为` (change to), `确认一下` (check); `是否` after
        assert_eq!(names("我们通过李明联系了客户。"), ["李明"]);
        assert_eq!(names("请把负责人改为王芳。"), ["王芳"]);
        assert_eq!(names("确认一下张伟是否到了"), ["张伟"]);
        for text in [
            "我们的时间很紧",
            "这个方法很好用",
            "周五之前完成文明建设",
            "高兴！",
            "我知道了",
        ] {
            assert_eq!(names(text), Vec::<&str>::new(), "{text}");
        }
    }

    #[test]
    fn japanese_names() {
        assert_eq!(names("担当は井上 篤司です"), ["井上 篤司"]);
        assert_eq!(names("木村 陽一、渡辺 直樹"), ["木村 陽一", "渡辺 直樹"]);
        assert_eq!(names("田中さんに連絡"), ["田中"]);
        assert_eq!(names("山田太郎は来ます"), ["山田太郎"]);
        for text in ["中村区役所", "東京都港区"] {
            assert_eq!(names(text), Vec::<&str>::new(), "{text}");
        }
    }

    #[test]
    fn spans_are_char_boundaries() {
        let text = "é朱颖é Jürgen Müller 木村 陽一";
        let mut spans = Vec::new();
        find(text, &mut |r| spans.push(r));
        assert!(!spans.is_empty());
        for r in spans {
            assert!(text.is_char_boundary(r.start) && text.is_char_boundary(r.end));
        }
    }
}
