//! `mod-cycles`: fails (exit 1) when two modules of a crate of the workspace use each other,
//! directly or through others. `scripts/test` runs it after clippy.
//!
//! ```text
//! mod-cycles [--edges] [WORKSPACE]   WORKSPACE: by default the one this tool is built in;
//!                                    --edges: also print every edge (the graph it checks)
//! ```
//!
//! For every crate root of every crate of the workspace (`manifest`) it builds the module
//! graph from the source text (`tree`) and looks for cycles in it (`cycles`).
//!
//! Nodes: the modules, files and inline `mod x { … }` blocks.
//!
//! Edges: module A uses module B (A ≠ B) when A's non-test code
//! - has a `use` (any block, not `pub`) with a leaf naming B or an item of B;
//! - writes a path of two segments or more that starts at `crate`, `super`, `self`, a child
//!   module of A or a name A's `use` binds, and names B or an item of B
//!   (`crate::b::f(…)`, `super::T`, `child::g()`);
//! - names, alone, an item it re-exports from B (`pub use b::X;` … `X::new()`, `f(…)`).
//!
//! An item path resolves to the deepest module on it, and a name reached through a re-export
//! to the module that declares it. Not edges: `mod b;` (a module contains its children; using
//! them is an edge like any other), a `pub use` itself (like `mod`, it only says where callers
//! find an item), a child naming the ancestor's type it implements (`use super::Core;`
//! `impl Core { … }` in `core/downstream.rs`: one type's methods split over files, part of
//! the type — anything else it takes from the ancestor is an edge), comments, strings,
//! attributes, `$crate::` in macros, and code that exists only in test builds (`mod tests`,
//! `#[cfg(test)]`, `#[cfg(all(test, …))]`): a test module may use its parent and its
//! siblings' test helpers freely.
//!
//! A cycle is any directed cycle: two siblings using each other, and just as much a parent
//! using a child's items while the child uses the parent's (`super::…`) — the module that
//! dispatches to others must not also be where they get their helpers. Method calls name no
//! module and are not seen.
//!
//! Each cycle is printed as its chain of modules with the file and line of the first
//! reference of each edge; a strongly connected set of modules gets enough cycles to show
//! every edge inside it. A module file that cannot be read is an error (exit 2), so nothing
//! goes unchecked.
#![forbid(unsafe_code)]

mod cycles;
mod lex;
mod manifest;
mod tree;

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// The report of one workspace: the cycles (text), the errors, and what was read.
#[derive(Debug, Default)]
struct Report {
    cycles: Vec<String>,
    errors: Vec<String>,
    roots: usize,
    modules: usize,
    edges: usize,
}

fn check(workspace: &Path, print_edges: bool) -> Result<Report, String> {
    let mut report = Report::default();
    let mut seen = BTreeSet::new();
    for package in manifest::packages(workspace)? {
        for root in &package.roots {
            let krate =
                tree::Crate::load(root, &|p: &Path| fs::read_to_string(workspace.join(p)).ok());
            report.errors.extend(krate.errors.iter().cloned());
            let edges = krate.edges();
            report.roots += 1;
            report.modules += krate.modules.len();
            report.edges += edges.len();
            if print_edges {
                for e in &edges {
                    println!(
                        "{} ({}): {}",
                        package.name,
                        root.display(),
                        describe_edge(&krate, e)
                    );
                }
            }
            let pairs: Vec<(usize, usize)> = edges.iter().map(|e| (e.from, e.to)).collect();
            for cycle in cycles::cycles(krate.modules.len(), &pairs) {
                let text = describe(&package.name, root, &krate, &edges, &cycle);
                // a file shared by several crate roots (`mod common;`) reports its cycle once
                if seen.insert(text.lines().skip(1).collect::<Vec<_>>().join("\n")) {
                    report.cycles.push(text);
                }
            }
        }
    }
    Ok(report)
}

/// `from -> to    file:line`
fn describe_edge(krate: &tree::Crate, e: &tree::Edge) -> String {
    let module = |m: usize| krate.modules.get(m);
    format!(
        "{} -> {}    {}:{}",
        module(e.from).map_or("?", |m| m.name.as_str()),
        module(e.to).map_or("?", |m| m.name.as_str()),
        module(e.from)
            .map_or_else(PathBuf::new, |m| m.file.clone())
            .display(),
        e.line
    )
}

/// `package (root): a -> b -> a`, then one `from -> to    file:line` per edge.
fn describe(
    package: &str,
    root: &Path,
    krate: &tree::Crate,
    edges: &[tree::Edge],
    cycle: &[usize],
) -> String {
    let name = |m: usize| {
        krate
            .modules
            .get(m)
            .map_or("?", |module| module.name.as_str())
    };
    let chain_edges: Vec<&tree::Edge> = cycle.iter().filter_map(|&e| edges.get(e)).collect();
    let mut chain: Vec<&str> = chain_edges.iter().map(|e| name(e.from)).collect();
    chain.extend(chain_edges.first().map(|e| name(e.from)));
    let mut out = format!("{package} ({}): {}\n", root.display(), chain.join(" -> "));
    for e in chain_edges {
        out.push_str(&format!("    {}\n", describe_edge(krate, e)));
    }
    out
}

fn main() -> ExitCode {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let print_edges = args.first().is_some_and(|a| a == "--edges");
    if print_edges {
        args.remove(0);
    }
    let workspace = match args.as_slice() {
        [] => Path::new(env!("CARGO_MANIFEST_DIR")).join("../.."),
        [dir] if !dir.starts_with('-') => PathBuf::from(dir),
        _ => {
            eprintln!("usage: mod-cycles [--edges] [WORKSPACE]");
            return ExitCode::from(2);
        }
    };
    let report = match check(&workspace, print_edges) {
        Ok(report) => report,
        Err(e) => {
            eprintln!("mod-cycles: {e}");
            return ExitCode::from(2);
        }
    };
    for error in &report.errors {
        eprintln!("mod-cycles: {error}");
    }
    for cycle in &report.cycles {
        print!("{cycle}");
    }
    let summary = format!(
        "mod-cycles: {} crate roots, {} modules, {} edges between them",
        report.roots, report.modules, report.edges
    );
    if !report.errors.is_empty() {
        eprintln!("{summary}; {} unreadable", report.errors.len());
        return ExitCode::from(2);
    }
    if !report.cycles.is_empty() {
        eprintln!("{summary}; {} import cycles (above)", report.cycles.len());
        return ExitCode::FAILURE;
    }
    println!("{summary}; no import cycle");
    ExitCode::SUCCESS
}
