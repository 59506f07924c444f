//! The `ruststream` binary run against the servers: PostgreSQL at `RUSTSTREAM_PG_URL`, MariaDB
//! at `RUSTSTREAM_MYSQL_URL`, and a SQLite file. Its `schema` output creates the table; rows
//! are written by hand; `stats`, `failed list|show|redrive|delete` and `watch` read and change
//! what the table holds, checked in the database.

use std::process::Command;

use sqlx::{AnyPool, AssertSqlSafe};

fn pg_url() -> String {
    std::env::var("RUSTSTREAM_PG_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into())
}

fn mysql_url() -> String {
    std::env::var("RUSTSTREAM_MYSQL_URL")
        .unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/test".into())
}

/// Runs the binary; answers its standard output, or fails with its standard error.
fn ruststream(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_ruststream"))
        .args(args)
        .output()
        .expect("the binary runs");
    assert!(
        out.status.success(),
        "ruststream {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("UTF-8")
}

/// Runs the binary with `DATABASE_URL` set to `url`; answers its standard output, or fails
/// with its standard error.
fn ruststream_at(url: &str, args: &[String]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_ruststream"))
        .args(args)
        .env("DATABASE_URL", url)
        .output()
        .expect("the binary runs");
    assert!(
        out.status.success(),
        "DATABASE_URL={url} ruststream {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("UTF-8")
}

/// Runs the binary expecting a failure; answers its standard error.
fn ruststream_fails(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_ruststream"))
        .args(args)
        .output()
        .expect("the binary runs");
    assert!(!out.status.success(), "ruststream {args:?} succeeded");
    String::from_utf8(out.stderr).expect("UTF-8")
}

/// A history of two errors, as the queue writes it.
const ERRORS: &str = r#"[{"attempt": 4, "at": 1765000000000000, "error": "boom earlier"}, {"attempt": 5, "at": 1765000001000000, "error": "boom two"}]"#;

struct Case {
    url: String,
    dialect: &'static str,
    table: String,
    /// A failed mark in the dialect.
    mark: &'static str,
}

impl Case {
    fn postgres() -> Self {
        Self {
            url: pg_url(),
            dialect: "postgres",
            table: format!("cli_jobs_{}", std::process::id()),
            mark: "now()",
        }
    }

    fn mariadb() -> Self {
        Self {
            url: mysql_url(),
            dialect: "mariadb",
            table: format!("cli_jobs_{}", std::process::id()),
            mark: "UTC_TIMESTAMP(6)",
        }
    }

    /// A directory of this process's own for a SQLite file, made.
    fn sqlite_dir(test: &str) -> std::path::PathBuf {
        let dir =
            std::env::temp_dir().join(format!("ruststream-cli-{test}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a directory");
        dir
    }

    /// A SQLite file in `dir`.
    fn sqlite(dir: &std::path::Path) -> Self {
        Self {
            url: format!("sqlite://{}?mode=rwc", dir.join("jobs.db").display()),
            dialect: "sqlite",
            table: "cli_jobs".into(),
            mark: "1",
        }
    }
}

async fn scalar(pool: &AnyPool, sql: &str) -> i64 {
    sqlx::query_scalar::<_, i64>(AssertSqlSafe(sql.to_owned()))
        .fetch_one(pool)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
}

async fn exec(pool: &AnyPool, sql: &str) {
    sqlx::raw_sql(AssertSqlSafe(sql.to_owned()))
        .execute(pool)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
}

async fn the_tool_reads_and_changes_a_table(case: Case) {
    sqlx::any::install_default_drivers();
    let pool = AnyPool::connect(&case.url)
        .await
        .unwrap_or_else(|e| panic!("{}: {e}", case.url));
    let t = case.table.as_str();
    exec(&pool, &format!("DROP TABLE IF EXISTS {t}")).await;
    let table = [
        "--table",
        t,
        "--generated-id",
        "--payload",
        "payload",
        "--attempt",
        "attempt",
        "--due",
        "due_at",
        "--failed-at",
        "failed_at",
        "--error",
        "error",
        "--errors",
        "errors",
    ];
    let with = |head: &[&str], tail: &[&str]| -> Vec<String> {
        head.iter()
            .chain(table.iter())
            .chain(tail.iter())
            .map(|s| s.to_string())
            .collect()
    };
    let run = |args: Vec<String>| ruststream(&args.iter().map(String::as_str).collect::<Vec<_>>());

    let ddl = run(with(&["schema", "--dialect", case.dialect], &[]));
    assert!(ddl.contains(&format!("{t}_claim")), "{ddl}");
    assert!(ddl.contains(&format!("{t}_failed")), "{ddl}");
    exec(&pool, &ddl).await;

    let due_now = match case.dialect {
        "postgres" => "now()",
        "mariadb" => "UTC_TIMESTAMP(6)",
        _ => "0",
    };
    exec(
        &pool,
        &format!(
            "INSERT INTO {t} (payload, attempt, due_at, failed_at, error, errors) VALUES
             ('{{\"n\":1}}', 5, {due_now}, {m}, 'boom one', NULL),
             ('{{\"n\":2}}', 5, {due_now}, {m}, 'boom two', '{ERRORS}'),
             ('{{\"n\":3}}', 0, {due_now}, NULL, NULL, NULL)",
            m = case.mark
        ),
    )
    .await;

    let stats: serde_json::Value =
        serde_json::from_str(&run(with(&["stats", &case.url], &["--json"]))).expect("JSON");
    assert_eq!(stats["table"], t);
    assert_eq!(stats["due"]["count"], 1, "{stats}");
    assert_eq!(stats["due"]["exact"], true);
    assert_eq!(stats["failed"]["count"], 2, "{stats}");
    assert_eq!(stats["in_work"], serde_json::Value::Null);
    let human = run(with(&["stats", &case.url], &[]));
    assert!(human.contains("failed     2"), "{human}");

    let listed: serde_json::Value = serde_json::from_str(&run(with(
        &["failed", "list", &case.url],
        &["--limit", "10", "--json"],
    )))
    .expect("JSON");
    let rows = listed.as_array().expect("rows");
    assert_eq!(rows.len(), 2, "{listed}");
    assert_eq!(rows[0]["error"], "boom one");
    assert_eq!(rows[0]["attempt"], 5);
    let first = rows[0]["id"].as_i64().expect("an integer id").to_string();
    let second = rows[1]["id"].as_i64().expect("an integer id").to_string();
    let after: serde_json::Value = serde_json::from_str(&run(with(
        &["failed", "list", &case.url],
        &["--after", &first, "--json"],
    )))
    .expect("JSON");
    assert_eq!(after.as_array().map(Vec::len), Some(1), "{after}");

    assert_eq!(rows[0]["errors"], serde_json::json!([]), "{listed}");
    assert_eq!(
        rows[1]["errors"],
        serde_json::json!([
            {"attempt": 4, "at_micros": 1_765_000_000_000_000_i64, "error": "boom earlier"},
            {"attempt": 5, "at_micros": 1_765_000_001_000_000_i64, "error": "boom two"},
        ]),
        "{listed}: the row's history of errors, oldest first"
    );

    let shown = run(with(&["failed", "show", &case.url, &second], &[]));
    assert!(
        shown.contains("boom two") && shown.contains("{\"n\":2}"),
        "{shown}"
    );
    assert!(
        shown.contains("  attempt 4 at 2025-12-06 05:46:40.000000 UTC: boom earlier\n")
            && shown.contains("  attempt 5 at 2025-12-06 05:46:41.000000 UTC: boom two\n"),
        "{shown}"
    );
    // The URL left out: `DATABASE_URL` gives it, to `failed show ID` as to the others.
    let shown_by_env = ruststream_at(&case.url, &with(&["failed", "show", &second], &[]));
    assert_eq!(shown_by_env, shown);
    let stats_by_env: serde_json::Value =
        serde_json::from_str(&ruststream_at(&case.url, &with(&["stats"], &["--json"])))
            .expect("JSON");
    assert_eq!(stats_by_env["table"], t);
    assert_eq!(stats_by_env["failed"]["count"], 2, "{stats_by_env}");
    let missing = ruststream_fails(
        &with(&["failed", "show", &case.url, "999999"], &[])
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>(),
    );
    assert!(
        missing.contains(&format!("table `{t}` has no failed row of id 999999")),
        "{missing}"
    );

    let redrove = run(with(&["failed", "redrive", &case.url], &["--id", &first]));
    assert!(redrove.contains("redrove 1 failed row"), "{redrove}");
    assert_eq!(
        scalar(
            &pool,
            &format!("SELECT COUNT(*) FROM {t} WHERE failed_at IS NULL AND attempt = 0")
        )
        .await,
        2,
        "the redriven row is due again, its attempts from zero"
    );
    let deleted = run(with(
        &["failed", "delete", &case.url],
        &["--error-contains", "two"],
    ));
    assert!(deleted.contains("deleted 1 failed row"), "{deleted}");
    assert_eq!(
        scalar(&pool, &format!("SELECT COUNT(*) FROM {t}")).await,
        2,
        "the deleted row is gone, the others stay"
    );

    let watched = run(with(
        &["watch", &case.url],
        &["--every", "0.1", "--count", "3"],
    ));
    let lines: Vec<&str> = watched.lines().collect();
    assert_eq!(lines.len(), 4, "a header and three ticks: {watched}");
    assert!(lines[0].contains("due") && lines[0].contains("done/s"));
    assert!(lines[1].trim_start().starts_with('2'), "{watched}");

    exec(&pool, &format!("DROP TABLE {t}")).await;
}

#[tokio::test]
async fn postgres() {
    the_tool_reads_and_changes_a_table(Case::postgres()).await;
}

#[tokio::test]
async fn mariadb() {
    the_tool_reads_and_changes_a_table(Case::mariadb()).await;
}

#[tokio::test]
async fn sqlite() {
    let dir = Case::sqlite_dir("reads");
    the_tool_reads_and_changes_a_table(Case::sqlite(&dir)).await;
    let _ = std::fs::remove_dir_all(dir);
}

/// A table described in a TOML file, with a key column's type; flags beside it win; a wrong
/// description fails naming what is wrong.
#[test]
fn a_description_in_a_file() {
    let dir = std::env::temp_dir().join(format!("ruststream-cli-toml-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a directory");
    let file = dir.join("jobs.toml");
    std::fs::write(
        &file,
        "table = \"video_jobs\"\ngenerated_id = true\npayload = \"payload\"\nattempt = \"attempt\"\nadvisory_lock = \"video-{channel}\"\n[types]\nchannel = \"BIGINT NOT NULL\"\n",
    )
    .expect("written");
    let file = file.to_str().expect("a path");
    let ddl = ruststream(&["schema", "--dialect", "postgres", "--config", file]);
    assert!(
        ddl.contains("CREATE TABLE IF NOT EXISTS \"video_jobs\""),
        "{ddl}"
    );
    assert!(ddl.contains("\"channel\" BIGINT NOT NULL"), "{ddl}");
    let renamed = ruststream(&[
        "schema",
        "--dialect",
        "mysql",
        "--config",
        file,
        "--table",
        "other_jobs",
    ]);
    assert!(
        renamed.contains("CREATE TABLE IF NOT EXISTS `other_jobs`"),
        "{renamed}"
    );
    let two_forms = ruststream_fails(&[
        "schema",
        "--dialect",
        "postgres",
        "--config",
        file,
        "--locked-until",
        "locked_until",
    ]);
    assert!(two_forms.contains("video_jobs"), "{two_forms}");
    let unknown = dir.join("bad.toml");
    std::fs::write(&unknown, "table = \"t\"\npayload_column = \"p\"\n").expect("written");
    let bad = ruststream_fails(&[
        "schema",
        "--dialect",
        "sqlite",
        "--config",
        unknown.to_str().expect("a path"),
    ]);
    assert!(bad.contains("payload_column"), "{bad}");
    let _ = std::fs::remove_dir_all(dir);
}

/// `enqueue` publishes a job as a publisher does: due now, its payload as given, the key's
/// column written; a table with a unique column takes a job of the same value once; a job
/// without a column the table needs, or with one it does not write, fails naming the column.
async fn the_tool_enqueues_jobs(case: Case) {
    sqlx::any::install_default_drivers();
    let pool = AnyPool::connect(&case.url)
        .await
        .unwrap_or_else(|e| panic!("{}: {e}", case.url));
    let t = format!("{}_enqueued", case.table);
    exec(&pool, &format!("DROP TABLE IF EXISTS {t}")).await;
    let table: Vec<String> = [
        "--table",
        &t,
        "--generated-id",
        "--payload",
        "payload",
        "--due",
        "due_at",
        "--advisory-lock",
        "channel-{channel}",
        "--unique",
        "channel",
        "--type",
        "channel=VARCHAR(100)",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let with = |head: &[&str], tail: &[&str]| -> Vec<String> {
        let head = head.iter().map(|s| s.to_string());
        let tail = tail.iter().map(|s| s.to_string());
        head.chain(table.iter().cloned()).chain(tail).collect()
    };
    let run = |args: Vec<String>| ruststream(&args.iter().map(String::as_str).collect::<Vec<_>>());
    let fails =
        |args: Vec<String>| ruststream_fails(&args.iter().map(String::as_str).collect::<Vec<_>>());
    exec(
        &pool,
        &run(with(&["schema", "--dialect", case.dialect], &[])),
    )
    .await;

    let enqueue = ["enqueue", case.url.as_str()];
    let job = ["--message", r#"{"title":"n1"}"#, "--column", "channel=news"];
    let said = run(with(&enqueue, &job));
    assert!(
        said.contains(&format!("enqueued 1 job into `{t}`")),
        "{said}"
    );
    let again = run(with(&enqueue, &job));
    assert!(again.contains("nothing enqueued"), "{again}");
    let stats: serde_json::Value =
        serde_json::from_str(&run(with(&["stats", &case.url], &["--json"]))).expect("JSON");
    assert_eq!(stats["due"]["count"], 1, "the job is due at once: {stats}");
    // SQLite compares a blob with text as unequal: the payload is read as text there.
    let payload = match case.dialect {
        "sqlite" => "CAST(payload AS TEXT)",
        _ => "payload",
    };
    let payload = scalar(
        &pool,
        &format!(
            "SELECT COUNT(*) FROM {t} WHERE channel = 'news' AND {payload} = '{{\"title\":\"n1\"}}'"
        ),
    )
    .await;
    assert_eq!(payload, 1, "the row holds the payload and the key's column");

    let later = run(with(
        &enqueue,
        &[
            "--message",
            "{}",
            "--column",
            "channel=later",
            "--at",
            "2099-01-01T00:00:00Z",
        ],
    ));
    assert!(later.contains("due at 2099-01-01T00:00:00Z"), "{later}");
    let stats: serde_json::Value =
        serde_json::from_str(&run(with(&["stats", &case.url], &["--json"]))).expect("JSON");
    assert_eq!(stats["due"]["count"], 1, "{stats}");
    assert_eq!(
        stats["scheduled"]["count"], 1,
        "the job at a time to come waits: {stats}"
    );
    let not_a_time = fails(with(
        &enqueue,
        &[
            "--message",
            "{}",
            "--column",
            "channel=x",
            "--at",
            "tomorrow",
        ],
    ));
    assert!(not_a_time.contains("RFC 3339"), "{not_a_time}");

    let missing = fails(with(&enqueue, &["--message", "{}"]));
    assert!(
        missing.contains(&t) && missing.contains("channel"),
        "the refusal names the table and the column: {missing}"
    );
    let unknown = fails(with(
        &enqueue,
        &[
            "--message",
            "{}",
            "--column",
            "channel=a",
            "--column",
            "chanel=b",
        ],
    ));
    assert!(
        unknown.contains("chanel"),
        "the refusal names the column: {unknown}"
    );
    let malformed = fails(with(&enqueue, &["--message", "{}", "--column", "channel"]));
    assert!(malformed.contains("COLUMN=VALUE"), "{malformed}");
    exec(&pool, &format!("DROP TABLE {t}")).await;
}

#[tokio::test]
async fn postgres_enqueue() {
    the_tool_enqueues_jobs(Case::postgres()).await;
}

#[tokio::test]
async fn mariadb_enqueue() {
    the_tool_enqueues_jobs(Case::mariadb()).await;
}

#[tokio::test]
async fn sqlite_enqueue() {
    let dir = Case::sqlite_dir("enqueue");
    the_tool_enqueues_jobs(Case::sqlite(&dir)).await;
    let _ = std::fs::remove_dir_all(dir);
}
