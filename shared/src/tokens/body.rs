//! The prompt estimate read straight from a request body's bytes, without building a
//! `serde_json::Value`: the same texts, in the same order, as [`super::estimate_with`] reads
//! from the parsed body, borrowed from the body unless they hold escapes.
//!
//! The body must be one that [`crate::json::scan_object`] accepted (well-formed, UTF-8,
//! bounded nesting); the walk trusts that grammar but never indexes past the bytes. It
//! answers `None` wherever `serde_json` might refuse what the scanner accepts or read it
//! differently (a surrogate escape that is not a proper pair, a number that could overflow an
//! `f64`, anything unexpected), so a caller that falls back to `serde_json` on `None` keeps
//! `serde_json`'s answer on every body.

use super::encoding::MESSAGE_OVERHEAD;
use crate::json;
use crate::request::Api;
use std::borrow::Cow;
use std::ops::Range;

/// Deeper nesting than the scanner's limit is no body it accepted.
const MAX_DEPTH: usize = 128;
/// Integer digits below which no JSON number overflows an `f64` (f64::MAX < 10^309).
const MAX_INT_DIGITS: usize = 300;

/// A body `scan_object` accepted.
struct Doc<'a> {
    text: &'a str,
}

impl<'a> Doc<'a> {
    fn bytes(&self) -> &'a [u8] {
        self.text.as_bytes()
    }

    fn at(&self, i: usize) -> Option<u8> {
        self.bytes().get(i).copied()
    }

    fn ws(&self, mut i: usize) -> usize {
        while matches!(self.at(i), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            i += 1;
        }
        i
    }

    fn hex4(&self, i: usize) -> Option<u32> {
        let digits = self.bytes().get(i..i + 4)?;
        digits
            .iter()
            .try_fold(0u32, |n, &d| Some(n << 4 | char::from(d).to_digit(16)?))
    }

    /// The end (after the closing quote) of the string literal at `i`, and whether it holds
    /// an escape; `None` for a surrogate escape that is not a high-low pair.
    fn string_end(&self, i: usize) -> Option<(usize, bool)> {
        let bytes = self.bytes();
        let mut j = i + 1;
        let mut escaped = false;
        loop {
            j += json::plain_run(bytes.get(j..)?);
            match self.at(j)? {
                b'"' => return Some((j + 1, escaped)),
                b'\\' => {
                    escaped = true;
                    if self.at(j + 1)? != b'u' {
                        j += 2;
                        continue;
                    }
                    let code = self.hex4(j + 2)?;
                    j += 6;
                    if (0xD800..0xDC00).contains(&code) {
                        if self.at(j) != Some(b'\\') || self.at(j + 1) != Some(b'u') {
                            return None;
                        }
                        if !(0xDC00..0xE000).contains(&self.hex4(j + 2)?) {
                            return None;
                        }
                        j += 6;
                    } else if (0xDC00..0xE000).contains(&code) {
                        return None;
                    }
                }
                _ => return None,
            }
        }
    }

    /// The end of the number at `i`; `None` for one `serde_json` might find out of range
    /// (an exponent, or very many integer digits).
    fn number_end(&self, i: usize) -> Option<usize> {
        let mut j = i;
        if self.at(j) == Some(b'-') {
            j += 1;
        }
        let start = j;
        while self.at(j).is_some_and(|b| b.is_ascii_digit()) {
            j += 1;
        }
        if j - start > MAX_INT_DIGITS || j == start {
            return None;
        }
        if self.at(j) == Some(b'.') {
            j += 1;
            while self.at(j).is_some_and(|b| b.is_ascii_digit()) {
                j += 1;
            }
        }
        match self.at(j) {
            Some(b'e' | b'E') => None,
            _ => Some(j),
        }
    }

    /// The end of the value at `i` (no leading whitespace).
    fn value_end(&self, i: usize, depth: usize) -> Option<usize> {
        match self.at(i)? {
            b'"' => self.string_end(i).map(|(end, _)| end),
            b'{' => self.members(i, depth, &mut |_, start| self.value_end(start, depth + 1)),
            b'[' => self.elements(i, depth, &mut |start| self.value_end(start, depth + 1)),
            b't' | b'n' => Some(i + 4),
            b'f' => Some(i + 5),
            _ => self.number_end(i),
        }
    }

    /// Walks the object at `i`: `member(key literal, value start)` reads each member's value
    /// and returns its end; the end of the object.
    fn members(
        &self,
        i: usize,
        depth: usize,
        member: &mut dyn FnMut(Key, usize) -> Option<usize>,
    ) -> Option<usize> {
        if depth > MAX_DEPTH {
            return None;
        }
        let mut j = self.ws(i + 1);
        if self.at(j)? == b'}' {
            return Some(j + 1);
        }
        loop {
            if self.at(j)? != b'"' {
                return None;
            }
            let (key_end, escaped) = self.string_end(j)?;
            let colon = self.ws(key_end);
            if self.at(colon)? != b':' {
                return None;
            }
            let start = self.ws(colon + 1);
            let end = member(
                Key {
                    span: j..key_end,
                    escaped,
                },
                start,
            )?;
            j = self.ws(end);
            match self.at(j)? {
                b',' => j = self.ws(j + 1),
                b'}' => return Some(j + 1),
                _ => return None,
            }
        }
    }

    /// Walks the array at `i`: `element(start)` reads each element and returns its end; the
    /// end of the array.
    fn elements(
        &self,
        i: usize,
        depth: usize,
        element: &mut dyn FnMut(usize) -> Option<usize>,
    ) -> Option<usize> {
        if depth > MAX_DEPTH {
            return None;
        }
        let mut j = self.ws(i + 1);
        if self.at(j)? == b']' {
            return Some(j + 1);
        }
        loop {
            let end = element(j)?;
            j = self.ws(end);
            match self.at(j)? {
                b',' => j = self.ws(j + 1),
                b']' => return Some(j + 1),
                _ => return None,
            }
        }
    }

    /// The text of the string literal `span` (`escaped`: it holds a backslash).
    fn text(&self, span: &Text) -> Option<Cow<'a, str>> {
        let raw = self.text.get(span.span.clone())?;
        if !span.escaped {
            return raw.get(1..raw.len().checked_sub(1)?).map(Cow::Borrowed);
        }
        json::unescape(raw.as_bytes(), span.span.start)
            .ok()
            .map(Cow::Owned)
    }

    /// Whether `key` names `name`.
    fn key_is(&self, key: &Key, name: &str) -> bool {
        if !key.escaped {
            let inner = key.span.start + 1..key.span.end.saturating_sub(1);
            return self.bytes().get(inner) == Some(name.as_bytes());
        }
        self.text(&Text {
            span: key.span.clone(),
            escaped: true,
        })
        .is_some_and(|key| key == name)
    }

    /// The string at `i`, if there is one: its span and end.
    fn string_at(&self, i: usize) -> Option<Option<Text>> {
        if self.at(i)? != b'"' {
            return Some(None);
        }
        let (end, escaped) = self.string_end(i)?;
        Some(Some(Text {
            span: i..end,
            escaped,
        }))
    }

    /// A `content` at `i` (`count_content`): a string, or the text parts of an array; its
    /// texts pushed to `texts`; the value's end.
    fn content(&self, i: usize, depth: usize, texts: &mut Vec<Text>) -> Option<usize> {
        match self.at(i)? {
            b'"' => {
                let (end, escaped) = self.string_end(i)?;
                texts.push(Text {
                    span: i..end,
                    escaped,
                });
                Some(end)
            }
            b'[' => self.elements(i, depth, &mut |part| {
                if self.at(part)? != b'{' {
                    return self.value_end(part, depth + 1);
                }
                // the last `type` (a string other than the text types excludes the part) and
                // the last `text` (counted if it is a string)
                let mut typed_text = true;
                let mut text = None;
                let end = self.members(part, depth + 1, &mut |key, value| {
                    if self.key_is(&key, "type") {
                        let kind = self.string_at(value)?;
                        typed_text = match &kind {
                            None => true,
                            Some(kind) => matches!(
                                self.text(kind)?.as_ref(),
                                "text" | "input_text" | "output_text"
                            ),
                        };
                        return match kind {
                            Some(kind) => Some(kind.span.end),
                            None => self.value_end(value, depth + 2),
                        };
                    }
                    if self.key_is(&key, "text") {
                        text = self.string_at(value)?;
                        return match &text {
                            Some(text) => Some(text.span.end),
                            None => self.value_end(value, depth + 2),
                        };
                    }
                    self.value_end(value, depth + 2)
                })?;
                if let Some(text) = text.filter(|_| typed_text) {
                    texts.push(text);
                }
                Some(end)
            }),
            _ => self.value_end(i, depth),
        }
    }

    /// A message at `i` (`message(m.get("content"))`): its last `content`'s texts pushed to
    /// `texts`; the value's end. (Not an object: no content.)
    fn message(&self, i: usize, depth: usize, texts: &mut Vec<Text>) -> Option<usize> {
        if self.at(i)? != b'{' {
            return self.value_end(i, depth);
        }
        let mark = texts.len();
        self.members(i, depth, &mut |key, value| {
            if self.key_is(&key, "content") {
                texts.truncate(mark); // the last one counts
                return self.content(value, depth + 1, texts);
            }
            self.value_end(value, depth + 1)
        })
    }
}

