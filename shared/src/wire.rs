//! The byte formats and status codes of the proxy-wasm ABI 0.2.1, encoded and decoded without
//! trusting the host: header maps, property paths, property values as Envoy encodes them, and
//! every status Envoy returns (its `WasmResult`).
//!
//! Pure functions, so they are tested natively and on wasm; [`crate::host`] uses them.
//! Decoding returns `None` on anything malformed instead of indexing past the end (the
//! proxy-wasm SDK's own decoder `unwrap`s and would trap the VM).

/// A host call that did not return OK. The names are Envoy's `WasmResult`s.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HostError {
    /// 1: the item does not exist (most getters map this to `None` instead).
    NotFound,
    /// 2: the host refused the arguments (a header change after `Continue`, say).
    BadArgument,
    /// 3: the host could not serialize the value.
    SerializationFailure,
    /// 4: the host could not parse the input.
    ParseFailure,
    /// 5: the property path is not a valid expression.
    BadExpression,
    /// 6: a pointer or size was outside linear memory.
    InvalidMemoryAccess,
    /// 7: nothing to return (an empty queue).
    Empty,
    /// 8: a shared-data CAS no longer matches: re-read and retry.
    CasMismatch,
    /// 9: the result has an unexpected type.
    ResultMismatch,
    /// 10: the host failed internally.
    InternalFailure,
    /// 11: the connection went away.
    BrokenConnection,
    /// 12: the host does not implement this call.
    Unimplemented,
    /// A status this layer does not know.
    Unknown(u32),
    /// The host returned bytes this layer could not decode.
    Malformed(&'static str),
}

impl HostError {
    /// `Ok` for status 0, else the error it names.
    pub fn check(status: u32) -> Result<(), HostError> {
        match status {
            0 => Ok(()),
            other => Err(HostError::from_status(other)),
        }
    }

    /// The error a non-zero status names.
    pub fn from_status(status: u32) -> Self {
        match status {
            1 => HostError::NotFound,
            2 => HostError::BadArgument,
            3 => HostError::SerializationFailure,
            4 => HostError::ParseFailure,
            5 => HostError::BadExpression,
            6 => HostError::InvalidMemoryAccess,
            7 => HostError::Empty,
            8 => HostError::CasMismatch,
            9 => HostError::ResultMismatch,
            10 => HostError::InternalFailure,
            11 => HostError::BrokenConnection,
            12 => HostError::Unimplemented,
            other => HostError::Unknown(other),
        }
    }
}

impl std::fmt::Display for HostError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HostError::Unknown(status) => write!(f, "host status {status}"),
            HostError::Malformed(what) => write!(f, "malformed {what} from host"),
            other => write!(f, "{other:?}"),
        }
    }
}

impl std::error::Error for HostError {}

/// Encodes header pairs: `u32` count, then `u32` name and value lengths per pair, then each
/// name and value followed by a NUL byte, all little-endian.
pub fn encode_header_map<V: AsRef<[u8]>>(pairs: &[(&str, V)]) -> Vec<u8> {
    encode_pairs(pairs)
}

/// [`encode_header_map`] of a header list as [`decode_header_map`] gives it.
pub fn encode_header_list(pairs: &[(String, Vec<u8>)]) -> Vec<u8> {
    encode_pairs(pairs)
}

fn encode_pairs<N: AsRef<str>, V: AsRef<[u8]>>(pairs: &[(N, V)]) -> Vec<u8> {
    let size = 4 + pairs
        .iter()
        .map(|(n, v)| 10 + n.as_ref().len() + v.as_ref().len())
        .sum::<usize>();
    let mut out = Vec::with_capacity(size);
    out.extend_from_slice(&len_u32(pairs.len()).to_le_bytes());
    for (name, value) in pairs {
        out.extend_from_slice(&len_u32(name.as_ref().len()).to_le_bytes());
        out.extend_from_slice(&len_u32(value.as_ref().len()).to_le_bytes());
    }
    for (name, value) in pairs {
        out.extend_from_slice(name.as_ref().as_bytes());
        out.push(0);
        out.extend_from_slice(value.as_ref());
        out.push(0);
    }
    out
}

fn len_u32(len: usize) -> u32 {
    u32::try_from(len).unwrap_or(u32::MAX)
}

