//! A web server and its jobs in one process: `POST /signups` writes the user and the job that
//! welcomes them in one sqlx transaction, so a welcome goes out for every signup that commits
//! and for none that fails; the subscription sends the welcomes. SIGINT or SIGTERM stops both:
//! the web server finishes the requests it is answering, the subscription the jobs in work.
//!
//! ```sh
//! cargo run --example axum_service -- postgres://postgres@127.0.0.1:5432/test 127.0.0.1:3000
//! curl -X POST 127.0.0.1:3000/signups -H 'content-type: application/json' \
//!      -d '{"email": "ada@example.com"}'
//! ```

use std::sync::{Arc, Mutex};

use axum::extract::State as Shared;
use axum::http::StatusCode;
use axum::routing::post;
use axum::{Json, Router};
use ruststream::core::Dialect;
use ruststream_sqlx::prelude::*;
use serde::{Deserialize, Serialize};
use sqlx::AssertSqlSafe;
use sqlx::postgres::{PgPool, PgPoolOptions};

/// The users' table; the jobs' table comes from its description (`WelcomeJob::TABLE.ddl(..)`).
const SIGNUPS: &str = "CREATE TABLE IF NOT EXISTS signups (
    id BIGSERIAL PRIMARY KEY,
    email TEXT NOT NULL UNIQUE CHECK (email LIKE '%@%')
)";

/// One row of `welcome_emails`, in the row lock form, counting its attempts; a retry waits in
/// `due_at`, and a welcome that fails for good stays, marked failed with its error.
#[derive(Inbox, sqlx::FromRow)]
#[inbox(
    table = "welcome_emails",
    due = "due_at",
    failed_at = "failed_at",
    error = "error"
)]
pub struct WelcomeJob {
    #[field(id, generated)]
    id: i64,
    #[field(attempt, generated)]
    attempt: i32,
    #[field(payload)]
    payload: Vec<u8>,
}

/// A signup as the web client posts it, and the job's message.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Signup {
    /// The new user's address.
    pub email: String,
}

/// Where the welcomes go; here, a list the example prints and its test reads.
pub type Outbox = Arc<Mutex<Vec<String>>>;

/// Sends one welcome: a job's handler, with `?` for its errors (an error retries the job).
#[subscriber(InboxQueue::<WelcomeJob>::new("welcomes"))]
async fn welcome(signup: &Signup, State(sent): State<Outbox>) -> Result<(), BoxError> {
    if signup.email.is_empty() {
        return Err("no address to welcome".into());
    }
    println!("welcomed {}", signup.email);
    sent.lock()
        .map_err(|_| "the outbox is poisoned")?
        .push(signup.email.clone());
    Ok(())
}

/// `POST /signups`: the user and their welcome's job in one transaction. 201 once both have
/// committed; 422 where the database refuses the signup (a taken or malformed address), and
/// then no job is written either.
async fn sign_up(Shared(pool): Shared<PgPool>, Json(signup): Json<Signup>) -> StatusCode {
    match write_signup(&pool, &signup).await {
        Ok(()) => StatusCode::CREATED,
        Err(error) => {
            tracing::info!(signup.email, %error, "signup refused");
            StatusCode::UNPROCESSABLE_ENTITY
        }
    }
}

async fn write_signup(pool: &PgPool, signup: &Signup) -> Result<(), BoxError> {
    let mut tx = pool.begin().await?;
    sqlx::query("INSERT INTO signups (email) VALUES ($1)")
        .bind(&signup.email)
        .execute(&mut *tx)
        .await?;
    SqlxOutbox::<WelcomeJob, Postgres>::new()
        .publish(&mut tx, Message::json(signup)?)
        .await?;
    tx.commit().await?;
    Ok(())
}

/// Creates the tables on `pool`'s database.
pub async fn create_tables(pool: &PgPool) -> Result<(), BoxError> {
    sqlx::raw_sql(SIGNUPS).execute(pool).await?;
    let jobs = WelcomeJob::TABLE.ddl(Dialect::Postgres).to_string();
    sqlx::raw_sql(AssertSqlSafe(jobs)).execute(pool).await?;
    Ok(())
}

/// Serves `listener` and the welcomes on `pool` until `stop` completes (the example passes
/// `ruststream::termination()`, SIGINT or SIGTERM): then the web server stops taking
/// connections and finishes its requests, while the service finishes its jobs in work.
pub async fn serve(
    pool: PgPool,
    listener: tokio::net::TcpListener,
    sent: Outbox,
    stop: impl Future<Output = ()> + Send + 'static,
) -> Result<(), BoxError> {
    use futures::FutureExt;
    let stop = stop.shared();
    let app = Router::new()
        .route("/signups", post(sign_up))
        .with_state(pool.clone());
    let web = axum::serve(listener, app).with_graceful_shutdown(stop.clone());
    // The jobs share the web server's pool: one pool, one set of connections to size.
    let jobs = RustStream::new(AppInfo::new("signups", "0.1.0"))
        .with_state(sent)
        .with_broker(SqlxBroker::new(pool), |b| {
            b.include(welcome.workers(4).max_attempts(5));
        })
        .run_until(stop);
    let (web, jobs) = tokio::join!(web.into_future(), jobs);
    web?;
    jobs?;
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let mut args = std::env::args().skip(1);
    let url = args
        .next()
        .unwrap_or_else(|| "postgres://postgres@127.0.0.1:5432/test".into());
    let addr = args.next().unwrap_or_else(|| "127.0.0.1:3000".into());
    let pool = PgPoolOptions::new()
        .max_connections(12)
        .connect(&url)
        .await?;
    create_tables(&pool).await?;
    let listener = tokio::net::TcpListener::bind(&addr).await?;
    let addr = listener.local_addr()?;
    println!("listening on http://{addr}; POST /signups {{\"email\": ..}}");
    let sent = Outbox::default();
    serve(pool, listener, sent.clone(), ruststream::termination()).await?;
    println!(
        "stopped; {} welcome(s) sent",
        sent.lock().expect("not poisoned").len()
    );
    Ok(())
}
