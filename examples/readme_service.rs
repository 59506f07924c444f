//! A welcome email for every signup, sent by a job queue in the same PostgreSQL database.

use ruststream_sqlx::prelude::*;
use sqlx::PgPool;

/// The jobs' table: a retry waits in `due_at`; a job that fails for good stays, with its error.
#[derive(Inbox, sqlx::FromRow)]
#[inbox(
    table = "email_jobs",
    due = "due_at",
    failed_at = "failed_at",
    error = "error"
)]
struct EmailJob {
    #[field(id, generated)]
    id: i64,
    #[field(attempt, generated)]
    attempt: i32,
    #[field(payload)]
    payload: Vec<u8>,
}

/// `Ok` deletes the job. An error retries it with backoff; the fifth failure keeps it failed.
#[subscriber(InboxQueue::<EmailJob>::new("emails"))]
async fn send(to: &String) -> Result<(), BoxError> {
    println!("sent a welcome to {to}");
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let pool = PgPool::connect(&std::env::var("DATABASE_URL")?).await?;
    let signups = pool.clone();
    RustStream::new(AppInfo::new("mailer", "0.1.0"))
        // A signup and its email commit together, or neither does.
        .on_started(async move || {
            let mut tx = signups.begin().await?;
            sqlx::query("CREATE TABLE IF NOT EXISTS users (email TEXT)")
                .execute(&mut *tx)
                .await?;
            sqlx::query("INSERT INTO users VALUES ('ada@example.com')")
                .execute(&mut *tx)
                .await?;
            let email = Message::json(&"ada@example.com")?;
            SqlxOutbox::<EmailJob, Postgres>::new()
                .publish(&mut tx, email)
                .await?;
            tx.commit().await?;
            Ok::<(), BoxError>(())
        })
        .with_broker(SqlxBroker::new(pool), |b| {
            b.include(send.workers(4).max_attempts(5).ensure_schema());
        })
        // Until SIGINT or SIGTERM; then the jobs in work finish.
        .run()
        .await?;
    Ok(())
}
