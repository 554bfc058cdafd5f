//! `wasm-abi`: reads or renames the proxy-wasm ABI version export of a compiled module.
//!
//! A proxy-wasm host picks the ABI by the module's `proxy_abi_version_*` export. The stock Rust
//! SDK (proxy-wasm 0.2.5, `src/lib.rs`) exports `proxy_abi_version_0_2_1` and nothing else that
//! names the ABI. Higress's cpp-host passes a headers `StopIteration` through only for modules
//! exporting `proxy_abi_version_0_2_100`, while upstream Envoy refuses a module that exports
//! only that one. So `scripts/build` writes each plugin twice from one source: the plain build
//! (`_0_2_1`, for Envoy) and a copy whose export is renamed (`_0_2_100`, for Higress,
//! `dist/higress/`). Renaming is all it takes: the export is an empty function, and the
//! functions both ABIs share are the same.
//!
//! ```text
//! wasm-abi show IN.wasm                 prints the module's proxy_abi_version_* exports
//! wasm-abi set VERSION IN.wasm OUT.wasm writes IN with its one ABI export renamed to
//!                                       proxy_abi_version_<VERSION> (e.g. 0_2_100)
//! wasm-abi drop IN.wasm OUT.wasm NAME.. writes IN without the stream callback exports NAME..
//! ```
//!
//! `drop` is for the callbacks a plugin leaves at the SDK's default (`scripts/unused-callbacks`):
//! the SDK exports every `proxy_on_*`, so the host enters the VM for each of them (for every
//! SSE event, for `proxy_on_response_body`) only to run a default that returns `Continue`.
//! proxy-wasm-cpp-host, which Envoy and Higress's fork both run (`src/context.cc`), skips a
//! stream callback the module does not export and answers as the default would (`Continue`;
//! `true` for `proxy_on_done`). Only the stream callbacks listed in [`DROPPABLE`] can go, and
//! each must be exported (a name the SDK stopped exporting is an error, not a silent no-op).
//!
//! It refuses (exit 1) a file that is not a WebAssembly module, a malformed one, and one that
//! does not export exactly one `proxy_abi_version_*`. Only the export section is rewritten
//! (its size re-encoded as LEB128); every other byte is copied as it is. It does not validate
//! the rest of the module.
#![forbid(unsafe_code)]

use std::process::ExitCode;

const MAGIC: &[u8; 8] = b"\0asm\x01\0\0\0";
const EXPORT_SECTION: u8 = 7;
const ABI_PREFIX: &str = "proxy_abi_version_";

/// The exports `drop` may remove: HTTP stream callbacks whose absence the host answers as the
/// SDK's default does (never a root callback, `proxy_on_context_create`, `proxy_on_delete` or
/// the memory allocator, which the host needs).
const DROPPABLE: [&str; 7] = [
    "proxy_on_request_trailers",
    "proxy_on_response_headers",
    "proxy_on_response_body",
    "proxy_on_response_trailers",
    "proxy_on_log",
    "proxy_on_done",
    "proxy_on_request_body",
];

/// Why a module cannot be read or rewritten.
#[derive(Debug, PartialEq, Eq)]
enum Error {
    NotWasm,
    Truncated,
    LebTooLong,
    NameNotUtf8,
    NoExportSection,
    AbiExports(Vec<String>),
    BadVersion(String),
    NotDroppable(String),
    NotExported(String),
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Error::NotWasm => write!(f, "not a WebAssembly 1.0 module (magic or version)"),
            Error::Truncated => write!(f, "malformed module: truncated"),
            Error::LebTooLong => write!(f, "malformed module: LEB128 longer than 5 bytes"),
            Error::NameNotUtf8 => write!(f, "malformed module: an export name is not UTF-8"),
            Error::NoExportSection => write!(f, "no export section (not a proxy-wasm module)"),
            Error::AbiExports(found) if found.is_empty() => {
                write!(f, "exports no {ABI_PREFIX}* (not a proxy-wasm module)")
            }
            Error::AbiExports(found) => write!(
                f,
                "exports {} ABI versions ({}); exactly one expected",
                found.len(),
                found.join(", ")
            ),
            Error::NotDroppable(name) => write!(
                f,
                "{name} is not a stream callback that may be dropped ({})",
                DROPPABLE.join(", ")
            ),
            Error::NotExported(name) => write!(f, "{name} is not exported"),
            Error::BadVersion(v) => write!(
                f,
                "{v:?} is not an ABI version (digits and underscores, like 0_2_100)"
            ),
        }
    }
}

