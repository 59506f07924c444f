//! A lock of the service's own ([custom locks](https://github.com/ruststream/ruststream/blob/main/docs/src/keys.md#custom-locks)): billing holds an account's key in `held_keys` while
//! it changes the account, and a payout of that account waits until billing releases the key.
//!
//! ```sh
//! cargo run --example sqlx_forms_lock
//! ```
//!
//! The service runs on `payouts.db` until SIGINT or SIGTERM, and pays out the rows of
//! `payouts`, such as
//! `INSERT INTO payouts (account_id, payload) VALUES (1, '{"cents":100}')`, each once no key
//! `accounts-<account_id>` is in `held_keys`.
//!
//! The table holds only what the example shows: it names no `failed_at` column, so a job
//! that fails returns to the queue. A table of yours names `failed_at` and `error` too, so a
//! job that keeps failing is kept aside ([Failures](https://github.com/ruststream/ruststream/blob/main/docs/src/failures.md#failed-rows-are-kept)).

use ruststream::core::Dialect;
use ruststream_sqlx::prelude::*;
use ruststream_sqlx::{Lock, Unlock};
use sqlx::sqlite::SqlitePoolOptions;
use sqlx::{AssertSqlSafe, Connection};
use sqlx::{Sqlite, SqliteConnection};

/// One row of `payouts`, held by the key of its account.
#[derive(Inbox, sqlx::FromRow)]
#[inbox(
    table = "payouts",
    advisory_lock = "accounts-{account_id}",
    custom(lock, unlock)
)]
struct Payout {
    #[field(id, generated)]
    id: i64,
    account_id: i64,
    #[field(payload)]
    payload: Vec<u8>,
}

/// Billing holds an account's key in `held_keys` while it changes the account, so a payout
/// never runs beside a billing run of its account.
impl Lock<Sqlite> for Payout {
    async fn lock(conn: &mut SqliteConnection, key: &str) -> Result<bool, sqlx::Error> {
        let taken = sqlx::query("INSERT OR IGNORE INTO held_keys (key) VALUES (?)")
            .bind(key)
            .execute(conn)
            .await?;
        Ok(taken.rows_affected() == 1)
    }
}

impl Unlock<Sqlite> for Payout {
    async fn unlock(conn: &mut SqliteConnection, key: &str) -> Result<bool, sqlx::Error> {
        let released = sqlx::query("DELETE FROM held_keys WHERE key = ?")
            .bind(key)
            .execute(conn)
            .await?;
        Ok(released.rows_affected() == 1)
    }
}

#[subscriber(InboxQueue::<Payout>::new("payouts"))]
async fn pay(transfer: &Transfer) -> HandlerOutcome {
    tracing::info!(transfer.cents, "paying out");
    HandlerOutcome::ack()
}

/// The service on the database `url` names.
pub fn service(url: &str) -> RustStream {
    let schema_url = url.to_owned();
    // Nothing connects here: the broker builds its pool when the service starts.
    let broker = SqlxBroker::from_url(url, SqlitePoolOptions::new());
    RustStream::new(AppInfo::new("payouts", "0.1.0"))
        // The tables, created before the subscription checks them.
        .on_startup(async move |()| {
            let mut conn = SqliteConnection::connect(&schema_url).await?;
            sqlx::raw_sql(HELD_KEYS).execute(&mut conn).await?;
            sqlx::raw_sql(AssertSqlSafe(payouts_schema()))
                .execute(&mut conn)
                .await?;
            conn.close().await
        })
        .with_broker(broker, |b| {
            b.include(pay);
        })
}

/// The message of a row: the transfer to pay out.
#[derive(serde::Serialize, serde::Deserialize)]
pub struct Transfer {
    /// The amount, in cents.
    pub cents: i64,
}

/// The keys billing and the payouts hold.
const HELD_KEYS: &str = "CREATE TABLE IF NOT EXISTS held_keys (key TEXT PRIMARY KEY)";

/// The payouts' table, as its description writes it; `account_id`, the key's column, holds
/// integers.
fn payouts_schema() -> String {
    Payout::TABLE
        .ddl(Dialect::Sqlite)
        .column_type("account_id", "INTEGER NOT NULL")
        .to_string()
}

/// The service on `payouts.db`, until SIGINT or SIGTERM.
#[ruststream::app]
fn app() -> impl App {
    service("sqlite:payouts.db?mode=rwc")
}