/// A member name.
struct Key {
    /// Its literal, quotes included.
    span: Range<usize>,
    /// It holds a backslash.
    escaped: bool,
}

/// A string literal to count.
#[derive(Clone)]
struct Text {
    /// Quotes included.
    span: Range<usize>,
    /// It holds a backslash.
    escaped: bool,
}

/// What one top-level member contributes: texts to count in order, messages (each adds
/// [`MESSAGE_OVERHEAD`]) and tokens given as such (pre-tokenized embedding inputs).
#[derive(Default)]
struct Part {
    texts: Vec<Text>,
    messages: u64,
    tokens: u64,
}

impl Part {
    fn total(&self, doc: &Doc<'_>, count: &dyn Fn(&str) -> u64) -> Option<u64> {
        let mut total = 0u64;
        for text in &self.texts {
            total = total.saturating_add(count(&doc.text(text)?));
        }
        Some(
            total
                .saturating_add(self.messages.saturating_mul(MESSAGE_OVERHEAD))
                .saturating_add(self.tokens),
        )
    }
}

/// Reads the value at `i` of a top-level member that `api` counts (`key`) into `part`; the
/// value's end.
fn read(doc: &Doc<'_>, api: Api, key: &str, i: usize, part: &mut Part) -> Option<usize> {
    const DEPTH: usize = 2;
    let messages = |part: &mut Part| {
        doc.elements(i, DEPTH, &mut |m| {
            part.messages += 1;
            doc.message(m, DEPTH + 1, &mut part.texts)
        })
    };
    match (api, key) {
        (Api::ChatCompletions | Api::AnthropicMessages, "messages") => match doc.at(i)? {
            b'[' => messages(part),
            _ => doc.value_end(i, DEPTH),
        },
        (Api::AnthropicMessages, "system") | (Api::Responses, "instructions") => {
            part.messages = 1;
            doc.content(i, DEPTH, &mut part.texts)
        }
        (Api::Responses, "input") => match doc.at(i)? {
            b'"' => {
                part.messages = 1;
                doc.content(i, DEPTH, &mut part.texts)
            }
            b'[' => doc.elements(i, DEPTH, &mut |item| {
                part.messages += 1;
                match doc.at(item)? {
                    b'"' => doc.content(item, DEPTH + 1, &mut part.texts),
                    _ => doc.message(item, DEPTH + 1, &mut part.texts),
                }
            }),
            _ => doc.value_end(i, DEPTH),
        },
        (Api::Embeddings, "input") => match doc.at(i)? {
            b'"' => doc.content(i, DEPTH, &mut part.texts),
            b'[' => doc.elements(i, DEPTH, &mut |item| match doc.at(item)? {
                b'"' => doc.content(item, DEPTH + 1, &mut part.texts),
                b'[' => doc.elements(item, DEPTH + 1, &mut |id| {
                    part.tokens += 1; // pre-tokenized: one token per element
                    doc.value_end(id, DEPTH + 2)
                }),
                b'{' | b't' | b'f' | b'n' => doc.value_end(item, DEPTH + 1),
                _ => {
                    part.tokens += 1; // a number
                    doc.number_end(item)
                }
            }),
            _ => doc.value_end(i, DEPTH),
        },
        _ => doc.value_end(i, DEPTH),
    }
}

