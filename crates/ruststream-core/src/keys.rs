//! Advisory lock keys: the template of `advisory_lock = ".."`, and how each database names a
//! key's lock.
//!
//! A key is text. The template `"video_jobs-{channel}"` renders, for a row whose `channel` is
//! `7`, the key `video_jobs-7`: a placeholder names a field, and the database renders the
//! column's value as text. `{{` and `}}` stand for literal braces.
//!
//! - **PostgreSQL** locks a 64-bit number: [`postgres_key_hash`], the first eight bytes of the
//!   SHA-256 of the key's UTF-8 bytes, read as a big-endian signed integer. Another system takes
//!   the same lock with the expression [`POSTGRES_KEY_HASH_SQL`] (PostgreSQL 11 and later):
//!   `pg_try_advisory_lock(('x' || substr(encode(sha256(convert_to(key, 'UTF8')), 'hex'), 1, 16))::bit(64)::bigint)`.
//! - **MySQL and MariaDB** lock a name with `GET_LOCK`: [`mysql_lock_name`], the database's
//!   name, a dot and the key, or the lowercase hex SHA-256 of that text when it is longer than
//!   64 characters, the longest name `GET_LOCK` takes.
//! - **SQLite** has no locks a session holds: the process keeps the keys in work.

use sha2::{Digest, Sha256};

/// A parsed piece of a key template.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum TemplatePart {
    /// Text written as it stands.
    Literal(String),
    /// A field whose column's value is rendered as text.
    Field(String),
}

/// A key template that does not parse.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TemplateError {
    /// The template is empty.
    #[error("advisory_lock: the key template is empty")]
    Empty,
    /// `{}` names no field.
    #[error(
        "advisory_lock `{template}`: the placeholder at byte {at} is empty; write a field's name between the braces"
    )]
    EmptyPlaceholder {
        /// The template.
        template: String,
        /// The byte offset of its `{`.
        at: usize,
    },
    /// A `{` with no `}`.
    #[error(
        "advisory_lock `{template}`: the `{{` at byte {at} is not closed; write `{{{{` for a literal brace"
    )]
    Unclosed {
        /// The template.
        template: String,
        /// The byte offset of the `{`.
        at: usize,
    },
    /// A `}` with no `{`.
    #[error(
        "advisory_lock `{template}`: the `}}` at byte {at} closes no placeholder; write `}}}}` for a literal brace"
    )]
    Unopened {
        /// The template.
        template: String,
        /// The byte offset of the `}`.
        at: usize,
    },
    /// A `{` inside a placeholder.
    #[error("advisory_lock `{template}`: the placeholder at byte {at} holds a `{{`")]
    Nested {
        /// The template.
        template: String,
        /// The byte offset of the inner `{`.
        at: usize,
    },
    /// A placeholder names a field the row does not have.
    #[error(
        "advisory_lock `{template}`: `{{{field}}}` names no field of the row; the fields are: {known}"
    )]
    UnknownField {
        /// The template.
        template: String,
        /// The unknown name.
        field: String,
        /// The fields there are, comma-separated.
        known: String,
    },
}

/// Parses a key template into its parts, merging adjacent literal text.
pub fn parse_template(template: &str) -> Result<Vec<TemplatePart>, TemplateError> {
    if template.is_empty() {
        return Err(TemplateError::Empty);
    }
    let mut parts = Vec::new();
    let mut literal = String::new();
    let mut chars = template.char_indices().peekable();
    while let Some((at, c)) = chars.next() {
        match c {
            '{' if chars.peek().is_some_and(|&(_, n)| n == '{') => {
                chars.next();
                literal.push('{');
            }
            '}' if chars.peek().is_some_and(|&(_, n)| n == '}') => {
                chars.next();
                literal.push('}');
            }
            '}' => {
                return Err(TemplateError::Unopened {
                    template: template.to_owned(),
                    at,
                });
            }
            '{' => {
                let mut name = String::new();
                let mut closed = false;
                for (inner_at, inner) in chars.by_ref() {
                    match inner {
                        '}' => {
                            closed = true;
                            break;
                        }
                        '{' => {
                            return Err(TemplateError::Nested {
                                template: template.to_owned(),
                                at: inner_at,
                            });
                        }
                        other => name.push(other),
                    }
                }
                if !closed {
                    return Err(TemplateError::Unclosed {
                        template: template.to_owned(),
                        at,
                    });
                }
                let name = name.trim();
                if name.is_empty() {
                    return Err(TemplateError::EmptyPlaceholder {
                        template: template.to_owned(),
                        at,
                    });
                }
                if !literal.is_empty() {
                    parts.push(TemplatePart::Literal(std::mem::take(&mut literal)));
                }
                parts.push(TemplatePart::Field(name.to_owned()));
            }
            other => literal.push(other),
        }
    }
    if !literal.is_empty() {
        parts.push(TemplatePart::Literal(literal));
    }
    Ok(parts)
}

