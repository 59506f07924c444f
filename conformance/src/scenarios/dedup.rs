//! Deduplicated publishing: a table whose description names a unique column.

use std::sync::Arc;

use ruststream::adapter::TakesRows;
use ruststream::exec::Tokio;
use ruststream::{Message, Published};
use ruststream_core::Dialect;

use crate::harness::{Harness, TxEnd};
use crate::rows::{Job, Rows, SuiteRow};
use crate::schema::{self, TableSpec};
use crate::support::{Cx, now_micros};
use crate::{Form, TestName, Verdict};

/// A table whose description names the unique column `order_id` passes over a publish of a
/// row already there (in the batch or in the table) and says which rows it skipped: through
/// the broker's publisher, through the outbox in the service's transaction (which commits and
/// rolls back with it) and on a pool with no broker; the table's counts read through that pool.
pub async fn outbox_skips_rows_already_there<R: Rows, H: Harness>(
    harness: &H,
    test: &TestName,
) -> Verdict
where
    H::Adapter: TakesRows<R::Receipt>,
{
    let spec = TableSpec {
        name: <R::Receipt as SuiteRow>::NAME,
        form: Form::Lease,
        processed: false,
        failing: false,
    };
    let cx = Cx::prepare(harness, spec, test).await;
    let t = spec.name;
    cx.execute(&format!(
        "ALTER TABLE {t} ADD COLUMN order_id BIGINT NOT NULL DEFAULT 0"
    ))
    .await;
    cx.execute(&format!("CREATE UNIQUE INDEX {t}_order ON {t} (order_id)"))
        .await;
    through_the_publisher::<H, R::Receipt>(&cx).await;
    through_the_outbox::<H, R::Receipt>(&cx).await;
    counted_on_a_pool::<H, R::Receipt>(&cx).await;
    if let Err(error) = harness.cleanup(&cx.db).await {
        println!("{cx}: cleaning up failed: {error}");
    }
    Ok(())
}

/// The job of order `order`.
fn receipt(order: i64) -> Message {
    Message::json(&Job { n: order })
        .expect("a job encodes")
        .column("order_id", order)
}

/// What a publish answered, or a panic naming `what`.
fn published<H: Harness, E: std::fmt::Display>(
    cx: &Cx<'_, H>,
    what: &str,
    answer: Result<Published, E>,
) -> Published {
    answer.unwrap_or_else(|e| panic!("{cx}: {what} failed: {e}"))
}

/// Orders 1, 2, 1, then 2, 3, then 3 alone, through a running broker's publisher.
async fn through_the_publisher<H: Harness, T: SuiteRow>(cx: &Cx<'_, H>)
where
    H::Adapter: TakesRows<T>,
{
    let running = cx
        .broker()
        .start(Vec::new(), Arc::new(Tokio))
        .await
        .unwrap_or_else(|e| panic!("{cx}: the broker starts: {e}"));
    let publisher = running.publisher::<T>();
    let first = publisher
        .publish_all([receipt(1), receipt(2), receipt(1)])
        .await;
    let first = published(cx, "the first batch", first);
    assert_eq!(first.skipped, [2], "{cx}: the second order 1 of the batch");
    let again = publisher.publish_all([receipt(2), receipt(3)]).await;
    let again = published(cx, "the second batch", again);
    assert_eq!(again.skipped, [0], "{cx}: order 2 is there already");
    let single = published(cx, "order 3 alone", publisher.publish(receipt(3)).await);
    assert!(!single.wrote_all(), "{cx}: order 3 is there already");
    running.shutdown().await;
}

/// Orders 4, 3, 4 in a transaction that commits, then 5 in one that rolls back, each beside
/// the service's own write in the log table.
async fn through_the_outbox<H: Harness, T: SuiteRow>(cx: &Cx<'_, H>) {
    let log = schema::log(cx.table.name);
    let write = |n: i64| format!("INSERT INTO {log} (n, attempt) VALUES ({n}, 0)");
    let batch = vec![receipt(4), receipt(3), receipt(4)];
    let committed = cx
        .harness
        .publish_in_transaction::<T>(&cx.db, &write(4), batch, TxEnd::Commit)
        .await;
    let committed = published(cx, "the committed transaction", committed);
    assert_eq!(
        committed.skipped,
        [1, 2],
        "{cx}: order 3 is there already, order 4 twice in the batch"
    );
    let rolled_back = cx
        .harness
        .publish_in_transaction::<T>(&cx.db, &write(5), vec![receipt(5)], TxEnd::Rollback)
        .await;
    let rolled_back = published(cx, "the rolled back transaction", rolled_back);
    assert!(rolled_back.wrote_all(), "{cx}: order 5 before the rollback");
    let logged = format!("SELECT COUNT(*) FROM {log} WHERE n = 4");
    assert_eq!(cx.i64(&logged).await, 1, "{cx}: the committed write");
    let logged = format!("SELECT COUNT(*) FROM {log} WHERE n = 5");
    assert_eq!(cx.i64(&logged).await, 0, "{cx}: the rolled back write");
}

/// Orders 2 and 6 on a pool with no broker; order 6 leased for an hour; the counts through the
/// same pool: four rows due, one in work; every order once, order 5 never.
async fn counted_on_a_pool<H: Harness, T: SuiteRow>(cx: &Cx<'_, H>) {
    let pooled = cx
        .harness
        .publish_without_broker::<T>(&cx.db, vec![receipt(2), receipt(6)])
        .await;
    let pooled = published(cx, "the publish without a broker", pooled);
    assert_eq!(pooled.skipped, [0], "{cx}: order 2 is there already");
    let in_an_hour = match cx.dialect() {
        Dialect::Postgres => "now() + interval '1 hour'".to_owned(),
        Dialect::MySql | Dialect::MariaDb => "UTC_TIMESTAMP(6) + INTERVAL 1 HOUR".to_owned(),
        Dialect::Sqlite => (now_micros() + 3_600_000_000).to_string(),
    };
    cx.execute(&format!(
        "UPDATE {} SET locked_until = {in_an_hour} WHERE order_id = 6",
        cx.table.name
    ))
    .await;
    let stats = cx
        .harness
        .outbox_stats::<T>(&cx.db)
        .await
        .unwrap_or_else(|e| panic!("{cx}: the counts without a broker: {e}"));
    assert_eq!(stats.table, cx.table.name, "{cx}: the counts' table");
    let counts = (
        stats.due.value(),
        stats.in_work.map(|c| c.value()),
        stats.failed,
    );
    assert_eq!(counts, (4, Some(1), None), "{cx}: due, in work, failed");
    assert_eq!(cx.count("1=1").await, 5, "{cx}: orders 1 to 4 and 6");
    let distinct = format!("SELECT COUNT(DISTINCT order_id) FROM {}", cx.table.name);
    assert_eq!(cx.i64(&distinct).await, 5, "{cx}: each order once");
    assert_eq!(
        cx.count("order_id = 5").await,
        0,
        "{cx}: order 5 rolled back"
    );
}
