//! Helpers the fuzz targets share: reading a few parameter bytes off the front of an input,
//! cutting the rest into network chunks, and a reference RESP encoder.
//!
//! A target's input is `parameters ++ payload`. Parameters are read with [`Input`] (a missing
//! byte reads as 0, so every input is valid); the payload is what the code under test sees.
//! Keeping the layout this simple keeps the committed seeds readable: a seed is a few
//! parameter bytes followed by a real SSE stream, body, config or reply.

use llm_gateway_shared::resp::Reply;

/// Parameter bytes at the front of an input.
#[derive(Debug)]
pub struct Input<'a> {
    data: &'a [u8],
}

impl<'a> Input<'a> {
    pub fn new(data: &'a [u8]) -> Self {
        Input { data }
    }

    /// The next byte (0 once the input is used up).
    pub fn byte(&mut self) -> u8 {
        match self.data.split_first() {
            Some((&b, rest)) => {
                self.data = rest;
                b
            }
            None => 0,
        }
    }

    /// A split plan: one length byte `n`, then `n & 0x1f` chunk sizes. Bit 7 of `n` asks for
    /// one byte per chunk instead (every possible cut at once).
    pub fn plan(&mut self) -> Plan {
        let n = self.byte();
        if n & 0x80 != 0 {
            return Plan::EveryByte;
        }
        let sizes = (0..n & 0x1f).map(|_| usize::from(self.byte())).collect();
        Plan::Sizes(sizes)
    }

    /// Everything not read yet.
    pub fn rest(self) -> &'a [u8] {
        self.data
    }
}

/// How a payload is cut into chunks.
#[derive(Debug, Clone)]
pub enum Plan {
    /// Chunks of these sizes (0: an empty chunk, which hosts do deliver), then the rest as
    /// the last chunk.
    Sizes(Vec<usize>),
    /// One chunk per byte.
    EveryByte,
}

impl Plan {
    /// `payload` cut by this plan; the chunks concatenate to `payload`.
    pub fn split<'p>(&self, payload: &'p [u8]) -> Vec<&'p [u8]> {
        match self {
            Plan::EveryByte => payload.chunks(1).collect(),
            Plan::Sizes(sizes) => {
                let mut chunks = Vec::with_capacity(sizes.len() + 1);
                let mut rest = payload;
                for &size in sizes {
                    let (chunk, tail) = rest.split_at(size.min(rest.len()));
                    chunks.push(chunk);
                    rest = tail;
                }
                chunks.push(rest);
                chunks
            }
        }
    }

    /// `text` cut by this plan, each cut moved back to a character boundary.
    pub fn split_str<'t>(&self, text: &'t str) -> Vec<&'t str> {
        let mut chunks = Vec::new();
        let (mut start, mut cut) = (0, 0);
        for chunk in self.split(text.as_bytes()) {
            cut += chunk.len();
            let mut end = cut;
            while !text.is_char_boundary(end) {
                end -= 1;
            }
            let end = end.max(start);
            chunks.push(text.get(start..end).unwrap_or_default());
            start = end;
        }
        // `cut` reached the end, a boundary: nothing is left over
        chunks
    }
}

/// The RESP2 bytes of `reply` (the shortest form: what Redis itself sends).
pub fn encode_reply(reply: &Reply, out: &mut Vec<u8>) {
    match reply {
        Reply::Simple(s) => {
            out.push(b'+');
            out.extend_from_slice(s.as_bytes());
        }
        Reply::Error(e) => {
            out.push(b'-');
            out.extend_from_slice(e.as_bytes());
        }
        Reply::Integer(i) => {
            out.push(b':');
            out.extend_from_slice(i.to_string().as_bytes());
        }
        Reply::Bulk(None) => out.extend_from_slice(b"$-1"),
        Reply::Bulk(Some(bytes)) => {
            out.push(b'$');
            out.extend_from_slice(bytes.len().to_string().as_bytes());
            out.extend_from_slice(b"\r\n");
            out.extend_from_slice(bytes);
        }
        Reply::Array(None) => out.extend_from_slice(b"*-1"),
        Reply::Array(Some(items)) => {
            out.push(b'*');
            out.extend_from_slice(items.len().to_string().as_bytes());
            out.extend_from_slice(b"\r\n");
            for item in items {
                encode_reply(item, out);
            }
            return;
        }
    }
    out.extend_from_slice(b"\r\n");
}
