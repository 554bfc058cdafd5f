//! The tokens of a Rust source file that name modules and paths: identifiers, string literals
//! (for `#[path = "…"]`), `::` and single punctuation characters, each with its line.
//!
//! Comments (nested block comments included), character and byte literals, lifetimes and
//! numbers produce no token, so a path written in a comment, a doc comment or a string
//! (`"crate::a"`, `r#"super::b"#`) is never taken for a reference. It is not a full Rust
//! lexer: multi-character operators other than `::` come out as their characters, which is
//! all the scanner (`tree`) needs.

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Tok {
    /// An identifier or keyword; a raw identifier (`r#type`) without its `r#`.
    Ident(String),
    /// A string literal's text between its quotes, escapes left as written.
    Str(String),
    /// `::`
    PathSep,
    /// Any other punctuation character.
    Punct(char),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Token {
    pub tok: Tok,
    /// 1-based.
    pub line: usize,
}

struct Cursor {
    chars: Vec<char>,
    pos: usize,
    line: usize,
}

impl Cursor {
    fn peek(&self, ahead: usize) -> Option<char> {
        self.chars.get(self.pos + ahead).copied()
    }

    fn bump(&mut self) -> Option<char> {
        let c = self.peek(0)?;
        self.pos += 1;
        if c == '\n' {
            self.line += 1;
        }
        Some(c)
    }

    fn bump_while(&mut self, keep: impl Fn(char) -> bool) -> String {
        let mut out = String::new();
        while let Some(c) = self.peek(0) {
            if !keep(c) {
                break;
            }
            out.push(c);
            self.bump();
        }
        out
    }

    /// After `/*`: up to the matching `*/`, nested comments counted.
    fn block_comment(&mut self) {
        let mut depth = 1usize;
        while depth > 0 {
            match (self.bump(), self.peek(0)) {
                (None, _) => return,
                (Some('/'), Some('*')) => {
                    self.bump();
                    depth += 1;
                }
                (Some('*'), Some('/')) => {
                    self.bump();
                    depth -= 1;
                }
                _ => {}
            }
        }
    }

    /// After the opening `"` of a string with escapes: its text, the closing quote consumed.
    fn quoted(&mut self) -> String {
        let mut out = String::new();
        while let Some(c) = self.bump() {
            match c {
                '"' => break,
                '\\' => {
                    out.push(c);
                    if let Some(escaped) = self.bump() {
                        out.push(escaped);
                    }
                }
                _ => out.push(c),
            }
        }
        out
    }

    /// At the `#`s or `"` after a raw string's `r`: its text, the closing `"#…` consumed.
    fn raw_quoted(&mut self) -> String {
        let hashes = self.bump_while(|c| c == '#').len();
        self.bump(); // the opening quote
        let mut out = String::new();
        while let Some(c) = self.bump() {
            if c == '"' && (0..hashes).all(|k| self.peek(k) == Some('#')) {
                for _ in 0..hashes {
                    self.bump();
                }
                break;
            }
            out.push(c);
        }
        out
    }

    /// After an opening `'`: a character literal (skipped) or a lifetime or label (skipped).
    fn quote(&mut self) {
        match (self.peek(0), self.peek(1)) {
            (Some('\\'), _) => {
                self.bump();
                self.bump();
                // the rest of the escape (`u{1F600}`, `x41`) up to the closing quote
                while let Some(c) = self.bump() {
                    if c == '\'' || c == '\n' {
                        break;
                    }
                }
            }
            (Some(_), Some('\'')) => {
                self.bump();
                self.bump();
            }
            _ => {
                self.bump_while(is_ident_continue);
            }
        }
    }

    /// Whether a raw string starts here (after its `r`): `#`* then `"`.
    fn at_raw_string(&self) -> bool {
        let mut k = 0;
        while self.peek(k) == Some('#') {
            k += 1;
        }
        self.peek(k) == Some('"')
    }
}

fn is_ident_start(c: char) -> bool {
    c == '_' || c.is_alphabetic()
}

fn is_ident_continue(c: char) -> bool {
    c == '_' || c.is_alphanumeric()
}

/// The tokens of `src`, in order.
pub fn lex(src: &str) -> Vec<Token> {
    let mut cur = Cursor {
        chars: src.chars().collect(),
        pos: 0,
        line: 1,
    };
    let mut out = Vec::new();
    while let Some(c) = cur.peek(0) {
        let line = cur.line;
        let mut push = |tok| out.push(Token { tok, line });
        match c {
            _ if c.is_whitespace() => {
                cur.bump();
            }
            '/' if cur.peek(1) == Some('/') => {
                cur.bump_while(|c| c != '\n');
            }
            '/' if cur.peek(1) == Some('*') => {
                cur.bump();
                cur.bump();
                cur.block_comment();
            }
            '"' => {
                cur.bump();
                push(Tok::Str(cur.quoted()));
            }
            '\'' => {
                cur.bump();
                cur.quote();
            }
            ':' if cur.peek(1) == Some(':') => {
                cur.bump();
                cur.bump();
                push(Tok::PathSep);
            }
            _ if c.is_ascii_digit() => {
                cur.bump_while(is_ident_continue);
            }
            _ if is_ident_start(c) => {
                let word = cur.bump_while(is_ident_continue);
                let next = cur.peek(0);
                match (word.as_str(), next) {
                    ("r", Some('#')) if cur.peek(1).is_some_and(is_ident_start) => {
                        cur.bump();
                        push(Tok::Ident(cur.bump_while(is_ident_continue)));
                    }
                    ("r" | "br" | "cr", Some('#' | '"')) if cur.at_raw_string() => {
                        push(Tok::Str(cur.raw_quoted()));
                    }
                    ("b" | "c", Some('"')) => {
                        cur.bump();
                        push(Tok::Str(cur.quoted()));
                    }
                    ("b", Some('\'')) => {
                        cur.bump();
                        cur.quote();
                    }
                    _ => push(Tok::Ident(word)),
                }
            }
            _ => {
                cur.bump();
                push(Tok::Punct(c));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn idents(src: &str) -> Vec<String> {
        lex(src)
            .into_iter()
            .filter_map(|t| match t.tok {
                Tok::Ident(s) => Some(s),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn comments_and_strings_hide_paths() {
        let src = r####"
            // crate::a::f()
            /* crate::b /* nested crate::c */ still crate::d */
            /// [`crate::e`]
            let s = "crate::f"; let r = r#"super::g "quoted""#; let b = br"self::h";
            let c = b"crate::i"; let raw = r##"a "# crate::j"##;
            x
        "####;
        assert_eq!(
            idents(src),
            ["let", "s", "let", "r", "let", "b", "let", "c", "let", "raw", "x"]
        );
    }

    #[test]
    fn chars_and_lifetimes_are_skipped() {
        let src =
            "fn f<'a>(x: &'a str) -> char { let q = '\"'; let e = '\\''; let u = '\\u{1F600}'; \
                   let b = b'x'; 'outer: loop { break 'outer; } 'é' }";
        let names = idents(src);
        assert!(!names.contains(&"a".to_string()), "{names:?}");
        assert!(!names.contains(&"outer".to_string()), "{names:?}");
        assert!(names.contains(&"loop".to_string()), "{names:?}");
        // the `"` in a character literal opens no string
        assert!(names.contains(&"e".to_string()), "{names:?}");
    }

    #[test]
    fn raw_identifiers_path_separators_and_lines() {
        let toks = lex("use crate::r#type;\n\nsuper::x");
        let kinds: Vec<Tok> = toks.iter().map(|t| t.tok.clone()).collect();
        assert_eq!(
            kinds,
            [
                Tok::Ident("use".into()),
                Tok::Ident("crate".into()),
                Tok::PathSep,
                Tok::Ident("type".into()),
                Tok::Punct(';'),
                Tok::Ident("super".into()),
                Tok::PathSep,
                Tok::Ident("x".into()),
            ]
        );
        assert_eq!(toks.last().map(|t| t.line), Some(3));
    }

    #[test]
    fn string_text_and_escapes() {
        let toks = lex(r#"#[path = "a/b.rs"] "x\"y" 1.5e3"#);
        assert!(toks.iter().any(|t| t.tok == Tok::Str("a/b.rs".into())));
        assert!(toks.iter().any(|t| t.tok == Tok::Str("x\\\"y".into())));
        assert!(!toks
            .iter()
            .any(|t| matches!(&t.tok, Tok::Ident(s) if s == "e3")));
    }
}
