//! The module tree of one crate (a crate root file and the files its `mod` declarations load)
//! and the references between its modules.
//!
//! Nodes are modules: files and inline `mod x { … }` blocks. `mod x;` loads `x.rs` or
//! `x/mod.rs` beside a `lib.rs`, `main.rs`, `mod.rs`, crate root or `#[path]` file, and
//! `<stem>/x.rs` or `<stem>/x/mod.rs` beside any other file; `#[path = "…"]` is honoured
//! (relative to the declaring file's directory, or to the inline module's directory inside an
//! inline block).
//!
//! References, per module: the leaves of its `use` declarations that are not re-exports (in
//! any block, `use a::{b, c::*}` included), the paths of two segments or more in its code
//! (`crate::a::f(…)`, `super::x::T`, `self::y::Z`, `child::g()`), and the lone identifiers of
//! its code that name something it re-exports (an upper-case name, or a called one: a
//! lower-case name that is not called is taken for a local). A path is resolved the way rustc starts it:
//! `crate` is the root, `super` the parent, `self` the module itself, and a bare first segment
//! a child module of the module or a name its `use` declarations bind; anything else
//! (`std::…`, another crate, a type's `Self::…`) names no module of this crate. From there
//! each segment descends into a child module; a segment that names an item stops there, so an
//! item path resolves to the deepest module on it. A name that a module only imports
//! (`pub use card::luhn;`, `pub use shell::*;`) is followed to the module that declares it.
//!
//! A re-export (`pub use`, `pub(crate) use`) is no reference by itself: like `mod`, it is
//! structure, saying where callers find an item. Nor is a reference to a type of an ancestor
//! that the module implements (`impl Core { … }` in a child of `core`): its methods are the
//! type's own, split over files. Left out as well: items and modules that
//! exist only in test builds — modules named `tests` and any module, `use` or item under
//! `#[cfg(test)]` or `#[cfg(all(test, …))]` — the contents of attributes, visibilities
//! (`pub(in crate::a)`), comments and strings, and `$crate::` in macros.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use crate::lex::{lex, Tok, Token};

/// How many bindings and globs a path is followed through before the resolution gives up (a
/// `use` that names itself, two globs importing each other).
const FUEL: u32 = 16;

/// Nesting of `mod` declarations beyond which a `#[path]` loop is assumed.
const MAX_NESTING: usize = 64;

#[derive(Debug)]
pub struct Module {
    /// `crate`, `crate::a`, `crate::a::b`.
    pub name: String,
    pub parent: Option<usize>,
    /// The file holding the module (an inline module's is its parent's).
    pub file: PathBuf,
    /// Where its `mod x;` declarations look for `x.rs` and `x/mod.rs`.
    dir: PathBuf,
    /// An inline `mod x { … }`.
    inline: bool,
    children: BTreeMap<String, usize>,
    /// The items it declares at its top level: `fn`, `struct`, `enum`, `union`, `trait`,
    /// `type`, `const`, `static`.
    items: BTreeSet<String>,
    /// The names its top-level `use` declarations bind, with the paths they name.
    bindings: BTreeMap<String, Vec<String>>,
    /// Those of its bindings that it re-exports (`pub use`, `pub(crate) use`).
    reexports: BTreeSet<String>,
    /// The paths of its top-level glob imports (`use a::*`), and whether each is re-exported.
    globs: Vec<(Vec<String>, bool)>,
    /// The self types of its top-level `impl` blocks, as written (`Core`, `super::Core`).
    impls: Vec<Vec<String>>,
}

impl Module {
    fn new(
        name: String,
        parent: Option<usize>,
        file: PathBuf,
        dir: PathBuf,
        inline: bool,
    ) -> Module {
        Module {
            name,
            parent,
            file,
            dir,
            inline,
            children: BTreeMap::new(),
            items: BTreeSet::new(),
            bindings: BTreeMap::new(),
            reexports: BTreeSet::new(),
            globs: Vec::new(),
            impls: Vec::new(),
        }
    }
}

#[derive(Debug)]
struct Ref {
    from: usize,
    path: Vec<String>,
    line: usize,
    /// A lone identifier in code (`Fused`, `luhn(…)`): a reference only when it names
    /// something the module re-exports.
    lone: bool,
}

/// One module using another: the first reference (by line) from `from` to `to`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Edge {
    pub from: usize,
    pub to: usize,
    pub line: usize,
}

#[derive(Debug)]
pub struct Crate {
    pub modules: Vec<Module>,
    refs: Vec<Ref>,
    /// Modules whose file could not be read: the check must not pass without them.
    pub errors: Vec<String>,
}

/// The attributes before an item, as far as the scan cares.
#[derive(Default)]
struct Attrs {
    test_only: bool,
    path: Option<String>,
    /// The item is `pub` or `pub(…)`.
    public: bool,
}

const ITEM_KEYWORDS: &[&str] = &[
    "fn",
    "struct",
    "enum",
    "union",
    "trait",
    "impl",
    "type",
    "const",
    "static",
    "mod",
    "use",
    "unsafe",
    "async",
    "extern",
    "macro_rules",
    "let",
];

fn ident(toks: &[Token], i: usize) -> Option<&str> {
    match toks.get(i).map(|t| &t.tok) {
        Some(Tok::Ident(s)) => Some(s),
        _ => None,
    }
}