/// A cursor over the module's bytes: every read is bounds-checked.
struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn byte(&mut self) -> Result<u8, Error> {
        let b = *self.bytes.get(self.pos).ok_or(Error::Truncated)?;
        self.pos += 1;
        Ok(b)
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], Error> {
        let end = self.pos.checked_add(n).ok_or(Error::Truncated)?;
        let out = self.bytes.get(self.pos..end).ok_or(Error::Truncated)?;
        self.pos = end;
        Ok(out)
    }

    /// An unsigned LEB128 `u32` (at most 5 bytes).
    fn u32(&mut self) -> Result<u32, Error> {
        let mut value: u64 = 0;
        for i in 0..5 {
            let b = self.byte()?;
            value |= u64::from(b & 0x7f) << (7 * i);
            if b & 0x80 == 0 {
                return u32::try_from(value).map_err(|_| Error::LebTooLong);
            }
        }
        Err(Error::LebTooLong)
    }

    fn done(&self) -> bool {
        self.pos >= self.bytes.len()
    }
}

fn write_u32(out: &mut Vec<u8>, mut value: u32) {
    loop {
        let b = (value & 0x7f) as u8;
        value >>= 7;
        if value == 0 {
            out.push(b);
            return;
        }
        out.push(b | 0x80);
    }
}

/// One export: its name and the raw bytes of its kind and index (copied as they are).
struct Export<'a> {
    name: String,
    rest: &'a [u8],
}

fn read_exports(payload: &[u8]) -> Result<Vec<Export<'_>>, Error> {
    let mut r = Reader {
        bytes: payload,
        pos: 0,
    };
    let count = r.u32()?;
    let mut out = Vec::new();
    for _ in 0..count {
        let len = r.u32()? as usize;
        let name = std::str::from_utf8(r.take(len)?).map_err(|_| Error::NameNotUtf8)?;
        let start = r.pos;
        r.byte()?; // kind
        r.u32()?; // index
        let rest = payload.get(start..r.pos).ok_or(Error::Truncated)?;
        out.push(Export {
            name: name.to_string(),
            rest,
        });
    }
    if !r.done() {
        return Err(Error::Truncated);
    }
    Ok(out)
}

/// The module's sections as (id, payload), after checking the header.
fn sections(module: &[u8]) -> Result<Vec<(u8, &[u8])>, Error> {
    if module.get(..8) != Some(MAGIC.as_slice()) {
        return Err(Error::NotWasm);
    }
    let mut r = Reader {
        bytes: module,
        pos: 8,
    };
    let mut out = Vec::new();
    while !r.done() {
        let id = r.byte()?;
        let size = r.u32()? as usize;
        out.push((id, r.take(size)?));
    }
    Ok(out)
}

/// The module's `proxy_abi_version_*` export names, in export order.
fn abi_exports(module: &[u8]) -> Result<Vec<String>, Error> {
    let mut found = Vec::new();
    let mut any = false;
    for (id, payload) in sections(module)? {
        if id == EXPORT_SECTION {
            any = true;
            for e in read_exports(payload)? {
                if e.name.starts_with(ABI_PREFIX) {
                    found.push(e.name);
                }
            }
        }
    }
    if !any {
        return Err(Error::NoExportSection);
    }
    Ok(found)
}

/// The module with its one `proxy_abi_version_*` export renamed to
/// `proxy_abi_version_<version>`.
fn set_abi(module: &[u8], version: &str) -> Result<Vec<u8>, Error> {
    if version.is_empty() || !version.bytes().all(|b| b.is_ascii_digit() || b == b'_') {
        return Err(Error::BadVersion(version.to_string()));
    }
    let found = abi_exports(module)?;
    if found.len() != 1 {
        return Err(Error::AbiExports(found));
    }
    let new_name = format!("{ABI_PREFIX}{version}");
    rewrite_exports(module, |name| {
        Some(if name.starts_with(ABI_PREFIX) {
            new_name.clone()
        } else {
            name.to_string()
        })
    })
}