/// [`super::estimate_with`] over the raw `body` (see the module's notes); `None` where the
/// caller must parse with `serde_json` instead.
pub(super) fn estimate(api: Api, body: &[u8], count: &dyn Fn(&str) -> u64) -> Option<u64> {
    estimate_text(api, std::str::from_utf8(body).ok()?, count)
}

/// [`estimate`] of a body already read as text.
pub(super) fn estimate_text(api: Api, body: &str, count: &dyn Fn(&str) -> u64) -> Option<u64> {
    let doc = Doc { text: body };
    // the members each API reads, in the order it counts them
    let keys: &[&str] = match api {
        Api::ChatCompletions => &["messages"],
        Api::AnthropicMessages => &["system", "messages"],
        Api::Responses => &["instructions", "input"],
        Api::Embeddings => &["input"],
    };
    let mut parts: [Part; 2] = Default::default();
    // one walk over the whole document (so nothing serde_json could refuse is left unseen);
    // a repeated member replaces what an earlier one read
    let start = doc.ws(0);
    if doc.at(start)? != b'{' {
        return None;
    }
    let end = doc.members(start, 1, &mut |key, value| match keys
        .iter()
        .enumerate()
        .find(|(_, name)| doc.key_is(&key, name))
    {
        Some((n, name)) => {
            let part = parts.get_mut(n)?;
            *part = Part::default();
            read(&doc, api, name, value, part)
        }
        None => doc.value_end(value, 2),
    })?;
    if doc.ws(end) != body.len() {
        return None;
    }
    let mut total = 0u64;
    for part in &parts {
        total = total.saturating_add(part.total(&doc, count)?);
    }
    Some(total.max(1))
}

