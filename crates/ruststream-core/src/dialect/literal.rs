//! PostgreSQL's simple query protocol: a statement's binds rendered into its text as SQL
//! literals ([`Statement::inline_binds`](crate::Statement::inline_binds)).
//!
//! Every `$n` placeholder outside string literals, quoted identifiers, dollar quotes and
//! comments is replaced by the literal of the `n`th bind. The literals are safe under either
//! setting of `standard_conforming_strings`: text without a backslash is `'...'` with each
//! quote doubled, text with one is an escape string `E'...'` with each backslash and quote
//! doubled, bytes are `'\x..'::bytea` written as an escape string, integers are their digits
//! (a negative one in parentheses), booleans `TRUE` and `FALSE`, and `NULL`. The quoting
//! follows PostgreSQL's rules as `postgres_protocol::escape::escape_literal` does, written
//! here so that the core depends on no PostgreSQL crate.

use std::fmt::Write;

use crate::{DbError, ErrorKind, Value};

/// The SQL literal of a value.
pub(super) fn literal(value: &Value) -> Result<String, DbError> {
    Ok(match value {
        Value::Null => "NULL".to_owned(),
        Value::Bool(true) => "TRUE".to_owned(),
        Value::Bool(false) => "FALSE".to_owned(),
        Value::Int(i) if *i < 0 => format!("({i})"),
        Value::Int(i) => i.to_string(),
        Value::Text(text) => text_literal(text)?,
        Value::Bytes(bytes) => {
            let mut out = String::with_capacity(bytes.len() * 2 + 16);
            out.push_str("E'\\\\x");
            for byte in bytes {
                // Writing to a String cannot fail.
                let _ = write!(out, "{byte:02x}");
            }
            out.push_str("'::bytea");
            out
        }
    })
}

fn text_literal(text: &str) -> Result<String, DbError> {
    if text.contains('\0') {
        return Err(DbError::new(
            ErrorKind::Other,
            "a text value holds a NUL character, which PostgreSQL text cannot store",
        ));
    }
    let mut out = String::with_capacity(text.len() + 3);
    if text.contains('\\') {
        out.push_str("E'");
        for c in text.chars() {
            match c {
                '\\' => out.push_str("\\\\"),
                '\'' => out.push_str("''"),
                c => out.push(c),
            }
        }
    } else {
        out.push('\'');
        for c in text.chars() {
            if c == '\'' {
                out.push_str("''");
            } else {
                out.push(c);
            }
        }
    }
    out.push('\'');
    Ok(out)
}

/// Whether `c` continues an unquoted identifier or keyword (where a `$` is part of the name).
fn ident_char(c: char) -> bool {
    c.is_alphanumeric() || c == '_' || c == '$'
}

/// `sql` with each `$n` replaced by the literal of `binds[n - 1]`.
pub(super) fn render(sql: &str, binds: &[Value]) -> Result<String, DbError> {
    let chars: Vec<char> = sql.chars().collect();
    let mut out = String::with_capacity(sql.len() + 16 * binds.len());
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        match c {
            '\'' => {
                let end = quoted_end(&chars, i, '\'', Backslash::at(&chars, i));
                out.extend(&chars[i..end]);
                i = end;
            }
            '"' => {
                let end = quoted_end(&chars, i, '"', Backslash::Plain);
                out.extend(&chars[i..end]);
                i = end;
            }
            '-' if chars.get(i + 1) == Some(&'-') => {
                let end = chars[i..]
                    .iter()
                    .position(|&c| c == '\n')
                    .map_or(chars.len(), |p| i + p + 1);
                out.extend(&chars[i..end]);
                i = end;
            }
            '/' if chars.get(i + 1) == Some(&'*') => {
                let end = block_comment_end(&chars, i);
                out.extend(&chars[i..end]);
                i = end;
            }
            '$' if i > 0 && ident_char(chars[i - 1]) => {
                out.push(c);
                i += 1;
            }
            '$' if chars.get(i + 1).is_some_and(char::is_ascii_digit) => {
                let mut end = i + 1;
                while chars.get(end).is_some_and(char::is_ascii_digit) {
                    end += 1;
                }
                let digits: String = chars[i + 1..end].iter().collect();
                let value = digits
                    .parse::<usize>()
                    .ok()
                    .and_then(|n| n.checked_sub(1))
                    .and_then(|n| binds.get(n))
                    .ok_or_else(|| {
                        DbError::new(
                            ErrorKind::Other,
                            format!(
                                "the statement names ${digits} but has {} binds: {sql}",
                                binds.len()
                            ),
                        )
                    })?;
                out.push_str(&literal(value)?);
                i = end;
            }
            '$' => match dollar_tag(&chars, i) {
                Some(tag_len) => {
                    let end = dollar_end(&chars, i, tag_len);
                    out.extend(&chars[i..end]);
                    i = end;
                }
                None => {
                    out.push(c);
                    i += 1;
                }
            },
            _ => {
                out.push(c);
                i += 1;
            }
        }
    }
    Ok(out)
}

