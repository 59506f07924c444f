//! Rows written by hand that the queue cannot take as they are, on every database: a key
//! column that is `NULL` or empty text fails its row without the handler, with an error
//! naming the table, the row and the column, and keeps it in the table; a key of 10 kB and
//! a payload of 16 MB are served; the rows beside them are served throughout. On SQLite, whose
//! columns take a value of any type, a key that is not text (bytes that are not UTF-8) and an
//! attempt that is not an integer fail their rows alone, each error naming the column, and the
//! row queued after them is served.

use ruststream::Inbox;

use crate::common::*;

/// A job keyed by nothing but its `k` column, which may be `NULL` in the table.
#[derive(Inbox, sqlx::FromRow)]
#[inbox(
    table = "bad_jobs",
    advisory_lock = "{k}",
    failed_at = "failed_at",
    error = "error"
)]
#[allow(dead_code)]
pub struct BadJob {
    #[field(id, generated)]
    id: i64,
    k: Option<String>,
    #[field(attempt, generated)]
    attempt: i32,
    #[field(payload)]
    payload: Vec<u8>,
}

const BIG_KEY: usize = 10 * 1024;

/// 16 MiB; on MariaDB 64 KiB less, since its `max_allowed_packet` (16 MiB by default) bounds
/// a whole row's packet and the server here is shared.
fn big_payload(dialect: Dialect) -> usize {
    match dialect {
        Dialect::MariaDb => 16 * 1024 * 1024 - 64 * 1024,
        Dialect::Postgres | Dialect::Sqlite => 16 * 1024 * 1024,
    }
}

fn schema(dialect: Dialect) -> String {
    match dialect {
        Dialect::Postgres => "CREATE TABLE bad_jobs (id BIGINT PRIMARY KEY, k TEXT,
                 attempt INT NOT NULL DEFAULT 0, payload BYTEA NOT NULL,
                 failed_at TIMESTAMPTZ, error TEXT);"
            .to_owned(),
        Dialect::MariaDb => "CREATE TABLE bad_jobs (id BIGINT PRIMARY KEY, k LONGTEXT,
                 attempt INT NOT NULL DEFAULT 0, payload LONGBLOB NOT NULL,
                 failed_at DATETIME(6) NULL, error TEXT);"
            .to_owned(),
        Dialect::Sqlite => "CREATE TABLE bad_jobs (id INTEGER PRIMARY KEY, k TEXT,
                 attempt INTEGER NOT NULL DEFAULT 0, payload BLOB NOT NULL,
                 failed_at INTEGER, error TEXT);"
            .to_owned(),
    }
}

/// `n` x's, written by the database itself.
fn xs(dialect: Dialect, n: usize) -> String {
    match dialect {
        Dialect::Postgres | Dialect::MariaDb => format!("REPEAT('x', {n})"),
        // `hex` writes two zeros a byte, each pair one x.
        Dialect::Sqlite => format!("replace(hex(zeroblob({n})), '00', 'x')"),
    }
}

/// The bytes of the JSON text `{"n": n, "pad": "<pad>"}`, built by the database.
fn payload(dialect: Dialect, n: u32, pad: &str) -> String {
    match dialect {
        Dialect::Postgres => {
            format!("convert_to('{{\"n\": {n}, \"pad\": \"' || {pad} || '\"}}', 'UTF8')")
        }
        Dialect::MariaDb => format!("CONCAT('{{\"n\": {n}, \"pad\": \"', {pad}, '\"}}')"),
        Dialect::Sqlite => {
            format!("CAST('{{\"n\": {n}, \"pad\": \"' || {pad} || '\"}}' AS BLOB)")
        }
    }
}

