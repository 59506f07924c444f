//! Arbitrary table descriptions, with names of any text, rendered in every dialect: building and
//! checking a description never panics, and every statement of one that passes its check
//! quotes every identifier, writes the key's literal text only as an escaped string literal,
//! and takes every value through a placeholder, one per argument it lists.
//!
//! The check reads each statement as the database would: quoted identifiers (`"..."`, or
//! `` `...` `` on MySQL and MariaDB) and string literals (`'...'`, with MySQL's backslash
//! escapes) are skipped; what is left is the statement's own text, which must be plain ASCII
//! with no quote, comment or statement separator. Each quoted identifier must be one of the
//! description's names, a part of its table's name, or a name of the core's own (plain
//! lowercase); each string literal the text of a key's literal part, a name of the description
//! (a table's name the catalog is asked about, a notification's payload), or text of the core's
//! own.

#![no_main]

use arbitrary::{Arbitrary, Result, Unstructured};
use libfuzzer_sys::fuzz_target;
use ruststream_core::spec::{Column, Hold, KeyPart, OrderBy, TableDesc};
use ruststream_core::{Dialect, FailedRows, Form, Inserts, Publish, Statement, Statements, Value};

const DIALECTS: [Dialect; 4] = [
    Dialect::Postgres,
    Dialect::MySql,
    Dialect::MariaDb,
    Dialect::Sqlite,
];

/// A name of arbitrary text, kept for the life of the process (descriptions hold `'static`
/// names): mostly short and odd, with quotes, backslashes, dots and non-ASCII text likely.
fn name(u: &mut Unstructured<'_>) -> Result<&'static str> {
    const ODD: [&str; 10] = ["\"", "`", "'", "\\", ".", " ", "é", "--", "$1", "?"];
    let mut out = String::new();
    for _ in 0..u.int_in_range(0..=6)? {
        if u.ratio(1, 3)? {
            out.push_str(u.choose(&ODD)?);
        } else {
            out.push(char::from(u.int_in_range(b'a'..=b'z')?));
        }
    }
    if out.is_empty() {
        out.push('c');
    }
    Ok(Box::leak(out.into_boxed_str()))
}

fn column(u: &mut Unstructured<'_>) -> Result<Column> {
    let column = Column::new(name(u)?);
    Ok(if u.arbitrary()? {
        column.generated()
    } else {
        column
    })
}

fn maybe(u: &mut Unstructured<'_>) -> Result<Option<Column>> {
    Ok(if u.arbitrary()? {
        Some(column(u)?)
    } else {
        None
    })
}

fn leak<T>(items: Vec<T>) -> &'static [T] {
    Box::leak(items.into_boxed_slice())
}

fn desc(u: &mut Unstructured<'_>) -> Result<TableDesc> {
    let form = u.int_in_range(0..=2u8)?;
    let hold = if form == 2 {
        let mut parts = Vec::new();
        for _ in 0..u.int_in_range(1..=3)? {
            parts.push(if u.arbitrary()? {
                KeyPart::Literal(name(u)?)
            } else {
                KeyPart::Column(name(u)?)
            });
        }
        Hold::Advisory {
            key: leak(parts),
            custom_lock: u.ratio(1, 4)?,
        }
    } else if form == 1 {
        Hold::Lease {
            locked_until: column(u)?,
        }
    } else {
        Hold::RowLock
    };
    let mut order = Vec::new();
    for _ in 0..u.int_in_range(0..=2)? {
        let column = name(u)?;
        order.push(if u.arbitrary()? {
            OrderBy::asc(column)
        } else {
            OrderBy::desc(column)
        });
    }
    let mut unique = Vec::new();
    for _ in 0..u.int_in_range(0..=2)? {
        unique.push(name(u)?);
    }
    Ok(TableDesc {
        table: name(u)?,
        id: column(u)?,
        payload: maybe(u)?,
        attempt: maybe(u)?,
        hold,
        processed_at: maybe(u)?,
        due: maybe(u)?,
        failed_at: maybe(u)?,
        error: maybe(u)?,
        errors: maybe(u)?,
        order: leak(order),
        unique: leak(unique),
    })
}

/// Every name the description holds, and its table's name part by part.
fn names(desc: &TableDesc) -> Vec<&'static str> {
    let mut out: Vec<&'static str> = desc.columns();
    out.extend(desc.key_columns());
    out.extend(desc.order.iter().map(|o| o.column));
    out.extend(desc.unique.iter().copied());
    out.push(desc.table);
    out.extend(desc.table.split('.'));
    out
}

fn literals(desc: &TableDesc) -> Vec<&'static str> {
    desc.advisory()
        .unwrap_or(&[])
        .iter()
        .filter_map(|part| match part {
            KeyPart::Literal(text) => Some(*text),
            KeyPart::Column(_) => None,
        })
        .collect()
}

/// Text the core writes itself: a plain lowercase name, or a literal of its own.
fn own_text(text: &str) -> bool {
    // The JSON paths and the empty array of the errors history.
    matches!(text, "[]" | "$" | "$[#]" | "$[0]")
        || text.chars().all(|c| {
            c.is_ascii_alphanumeric() || matches!(c, '_' | ' ' | '-' | '.' | ':' | '%' | '!' | ',')
        })
}

