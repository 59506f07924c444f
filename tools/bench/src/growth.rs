//! Growth: the latency of the claim as the table grows, with most rows not yet due.
//!
//! ```sh
//! cargo run --release -p ruststream-bench -- --scenario growth --adapter sqlx \
//!     --url postgres://postgres@127.0.0.1:5432/test --rows 10000,1000000,10000000
//! ```
//!
//! For each size N, the table `bench_growth` is dropped, created and filled by the database
//! itself (PostgreSQL: `generate_series`; MariaDB: the `seq_A_to_B` tables of the Sequence
//! engine; SQLite: a recursive CTE), a million rows to a statement. The table has a due column,
//! `due_at`, which every form's claim filters on (`due_at <= now`) and orders by (`ORDER BY
//! due_at, id`). `--due D` rows (1000), spread evenly over the ids, were due an hour ago; the
//! other N - D are due a day later, so the claim must pass over them. Then, unless `--index
//! none`, the claim's index is built: `CREATE INDEX bench_growth_due ON bench_growth (due_at,
//! id)`, and the table is analyzed.
//!
//! For each form, the claim's search statement, as [`Statements::render`] renders it for the
//! same description, runs `--claims C` times (200) on one connection of the adapter's driver,
//! after 10 untimed ones: PostgreSQL row lock `count_row`, MySQL/MariaDB row lock
//! `select_row_id`, lease `claim_lease` (PostgreSQL, SQLite) or `select_lease` (MySQL/MariaDB)
//! for one row, advisory `candidates` for 2 W rows. A statement that writes or locks runs in a
//! transaction that is rolled back, so every claim finds the same table. Each claim must
//! answer a row. The time of the statement alone (issue to reply) gives the p50 and p99.
//!
//! Then the statement's plan, executed where the database can (PostgreSQL `EXPLAIN (ANALYZE,
//! BUFFERS)`, MariaDB `ANALYZE FORMAT=JSON`, both rolled back; SQLite `EXPLAIN QUERY PLAN`;
//! MySQL `EXPLAIN FORMAT=JSON`), says whether the claim read through `bench_growth_due`.
//! After the last size the table is dropped.

use std::time::{Duration, Instant};

use ruststream::core::{
    Arg, Column, Dialect, Form, InboxSpec, Statement, Statements, TableDesc, Value,
};
use serde::Serialize;
use sqlx::Connection;

use crate::baseline::RawConn;
use crate::stats::{now_us, quantile_ms};
use crate::{AdapterKind, BoxError, Config, Database, Lines, drivers};

/// The table the growth scenario fills.
pub(crate) const TABLE: &str = "bench_growth";
/// The claim's index: `(due_at, id)`.
pub(crate) const INDEX: &str = "bench_growth_due";
/// Rows per filling statement.
const CHUNK: u64 = 1_000_000;
/// Untimed claims before the timed ones.
const WARM_UP: usize = 10;
/// The lease a lease claim writes (rolled back).
const LEASE_US: i64 = 30_000_000;
/// The payload of every row: `{"t":0}`.
const PAYLOAD_HEX: &str = "7b2274223a307d";

/// The description of `bench_growth` in a form: a due column, an attempt column, a payload;
/// the lease form's `locked_until`, the advisory form's key `bench-{k}`.
pub(crate) fn desc(form: Form) -> TableDesc {
    let id = Column::new("id").generated();
    let attempt = Column::new("attempt").generated();
    let payload = Column::new("payload");
    let due = Column::new("due_at");
    match form {
        Form::RowLock => *InboxSpec::new(TABLE, id)
            .attempt(attempt)
            .payload(payload)
            .due(due)
            .desc(),
        Form::Lease => *InboxSpec::new(TABLE, id)
            .lease(Column::new("locked_until"))
            .attempt(attempt)
            .payload(payload)
            .due(due)
            .desc(),
        Form::Advisory => *InboxSpec::new(TABLE, id)
            .advisory(crate::framework::KEY)
            .attempt(attempt)
            .payload(payload)
            .due(due)
            .desc(),
    }
}