/// Decodes a header map. Names that are not UTF-8 are decoded lossily (HTTP header names
/// are ASCII tokens; Envoy would not pass anything else); values stay bytes, since obs-text
/// is legal in HTTP/1 header values. `None` if the encoding is malformed.
pub fn decode_header_map(bytes: &[u8]) -> Option<Vec<(String, Vec<u8>)>> {
    if bytes.is_empty() {
        return Some(Vec::new());
    }
    let count = read_u32(bytes, 0)? as usize;
    // Each pair needs at least 8 bytes of lengths and 2 NULs: bound the allocation by the
    // input, not by a count the host claims.
    if count > bytes.len() / 10 {
        return None;
    }
    let mut sizes = Vec::with_capacity(count);
    for i in 0..count {
        let at = 4 + i * 8;
        sizes.push((
            read_u32(bytes, at)? as usize,
            read_u32(bytes, at + 4)? as usize,
        ));
    }
    let mut pos = 4 + count * 8;
    let mut pairs = Vec::with_capacity(count);
    for (name_len, value_len) in sizes {
        let name = bytes.get(pos..pos.checked_add(name_len)?)?;
        pos = pos.checked_add(name_len)?.checked_add(1)?;
        let value = bytes.get(pos..pos.checked_add(value_len)?)?;
        pos = pos.checked_add(value_len)?.checked_add(1)?;
        pairs.push((String::from_utf8_lossy(name).into_owned(), value.to_vec()));
    }
    Some(pairs)
}

/// A header map as the host serialized it, looked up in place: one host call
/// (`proxy_get_header_map_pairs`) instead of one per header, and no allocation per pair, for a
/// filter that reads a few named headers in one callback.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EncodedHeaders {
    bytes: Vec<u8>,
    /// Per pair: where its name starts, the name's length, where its value starts, the
    /// value's length (checked against `bytes` once, when the map is read).
    index: Vec<[u32; 4]>,
}

impl EncodedHeaders {
    /// Checks the encoding once ([`decode_header_map`]'s format) and indexes its pairs; `None`
    /// if it is malformed.
    pub fn new(bytes: Vec<u8>) -> Option<EncodedHeaders> {
        if bytes.is_empty() {
            return Some(EncodedHeaders::default());
        }
        let count = read_u32(&bytes, 0)? as usize;
        if count > bytes.len() / 10 {
            return None;
        }
        let mut index = Vec::with_capacity(count);
        let mut pos = 4 + count * 8;
        for i in 0..count {
            let at = 4 + i * 8;
            let name_len = read_u32(&bytes, at)?;
            let value_len = read_u32(&bytes, at + 4)?;
            let value_at = pos.checked_add(name_len as usize)?.checked_add(1)?;
            let end = value_at.checked_add(value_len as usize)?;
            if end > bytes.len() {
                return None;
            }
            index.push([
                u32::try_from(pos).ok()?,
                name_len,
                u32::try_from(value_at).ok()?,
                value_len,
            ]);
            pos = end.checked_add(1)?;
        }
        Some(EncodedHeaders { bytes, index })
    }

    /// The first value of header `name` (ASCII case-insensitive, as the host's
    /// `proxy_get_header_map_value`); `None` if absent.
    pub fn get(&self, name: &str) -> Option<&[u8]> {
        let wanted = name.as_bytes();
        let [_, _, value_at, value_len] = self.index.iter().find(|[at, len, _, _]| {
            *len as usize == wanted.len()
                && self
                    .bytes
                    .get(*at as usize..(*at as usize).saturating_add(*len as usize))
                    .is_some_and(|n| n.eq_ignore_ascii_case(wanted))
        })?;
        self.bytes
            .get(*value_at as usize..(*value_at as usize).checked_add(*value_len as usize)?)
    }

    /// A header's first value as text; `None` if absent or not UTF-8.
    pub fn text(&self, name: &str) -> Option<&str> {
        self.get(name).and_then(|v| std::str::from_utf8(v).ok())
    }

    /// Every pair, name and value as the host encoded them, in the host's order.
    pub fn iter(&self) -> impl Iterator<Item = (&[u8], &[u8])> + '_ {
        self.index.iter().map(|&[at, len, value_at, value_len]| {
            let slice = |at: u32, len: u32| {
                let at = at as usize;
                self.bytes
                    .get(at..at.saturating_add(len as usize))
                    .unwrap_or_default()
            };
            (slice(at, len), slice(value_at, value_len))
        })
    }

    /// How many pairs the map holds.
    pub fn len(&self) -> usize {
        self.index.len()
    }

    /// The map holds no pair.
    pub fn is_empty(&self) -> bool {
        self.index.is_empty()
    }
}

