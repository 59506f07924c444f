//! The core's rendered statements run on a session of a harness's own ([`Session`]), and what
//! the statement scenarios share: the table they run on, the database's clock, reading rows.

use ruststream_core::{Arg, Dialect, Statement, StatementKind, Statements, Value};

use crate::harness::{Harness, HarnessFuture};

/// A row a [`Session`] answers: each column's name and value, in the statement's order.
/// Integers of any width read as [`Value::Int`], booleans as [`Value::Bool`], binary columns as
/// [`Value::Bytes`], text as [`Value::Text`]; any other type (a time) may read as its text.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SqlRow(pub Vec<(String, Value)>);

impl SqlRow {
    /// The value of the column `name`; panics where the row has none.
    pub fn get(&self, name: &str) -> &Value {
        self.0
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v)
            .unwrap_or_else(|| panic!("no column {name} in {self:?}"))
    }

    /// The column `name` as an integer (a boolean as `0` or `1`), `None` for `NULL`.
    pub fn opt_int(&self, name: &str) -> Option<i64> {
        match self.get(name) {
            Value::Null => None,
            Value::Int(i) => Some(*i),
            Value::Bool(b) => Some(i64::from(*b)),
            Value::Text(t) => Some(t.parse().unwrap_or_else(|_| panic!("{name}: {t}"))),
            Value::Bytes(b) => {
                let text = String::from_utf8_lossy(b);
                Some(text.parse().unwrap_or_else(|_| panic!("{name}: {text}")))
            }
        }
    }

    /// The column `name` as an integer.
    pub fn int(&self, name: &str) -> i64 {
        self.opt_int(name)
            .unwrap_or_else(|| panic!("{name} is NULL in {self:?}"))
    }

    /// The column `name` as text (bytes as UTF-8), `None` for `NULL`.
    pub fn opt_text(&self, name: &str) -> Option<String> {
        match self.get(name) {
            Value::Null => None,
            Value::Text(t) => Some(t.clone()),
            Value::Bytes(b) => Some(String::from_utf8(b.clone()).expect("UTF-8 text")),
            Value::Int(i) => Some(i.to_string()),
            other => panic!("{name} is {other:?}, not text"),
        }
    }

    /// The column `name` as text.
    pub fn text(&self, name: &str) -> String {
        self.opt_text(name)
            .unwrap_or_else(|| panic!("{name} is NULL in {self:?}"))
    }

    /// The column `name` as bytes (text as its UTF-8).
    pub fn bytes(&self, name: &str) -> Vec<u8> {
        match self.get(name) {
            Value::Bytes(b) => b.clone(),
            Value::Text(t) => t.clone().into_bytes(),
            other => panic!("{name} is {other:?}, not bytes"),
        }
    }

    /// The column `name` as a boolean (an integer as nonzero).
    pub fn bool(&self, name: &str) -> bool {
        match self.get(name) {
            Value::Bool(b) => *b,
            Value::Int(i) => *i != 0,
            other => panic!("{name} is {other:?}, not a boolean"),
        }
    }
}

/// A connection of a harness's own that runs SQL with binds, one per placeholder, built by the
/// adapter's test code from the core's [`Value`]s: the core's statements and a scenario's own.
pub trait Session: Send {
    /// Runs `sql` with `binds` and answers its rows.
    fn query<'a>(&'a mut self, sql: &'a str, binds: &'a [Value]) -> HarnessFuture<'a, Vec<SqlRow>>;

    /// Runs `sql` with `binds` and answers how many rows it affected.
    fn execute<'a>(&'a mut self, sql: &'a str, binds: &'a [Value]) -> HarnessFuture<'a, u64>;
}

/// The binds of `statement`, each arg's value among `values`.
pub fn binds(statement: &Statement, values: &[(Arg, Value)]) -> Vec<Value> {
    statement.binds(|arg| {
        values
            .iter()
            .find(|(a, _)| *a == arg)
            .map(|(_, v)| v.clone())
            .unwrap_or_else(|| panic!("no value for {arg:?} in {}", statement.sql))
    })
}

/// The statement of `kind`, which `s` renders.
pub fn get(s: &Statements, kind: StatementKind) -> &Statement {
    s.of_kind(kind)
        .unwrap_or_else(|| panic!("{kind:?} is rendered"))
}

/// The ids of `rows`, by their column `id`.
pub fn ids(rows: &[SqlRow]) -> Vec<i64> {
    rows.iter().map(|r| r.int("id")).collect()
}