/// The module without the exports `names` (each one in [`DROPPABLE`] and exported).
fn drop_exports(module: &[u8], names: &[String]) -> Result<Vec<u8>, Error> {
    let abi = abi_exports(module)?;
    if abi.len() != 1 {
        return Err(Error::AbiExports(abi));
    }
    let mut exported = Vec::new();
    for (id, payload) in sections(module)? {
        if id == EXPORT_SECTION {
            exported.extend(read_exports(payload)?.into_iter().map(|e| e.name));
        }
    }
    for name in names {
        if !DROPPABLE.contains(&name.as_str()) {
            return Err(Error::NotDroppable(name.clone()));
        }
        if !exported.contains(name) {
            return Err(Error::NotExported(name.clone()));
        }
    }
    rewrite_exports(module, |name| {
        (!names.iter().any(|n| n == name)).then(|| name.to_string())
    })
}

/// The module with its export section rewritten: each export's new name from `rename`, or
/// left out for `None`; every other section copied as it is.
fn rewrite_exports(
    module: &[u8],
    rename: impl Fn(&str) -> Option<String>,
) -> Result<Vec<u8>, Error> {
    let mut out = MAGIC.to_vec();
    for (id, payload) in sections(module)? {
        out.push(id);
        if id != EXPORT_SECTION {
            write_u32(&mut out, payload.len() as u32);
            out.extend_from_slice(payload);
            continue;
        }
        let exports = read_exports(payload)?;
        let kept: Vec<(String, &[u8])> = exports
            .iter()
            .filter_map(|e| rename(&e.name).map(|name| (name, e.rest)))
            .collect();
        let mut section = Vec::with_capacity(payload.len() + 4);
        write_u32(&mut section, kept.len() as u32);
        for (name, rest) in kept {
            write_u32(&mut section, name.len() as u32);
            section.extend_from_slice(name.as_bytes());
            section.extend_from_slice(rest);
        }
        write_u32(&mut out, section.len() as u32);
        out.extend_from_slice(&section);
    }
    Ok(out)
}

fn run(args: &[String]) -> Result<(), String> {
    let read = |path: &str| std::fs::read(path).map_err(|e| format!("{path}: {e}"));
    match args {
        [cmd, input] if cmd == "show" => {
            let found = abi_exports(&read(input)?).map_err(|e| format!("{input}: {e}"))?;
            for name in found {
                println!("{name}");
            }
            Ok(())
        }
        [cmd, version, input, output] if cmd == "set" => {
            let module = set_abi(&read(input)?, version).map_err(|e| format!("{input}: {e}"))?;
            write(output, module)
        }
        [cmd, input, output, names @ ..] if cmd == "drop" => {
            let module = drop_exports(&read(input)?, names).map_err(|e| format!("{input}: {e}"))?;
            write(output, module)
        }
        _ => Err(
            "usage: wasm-abi show IN.wasm | wasm-abi set VERSION IN.wasm OUT.wasm | \
                  wasm-abi drop IN.wasm OUT.wasm NAME..."
                .into(),
        ),
    }
}