/// One size and form of the growth scenario, as its JSON line writes it.
#[derive(Clone, Debug, Serialize)]
pub struct GrowthRecord {
    /// `"growth"`.
    pub kind: &'static str,
    /// The adapter whose driver ran the statements.
    pub adapter: &'static str,
    /// The database, as its dialect names it.
    pub database: &'static str,
    /// The form.
    pub form: &'static str,
    /// The rows in the table.
    pub rows: u64,
    /// The rows due now, counted after the fill.
    pub due_rows: u64,
    /// The claim's index, or `None` under `--index none`.
    pub index: Option<String>,
    /// The claims timed.
    pub claims: usize,
    /// The statement timed, by its kind.
    pub statement: String,
    /// Its text.
    pub sql: String,
    /// Claim latency (the statement, issue to reply): median, ms.
    pub claim_p50_ms: Option<f64>,
    /// Claim latency: 99th percentile, ms.
    pub claim_p99_ms: Option<f64>,
    /// Claim latency: mean, ms.
    pub claim_mean_ms: f64,
    /// Claim latency: the slowest, ms.
    pub claim_max_ms: Option<f64>,
    /// Whether the plan reads through the claim's index.
    pub index_used: bool,
    /// The plan in a line: the scans, and what the execution read where the database says.
    pub plan_summary: String,
    /// The plan as the database wrote it (MariaDB: the scans of its JSON).
    pub plan: Vec<String>,
    /// The filling statements' time, seconds.
    pub fill_s: f64,
    /// The index build's time, seconds.
    pub index_s: Option<f64>,
    /// The table's size with its indexes, MB, as the database reports it.
    pub table_mb: Option<f64>,
    /// The command that produced this line.
    pub command: String,
    /// When the line was written, UTC.
    pub date: String,
    /// The machine's CPUs.
    pub cpus: usize,
    /// The 1-minute load average when the claims ended.
    pub load1: Option<f64>,
}

/// Runs the growth scenario: for each `--rows` size, fills `bench_growth`, times each form's
/// claim, and reads its plan. Writes a JSON line per size and form; answers the records.
pub async fn run_growth(
    config: &Config,
    out: &mut (dyn std::io::Write + Send),
) -> Result<Vec<GrowthRecord>, BoxError> {
    let mut lines = Lines::open(config, out)?;
    match (config.adapter, &config.database) {
        (AdapterKind::Sqlx, Database::Postgres(url)) => {
            let conn = sqlx::PgConnection::connect(url).await?;
            grow(conn, config, &mut lines).await
        }
        (AdapterKind::Sqlx, Database::MySql(url)) => {
            let conn = sqlx::MySqlConnection::connect(url).await?;
            grow(conn, config, &mut lines).await
        }
        (AdapterKind::Sqlx, Database::Sqlite(path)) => {
            if let Some(dir) = path.parent() {
                std::fs::create_dir_all(dir)?;
            }
            let conn = sqlx::SqliteConnection::connect_with(&drivers::sqlite_options(path)).await?;
            grow(conn, config, &mut lines).await
        }
        (AdapterKind::TokioPostgres, Database::Postgres(url)) => {
            grow(drivers::TokioPg::connect(url).await?, config, &mut lines).await
        }
        (AdapterKind::MysqlAsync, Database::MySql(url)) => {
            let conn = mysql_async::Conn::new(mysql_async::Opts::from_url(url)?).await?;
            grow(drivers::MyAsync(conn), config, &mut lines).await
        }
        (AdapterKind::Rusqlite, Database::Sqlite(path)) => {
            if let Some(dir) = path.parent() {
                std::fs::create_dir_all(dir)?;
            }
            grow(drivers::open_rusqlite(path)?, config, &mut lines).await
        }
        (adapter, database) => Err(format!(
            "--adapter {} does not run on {}",
            adapter.name(),
            database.family()
        )
        .into()),
    }
}

/// The dialect of a connection's database: MySQL or MariaDB by `VERSION()`.
pub(crate) async fn dialect_of<C: RawConn>(
    conn: &mut C,
    database: &Database,
) -> Result<Dialect, BoxError> {
    Ok(match database {
        Database::Postgres(_) => Dialect::Postgres,
        Database::Sqlite(_) => Dialect::Sqlite,
        Database::MySql(_) => {
            let rows = conn
                .query("SELECT VERSION() AS db", Vec::new(), &["db"])
                .await?;
            let version = rows
                .first()
                .and_then(|r| r.first())
                .and_then(Value::as_text)
                .unwrap_or_default();
            if version.contains("MariaDB") {
                Dialect::MariaDb
            } else {
                Dialect::MySql
            }
        }
    })
}

