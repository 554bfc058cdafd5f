//! Context words: the words before or after a candidate that say what it is ("tel", "card",
//! "Steuer-IdNr") or that it is not personal data ("order", "invoice"), and the lists of them
//! that more than one detector reads. The detectors ([`crate::detect`], [`crate::card`],
//! [`crate::phone`], [`crate::national_id`]) look for them with [`context_before`] and
//! [`context_after`]; the dispatcher and the detectors both sit above this module.

use crate::scan::{at, before};

/// A list of context words (lower case; ASCII letters compared ignoring case) with the set
/// of bytes they begin with (both cases of an ASCII letter), built at compile time: a window
/// position whose byte is not in the set starts none of them, and of the words only those
/// with that first byte are compared.
pub(crate) struct Words {
    list: &'static [&'static [u8]],
    firsts: [u64; 4],
}

impl Words {
    // Evaluated at compile time (every list is a `const`): an index out of range would fail
    // the build, never panic.
    #[allow(clippy::indexing_slicing)]
    pub(crate) const fn new(list: &'static [&'static [u8]]) -> Words {
        let mut firsts = [0u64; 4];
        let mut n = 0;
        while n < list.len() {
            let word = list[n];
            if !word.is_empty() {
                let c = word[0];
                let lower = c.to_ascii_lowercase();
                let upper = c.to_ascii_uppercase();
                firsts[(lower >> 6) as usize] |= 1 << (lower & 63);
                firsts[(upper >> 6) as usize] |= 1 << (upper & 63);
            }
            n += 1;
        }
        Words { list, firsts }
    }

    fn may_start(&self, c: u8) -> bool {
        self.firsts
            .get(usize::from(c >> 6))
            .is_some_and(|bits| bits & (1 << (c & 63)) != 0)
    }

    /// Whether one of the words starts a word at `k` and ends by `limit`.
    fn starts_at(&self, b: &[u8], k: usize, limit: usize) -> bool {
        let c = at(b, k);
        if !self.may_start(c) || before(b, k).is_ascii_alphabetic() {
            return false;
        }
        let lower = c.to_ascii_lowercase();
        self.list.iter().any(|w| {
            w.first() == Some(&lower)
                && k + w.len() <= limit
                && b.get(k..k + w.len())
                    .is_some_and(|win| win.eq_ignore_ascii_case(w))
        })
    }
}

/// Whether one of `words` starts a word in the `window` bytes before `i`: ASCII letters
/// compared ignoring case, and no ASCII letter right before it (so `tel` is found in "Tel."
/// and "telephone", not in "hotel"). Reads at most `window` bytes per word.
pub(crate) fn context_before(b: &[u8], i: usize, words: &Words, window: usize) -> bool {
    // most positions are inside a word or start no listed word: two bit tests rule them out
    // before any word is compared
    (i.saturating_sub(window)..i).any(|k| words.starts_at(b, k, i))
}

/// Whether one of `words` starts a word in the `window` bytes after `end` (the same
/// comparison as [`context_before`]): "5272868387 is the phone number",
/// "…は昨日伺ったマイナンバーです". Reads at most `window` bytes per word.
pub(crate) fn context_after(b: &[u8], end: usize, words: &Words, window: usize) -> bool {
    (end..end.saturating_add(window).min(b.len())).any(|k| words.starts_at(b, k, usize::MAX))
}

/// Words before a number that say it is a reference, not personal data (lower case).
pub(crate) const REFERENCE_WORDS: Words = Words::new(&[
    b"order",
    b"invoice",
    b"tracking",
    b"ref",
    b"sku",
    b"serial",
    b"ticket",
    b"case",
    b"account",
    b"acct",
    b"customer",
    b"transaction",
    b"id",
    b"#",
    "订单".as_bytes(),
    "单号".as_bytes(),
    "注文".as_bytes(),
]);

/// Words for a card, lower case (ASCII compared ignoring case).
pub(crate) const CARD_WORDS: Words = Words::new(&[
    b"card",
    b"maestro",
    b"karte",
    b"carte",
    b"tarjeta",
    b"carta",
    b"kaart",
    b"credit",
    b"debit",
    "卡".as_bytes(),
    "カード".as_bytes(),
    "카드".as_bytes(),
]);

/// Words for a phone, lower case (ASCII compared ignoring case).
pub(crate) const PHONE_WORDS: Words = Words::new(&[
    b"phone",
    b"tel", // tel, telephone, Telefon, teléfono, telefono
    b"call",
    b"mobile",
    b"cell",
    b"fax",
    b"whatsapp",
    b"contact",
    b"reach",
    b"dial",
    b"sms",
    b"number",
    b"nummer",
    "numéro".as_bytes(),
    "número".as_bytes(),
    b"numero",
    b"handy",
    b"ruf", // Rufnummer
    b"anruf",
    b"portable",
    b"appel", // appeler, appelez
    b"llam",  // llamar, llame
    b"chiam", // chiamare, chiami
    "téléphone".as_bytes(),
    "电话".as_bytes(),
    "手机".as_bytes(),
    "電話".as_bytes(),
    "携帯".as_bytes(),
    "番号".as_bytes(),
    "号码".as_bytes(),
    "연락처".as_bytes(),
]);

/// Words for a German tax id (lower case; ASCII ignoring case).
pub(crate) const TAX_ID_WORDS: Words = Words::new(&[
    b"steuer",
    b"idnr",
    b"id-nr",
    b"identifikationsnummer",
    b"tax",
]);
