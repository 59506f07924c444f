//! A handler takes a transaction on its delivery's connection (`SqlxClaim`): in the row lock
//! form its claim's, in the advisory lock form one begun where the key is held, in the lease
//! form one begun on a connection taken for it, whose settlement is fenced by the lease. What the
//! handler writes in it commits with the acknowledgement, rolls back with a retry, and is gone
//! with a process killed between the write and the commit. Both or neither, never one.
//!
//! The kill: the test binary runs again as a child (`RS_SQLX_CLAIM_CHILD` names the broker's
//! URL), whose handler writes its effect in the claim's transaction, marks that it did on a
//! connection of its own, and waits; the parent kills it with SIGKILL once the mark is there.

use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use ruststream::adapter::TakesRows;
use ruststream::{Context, Handle, HandlerOutcome, InboxContext, IntoSubscription, Message};
use ruststream_sqlx::prelude::*;
use ruststream_sqlx::{SqlxClaim, SqlxDatabase, sqlx};
use sqlx::AssertSqlSafe;

use crate::common::*;

mod rows {
    crate::tables!("sqlx_claim");
}
use rows::{Keyed, Leased, RowLock};

const CHILD: &str = "RS_SQLX_CLAIM_CHILD";

/// Writes `effects (n)` for its job in the claim's transaction; then retries, waits to be
/// killed, or acknowledges, by the attempt and the mode.
struct Effect<DB: SqlxDatabase> {
    /// The child: after the write, mark it on a connection of its own and wait.
    mark: Option<sqlx::Pool<DB>>,
    /// Retry the attempts below this one, after writing.
    retry_below: i64,
    handled: Arc<AtomicUsize>,
}

impl<DB> Handle<Job, (), (), InboxContext> for Effect<DB>
where
    DB: SqlxDatabase,
    for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
    for<'c> &'c sqlx::Pool<DB>: sqlx::Executor<'c, Database = DB>,
{
    async fn handle(
        &self,
        job: &Job,
        _outs: &(),
        ctx: &mut Context<'_, InboxContext>,
    ) -> Result<(), HandlerOutcome> {
        let attempt = ctx.kind().info().attempt.unwrap_or(0);
        let mut claim =
            <SqlxClaim<DB> as ruststream::FromContext<InboxContext>>::from_context(ctx).await?;
        // A second attempt's write would break the primary key if the first one's stayed.
        sqlx::raw_sql(AssertSqlSafe(format!(
            "INSERT INTO effects (n, attempt) VALUES ({}, {attempt})",
            job.n
        )))
        .execute(&mut *claim)
        .await
        .map_err(|e| HandlerOutcome::retry().with_error(e))?;
        if let Some(pool) = &self.mark {
            sqlx::raw_sql(AssertSqlSafe(format!(
                "INSERT INTO marks (n) VALUES ({})",
                job.n
            )))
            .execute(pool)
            .await
            .expect("the mark");
            tokio::time::sleep(Duration::from_secs(600)).await;
        }
        self.handled.fetch_add(1, Ordering::SeqCst);
        if attempt < self.retry_below {
            return Err(HandlerOutcome::retry().with_error("not yet"));
        }
        Ok(())
    }
}

fn subscription<T, DB>(effect: Effect<DB>) -> ruststream::Subscription<SqlxBroker<DB>>
where
    T: ruststream::InboxTable + ruststream::PayloadRow + ruststream::DecodesAs<Job>,
    DB: SqlxDatabase,
    SqlxBroker<DB>: TakesRows<T>,
    for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
    for<'c> &'c sqlx::Pool<DB>: sqlx::Executor<'c, Database = DB>,
{
    ruststream::subscriber("claims", effect)
        .map_source(|_| InboxQueue::<T>::new("claims"))
        .poll_interval(POLL)
        // The lease form: the killed child's lease runs out soon after the kill.
        .lease(Duration::from_secs(3))
        .retry_policy(ruststream::RetryPolicy::immediate())
        .into_subscription()
}