/// Parses a key template and checks that each placeholder names one of `fields`.
pub fn parse_template_for(
    template: &str,
    fields: &[&str],
) -> Result<Vec<TemplatePart>, TemplateError> {
    let parts = parse_template(template)?;
    for part in &parts {
        if let TemplatePart::Field(field) = part
            && !fields.contains(&field.as_str())
        {
            return Err(TemplateError::UnknownField {
                template: template.to_owned(),
                field: field.clone(),
                known: fields.join(", "),
            });
        }
    }
    Ok(parts)
}

/// The SQL expression that computes [`postgres_key_hash`] on a PostgreSQL server (11 and
/// later), with `{key}` standing for a text expression.
pub const POSTGRES_KEY_HASH_SQL: &str =
    "('x' || substr(encode(sha256(convert_to({key}, 'UTF8')), 'hex'), 1, 16))::bit(64)::bigint";

/// The 64-bit number PostgreSQL locks for `key`: the first eight bytes of the SHA-256 of its
/// UTF-8 bytes, big-endian, as a signed integer.
pub fn postgres_key_hash(key: &str) -> i64 {
    let digest = Sha256::digest(key.as_bytes());
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    i64::from_be_bytes(first)
}

/// The longest name MySQL's and MariaDB's `GET_LOCK` takes, in characters.
pub const MYSQL_LOCK_NAME_MAX: usize = 64;

/// The name MySQL and MariaDB lock for `key` in `database`: `database.key`, or the lowercase
/// hex SHA-256 of that text when it is longer than [`MYSQL_LOCK_NAME_MAX`] characters.
pub fn mysql_lock_name(database: &str, key: &str) -> String {
    let name = format!("{database}.{key}");
    if name.chars().count() <= MYSQL_LOCK_NAME_MAX {
        return name;
    }
    let digest = Sha256::digest(name.as_bytes());
    let mut hex = String::with_capacity(64);
    for byte in digest {
        hex.push(char::from_digit(u32::from(byte >> 4), 16).expect("a nibble is a hex digit"));
        hex.push(char::from_digit(u32::from(byte & 0xf), 16).expect("a nibble is a hex digit"));
    }
    hex
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_literal_and_fields() {
        assert_eq!(
            parse_template("video_jobs-{channel}").unwrap(),
            vec![
                TemplatePart::Literal("video_jobs-".into()),
                TemplatePart::Field("channel".into())
            ]
        );
        assert_eq!(
            parse_template("{a}:{b}").unwrap(),
            vec![
                TemplatePart::Field("a".into()),
                TemplatePart::Literal(":".into()),
                TemplatePart::Field("b".into())
            ]
        );
        assert_eq!(
            parse_template("x{{y}}").unwrap(),
            vec![TemplatePart::Literal("x{y}".into())]
        );
    }

    #[test]
    fn names_what_is_wrong() {
        assert_eq!(parse_template(""), Err(TemplateError::Empty));
        let err = parse_template("jobs-{}").unwrap_err();
        assert!(matches!(err, TemplateError::EmptyPlaceholder { at: 5, .. }));
        assert!(err.to_string().contains("jobs-{}"));
        assert!(matches!(
            parse_template("jobs-{channel"),
            Err(TemplateError::Unclosed { at: 5, .. })
        ));
        assert!(matches!(
            parse_template("jobs-}x"),
            Err(TemplateError::Unopened { at: 5, .. })
        ));
        assert!(matches!(
            parse_template("{a{b}"),
            Err(TemplateError::Nested { at: 2, .. })
        ));
        let err = parse_template_for("jobs-{chanel}", &["id", "channel"]).unwrap_err();
        assert_eq!(
            err.to_string(),
            "advisory_lock `jobs-{chanel}`: `{chanel}` names no field of the row; the fields are: id, channel"
        );
    }

    #[test]
    fn postgres_hash_is_stable() {
        // The value is fixed forever, since another system computes it too: SHA-256 of the
        // empty text begins e3b0c44298fc1c14.
        let digest = Sha256::digest(b"video_jobs-7");
        let expected = i64::from_be_bytes(digest[..8].try_into().unwrap());
        assert_eq!(postgres_key_hash("video_jobs-7"), expected);
        assert_eq!(postgres_key_hash(""), -2_039_914_840_885_289_964);
    }

    #[test]
    fn mysql_names_hash_past_64_characters() {
        assert_eq!(mysql_lock_name("test", "video_jobs-7"), "test.video_jobs-7");
        let key = "k".repeat(59);
        assert_eq!(mysql_lock_name("test", &key).chars().count(), 64);
        assert_eq!(mysql_lock_name("test", &key), format!("test.{key}"));
        let long = "k".repeat(60);
        let hashed = mysql_lock_name("test", &long);
        assert_eq!(hashed.len(), 64);
        assert!(
            hashed
                .chars()
                .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase())
        );
        assert_ne!(hashed, mysql_lock_name("test2", &long));
        // Characters, not bytes: 59 two-byte characters still fit.
        let wide = "é".repeat(59);
        assert_eq!(mysql_lock_name("test", &wide), format!("test.{wide}"));
    }
}