fn read_u32(bytes: &[u8], at: usize) -> Option<u32> {
    let raw: [u8; 4] = bytes.get(at..at.checked_add(4)?)?.try_into().ok()?;
    Some(u32::from_le_bytes(raw))
}

/// Encodes a property path: the segments joined by NUL bytes.
pub fn encode_property_path(path: &[&str]) -> Vec<u8> {
    let mut out = Vec::with_capacity(path.iter().map(|p| p.len() + 1).sum());
    for (i, segment) in path.iter().enumerate() {
        if i > 0 {
            out.push(0);
        }
        out.extend_from_slice(segment.as_bytes());
    }
    out
}

/// Decodes an integer property: Envoy sends `int64`/`uint64` values as 8 little-endian bytes
/// (so `source.port` is not text).
pub fn decode_property_u64(bytes: &[u8]) -> Option<u64> {
    let raw: [u8; 8] = bytes.try_into().ok()?;
    Some(u64::from_le_bytes(raw))
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn encoded_headers_find_what_the_decoder_finds() {
        let pairs: Vec<(&str, &[u8])> = vec![
            (":path", b"/v1/chat/completions"),
            ("x-bin", &[0xff, 0x00, 0x80]),
            ("empty", b""),
            ("x-dup", b"first"),
            ("x-dup", b"second"),
        ];
        let headers = EncodedHeaders::new(encode_header_map(&pairs)).unwrap();
        assert_eq!(headers.get(":path"), Some(&b"/v1/chat/completions"[..]));
        assert_eq!(headers.text(":path"), Some("/v1/chat/completions"));
        assert_eq!(headers.get("x-bin"), Some(&[0xff, 0x00, 0x80][..]));
        assert_eq!(headers.text("x-bin"), None);
        assert_eq!(headers.get("empty"), Some(&b""[..]));
        assert_eq!(headers.get("X-Dup"), Some(&b"first"[..]));
        assert_eq!(headers.get("absent"), None);
        assert_eq!(EncodedHeaders::new(Vec::new()).unwrap().get(":path"), None);
    }

    #[test]
    fn encoded_headers_refuse_a_truncated_map() {
        let full = encode_header_map(&[("name", b"value".as_slice()), ("other", b"x")]);
        for cut in 1..full.len() - 1 {
            let bytes = full.get(..cut).unwrap().to_vec();
            assert_eq!(
                EncodedHeaders::new(bytes.clone()).is_some(),
                decode_header_map(&bytes).is_some(),
                "cut at {cut}"
            );
        }
        assert!(EncodedHeaders::new(full).is_some());
    }

    #[test]
    fn header_map_round_trip() {
        let pairs: Vec<(&str, &[u8])> = vec![
            (":path", b"/v1/chat/completions"),
            ("x-bin", &[0xff, 0x00, 0x80]),
            ("empty", b""),
        ];
        let encoded = encode_header_map(&pairs);
        let decoded = decode_header_map(&encoded).unwrap();
        assert_eq!(decoded.len(), 3);
        for ((n1, v1), (n2, v2)) in pairs.iter().zip(&decoded) {
            assert_eq!(*n1, n2);
            assert_eq!(*v1, v2.as_slice());
        }
        assert_eq!(decode_header_map(&[]), Some(vec![]));
        assert_eq!(
            decode_header_map(&encode_header_map::<&str>(&[])),
            Some(vec![])
        );
        // the owned list encodes byte for byte the same
        assert_eq!(encode_header_list(&decoded), encoded);
    }

    #[test]
    fn malformed_header_maps_are_refused() {
        let good = encode_header_map(&[("a", "b"), ("cc", "dd")]);
        for cut in 1..good.len() - 1 {
            assert_eq!(decode_header_map(&good[..cut]), None, "cut at {cut}");
        }
        // a count far beyond the input must not allocate it
        let mut huge = u32::MAX.to_le_bytes().to_vec();
        huge.extend_from_slice(&[0; 16]);
        assert_eq!(decode_header_map(&huge), None);
        // lengths that overflow
        let mut bad = 1u32.to_le_bytes().to_vec();
        bad.extend_from_slice(&u32::MAX.to_le_bytes());
        bad.extend_from_slice(&u32::MAX.to_le_bytes());
        bad.extend_from_slice(&[0; 4]);
        assert_eq!(decode_header_map(&bad), None);
    }

    #[test]
    fn every_envoy_status_has_its_own_error() {
        assert_eq!(HostError::check(0), Ok(()));
        let errors: Vec<HostError> = (1..=12).map(HostError::from_status).collect();
        for (i, a) in errors.iter().enumerate() {
            assert!(
                !matches!(a, HostError::Unknown(_)),
                "status {} unknown",
                i + 1
            );
            for b in &errors[i + 1..] {
                assert_ne!(a, b);
            }
        }
        assert_eq!(HostError::check(8), Err(HostError::CasMismatch));
        assert_eq!(HostError::from_status(13), HostError::Unknown(13));
        assert_eq!(
            HostError::from_status(u32::MAX).to_string(),
            format!("host status {}", u32::MAX)
        );
    }

    #[test]
    fn property_paths_and_integers() {
        assert_eq!(
            encode_property_path(&["xds", "route_name"]),
            b"xds\0route_name"
        );
        assert_eq!(encode_property_path(&["route_name"]), b"route_name");
        assert_eq!(encode_property_path(&[]), b"");
        assert_eq!(decode_property_u64(&8080u64.to_le_bytes()), Some(8080));
        assert_eq!(decode_property_u64(b"8080"), None);
    }

    #[cfg(not(target_arch = "wasm32"))]
    mod properties {
        use super::*;
        use proptest::prelude::*;

        proptest! {
            #[test]
            fn decode_is_total(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
                let _ = decode_header_map(&bytes);
            }

            #[test]
            fn round_trip(pairs in proptest::collection::vec(("[a-z:-]{0,12}", proptest::collection::vec(any::<u8>(), 0..20)), 0..8)) {
                let borrowed: Vec<(&str, &[u8])> = pairs.iter().map(|(n, v)| (n.as_str(), v.as_slice())).collect();
                let decoded = decode_header_map(&encode_header_map(&borrowed)).unwrap();
                prop_assert_eq!(decoded, pairs);
            }

            #[test]
            fn encoded_headers_agree_with_the_decoder(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
                let decoded = decode_header_map(&bytes);
                let encoded = EncodedHeaders::new(bytes);
                prop_assert_eq!(encoded.is_some(), decoded.is_some());
                if let (Some(encoded), Some(decoded)) = (encoded, decoded) {
                    // a name that is not UTF-8 decodes lossily: only the others can be asked for
                    for (name, _) in decoded.iter().filter(|(n, _)| !n.contains('\u{fffd}')) {
                        let first = decoded.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_slice());
                        prop_assert_eq!(encoded.get(name), first);
                    }
                }
            }

            #[test]
            fn encoded_headers_list_the_decoders_pairs(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
                if let (Some(encoded), Some(decoded)) = (EncodedHeaders::new(bytes.clone()), decode_header_map(&bytes)) {
                    let listed: Vec<(String, Vec<u8>)> = encoded
                        .iter()
                        .map(|(n, v)| (String::from_utf8_lossy(n).into_owned(), v.to_vec()))
                        .collect();
                    prop_assert_eq!(encoded.len(), decoded.len());
                    prop_assert_eq!(listed, decoded);
                }
            }

            #[test]
            fn encoded_headers_list_what_was_encoded(pairs in proptest::collection::vec(("[a-z:-]{0,12}", proptest::collection::vec(any::<u8>(), 0..20)), 0..8)) {
                let borrowed: Vec<(&str, &[u8])> = pairs.iter().map(|(n, v)| (n.as_str(), v.as_slice())).collect();
                let encoded = EncodedHeaders::new(encode_header_map(&borrowed)).unwrap();
                let listed: Vec<(&[u8], &[u8])> = encoded.iter().collect();
                let expected: Vec<(&[u8], &[u8])> = borrowed.iter().map(|(n, v)| (n.as_bytes(), *v)).collect();
                prop_assert_eq!(listed, expected);
                prop_assert_eq!(encoded.is_empty(), pairs.is_empty());
            }

            #[test]
            fn encoded_headers_find_the_first_value(pairs in proptest::collection::vec(("[a-c:-]{0,3}", proptest::collection::vec(any::<u8>(), 0..6)), 0..8), name in "[a-c:-]{0,3}") {
                let borrowed: Vec<(&str, &[u8])> = pairs.iter().map(|(n, v)| (n.as_str(), v.as_slice())).collect();
                let encoded = EncodedHeaders::new(encode_header_map(&borrowed)).unwrap();
                let first = pairs.iter().find(|(n, _)| *n == name).map(|(_, v)| v.as_slice());
                prop_assert_eq!(encoded.get(&name), first);
            }
        }
    }
}