fn form_name(form: Form) -> &'static str {
    match form {
        Form::RowLock => "row-lock",
        Form::Lease => "lease",
        Form::Advisory => "advisory",
    }
}

async fn grow<C: RawConn>(
    mut conn: C,
    config: &Config,
    lines: &mut Lines<'_>,
) -> Result<Vec<GrowthRecord>, BoxError> {
    let dialect = dialect_of(&mut conn, &config.database).await?;
    let mut records = Vec::new();
    for &rows in &config.rows {
        let (fill_s, index_s) = fill(&mut conn, config, dialect, rows).await?;
        let due_rows = count_due(&mut conn, dialect).await?;
        let table_mb = table_bytes(&mut conn, dialect)
            .await
            .ok()
            .flatten()
            .map(|b| b as f64 / 1_048_576.0);
        eprintln!(
            "growth {} {rows} rows ({due_rows} due): filled in {fill_s:.1} s{}, {} MB",
            dialect.name(),
            index_s.map_or_else(String::new, |s| format!(", index in {s:.1} s")),
            table_mb.map_or_else(|| "-".to_owned(), |mb| format!("{mb:.0}")),
        );
        for &form in &config.forms {
            let statements = Statements::render(dialect, &desc(form), config.workers);
            let (statement, in_transaction, columns) = claim_statement(&statements)?;
            let bar = crate::bar(
                config,
                config.claims as u64,
                format!("{} {rows} {}", dialect.name(), form_name(form)),
            );
            for _ in 0..WARM_UP {
                claim(
                    &mut conn,
                    &statements,
                    statement,
                    in_transaction,
                    columns,
                    config,
                )
                .await?;
            }
            let mut samples = Vec::with_capacity(config.claims);
            for _ in 0..config.claims {
                let took = claim(
                    &mut conn,
                    &statements,
                    statement,
                    in_transaction,
                    columns,
                    config,
                )
                .await?;
                samples.push(took.as_micros() as i64);
                bar.inc(1);
            }
            bar.finish_and_clear();
            let load1 = crate::stats::load_average();
            let plan = plan(&mut conn, &statements, statement, config).await?;
            let mean = samples.iter().sum::<i64>() as f64 / samples.len().max(1) as f64;
            samples.sort_unstable();
            let record = GrowthRecord {
                kind: "growth",
                adapter: config.adapter.name(),
                database: dialect.name(),
                form: form_name(form),
                rows,
                due_rows,
                index: config.index.then(|| format!("{INDEX} (due_at, id)")),
                claims: config.claims,
                statement: format!("{:?}", statement.kind),
                sql: statement.sql.to_string(),
                claim_p50_ms: quantile_ms(&samples, 0.5),
                claim_p99_ms: quantile_ms(&samples, 0.99),
                claim_mean_ms: mean / 1000.0,
                claim_max_ms: quantile_ms(&samples, 1.0),
                index_used: plan.index_used,
                plan_summary: plan.summary,
                plan: plan.lines,
                fill_s,
                index_s,
                table_mb,
                command: config.command.clone(),
                date: crate::stats::utc_now(),
                cpus: std::thread::available_parallelism().map_or(1, |n| n.get()),
                load1,
            };
            eprintln!(
                "growth {} {} {rows} rows: {} p50 {} p99 {} ms, index used: {} ({})",
                record.database,
                record.form,
                record.statement,
                ms(record.claim_p50_ms),
                ms(record.claim_p99_ms),
                record.index_used,
                record.plan_summary,
            );
            lines.emit(&record)?;
            records.push(record);
        }
    }
    drop_table(&mut conn, dialect).await?;
    Ok(records)
}

fn ms(v: Option<f64>) -> String {
    v.map_or_else(|| "-".to_owned(), |v| format!("{v:.3}"))
}

