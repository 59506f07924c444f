//! Orders on SQLite through sqlx. `examples/switch/on_rusqlite.rs` is the same service on
//! rusqlite: the two files differ in the prelude, the row's derive and the broker line, and
//! nothing else.
//!
//! ```sh
//! cargo run --example switch_on_sqlx
//! ```

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use ruststream_sqlx::prelude::*;
use serde::{Deserialize, Serialize};

/// One row of `orders`, held by the key of its customer while it is in work.
#[derive(Inbox, sqlx::FromRow)]
#[inbox(
    table = "orders",
    advisory_lock = "orders-{customer}",
    failed_at = "failed_at",
    error = "error"
)]
pub struct Order {
    #[field(id, generated)]
    id: i64,
    customer: i64,
    #[field(attempt, generated)]
    attempt: i64,
    #[field(payload)]
    payload: Vec<u8>,
}

/// The message: an order to ship.
#[derive(Serialize, Deserialize)]
pub struct Ship {
    /// The order's number.
    pub number: i64,
}

/// Ships an order and counts it.
pub struct Shipper(pub Arc<AtomicUsize>);

impl Handle<Ship> for Shipper {
    async fn handle(&self, ship: &Ship, _: &(), _: &mut Context<'_>) -> Result<(), HandlerOutcome> {
        tracing::info!(ship.number, "shipping");
        self.0.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
}

/// The service on the SQLite file at `path`, shipping into `shipped`.
pub fn service(path: &Path, shipped: Arc<AtomicUsize>) -> RustStream {
    let broker = SqlxBroker::from_url(
        format!("sqlite:{}", path.display()),
        sqlx::sqlite::SqlitePoolOptions::new(),
    );
    RustStream::new(AppInfo::new("orders", "0.1.0")).with_broker(broker, |b| {
        let ship = subscriber("orders", Shipper(shipped))
            .map_source(|_| InboxQueue::<Order>::new("orders"))
            .workers(nonzero!(2))
            .poll_interval(std::time::Duration::from_millis(100));
        b.include(ship.build());
    })
}

#[allow(dead_code)]
#[ruststream::app]
fn app() -> impl App {
    service(Path::new("target/switch_orders.db"), Arc::default())
}
