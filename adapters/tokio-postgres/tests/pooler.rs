//! Through a real PgBouncer (Debian's `pgbouncer`, which `scripts/test` installs where it is
//! missing), started by the test on a port of its own in front of a fresh PostgreSQL the test
//! binary starts (initdb, as the TLS tests do): in transaction pooling the advisory lock form
//! refuses to start, naming transaction pooling and leaving no lock on the server; in session
//! pooling it starts and serves every row. Both on the simple query protocol, the one
//! PgBouncer's transaction pooling serves.

mod common;

use std::time::{Duration, Instant};

use common::*;
use ruststream_conformance::servers::bouncer::{Bouncer, Pooling};
use ruststream_conformance::servers::postgres::TlsServer;
use ruststream_tokio_postgres::deadpool_postgres::PoolConfig;
use ruststream_tokio_postgres::prelude::*;
use ruststream_tokio_postgres::tokio_postgres;

/// A fresh PostgreSQL of this test binary's own, started by its first test and stopped once
/// the binary exits, and a schema of the test's own on it: the pooler stands in front of a
/// server that nothing else has configured.
async fn fresh_db(test: &str) -> Db {
    static SERVER: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    let url = SERVER.get_or_init(|| {
        let server = TlsServer::plain("pooler-tp");
        let url = server.url("");
        server.stop_at_exit();
        url
    });
    use_url(url.clone());
    let db = Db::new(test).await;
    let config: tokio_postgres::Config = url.parse().expect("the server's URL parses");
    assert_eq!(
        db.count("SELECT CAST(current_setting('port') AS BIGINT)")
            .await,
        i64::from(config.get_ports()[0]),
        "the test's schema is on the fresh server"
    );
    db
}

/// Advisory locks held by server sessions PgBouncer lent the test's clients, which carry the
/// test's application name (other users of the server are not counted).
async fn advisory_locks_held(db: &Db) -> i64 {
    db.advisory_locks().await
}