fn is_punct(toks: &[Token], i: usize, c: char) -> bool {
    toks.get(i).is_some_and(|t| t.tok == Tok::Punct(c))
}

fn is_path_sep(toks: &[Token], i: usize) -> bool {
    toks.get(i).is_some_and(|t| t.tok == Tok::PathSep)
}

fn line_of(toks: &[Token], i: usize) -> usize {
    toks.get(i).map_or(0, |t| t.line)
}

/// The bracket closing the one at `open` (any of `(`, `[`, `{`, counted together).
fn matching(toks: &[Token], open: usize) -> Option<usize> {
    let mut depth = 0usize;
    for (k, t) in toks.iter().enumerate().skip(open) {
        match t.tok {
            Tok::Punct('(' | '[' | '{') => depth += 1,
            Tok::Punct(')' | ']' | '}') => {
                depth = depth.checked_sub(1)?;
                if depth == 0 {
                    return Some(k);
                }
            }
            _ => {}
        }
    }
    None
}

/// Whether an attribute (its tokens between `[` and `]`) is `cfg(test)` or
/// `cfg(all(test, …))`: what it is on exists only in test builds.
fn is_test_cfg(attr: &[Token]) -> bool {
    if ident(attr, 0) != Some("cfg") || !is_punct(attr, 1, '(') {
        return false;
    }
    if ident(attr, 2) == Some("test") && is_punct(attr, 3, ')') {
        return true;
    }
    if ident(attr, 2) != Some("all") || !is_punct(attr, 3, '(') {
        return false;
    }
    // `test` as one of `all`'s own arguments, not inside a nested `not(…)` or `any(…)`
    let mut depth = 0usize;
    for k in 3..attr.len() {
        match attr.get(k).map(|t| &t.tok) {
            Some(Tok::Punct('(')) => depth += 1,
            Some(Tok::Punct(')')) => {
                depth = depth.saturating_sub(1);
                if depth == 0 {
                    break;
                }
            }
            Some(Tok::Ident(s)) if s == "test" && depth == 1 => {
                let before = is_punct(attr, k - 1, '(') || is_punct(attr, k - 1, ',');
                let after = is_punct(attr, k + 1, ')') || is_punct(attr, k + 1, ',');
                if before && after {
                    return true;
                }
            }
            _ => {}
        }
    }
    false
}

/// `path = "…"`
fn path_attr(attr: &[Token]) -> Option<String> {
    match attr {
        [Token {
            tok: Tok::Ident(p), ..
        }, Token {
            tok: Tok::Punct('='),
            ..
        }, Token {
            tok: Tok::Str(s), ..
        }] if p == "path" => Some(s.clone()),
        _ => None,
    }
}

/// The end of the item (or statement, field, argument) starting at `start`: after its `;` or
/// its top-level `{ … }`, or at the `,` or closing bracket that ends a field or argument.
fn skip_item(toks: &[Token], start: usize, end: usize) -> usize {
    let item = ident(toks, start).is_some_and(|s| ITEM_KEYWORDS.contains(&s));
    let mut depth = 0usize;
    for k in start..end {
        match toks.get(k).map(|t| &t.tok) {
            Some(Tok::Punct('(' | '[' | '{')) => depth += 1,
            Some(Tok::Punct(c @ (')' | ']' | '}'))) => {
                let Some(d) = depth.checked_sub(1) else {
                    return k;
                };
                depth = d;
                if depth == 0 && *c == '}' {
                    return k + 1;
                }
            }
            Some(Tok::Punct(';')) if depth == 0 => return k + 1,
            Some(Tok::Punct(',')) if depth == 0 && !item => return k,
            _ => {}
        }
    }
    end
}

/// One leaf of a `use` tree.
#[derive(Debug, PartialEq, Eq)]
enum UseLeaf {
    /// `a::b` or `a::b as c` or `a::{self}`: the path and the name it binds (`None` for `_`).
    Name(Vec<String>, Option<String>),
    /// `a::*`: the path before the `*`.
    Glob(Vec<String>),
}

/// The leaves of the use tree in `toks` (between `use` and `;`). A leading `::` (an extern
/// crate) starts the path with a segment that resolves to nothing.
fn use_leaves(toks: &[Token]) -> Vec<UseLeaf> {
    fn tree(toks: &[Token], pos: &mut usize, prefix: Vec<String>, out: &mut Vec<UseLeaf>) {
        let mut path = prefix;
        loop {
            match toks.get(*pos).map(|t| &t.tok) {
                Some(Tok::PathSep) if path.is_empty() => {
                    path.push("::".to_string());
                    *pos += 1;
                }
                Some(Tok::Ident(s)) => {
                    path.push(s.clone());
                    *pos += 1;
                    if is_path_sep(toks, *pos) {
                        *pos += 1;
                        continue;
                    }
                    let alias = if ident(toks, *pos) == Some("as") {
                        *pos += 2;
                        ident(toks, *pos - 1).map(str::to_string)
                    } else {
                        None
                    };
                    if path.last().is_some_and(|s| s == "self") {
                        path.pop();
                    }
                    let bound = match alias {
                        Some(a) if a == "_" => None,
                        Some(a) => Some(a),
                        None => path.last().cloned(),
                    };
                    out.push(UseLeaf::Name(path, bound));
                    return;
                }
                Some(Tok::Punct('*')) => {
                    *pos += 1;
                    out.push(UseLeaf::Glob(path));
                    return;
                }
                Some(Tok::Punct('{')) => {
                    *pos += 1;
                    loop {
                        match toks.get(*pos).map(|t| &t.tok) {
                            None => return,
                            Some(Tok::Punct('}')) => {
                                *pos += 1;
                                return;
                            }
                            Some(Tok::Punct(',')) => *pos += 1,
                            Some(_) => {
                                let before = *pos;
                                tree(toks, pos, path.clone(), out);
                                if *pos == before {
                                    *pos += 1; // malformed: never loop on one token
                                }
                            }
                        }
                    }
                }
                _ => return,
            }
        }
    }
    let mut out = Vec::new();
    let mut pos = 0;
    while pos < toks.len() {
        let before = pos;
        tree(toks, &mut pos, Vec::new(), &mut out);
        if pos == before {
            pos += 1;
        }
    }
    out
}

