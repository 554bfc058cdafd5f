//! The crates of the workspace and their crate roots, read from the `Cargo.toml` files as
//! plain text (the few keys needed, no TOML library).
//!
//! Crates: the root manifest's `members` and its in-tree `exclude`d crates (`fuzz`, a
//! workspace of its own), a trailing `/*` listing every directory with a `Cargo.toml`.
//! Crate roots of each: the `path` of its `[lib]`, `[[bin]]`, `[[test]]`, `[[bench]]` and
//! `[[example]]` sections, and Cargo's conventional ones that exist (`src/lib.rs`,
//! `src/main.rs`, `src/bin/*.rs`, `src/bin/*/main.rs`, `tests/*.rs`, `benches/*.rs`,
//! `examples/*.rs`). Each root is a crate of its own: its `crate::` is its own root.

use std::fs;
use std::path::{Path, PathBuf};

#[derive(Debug, PartialEq, Eq)]
pub struct Package {
    pub name: String,
    /// Relative to the workspace root.
    pub dir: PathBuf,
    /// Relative to the workspace root, sorted, no duplicates.
    pub roots: Vec<PathBuf>,
}

/// `text` without its `#` comments (a `#` inside a string is kept).
fn strip_comments(text: &str) -> String {
    let mut out = String::new();
    for line in text.lines() {
        let mut in_string = false;
        for c in line.chars() {
            match c {
                '"' => in_string = !in_string,
                '#' if !in_string => break,
                _ => {}
            }
            out.push(c);
        }
        out.push('\n');
    }
    out
}

/// The quoted strings of the array `key = [ … ]` in the `[workspace]` table.
fn workspace_array(manifest: &str, key: &str) -> Vec<String> {
    let text = strip_comments(manifest);
    let mut table = "";
    let mut out = Vec::new();
    let mut lines = text.lines();
    while let Some(line) = lines.next() {
        let trimmed = line.trim();
        if trimmed.starts_with('[') && !trimmed.contains('=') {
            table = trimmed;
            continue;
        }
        let Some((k, v)) = trimmed.split_once('=') else {
            continue;
        };
        if table != "[workspace]" || k.trim() != key {
            continue;
        }
        let mut array = v.to_string();
        while !array.contains(']') {
            let Some(more) = lines.next() else { break };
            array.push_str(more);
        }
        out.extend(quoted(&array));
    }
    out
}

/// The double-quoted strings in `text`, in order.
fn quoted(text: &str) -> Vec<String> {
    text.split('"')
        .skip(1)
        .step_by(2)
        .map(str::to_string)
        .collect()
}

/// The package name and the `path`s of the target sections of a member's manifest.
fn package_name_and_paths(manifest: &str) -> (Option<String>, Vec<String>) {
    const TARGETS: &[&str] = &["[lib]", "[[bin]]", "[[test]]", "[[bench]]", "[[example]]"];
    let mut table = String::new();
    let mut name = None;
    let mut paths = Vec::new();
    for line in strip_comments(manifest).lines() {
        let trimmed = line.trim();
        if trimmed.starts_with('[') && !trimmed.contains('=') {
            table = trimmed.to_string();
            continue;
        }
        let Some((k, v)) = trimmed.split_once('=') else {
            continue;
        };
        let value = quoted(v).into_iter().next();
        match (table.as_str(), k.trim()) {
            ("[package]", "name") => name = value,
            (t, "path") if TARGETS.contains(&t) => paths.extend(value),
            _ => {}
        }
    }
    (name, paths)
}

/// The `.rs` files directly in `dir`, and `dir/*/main.rs` when `nested_main`.
fn rust_files(dir: &Path, nested_main: bool) -> Vec<PathBuf> {
    let Ok(entries) = fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_file() && path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        } else if nested_main && path.join("main.rs").is_file() {
            out.push(path.join("main.rs"));
        }
    }
    out
}

/// The crates of the workspace at `root`, each with its crate roots.
pub fn packages(root: &Path) -> Result<Vec<Package>, String> {
    let manifest_path = root.join("Cargo.toml");
    let manifest = fs::read_to_string(&manifest_path)
        .map_err(|e| format!("{}: {e}", manifest_path.display()))?;
    let mut dirs = Vec::new();
    let listed = workspace_array(&manifest, "members");
    if listed.is_empty() {
        return Err(format!(
            "{}: no [workspace] members",
            manifest_path.display()
        ));
    }
    let excluded = workspace_array(&manifest, "exclude");
    for entry in listed.iter().chain(&excluded) {
        match entry.strip_suffix("/*") {
            Some(parent) => {
                let Ok(children) = fs::read_dir(root.join(parent)) else {
                    continue;
                };
                let mut found: Vec<PathBuf> = children
                    .flatten()
                    .map(|c| Path::new(parent).join(c.file_name()))
                    .filter(|d| root.join(d).join("Cargo.toml").is_file())
                    .collect();
                found.sort();
                dirs.extend(found);
            }
            None if root.join(entry).join("Cargo.toml").is_file() => {
                dirs.push(PathBuf::from(entry))
            }
            None if listed.contains(entry) => {
                return Err(format!(
                    "{}: member {entry} has no Cargo.toml",
                    manifest_path.display()
                ));
            }
            None => {} // an excluded path that is not a crate
        }
    }
    let mut out = Vec::new();
    for dir in dirs {
        let member_manifest = root.join(&dir).join("Cargo.toml");
        let text = fs::read_to_string(&member_manifest)
            .map_err(|e| format!("{}: {e}", member_manifest.display()))?;
        let (name, paths) = package_name_and_paths(&text);
        let base = root.join(&dir);
        let mut roots: Vec<PathBuf> = paths.iter().map(|p| base.join(p)).collect();
        roots.extend(
            ["src/lib.rs", "src/main.rs"]
                .iter()
                .map(|p| base.join(p))
                .filter(|p| p.is_file()),
        );
        roots.extend(rust_files(&base.join("src/bin"), true));
        for auto in ["tests", "benches", "examples"] {
            roots.extend(rust_files(&base.join(auto), true));
        }
        let mut roots: Vec<PathBuf> = roots
            .into_iter()
            .map(|p| p.strip_prefix(root).map(Path::to_path_buf).unwrap_or(p))
            .collect();
        roots.sort();
        roots.dedup();
        out.push(Package {
            name: name.unwrap_or_else(|| dir.display().to_string()),
            dir,
            roots,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workspace_members_span_lines_and_skip_comments() {
        let manifest = r#"
[workspace]
resolver = "2"
members = [
    "shared",
    # "old",
    "plugins/key-auth", # trailing
]
exclude = ["fuzz"]

[workspace.package]
members = ["not-this"]
"#;
        assert_eq!(
            workspace_array(manifest, "members"),
            ["shared", "plugins/key-auth"]
        );
        assert_eq!(workspace_array(manifest, "exclude"), ["fuzz"]);
    }

    #[test]
    fn package_name_and_target_paths() {
        let manifest = r#"
[package]
name = "llm-gateway-tests"
[dependencies]
mock-upstream = { path = "mock-upstream" }
x = { path = "../x" } # not a target
[lib]
crate-type = ["cdylib"]
[[test]]
name = "e2e_key_auth"
path = "e2e/key_auth.rs"
[[bin]]
name = "bench"
"#;
        let (name, paths) = package_name_and_paths(manifest);
        assert_eq!(name.as_deref(), Some("llm-gateway-tests"));
        assert_eq!(paths, ["e2e/key_auth.rs"]);
    }
}
