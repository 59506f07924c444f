//! The outbox on SQLite with rusqlite: a shop writes an order and the job that mails its
//! receipt in one transaction, so a receipt goes out for every order that commits and for no
//! order that rolls back. The shop's code is plain blocking rusqlite; a service beside it
//! sends the receipts.
//!
//! ```sh
//! cargo run --example rusqlite_outbox
//! ```

use std::path::{Path, PathBuf};
use std::time::Duration;

use ruststream::core::Dialect;
use ruststream_rusqlite::RusqliteOutbox;
use ruststream_rusqlite::prelude::*;
use ruststream_rusqlite::rusqlite::Connection;
use serde::{Deserialize, Serialize};

/// One row of `receipt_jobs`, in the lease form.
#[derive(Inbox, Deserialize)]
#[inbox(table = "receipt_jobs", failed_at = "failed_at", error = "error")]
pub struct SendReceipt {
    #[field(id, generated)]
    id: i64,
    #[field(locked_until)]
    locked_until: Option<i64>,
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

/// Writes order `id` and its receipt's job in one transaction: both commit, or, when the
/// database refuses the order (it costs nothing), neither is written.
pub fn place_order(
    conn: &mut Connection,
    id: i64,
    cents: i64,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let email = format!("customer{id}@example.com");
    let tx = conn.transaction()?;
    tx.execute(
        "INSERT INTO orders (id, email, cents) VALUES (?1, ?2, ?3)",
        (id, &email, cents),
    )?;
    RusqliteOutbox::<SendReceipt>::new()
        .publish(&tx, Message::json(&Receipt { order: id, email })?)?;
    tx.commit()?;
    Ok(())
}

/// Where the receipts go: here, to the caller, in order.
type Sent = tokio::sync::mpsc::UnboundedSender<Receipt>;

/// Mails a receipt (here: hands it to `sent`).
struct Mail {
    sent: Sent,
}

impl Handle<Receipt> for Mail {
    async fn handle(
        &self,
        receipt: &Receipt,
        _outs: &(),
        _ctx: &mut Context<'_>,
    ) -> Result<(), HandlerOutcome> {
        let _ = self.sent.send(receipt.clone());
        Ok(())
    }
}

/// Creates the tables in the SQLite file at `path`, runs the service, and places `orders`
/// orders from a thread of the shop's own, every fifth of which the database refuses. Answers
/// the receipts sent once every order that committed has one.
pub async fn run(
    path: &Path,
    orders: i64,
) -> Result<Vec<Receipt>, Box<dyn std::error::Error + Send + Sync>> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let conn = Connection::open(path)?;
    conn.execute_batch(
        "DROP TABLE IF EXISTS orders;
         DROP TABLE IF EXISTS receipt_jobs;
         CREATE TABLE orders (
             id INTEGER PRIMARY KEY,
             email TEXT NOT NULL,
             cents INTEGER NOT NULL CHECK (cents > 0)
         );",
    )?;
    // The jobs' table, as its description writes it.
    conn.execute_batch(&SendReceipt::TABLE.ddl(Dialect::Sqlite).to_string())?;
    drop(conn);
    let (sent, mut mailed) = tokio::sync::mpsc::unbounded_channel();
    let mut receipts = Vec::new();
    let shop = path.to_owned();
    let placed = async {
        let committed = tokio::task::spawn_blocking(move || {
            let mut conn = Connection::open(&shop)?;
            conn.busy_timeout(Duration::from_secs(5))?;
            let mut committed = 0;
            for id in 1..=orders {
                let cents = if id % 5 == 0 { 0 } else { 100 * id };
                if place_order(&mut conn, id, cents).is_ok() {
                    committed += 1;
                }
            }
            Ok::<usize, Box<dyn std::error::Error + Send + Sync>>(committed)
        })
        .await
        .expect("the shop's thread")
        .expect("the shop's connection");
        while receipts.len() < committed {
            let Some(receipt) = mailed.recv().await else {
                break;
            };
            receipts.push(receipt);
        }
    };
    let mail = Mail { sent: sent.clone() };
    RustStream::new(AppInfo::new("receipts", "0.1.0"))
        .shutdown_timeout(Duration::from_secs(10))
        .with_broker(RusqliteBroker::open(path), move |b| {
            let mail = subscriber("receipts", mail)
                .map_source(|_| InboxQueue::<SendReceipt>::new("receipts"))
                .poll_interval(Duration::from_millis(50));
            b.include(mail.build());
        })
        .run_until(placed)
        .await?;
    Ok(receipts)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let sent = run(&PathBuf::from("target/rusqlite_outbox.db"), 20).await?;
    println!(
        "{} receipts sent for 20 orders, of which 4 were refused",
        sent.len()
    );
    Ok(())
}