/// Drops and creates `bench_growth`, fills it with `rows` rows, builds the claim's index
/// (unless `--index none`) and analyzes the table. Answers the seconds the fill and the index
/// took.
async fn fill<C: RawConn>(
    conn: &mut C,
    config: &Config,
    dialect: Dialect,
    rows: u64,
) -> Result<(f64, Option<f64>), BoxError> {
    for statement in schema(dialect) {
        conn.execute(&statement, Vec::new()).await?;
    }
    let bar = crate::bar(config, rows, format!("{} fill {rows}", dialect.name()));
    let now = now_us();
    // Due rows: an hour ago; the others: a day later, a millisecond apart.
    let past = now - 3_600_000_000;
    let future = now + 86_400_000_000;
    let stride = (rows / config.due.max(1)).max(1);
    let due = config.due;
    let started = Instant::now();
    let mut first = 1;
    while first <= rows {
        let last = (first + CHUNK - 1).min(rows);
        let when = |n: &str, div: &str| {
            format!(
                "CASE WHEN {n} % {stride} = 0 AND {n} {div} {stride} <= {due} THEN {past} + {n} \
                 ELSE {future} + {n} * 1000 END"
            )
        };
        let sql = match dialect {
            Dialect::Postgres => format!(
                "INSERT INTO {TABLE} (id, k, attempt, payload, due_at) \
                 SELECT n, n % 100, 0, decode('{PAYLOAD_HEX}', 'hex'), \
                 TIMESTAMPTZ 'epoch' + ({}) * INTERVAL '1 microsecond' \
                 FROM generate_series(CAST({first} AS BIGINT), CAST({last} AS BIGINT)) AS n",
                when("n", "/")
            ),
            Dialect::MySql | Dialect::MariaDb => format!(
                "INSERT INTO {TABLE} (id, k, attempt, payload, due_at) \
                 SELECT seq, seq % 100, 0, X'{PAYLOAD_HEX}', \
                 TIMESTAMPADD(MICROSECOND, {}, TIMESTAMP'1970-01-01 00:00:00') \
                 FROM seq_{first}_to_{last}",
                when("seq", "DIV")
            ),
            Dialect::Sqlite => format!(
                "WITH RECURSIVE s(n) AS (SELECT {first} UNION ALL SELECT n + 1 FROM s \
                 WHERE n < {last}) \
                 INSERT INTO {TABLE} (id, k, attempt, payload, due_at) \
                 SELECT n, n % 100, 0, X'{PAYLOAD_HEX}', {} FROM s",
                when("n", "/")
            ),
        };
        conn.execute(&sql, Vec::new()).await?;
        bar.inc(last - first + 1);
        first = last + 1;
    }
    let fill_s = started.elapsed().as_secs_f64();
    bar.finish_and_clear();
    let index_s = if config.index {
        let started = Instant::now();
        conn.execute(
            &format!("CREATE INDEX {INDEX} ON {TABLE} (due_at, id)"),
            Vec::new(),
        )
        .await?;
        Some(started.elapsed().as_secs_f64())
    } else {
        None
    };
    let analyze = match dialect {
        Dialect::Postgres => format!("ANALYZE {TABLE}"),
        Dialect::MySql | Dialect::MariaDb => format!("ANALYZE TABLE {TABLE}"),
        Dialect::Sqlite => "ANALYZE".to_owned(),
    };
    conn.execute(&analyze, Vec::new()).await?;
    Ok((fill_s, index_s))
}

/// `bench_growth`, dropped and created: the bench's columns and a due column.
fn schema(dialect: Dialect) -> Vec<String> {
    let create = match dialect {
        Dialect::Postgres => format!(
            "CREATE TABLE {TABLE} (
                id BIGSERIAL PRIMARY KEY,
                k BIGINT NOT NULL,
                attempt BIGINT NOT NULL DEFAULT 0,
                payload BYTEA NOT NULL,
                due_at TIMESTAMPTZ NOT NULL DEFAULT now(),
                locked_until TIMESTAMPTZ NULL
            )"
        ),
        Dialect::MySql | Dialect::MariaDb => format!(
            "CREATE TABLE {TABLE} (
                id BIGINT AUTO_INCREMENT PRIMARY KEY,
                k BIGINT NOT NULL,
                attempt BIGINT NOT NULL DEFAULT 0,
                payload LONGBLOB NOT NULL,
                due_at DATETIME(6) NOT NULL,
                locked_until DATETIME(6) NULL
            ) ENGINE = InnoDB"
        ),
        Dialect::Sqlite => format!(
            "CREATE TABLE {TABLE} (
                id INTEGER PRIMARY KEY AUTOINCREMENT,
                k INTEGER NOT NULL,
                attempt INTEGER NOT NULL DEFAULT 0,
                payload BLOB NOT NULL,
                due_at INTEGER NOT NULL,
                locked_until INTEGER NULL
            )"
        ),
    };
    vec![format!("DROP TABLE IF EXISTS {TABLE}"), create]
}

