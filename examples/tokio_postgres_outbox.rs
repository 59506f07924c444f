//! The outbox on PostgreSQL with tokio-postgres: a shop writes an order and the job that mails
//! its receipt in one transaction, so a receipt goes out for every order that commits and for
//! no order that rolls back. A service sends the receipts as they commit: the notification that
//! wakes it rides in the order's transaction.
//!
//! ```sh
//! cargo run --example tokio_postgres_outbox -- postgres://postgres@127.0.0.1:5432/test
//! ```

use std::time::Duration;

use ruststream::core::Dialect;
use ruststream_tokio_postgres::TokioPostgresOutbox;
use ruststream_tokio_postgres::deadpool_postgres::{Manager, Pool, PoolConfig};
use ruststream_tokio_postgres::prelude::*;
use ruststream_tokio_postgres::tokio_postgres::{Config, NoTls};
use serde::{Deserialize, Serialize};
use std::future::ready;

/// The shop's table; the jobs' table comes from its description (`SendReceipt::TABLE.ddl(..)`).
const ORDERS: &str = "CREATE TABLE IF NOT EXISTS orders (
    id BIGINT PRIMARY KEY,
    email TEXT NOT NULL,
    cents BIGINT NOT NULL CHECK (cents > 0)
)";

/// One row of `receipt_jobs`, in the row lock form.
#[derive(Inbox, Deserialize)]
#[inbox(table = "receipt_jobs", failed_at = "failed_at", error = "error")]
pub struct SendReceipt {
    #[field(id, generated)]
    id: i64,
    #[field(payload)]
    payload: Vec<u8>,
}

/// The message: whom to mail the receipt of which order.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Receipt {
    /// The order.
    pub order: i64,
    /// Where to mail it.
    pub email: String,
}

/// An order as the shop takes it.
#[derive(Clone, Debug)]
pub struct Order {
    /// Its number.
    pub id: i64,
    /// The customer's address.
    pub email: String,
    /// What it costs, in cents: more than zero, or the database refuses it.
    pub cents: i64,
}

/// Writes the order and its receipt's job in one transaction: both commit, or, when the
/// database refuses the order, neither is written.
pub async fn place_order(pool: &Pool, order: &Order) -> Result<(), Box<dyn std::error::Error>> {
    let mut client = pool.get().await?;
    let tx = client.transaction().await?;
    tx.execute(
        "INSERT INTO orders (id, email, cents) VALUES ($1, $2, $3)",
        &[&order.id, &order.email, &order.cents],
    )
    .await?;
    let receipt = Receipt {
        order: order.id,
        email: order.email.clone(),
    };
    TokioPostgresOutbox::<SendReceipt>::new()
        .publish(&*tx, Message::json(&receipt)?)
        .await?;
    tx.commit().await?;
    Ok(())
}

/// Where the receipts go: here, to the caller, in order.
pub type Sent = tokio::sync::mpsc::UnboundedSender<Receipt>;

/// Mails a receipt (here: hands it to `sent`).
struct Mail {
    sent: Sent,
}

impl Handle<Receipt> for Mail {
    fn handle(
        &self,
        receipt: &Receipt,
        _outs: &(),
        _ctx: &mut Context<'_>,
    ) -> impl Future<Output = Result<(), HandlerOutcome>> {
        tracing::info!(receipt.order, receipt.email, "mailing a receipt");
        let _ = self.sent.send(receipt.clone());
        ready(Ok(()))
    }
}

/// The service that mails the receipts, on the database `url` names. It polls once a minute:
/// a receipt goes out when its order's transaction commits, woken by the notification that
/// rode in it.
pub fn service(url: &str, sent: Sent) -> RustStream {
    let broker = TokioPostgresBroker::from_url(url, PoolConfig::new(4));
    RustStream::new(AppInfo::new("receipts", "0.1.0")).with_broker(broker, move |b| {
        let mail = subscriber("receipts", Mail { sent })
            .map_source(|_| InboxQueue::<SendReceipt>::new("receipts"))
            .poll_interval(Duration::from_secs(60));
        b.include(mail.build());
    })
}

/// Creates the tables, runs the service, and places `orders` orders, every fifth of which
/// the database refuses (it costs nothing). Answers the receipts sent once every order that
/// committed has one.
pub async fn run(url: &str, orders: i64) -> Result<Vec<Receipt>, Box<dyn std::error::Error>> {
    let config: Config = url.parse()?;
    let pool = Pool::builder(Manager::new(config, NoTls))
        .max_size(4)
        .build()?;
    let receipt_jobs = SendReceipt::TABLE.ddl(Dialect::Postgres);
    pool.get()
        .await?
        .batch_execute(&format!("{ORDERS};\n{receipt_jobs}"))
        .await?;
    let first: i64 = pool
        .get()
        .await?
        .query_one("SELECT COALESCE(MAX(id), 0) + 1 FROM orders", &[])
        .await?
        .get(0);
    let (sent, mut mailed) = tokio::sync::mpsc::unbounded_channel();
    let mut receipts = Vec::new();
    let placed = async {
        let mut committed = 0;
        for id in first..first + orders {
            let order = Order {
                id,
                email: format!("customer{id}@example.com"),
                cents: if id % 5 == 0 { 0 } else { 100 * id },
            };
            match place_order(&pool, &order).await {
                Ok(()) => committed += 1,
                Err(error) => tracing::info!(order.id, %error, "the order was refused"),
            }
        }
        while receipts.len() < committed {
            let Some(receipt) = mailed.recv().await else {
                break;
            };
            receipts.push(receipt);
        }
    };
    service(url, sent.clone())
        .shutdown_timeout(Duration::from_secs(10))
        .run_until(placed)
        .await?;
    pool.close();
    Ok(receipts)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "postgres://postgres@127.0.0.1:5432/test".into());
    let sent = run(&url, 20).await?;
    println!(
        "{} receipts sent for 20 orders, of which 4 were refused",
        sent.len()
    );
    Ok(())
}