/// Whether a backslash escapes the character after it inside a quoted token: in an escape
/// string (`E'..'`) it does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Backslash {
    Escapes,
    Plain,
}

impl Backslash {
    /// How backslashes read in the string whose quote is at `i`: an escape string when an
    /// `E` that begins a token stands before it.
    fn at(chars: &[char], i: usize) -> Self {
        let escape =
            i > 0 && matches!(chars[i - 1], 'e' | 'E') && (i < 2 || !ident_char(chars[i - 2]));
        if escape {
            Backslash::Escapes
        } else {
            Backslash::Plain
        }
    }
}

/// The index past a quoted token that opens at `start` with `quote`; a doubled quote stays
/// inside, and so does a backslash-escaped one in an escape string.
fn quoted_end(chars: &[char], start: usize, quote: char, backslash: Backslash) -> usize {
    let mut i = start + 1;
    while i < chars.len() {
        let c = chars[i];
        if backslash == Backslash::Escapes && c == '\\' {
            i += 2;
            continue;
        }
        if c == quote {
            if chars.get(i + 1) == Some(&quote) {
                i += 2;
                continue;
            }
            return i + 1;
        }
        i += 1;
    }
    chars.len()
}

/// The index past a block comment (they nest in PostgreSQL) that opens at `start`.
fn block_comment_end(chars: &[char], start: usize) -> usize {
    let mut depth = 0usize;
    let mut i = start;
    while i + 1 < chars.len() {
        match (chars[i], chars[i + 1]) {
            ('/', '*') => {
                depth += 1;
                i += 2;
            }
            ('*', '/') => {
                depth -= 1;
                i += 2;
                if depth == 0 {
                    return i;
                }
            }
            _ => i += 1,
        }
    }
    chars.len()
}

/// The length of a dollar quote's tag (`$$` or `$tag$`) that opens at `start`, if one does.
fn dollar_tag(chars: &[char], start: usize) -> Option<usize> {
    let mut i = start + 1;
    while let Some(&c) = chars.get(i) {
        if c == '$' {
            return Some(i + 1 - start);
        }
        let first = i == start + 1;
        if !(c.is_alphabetic() || c == '_' || (!first && c.is_ascii_digit())) {
            return None;
        }
        i += 1;
    }
    None
}

/// The index past a dollar-quoted string whose tag of `tag_len` characters opens at `start`.
fn dollar_end(chars: &[char], start: usize, tag_len: usize) -> usize {
    let tag = &chars[start..start + tag_len];
    let mut i = start + tag_len;
    while i + tag_len <= chars.len() {
        if &chars[i..i + tag_len] == tag {
            return i + tag_len;
        }
        i += 1;
    }
    chars.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn literals_are_safe_under_either_setting() {
        assert_eq!(literal(&Value::Null).unwrap(), "NULL");
        assert_eq!(literal(&Value::Bool(true)).unwrap(), "TRUE");
        assert_eq!(literal(&Value::Int(42)).unwrap(), "42");
        assert_eq!(literal(&Value::Int(-7)).unwrap(), "(-7)");
        assert_eq!(
            literal(&Value::Int(i64::MIN)).unwrap(),
            "(-9223372036854775808)"
        );
        assert_eq!(literal(&Value::Text("it's".into())).unwrap(), "'it''s'");
        assert_eq!(
            literal(&Value::Text("a\\'b".into())).unwrap(),
            "E'a\\\\''b'"
        );
        assert_eq!(
            literal(&Value::Bytes(vec![0, 0xab, b'\''])).unwrap(),
            "E'\\\\x00ab27'::bytea"
        );
        assert!(literal(&Value::Text("nul\0".into())).is_err());
    }

    #[test]
    fn placeholders_outside_quotes_are_replaced() {
        let sql = r#"SELECT "a$1", 'x$1', $1, E'\'$2', $2 FROM t WHERE "i""d" = $10 -- $1
AND b = /* $1 /* $2 */ */ $1 AND c$1 = $$ $1 $$ AND d = $tag$ $2 $tag$"#;
        let mut binds = vec![Value::Int(1), Value::Text("two".into())];
        binds.extend((3..=10).map(Value::Int));
        let rendered = render(sql, &binds).unwrap();
        assert_eq!(
            rendered,
            r#"SELECT "a$1", 'x$1', 1, E'\'$2', 'two' FROM t WHERE "i""d" = 10 -- $1
AND b = /* $1 /* $2 */ */ 1 AND c$1 = $$ $1 $$ AND d = $tag$ $2 $tag$"#
        );
        assert!(render("SELECT $3", &binds[..2]).is_err());
        assert!(render("SELECT $0", &binds).is_err());
    }
}