async fn drop_table<C: RawConn>(conn: &mut C, dialect: Dialect) -> Result<(), BoxError> {
    conn.execute(&format!("DROP TABLE IF EXISTS {TABLE}"), Vec::new())
        .await?;
    if dialect == Dialect::Sqlite {
        // Give the file's pages back: the vacuum, then the WAL into the file.
        conn.execute("VACUUM", Vec::new()).await?;
        conn.query("PRAGMA wal_checkpoint(TRUNCATE)", Vec::new(), &["busy"])
            .await?;
    }
    Ok(())
}

/// The rows due now.
async fn count_due<C: RawConn>(conn: &mut C, dialect: Dialect) -> Result<u64, BoxError> {
    let now = match dialect {
        Dialect::Postgres => "now()".to_owned(),
        Dialect::MySql | Dialect::MariaDb => "UTC_TIMESTAMP(6)".to_owned(),
        Dialect::Sqlite => now_us().to_string(),
    };
    let rows = conn
        .query(
            &format!("SELECT COUNT(*) AS n FROM {TABLE} WHERE due_at <= {now}"),
            Vec::new(),
            &["n"],
        )
        .await?;
    Ok(rows
        .first()
        .and_then(|r| r.first())
        .and_then(Value::as_int)
        .unwrap_or(0) as u64)
}

/// The table's size with its indexes, as the database reports it.
async fn table_bytes<C: RawConn>(conn: &mut C, dialect: Dialect) -> Result<Option<u64>, BoxError> {
    let sql = match dialect {
        Dialect::Postgres => format!("SELECT pg_total_relation_size('{TABLE}') AS n"),
        Dialect::MySql | Dialect::MariaDb => format!(
            "SELECT CAST(data_length + index_length AS SIGNED) AS n FROM information_schema.tables \
             WHERE table_schema = DATABASE() AND table_name = '{TABLE}'"
        ),
        Dialect::Sqlite => {
            "SELECT page_count * page_size AS n FROM pragma_page_count(), pragma_page_size()"
                .to_owned()
        }
    };
    let rows = conn.query(&sql, Vec::new(), &["n"]).await?;
    Ok(rows
        .first()
        .and_then(|r| r.first())
        .and_then(Value::as_int)
        .map(|n| n as u64))
}

/// The claim's search statement of a form and dialect, whether it runs in a transaction
/// (rolled back here), and the columns read from its rows.
fn claim_statement(
    st: &Statements,
) -> Result<(&Statement, bool, &'static [&'static str]), BoxError> {
    use ruststream::core::dialect::{FormStatements, LeaseClaim, RowLockClaim};
    Ok(match &st.form {
        FormStatements::RowLock(f) => match &f.claim {
            RowLockClaim::Count { count_row: s, .. }
            | RowLockClaim::SelectCount {
                select_row_id: s, ..
            } => (s, true, &["id", "attempt", "rs_mark"][..]),
            RowLockClaim::Lock { lock_row } => (lock_row, true, &["id"][..]),
        },
        FormStatements::Lease(f) => match &f.claim {
            LeaseClaim::Returning { claim } => (claim, true, &["id"][..]),
            LeaseClaim::Locking { select, .. } => (select, true, &["id"][..]),
        },
        FormStatements::Advisory(f) => (&f.candidates, false, &["rs_id"][..]),
    })
}

fn binds(statement: &Statement, config: &Config) -> Vec<Value> {
    statement.binds(|arg| match arg {
        Arg::LeaseFor => Value::Int(LEASE_US),
        Arg::Limit if statement.kind == ruststream::core::StatementKind::Candidates => {
            Value::Int(2 * config.workers as i64)
        }
        Arg::Limit | Arg::Take => Value::Int(1),
        _ => Value::Null,
    })
}