/// A lock a client takes through `bouncer` (in session pooling) is counted by
/// [`advisory_locks_held`], and its release too: the count sees the test's sessions.
async fn the_count_sees_a_lock_through(bouncer: &Bouncer, db: &Db) {
    let before = advisory_locks_held(db).await;
    let (client, connection) = tokio_postgres::connect(&bouncer.url(), tokio_postgres::NoTls)
        .await
        .expect("a client connects through PgBouncer");
    let connection = tokio::spawn(connection);
    client
        .simple_query("SELECT pg_advisory_lock(7, 7)")
        .await
        .expect("a lock through PgBouncer");
    assert_eq!(
        advisory_locks_held(db).await,
        before + 1,
        "a lock taken through PgBouncer is counted"
    );
    client
        .simple_query("SELECT pg_advisory_unlock(7, 7)")
        .await
        .expect("an unlock through PgBouncer");
    assert_eq!(
        advisory_locks_held(db).await,
        before,
        "its release is counted"
    );
    drop(client);
    let _ = connection.await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_advisory_form_refuses_transaction_pooling_and_runs_on_session_pooling() {
    let db = fresh_db("pooler").await;
    let before = advisory_locks_held(&db).await;

    // Transaction pooling: the start fails, naming it, and leaves no lock behind. The
    // listening session connects directly, so the session check is what refuses.
    let bouncer = Bouncer::start(Pooling::Transaction, &base_url(), &db.name);
    let direct: tokio_postgres::Config = base_url().parse().expect("the test URL parses");
    let broker = TokioPostgresBroker::from_url(bouncer.url(), PoolConfig::new(4))
        .simple_query(true)
        .listen_on(direct, tokio_postgres::NoTls);
    let started = broker
        .start(vec![subscription(
            Form::Advisory,
            Record::new(&Seen::default()),
            2,
        )])
        .await;
    let error = match started {
        Ok(running) => {
            running.shutdown().await;
            panic!("the advisory form started through PgBouncer in transaction pooling");
        }
        Err(error) => error.to_string(),
    };
    assert!(
        error.contains("transaction pooling") && error.contains("pool_mode = transaction"),
        "the error names transaction pooling: {error}"
    );
    assert!(
        error.contains("videos"),
        "the error names the table: {error}"
    );
    assert_eq!(
        advisory_locks_held(&db).await,
        before,
        "the session check left no lock on the server"
    );
    drop(bouncer);

    // Session pooling: the form starts and serves every row.
    let bouncer = Bouncer::start(Pooling::Session, &base_url(), &db.name);
    let seen = Seen::default();
    let broker =
        TokioPostgresBroker::from_url(bouncer.url(), PoolConfig::new(4)).simple_query(true);
    let running = broker
        .start(vec![subscription(Form::Advisory, Record::new(&seen), 2)])
        .await
        .expect("the advisory form starts through PgBouncer in session pooling");
    let publisher = running.publisher::<Video>();
    for n in 0..12 {
        publisher
            .publish(message(Form::Advisory, n))
            .await
            .expect("a publish");
    }
    assert!(
        eventually(WAIT, || seen.len() >= 12).await,
        "12 rows served, {} seen",
        seen.len()
    );
    running.shutdown().await;
    assert_eq!(db.wait_count("SELECT COUNT(*) FROM videos", 0).await, 0);
    assert_eq!(advisory_locks_held(&db).await, before, "no lock left");
    // Last, as its client's end resets the session's search path (PgBouncer's
    // `DISCARD ALL`).
    the_count_sees_a_lock_through(&bouncer, &db).await;
    drop(bouncer);
    db.finish().await;
}

/// The row lock form with an attempt column marks the rows its counts count with session
/// locks until their locks: through transaction pooling a mark would stay on a server session
/// other clients use, and its row would be passed over for good. The start refuses, naming the
/// form and transaction pooling, and leaves no lock; through session pooling the form serves,
/// each row at attempt 1, and no mark is left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_row_lock_form_with_attempts_refuses_transaction_pooling() {
    let db = fresh_db("pooler_rowlock").await;
    let before = advisory_locks_held(&db).await;
    let bouncer = Bouncer::start(Pooling::Transaction, &base_url(), &db.name);
    let direct: tokio_postgres::Config = base_url().parse().expect("the test URL parses");
    let broker = TokioPostgresBroker::from_url(bouncer.url(), PoolConfig::new(4))
        .simple_query(true)
        .listen_on(direct, tokio_postgres::NoTls);
    let started = broker
        .start(vec![subscription(
            Form::RowLock,
            Record::new(&Seen::default()),
            2,
        )])
        .await;
    let error = match started {
        Ok(running) => {
            running.shutdown().await;
            panic!("the row lock form started through PgBouncer in transaction pooling");
        }
        Err(error) => error.to_string(),
    };
    assert!(
        error.contains("row lock form marks each row it counts")
            && error.contains("pool_mode = transaction")
            && error.contains("invoices"),
        "the error names the form, transaction pooling and the table: {error}"
    );
    assert_eq!(advisory_locks_held(&db).await, before, "no lock left");
    drop(bouncer);

    let bouncer = Bouncer::start(Pooling::Session, &base_url(), &db.name);
    let seen = Seen::default();
    let broker =
        TokioPostgresBroker::from_url(bouncer.url(), PoolConfig::new(4)).simple_query(true);
    let running = broker
        .start(vec![subscription(Form::RowLock, Record::new(&seen), 2)])
        .await
        .expect("the row lock form starts through PgBouncer in session pooling");
    let publisher = running.publisher::<Invoice>();
    for n in 0..12 {
        publisher
            .publish(message(Form::RowLock, n))
            .await
            .expect("a publish");
    }
    assert!(
        eventually(WAIT, || seen.len() >= 12).await,
        "12 rows served, {} seen",
        seen.len()
    );
    running.shutdown().await;
    assert!(
        seen.all().iter().all(|&(_, attempt)| attempt == 1),
        "each row at attempt 1: {:?}",
        seen.all()
    );
    assert_eq!(db.wait_count("SELECT COUNT(*) FROM invoices", 0).await, 0);
    assert_eq!(advisory_locks_held(&db).await, before, "no mark left");
    // Last, as its client's end resets the session's search path (PgBouncer's
    // `DISCARD ALL`).
    the_count_sees_a_lock_through(&bouncer, &db).await;
    drop(bouncer);
    db.finish().await;
}