struct Loader<'r> {
    read: &'r dyn Fn(&Path) -> Option<String>,
    krate: Crate,
}

impl Loader<'_> {
    fn add_module(&mut self, module: Module) -> usize {
        self.krate.modules.push(module);
        self.krate.modules.len() - 1
    }

    fn module_mut(&mut self, m: usize) -> Option<&mut Module> {
        self.krate.modules.get_mut(m)
    }

    /// How many modules enclose `m`.
    fn nesting(&self, m: usize) -> usize {
        let mut depth = 0;
        let mut at = self.krate.modules.get(m).and_then(|module| module.parent);
        while let Some(p) = at {
            depth += 1;
            at = self.krate.modules.get(p).and_then(|module| module.parent);
        }
        depth
    }

    fn scan_file(&mut self, m: usize, file: &Path) {
        let Some(src) = (self.read)(file) else {
            self.krate
                .errors
                .push(format!("{}: cannot read", file.display()));
            return;
        };
        let toks = lex(&src);
        self.scan_body(&toks, 0, toks.len(), m);
    }

    /// The tokens `start..end` of module `m`'s body.
    fn scan_body(&mut self, toks: &[Token], start: usize, end: usize, m: usize) {
        let mut attrs = Attrs::default();
        let mut depth = 0usize;
        let mut i = start;
        while i < end {
            let Some(token) = toks.get(i) else { break };
            // attributes: `#[…]`, `#![…]`
            if token.tok == Tok::Punct('#') {
                let inner = is_punct(toks, i + 1, '!');
                let open = if inner { i + 2 } else { i + 1 };
                if is_punct(toks, open, '[') {
                    let close = matching(toks, open).unwrap_or(end).min(end);
                    let attr = toks.get(open + 1..close).unwrap_or_default();
                    if inner && is_test_cfg(attr) {
                        return; // the whole module is test-only
                    }
                    if !inner {
                        attrs.test_only |= is_test_cfg(attr);
                        attrs.path = path_attr(attr).or(attrs.path.take());
                    }
                    i = close + 1;
                    continue;
                }
            }
            // visibility: `pub`, `pub(crate)`, `pub(in crate::a)`
            if ident(toks, i) == Some("pub") {
                attrs.public = true;
                i += 1;
                if is_punct(toks, i, '(') {
                    i = matching(toks, i).map_or(end, |k| k + 1);
                }
                continue;
            }
            if std::mem::take(&mut attrs.test_only) {
                i = skip_item(toks, i, end).max(i + 1);
                attrs = Attrs::default();
                continue;
            }
            let path_attr = attrs.path.take();
            let public = std::mem::take(&mut attrs.public);
            match &token.tok {
                Tok::Punct('{' | '(' | '[') => depth += 1,
                Tok::Punct('}' | ')' | ']') => depth = depth.saturating_sub(1),
                Tok::Ident(word) if word == "mod" => {
                    if let Some(name) = ident(toks, i + 1) {
                        i = self.module_decl(toks, i, end, m, name, path_attr);
                        continue;
                    }
                }
                Tok::Ident(word) if word == "use" => {
                    let semi = (i..end).find(|&k| is_punct(toks, k, ';')).unwrap_or(end);
                    let line = token.line;
                    for leaf in use_leaves(toks.get(i + 1..semi).unwrap_or_default()) {
                        self.use_leaf(m, leaf, line, depth == 0, public);
                    }
                    i = semi + 1;
                    continue;
                }
                Tok::Ident(word) if word == "impl" && depth == 0 && starts_item(toks, i, start) => {
                    if let (Some(path), Some(module)) =
                        (impl_self_type(toks, i + 1, end), self.module_mut(m))
                    {
                        module.impls.push(path);
                    }
                }
                Tok::Ident(word) if depth == 0 && is_item_keyword(word) => {
                    let mut k = i + 1;
                    if matches!(ident(toks, k), Some("mut" | "fn")) {
                        k += 1; // `static mut X`, `const fn f`
                    }
                    if let (Some(name), Some(module)) = (ident(toks, k), self.module_mut(m)) {
                        module.items.insert(name.to_string());
                    }
                }
                Tok::Ident(first) => {
                    // not a path's later segment, a macro's `$crate`, a field or a method
                    let starts_path = i == start
                        || !(is_path_sep(toks, i - 1)
                            || is_punct(toks, i - 1, '$')
                            || is_punct(toks, i - 1, '.'));
                    if starts_path && is_path_sep(toks, i + 1) {
                        let mut path = vec![first.clone()];
                        let mut k = i + 1;
                        while is_path_sep(toks, k) {
                            let Some(seg) = ident(toks, k + 1) else { break };
                            path.push(seg.to_string());
                            k += 2;
                        }
                        if path.len() >= 2 {
                            self.krate.refs.push(Ref {
                                from: m,
                                path,
                                line: token.line,
                                lone: false,
                            });
                        }
                        i = k;
                        continue;
                    }
                    if starts_path && names_an_item(toks, i, start) {
                        let path = vec![first.clone()];
                        self.krate.refs.push(Ref {
                            from: m,
                            path,
                            line: token.line,
                            lone: true,
                        });
                    }
                }
                _ => {}
            }
            i += 1;
        }
    }

    /// `mod name;` or `mod name { … }` at `at`: the child loaded and scanned (unless it is
    /// test-only). Returns where the scan goes on.
    fn module_decl(
        &mut self,
        toks: &[Token],
        at: usize,
        end: usize,
        parent: usize,
        name: &str,
        path_attr: Option<String>,
    ) -> usize {
        let test_only = name == "tests";
        let Some(p) = self.krate.modules.get(parent) else {
            return end;
        };
        let (pname, pfile, pdir, pinline) =
            (p.name.clone(), p.file.clone(), p.dir.clone(), p.inline);
        let child_name = format!("{pname}::{name}");
        let line = line_of(toks, at);
        if is_punct(toks, at + 2, '{') {
            let close = matching(toks, at + 2).unwrap_or(end).min(end);
            if !test_only {
                let child = self.add_module(Module::new(
                    child_name,
                    Some(parent),
                    pfile,
                    pdir.join(name),
                    true,
                ));
                self.link(parent, name, child);
                self.scan_body(toks, at + 3, close, child);
            }
            return close + 1;
        }
        let next = if is_punct(toks, at + 2, ';') {
            at + 3
        } else {
            at + 2
        };
        if test_only {
            return next;
        }
        if self.nesting(parent) >= MAX_NESTING {
            self.krate.errors.push(format!(
                "{}:{line}: mod {name}: nested too deep",
                pfile.display()
            ));
            return next;
        }
        let (file, mod_rs) = match path_attr {
            Some(p) => {
                let base = if pinline {
                    pdir.clone()
                } else {
                    pfile.parent().map(Path::to_path_buf).unwrap_or_default()
                };
                (base.join(p), true)
            }
            None => {
                let flat = pdir.join(format!("{name}.rs"));
                let nested = pdir.join(name).join("mod.rs");
                if (self.read)(&flat).is_some() {
                    (flat, false)
                } else {
                    (nested, true)
                }
            }
        };
        let dir = if mod_rs {
            file.parent().map(Path::to_path_buf).unwrap_or_default()
        } else {
            pdir.join(name)
        };
        let child = self.add_module(Module::new(
            child_name,
            Some(parent),
            file.clone(),
            dir,
            false,
        ));
        self.link(parent, name, child);
        if (self.read)(&file).is_none() {
            self.krate.errors.push(format!(
                "{}:{line}: mod {name}: no {} (nor {name}.rs)",
                pfile.display(),
                file.display()
            ));
            return next;
        }
        self.scan_file(child, &file);
        next
    }

    fn link(&mut self, parent: usize, name: &str, child: usize) {
        if let Some(p) = self.module_mut(parent) {
            p.children.insert(name.to_string(), child);
        }
    }

    /// A leaf of a `use` in module `m`: a reference, unless it is a re-export (`pub use`),
    /// which is structure like `mod`: it says where callers find an item, and the module's
    /// own code using the re-exported name is what makes a reference.
    fn use_leaf(&mut self, m: usize, leaf: UseLeaf, line: usize, top_level: bool, reexport: bool) {
        let path = match leaf {
            UseLeaf::Name(path, bound) => {
                if let (true, Some(name), Some(module)) = (top_level, bound, self.module_mut(m)) {
                    if reexport {
                        module.reexports.insert(name.clone());
                    }
                    module.bindings.insert(name, path.clone());
                }
                path
            }
            UseLeaf::Glob(path) => {
                if let (true, Some(module)) = (top_level, self.module_mut(m)) {
                    module.globs.push((path.clone(), reexport));
                }
                path
            }
        };
        if !reexport {
            self.krate.refs.push(Ref {
                from: m,
                path,
                line,
                lone: false,
            });
        }
    }
}