/// A session of a statement scenario in its dialect: it runs the core's statements and the
/// scenario's own SQL, and panics on a failure with the statement.
pub struct Sql {
    session: Box<dyn Session>,
    dialect: Dialect,
}

impl Sql {
    /// A new session of `harness` on `db`, in `harness`'s dialect.
    pub async fn open<H: Harness>(harness: &H, db: &str) -> Self {
        let session = harness
            .session(db)
            .await
            .unwrap_or_else(|e| panic!("{}: a session: {e}", harness.name()));
        let mut sql = Self {
            session,
            dialect: harness.dialect(),
        };
        if sql.is_mysql() {
            // The queue's times are UTC by the server's clock, never the session's time zone.
            sql.run("SET time_zone = '+05:45'").await;
        }
        sql
    }

    /// The session's dialect.
    pub fn dialect(&self) -> Dialect {
        self.dialect
    }

    /// Whether the dialect is MySQL's or MariaDB's.
    pub fn is_mysql(&self) -> bool {
        matches!(self.dialect, Dialect::MySql | Dialect::MariaDb)
    }

    /// Runs `statement` with `binds` (one per arg) and answers its rows.
    pub async fn query(&mut self, statement: &Statement, binds: &[Value]) -> Vec<SqlRow> {
        assert_eq!(binds.len(), statement.args.len(), "{}", statement.sql);
        self.session
            .query(&statement.sql, binds)
            .await
            .unwrap_or_else(|e| panic!("{:?} failed: {e}\n{}", statement.kind, statement.sql))
    }

    /// Runs `statement` with `binds` and answers the rows it affected.
    pub async fn execute(&mut self, statement: &Statement, binds: &[Value]) -> u64 {
        assert_eq!(binds.len(), statement.args.len(), "{}", statement.sql);
        self.session
            .execute(&statement.sql, binds)
            .await
            .unwrap_or_else(|e| panic!("{:?} failed: {e}\n{}", statement.kind, statement.sql))
    }

    /// Runs the scenario's own `sql` and answers its rows.
    pub async fn rows(&mut self, sql: &str) -> Vec<SqlRow> {
        self.session
            .query(sql, &[])
            .await
            .unwrap_or_else(|e| panic!("{sql} failed: {e}"))
    }

    /// Runs the scenario's own `sql` and answers the rows it affected.
    pub async fn run(&mut self, sql: &str) -> u64 {
        self.session
            .execute(sql, &[])
            .await
            .unwrap_or_else(|e| panic!("{sql} failed: {e}"))
    }

    /// The one integer (or `NULL`) the scenario's own `sql` answers, in its column `v`.
    pub async fn scalar(&mut self, sql: &str) -> Option<i64> {
        let rows = self.rows(sql).await;
        assert_eq!(rows.len(), 1, "{sql}: {rows:?}");
        rows[0].opt_int("v")
    }

    /// Creates `table` with every column the statement scenarios name, dropping it first.
    pub async fn create(&mut self, table: &str) {
        self.drop_table(table).await;
        let columns = match self.dialect {
            Dialect::Postgres => {
                "id BIGSERIAL PRIMARY KEY, payload BYTEA, attempt INT NOT NULL DEFAULT 0, \
                 locked_until TIMESTAMPTZ NULL, processed_at TIMESTAMPTZ NULL, \
                 due_at TIMESTAMPTZ NOT NULL DEFAULT now(), channel TEXT, \
                 priority INT NOT NULL DEFAULT 0"
            }
            // On InnoDB a claim reads its rows in claim order through an index: without it the
            // server sorts, locks every claimable row, and another claim finds none to skip to.
            Dialect::MySql | Dialect::MariaDb => {
                "id BIGINT AUTO_INCREMENT PRIMARY KEY, payload LONGBLOB, \
                 attempt INT NOT NULL DEFAULT 0, locked_until DATETIME(6) NULL, \
                 processed_at DATETIME(6) NULL, \
                 due_at DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6), \
                 channel VARCHAR(200), priority INT NOT NULL DEFAULT 0, INDEX (due_at, id)"
            }
            Dialect::Sqlite => {
                "id INTEGER PRIMARY KEY AUTOINCREMENT, payload BLOB, \
                 attempt INTEGER NOT NULL DEFAULT 0, locked_until INTEGER NULL, \
                 processed_at INTEGER NULL, due_at INTEGER NOT NULL DEFAULT 0, channel, \
                 priority INTEGER NOT NULL DEFAULT 0"
            }
        };
        let engine = if self.is_mysql() {
            " ENGINE=InnoDB"
        } else {
            ""
        };
        self.run(&format!("CREATE TABLE {table} ({columns}){engine}"))
            .await;
    }

