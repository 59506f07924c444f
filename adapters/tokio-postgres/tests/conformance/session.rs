//! The harness's session: the suite's SQL on one tokio-postgres client, each bind at the type
//! the server inferred for its placeholder, each column read as the core's value.

use std::time::{SystemTime, UNIX_EPOCH};

use ruststream_conformance::HarnessFuture;
use ruststream_conformance::session::{Session, SqlRow};
use ruststream_core::Value;
use ruststream_tokio_postgres::tokio_postgres::types::{ToSql, Type};
use ruststream_tokio_postgres::tokio_postgres::{self, Client, Row};

/// One client, under the extended query protocol.
pub struct PgSession(pub Client);

/// A bind for a parameter of type `ty`: PostgreSQL infers a placeholder's type from where it
/// stands (`"attempt" = $2` takes the column's type), so an integer is bound at that width.
pub fn param(value: &Value, ty: &Type) -> Box<dyn ToSql + Sync + Send> {
    match value {
        Value::Int(i) if *ty == Type::INT2 => {
            Box::new(i16::try_from(*i).expect("the value fits a SMALLINT"))
        }
        Value::Int(i) if *ty == Type::INT4 => {
            Box::new(i32::try_from(*i).expect("the value fits an INT"))
        }
        Value::Int(i) => Box::new(*i),
        Value::Text(t) => Box::new(t.clone()),
        Value::Bytes(b) => Box::new(b.clone()),
        Value::Bool(b) => Box::new(*b),
        Value::Null => null(ty),
    }
}

/// A `NULL` of the placeholder's type: tokio-postgres binds no value of another type.
fn null(ty: &Type) -> Box<dyn ToSql + Sync + Send> {
    match *ty {
        Type::TEXT | Type::VARCHAR => Box::new(None::<String>),
        Type::BYTEA => Box::new(None::<Vec<u8>>),
        Type::BOOL => Box::new(None::<bool>),
        Type::INT2 => Box::new(None::<i16>),
        Type::INT4 => Box::new(None::<i32>),
        _ => Box::new(None::<i64>),
    }
}

/// The column `i` of `row` as the core's value; a time as microseconds since the epoch.
fn value(row: &Row, i: usize) -> Result<Value, tokio_postgres::Error> {
    let ty = row.columns()[i].type_().clone();
    let or_null = |v: Option<Value>| v.unwrap_or(Value::Null);
    Ok(match ty {
        Type::INT2 => or_null(
            row.try_get::<_, Option<i16>>(i)?
                .map(|v| Value::Int(v.into())),
        ),
        Type::INT4 => or_null(
            row.try_get::<_, Option<i32>>(i)?
                .map(|v| Value::Int(v.into())),
        ),
        Type::INT8 => or_null(row.try_get::<_, Option<i64>>(i)?.map(Value::Int)),
        Type::BOOL => or_null(row.try_get::<_, Option<bool>>(i)?.map(Value::Bool)),
        Type::BYTEA => or_null(row.try_get::<_, Option<Vec<u8>>>(i)?.map(Value::Bytes)),
        Type::TIMESTAMPTZ => or_null(row.try_get::<_, Option<SystemTime>>(i)?.map(|t| {
            let micros = t
                .duration_since(UNIX_EPOCH)
                .expect("after the epoch")
                .as_micros();
            Value::Int(i64::try_from(micros).expect("a time in range"))
        })),
        _ => or_null(row.try_get::<_, Option<String>>(i)?.map(Value::Text)),
    })
}

impl PgSession {
    /// Prepares `sql` and builds its binds at the types the server inferred.
    async fn prepare(
        &self,
        sql: &str,
        binds: &[Value],
    ) -> Result<(tokio_postgres::Statement, Vec<Box<dyn ToSql + Sync + Send>>), tokio_postgres::Error>
    {
        let prepared = self.0.prepare(sql).await?;
        assert_eq!(prepared.params().len(), binds.len(), "{sql}");
        let params = binds
            .iter()
            .zip(prepared.params())
            .map(|(value, ty)| param(value, ty))
            .collect();
        Ok((prepared, params))
    }
}

impl Session for PgSession {
    fn query<'a>(&'a mut self, sql: &'a str, binds: &'a [Value]) -> HarnessFuture<'a, Vec<SqlRow>> {
        Box::pin(async move {
            let (prepared, params) = self.prepare(sql, binds).await?;
            let refs: Vec<&(dyn ToSql + Sync)> = params.iter().map(|p| &**p as _).collect();
            let rows = self.0.query(&prepared, &refs).await?;
            let mut out = Vec::with_capacity(rows.len());
            for row in &rows {
                let mut cells = Vec::with_capacity(row.len());
                for (i, column) in row.columns().iter().enumerate() {
                    cells.push((column.name().to_owned(), value(row, i)?));
                }
                out.push(SqlRow(cells));
            }
            Ok(out)
        })
    }

    fn execute<'a>(&'a mut self, sql: &'a str, binds: &'a [Value]) -> HarnessFuture<'a, u64> {
        Box::pin(async move {
            let (prepared, params) = self.prepare(sql, binds).await?;
            let refs: Vec<&(dyn ToSql + Sync)> = params.iter().map(|p| &**p as _).collect();
            Ok(self.0.execute(&prepared, &refs).await?)
        })
    }
}