/// Whether the lone identifier at `i` can name an item rather than a local variable, a
/// parameter or a field: a type, trait, variant or constant (it starts upper-case: `Fused`,
/// `MAX_EVENT_BYTES`), or a function it calls (`luhn(…)`, not after `fn`). A lowercase name
/// that is not called (`messages` in `fn f(messages: &[Value])`) is taken for a local.
fn names_an_item(toks: &[Token], i: usize, start: usize) -> bool {
    let Some(name) = ident(toks, i) else {
        return false;
    };
    if name.starts_with(|c: char| c.is_uppercase()) {
        return true;
    }
    is_punct(toks, i + 1, '(') && !(i > start && ident(toks, i - 1) == Some("fn"))
}

/// Whether the token at `i` begins an item (after a `;`, a block, an attribute or the start
/// of the body), not a type in one (`-> impl Iterator`).
fn starts_item(toks: &[Token], i: usize, start: usize) -> bool {
    i == start
        || [';', '}', ']', '{']
            .iter()
            .any(|&c| is_punct(toks, i - 1, c))
        || matches!(ident(toks, i - 1), Some("unsafe" | "default"))
}

/// Whether the `>` at `k` closes an angle bracket (is not the end of `->` or `=>`).
fn closes_angle(toks: &[Token], k: usize) -> bool {
    is_punct(toks, k, '>') && !(k > 0 && (is_punct(toks, k - 1, '-') || is_punct(toks, k - 1, '=')))
}