    /// Drops `table` where it exists.
    pub async fn drop_table(&mut self, table: &str) {
        self.run(&format!("DROP TABLE IF EXISTS {table}")).await;
    }

    /// Publishes a row due at `due` (microseconds since the epoch), or, for `None`, at the
    /// database's time of the publish, with `channel` in its column `channel`.
    pub async fn publish(
        &mut self,
        s: &Statements,
        payload: &[u8],
        due: Option<i64>,
        channel: Value,
    ) {
        let publish = &s.publish;
        let values = [
            (Arg::Payload, Value::Bytes(payload.to_vec())),
            (Arg::Due, due.map_or(Value::Null, Value::Int)),
            (Arg::Column("channel"), channel),
        ];
        assert_eq!(self.execute(publish, &binds(publish, &values)).await, 1);
    }

    /// The id of each row of `table` by its payload, in id order.
    pub async fn ids_by_payload(&mut self, table: &str) -> Vec<(i64, Vec<u8>)> {
        let rows = self
            .rows(&format!("SELECT id, payload FROM {table} ORDER BY id"))
            .await;
        rows.iter()
            .map(|r| (r.int("id"), r.bytes("payload")))
            .collect()
    }

    /// The ids of the rows `where_` selects of `table`, in id order.
    pub async fn ids_where(&mut self, table: &str, where_: &str) -> Vec<i64> {
        let sql = format!("SELECT id FROM {table} WHERE {where_} ORDER BY id");
        ids(&self.rows(&sql).await)
    }

    /// The database's clock, the one every statement of the queue reads, in microseconds since
    /// the Unix epoch (SQLite keeps the millisecond).
    pub async fn now(&mut self) -> i64 {
        let sql = format!("SELECT {} AS v", self.now_sql());
        self.scalar(&sql).await.expect("the database's clock")
    }

    fn now_sql(&self) -> &'static str {
        match self.dialect {
            Dialect::Postgres => {
                "CAST(EXTRACT(EPOCH FROM statement_timestamp()) * 1000000 AS BIGINT)"
            }
            Dialect::MySql | Dialect::MariaDb => {
                "TIMESTAMPDIFF(MICROSECOND, TIMESTAMP'1970-01-01 00:00:00', UTC_TIMESTAMP(6))"
            }
            Dialect::Sqlite => "(CAST(ROUND(unixepoch('subsec') * 1000.0) AS INTEGER) * 1000)",
        }
    }

    /// The time column `column` of the row `id`, in microseconds since the epoch.
    pub async fn stored(&mut self, table: &str, column: &str, id: i64) -> Option<i64> {
        let micros = match self.dialect {
            Dialect::Postgres => {
                format!("CAST(EXTRACT(EPOCH FROM {column}) * 1000000 AS BIGINT)")
            }
            Dialect::MySql | Dialect::MariaDb => {
                format!("TIMESTAMPDIFF(MICROSECOND, TIMESTAMP'1970-01-01 00:00:00', {column})")
            }
            Dialect::Sqlite => column.to_owned(),
        };
        self.scalar(&format!(
            "SELECT {micros} AS v FROM {table} WHERE id = {id}"
        ))
        .await
    }

    /// Moves the time column `column` of the row `id` to `offset` microseconds from the
    /// database's clock: a lease that ran out or a row that fell due, as the database sees it.
    pub async fn set_from_now(&mut self, table: &str, column: &str, id: i64, offset: i64) {
        let value = match self.dialect {
            Dialect::Postgres => {
                format!("statement_timestamp() + {offset} * INTERVAL '1 microsecond'")
            }
            Dialect::MySql | Dialect::MariaDb => {
                format!("TIMESTAMPADD(MICROSECOND, {offset}, UTC_TIMESTAMP(6))")
            }
            Dialect::Sqlite => format!("{} + {offset}", self.now_sql()),
        };
        let sql = format!("UPDATE {table} SET {column} = {value} WHERE id = {id}");
        assert_eq!(self.run(&sql).await, 1, "{sql}");
    }
}

/// Asserts that `t` is the database's clock plus `plus`, read by a statement that ran between
/// the scenario's two reads of the clock, `before` and `after`.
pub fn assert_db_time(t: i64, before: i64, after: i64, plus: i64, what: &str) {
    assert!(
        before + plus <= t && t <= after + plus,
        "{what}: {t} is not the database's time plus {plus} ({} ..= {})",
        before + plus,
        after + plus
    );
}