#[cfg(all(test, not(target_arch = "wasm32")))]
mod tests {
    use super::super::{estimate_body_tokens_sampled, estimate_prompt_tokens_sampled, Encoding};
    use crate::json::{scan_object, Limits};
    use crate::request::Api;
    use proptest::prelude::*;

    const APIS: [Api; 4] = [
        Api::ChatCompletions,
        Api::AnthropicMessages,
        Api::Responses,
        Api::Embeddings,
    ];
    const ENCODINGS: [Encoding; 3] = [Encoding::O200k, Encoding::Cl100k, Encoding::Chars];
    const SAMPLES: [usize; 4] = [0, 7, 40, 1 << 20];

    /// The raw estimate of `body` for every API, encoding and sample size: `Some` of the
    /// `Value` estimate, or `None` (a fallback); `Err` from the first disagreement.
    fn agree(body: &str) -> Result<bool, String> {
        let mut raw_always = true;
        if scan_object(body.as_bytes(), &Limits::default()).is_err() {
            return Ok(true); // the caller refuses it before estimating
        }
        let parsed: Option<serde_json::Value> = serde_json::from_str(body).ok();
        for api in APIS {
            for encoding in ENCODINGS {
                for sample in SAMPLES {
                    let raw = estimate_body_tokens_sampled(api, body.as_bytes(), encoding, sample);
                    match (&parsed, raw) {
                        (Some(value), Some(raw)) => {
                            let want = estimate_prompt_tokens_sampled(api, value, encoding, sample);
                            if raw != want {
                                return Err(format!(
                                    "{api:?} {encoding:?} {sample}: {raw} vs {want} for {body}"
                                ));
                            }
                        }
                        (None, Some(_)) => {
                            return Err(format!("serde_json refuses {body}, the walk did not"))
                        }
                        (_, None) => raw_always = false,
                    }
                }
            }
        }
        Ok(raw_always)
    }