/// The self type's path of the `impl` header starting at `from` (after `impl`): `Core` in
/// `impl Core {`, `impl<T> fmt::Debug for Core<T> where … {`.
fn impl_self_type(toks: &[Token], from: usize, end: usize) -> Option<Vec<String>> {
    let mut angle = 0usize;
    let mut k = from;
    if is_punct(toks, k, '<') {
        // the impl's generics
        while k < end {
            if is_punct(toks, k, '<') {
                angle += 1;
            } else if closes_angle(toks, k) {
                angle = angle.saturating_sub(1);
                if angle == 0 {
                    break;
                }
            }
            k += 1;
        }
        k += 1;
    }
    let mut self_type = k;
    angle = 0;
    for j in k..end {
        if is_punct(toks, j, '<') {
            angle += 1;
        } else if closes_angle(toks, j) {
            angle = angle.saturating_sub(1);
        } else if angle == 0 {
            if is_punct(toks, j, '{') || is_punct(toks, j, ';') || ident(toks, j) == Some("where") {
                break;
            }
            if ident(toks, j) == Some("for") {
                self_type = j + 1;
            }
        }
    }
    while is_punct(toks, self_type, '&')
        || is_punct(toks, self_type, '!')
        || matches!(ident(toks, self_type), Some("dyn" | "mut"))
    {
        self_type += 1;
    }
    let mut path = vec![ident(toks, self_type)?.to_string()];
    let mut t = self_type + 1;
    while is_path_sep(toks, t) {
        let Some(seg) = ident(toks, t + 1) else { break };
        path.push(seg.to_string());
        t += 2;
    }
    Some(path)
}

fn is_item_keyword(word: &str) -> bool {
    matches!(
        word,
        "fn" | "struct" | "enum" | "union" | "trait" | "type" | "const" | "static"
    )
}

impl Crate {
    /// The crate whose root file is `root`; `read` gives a file's text (`None`: no such file).
    pub fn load(root: &Path, read: &dyn Fn(&Path) -> Option<String>) -> Crate {
        let mut loader = Loader {
            read,
            krate: Crate {
                modules: Vec::new(),
                refs: Vec::new(),
                errors: Vec::new(),
            },
        };
        let dir = root.parent().map(Path::to_path_buf).unwrap_or_default();
        let root_module = loader.add_module(Module::new(
            "crate".to_string(),
            None,
            root.to_path_buf(),
            dir,
            false,
        ));
        loader.scan_file(root_module, root);
        loader.krate
    }

    fn module(&self, m: usize) -> Option<&Module> {
        self.modules.get(m)
    }

    /// What `path`, written in module `ctx`, names: a module of this crate or an item in one.
    /// `None`: nothing in this crate.
    fn resolve(&self, ctx: usize, path: &[String], fuel: u32) -> Option<Target> {
        let fuel = fuel.checked_sub(1)?;
        let (first, rest) = path.split_first()?;
        let start = match first.as_str() {
            "crate" => 0,
            "self" => ctx,
            "super" => self.module(ctx)?.parent?,
            name => {
                let module = self.module(ctx)?;
                if let Some(&child) = module.children.get(name) {
                    child
                } else {
                    let target = self.resolve(ctx, module.bindings.get(name)?, fuel)?;
                    if target.item.is_some() {
                        return Some(target);
                    }
                    target.module
                }
            }
        };
        self.walk(start, rest, fuel)
    }

    fn walk(&self, start: usize, rest: &[String], fuel: u32) -> Option<Target> {
        let mut m = start;
        for seg in rest {
            m = match seg.as_str() {
                "super" => self.module(m)?.parent?,
                "self" => m,
                name => match self.module(m)?.children.get(name) {
                    Some(&child) => child,
                    None => match self.lookup(m, name, fuel) {
                        Some(Target { module, item: None }) => module,
                        Some(item) => return Some(item),
                        // not declared where it can be seen (a variant, a macro): `m`'s all the same
                        None => return Some(Target::item(m, name)),
                    },
                },
            };
        }
        Some(Target::module(m))
    }

    /// Where the name `name`, not a child module of `m`, comes from: `m` itself if it declares
    /// it, else whatever its `use` declarations bind it to, by name or through a glob.
    fn lookup(&self, m: usize, name: &str, fuel: u32) -> Option<Target> {
        let fuel = fuel.checked_sub(1)?;
        let module = self.module(m)?;
        if module.items.contains(name) {
            return Some(Target::item(m, name));
        }
        if let Some(target) = module.bindings.get(name) {
            return self.resolve(m, target, fuel);
        }
        for (glob, _) in &module.globs {
            if let Some(found) = self.through_glob(m, glob, name, fuel) {
                return Some(found);
            }
        }
        None
    }

