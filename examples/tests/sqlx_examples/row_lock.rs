//! The row lock form: four workers issue invoices on PostgreSQL; each holds its row's lock and a
//! connection until its acknowledgement commits.

use std::time::Duration;

use ruststream::RustStream;
use ruststream_sqlx::prelude::PgConnectOptions;

use crate::common::*;

const INVOICES: i64 = 8;

async fn four_workers_hold_a_connection_each(
    test: &str,
    service: fn(PgConnectOptions) -> RustStream,
) {
    let _serial = serial().await;
    let db = PgSchema::new(test).await;
    let hold = recorder().hold(|e| e.message == "issuing an invoice");
    service(db.options.clone())
        .shutdown_timeout(Duration::from_secs(10))
        .run_until(async {
            // The service created the table at its start.
            db.exec(&format!(
                "INSERT INTO invoice_jobs (payload)
                 SELECT convert_to(json_build_object('number', n)::text, 'UTF8')
                 FROM generate_series(1, {INVOICES}) AS n"
            ))
            .await;
            eventually("four invoices are in work", || async {
                recorder().held() == 4
            })
            .await;
            // No fifth: each worker holds one invoice.
            tokio::time::sleep(Duration::from_millis(300)).await;
            assert_eq!(recorder().held(), 4, "four workers, four invoices in work");
            assert_eq!(
                db.sessions("AND state = 'idle in transaction'").await,
                4,
                "each invoice in work holds a connection of the service, its claim's transaction open"
            );
            assert_eq!(
                db.scalar("SELECT COUNT(*) FROM (SELECT id FROM invoice_jobs FOR UPDATE SKIP LOCKED) AS free")
                    .await,
                INVOICES - 4,
                "the four rows in work are locked"
            );
            assert_eq!(
                db.scalar("SELECT COUNT(*) FROM invoice_jobs").await,
                INVOICES,
                "no row is deleted before its acknowledgement"
            );
            hold.release();
            eventually("every invoice is issued and its row deleted", || async {
                db.scalar("SELECT COUNT(*) FROM invoice_jobs").await == 0
            })
            .await;
        })
        .await
        .expect("the service runs");

    let mut issued: Vec<i64> = recorder()
        .messages("issuing an invoice")
        .iter()
        .map(|e| e.int("invoice.number").expect("the invoice's number"))
        .collect();
    issued.sort_unstable();
    assert_eq!(
        issued,
        (1..=INVOICES).collect::<Vec<_>>(),
        "each invoice is issued once"
    );
    eventually("the service's sessions are gone", || async {
        db.sessions("").await == 0
    })
    .await;
    db.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn forms_row_lock_by_macros() {
    four_workers_hold_a_connection_each("row_lock_macros", crate::row_lock_macros::service).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn forms_row_lock_by_hand() {
    four_workers_hold_a_connection_each("row_lock_manual", crate::row_lock_manual::service).await;
}