/// A listening session through transaction pooling hears nothing: its `LISTEN` stays on a
/// server session other clients then use. The start sends a notification of its own through
/// the pool and, not hearing it, refuses, naming transaction pooling; the lease form, which
/// needs no session of its own, shows it apart from the advisory form's session check. In
/// session pooling the same start hears it and serves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listener_that_hears_nothing_through_transaction_pooling_refuses_the_start() {
    let db = fresh_db("pooler_listen").await;
    let bouncer = Bouncer::start(Pooling::Transaction, &base_url(), &db.name);
    let broker =
        TokioPostgresBroker::from_url(bouncer.url(), PoolConfig::new(4)).simple_query(true);
    let since = Instant::now();
    let started = broker
        .start(vec![subscription(
            Form::Lease,
            Record::new(&Seen::default()),
            2,
        )])
        .await;
    let error = match started {
        Ok(running) => {
            running.shutdown().await;
            panic!("the lease form started with a listener that hears nothing");
        }
        Err(error) => error.to_string(),
    };
    assert!(
        error.contains("did not hear") && error.contains("pool_mode = transaction"),
        "the error names the deaf listener and transaction pooling: {error}"
    );
    assert!(
        since.elapsed() < Duration::from_secs(30),
        "refused within the probe's wait"
    );
    drop(bouncer);

    let bouncer = Bouncer::start(Pooling::Session, &base_url(), &db.name);
    let seen = Seen::default();
    let broker =
        TokioPostgresBroker::from_url(bouncer.url(), PoolConfig::new(4)).simple_query(true);
    let running = broker
        .start(vec![subscription(Form::Lease, Record::new(&seen), 2)])
        .await
        .expect("the lease form starts through session pooling: its listener hears");
    let publisher = running.publisher::<Export>();
    for n in 0..4 {
        publisher
            .publish(message(Form::Lease, n))
            .await
            .expect("a publish");
    }
    assert!(
        eventually(WAIT, || seen.len() >= 4).await,
        "4 rows served, {} seen",
        seen.len()
    );
    running.shutdown().await;
    drop(bouncer);
    db.finish().await;
}

/// The lease form holds no session lock: through transaction pooling, under the simple query
/// protocol with the listening session on a direct connection, it starts and serves every row
/// published through the pooler, each once, and settles them. Under the extended protocol
/// (deadpool-postgres's statements, prepared and kept per connection) the same start refuses
/// at once, naming transaction pooling and `simple_query(true)`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lease_form_works_through_transaction_pooling_under_the_simple_query_protocol() {
    const N: u32 = 20;
    let db = fresh_db("pooler_lease").await;
    let bouncer = Bouncer::start(Pooling::Transaction, &base_url(), &db.name);
    let direct: tokio_postgres::Config = base_url().parse().expect("the test URL parses");

    let since = Instant::now();
    let started = TokioPostgresBroker::from_url(bouncer.url(), PoolConfig::new(4))
        .listen_on(direct.clone(), tokio_postgres::NoTls)
        .start(vec![subscription(
            Form::Lease,
            Record::new(&Seen::default()),
            2,
        )])
        .await;
    let error = match started {
        Ok(running) => {
            running.shutdown().await;
            panic!("the lease form started on prepared statements through transaction pooling");
        }
        Err(error) => error.to_string(),
    };
    assert!(
        error.contains("transaction pooling")
            && error.contains("simple_query(true)")
            && error.contains("exports"),
        "the error names transaction pooling, its cure and the table: {error}"
    );
    assert!(
        since.elapsed() < Duration::from_secs(15),
        "refused at once, not retried ({:?})",
        since.elapsed()
    );

    let seen = Seen::default();
    let running = TokioPostgresBroker::from_url(bouncer.url(), PoolConfig::new(4))
        .simple_query(true)
        .listen_on(direct, tokio_postgres::NoTls)
        .start(vec![subscription(Form::Lease, Record::new(&seen), 2)])
        .await
        .expect("the lease form starts through transaction pooling");
    let publisher = running.publisher::<Export>();
    for n in 0..N {
        publisher
            .publish(message(Form::Lease, n))
            .await
            .unwrap_or_else(|e| panic!("publish {n} through PgBouncer: {e}"));
    }
    assert!(
        eventually(WAIT, || seen.len() >= N as usize).await,
        "{N} rows served, {} seen",
        seen.len()
    );
    // Settled: `exports` keeps its rows, marked processed.
    assert_eq!(
        db.wait_count("SELECT COUNT(*) FROM exports WHERE processed_at IS NULL", 0)
            .await,
        0
    );
    running.shutdown().await;
    let mut served: Vec<u32> = seen.all().iter().map(|&(n, _)| n).collect();
    served.sort_unstable();
    assert_eq!(served, (0..N).collect::<Vec<_>>(), "each row once");
    assert!(
        seen.all().iter().all(|&(_, attempt)| attempt == 1),
        "each row at attempt 1: {:?}",
        seen.all()
    );
    assert_eq!(advisory_locks_held(&db).await, 0, "no lock left");
    drop(bouncer);
    db.finish().await;
}
