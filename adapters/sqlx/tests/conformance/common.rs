//! What the three harnesses of the sqlx adapter share: their brokers' pool settings, and
//! reading the answer of a query.

use std::time::Duration;

use ruststream_conformance::HarnessResult;
use sqlx::{ColumnIndex, Decode, Row, ValueRef};

/// The most connections a broker's pool opens: the most workers of a scenario, a claim and a
/// publish, and room.
pub(crate) const POOL: u32 = 16;

/// How long a broker's pool waits for a connection.
pub(crate) const ACQUIRE: Duration = Duration::from_secs(10);

/// The first column of each row as an integer; a `NULL` is an error.
pub(crate) fn first_column<R>(rows: &[R], sql: &str) -> HarnessResult<Vec<i64>>
where
    R: Row,
    usize: ColumnIndex<R>,
    for<'r> i64: Decode<'r, R::Database>,
{
    rows.iter()
        .map(|row| -> HarnessResult<i64> {
            if row.try_get_raw(0)?.is_null() {
                return Err(format!("`{sql}` answered NULL").into());
            }
            Ok(row.try_get_unchecked::<i64, _>(0)?)
        })
        .collect()
}