/// Writes `module` to `output` through a temporary file (`output` may be the input).
fn write(output: &str, module: Vec<u8>) -> Result<(), String> {
    let tmp = format!("{output}.tmp");
    std::fs::write(&tmp, module).map_err(|e| format!("{tmp}: {e}"))?;
    std::fs::rename(&tmp, output).map_err(|e| format!("{output}: {e}"))
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("wasm-abi: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn export(name: &str, kind: u8, index: u32) -> Vec<u8> {
        let mut out = Vec::new();
        write_u32(&mut out, name.len() as u32);
        out.extend_from_slice(name.as_bytes());
        out.push(kind);
        write_u32(&mut out, index);
        out
    }

    /// A module with a type section, the given exports and a custom section after them.
    fn module(names: &[&str]) -> Vec<u8> {
        let mut exports = Vec::new();
        write_u32(&mut exports, names.len() as u32);
        for (i, name) in names.iter().enumerate() {
            exports.extend(export(name, 0, i as u32));
        }
        let mut out = MAGIC.to_vec();
        out.extend_from_slice(&[1, 4, 1, 0x60, 0, 0]); // type section: () -> ()
        out.push(EXPORT_SECTION);
        write_u32(&mut out, exports.len() as u32);
        out.extend(exports);
        out.extend_from_slice(&[0, 4, 1, b'x', 0xaa, 0xbb]); // custom section "x"
        out
    }

    #[test]
    fn renames_the_one_abi_export_and_keeps_the_rest() {
        let before = module(&["memory", "proxy_abi_version_0_2_1", "proxy_on_tick"]);
        let after = set_abi(&before, "0_2_100").unwrap();
        assert_eq!(
            after,
            module(&["memory", "proxy_abi_version_0_2_100", "proxy_on_tick"])
        );
        assert_eq!(abi_exports(&after).unwrap(), ["proxy_abi_version_0_2_100"]);
        // and back again, byte for byte
        assert_eq!(set_abi(&after, "0_2_1").unwrap(), before);
    }

    #[test]
    fn a_section_size_crossing_a_leb128_byte_is_re_encoded() {
        // 20 two-letter exports + the ABI one: the section grows from 127 to 129 bytes, so
        // its size needs a second LEB128 byte
        let mut names: Vec<String> = (0..20).map(|i| format!("{i:02}")).collect();
        names.push("proxy_abi_version_0_2_1".into());
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        let before = module(&names);
        let size_at = 8 + 6 + 1;
        assert_eq!(before[size_at], 127, "the fixture moved");
        let after = set_abi(&before, "0_2_100").unwrap();
        assert!(after[size_at] & 0x80 != 0, "a two-byte size");
        assert_eq!(after.len(), before.len() + 2 + 1);
        let mut renamed = names.clone();
        *renamed.last_mut().unwrap() = "proxy_abi_version_0_2_100";
        assert_eq!(after, module(&renamed));
    }

    #[test]
    fn refuses_modules_without_exactly_one_abi_export() {
        assert_eq!(
            set_abi(&module(&["memory"]), "0_2_100"),
            Err(Error::AbiExports(vec![]))
        );
        assert_eq!(
            set_abi(
                &module(&["proxy_abi_version_0_2_1", "proxy_abi_version_0_2_100"]),
                "0_2_100"
            ),
            Err(Error::AbiExports(vec![
                "proxy_abi_version_0_2_1".into(),
                "proxy_abi_version_0_2_100".into()
            ]))
        );
        let mut no_exports = MAGIC.to_vec();
        no_exports.extend_from_slice(&[1, 4, 1, 0x60, 0, 0]);
        assert_eq!(abi_exports(&no_exports), Err(Error::NoExportSection));
    }

    #[test]
    fn drops_only_the_named_stream_callbacks() {
        let before = module(&[
            "memory",
            "proxy_abi_version_0_2_1",
            "proxy_on_response_body",
            "proxy_on_log",
            "proxy_on_delete",
        ]);
        let names = |n: &[&str]| n.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let after = drop_exports(&before, &names(&["proxy_on_response_body", "proxy_on_log"]));
        // the kept exports keep their function indices (2 → 4 for proxy_on_delete)
        let mut expected = MAGIC.to_vec();
        expected.extend_from_slice(&[1, 4, 1, 0x60, 0, 0]);
        let mut exports = Vec::new();
        write_u32(&mut exports, 3);
        exports.extend(export("memory", 0, 0));
        exports.extend(export("proxy_abi_version_0_2_1", 0, 1));
        exports.extend(export("proxy_on_delete", 0, 4));
        expected.push(EXPORT_SECTION);
        write_u32(&mut expected, exports.len() as u32);
        expected.extend(exports);
        expected.extend_from_slice(&[0, 4, 1, b'x', 0xaa, 0xbb]);
        assert_eq!(after, Ok(expected));
        assert_eq!(drop_exports(&before, &[]), Ok(before.clone()));
        // what the host needs, and what is not there, is refused
        assert_eq!(
            drop_exports(&before, &names(&["proxy_on_delete"])),
            Err(Error::NotDroppable("proxy_on_delete".into()))
        );
        assert_eq!(
            drop_exports(&before, &names(&["proxy_on_done"])),
            Err(Error::NotExported("proxy_on_done".into()))
        );
        assert!(drop_exports(&module(&["memory"]), &[]).is_err());
    }

    #[test]
    fn refuses_what_is_not_a_module_or_is_cut_short() {
        assert_eq!(abi_exports(b"\x7fELF\x02\x01\x01\0"), Err(Error::NotWasm));
        assert_eq!(abi_exports(b"\0asm"), Err(Error::NotWasm));
        let whole = module(&["proxy_abi_version_0_2_1"]);
        for cut in 9..whole.len() - 6 {
            assert!(abi_exports(&whole[..cut]).is_err(), "cut at {cut}");
        }
        let mut long_leb = MAGIC.to_vec();
        long_leb.extend_from_slice(&[7, 0x80, 0x80, 0x80, 0x80, 0x80, 0x01]);
        assert_eq!(abi_exports(&long_leb), Err(Error::LebTooLong));
        assert_eq!(
            set_abi(&whole, "0.2.100"),
            Err(Error::BadVersion("0.2.100".into()))
        );
    }
}
