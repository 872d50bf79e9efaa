//! The category of a refusal, for counting refusals by reason: the error's variant path read from
//! its Debug form (`Header/OutOfBounds`, `Checkpoint/Shard/SizeMismatch`), or for errors that are
//! a message, the message with names and numbers folded away.

use std::fmt::Debug;

fn ident(s: &str) -> (&str, &str) {
    let end = s
        .find(|c: char| !(c.is_alphanumeric() || c == '_'))
        .unwrap_or(s.len());
    (&s[..end], &s[end..])
}

/// `Variant`, `Variant/Inner` for tuple variants wrapping an enum, and `/Source` for a `source`
/// field, from an error's Debug text.
pub fn of(e: &dyn Debug) -> String {
    let text = format!("{e:?}");
    let mut parts = Vec::new();
    let (head, mut rest) = ident(&text);
    parts.push(head.to_string());
    while let Some(r) = rest.strip_prefix('(') {
        let (inner, r) = ident(r);
        if inner.is_empty() || !inner.starts_with(|c: char| c.is_ascii_uppercase()) {
            break;
        }
        parts.push(inner.to_string());
        rest = r;
    }
    if let Some(at) = rest.find("source: ") {
        let (src, r) = ident(&rest[at + 8..]);
        if !src.is_empty() && src.starts_with(|c: char| c.is_ascii_uppercase()) {
            parts.push(src.to_string());
            if let Some(r) = r.strip_prefix('(') {
                let (inner, _) = ident(r);
                if inner.starts_with(|c: char| c.is_ascii_uppercase()) {
                    parts.push(inner.to_string());
                }
            }
        }
    }
    if let Some(kind) = text.split("kind: ").nth(1) {
        parts.push(ident(kind).0.to_string());
    }
    parts.join("/")
}

/// A message with quoted names, bracketed shapes and numbers folded, so that one reason counts once.
pub fn of_message(msg: &str) -> String {
    let mut out = String::new();
    let mut chars = msg.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '`' | '"' => {
                for d in chars.by_ref() {
                    if d == c {
                        break;
                    }
                }
                out.push_str("<name>");
            }
            '[' => {
                let mut depth = 1;
                for d in chars.by_ref() {
                    depth += (d == '[') as i32 - (d == ']') as i32;
                    if depth == 0 {
                        break;
                    }
                }
                out.push_str("[..]");
            }
            // A number, not a digit inside a name (F32, utf8).
            c if !out.ends_with(|p: char| p.is_alphanumeric() || p == '_')
                && (c.is_ascii_digit()
                    || (c == '-' && chars.peek().is_some_and(|d| d.is_ascii_digit()))) =>
            {
                while chars
                    .peek()
                    .is_some_and(|d| d.is_ascii_digit() || *d == '.' || *d == 'e')
                {
                    chars.next();
                }
                out.push('N');
            }
            c => out.push(c),
        }
        if out.len() > 90 {
            out.push('…');
            break;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    #[derive(Debug)]
    #[allow(dead_code)]
    enum Inner {
        OutOfBounds { start: u64 },
    }
    #[derive(Debug)]
    #[allow(dead_code)]
    enum Outer {
        Header { path: String, source: Inner },
        Wrap(Box<Outer>),
    }

    #[test]
    fn variant_paths() {
        let e = Outer::Header {
            path: "p".into(),
            source: Inner::OutOfBounds { start: 3 },
        };
        assert_eq!(super::of(&e), "Header/OutOfBounds");
        assert_eq!(
            super::of(&Outer::Wrap(Box::new(e))),
            "Wrap/Header/OutOfBounds"
        );
        assert_eq!(
            super::of_message("tensor `a` is F32 [2, 3], expected 12 bytes"),
            "tensor <name> is F32 [..], expected N bytes"
        );
    }
}
