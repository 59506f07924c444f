//! `ruststream`: a queue table's counts, its failed rows, its schema, a live view, and jobs
//! enqueued by hand, from the command line.
//!
//! ```text
//! ruststream stats postgres://localhost/app --table jobs --due due_at --failed-at failed_at
//! ruststream failed list URL --config jobs.toml --limit 20
//! ruststream failed show URL 42 --config jobs.toml
//! ruststream failed redrive URL --config jobs.toml --id 42 --id 43
//! ruststream failed delete URL --config jobs.toml --error-contains "timeout"
//! ruststream schema --dialect postgres --config jobs.toml
//! ruststream watch URL --config jobs.toml --every 1
//! ruststream enqueue URL --config jobs.toml --message '{"title":"n1"}' --column channel=news
//! ```
//!
//! The table is described with flags (`--table`, `--id-column`, `--payload`, `--attempt`,
//! `--locked-until`, `--processed-at`, `--due`, `--failed-at`, `--error`, `--advisory-lock`,
//! `--order`, `--unique`) or a TOML file of the same keys (`--config`). URLs are
//! `postgres://`, `mysql://` (MySQL or MariaDB) and `sqlite://`; where a command's URL is left
//! out, `DATABASE_URL` gives it.

use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};
use ruststream_core::{
    Arg, Ddl, Dialect, FailedRow, FailedRows, Inserts, Publish, Statements, Stats, TableDesc, Time,
    Value, error_like,
};
use serde_json::json;

mod db;
mod table;

use db::{Db, Ran};
use table::TableArgs;

/// A queue table's counts, failed rows, schema, a live view, and jobs enqueued by hand.
#[derive(Parser, Debug)]
#[command(name = "ruststream", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// The table's counts: due, scheduled, in work, failed, processed, the oldest due age.
    Stats {
        /// The database's URL; `DATABASE_URL` where it is left out.
        #[arg(env = "DATABASE_URL", value_name = "URL")]
        url: String,
        #[command(flatten)]
        table: TableArgs,
        /// Prints JSON.
        #[arg(long)]
        json: bool,
    },
    /// Publishes a job into the table, due now (at the database's time) or at a given time.
    Enqueue {
        /// The database's URL; `DATABASE_URL` where it is left out.
        #[arg(env = "DATABASE_URL", value_name = "URL")]
        url: String,
        #[command(flatten)]
        table: TableArgs,
        #[command(flatten)]
        job: JobArgs,
    },
    /// The failed rows: list, show, redrive, delete.
    Failed {
        #[command(subcommand)]
        command: FailedCommand,
    },
    /// Prints the table's schema (CREATE TABLE and its indexes) in a dialect.
    Schema {
        /// The dialect.
        #[arg(long, value_enum)]
        dialect: DialectArg,
        #[command(flatten)]
        table: TableArgs,
    },
    /// A live view of the table's depth and rates, one line per tick.
    Watch {
        /// The database's URL; `DATABASE_URL` where it is left out.
        #[arg(env = "DATABASE_URL", value_name = "URL")]
        url: String,
        #[command(flatten)]
        table: TableArgs,
        /// Seconds between ticks.
        #[arg(long, default_value_t = 1.0)]
        every: f64,
        /// Stops after this many ticks.
        #[arg(long)]
        count: Option<u64>,
    },
}

#[derive(Subcommand, Debug)]
enum FailedCommand {
    /// Lists failed rows in id order.
    List {
        /// The database's URL; `DATABASE_URL` where it is left out.
        #[arg(env = "DATABASE_URL", value_name = "URL")]
        url: String,
        #[command(flatten)]
        table: TableArgs,
        /// The most rows.
        #[arg(long, default_value_t = 20)]
        limit: u32,
        /// The rows after this id.
        #[arg(long)]
        after: Option<String>,
        /// Prints JSON.
        #[arg(long)]
        json: bool,
    },
    /// Shows one failed row, with its payload.
    Show {
        /// The database's URL, then the row's id; the URL may be left out where
        /// `DATABASE_URL` gives it.
        #[arg(value_name = "[URL] ID", num_args = 1..=2, required = true)]
        url_and_row: Vec<String>,
        #[command(flatten)]
        table: TableArgs,
        /// Prints JSON.
        #[arg(long)]
        json: bool,
    },
    /// Returns failed rows to the queue, due now, their attempts counted from zero.
    Redrive {
        /// The database's URL; `DATABASE_URL` where it is left out.
        #[arg(env = "DATABASE_URL", value_name = "URL")]
        url: String,
        #[command(flatten)]
        table: TableArgs,
        #[command(flatten)]
        which: Which,
    },
    /// Deletes failed rows.
    Delete {
        /// The database's URL; `DATABASE_URL` where it is left out.
        #[arg(env = "DATABASE_URL", value_name = "URL")]
        url: String,
        #[command(flatten)]
        table: TableArgs,
        #[command(flatten)]
        which: Which,
    },
}