pub async fn bad_rows_fail_or_are_served<D: TestDb>(db: &D)
where
    ruststream_sqlx::SqlxBroker<D::DB>: ruststream::adapter::TakesRows<BadJob>,
{
    let dialect = db.dialect();
    db.exec(&schema(dialect)).await;
    let insert = |id: u32, k: &str, pad: &str| {
        format!(
            "INSERT INTO bad_jobs (id, k, payload) VALUES ({id}, {k}, {})",
            payload(dialect, id, pad)
        )
    };
    db.exec(&insert(1, "NULL", "''")).await;
    db.exec(&insert(2, "''", "''")).await;
    db.exec(&insert(3, &xs(dialect, BIG_KEY), "''")).await;
    db.exec(&insert(4, "'four'", &xs(dialect, big_payload(dialect))))
        .await;
    db.exec(&insert(5, "'five'", "''")).await;
    let sqlite = dialect == Dialect::Sqlite;
    if sqlite {
        db.exec(&insert(6, "X'00FF'", "''")).await;
        db.exec(&format!(
            "INSERT INTO bad_jobs (id, k, attempt, payload) VALUES (7, 'seven', 2.5, {})",
            payload(dialect, 7, "''")
        ))
        .await;
        db.exec(&insert(8, "'eight'", "''")).await;
    }
    let (served_rows, failed_rows): (&[u32], &[u32]) = if sqlite {
        (&[3, 4, 5, 8], &[1, 2, 6, 7])
    } else {
        (&[3, 4, 5], &[1, 2])
    };
    assert_eq!(
        db.scalar("SELECT COUNT(*) FROM bad_jobs WHERE LENGTH(payload) > 16000000")
            .await,
        1,
        "{dialect:?}: the 16 MB payload is in the table"
    );

    let seen = Seen::default();
    let running = db
        .broker()
        .start(vec![subscription::<BadJob, D::DB>(
            Record::new(&seen, &Gate::open()),
            2,
            None,
        )])
        .await
        .expect("the broker starts");
    eventually("the rows with a key are served", || async {
        seen.len() >= served_rows.len()
    })
    .await;
    eventually(
        "the rows that cannot be taken are marked failed",
        || async {
            db.scalar("SELECT COUNT(*) FROM bad_jobs WHERE failed_at IS NOT NULL")
                .await
                == failed_rows.len() as i64
        },
    )
    .await;
    // A handler records its row as it starts: the served rows' settlements end before the
    // shutdown, which would return a row still in work.
    eventually("the served rows are settled", || async {
        db.scalar("SELECT COUNT(*) FROM bad_jobs").await == failed_rows.len() as i64
    })
    .await;
    running.shutdown().await;

    let mut served: Vec<u32> = seen.all().into_iter().map(|(n, _)| n).collect();
    served.sort_unstable();
    assert_eq!(
        served, served_rows,
        "{dialect:?}: the 10 kB key, the 16 MB payload, the plain rows"
    );
    assert_eq!(
        db.scalar("SELECT COUNT(*) FROM bad_jobs").await,
        failed_rows.len() as i64,
        "{dialect:?}: the failed rows stay, the served ones are gone"
    );
    if sqlite {
        assert_eq!(
            db.scalar(
                "SELECT COUNT(*) FROM bad_jobs WHERE id = 6 AND failed_at IS NOT NULL
                   AND error LIKE '%table `bad_jobs`: row 6:%key (of `k`) does not read as text%invalid utf-8%'"
            )
            .await,
            1,
            "row 6's key is not text: failed, its error naming the table, the row and the column"
        );
        assert_eq!(
            db.scalar(
                "SELECT COUNT(*) FROM bad_jobs WHERE id = 7 AND failed_at IS NOT NULL
                   AND error LIKE '%table `bad_jobs`: row 7 does not decode%column \"attempt\"%'"
            )
            .await,
            1,
            "row 7's attempt is not an integer: failed, its error naming the table, the row and the column"
        );
    }
    for id in [1, 2] {
        assert_eq!(
            db.scalar(&format!(
                "SELECT COUNT(*) FROM bad_jobs WHERE id = {id} AND attempt = 1
                   AND error LIKE '%table `bad_jobs`: row {id}:%key%`k`%NULL or empty%'"
            ))
            .await,
            1,
            "{dialect:?}: row {id} is failed after one attempt, its error naming the table, the row and the column"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres() {
    let db = Pg::new("pg_bad_rows").await;
    bad_rows_fail_or_are_served(&db).await;
    assert_eq!(db.advisory_locks().await, 0, "no advisory lock is left");
    db.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb() {
    let db = My::new("my_bad_rows").await;
    bad_rows_fail_or_are_served(&db).await;
    db.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite() {
    let db = Lite::new("lite_bad_rows").await;
    bad_rows_fail_or_are_served(&db).await;
    db.drop().await;
}
