//! The harness's session: the suite's SQL on one rusqlite connection, its binds and columns
//! converted between the core's values and SQLite's.

use std::sync::{Arc, Mutex};

use ruststream_conformance::HarnessFuture;
use ruststream_conformance::session::{Session, SqlRow};
use ruststream_core::Value;
use ruststream_rusqlite::rusqlite::types::Value as SqlValue;
use ruststream_rusqlite::rusqlite::{self, Connection};

/// One connection, used on tokio's blocking threads.
pub struct RusqliteSession(pub Arc<Mutex<Connection>>);

pub fn param(value: &Value) -> SqlValue {
    match value {
        Value::Null => SqlValue::Null,
        Value::Bool(b) => SqlValue::Integer(i64::from(*b)),
        Value::Int(i) => SqlValue::Integer(*i),
        Value::Text(t) => SqlValue::Text(t.clone()),
        Value::Bytes(b) => SqlValue::Blob(b.clone()),
    }
}

fn value(cell: SqlValue) -> Value {
    match cell {
        SqlValue::Null => Value::Null,
        SqlValue::Integer(i) => Value::Int(i),
        SqlValue::Real(r) => Value::Text(r.to_string()),
        SqlValue::Text(t) => Value::Text(t),
        SqlValue::Blob(b) => Value::Bytes(b),
    }
}

fn query(conn: &Connection, sql: &str, binds: &[Value]) -> rusqlite::Result<Vec<SqlRow>> {
    let mut stmt = conn.prepare(sql)?;
    assert_eq!(stmt.parameter_count(), binds.len(), "{sql}");
    let names: Vec<String> = stmt.column_names().into_iter().map(String::from).collect();
    let mut rows = stmt.query(rusqlite::params_from_iter(binds.iter().map(param)))?;
    let mut out = Vec::new();
    while let Some(row) = rows.next()? {
        let mut cells = Vec::with_capacity(names.len());
        for (i, name) in names.iter().enumerate() {
            cells.push((name.clone(), value(row.get::<_, SqlValue>(i)?)));
        }
        out.push(SqlRow(cells));
    }
    Ok(out)
}

fn execute(conn: &Connection, sql: &str, binds: &[Value]) -> rusqlite::Result<u64> {
    let mut stmt = conn.prepare(sql)?;
    assert_eq!(stmt.parameter_count(), binds.len(), "{sql}");
    let affected = stmt.execute(rusqlite::params_from_iter(binds.iter().map(param)))?;
    Ok(affected as u64)
}

impl RusqliteSession {
    fn run<T, F>(&self, sql: &str, binds: &[Value], f: F) -> HarnessFuture<'static, T>
    where
        T: Send + 'static,
        F: FnOnce(&Connection, &str, &[Value]) -> rusqlite::Result<T> + Send + 'static,
    {
        let (conn, sql, binds) = (Arc::clone(&self.0), sql.to_owned(), binds.to_vec());
        Box::pin(async move {
            let answer = tokio::task::spawn_blocking(move || {
                let conn = conn.lock().expect("the session's connection");
                f(&conn, &sql, &binds)
            })
            .await??;
            Ok(answer)
        })
    }
}

impl Session for RusqliteSession {
    fn query<'a>(&'a mut self, sql: &'a str, binds: &'a [Value]) -> HarnessFuture<'a, Vec<SqlRow>> {
        self.run(sql, binds, query)
    }

    fn execute<'a>(&'a mut self, sql: &'a str, binds: &'a [Value]) -> HarnessFuture<'a, u64> {
        self.run(sql, binds, execute)
    }
}
