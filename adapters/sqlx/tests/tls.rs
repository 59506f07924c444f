//! TLS on a real PostgreSQL: a throwaway server of the test's own (the conformance suite's
//! `servers::postgres`; never the shared server) that takes TLS sessions only, its certificate signed by a CA made
//! for the test. The features `postgres` and `tls-rustls` (this target's required features):
//!
//! - a URL with `sslmode=disable` does not start, and its error names the server's refusal;
//! - `sslmode=verify-full` without the test CA (the webpki roots) does not start, and its
//!   error names the certificate;
//! - `sslmode=verify-full&sslrootcert=<the test CA>` starts a service whose subscriber handles
//!   every row published through it; the rows are settled in the table, and every session of
//!   the broker on the server is a TLS session (`pg_stat_ssl`).
//!
//! `cargo test -p ruststream-sqlx --features tls-rustls --test tls`

#[path = "../../tokio-postgres/tests/support/tls_jobs.rs"]
mod tls_jobs;

use std::time::{Duration, Instant};

use ruststream_conformance::servers::postgres::TlsServer;
use ruststream_sqlx::prelude::*;
use ruststream_sqlx::sqlx;
use sqlx::Connection;
use sqlx::postgres::PgPoolOptions;
use tls_jobs::{Job, Seen};

/// Rows the test publishes.
const JOBS: u32 = 5;
/// The application name of the broker's sessions, to find them on the server.
const APP: &str = "rs_tls_broker";
const WAIT: Duration = Duration::from_secs(30);

const SCHEMA: &str = "CREATE TABLE tls_jobs (
    id BIGSERIAL PRIMARY KEY,
    payload BYTEA NOT NULL,
    locked_until TIMESTAMPTZ,
    processed_at TIMESTAMPTZ
)";

/// A row of `tls_jobs`, in the lease form: a settled row stays, marked processed.
#[derive(Inbox, sqlx::FromRow)]
#[inbox(
    table = "tls_jobs",
    locked_until = "locked_until",
    processed_at = "processed_at"
)]
#[allow(dead_code)]
struct TlsJob {
    #[field(id, generated)]
    id: i64,
    #[field(payload)]
    payload: Vec<u8>,
}

async fn count(conn: &mut PgConnection, sql: &'static str) -> i64 {
    sqlx::query_scalar(sql)
        .fetch_one(conn)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
}

/// Why a broker of `url` does not start; fails the test if it starts.
async fn start_error(url: String, what: &str) -> String {
    let broker = SqlxBroker::<Postgres>::from_url(
        url,
        PgPoolOptions::new()
            .max_connections(1)
            .acquire_timeout(Duration::from_secs(10)),
    );
    match broker.start(Vec::new()).await {
        Ok(running) => {
            let _ = running.shutdown().await;
            panic!("{what}: the broker started")
        }
        Err(error) => error.to_string(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broker_serves_rows_over_tls_and_plain_sessions_are_refused() {
    let server = TlsServer::start("sqlx");
    let ca = server.ca_file();
    let verified = format!(
        "?sslmode=verify-full&sslrootcert={}",
        ca.to_str().expect("a UTF-8 path")
    );

    // Without TLS the server finds no pg_hba.conf entry, and the start says so.
    let plain = start_error(
        server.url("?sslmode=disable"),
        "sslmode=disable, on a server that takes TLS sessions only",
    )
    .await;
    eprintln!("sslmode=disable: {plain}");
    assert!(
        plain.contains("no pg_hba.conf entry") && plain.contains("no encryption"),
        "the start without TLS names the server's refusal: {plain}"
    );

    // Verifying against the webpki roots alone, the test CA is unknown: the handshake fails.
    let untrusted = start_error(
        server.url("?sslmode=verify-full"),
        "sslmode=verify-full without the test CA",
    )
    .await;
    eprintln!("sslmode=verify-full, the test CA unknown: {untrusted}");
    assert!(
        untrusted.contains("invalid peer certificate"),
        "the start over TLS with an unknown CA names the certificate: {untrusted}"
    );

    // A session of the test's own, over TLS, makes the table and sees its own TLS.
    let helper_url = server.url(&format!("{verified}&application_name=rs_tls_helper"));
    let mut helper = PgConnection::connect(&helper_url)
        .await
        .unwrap_or_else(|e| {
            panic!(
                "connect over TLS to the throwaway server at {helper_url}: {e}\nserver log:\n{}",
                server.log_tail()
            )
        });
    sqlx::raw_sql(SCHEMA)
        .execute(&mut helper)
        .await
        .expect("create tls_jobs");
    let ssl: bool = sqlx::query_scalar("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()")
        .fetch_one(&mut helper)
        .await
        .expect("pg_stat_ssl");
    assert!(ssl, "the helper's session is a TLS session");

    let handle = SqlxBroker::<Postgres>::from_url(
        server.url(&format!("{verified}&application_name={APP}")),
        PgPoolOptions::new().max_connections(4),
    )
    .handle();
    let seen = Seen::default();
    let handler = seen.clone();
    let service = RustStream::new(AppInfo::new("sqlx-tls-test", "0.1.0"))
        .shutdown_timeout(Duration::from_secs(10))
        .with_broker(handle.clone(), move |b| {
            b.include(
                subscriber("tls_jobs", handler)
                    .map_source(|_| InboxQueue::<TlsJob>::new("tls_jobs"))
                    .workers(nonzero!(2))
                    .poll_interval(Duration::from_millis(50))
                    .lease(Duration::from_secs(10))
                    .build(),
            );
        });
    let publisher = SqlxPublisher::<TlsJob, Postgres>::new(&handle);
    let run = async {
        for n in 0..JOBS {
            publisher
                .publish(Message::json(&Job { n }).unwrap())
                .await
                .expect("a publish over TLS");
        }
        let start = Instant::now();
        while count(
            &mut helper,
            "SELECT COUNT(*) FROM tls_jobs WHERE processed_at IS NOT NULL",
        )
        .await
            < i64::from(JOBS)
        {
            assert!(
                start.elapsed() < WAIT,
                "every row settled within {WAIT:?}: handled {:?}",
                seen.all()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // The broker's sessions (its pool's and its listening session) are all TLS sessions.
        let (tls, plain): (i64, i64) = sqlx::query_as(
            "SELECT COUNT(*) FILTER (WHERE s.ssl), COUNT(*) FILTER (WHERE NOT s.ssl)
               FROM pg_stat_ssl s JOIN pg_stat_activity a ON a.pid = s.pid
              WHERE a.application_name = $1",
        )
        .bind(APP)
        .fetch_one(&mut helper)
        .await
        .expect("the broker's sessions in pg_stat_ssl");
        assert!(tls >= 1, "the broker holds TLS sessions on the server");
        assert_eq!(plain, 0, "the broker holds no session without TLS");
    };
    service
        .run_until(run)
        .await
        .expect("the service over TLS runs");

    assert_eq!(
        seen.all(),
        (0..JOBS).collect::<Vec<_>>(),
        "each published row handled once"
    );
    assert_eq!(
        count(
            &mut helper,
            "SELECT COUNT(*) FROM tls_jobs WHERE processed_at IS NOT NULL AND locked_until IS NULL"
        )
        .await,
        i64::from(JOBS),
        "every row settled: marked processed, its lease cleared"
    );
    assert_eq!(
        count(&mut helper, "SELECT COUNT(*) FROM tls_jobs").await,
        i64::from(JOBS),
        "no row other than those published"
    );
    helper.close().await.expect("close the helper's session");
}