    #[test]
    fn reads_what_the_parsed_body_holds() {
        // (body, whether the walk reads it without falling back)
        let cases: &[(&str, bool)] = &[
            (
                r#"{"model":"gpt-4o","messages":[{"role":"user","content":"Hello there"}]}"#,
                true,
            ),
            (
                r#"{"messages":[{"content":"a"},{"content":[{"type":"text","text":"b c"},{"type":"image_url","text":"no"},{"text":"untyped"},{"type":7,"text":"odd type"},"loose",{"type":"input_text","text":"in"}]}],"system":"sys","instructions":"do","input":"in put"}"#,
                true,
            ),
            // duplicates: the last one counts, at every level
            (
                r#"{"messages":[{"content":"first","content":"second one"}],"messages":[{"content":"last","content":"really last"}]}"#,
                true,
            ),
            (
                r#"{"messages":[{"content":[{"type":"image","type":"text","text":"x","text":"yy yy"}]}]}"#,
                true,
            ),
            // escapes in keys and values, surrogate pairs, other scripts
            (
                r#"{"m\u0065ssages":[{"c\u006fntent":"tab\there \"quoted\" \ud83d\ude00 \u00e9"}]}"#,
                true,
            ),
            (
                r#"{"messages":[{"content":"日本語のテキスト e\u0301 👩‍👩‍👧"}], "system": ["not", "content"]}"#,
                true,
            ),
            // not arrays, not objects, nulls
            (
                r#"{"messages":{"content":"x"},"system":null,"input":{"content":"y"},"instructions":5}"#,
                true,
            ),
            (
                r#"{"messages":[1,"two",null,[3],{"content":null},{"content":{"text":"x"}}]}"#,
                true,
            ),
            (
                r#"{"input":["a",{"content":"b"},{"content":[{"text":"c"}]},3,null,[1,2,3],true]}"#,
                true,
            ),
            (
                r#"{"input":[[1,2,3],[],"four",5,-6.5,{"x":1},false]}"#,
                true,
            ),
            (r#"{"input":[]}"#, true),
            (r#"{}"#, true),
            (
                "  {\n\t\"messages\" : [ { \"content\" : \"spaced\" } ] \r\n}  ",
                true,
            ),
            (
                r#"{"temperature":0.7,"max_tokens":12,"n":-1,"messages":[{"content":"x"}]}"#,
                true,
            ),
            // what serde_json may refuse: the walk falls back
            (
                r#"{"messages":[{"content":"lone \ud800 surrogate"}]}"#,
                false,
            ),
            (r#"{"messages":[{"content":"lone \udc00 low"}]}"#, false),
            (r#"{"messages":[{"content":"x"}],"x":1e400}"#, false),
            (r#"{"messages":[{"content":"x"}],"x":1E2}"#, false),
        ];
        for &(body, raw) in cases {
            assert_eq!(agree(body), Ok(raw), "{body}");
        }
        let long = format!(
            r#"{{"messages":[{{"content":"x"}}],"n":{}}}"#,
            "9".repeat(400)
        );
        assert_eq!(agree(&long), Ok(false));
        let long = format!(
            r#"{{"messages":[{{"content":"x"}}],"n":{}}}"#,
            "9".repeat(250)
        );
        assert_eq!(agree(&long), Ok(true));
    }

    fn text() -> impl Strategy<Value = String> {
        prop_oneof![
            "[a-z ]{0,12}",
            "\\PC{0,8}",
            Just("text".to_string()),
            Just("input_text".to_string()),
            Just("image_url".to_string()),
        ]
    }

    fn key() -> impl Strategy<Value = String> {
        prop_oneof![
            Just("messages"),
            Just("content"),
            Just("type"),
            Just("text"),
            Just("system"),
            Just("input"),
            Just("instructions"),
            Just("role"),
        ]
        .prop_map(str::to_string)
    }

    /// JSON text (not `Value`s: duplicate keys and escapes included).
    fn json_text() -> impl Strategy<Value = String> {
        let leaf = prop_oneof![
            text().prop_map(|t| serde_json::to_string(&t).unwrap()),
            // the same text with every character \u-escaped
            text().prop_map(|t| {
                let mut out = String::from("\"");
                for unit in t.encode_utf16() {
                    out.push_str(&format!("\\u{unit:04x}"));
                }
                out.push('"');
                out
            }),
            any::<i32>().prop_map(|n| n.to_string()),
            Just("1.5".to_string()),
            Just("null".to_string()),
            Just("true".to_string()),
        ];
        leaf.prop_recursive(4, 48, 6, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..6)
                    .prop_map(|items| format!("[{}]", items.join(","))),
                prop::collection::vec((key(), inner), 0..6).prop_map(|members| {
                    let members: Vec<String> = members
                        .iter()
                        .map(|(k, v)| format!("\"{k}\":{v}"))
                        .collect();
                    format!("{{{}}}", members.join(","))
                }),
            ]
        })
    }

    proptest! {
        #[test]
        fn agrees_with_the_parsed_body(members in prop::collection::vec((key(), json_text()), 0..6)) {
            let members: Vec<String> = members.iter().map(|(k, v)| format!("\"{k}\": {v}")).collect();
            let body = format!("{{{}}}", members.join(", "));
            prop_assert_eq!(agree(&body).map(|_| ()), Ok(()));
        }
    }
}