/// One claim: the statement, in a transaction rolled back when it writes or locks. Answers the
/// statement's time, issue to reply; fails when it answered no row.
async fn claim<C: RawConn>(
    conn: &mut C,
    st: &Statements,
    statement: &Statement,
    in_transaction: bool,
    columns: &'static [&'static str],
    config: &Config,
) -> Result<Duration, BoxError> {
    if in_transaction {
        conn.execute(&st.begin.sql, Vec::new()).await?;
    }
    let binds = binds(statement, config);
    let issued = Instant::now();
    let rows = conn.query(&statement.sql, binds, columns).await;
    let took = issued.elapsed();
    if in_transaction {
        conn.execute(&st.rollback.sql, Vec::new()).await?;
    }
    if rows?.is_empty() {
        return Err(format!("the claim found no due row: {}", statement.sql).into());
    }
    Ok(took)
}

struct Plan {
    lines: Vec<String>,
    summary: String,
    index_used: bool,
}

/// The claim's plan: executed and rolled back on PostgreSQL and MariaDB, as planned elsewhere.
async fn plan<C: RawConn>(
    conn: &mut C,
    st: &Statements,
    statement: &Statement,
    config: &Config,
) -> Result<Plan, BoxError> {
    let binds = binds(statement, config);
    let (prefix, column, executes): (&str, &'static [&'static str], bool) = match st.dialect {
        Dialect::Postgres => ("EXPLAIN (ANALYZE, BUFFERS) ", &["QUERY PLAN"], true),
        Dialect::MariaDb => ("ANALYZE FORMAT=JSON ", &["ANALYZE"], true),
        Dialect::MySql => ("EXPLAIN FORMAT=JSON ", &["EXPLAIN"], false),
        Dialect::Sqlite => ("EXPLAIN QUERY PLAN ", &["detail"], false),
    };
    if executes {
        conn.execute(&st.begin.sql, Vec::new()).await?;
    }
    let rows = conn
        .query(&format!("{prefix}{}", statement.sql), binds, column)
        .await;
    if executes {
        conn.execute(&st.rollback.sql, Vec::new()).await?;
    }
    let text: Vec<String> = rows?
        .into_iter()
        .filter_map(|r| r.into_iter().next())
        .filter_map(|v| v.as_text().map(str::to_owned))
        .collect();
    let lines = match st.dialect {
        Dialect::MySql | Dialect::MariaDb => {
            let mut scans = Vec::new();
            for json in &text {
                json_scans(&serde_json::from_str(json)?, &mut scans);
            }
            scans
        }
        Dialect::Postgres | Dialect::Sqlite => text,
    };
    let index_used = lines.iter().any(|l| l.contains(INDEX));
    let summary = match st.dialect {
        Dialect::Postgres => {
            let mut parts: Vec<String> = lines
                .iter()
                .filter(|l| l.contains(" Scan"))
                .map(|l| {
                    let l = l.trim().trim_start_matches("->").trim();
                    l.split("  (").next().unwrap_or(l).to_owned()
                })
                .collect();
            if let Some(buffers) = lines.iter().find(|l| l.contains("Buffers:")) {
                parts.push(buffers.trim().to_owned());
            }
            parts.join("; ")
        }
        _ => lines.join("; "),
    };
    Ok(Plan {
        lines,
        summary,
        index_used,
    })
}

/// The table scans of a MySQL/MariaDB JSON plan, a line each: table, access type, index, and
/// what the execution read (MariaDB's `ANALYZE`: `r_rows`, pages accessed).
fn json_scans(value: &serde_json::Value, out: &mut Vec<String>) {
    match value {
        serde_json::Value::Object(map) => {
            if let Some(table) = map.get("table").and_then(|t| t.as_object())
                && table.contains_key("access_type")
            {
                let field = |name: &str| {
                    table
                        .get(name)
                        .map(|v| v.to_string().trim_matches('"').to_owned())
                        .unwrap_or_else(|| "-".to_owned())
                };
                // `pages_accessed`, and `pages_read_count` where pages came from disk.
                let pages = table
                    .get("r_engine_stats")
                    .map_or_else(|| "-".to_owned(), |v| v.to_string());
                out.push(format!(
                    "{}: access_type {}, key {}, rows (estimate) {}, r_rows {}, engine {}",
                    field("table_name"),
                    field("access_type"),
                    field("key"),
                    field("rows"),
                    field("r_rows"),
                    pages,
                ));
            }
            for v in map.values() {
                json_scans(v, out);
            }
        }
        serde_json::Value::Array(items) => {
            for v in items {
                json_scans(v, out);
            }
        }
        _ => {}
    }
}