async fn until<F: Future<Output = bool>>(what: &str, mut check: impl FnMut() -> F) {
    let since = Instant::now();
    while !check().await {
        assert!(since.elapsed() < WAIT, "timed out waiting until {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The child: the service, whose handler writes, marks and waits to be killed.
async fn child<T, DB>(url: &str)
where
    T: ruststream::InboxTable + ruststream::PayloadRow + ruststream::DecodesAs<Job>,
    DB: SqlxDatabase,
    SqlxBroker<DB>: TakesRows<T>,
    for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
    for<'c> &'c sqlx::Pool<DB>: sqlx::Executor<'c, Database = DB>,
{
    let mark = sqlx::pool::PoolOptions::<DB>::new()
        .max_connections(1)
        .connect(url)
        .await
        .expect("the mark's pool");
    let effect = Effect {
        mark: Some(mark),
        retry_below: 0,
        handled: Arc::default(),
    };
    let broker = SqlxBroker::<DB>::from_url(url, sqlx::pool::PoolOptions::new().max_connections(4));
    let _running = broker
        .start([subscription::<T, DB>(effect)])
        .await
        .expect("the child's broker starts");
    tokio::time::sleep(Duration::from_secs(60)).await;
    eprintln!("the child was not killed within a minute");
    std::process::exit(3);
}

/// The parent: job 1 in the table; the child killed between its write and the commit leaves
/// neither; a service whose handler writes and retries once, then writes and acknowledges,
/// leaves the row deleted and exactly the last attempt's write.
async fn writes_commit_with_the_acknowledgement<T, D>(db: &D, test: &str, url: &str, table: &str)
where
    T: ruststream::InboxTable + ruststream::PayloadRow + ruststream::DecodesAs<Job>,
    D: TestDb,
    SqlxBroker<D::DB>: TakesRows<T>,
    for<'c> &'c mut <D::DB as sqlx::Database>::Connection: sqlx::Executor<'c, Database = D::DB>,
    for<'c> &'c sqlx::Pool<D::DB>: sqlx::Executor<'c, Database = D::DB>,
{
    db.exec(&schema(db.dialect(), rows::PREFIX)).await;
    db.exec("CREATE TABLE effects (n BIGINT PRIMARY KEY, attempt BIGINT NOT NULL)")
        .await;
    db.exec("CREATE TABLE marks (n BIGINT NOT NULL)").await;
    let running = db.broker().start([]).await.expect("the broker starts");
    let mut job = Message::json(&Job { n: 1 }).unwrap();
    if table.ends_with("_keyed") {
        job = job.column("k", "one");
    }
    running.publisher::<T>().publish(job).await.expect("job 1");
    running.shutdown().await;

    let mut child = Command::new(std::env::current_exe().expect("the test binary"))
        .args([test, "--exact", "--nocapture"])
        .env(CHILD, url)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("the child starts");
    until("the child's handler wrote and marked it", || async {
        db.scalar("SELECT COUNT(*) FROM marks").await == 1
    })
    .await;
    child.kill().expect("SIGKILL");
    child.wait().expect("the child ends");
    until("the child's transaction is rolled back", || async {
        db.scalar("SELECT COUNT(*) FROM effects").await == 0
            && db.scalar(&format!("SELECT COUNT(*) FROM {table}")).await == 1
    })
    .await;

    let handled = Arc::new(AtomicUsize::new(0));
    let effect = Effect::<D::DB> {
        mark: None,
        retry_below: 3,
        handled: handled.clone(),
    };
    let running = db
        .broker()
        .start([subscription::<T, D::DB>(effect)])
        .await
        .expect("the broker starts");
    until("the row is settled", || async {
        db.scalar(&format!("SELECT COUNT(*) FROM {table}")).await == 0
    })
    .await;
    running.shutdown().await;
    assert_eq!(handled.load(Ordering::SeqCst), 2, "attempts 2 and 3");
    assert_eq!(
        db.scalar("SELECT COUNT(*) FROM effects WHERE n = 1 AND attempt = 3")
            .await,
        1,
        "the acknowledged attempt's write, once"
    );
    assert_eq!(
        db.scalar("SELECT COUNT(*) FROM effects").await,
        1,
        "nothing of the killed attempt or the retried one"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres() {
    if let Ok(url) = std::env::var(CHILD) {
        return child::<RowLock, Postgres>(&url).await;
    }
    let db = Pg::new("pg_claim").await;
    let url = db.broker_url();
    writes_commit_with_the_acknowledgement::<RowLock, _>(
        &db,
        "claim::postgres",
        &url,
        "sqlx_claim_rowlock",
    )
    .await;
    db.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_advisory() {
    if let Ok(url) = std::env::var(CHILD) {
        return child::<Keyed, Postgres>(&url).await;
    }
    let db = Pg::new("pg_claim_adv").await;
    let url = db.broker_url();
    writes_commit_with_the_acknowledgement::<Keyed, _>(
        &db,
        "claim::postgres_advisory",
        &url,
        "sqlx_claim_keyed",
    )
    .await;
    db.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb() {
    if let Ok(url) = std::env::var(CHILD) {
        return child::<RowLock, MySql>(&url).await;
    }
    let db = My::new("my_claim").await;
    let url = sqlx::ConnectOptions::to_url_lossy(&db.options).to_string();
    writes_commit_with_the_acknowledgement::<RowLock, _>(
        &db,
        "claim::mariadb",
        &url,
        "sqlx_claim_rowlock",
    )
    .await;
    db.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_advisory() {
    if let Ok(url) = std::env::var(CHILD) {
        return child::<Keyed, MySql>(&url).await;
    }
    let db = My::new("my_claim_adv").await;
    let url = sqlx::ConnectOptions::to_url_lossy(&db.options).to_string();
    writes_commit_with_the_acknowledgement::<Keyed, _>(
        &db,
        "claim::mariadb_advisory",
        &url,
        "sqlx_claim_keyed",
    )
    .await;
    db.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_lease() {
    if let Ok(url) = std::env::var(CHILD) {
        return child::<Leased, Postgres>(&url).await;
    }
    let db = Pg::new("pg_claim_lease").await;
    let url = db.broker_url();
    writes_commit_with_the_acknowledgement::<Leased, _>(
        &db,
        "claim::postgres_lease",
        &url,
        "sqlx_claim_lease",
    )
    .await;
    db.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_lease() {
    if let Ok(url) = std::env::var(CHILD) {
        return child::<Leased, MySql>(&url).await;
    }
    let db = My::new("my_claim_lease").await;
    let url = sqlx::ConnectOptions::to_url_lossy(&db.options).to_string();
    writes_commit_with_the_acknowledgement::<Leased, _>(
        &db,
        "claim::mariadb_lease",
        &url,
        "sqlx_claim_lease",
    )
    .await;
    db.drop().await;
}
