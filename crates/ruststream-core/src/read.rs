//! A driver's rows as the core reads them: an adapter hands over its rows with two readers, the
//! names of a row's columns and one cell as a declared [`ColumnType`], and [`read_rows`] finds
//! the statement's columns by name and reads their values, with one set of errors for every
//! adapter.

use crate::dialect::{ColumnType, OutColumn};
use crate::types::Row;
use crate::value::{DbError, ErrorKind, Value};

/// The position of the column `name` among `names`: the exact name first, then one that
/// differs only in ASCII case (MySQL's rule for column names, and how a server may fold an
/// alias).
pub fn column_position<S: AsRef<str>>(names: &[S], name: &str) -> Option<usize> {
    names.iter().position(|c| c.as_ref() == name).or_else(|| {
        names
            .iter()
            .position(|c| c.as_ref().eq_ignore_ascii_case(name))
    })
}

/// The rows of a statement whose output is [`Output::Rows`](crate::Output::Rows): for each
/// row, the values of `columns` in order, each read by `read` as its declared type. A missing
/// column fails the statement; a cell that does not read fails its row only ([`Row::unread`]).
pub fn read_rows<R>(
    rows: impl IntoIterator<Item = R>,
    columns: &[OutColumn],
    raw: bool,
    sql: &str,
    names: impl Fn(&R) -> Vec<String>,
    read: impl Fn(&R, usize, ColumnType) -> Result<Value, String>,
) -> Result<Vec<Row<R>>, DbError> {
    // `names` gives a row's column names in the driver's order; it is asked of the first row only,
    // since every row of one statement has the same columns. `read` reads the cell at an index as
    // a [`ColumnType`]: most drivers read the value their own type gives and pass it through
    // [`ColumnType::read`]; a driver that reports no types passes its text through
    // [`ColumnType::read_text`].
    //
    // A column the rows lack fails the statement with [`ErrorKind::UndefinedColumn`], naming the
    // column and the statement. A cell that does not read as its type (a value of another type in
    // a column of SQLite, text that is not UTF-8) fails its row only: the cell reads `NULL`, and
    // the row's [`Row::unread`] names the column and why, so one bad row does not stop the rows
    // beside it.
    let rows = rows.into_iter();
    let mut out = Vec::with_capacity(rows.size_hint().0);
    let mut indexes: Option<Vec<usize>> = None;
    for row in rows {
        let wanted = match &indexes {
            Some(wanted) => wanted,
            None => indexes.insert(positions(&names(&row), columns, sql)?),
        };
        let mut unread = None;
        let values = wanted
            .iter()
            .zip(columns)
            .map(|(&index, column)| {
                read(&row, index, column.ty).unwrap_or_else(|message| {
                    unread.get_or_insert_with(|| {
                        format!(
                            "column `{}` does not read as {}: {message}",
                            column.name,
                            column.ty.name()
                        )
                    });
                    Value::Null
                })
            })
            .collect::<Vec<Value>>();
        out.push(Row {
            values,
            raw: raw.then_some(row),
            unread,
        });
    }
    Ok(out)
}

/// Where each of `columns` is among a row's `names`.
fn positions(names: &[String], columns: &[OutColumn], sql: &str) -> Result<Vec<usize>, DbError> {
    columns
        .iter()
        .map(|column| {
            column_position(names, column.name).ok_or_else(|| {
                DbError::new(
                    ErrorKind::UndefinedColumn,
                    format!(
                        "the statement's rows have no column `{}`: {sql}",
                        column.name
                    ),
                )
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A driver row of named text cells, whose types the driver does not tell.
    #[derive(Debug)]
    struct TextRow(Vec<(&'static str, Option<&'static str>)>);

    fn names(row: &TextRow) -> Vec<String> {
        row.0.iter().map(|(n, _)| (*n).to_owned()).collect()
    }

    fn read(row: &TextRow, index: usize, ty: ColumnType) -> Result<Value, String> {
        match row.0[index].1 {
            Some(text) => ty.read_text(text),
            None => Ok(Value::Null),
        }
    }

    const COLUMNS: [OutColumn; 2] = [
        OutColumn::new("id", ColumnType::Id),
        OutColumn::new("attempt", ColumnType::Int),
    ];

    #[test]
    fn columns_are_found_exactly_then_ignoring_case() {
        assert_eq!(column_position(&["ID", "id"], "id"), Some(1));
        assert_eq!(column_position(&["Attempt"], "attempt"), Some(0));
        assert_eq!(column_position(&["attempts"], "attempt"), None);
    }

    #[test]
    fn rows_read_in_the_statements_order_as_declared() {
        let rows = vec![
            TextRow(vec![("ATTEMPT", Some("2")), ("id", Some("7"))]),
            TextRow(vec![("ATTEMPT", None), ("id", Some("x-1"))]),
        ];
        let read = read_rows(rows, &COLUMNS, true, "SELECT", names, read).unwrap();
        assert_eq!(read[0].values, vec![Value::Int(7), Value::Int(2)]);
        assert_eq!(read[1].values, vec![Value::Text("x-1".into()), Value::Null]);
        assert!(read.iter().all(|row| row.raw.is_some()));
    }

    #[test]
    fn a_missing_column_fails_the_statement_and_a_cell_of_another_type_its_row() {
        let rows = vec![TextRow(vec![("id", Some("7"))])];
        let error = read_rows(rows, &COLUMNS, false, "SELECT id", names, read).unwrap_err();
        assert_eq!(error.kind, ErrorKind::UndefinedColumn);
        assert!(error.message.contains("`attempt`") && error.message.contains("SELECT id"));

        // A cell of another type reads `NULL`, its row says why, and the next row reads.
        let rows = vec![
            TextRow(vec![("id", Some("7")), ("attempt", Some("two"))]),
            TextRow(vec![("id", Some("8")), ("attempt", Some("2"))]),
        ];
        let read = read_rows(rows, &COLUMNS, false, "SELECT *", names, read).unwrap();
        assert_eq!(read[0].values, vec![Value::Int(7), Value::Null]);
        let why = read[0].unread.as_deref().unwrap_or_default();
        assert!(
            why.contains("column `attempt` does not read as an integer"),
            "{why}"
        );
        assert_eq!(read[1].values, vec![Value::Int(8), Value::Int(2)]);
        assert_eq!(read[1].unread, None);
    }

    #[test]
    fn no_rows_read_as_none_without_asking_for_names() {
        let read = read_rows(
            Vec::<TextRow>::new(),
            &COLUMNS,
            false,
            "SELECT",
            |_| unreachable!("no row to name"),
            read,
        )
        .unwrap();
        assert!(read.is_empty());
    }
}
