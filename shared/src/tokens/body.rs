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

use crate::json;
use crate::usage::Api;
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
        digits.iter().try_fold(0u32, |n, &d| {
            Some(n << 4 | char::from(d).to_digit(16)?)
        })
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
            b'{' => self.members(i, depth, &mut |_, _| Some(())),
            b'[' => self.elements(i, depth, &mut |_| Some(())),
            b't' | b'n' => Some(i + 4),
            b'f' => Some(i + 5),
            _ => self.number_end(i),
        }
    }

    /// Walks the object at `i`, calling `member(key literal, value span)` for each member in
    /// document order; the end of the object.
    fn members(
        &self,
        i: usize,
        depth: usize,
        member: &mut dyn FnMut(Range<usize>, Range<usize>) -> Option<()>,
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
            let (key_end, _) = self.string_end(j)?;
            let colon = self.ws(key_end);
            if self.at(colon)? != b':' {
                return None;
            }
            let start = self.ws(colon + 1);
            let end = self.value_end(start, depth + 1)?;
            member(j..key_end, start..end)?;
            j = self.ws(end);
            match self.at(j)? {
                b',' => j = self.ws(j + 1),
                b'}' => return Some(j + 1),
                _ => return None,
            }
        }
    }

    /// Walks the array at `i`, calling `element(span)` for each element; the end of the array.
    fn elements(
        &self,
        i: usize,
        depth: usize,
        element: &mut dyn FnMut(Range<usize>) -> Option<()>,
    ) -> Option<usize> {
        if depth > MAX_DEPTH {
            return None;
        }
        let mut j = self.ws(i + 1);
        if self.at(j)? == b']' {
            return Some(j + 1);
        }
        loop {
            let end = self.value_end(j, depth + 1)?;
            element(j..end)?;
            j = self.ws(end);
            match self.at(j)? {
                b',' => j = self.ws(j + 1),
                b']' => return Some(j + 1),
                _ => return None,
            }
        }
    }

    /// The text of the string literal `span`, unescaped.
    fn string(&self, span: Range<usize>) -> Option<Cow<'a, str>> {
        let raw = self.text.get(span.clone())?;
        let inner = raw.get(1..raw.len().checked_sub(1)?)?;
        if !inner.contains('\\') {
            return Some(Cow::Borrowed(inner));
        }
        json::unescape(raw.as_bytes(), span.start).ok().map(Cow::Owned)
    }

    /// Whether the key literal `span` names `name`.
    fn key_is(&self, span: Range<usize>, name: &str) -> bool {
        self.string(span).is_some_and(|key| key == name)
    }

    /// The span of the last member named `name` of the object `span` (`Value::get`); `None`
    /// inside for a value that is no object.
    fn get(&self, span: &Range<usize>, name: &str) -> Option<Option<Range<usize>>> {
        if self.at(span.start)? != b'{' {
            return Some(None);
        }
        let mut found = None;
        self.members(span.start, 1, &mut |key, value| {
            if self.key_is(key, name) {
                found = Some(value);
            }
            Some(())
        })?;
        Some(found)
    }

    /// The string value `span`, if it is one (`Value::as_str`).
    fn as_str(&self, span: &Range<usize>) -> Option<Option<Cow<'a, str>>> {
        match self.at(span.start)? {
            b'"' => self.string(span.clone()).map(Some),
            _ => Some(None),
        }
    }
}