/// The job `enqueue` publishes.
#[derive(Args, Debug)]
struct JobArgs {
    /// The payload, written as given (JSON for a handler of a JSON message).
    #[arg(long = "message", value_name = "PAYLOAD")]
    message: String,
    /// A value of a column the row's key or the table needs, as `COLUMN=VALUE` (repeatable);
    /// a value that reads as an integer is written as one.
    #[arg(long = "column", value_name = "COLUMN=VALUE")]
    columns: Vec<String>,
    /// The row's id, where the database does not generate it.
    #[arg(long = "job-id", value_name = "ID")]
    id: Option<String>,
    /// When the job becomes due, as RFC 3339 (`2026-12-24T18:00:00Z`); now (at the
    /// database's time) when left out. The table needs a due column.
    #[arg(long, value_name = "TIME")]
    at: Option<String>,
}

/// Which failed rows: by id, by their error's text, or all.
#[derive(Args, Debug)]
#[group(required = true, multiple = false)]
struct Which {
    /// A row's id (repeatable).
    #[arg(long = "id")]
    ids: Vec<String>,
    /// The rows whose error contains this text.
    #[arg(long)]
    error_contains: Option<String>,
    /// Every failed row.
    #[arg(long)]
    all: bool,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum DialectArg {
    Postgres,
    Mysql,
    Mariadb,
    Sqlite,
}

impl From<DialectArg> for Dialect {
    fn from(d: DialectArg) -> Dialect {
        match d {
            DialectArg::Postgres => Dialect::Postgres,
            DialectArg::Mysql => Dialect::MySql,
            DialectArg::Mariadb => Dialect::MariaDb,
            DialectArg::Sqlite => Dialect::Sqlite,
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    match runtime.block_on(run(cli.command)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("ruststream: {error}");
            ExitCode::FAILURE
        }
    }
}

/// The URL and the id of `failed show URL ID`, or of `failed show ID` with the URL from
/// `DATABASE_URL`.
fn url_and_id(mut given: Vec<String>, env: Option<String>) -> Result<(String, String), String> {
    let id = given
        .pop()
        .ok_or("no row id: give `failed show [URL] ID`")?;
    match (given.pop(), env) {
        (Some(url), _) | (None, Some(url)) => Ok((url, id)),
        (None, None) => Err(format!(
            "no database: give `failed show URL {id}`, or set DATABASE_URL"
        )),
    }
}

/// An id as the command line gives it: an integer where it reads as one, else text.
fn id_value(id: &str) -> Value {
    match id.parse::<i64>() {
        Ok(n) => Value::Int(n),
        Err(_) => Value::Text(id.to_owned()),
    }
}

fn now() -> Time {
    let micros = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_micros())
        .unwrap_or(0);
    Time(i64::try_from(micros).unwrap_or(i64::MAX))
}

async fn run(command: Command) -> Result<(), String> {
    match command {
        Command::Stats { url, table, json } => {
            let desc = table.resolved()?.desc()?;
            let db = Db::connect(&url).await?;
            let stats = stats(&db, &desc).await?;
            if json {
                println!("{}", stats_json(&stats));
            } else {
                print_stats(&stats);
            }
            Ok(())
        }
        Command::Schema { dialect, table } => {
            let table = table.resolved()?;
            let desc = table.desc()?;
            let mut ddl = Ddl::new(dialect.into(), &desc);
            for (column, ty) in table.column_types()? {
                ddl = ddl.column_type(&column, &ty);
            }
            print!("{ddl}");
            Ok(())
        }
        Command::Watch {
            url,
            table,
            every,
            count,
        } => watch(&url, &table.resolved()?.desc()?, every, count).await,
        Command::Enqueue { url, table, job } => enqueue(&url, &table, &job).await,
        Command::Failed { command } => failed(command).await,
    }
}

/// Publishes `job` into the table with the statements a publisher runs (on PostgreSQL they
/// wake the subscriptions that listen).
async fn enqueue(url: &str, table: &TableArgs, job: &JobArgs) -> Result<(), String> {
    let desc = table.resolved()?.desc()?;
    let columns = job
        .columns
        .iter()
        .map(|given| match given.split_once('=') {
            Some((column, value)) if !column.is_empty() => {
                Ok((table::leak(column.to_owned()), id_value(value)))
            }
            _ => Err(format!("--column {given}: give COLUMN=VALUE")),
        })
        .collect::<Result<Vec<_>, String>>()?;
    let due = match &job.at {
        Some(at) => {
            let at = chrono::DateTime::parse_from_rfc3339(at)
                .map_err(|e| format!("--at {at}: not an RFC 3339 time ({e})"))?;
            if desc.due.is_none() {
                return Err(format!(
                    "--at: table `{}` has no due column to write it into: give it (--due)",
                    desc.table
                ));
            }
            Some(Time(at.timestamp_micros()))
        }
        None => None,
    };
    let row = Publish {
        id: job.id.as_deref().map(id_value),
        payload: job.message.clone().into_bytes(),
        columns,
        due,
    };
    let db = Db::connect(url).await?;
    let mut inserts = Inserts::new(db.dialect(), desc);
    let statements = inserts.statements(&[row]).map_err(|e| e.to_string())?;
    let mut written = Vec::new();
    for (statement, binds) in statements {
        written.push(match db.run(&statement, binds).await? {
            Ran::Affected(n) => n,
            Ran::Rows(rows) => rows.len() as u64,
        });
    }
    if inserts.published(&written).skipped.is_empty() {
        match &job.at {
            Some(at) => println!("enqueued 1 job into `{}`, due at {at}", desc.table),
            None => println!("enqueued 1 job into `{}`", desc.table),
        }
    } else {
        println!(
            "`{}` holds a job with the same unique columns already: nothing enqueued",
            desc.table
        );
    }
    Ok(())
}

async fn stats(db: &Db, desc: &TableDesc) -> Result<Stats, String> {
    // The counts read the database's time themselves: the statement binds nothing.
    let statement = Statements::stats(db.dialect(), desc);
    let now = now();
    let binds = statement.binds(|_| Value::Null);
    let values = match db.run(&statement, binds).await? {
        Ran::Rows(rows) => rows.into_iter().next().unwrap_or_default(),
        Ran::Affected(_) => Vec::new(),
    };
    Stats::from_values(desc.table, &values, now)
}

fn stats_json(stats: &Stats) -> serde_json::Value {
    let count = |c: Option<ruststream_core::Count>| {
        c.map(|c| json!({ "count": c.value(), "exact": c.is_exact() }))
    };
    json!({
        "table": stats.table,
        "due": count(Some(stats.due)),
        "scheduled": count(Some(stats.scheduled)),
        "in_work": count(stats.in_work),
        "failed": count(stats.failed),
        "processed": count(stats.processed),
        "oldest_due_age_seconds": stats.oldest_due_age().map(|d| d.as_secs_f64()),
    })
}

fn shown(c: Option<ruststream_core::Count>) -> String {
    c.map_or_else(|| "-".to_owned(), |c| c.to_string())
}

fn print_stats(stats: &Stats) {
    println!("table      {}", stats.table);
    println!("due        {}", stats.due);
    println!("scheduled  {}", stats.scheduled);
    println!("in work    {}", shown(stats.in_work));
    println!("failed     {}", shown(stats.failed));
    println!("processed  {}", shown(stats.processed));
    println!(
        "oldest due {}",
        stats
            .oldest_due_age()
            .map_or_else(|| "-".to_owned(), |d| format!("{:.1}s", d.as_secs_f64()))
    );
}

async fn watch(url: &str, desc: &TableDesc, every: f64, count: Option<u64>) -> Result<(), String> {
    let db = Db::connect(url).await?;
    let every = Duration::from_secs_f64(every.max(0.05));
    println!(
        "{:>10} {:>10} {:>8} {:>8} {:>10} {:>10} {:>10}",
        "due", "scheduled", "in work", "failed", "processed", "done/s", "oldest due"
    );
    let mut last: Option<(Stats, std::time::Instant)> = None;
    let mut ticks = 0u64;
    loop {
        let s = stats(&db, desc).await?;
        let at = std::time::Instant::now();
        // Rows that left the queue per second: fewer rows waiting or in work, or more marked
        // processed where the table keeps them.
        let rate = last.as_ref().map(|(before, then)| {
            let secs = at.duration_since(*then).as_secs_f64().max(1e-3);
            let open = |s: &Stats| {
                (s.due.value() + s.scheduled.value() + s.in_work.map_or(0, |c| c.value())) as f64
            };
            let done = match (s.processed, before.processed) {
                (Some(now), Some(then)) => now.value() as f64 - then.value() as f64,
                _ => open(before) - open(&s),
            };
            (done / secs).max(0.0)
        });
        println!(
            "{:>10} {:>10} {:>8} {:>8} {:>10} {:>10} {:>10}",
            s.due.to_string(),
            s.scheduled.to_string(),
            shown(s.in_work),
            shown(s.failed),
            shown(s.processed),
            rate.map_or_else(|| "-".to_owned(), |r| format!("{r:.1}")),
            s.oldest_due_age()
                .map_or_else(|| "-".to_owned(), |d| format!("{:.1}s", d.as_secs_f64()))
        );
        ticks += 1;
        if count.is_some_and(|n| ticks >= n) {
            return Ok(());
        }
        last = Some((s, at));
        tokio::time::sleep(every).await;
    }
}

fn row_json(row: &FailedRow) -> serde_json::Value {
    let id = match &row.id {
        Value::Int(n) => json!(n),
        Value::Text(t) => json!(t),
        other => json!(other.to_string()),
    };
    json!({
        "id": id,
        "attempt": row.attempt,
        "error": row.error,
        "failed_at_micros": row.failed_at.map(|t| t.micros()),
        "payload": row.payload.as_ref().map(|p| String::from_utf8_lossy(p).into_owned()),
        "errors": row.errors.iter().map(|e| json!({
            "attempt": e.attempt,
            "at_micros": e.at.map(|t| t.micros()),
            "error": e.error,
        })).collect::<Vec<_>>(),
    })
}

async fn failed(command: FailedCommand) -> Result<(), String> {
    match command {
        FailedCommand::List {
            url,
            table,
            limit,
            after,
            json,
        } => {
            let desc = table.resolved()?.desc()?;
            let db = Db::connect(&url).await?;
            let after = after.as_deref().map(id_value);
            let rows = failed_rows(&db, &desc, Some(limit), after, None).await?;
            if json {
                println!("{}", json!(rows.iter().map(row_json).collect::<Vec<_>>()));
            } else {
                println!("{:>12} {:>7}  error", "id", "attempt");
                for row in &rows {
                    println!(
                        "{:>12} {:>7}  {}",
                        row.id.to_string(),
                        row.attempt.map_or_else(|| "-".into(), |a| a.to_string()),
                        row.error.as_deref().unwrap_or("-").replace('\n', " ")
                    );
                }
            }
            Ok(())
        }
        FailedCommand::Show {
            url_and_row,
            table,
            json,
        } => {
            let (url, id) = url_and_id(url_and_row, std::env::var("DATABASE_URL").ok())?;
            let desc = table.resolved()?.desc()?;
            let db = Db::connect(&url).await?;
            let rows = failed_rows(&db, &desc, None, None, Some(id_value(&id))).await?;
            let row = rows
                .first()
                .ok_or_else(|| format!("table `{}` has no failed row of id {id}", desc.table))?;
            if json {
                println!("{}", row_json(row));
            } else {
                println!("id       {}", row.id);
                println!(
                    "attempt  {}",
                    row.attempt.map_or_else(|| "-".into(), |a| a.to_string())
                );
                println!(
                    "failed   {}",
                    row.failed_at
                        .map_or_else(|| "-".into(), |t| utc(t.micros()))
                );
                println!("error    {}", row.error.as_deref().unwrap_or("-"));
                if !row.errors.is_empty() {
                    println!("errors   (oldest first)");
                    for e in &row.errors {
                        let attempt = e.attempt.map_or_else(|| "?".into(), |a| a.to_string());
                        let at = e.at.map_or_else(|| "-".into(), |t| utc(t.micros()));
                        println!("  attempt {attempt} at {at}: {}", e.error);
                    }
                }
                println!(
                    "payload  {}",
                    row.payload
                        .as_ref()
                        .map_or_else(|| "-".into(), |p| String::from_utf8_lossy(p).into_owned())
                );
            }
            Ok(())
        }
        FailedCommand::Redrive { url, table, which } => change(&url, &table, &which, true).await,
        FailedCommand::Delete { url, table, which } => change(&url, &table, &which, false).await,
    }
}

async fn failed_rows(
    db: &Db,
    desc: &TableDesc,
    limit: Option<u32>,
    after: Option<Value>,
    id: Option<Value>,
) -> Result<Vec<FailedRow>, String> {
    let statement = Statements::list_failed(db.dialect(), desc, after.is_some(), id.is_some())
        .ok_or_else(|| {
            format!(
                "table `{}` keeps no failed rows: give its failed column (--failed-at)",
                desc.table
            )
        })?;
    let binds = statement.binds(|arg| match arg {
        Arg::Limit => Value::Int(i64::from(limit.unwrap_or(1))),
        Arg::Floor => after.clone().unwrap_or(Value::Null),
        _ => id.clone().unwrap_or(Value::Null),
    });
    match db.run(&statement, binds).await? {
        Ran::Rows(rows) => Ok(rows.into_iter().map(FailedRow::from_values).collect()),
        Ran::Affected(_) => Ok(Vec::new()),
    }
}

async fn change(url: &str, table: &TableArgs, which: &Which, redrive: bool) -> Result<(), String> {
    let desc = table.resolved()?.desc()?;
    let db = Db::connect(url).await?;
    let dialect = db.dialect();
    let selects = if which.all {
        FailedRows::All
    } else if which.error_contains.is_some() {
        FailedRows::ErrorContains
    } else {
        FailedRows::Ids(which.ids.len())
    };
    let statement = if redrive {
        Statements::redrive(dialect, &desc, selects)
    } else {
        Statements::delete_failed(dialect, &desc, selects)
    }
    .ok_or_else(|| {
        format!(
            "table `{}` keeps no failed rows: give its failed column (--failed-at)",
            desc.table
        )
    })?;
    let binds = statement.binds(|arg| match arg {
        Arg::IdAt(i) => which.ids.get(i).map_or(Value::Null, |id| id_value(id)),
        Arg::ErrorLike => Value::Text(error_like(which.error_contains.as_deref().unwrap_or(""))),
        _ => Value::Null,
    });
    let n = match db.run(&statement, binds).await? {
        Ran::Affected(n) => n,
        Ran::Rows(rows) => rows.len() as u64,
    };
    if redrive && n > 0 {
        // Listening subscriptions on PostgreSQL hear of the rows at once.
        if let Some(notify) = Statements::notify(dialect, &desc) {
            db.run(&notify, Vec::new()).await?;
        }
    }
    println!(
        "{} {n} failed row{} of `{}`",
        if redrive { "redrove" } else { "deleted" },
        if n == 1 { "" } else { "s" },
        desc.table
    );
    Ok(())
}

/// A time in microseconds since the Unix epoch, as UTC.
fn utc(micros: i64) -> String {
    chrono::DateTime::from_timestamp_micros(micros).map_or_else(
        || format!("{micros} µs"),
        |t| t.format("%Y-%m-%d %H:%M:%S%.6f UTC").to_string(),
    )
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    #[test]
    fn the_commands_are_consistent() {
        super::Cli::command().debug_assert();
    }

    #[test]
    fn failed_show_takes_its_url_from_the_line_or_database_url() {
        let env = Some("postgres://env/db".to_owned());
        let given = |args: &[&str]| args.iter().map(|a| a.to_string()).collect::<Vec<_>>();
        assert_eq!(
            super::url_and_id(given(&["postgres://line/db", "7"]), env.clone()).unwrap(),
            ("postgres://line/db".to_owned(), "7".to_owned())
        );
        assert_eq!(
            super::url_and_id(given(&["7"]), env).unwrap(),
            ("postgres://env/db".to_owned(), "7".to_owned())
        );
        let error = super::url_and_id(given(&["7"]), None).unwrap_err();
        assert!(error.contains("DATABASE_URL"), "{error}");
    }

    #[test]
    fn ids_read_as_integers_where_they_are() {
        assert_eq!(super::id_value("42"), super::Value::Int(42));
        assert_eq!(super::id_value("a-1"), super::Value::Text("a-1".to_owned()));
    }
}