/// Reads `sql` as `dialect` does; panics where a statement breaks the target's rules.
fn check(dialect: Dialect, desc: &TableDesc, statement: &Statement) {
    let mysql = matches!(dialect, Dialect::MySql | Dialect::MariaDb);
    let ident_quote = if mysql { '`' } else { '"' };
    let sql: Vec<char> = statement.sql.chars().collect();
    let names = names(desc);
    let literals = literals(desc);
    let mut outside = String::new();
    let mut placeholders = 0;
    let mut i = 0;
    while i < sql.len() {
        let c = sql[i];
        if c == ident_quote || c == '\'' {
            let mut text = String::new();
            i += 1;
            loop {
                let Some(&d) = sql.get(i) else {
                    panic!("{dialect:?}: an unclosed quote in {:?}", statement.sql);
                };
                if c == '\'' && mysql && d == '\\' {
                    text.push(*sql.get(i + 1).expect("an escaped character"));
                    i += 2;
                    continue;
                }
                if d == c {
                    if sql.get(i + 1) == Some(&c) {
                        text.push(c);
                        i += 2;
                        continue;
                    }
                    i += 1;
                    break;
                }
                text.push(d);
                i += 1;
            }
            if c == '\'' {
                assert!(
                    literals.contains(&text.as_str())
                        || names.contains(&text.as_str())
                        || own_text(&text),
                    "{dialect:?}: the literal {text:?} is neither a key's text, a name of the description nor the core's: {:?}",
                    statement.sql
                );
            } else {
                assert!(
                    names.contains(&text.as_str())
                        || text.chars().all(|c| c.is_ascii_lowercase() || c == '_'),
                    "{dialect:?}: the identifier {text:?} is no name of the description: {:?}",
                    statement.sql
                );
            }
            outside.push(' ');
            continue;
        }
        if c == '?' {
            placeholders += 1;
        }
        if c == '$' && sql.get(i + 1).is_some_and(char::is_ascii_digit) {
            placeholders += 1;
        }
        outside.push(c);
        i += 1;
    }
    assert!(
        outside
            .chars()
            .all(|c| c.is_ascii() && !c.is_ascii_control() || matches!(c, '\n' | '\t'))
            && !outside.contains(['"', '`', '\\', ';', '#'])
            && !outside.contains("--")
            && !outside.contains("/*"),
        "{dialect:?}: text outside quotes that a name could have written: {outside:?} in {:?}",
        statement.sql
    );
    // `$n` (PostgreSQL) and `?n` (SQLite) may repeat an argument: count the distinct ones.
    let numbered = match dialect {
        Dialect::Postgres => Some('$'),
        Dialect::Sqlite => Some('?'),
        Dialect::MySql | Dialect::MariaDb => None,
    };
    if let Some(mark) = numbered {
        let mut seen = std::collections::BTreeSet::new();
        let mut rest = outside.as_str();
        while let Some(at) = rest.find(mark) {
            let digits: String = rest[at + 1..]
                .chars()
                .take_while(char::is_ascii_digit)
                .collect();
            assert!(
                !digits.is_empty(),
                "{dialect:?}: a placeholder without its number: {:?}",
                statement.sql
            );
            seen.insert(digits.parse::<usize>().expect("digits"));
            rest = &rest[at + 1..];
        }
        assert_eq!(
            seen.len(),
            statement.args.len(),
            "{dialect:?}: placeholders against arguments: {:?}",
            statement.sql
        );
    } else {
        assert_eq!(
            placeholders,
            statement.args.len(),
            "{dialect:?}: placeholders against arguments: {:?}",
            statement.sql
        );
    }
}

#[derive(Debug)]
struct Input {
    desc: TableDesc,
    batch: usize,
    rows: usize,
}

impl<'a> Arbitrary<'a> for Input {
    fn arbitrary(u: &mut Unstructured<'a>) -> Result<Self> {
        Ok(Input {
            desc: desc(u)?,
            batch: u.int_in_range(1..=70)?,
            rows: u.int_in_range(1..=9)?,
        })
    }
}

fuzz_target!(|input: Input| {
    let desc = input.desc;
    if desc.validate().is_err() {
        return;
    }
    for dialect in DIALECTS {
        if dialect == Dialect::Sqlite && desc.form() == Form::RowLock {
            // No row locks on SQLite: such a description does not compile.
            continue;
        }
        let statements = Statements::render(dialect, &desc, input.batch);
        let mut all: Vec<Statement> = statements.all().into_iter().cloned().collect();
        all.extend(Statements::settle_leases(dialect, &desc, input.rows));
        all.extend(Statements::candidates_excluding(dialect, &desc, input.rows));
        all.extend(Statements::candidates_from(dialect, &desc, input.rows));
        for which in [
            FailedRows::All,
            FailedRows::Ids(input.rows),
            FailedRows::ErrorContains,
        ] {
            all.extend(Statements::redrive(dialect, &desc, which));
            all.extend(Statements::delete_failed(dialect, &desc, which));
        }
        let mut inserts = Inserts::new(dialect, desc);
        let mut columns: Vec<(&'static str, Value)> = Vec::new();
        for column in desc
            .key_columns()
            .into_iter()
            .chain(desc.unique.iter().copied())
        {
            if !columns.iter().any(|(c, _)| *c == column) {
                columns.push((column, Value::Text("it's \\ \"x\"".to_owned())));
            }
        }
        let row = Publish {
            id: (!desc.id.generated).then_some(Value::Int(1)),
            payload: b"{}".to_vec(),
            columns,
            due: None,
        };
        let rows = vec![row; input.rows.min(3)];
        if let Ok(publishes) = inserts.statements(&rows) {
            all.extend(publishes.into_iter().map(|(statement, _)| statement));
        }
        for statement in &all {
            check(dialect, &desc, statement);
        }
    }
});
