//! Where things are: the workspace root, the built `.wasm` files, the Envoy binary.

use std::path::{Path, PathBuf};

/// The workspace root (the parent of this crate).
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."))
}

/// The folder `scripts/build` writes the plugins to (`LLM_GATEWAY_WASM_DIR` overrides).
pub fn wasm_dir() -> PathBuf {
    std::env::var_os("LLM_GATEWAY_WASM_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root().join("dist"))
}

/// A built plugin; an error telling to run `scripts/build` when it is missing.
pub fn plugin_wasm(name: &str) -> crate::Result<PathBuf> {
    let path = wasm_dir().join(format!("{name}.wasm"));
    if path.is_file() {
        Ok(path)
    } else {
        Err(format!(
            "{} is missing: run scripts/build first (scripts/test does)",
            path.display()
        ))
    }
}

/// A plugin's Higress build (`dist/higress/<name>.wasm`, ABI `0_2_100`); an error telling to
/// run `scripts/build` when it is missing.
pub fn higress_wasm(name: &str) -> crate::Result<PathBuf> {
    plugin_wasm(&format!("higress/{name}"))
}

/// The SHA-256 of `bytes` as lowercase hex: the `key_sha256` of a virtual key in key-auth's
/// config, and the name of the harness's compiled-code cache files.
pub fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The Envoy a fixture runs: 1.40 (`.venv`) or 1.36.4 (`.venv-envoy-1.36`: Higress 2.2.4's base),
/// both installed by `scripts/setup`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EnvoyVersion {
    /// Envoy 1.40.
    V140,
    /// Envoy 1.36.4.
    V136,
}

impl EnvoyVersion {
    /// The version of a fixture that names none: 1.36.4 under `LLM_GATEWAY_ENVOY=1.36`, else
    /// 1.40. Set from outside to rerun suites on 1.36.4 (`scripts/test`); read, never written, so
    /// the tests of one process that name a version (`e2e envoy_136::`) never switch the others.
    pub fn from_env() -> EnvoyVersion {
        if std::env::var("LLM_GATEWAY_ENVOY").is_ok_and(|v| v == "1.36") {
            EnvoyVersion::V136
        } else {
            EnvoyVersion::V140
        }
    }

    /// As `LLM_GATEWAY_ENVOY` and `scripts/bench --envoy` name it.
    pub fn parse(text: &str) -> crate::Result<EnvoyVersion> {
        match text.trim() {
            "1.40" => Ok(EnvoyVersion::V140),
            "1.36" => Ok(EnvoyVersion::V136),
            other => Err(format!("Envoy {other:?} is neither 1.40 nor 1.36")),
        }
    }

    /// Its short name.
    pub fn name(self) -> &'static str {
        match self {
            EnvoyVersion::V140 => "1.40",
            EnvoyVersion::V136 => "1.36",
        }
    }

    /// The virtualenv `scripts/setup` installs it into.
    fn venv(self) -> &'static str {
        match self {
            EnvoyVersion::V140 => ".venv",
            EnvoyVersion::V136 => ".venv-envoy-1.36",
        }
    }
}

/// The Envoy binary of `version`: `ENVOY_BIN`, else the one `scripts/setup` installed into its
/// virtualenv.
pub fn envoy_bin(version: EnvoyVersion) -> crate::Result<PathBuf> {
    if let Some(path) = std::env::var_os("ENVOY_BIN") {
        return Ok(PathBuf::from(path));
    }
    let lib = root().join(version.venv()).join("lib");
    let entries = std::fs::read_dir(&lib)
        .map_err(|e| format!("{}: {e} (run scripts/setup)", lib.display()))?;
    for entry in entries.flatten() {
        let candidate = entry.path().join("site-packages/envoy/_bin/envoy");
        if candidate.is_file() {
            return Ok(candidate);
        }
    }
    Err(format!(
        "no envoy binary under {}/python3*/site-packages/envoy/_bin (run scripts/setup)",
        lib.display()
    ))
}

/// A file of `envoy-config/`.
pub fn envoy_config(name: &str) -> PathBuf {
    root().join("envoy-config").join(name)
}

/// A fresh temporary directory for one fixture's files (configs, logs), removed on drop.
#[derive(Debug)]
pub struct TempDir(PathBuf);

impl TempDir {
    /// Creates `$TMPDIR/llm-gateway-<label>-<pid>-<n>`.
    pub fn new(label: &str) -> crate::Result<TempDir> {
        use std::sync::atomic::{AtomicUsize, Ordering};
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let path =
            std::env::temp_dir().join(format!("llm-gateway-{label}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        Ok(TempDir(path))
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        if std::env::var_os("LLM_GATEWAY_KEEP_TMP").is_none() {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

/// Replaces every `${NAME}` in `template` with its value; an unknown or unclosed
/// placeholder is an error, so a config never reaches Envoy half-rendered.
pub fn render(template: &str, vars: &[(&str, String)]) -> crate::Result<String> {
    let mut out = String::with_capacity(template.len());
    let mut rest = template;
    while let Some(start) = rest.find("${") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        let end = after.find('}').ok_or_else(|| {
            format!(
                "unclosed placeholder near {:?}",
                &rest[start..rest.len().min(start + 20)]
            )
        })?;
        let name = &after[..end];
        let value = vars
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| v)
            .ok_or_else(|| format!("no value for placeholder ${{{name}}}"))?;
        out.push_str(value);
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn render_fills_and_refuses() {
        let vars = [("A", "1".to_string()), ("B", "two".to_string())];
        assert_eq!(render("x${A}y${B}${A}", &vars).unwrap(), "x1ytwo1");
        assert_eq!(render("no placeholders", &vars).unwrap(), "no placeholders");
        assert!(render("${C}", &vars).unwrap_err().contains("${C}"));
        assert!(render("${A", &vars).unwrap_err().contains("unclosed"));
    }
}
