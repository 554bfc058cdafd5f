//! A JSON document borrowed from the bytes it was read from, for the request translation.
//!
//! `serde_json::Value` copies every string and key and sorts every object into a `BTreeMap`;
//! a request body is read once and mostly copied across, so [`Doc`] keeps strings borrowed
//! (copied only when they hold an escape), objects as their members in document order, and
//! lets an output document point into the input ([`Doc::Ref`]) instead of cloning a subtree.
//! Parsing is still `serde_json`'s (same grammar, same errors, recursion bounded at 128).

use llm_gateway_shared::json::push_quoted;
use serde::de::{Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use std::borrow::Cow;
use std::fmt;

/// A JSON value; see the module docs.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Doc<'a> {
    Null,
    Bool(bool),
    Number(serde_json::Number),
    String(Cow<'a, str>),
    Array(Vec<Doc<'a>>),
    /// Members in document order, duplicates kept (readers take the last, as serde_json).
    Object(Vec<(Cow<'a, str>, Doc<'a>)>),
    /// A value of another document, written as it is.
    Ref(&'a Doc<'a>),
}

impl<'a> Doc<'a> {
    /// `bytes` as a document.
    pub(super) fn parse(bytes: &'a [u8]) -> Result<Doc<'a>, serde_json::Error> {
        serde_json::from_slice(bytes)
    }

    /// A string.
    pub(super) fn str(s: &'a str) -> Doc<'a> {
        Doc::String(Cow::Borrowed(s))
    }

    /// An object of the given members.
    pub(super) fn object<const N: usize>(members: [(&'static str, Doc<'a>); N]) -> Doc<'a> {
        Doc::Object(
            members
                .into_iter()
                .map(|(k, v)| (Cow::Borrowed(k), v))
                .collect(),
        )
    }

    /// `{"type":"text","text":text}`, the text block and the text part alike.
    pub(super) fn text(text: &'a str) -> Doc<'a> {
        Doc::object([("type", Doc::str("text")), ("text", Doc::str(text))])
    }

    /// Through references.
    fn resolved(&self) -> &Doc<'a> {
        let mut doc = self;
        while let Doc::Ref(inner) = doc {
            doc = inner;
        }
        doc
    }

    /// Member `key` (the last one when repeated); `null` counts as absent.
    pub(super) fn field(&self, key: &str) -> Option<&Doc<'a>> {
        match self.resolved() {
            Doc::Object(members) => members
                .iter()
                .rev()
                .find(|(k, _)| k == key)
                .map(|(_, v)| v.resolved())
                .filter(|v| !v.is_null()),
            _ => None,
        }
    }

    /// The members in document order, each key once: where the last duplicate stands (its
    /// value is the one [`Doc::field`] reads).
    pub(super) fn members(&self) -> impl Iterator<Item = (&str, &Doc<'a>)> {
        let members = match self.resolved() {
            Doc::Object(members) => members.as_slice(),
            _ => &[],
        };
        members.iter().enumerate().filter_map(move |(i, (k, v))| {
            let later = members.get(i + 1..).unwrap_or_default();
            (!later.iter().any(|(other, _)| other == k)).then_some((k.as_ref(), v.resolved()))
        })
    }

    pub(super) fn as_str(&self) -> Option<&str> {
        match self.resolved() {
            Doc::String(s) => Some(s),
            _ => None,
        }
    }

    pub(super) fn as_array(&self) -> Option<&[Doc<'a>]> {
        match self.resolved() {
            Doc::Array(items) => Some(items),
            _ => None,
        }
    }

    pub(super) fn as_u64(&self) -> Option<u64> {
        match self.resolved() {
            Doc::Number(n) => n.as_u64(),
            _ => None,
        }
    }

    pub(super) fn as_f64(&self) -> Option<f64> {
        match self.resolved() {
            Doc::Number(n) => n.as_f64(),
            _ => None,
        }
    }

    pub(super) fn as_bool(&self) -> Option<bool> {
        match self.resolved() {
            Doc::Bool(b) => Some(*b),
            _ => None,
        }
    }

    pub(super) fn is_null(&self) -> bool {
        matches!(self.resolved(), Doc::Null)
    }

    pub(super) fn is_object(&self) -> bool {
        matches!(self.resolved(), Doc::Object(_))
    }

    pub(super) fn is_number(&self) -> bool {
        matches!(self.resolved(), Doc::Number(_))
    }

    /// Appends the compact JSON text. An object with a repeated key is written with every
    /// copy, as it came (it only comes from an input).
    pub(super) fn write(&self, out: &mut Vec<u8>) {
        match self {
            Doc::Null => out.extend_from_slice(b"null"),
            Doc::Bool(true) => out.extend_from_slice(b"true"),
            Doc::Bool(false) => out.extend_from_slice(b"false"),
            Doc::Number(n) => out.extend_from_slice(n.to_string().as_bytes()),
            Doc::String(s) => push_quoted(out, s),
            Doc::Array(items) => {
                out.push(b'[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push(b',');
                    }
                    item.write(out);
                }
                out.push(b']');
            }
            Doc::Object(members) => {
                out.push(b'{');
                for (i, (key, value)) in members.iter().enumerate() {
                    if i > 0 {
                        out.push(b',');
                    }
                    push_quoted(out, key);
                    out.push(b':');
                    value.write(out);
                }
                out.push(b'}');
            }
            Doc::Ref(inner) => inner.write(out),
        }
    }

    /// The compact JSON text.
    pub(super) fn to_json(&self) -> String {
        let mut out = Vec::new();
        self.write(&mut out);
        // written from `str`s and ASCII only
        String::from_utf8(out).unwrap_or_default()
    }
}

impl<'de: 'a, 'a> Deserialize<'de> for Doc<'a> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct DocVisitor;
        impl<'de> Visitor<'de> for DocVisitor {
            type Value = Doc<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON value")
            }
            fn visit_unit<E>(self) -> Result<Doc<'de>, E> {
                Ok(Doc::Null)
            }
            fn visit_bool<E>(self, b: bool) -> Result<Doc<'de>, E> {
                Ok(Doc::Bool(b))
            }
            fn visit_u64<E>(self, n: u64) -> Result<Doc<'de>, E> {
                Ok(Doc::Number(n.into()))
            }
            fn visit_i64<E>(self, n: i64) -> Result<Doc<'de>, E> {
                Ok(Doc::Number(n.into()))
            }
            fn visit_f64<E>(self, n: f64) -> Result<Doc<'de>, E> {
                // JSON has no NaN or infinity: serde_json never hands one
                Ok(serde_json::Number::from_f64(n).map_or(Doc::Null, Doc::Number))
            }
            fn visit_borrowed_str<E>(self, s: &'de str) -> Result<Doc<'de>, E> {
                Ok(Doc::String(Cow::Borrowed(s)))
            }
            fn visit_str<E>(self, s: &str) -> Result<Doc<'de>, E> {
                Ok(Doc::String(Cow::Owned(s.to_string())))
            }
            fn visit_string<E>(self, s: String) -> Result<Doc<'de>, E> {
                Ok(Doc::String(Cow::Owned(s)))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Doc<'de>, A::Error> {
                let mut items = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(64));
                while let Some(item) = seq.next_element()? {
                    items.push(item);
                }
                Ok(Doc::Array(items))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Doc<'de>, A::Error> {
                let mut members = Vec::with_capacity(map.size_hint().unwrap_or(0).min(64));
                while let Some(member) = map.next_entry::<Cow<'de, str>, Doc<'de>>()? {
                    members.push(member);
                }
                Ok(Doc::Object(members))
            }
        }
        deserializer.deserialize_any(DocVisitor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_like_serde_json_and_writes_compact_json() {
        let raw = br#" {"b": [1, -2, 0.5, 1e400, true, null], "a": "x\"\u00e9", "b": {"k": "v"}} "#;
        assert!(
            Doc::parse(raw).is_err(),
            "1e400 is out of range, as for serde_json"
        );
        let raw = br#" {"b": [1, -2, 0.5, 1e300, true, null], "a": "x\"\u00e9", "b": {"k": "v"}} "#;
        let doc = Doc::parse(raw).unwrap();
        let value: serde_json::Value = serde_json::from_slice(raw).unwrap();
        assert_eq!(
            doc.field("b").unwrap().field("k").unwrap().as_str(),
            Some("v")
        );
        assert_eq!(doc.field("a").unwrap().as_str(), value["a"].as_str());
        let members: Vec<&str> = doc.members().map(|(k, _)| k).collect();
        assert_eq!(members, ["a", "b"]);
        assert_eq!(
            doc.to_json(),
            r#"{"b":[1,-2,0.5,1e+300,true,null],"a":"x\"é","b":{"k":"v"}}"#
        );
        let reparsed: serde_json::Value = serde_json::from_str(&doc.to_json()).unwrap();
        assert_eq!(reparsed, value);
    }

    #[test]
    fn unescaped_strings_are_borrowed() {
        let doc = Doc::parse(br#"{"plain":"abc","escaped":"a\nb"}"#).unwrap();
        let Doc::Object(members) = &doc else {
            panic!("an object")
        };
        assert!(matches!(members[0].1, Doc::String(Cow::Borrowed("abc"))));
        assert!(matches!(&members[1].1, Doc::String(Cow::Owned(s)) if s == "a\nb"));
    }

    #[test]
    fn null_members_are_absent_and_refs_read_through() {
        let doc = Doc::parse(br#"{"a":null,"b":{"c":1}}"#).unwrap();
        assert!(doc.field("a").is_none());
        let inner = doc.field("b").unwrap();
        let wrapped = Doc::object([("r", Doc::Ref(inner))]);
        assert_eq!(
            wrapped.field("r").unwrap().field("c").unwrap().as_u64(),
            Some(1)
        );
        assert_eq!(wrapped.to_json(), r#"{"r":{"c":1}}"#);
    }

    #[test]
    fn nesting_is_bounded() {
        let deep = format!("{}{}", "[".repeat(10_000), "]".repeat(10_000));
        assert!(Doc::parse(deep.as_bytes()).is_err());
    }
}