    /// `name` as the glob import `glob` (`use glob::*`) of module `m` brings it in, if it does.
    fn through_glob(&self, m: usize, glob: &[String], name: &str, fuel: u32) -> Option<Target> {
        let source = self.resolve(m, glob, fuel)?;
        if source.item.is_some() || source.module == m {
            return None; // an enum's variants, or itself
        }
        match self.module(source.module)?.children.get(name) {
            Some(&child) => Some(Target::module(child)),
            None => self.lookup(source.module, name, fuel),
        }
    }

    /// Where `name`, used alone in the code of `m`, comes from if `m` re-exports it (by name
    /// or through a `pub use a::*`). Names `m` imports privately are counted at their `use`.
    fn reexported(&self, m: usize, name: &str) -> Option<Target> {
        let module = self.module(m)?;
        if module.reexports.contains(name) {
            return self.resolve(m, module.bindings.get(name)?, FUEL);
        }
        module
            .globs
            .iter()
            .filter(|(_, reexport)| *reexport)
            .find_map(|(glob, _)| self.through_glob(m, glob, name, FUEL))
    }

    /// Whether `ancestor` encloses `m` (is its parent, or its parent's, …).
    fn encloses(&self, ancestor: usize, m: usize) -> bool {
        let mut at = self.module(m).and_then(|module| module.parent);
        while let Some(p) = at {
            if p == ancestor {
                return true;
            }
            at = self.module(p).and_then(|module| module.parent);
        }
        false
    }

    /// The types of its ancestors that module `m` implements (`impl Core { … }`,
    /// `impl Trait for Core`), as (module, name).
    fn implemented_ancestor_types(&self, m: usize) -> BTreeSet<(usize, String)> {
        let Some(module) = self.module(m) else {
            return BTreeSet::new();
        };
        module
            .impls
            .iter()
            .filter_map(|path| self.resolve(m, path, FUEL))
            .filter(|t| self.encloses(t.module, m))
            .filter_map(|t| Some((t.module, t.item?)))
            .collect()
    }

    /// Every pair of distinct modules where the first refers to the second, with the line of
    /// its first reference, in order of `from`, then `to`.
    pub fn edges(&self) -> Vec<Edge> {
        let mut first: BTreeMap<(usize, usize), usize> = BTreeMap::new();
        let mut implemented: BTreeMap<usize, BTreeSet<(usize, String)>> = BTreeMap::new();
        for r in &self.refs {
            let target = match (r.lone, r.path.first()) {
                (true, Some(name)) => self.reexported(r.from, name),
                _ => self.resolve(r.from, &r.path, FUEL),
            };
            let Some(Target { module: to, item }) = target else {
                continue;
            };
            if to == r.from {
                continue;
            }
            // the ancestor's type this module implements: part of that type, not a use of it
            let own = implemented
                .entry(r.from)
                .or_insert_with(|| self.implemented_ancestor_types(r.from));
            if item.is_some_and(|name| own.contains(&(to, name))) {
                continue;
            }
            let line = first.entry((r.from, to)).or_insert(r.line);
            *line = (*line).min(r.line);
        }
        first
            .into_iter()
            .map(|((from, to), line)| Edge { from, to, line })
            .collect()
    }
}

/// What a path names: a module (`item: None`) or an item declared in it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Target {
    module: usize,
    item: Option<String>,
}

impl Target {
    fn module(module: usize) -> Target {
        Target { module, item: None }
    }

