//! The harness's session: the suite's SQL on one mysql_async connection as prepared
//! statements, its binds and columns converted between the core's values and MySQL's.

use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Params, Row};
use ruststream_conformance::HarnessFuture;
use ruststream_conformance::session::{Session, SqlRow};
use ruststream_core::Value;

/// One connection.
pub struct MySqlSession(pub Conn);

pub fn params(binds: &[Value]) -> Params {
    if binds.is_empty() {
        return Params::Empty;
    }
    Params::Positional(
        binds
            .iter()
            .map(|v| match v {
                Value::Null => mysql_async::Value::NULL,
                Value::Bool(b) => mysql_async::Value::Int(i64::from(*b)),
                Value::Int(i) => mysql_async::Value::Int(*i),
                Value::Text(t) => mysql_async::Value::Bytes(t.clone().into_bytes()),
                Value::Bytes(b) => mysql_async::Value::Bytes(b.clone()),
            })
            .collect(),
    )
}

/// A cell as the core's value: text and binary strings alike as bytes, a time as its text.
fn value(cell: &mysql_async::Value) -> Value {
    match cell {
        mysql_async::Value::NULL => Value::Null,
        mysql_async::Value::Int(i) => Value::Int(*i),
        mysql_async::Value::UInt(u) => Value::Int(i64::try_from(*u).expect("an integer in range")),
        mysql_async::Value::Bytes(b) => Value::Bytes(b.clone()),
        other => Value::Text(other.as_sql(true)),
    }
}

fn row(row: &Row) -> SqlRow {
    let columns = row.columns_ref();
    SqlRow(
        columns
            .iter()
            .enumerate()
            .map(|(i, c)| {
                let cell = row.as_ref(i).expect("the row's cell");
                (c.name_str().into_owned(), value(cell))
            })
            .collect(),
    )
}

impl Session for MySqlSession {
    fn query<'a>(&'a mut self, sql: &'a str, binds: &'a [Value]) -> HarnessFuture<'a, Vec<SqlRow>> {
        Box::pin(async move {
            let rows: Vec<Row> = self.0.exec(sql, params(binds)).await?;
            Ok(rows.iter().map(row).collect())
        })
    }

    fn execute<'a>(&'a mut self, sql: &'a str, binds: &'a [Value]) -> HarnessFuture<'a, u64> {
        Box::pin(async move {
            self.0.exec_drop(sql, params(binds)).await?;
            Ok(self.0.affected_rows())
        })
    }
}
