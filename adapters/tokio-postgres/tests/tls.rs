//! TLS on a real server: a throwaway PostgreSQL of the test's own (the conformance suite's
//! `servers::postgres`, never the shared server) that takes TLS sessions only, its certificate signed by a CA made
//! for the test. The feature `rustls` (this target's required feature):
//!
//! - `from_url` (no TLS) does not start, and its error names the server's refusal;
//! - `from_url_rustls` (the webpki roots, which do not hold the test CA) does not start, and its
//!   error names the certificate;
//! - `from_url_tls` with a rustls connector that trusts the test CA starts a service whose
//!   subscriber handles every row published through it; the rows are settled in the table,
//!   and every session of the broker on the server is a TLS session (`pg_stat_ssl`).
//!
//! `cargo test -p ruststream-tokio-postgres --features rustls --test tls`

#[path = "support/tls_jobs.rs"]
mod tls_jobs;

use std::time::{Duration, Instant};

use ruststream_conformance::servers::postgres::TlsServer;
use ruststream_tokio_postgres::deadpool_postgres::PoolConfig;
use ruststream_tokio_postgres::prelude::*;
use ruststream_tokio_postgres::rustls;
use ruststream_tokio_postgres::tokio_postgres::{self, Client};
use ruststream_tokio_postgres::tokio_postgres_rustls::MakeRustlsConnect;
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
#[derive(Inbox, serde::Deserialize)]
#[inbox(
    table = "tls_jobs",
    locked_until = "locked_until",
    processed_at = "processed_at"
)]
struct TlsJob {
    #[field(id, generated)]
    id: i64,
    #[field(payload)]
    payload: Vec<u8>,
}

/// A rustls connector that trusts the test CA alone, on rustls's process-wide provider (`ring`,
/// the one the feature `rustls` enables, as `from_url_rustls` takes it).
fn connector(server: &TlsServer) -> MakeRustlsConnect {
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(rustls::pki_types::CertificateDer::from(
            server.ca_der().to_vec(),
        ))
        .expect("the test CA is a root rustls takes");
    let config = rustls::ClientConfig::builder()
        .with_root_certificates(roots)
        .with_no_client_auth();
    MakeRustlsConnect::new(config)
}

/// A session of the test's own over `tls`.
async fn connect(url: &str, tls: MakeRustlsConnect, server: &TlsServer) -> Client {
    let (client, connection) = tokio_postgres::connect(url, tls).await.unwrap_or_else(|e| {
        panic!(
            "connect over TLS to the throwaway server at {url}: {e:?}\nserver log:\n{}",
            server.log_tail()
        )
    });
    tokio::spawn(async move {
        let _ = connection.await;
    });
    client
}

async fn count(client: &Client, sql: &str) -> i64 {
    client
        .query_one(sql, &[])
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
        .get(0)
}

/// Why `broker` does not start; fails the test if it starts.
async fn start_error(broker: TokioPostgresBroker, what: &str) -> String {
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
    let server = TlsServer::start("tokio_postgres");

    // Without TLS the server finds no pg_hba.conf entry, and the start says so.
    let plain = start_error(
        TokioPostgresBroker::from_url(server.url("?sslmode=disable"), PoolConfig::new(1)),
        "from_url without TLS, on a server that takes TLS sessions only",
    )
    .await;
    eprintln!("from_url without TLS: {plain}");
    assert!(
        plain.contains("no pg_hba.conf entry") && plain.contains("no encryption"),
        "the start without TLS names the server's refusal: {plain}"
    );

    // Over rustls with the webpki roots, the test CA is unknown: the handshake fails.
    let untrusted = start_error(
        TokioPostgresBroker::from_url_rustls(server.url("?sslmode=require"), PoolConfig::new(1)),
        "from_url_rustls, whose roots do not hold the test CA",
    )
    .await;
    eprintln!("from_url_rustls, the test CA unknown: {untrusted}");
    assert!(
        untrusted.contains("TLS") && untrusted.contains("certificate"),
        "the start over TLS with an unknown CA names the certificate: {untrusted}"
    );

    // A session of the test's own, over TLS, makes the table and sees its own TLS.
    let helper = connect(
        &server.url("?sslmode=require&application_name=rs_tls_helper"),
        connector(&server),
        &server,
    )
    .await;
    helper.batch_execute(SCHEMA).await.expect("create tls_jobs");
    let ssl: bool = helper
        .query_one(
            "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()",
            &[],
        )
        .await
        .expect("pg_stat_ssl")
        .get(0);
    assert!(ssl, "the helper's session is a TLS session");

    let handle = TokioPostgresBroker::from_url_tls(
        server.url(&format!("?sslmode=require&application_name={APP}")),
        PoolConfig::new(4),
        connector(&server),
    )
    .handle();
    let seen = Seen::default();
    let handler = seen.clone();
    let service = RustStream::new(AppInfo::new("tokio-postgres-tls-test", "0.1.0"))
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
    let publisher = TokioPostgresPublisher::<TlsJob>::new(&handle);
    let processed = "SELECT COUNT(*) FROM tls_jobs WHERE processed_at IS NOT NULL";
    let run = async {
        for n in 0..JOBS {
            publisher
                .publish(Message::json(&Job { n }).unwrap())
                .await
                .expect("a publish over TLS");
        }
        let start = Instant::now();
        while count(&helper, processed).await < i64::from(JOBS) {
            assert!(
                start.elapsed() < WAIT,
                "every row settled within {WAIT:?}: handled {:?}",
                seen.all()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // The broker's sessions (its pool's and its listening session) are all TLS sessions.
        let sessions = helper
            .query_one(
                "SELECT COUNT(*) FILTER (WHERE s.ssl), COUNT(*) FILTER (WHERE NOT s.ssl)
                   FROM pg_stat_ssl s JOIN pg_stat_activity a ON a.pid = s.pid
                  WHERE a.application_name = $1",
                &[&APP],
            )
            .await
            .expect("the broker's sessions in pg_stat_ssl");
        let (tls, plain): (i64, i64) = (sessions.get(0), sessions.get(1));
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
            &helper,
            "SELECT COUNT(*) FROM tls_jobs WHERE processed_at IS NOT NULL AND locked_until IS NULL"
        )
        .await,
        i64::from(JOBS),
        "every row settled: marked processed, its lease cleared"
    );
    assert_eq!(
        count(&helper, "SELECT COUNT(*) FROM tls_jobs").await,
        i64::from(JOBS),
        "no row other than those published"
    );
}