    fn item(module: usize, name: &str) -> Target {
        Target {
            module,
            item: Some(name.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    /// The crate rooted at `src/lib.rs` among `files` (path, text), and its edges by name.
    fn edges_of(files: &[(&str, &str)]) -> Vec<(String, String, usize)> {
        let map: HashMap<PathBuf, String> = files
            .iter()
            .map(|(p, s)| (PathBuf::from(p), s.to_string()))
            .collect();
        let krate = Crate::load(Path::new("src/lib.rs"), &|p: &Path| map.get(p).cloned());
        assert!(krate.errors.is_empty(), "{:?}", krate.errors);
        krate
            .edges()
            .into_iter()
            .map(|e| {
                (
                    krate.modules[e.from].name.clone(),
                    krate.modules[e.to].name.clone(),
                    e.line,
                )
            })
            .collect()
    }

    fn e(from: &str, to: &str, line: usize) -> (String, String, usize) {
        (from.to_string(), to.to_string(), line)
    }

    #[test]
    fn mod_declarations_are_not_edges_and_use_paths_resolve_to_the_deepest_module() {
        let edges = edges_of(&[
            ("src/lib.rs", "pub mod a;\nmod b;\n"),
            (
                "src/a.rs",
                "use crate::b::helper;\nuse std::fmt;\npub fn f() {}\n",
            ),
            ("src/b.rs", "pub fn helper() {}\n"),
        ]);
        assert_eq!(edges, [e("crate::a", "crate::b", 1)]);
    }

    #[test]
    fn nested_layouts_mod_rs_and_stem_directories() {
        let edges = edges_of(&[
            ("src/lib.rs", "mod a;\nmod b;\n"),
            ("src/a/mod.rs", "mod inner;\n"),
            (
                "src/a/inner.rs",
                "pub fn g() { super::super::b::deep::h() }\n",
            ),
            ("src/b.rs", "pub mod deep;\n"),
            ("src/b/deep.rs", "pub fn h() {}\n"),
        ]);
        assert_eq!(edges, [e("crate::a::inner", "crate::b::deep", 1)]);
    }

    #[test]
    fn path_attribute_and_inline_modules() {
        let edges = edges_of(&[
            ("src/lib.rs", "#[path = \"other/x.rs\"]\nmod x;\nmod inline {\n    pub fn k() { self::deeper::z() }\n    mod deeper { pub fn z() { crate::x::y(); } }\n}\n"),
            ("src/other/x.rs", "pub fn y() {}\n"),
        ]);
        assert_eq!(
            edges,
            [
                e("crate::inline", "crate::inline::deeper", 4),
                e("crate::inline::deeper", "crate::x", 5)
            ]
        );
    }

    #[test]
    fn use_trees_groups_self_aliases_and_globs() {
        let edges = edges_of(&[
            ("src/lib.rs", "mod a; mod b; mod c; mod d;\n"),
            (
                "src/a.rs",
                "use crate::{\n    b::{self, B as Bee},\n    c::*,\n};\nuse ::d::x;\n",
            ),
            ("src/b.rs", "pub struct B;"),
            ("src/c.rs", ""),
            ("src/d.rs", ""),
        ]);
        // `::d` is an extern crate named `d`, not the module
        assert_eq!(
            edges,
            [e("crate::a", "crate::b", 1), e("crate::a", "crate::c", 1)]
        );
    }

    #[test]
    fn bare_paths_to_children_and_bindings_count() {
        let edges = edges_of(&[
            (
                "src/lib.rs",
                "mod a;\nmod b;\nfn f() { a::g(); String::new(); std::mem::drop(1); }\n",
            ),
            ("src/a.rs", "use super::b;\nfn g() { b::h() }\n"),
            ("src/b.rs", "pub fn h() {}\n"),
        ]);
        assert_eq!(
            edges,
            [e("crate", "crate::a", 3), e("crate::a", "crate::b", 1)]
        );
    }

    #[test]
    fn test_modules_and_test_items_are_left_out() {
        let edges = edges_of(&[
            ("src/lib.rs", "mod a;\nmod b;\n"),
            (
                "src/a.rs",
                "pub fn f() {}\n#[cfg(test)]\nuse crate::b::x;\n#[cfg(test)]\nfn helper() -> Result<u8, u8> { crate::b::x() }\n\
                 #[cfg(all(test, not(target_arch = \"wasm32\")))]\nmod slow;\n#[cfg(test)]\nmod tests { use crate::b::x; }\n",
            ),
            ("src/b.rs", "pub fn x() { crate::a::f() }\n#[cfg(test)]\nmod tests;\nmod tests_not { }\n"),
        ]);
        assert_eq!(edges, [e("crate::b", "crate::a", 1)]);
    }

    #[test]
    fn cfg_any_test_is_not_test_only() {
        let toks = lex("cfg(any(test, feature = \"bench\"))");
        assert!(!is_test_cfg(&toks));
        assert!(is_test_cfg(&lex("cfg(test)")));
        assert!(is_test_cfg(&lex("cfg(all(feature = \"x\", test))")));
        assert!(!is_test_cfg(&lex("cfg(all(not(test), unix))")));
    }

    #[test]
    fn reexports_are_followed_to_the_declaring_module() {
        let edges = edges_of(&[
            (
                "src/lib.rs",
                "mod shell;\nmod card;\nmod glob;\npub use shell::Root;\npub use glob::*;\n",
            ),
            ("src/shell.rs", "pub struct Root;\n"),
            (
                "src/card.rs",
                "use crate::Root;\nfn f() { crate::Globbed::new(); }\n",
            ),
            ("src/glob.rs", "pub struct Globbed;\n"),
        ]);
        // the root's `pub use` lines are no references of its own
        assert_eq!(
            edges,
            [
                e("crate::card", "crate::shell", 1),
                e("crate::card", "crate::glob", 2)
            ]
        );
    }

    #[test]
    fn a_reexport_is_structure_and_using_the_reexported_name_is_a_reference() {
        // shell re-exports its child's `Fused` and the child uses shell's `State`: no cycle
        let edges = edges_of(&[
            ("src/lib.rs", "mod shell;\nmod core;\npub use core::*;\n"),
            (
                "src/shell/mod.rs",
                "mod fused;\npub use fused::Fused;\npub struct State;\n",
            ),
            (
                "src/shell/fused.rs",
                "use super::*;\npub struct Fused(State);\n",
            ),
            ("src/core.rs", "pub fn step() {}\n"),
        ]);
        assert_eq!(edges, [e("crate::shell::fused", "crate::shell", 1)]);
        // …but a module whose own code uses what it re-exports depends on it (a type, or a
        // function it calls; a parameter or local of the same name is none of them)
        let edges = edges_of(&[
            ("src/lib.rs", "mod api;\npub use api::{messages, Reply};\nfn f(messages: &[u8]) -> usize { messages.len() }\n"),
            ("src/api.rs", "pub fn messages() {}\npub struct Reply;\n"),
        ]);
        assert!(edges.is_empty(), "{edges:?}");
        let edges = edges_of(&[
            ("src/lib.rs", "mod api;\npub use api::{messages, Reply};\nfn f() -> Reply { messages(); Reply }\n"),
            ("src/api.rs", "pub fn messages() {}\npub struct Reply;\n"),
        ]);
        assert_eq!(edges, [e("crate", "crate::api", 3)]);
        let edges = edges_of(&[
            (
                "src/lib.rs",
                "mod shell;\nmod core;\npub use core::*;\nfn f() { step(); }\n",
            ),
            (
                "src/shell/mod.rs",
                "mod fused;\npub use fused::Fused;\nfn f(x: Fused) { x.Fused(); }\n",
            ),
            ("src/shell/fused.rs", "pub struct Fused;\n"),
            ("src/core.rs", "pub fn step() {}\n"),
        ]);
        assert_eq!(
            edges,
            [
                e("crate", "crate::core", 4),
                e("crate::shell", "crate::shell::fused", 3)
            ]
        );
    }

    #[test]
    fn items_declared_in_the_root_stay_in_the_root() {
        let edges = edges_of(&[
            (
                "src/lib.rs",
                "mod a;\npub const LIMIT: usize = 3;\nfn f() { a::g() }\n",
            ),
            ("src/a.rs", "pub fn g() -> usize { crate::LIMIT }\n"),
        ]);
        assert_eq!(
            edges,
            [e("crate", "crate::a", 3), e("crate::a", "crate", 1)]
        );
    }

    #[test]
    fn comments_strings_macros_and_visibility_are_not_references() {
        let edges = edges_of(&[
            ("src/lib.rs", "mod a;\nmod b;\n"),
            (
                "src/a.rs",
                "//! see [`crate::b`]\n/// crate::b::x\npub(in crate::b) fn f() {\n    let s = \"crate::b::x\";\n    let r = r#\"super::b\"#;\n}\n\
                 macro_rules! m { () => { $crate::b::x() } }\n#[doc = \"crate::b\"]\nfn g() {}\n",
            ),
            ("src/b.rs", "pub fn x() {}\n"),
        ]);
        assert!(edges.is_empty(), "{edges:?}");
    }

    #[test]
    fn missing_module_file_is_an_error() {
        let krate = Crate::load(Path::new("src/lib.rs"), &|p: &Path| {
            (p == Path::new("src/lib.rs")).then(|| "mod gone;".to_string())
        });
        assert_eq!(krate.errors.len(), 1, "{:?}", krate.errors);
        assert!(krate.errors[0].contains("mod gone"), "{:?}", krate.errors);
    }

    #[test]
    fn a_child_implementing_its_ancestors_type_does_not_use_it_by_naming_it() {
        // core/mod.rs holds `Core` and the per-request state of its child; the child holds
        // `impl Core` (one type's methods split over files): no cycle through `Core`…
        let files = [
            ("src/lib.rs", "mod core;\n"),
            (
                "src/core/mod.rs",
                "mod downstream;\nmod protocol;\npub struct Core { x: downstream::Exchange }\n",
            ),
            (
                "src/core/downstream.rs",
                "use super::protocol::Level;\nuse super::Core;\npub struct Exchange;\n\
                 impl Core {\n    fn f(&self) -> Level { Level }\n}\n\
                 impl<T: Fn() -> u8> std::fmt::Debug for super::Core where T: Copy {}\n",
            ),
            ("src/core/protocol.rs", "pub struct Level;\n"),
        ];
        assert_eq!(
            edges_of(&files),
            [
                e("crate::core", "crate::core::downstream", 3),
                e("crate::core::downstream", "crate::core::protocol", 1),
            ]
        );
        // …but taking anything else from the ancestor is a use
        let mut files = files;
        files[2].1 = "use super::{Core, Level};\npub struct Exchange;\nimpl Core { fn f(&self) -> Level { Level } }\n";
        files[1].1 =
            "mod downstream;\npub struct Core { x: downstream::Exchange }\npub struct Level;\n";
        files[3].1 = "";
        assert_eq!(
            edges_of(&files),
            [
                e("crate::core", "crate::core::downstream", 2),
                e("crate::core::downstream", "crate::core", 1)
            ]
        );
    }

    #[test]
    fn impl_self_types() {
        let self_type = |src: &str| impl_self_type(&lex(src), 0, usize::MAX);
        let path = |p: &[&str]| Some(p.iter().map(|s| s.to_string()).collect::<Vec<_>>());
        assert_eq!(self_type("Core {"), path(&["Core"]));
        assert_eq!(
            self_type("<T> Trait<T> for super::Core<T> {"),
            path(&["super", "Core"])
        );
        assert_eq!(
            self_type("<F: Fn() -> u8> From<F> for &'a mut Core where F: Copy {"),
            path(&["Core"])
        );
        assert_eq!(self_type("!Send for Core {}"), path(&["Core"]));
        let toks = lex("fn f() -> impl Iterator<Item = u8> { }\nimpl Core {}");
        let impls: Vec<usize> = (0..toks.len())
            .filter(|&i| ident(&toks, i) == Some("impl") && starts_item(&toks, i, 0))
            .collect();
        assert_eq!(impls.len(), 1);
    }

    #[test]
    fn use_leaves_parse() {
        let toks = lex("crate::a::{self as x, b::{c, d::*}, e as _}");
        assert_eq!(
            use_leaves(&toks),
            [
                UseLeaf::Name(vec!["crate".into(), "a".into()], Some("x".into())),
                UseLeaf::Name(
                    vec!["crate".into(), "a".into(), "b".into(), "c".into()],
                    Some("c".into())
                ),
                UseLeaf::Glob(vec!["crate".into(), "a".into(), "b".into(), "d".into()]),
                UseLeaf::Name(vec!["crate".into(), "a".into(), "e".into()], None),
            ]
        );
    }
}