/// [`super::estimate_with`] over the raw `body` (see the module's notes); `None` where the
/// caller must parse with `serde_json` instead.
pub(super) fn estimate(api: Api, body: &[u8], count: &dyn Fn(&str) -> u64) -> Option<u64> {
    let doc = Doc {
        text: std::str::from_utf8(body).ok()?,
    };
    // the top level: every member walked (so nothing serde_json could refuse is left
    // unseen), the last of each name kept
    let start = doc.ws(0);
    if doc.at(start)? != b'{' {
        return None;
    }
    let (mut messages, mut system, mut input, mut instructions) = (None, None, None, None);
    let end = doc.members(start, 1, &mut |key, value| {
        let slot = match doc.string(key)?.as_ref() {
            "messages" => &mut messages,
            "system" => &mut system,
            "input" => &mut input,
            "instructions" => &mut instructions,
            _ => return Some(()),
        };
        *slot = Some(value);
        Some(())
    })?;
    if doc.ws(end) != body.len() {
        return None;
    }
    let content = |span: Option<Range<usize>>| -> Option<u64> {
        let Some(span) = span else { return Some(0) };
        match doc.at(span.start)? {
            b'"' => Some(count(&doc.string(span)?)),
            b'[' => {
                let mut total = 0u64;
                doc.elements(span.start, 1, &mut |part| {
                    let type_ok = match doc.get(&part, "type")? {
                        None => true,
                        Some(kind) => match doc.as_str(&kind)? {
                            None => true,
                            Some(kind) => {
                                matches!(kind.as_ref(), "text" | "input_text" | "output_text")
                            }
                        },
                    };
                    if !type_ok {
                        return Some(());
                    }
                    if let Some(text) = doc.get(&part, "text")? {
                        if let Some(text) = doc.as_str(&text)? {
                            total = total.saturating_add(count(&text));
                        }
                    }
                    Some(())
                })?;
                Some(total)
            }
            _ => Some(0),
        }
    };
    let message = |span: Option<Range<usize>>| -> Option<u64> {
        Some(content(span)?.saturating_add(super::MESSAGE_OVERHEAD))
    };
    // Σ message(m.content) over an array of messages
    let each_message = |span: Option<Range<usize>>, total: u64| -> Option<u64> {
        let Some(span) = span.filter(|s| doc.at(s.start) == Some(b'[')) else {
            return Some(total);
        };
        let mut total = total;
        doc.elements(span.start, 1, &mut |m| {
            total = total.saturating_add(message(doc.get(&m, "content")?)?);
            Some(())
        })?;
        Some(total)
    };
    let total = match api {
        Api::ChatCompletions => each_message(messages, 0)?,
        Api::AnthropicMessages => {
            let system = match system {
                Some(s) => message(Some(s))?,
                None => 0,
            };
            each_message(messages, system)?
        }
        Api::Responses => {
            let instructions = match instructions {
                Some(s) => message(Some(s))?,
                None => 0,
            };
            let input = match input {
                Some(span) if doc.at(span.start) == Some(b'"') => message(Some(span))?,
                Some(span) if doc.at(span.start) == Some(b'[') => {
                    let mut total = 0u64;
                    doc.elements(span.start, 1, &mut |item| {
                        let n = match doc.at(item.start)? {
                            b'"' => message(Some(item))?,
                            _ => message(doc.get(&item, "content")?)?,
                        };
                        total = total.saturating_add(n);
                        Some(())
                    })?;
                    total
                }
                _ => 0,
            };
            input.saturating_add(instructions)
        }
        Api::Embeddings => match input {
            Some(span) if doc.at(span.start) == Some(b'"') => count(&doc.string(span)?),
            Some(span) if doc.at(span.start) == Some(b'[') => {
                let mut total = 0u64;
                doc.elements(span.start, 1, &mut |item| {
                    let n = match doc.at(item.start)? {
                        b'"' => count(&doc.string(item)?),
                        b'[' => {
                            let mut ids = 0u64;
                            doc.elements(item.start, 1, &mut |_| {
                                ids += 1;
                                Some(())
                            })?;
                            ids
                        }
                        b'{' | b't' | b'f' | b'n' => 0,
                        _ => 1, // a number
                    };
                    total = total.saturating_add(n);
                    Some(())
                })?;
                total
            }
            _ => 0,
        },
    };
    Some(total.max(1))
}

#[cfg(all(test, not(target_arch = "wasm32")))]
mod tests {
    use super::super::{estimate_body_tokens_sampled, estimate_prompt_tokens_sampled, Encoding};
    use crate::json::{scan_object, Limits};
    use crate::usage::Api;
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
            (r#"{"model":"gpt-4o","messages":[{"role":"user","content":"Hello there"}]}"#, true),
            (r#"{"messages":[{"content":"a"},{"content":[{"type":"text","text":"b c"},{"type":"image_url","text":"no"},{"text":"untyped"},{"type":7,"text":"odd type"},"loose",{"type":"input_text","text":"in"}]}],"system":"sys","instructions":"do","input":"in put"}"#, true),
            // duplicates: the last one counts, at every level
            (r#"{"messages":[{"content":"first","content":"second one"}],"messages":[{"content":"last","content":"really last"}]}"#, true),
            (r#"{"messages":[{"content":[{"type":"image","type":"text","text":"x","text":"yy yy"}]}]}"#, true),
            // escapes in keys and values, surrogate pairs, other scripts
            (r#"{"m\u0065ssages":[{"c\u006fntent":"tab\there \"quoted\" \ud83d\ude00 \u00e9"}]}"#, true),
            (r#"{"messages":[{"content":"日本語のテキスト e\u0301 👩‍👩‍👧"}], "system": ["not", "content"]}"#, true),
            // not arrays, not objects, nulls
            (r#"{"messages":{"content":"x"},"system":null,"input":{"content":"y"},"instructions":5}"#, true),
            (r#"{"messages":[1,"two",null,[3],{"content":null},{"content":{"text":"x"}}]}"#, true),
            (r#"{"input":["a",{"content":"b"},{"content":[{"text":"c"}]},3,null,[1,2,3],true]}"#, true),
            (r#"{"input":[[1,2,3],[],"four",5,-6.5,{"x":1},false]}"#, true),
            (r#"{"input":[]}"#, true),
            (r#"{}"#, true),
            ("  {\n\t\"messages\" : [ { \"content\" : \"spaced\" } ] \r\n}  ", true),
            (r#"{"temperature":0.7,"max_tokens":12,"n":-1,"messages":[{"content":"x"}]}"#, true),
            // what serde_json may refuse: the walk falls back
            (r#"{"messages":[{"content":"lone \ud800 surrogate"}]}"#, false),
            (r#"{"messages":[{"content":"lone \udc00 low"}]}"#, false),
            (r#"{"messages":[{"content":"x"}],"x":1e400}"#, false),
            (r#"{"messages":[{"content":"x"}],"x":1E2}"#, false),
        ];
        for &(body, raw) in cases {
            assert_eq!(agree(body), Ok(raw), "{body}");
        }
        let long = format!(r#"{{"messages":[{{"content":"x"}}],"n":{}}}"#, "9".repeat(400));
        assert_eq!(agree(&long), Ok(false));
        let long = format!(r#"{{"messages":[{{"content":"x"}}],"n":{}}}"#, "9".repeat(250));
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
